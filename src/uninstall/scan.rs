//! What `kbind uninstall` finds before it releases anything: per kind, the objects carrying a
//! pass's finalizer, the Connections and their Secrets, the Grants a provider issued.

use super::*;

fn lp(selector: Option<&str>) -> ListParams {
    match selector {
        Some(s) => ListParams::default().labels(s),
        None => ListParams::default(),
    }
}

/// A LIST error: 404 means the kind's CRD is not installed (`Ok(None)`); 400 on a selected list
/// is a bad `--selector`.
fn listed<T>(r: Result<T, kube::Error>, what: &str) -> Result<Option<T>, UninstallError> {
    match r {
        Ok(v) => Ok(Some(v)),
        Err(kube::Error::Api(s)) if s.code == 404 => Ok(None),
        Err(kube::Error::Api(s)) if s.code == 400 => {
            Err(UninstallError::Config(format!("--selector: {}", s.message)))
        }
        Err(source) => Err(UninstallError::List {
            what: what.to_string(),
            source,
        }),
    }
}

fn not_installed(resource: &str) -> String {
    format!("CRD {resource} is not installed")
}

/// The objects carrying `finalizer` among `metas`.
fn carrying<K: Resource>(
    metas: impl IntoIterator<Item = kube::api::PartialObjectMeta<K>>,
    finalizer: &str,
) -> Vec<ObjectReport> {
    let mut out: Vec<ObjectReport> = metas
        .into_iter()
        .filter(|m| m.finalizers().iter().any(|f| f == finalizer))
        .map(|m| ObjectReport {
            namespace: m.namespace(),
            name: m.name_any(),
            uid: m.uid().unwrap_or_default(),
            deleting: m.metadata.deletion_timestamp.is_some(),
            outcome: Outcome::WouldRelease,
            error: None,
            unrevoked: None,
        })
        .collect();
    out.sort_by_key(ObjectReport::key);
    out
}

/// Every object of `ar` carrying `finalizer` (matching `selector`), or why the kind was skipped.
async fn scan(
    client: &Client,
    mut report: KindReport,
    selector: Option<&str>,
) -> Result<KindReport, UninstallError> {
    let api: Api<DynamicObject> = Api::all_with(client.clone(), &report.ar);
    let what = format!("{} ({})", report.kind, report.resource);
    match listed(
        crate::pass::list::metadata(&api, &lp(selector)).await,
        &what,
    )? {
        Some(metas) => report.objects = carrying(metas, &report.finalizer),
        None => report.skipped = Some(not_installed(&report.resource)),
    }
    Ok(report)
}

pub(super) fn resource_of<K: Resource<DynamicType = ()>>() -> String {
    let ar = ApiResource::erase::<K>(&());
    if ar.group.is_empty() {
        ar.plural
    } else {
        format!("{}.{}", ar.plural, ar.group)
    }
}

pub(super) fn kind_report<K: Resource<DynamicType = ()>>(
    finalizer: &str,
    pass: &str,
) -> KindReport {
    KindReport::new(
        ApiResource::erase::<K>(&()),
        resource_of::<K>(),
        finalizer,
        pass,
    )
}

/// The Connections a run looks at: every one (for whose Secret is shared), and the selected ones.
struct Connections {
    all: Option<Vec<Connection>>,
    selected: Option<BTreeSet<String>>,
}

impl Connections {
    async fn read(client: &Client, selector: Option<&str>) -> Result<Self, UninstallError> {
        let api: Api<Connection> = Api::all(client.clone());
        let all = listed(
            crate::pass::list::all(&api, &ListParams::default()).await,
            "Connections",
        )?;
        let selected = match (&all, selector) {
            (None, _) => None,
            (Some(all), None) => Some(all.iter().map(|c| c.name_any()).collect()),
            (Some(_), Some(sel)) => listed(
                crate::pass::list::metadata(&api, &lp(Some(sel))).await,
                "Connections",
            )?
            .map(|m| m.iter().map(|c| c.name_any()).collect()),
        };
        Ok(Self { all, selected })
    }
}

/// Whether `kbind uninstall` knows where `f` lives (a test keeps every registered one known).
pub fn releases(f: &Finalizer) -> bool {
    match f.on {
        Finalized::ManagedKinds => true,
        Finalized::Kind(k) => RELEASED.contains(&(k.group, k.kind)),
    }
}

const RELEASED: [(&str, &str); 6] = [
    ("core.kbind.io", "Binding"),
    ("core.kbind.io", "ClusterBinding"),
    ("core.kbind.io", "Connection"),
    ("", "Secret"),
    ("agentprimitives.authzed.com", "RelationshipSource"),
    ("iam.kbind.io", "Grant"),
];

/// Find every object carrying one of the passes' finalizers, in the order they are released:
/// synced objects first, then each pass's kinds in registry order (Bindings, ClusterBindings,
/// Connections, Secrets, RelationshipSources, Grants).
pub(super) async fn find(
    client: &Client,
    selector: Option<&str>,
    grants_ns: &str,
    passes: &[Descriptor],
) -> Result<Vec<KindReport>, UninstallError> {
    let conns = Connections::read(client, selector).await?;
    let mut owned: Vec<(&str, &Finalizer)> = passes
        .iter()
        .flat_map(|p| p.finalizers.iter().map(move |f| (p.name, f)))
        .collect();
    owned.sort_by_key(|(_, f)| f.on != Finalized::ManagedKinds);
    let mut kinds = Vec::new();
    for (pass, f) in owned {
        match f.on {
            Finalized::ManagedKinds => {
                kinds.extend(synced(client, selector, &conns, f.name, pass).await?);
            }
            Finalized::Kind(k) => {
                let report = scan_kind(client, selector, &conns, grants_ns, k, f.name, pass);
                kinds.push(report.await?);
            }
        }
    }
    Ok(kinds)
}

/// One kind's objects carrying `finalizer`.
async fn scan_kind(
    client: &Client,
    selector: Option<&str>,
    conns: &Connections,
    grants_ns: &str,
    k: Kind,
    finalizer: &str,
    pass: &str,
) -> Result<KindReport, UninstallError> {
    let report = match (k.group, k.kind) {
        ("", "Secret") => return secrets(client, selector, conns, finalizer, pass).await,
        ("iam.kbind.io", "Grant") => {
            return issued_grants(client, selector, grants_ns, finalizer, pass).await;
        }
        ("core.kbind.io", "Binding") => kind_report::<Binding>(finalizer, pass),
        ("core.kbind.io", "ClusterBinding") => kind_report::<ClusterBinding>(finalizer, pass),
        ("core.kbind.io", "Connection") => kind_report::<Connection>(finalizer, pass),
        ("agentprimitives.authzed.com", "RelationshipSource") => {
            kind_report::<RelationshipSource>(finalizer, pass)
        }
        (group, kind) => {
            return Err(UninstallError::Config(format!(
                "kbind uninstall cannot release {finalizer} on {kind}.{group}: a registered \
                 pass adds a finalizer on a kind it does not know"
            )));
        }
    };
    scan(client, report, selector).await
}

/// Synced consumer objects: every kind whose CRD kbind manages (of a selected Connection).
async fn synced(
    client: &Client,
    selector: Option<&str>,
    conns: &Connections,
    finalizer: &str,
    pass: &str,
) -> Result<Vec<KindReport>, UninstallError> {
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    let managed = crate::pass::list::all(&crds, &ListParams::default().labels(keys::MANAGED))
        .await
        .map_err(|source| UninstallError::List {
            what: format!("CRDs labelled {}", keys::MANAGED),
            source,
        })?;
    let mut synced = Vec::new();
    for crd in managed {
        if let Some(sel) = selector.and(conns.selected.as_ref()) {
            let owner = crd.annotations().get(keys::CONNECTION);
            if !owner.is_some_and(|o| sel.contains(o)) {
                continue;
            }
        }
        let spec = &crd.spec;
        let Some(version) = spec
            .versions
            .iter()
            .find(|v| v.storage)
            .or_else(|| spec.versions.iter().find(|v| v.served))
        else {
            continue;
        };
        let ar = ApiResource {
            group: spec.group.clone(),
            version: version.name.clone(),
            api_version: format!("{}/{}", spec.group, version.name),
            kind: spec.names.kind.clone(),
            plural: spec.names.plural.clone(),
        };
        let report = KindReport::new(ar, crd.name_any(), finalizer, pass);
        synced.push(scan(client, report, None).await?);
    }
    synced.sort_by(|a, b| a.resource.cmp(&b.resource));
    Ok(synced)
}

/// The issuer's Grants carrying `iam.kbind.io/revoke`, each with what releasing leaves behind.
/// Read whole (spec and status; a Grant holds no secret) for the grants namespace and expiry.
async fn issued_grants(
    client: &Client,
    selector: Option<&str>,
    grants_ns: &str,
    finalizer: &str,
    pass: &str,
) -> Result<KindReport, UninstallError> {
    let mut report = kind_report::<IssuedGrant>(finalizer, pass);
    let api: Api<IssuedGrant> = Api::all(client.clone());
    let what = format!("{} ({})", report.kind, report.resource);
    let Some(grants) = listed(crate::pass::list::all(&api, &lp(selector)).await, &what)? else {
        report.skipped = Some(not_installed(&report.resource));
        return Ok(report);
    };
    let by_name: std::collections::BTreeMap<String, &IssuedGrant> =
        grants.iter().map(|g| (g.name_any(), g)).collect();
    let metas = grants
        .iter()
        .map(|g| kube::api::PartialObjectMeta::<IssuedGrant> {
            types: None,
            metadata: g.metadata.clone(),
            _phantom: std::marker::PhantomData,
        });
    report.objects = carrying(metas, &report.finalizer);
    for o in &mut report.objects {
        o.unrevoked = by_name.get(&o.name).map(|g| unrevoked(g, grants_ns));
    }
    Ok(report)
}

/// Secrets carrying `core.kbind.io/cleanup`: every one (read as metadata only, never data);
/// with a selector, those of the selected Connections that no other Connection uses.
async fn secrets(
    client: &Client,
    selector: Option<&str>,
    conns: &Connections,
    finalizer: &str,
    pass: &str,
) -> Result<KindReport, UninstallError> {
    let mut report = kind_report::<Secret>(finalizer, pass);
    if selector.is_none() {
        return scan(client, report, None).await;
    }
    let (Some(all), Some(selected)) = (conns.all.as_deref(), conns.selected.as_ref()) else {
        report.skipped = Some(not_installed(&resource_of::<Connection>()));
        return Ok(report);
    };
    let refs = |pick: bool| -> BTreeSet<(String, String)> {
        all.iter()
            .filter(|c| selected.contains(&c.name_any()) == pick)
            .map(|c| {
                let r = &c.spec.kubeconfig_secret_ref;
                (r.namespace.clone(), r.name.clone())
            })
            .collect()
    };
    let shared = refs(false);
    let mut metas = Vec::new();
    for (ns, name) in refs(true).difference(&shared) {
        let api: Api<Secret> = Api::namespaced(client.clone(), ns);
        let what = format!("Secret {ns}/{name}");
        match api.get_metadata_opt(name).await {
            Ok(Some(m)) => metas.push(m),
            Ok(None) => {}
            Err(source) => return Err(UninstallError::List { what, source }),
        }
    }
    report.objects = carrying(metas, finalizer);
    Ok(report)
}
