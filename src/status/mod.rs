//! `kbind status`: a one-shot, read-only overview of every kbind resource on the cluster the
//! job's own kubeconfig points at (docs/operations.md, "kbind status"). It lists Connections,
//! ClusterBindings and Bindings (per-API counts from status), CatalogEntries,
//! RelationshipSources, the claims Grants (`tenancy.kbind.io`), and the service layer's Exports,
//! Collections and Grants (`catalog.kbind.io`, `iam.kbind.io`); every kind is printed with its
//! group (two kinds are named Grant). A kind whose CRD is not installed is skipped with one line. It takes no Lease and writes nothing, so it runs beside the passes at any time.
//!
//! Exit codes: 0 every object that has a Ready condition says `Ready=True`; 3 something is not
//! Ready (or has no Ready condition yet); 1 the API cannot be read; 2 bad usage.

use std::sync::Arc;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::api::ListParams;
use kube::{Api, Client, Resource, ResourceExt};
use serde::Serialize;

use crate::api::catalog::{Collection, Export};
use crate::api::core::{Binding, BindingStatus, ClusterBinding, Connection, condition};
use crate::api::iam::Grant as IssuedGrant;
use crate::api::providers::{CatalogEntry, Grant};
use crate::api::relsync::RelationshipSource;
use crate::pass::client::{RequestCounter, counted_client, own_config};
use crate::pass::descriptor::{Descriptor, Kind};
use crate::pass::{CommonArgs, OutputFormat, PassError};

/// The exit code when something is not Ready (docs/operations.md: 1 and 2 keep their meaning).
pub const NOT_READY: i32 = 3;

/// The name clients built by `kbind status` carry in their User-Agent.
pub const COMMAND: &str = "status";

/// Flags of `kbind status`.
#[derive(Clone, Debug, Default, clap::Args)]
pub struct StatusArgs {
    /// Only objects matching this label selector (kubectl's `-l` syntax, e.g. `team=a`).
    #[arg(long, short = 'l')]
    pub selector: Option<String>,
}

/// The whole report, as `-o json|yaml` prints it.
#[derive(Clone, Debug, Default, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Report {
    /// Whether every object with a Ready condition is Ready (the exit code is 0 exactly then).
    pub ready: bool,
    pub kinds: Vec<KindReport>,
}

/// One kind: installed or skipped, and its objects.
#[derive(Clone, Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct KindReport {
    pub kind: &'static str,
    pub group: &'static str,
    /// False when the cluster does not serve this kind (its CRD is not installed): skipped.
    pub installed: bool,
    pub items: Vec<Item>,
}

/// One object. `ready` is the Ready condition's status (`None`: the kind has no Ready
/// condition, as the claims Grant); `reason` and `message` are set when it is not True.
#[derive(Clone, Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Item {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
    pub name: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ready: Option<String>,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub reason: String,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub message: String,
    #[serde(flatten)]
    pub facts: Facts,
}

impl Item {
    /// Whether this object holds the report back: it has (or should have) a Ready condition
    /// that is not True.
    pub fn not_ready(&self) -> bool {
        self.ready.as_deref().is_some_and(|r| r != "True")
    }
}

/// What each kind adds beside its Ready condition.
#[derive(Clone, Debug, Serialize)]
#[serde(untagged, rename_all_fields = "camelCase")]
pub enum Facts {
    Connection {
        /// The Connected condition's status.
        connected: String,
        #[serde(rename = "exportedAPIs")]
        exported_apis: usize,
    },
    Binding {
        connection: String,
        apis: Vec<ApiCounts>,
    },
    CatalogEntry {
        export: String,
        bindings_checked: i64,
        bindings_updated: i64,
        missing_on_export: usize,
    },
    RelationshipSource {
        source_kind: String,
        #[serde(skip_serializing_if = "Option::is_none")]
        last_sync_time: Option<String>,
        /// Whether the current enumeration cycle has covered every scope.
        enum_complete: bool,
        /// The last scope the current cycle finished (empty: from the beginning).
        #[serde(skip_serializing_if = "String::is_empty")]
        resume_after: String,
        scopes_processed: i32,
        scope_errors: i32,
    },
    Grant {
        workspace: String,
        provider: String,
        compositions: usize,
    },
    /// `catalog.kbind.io` Export.
    Export {
        api_count: usize,
        /// The APIs `kbind issue` found not exported (`status.missingAPIs`).
        #[serde(rename = "missingAPIs")]
        missing_apis: Vec<String>,
    },
    /// `catalog.kbind.io` Collection: no status, no Ready condition.
    Collection { exports: Vec<String> },
    /// `iam.kbind.io` Grant, the issued credential.
    IssuedGrant {
        consumer: String,
        #[serde(skip_serializing_if = "Option::is_none")]
        export: Option<String>,
        #[serde(skip_serializing_if = "Option::is_none")]
        collection: Option<String>,
        #[serde(skip_serializing_if = "Option::is_none")]
        expires_at: Option<String>,
        /// The consumer cluster the Grant is pinned to (none: not pinned yet).
        #[serde(skip_serializing_if = "Option::is_none")]
        consumer_cluster: Option<String>,
    },
}

/// Per-API counts from a binding's `status.boundAPIs` (what `kbind resync` last recorded).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ApiCounts {
    pub name: String,
    pub in_sync: i64,
    pub pending: i64,
    pub conflicts: i64,
    pub orphaned: i64,
    pub denied: i64,
    pub rejected: i64,
}

/// Read everything and print it; returns the exit code.
pub async fn run(common: CommonArgs, args: StatusArgs, passes: &[Descriptor]) -> i32 {
    crate::install_crypto_provider();
    crate::set_command(COMMAND);
    crate::pass::retry::set_limits(crate::pass::retry::Limits {
        deadline: std::time::Instant::now() + common.deadline,
        request_timeout: common.request_timeout,
    });
    let report = match collect(&common, &args, passes).await {
        Ok(r) => r,
        Err(e) => {
            crate::logging::print_error("status", &e);
            return e.exit_code();
        }
    };
    let text = match common.output {
        None | Some(OutputFormat::Text) => Ok(table(&report)),
        Some(OutputFormat::Json) => serde_json::to_string_pretty(&report)
            .map(|s| s + "\n")
            .map_err(|e| e.to_string()),
        Some(OutputFormat::Yaml) => serde_saphyr::to_string(&report).map_err(|e| e.to_string()),
    };
    match text {
        Ok(t) => {
            use std::io::Write;
            // A closed pipe (`| head`) is not worth a panic.
            let _ = std::io::stdout().write_all(t.as_bytes());
        }
        Err(e) => {
            crate::logging::print_error("status", &format!("rendering the report: {e}"));
            return 1;
        }
    }
    if report.ready { 0 } else { NOT_READY }
}

/// Read the kinds the passes show, each once, in the order the registry lists them; a kind the
/// server does not serve is reported as skipped.
pub async fn collect(
    common: &CommonArgs,
    args: &StatusArgs,
    passes: &[Descriptor],
) -> Result<Report, PassError> {
    let config = own_config(common).await?;
    let client = counted_client(config, Arc::new(RequestCounter::default()))
        .map_err(|e| PassError::kube("building the Kubernetes client", e))?;
    let lp = match &args.selector {
        Some(s) => ListParams::default().labels(s),
        None => ListParams::default(),
    };
    let mut kinds = Vec::new();
    for k in shown(passes) {
        kinds.push(read_kind(&client, &lp, k).await?);
    }
    let ready = !kinds.iter().flat_map(|k| &k.items).any(Item::not_ready);
    Ok(Report { ready, kinds })
}

/// Every kind the passes show, each once, in the report's order ([`SHOWN`]: the binding kinds
/// first, then CatalogEntries, RelationshipSources, the claims Grants and the service layer); a kind it does not know, last.
pub fn shown(passes: &[Descriptor]) -> Vec<Kind> {
    let mut kinds: Vec<Kind> = Vec::new();
    for k in passes.iter().flat_map(|p| p.shows) {
        if !kinds.contains(k) {
            kinds.push(*k);
        }
    }
    let rank = |k: &Kind| {
        SHOWN
            .iter()
            .position(|s| *s == (k.group, k.kind))
            .unwrap_or(SHOWN.len())
    };
    kinds.sort_by_key(rank);
    kinds
}

/// Whether `kbind status` knows how to show `k` (a test keeps every registered kind shown).
pub fn shows(k: Kind) -> bool {
    SHOWN.contains(&(k.group, k.kind))
}

const SHOWN: [(&str, &str); 9] = [
    ("core.kbind.io", "Connection"),
    ("core.kbind.io", "ClusterBinding"),
    ("core.kbind.io", "Binding"),
    ("providers.kbind.io", "CatalogEntry"),
    ("agentprimitives.authzed.com", "RelationshipSource"),
    ("tenancy.kbind.io", "Grant"),
    ("catalog.kbind.io", "Export"),
    ("catalog.kbind.io", "Collection"),
    ("iam.kbind.io", "Grant"),
];

async fn read_kind(client: &Client, lp: &ListParams, k: Kind) -> Result<KindReport, PassError> {
    match (k.group, k.kind) {
        ("core.kbind.io", "Connection") => kind::<Connection>(client, lp, connection).await,
        ("core.kbind.io", "ClusterBinding") => {
            kind::<ClusterBinding>(client, lp, |b| {
                binding(None, b.name_any(), &b.spec.connection_ref.name, b.status)
            })
            .await
        }
        ("core.kbind.io", "Binding") => {
            kind::<Binding>(client, lp, |b| {
                let (ns, name) = (b.namespace(), b.name_any());
                binding(ns, name, &b.spec.connection_ref.name, b.status)
            })
            .await
        }
        ("providers.kbind.io", "CatalogEntry") => {
            kind::<CatalogEntry>(client, lp, catalog_entry).await
        }
        ("tenancy.kbind.io", "Grant") => kind::<Grant>(client, lp, grant).await,
        ("agentprimitives.authzed.com", "RelationshipSource") => {
            kind::<RelationshipSource>(client, lp, relationship_source).await
        }
        ("catalog.kbind.io", "Export") => kind::<Export>(client, lp, export).await,
        ("catalog.kbind.io", "Collection") => kind::<Collection>(client, lp, collection).await,
        ("iam.kbind.io", "Grant") => kind::<IssuedGrant>(client, lp, issued_grant).await,
        (group, kind) => Err(PassError::Config(format!(
            "kbind status cannot show {kind}.{group}: a registered pass names a kind it does not know"
        ))),
    }
}

/// List one kind across all namespaces; a 404 on the list means the server does not serve the
/// kind (its CRD is not installed).
async fn kind<K>(
    client: &Client,
    lp: &ListParams,
    item: impl Fn(K) -> Item,
) -> Result<KindReport, PassError>
where
    K: Resource<DynamicType = ()> + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    let (kind, group) = (kind_of::<K>(), group_of::<K>());
    let api: Api<K> = Api::all(client.clone());
    match crate::pass::list::map_all(&api, lp, item).await {
        Ok(mut items) => {
            items.sort_by(|a, b| (&a.namespace, &a.name).cmp(&(&b.namespace, &b.name)));
            tracing::debug!(kind, group, items = items.len(), "listed");
            Ok(KindReport {
                kind,
                group,
                installed: true,
                items,
            })
        }
        Err(kube::Error::Api(s)) if s.code == 404 => {
            tracing::debug!(kind, group, "not served by this cluster: skipped");
            Ok(KindReport {
                kind,
                group,
                installed: false,
                items: Vec::new(),
            })
        }
        Err(kube::Error::Api(s)) if s.code == 400 => Err(PassError::Config(format!(
            "listing {kind}.{group}: {}",
            s.message
        ))),
        Err(e) => Err(PassError::kube(format!("listing {kind}.{group}"), e)),
    }
}

fn kind_of<K: Resource<DynamicType = ()>>() -> &'static str {
    match K::kind(&()) {
        std::borrow::Cow::Borrowed(k) => k,
        std::borrow::Cow::Owned(_) => "",
    }
}

fn group_of<K: Resource<DynamicType = ()>>() -> &'static str {
    match K::group(&()) {
        std::borrow::Cow::Borrowed(g) => g,
        std::borrow::Cow::Owned(_) => "",
    }
}

/// The Ready condition's status, and its reason and message when it is not True. An object
/// with no Ready condition yet (never handled by its pass) is `Unknown`.
fn ready(conditions: &[Condition]) -> (String, String, String) {
    match conditions.iter().find(|c| c.type_ == condition::READY) {
        Some(c) if c.status == "True" => (c.status.clone(), String::new(), String::new()),
        Some(c) => (c.status.clone(), c.reason.clone(), c.message.clone()),
        None => (
            "Unknown".into(),
            "NotObserved".into(),
            "no Ready condition yet: its pass has not handled this object".into(),
        ),
    }
}

fn item(namespace: Option<String>, name: String, conditions: &[Condition], facts: Facts) -> Item {
    let (ready, reason, message) = ready(conditions);
    Item {
        namespace,
        name,
        ready: Some(ready),
        reason,
        message,
        facts,
    }
}

fn connection(c: Connection) -> Item {
    let name = c.name_any();
    let st = c.status.unwrap_or_default();
    let connected = st
        .conditions
        .iter()
        .find(|c| c.type_ == condition::CONNECTED)
        .map_or_else(|| "Unknown".to_string(), |c| c.status.clone());
    let facts = Facts::Connection {
        connected,
        exported_apis: st.exported_apis.len(),
    };
    item(None, name, &st.conditions, facts)
}

fn binding(
    namespace: Option<String>,
    name: String,
    connection: &str,
    status: Option<BindingStatus>,
) -> Item {
    let st = status.unwrap_or_default();
    let apis = st
        .bound_apis
        .iter()
        .map(|a| ApiCounts {
            name: a.name.clone(),
            in_sync: a.in_sync.unwrap_or(0),
            pending: a.pending.unwrap_or(0),
            conflicts: a.conflict_count.unwrap_or(0),
            orphaned: a.orphaned.unwrap_or(0),
            denied: a.denied.unwrap_or(0),
            rejected: a.rejected.unwrap_or(0),
        })
        .collect();
    let facts = Facts::Binding {
        connection: connection.to_string(),
        apis,
    };
    item(namespace, name, &st.conditions, facts)
}

fn catalog_entry(e: CatalogEntry) -> Item {
    let name = e.name_any();
    let st = e.status.unwrap_or_default();
    let export = match e.spec.export.path.as_str() {
        "" => e.spec.export.name.clone(),
        path => format!("{path}:{}", e.spec.export.name),
    };
    let facts = Facts::CatalogEntry {
        export,
        bindings_checked: st.bindings_checked,
        bindings_updated: st.bindings_updated,
        missing_on_export: st.missing_on_export.len(),
    };
    item(None, name, &st.conditions, facts)
}

fn relationship_source(s: RelationshipSource) -> Item {
    let (namespace, name) = (s.namespace(), s.name_any());
    let st = s.status.unwrap_or_default();
    let sync = st.sync.unwrap_or_default();
    let last = sync.last_pass.unwrap_or_default();
    let facts = Facts::RelationshipSource {
        source_kind: s.spec.kind,
        last_sync_time: sync.last_sync_time.map(|t| t.0.to_string()),
        enum_complete: sync.enum_complete,
        resume_after: sync.resume_after,
        scopes_processed: last.scopes_processed,
        scope_errors: last.scope_errors,
    };
    item(namespace, name, &st.conditions, facts)
}

fn grant(g: Grant) -> Item {
    Item {
        namespace: g.namespace(),
        name: g.name_any(),
        // A Grant is consent, not reconciled: it has no status and no Ready condition.
        ready: None,
        reason: String::new(),
        message: String::new(),
        facts: Facts::Grant {
            workspace: g.spec.workspace,
            provider: g.spec.provider,
            compositions: g.spec.compositions.len(),
        },
    }
}

fn export(e: Export) -> Item {
    let name = e.name_any();
    let st = e.status.unwrap_or_default();
    let facts = Facts::Export {
        api_count: e.spec.apis.len(),
        missing_apis: st.missing_apis,
    };
    item(None, name, &st.conditions, facts)
}

fn collection(c: Collection) -> Item {
    Item {
        namespace: None,
        name: c.name_any(),
        // A Collection is a list of Exports, not reconciled: no Ready condition.
        ready: None,
        reason: String::new(),
        message: String::new(),
        facts: Facts::Collection {
            exports: c.spec.exports.into_iter().map(|e| e.name).collect(),
        },
    }
}

fn issued_grant(g: IssuedGrant) -> Item {
    let name = g.name_any();
    let st = g.status.unwrap_or_default();
    let facts = Facts::IssuedGrant {
        consumer: g.spec.consumer,
        export: g.spec.export,
        collection: g.spec.collection,
        expires_at: st.expires_at.map(|t| t.0.to_string()),
        consumer_cluster: st.consumer_cluster,
    };
    item(None, name, &st.conditions, facts)
}

mod table;
pub use table::table;
#[cfg(test)]
use table::{MESSAGE_WIDTH, reason_cell};

#[cfg(test)]
mod tests;
