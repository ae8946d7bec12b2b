//! The hand-over check's plan (docs/issue.md "Read isolation"): where a Grant is about to read
//! for the first time, and what to look at there for another consumer's objects. Revoking a
//! Grant never deletes provider data, so the next Grant holding its namespace (or exclusive
//! cluster-scoped API) would read what the previous consumer left. Pure; the LISTs are in
//! `observe/handover.rs`.

use std::collections::BTreeSet;

use k8s_openapi::api::rbac::v1::PolicyRule;
use k8s_openapi::jiff::Timestamp;

use super::render::{Resolved, ResolvedApi};

/// One place a Grant would newly hold, and what to look at there.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Look {
    /// `namespace <ns>` or `API <name>`: what an approval names (after the space).
    pub what: String,
    /// The namespace, for a namespace; `None` for a cluster-scoped API.
    pub namespace: Option<String>,
    pub targets: Vec<Target>,
}

/// What to look at in a place.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Target {
    /// An exported API: any object not labelled with the Grant's pin.
    Api(ResolvedApi),
    /// A resource an Export's `spec.permissions` reach there (the named objects only, when the
    /// rule names some): any object not labelled with the Grant's pin, but those every
    /// namespace holds ([`namespace_defaults`]).
    Permission {
        group: String,
        resource: String,
        names: Vec<String>,
    },
    /// A rule whose resources cannot be listed one by one (a `*`): the place needs approval
    /// whenever it exists, with the rule named.
    Unlistable(String),
}

/// What the check found in a place.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Finding {
    /// One object it found (`<api> <ns>/<name>`).
    Object(String),
    /// Why it could not look (an unlistable rule, a refused or failed LIST): a place that
    /// cannot be looked at passes only with a person's approval.
    Unchecked(String),
}

/// The places a Grant would newly hold, in existing namespaces (a namespace the issuer creates
/// holds nothing yet): each namespace it owns but holds no Role in yet (every namespaced API and
/// every permission resource); each it holds, for the APIs not yet in `status.grantedAPIs`;
/// each exclusive cluster-scoped API not yet granted. Those `approved` names are left out.
pub fn looks(
    resolved: &Resolved,
    owned: &dyn Fn(&str) -> bool,
    held: &dyn Fn(&str) -> bool,
    granted: &dyn Fn(&str) -> bool,
    exclusive: &dyn Fn(&str) -> bool,
    approved: &BTreeSet<&str>,
) -> Vec<Look> {
    let mut out = Vec::new();
    let permissions = permission_targets(&resolved.permissions);
    for ns in &resolved.namespaces {
        if !owned(ns) || approved.contains(ns.as_str()) {
            continue;
        }
        let held_here = held(ns);
        let mut targets: Vec<Target> = resolved
            .apis
            .iter()
            .filter(|a| a.namespaced && !(held_here && granted(&a.name)))
            .map(|a| Target::Api(a.clone()))
            .collect();
        if !held_here {
            targets.extend(permissions.iter().cloned());
        }
        if !targets.is_empty() {
            out.push(Look {
                what: format!("namespace {ns}"),
                namespace: Some(ns.clone()),
                targets,
            });
        }
    }
    for a in resolved.apis.iter().filter(|a| !a.namespaced) {
        if exclusive(&a.name) && !granted(&a.name) && !approved.contains(a.name.as_str()) {
            out.push(Look {
                what: format!("API {}", a.name),
                namespace: None,
                targets: vec![Target::Api(a.clone())],
            });
        }
    }
    out
}

/// What a Pod can be made to mount or run as in its namespace, so what creating workloads
/// reaches besides the workloads themselves.
const MOUNTABLE: [&str; 4] = [
    "secrets",
    "configmaps",
    "persistentvolumeclaims",
    "serviceaccounts",
];

/// Whether a rule lets its holder create or change what may run Pods: a write on anything but
/// the built-in resources known to start none. Fails closed: a CRD may start Pods (a workflow,
/// a pipeline run, a virtual machine), and those mount what the namespace holds.
fn runs_workloads(r: &PolicyRule) -> bool {
    const POD_FREE_GROUPS: [&str; 7] = [
        "rbac.authorization.k8s.io",
        "networking.k8s.io",
        "coordination.k8s.io",
        "events.k8s.io",
        "discovery.k8s.io",
        "policy",
        "autoscaling",
    ];
    const POD_FREE_CORE: [&str; 9] = [
        "configmaps",
        "secrets",
        "services",
        "endpoints",
        "events",
        "persistentvolumeclaims",
        "serviceaccounts",
        "limitranges",
        "resourcequotas",
    ];
    let writes = r
        .verbs
        .iter()
        .any(|v| matches!(v.as_str(), "create" | "update" | "patch" | "*"));
    writes
        && r.api_groups.iter().flatten().any(|g| {
            r.resources.iter().flatten().any(|res| {
                let base = res.split('/').next().unwrap_or_default();
                let pod_free = match g.as_str() {
                    "" => POD_FREE_CORE.contains(&base),
                    g => POD_FREE_GROUPS.contains(&g),
                };
                !pod_free
            })
        })
}

/// The resources an Export's resource rules reach in a Grant's namespaces, each once. Any verb
/// counts: a write answers with the object it wrote. A subresource counts as its resource (the
/// logs of a pod are the pod's). A rule that creates or changes workloads reaches what a Pod
/// can mount or run as there (Secrets, ConfigMaps, PersistentVolumeClaims, ServiceAccounts)
/// too.
pub fn permission_targets(rules: &[PolicyRule]) -> Vec<Target> {
    let mut out: Vec<Target> = Vec::new();
    if rules.iter().any(runs_workloads) {
        out.extend(MOUNTABLE.iter().map(|r| Target::Permission {
            group: String::new(),
            resource: (*r).to_string(),
            names: Vec::new(),
        }));
    }
    for r in rules
        .iter()
        .filter(|r| r.non_resource_urls.as_ref().is_none_or(Vec::is_empty))
    {
        let names = r.resource_names.clone().unwrap_or_default();
        for group in r.api_groups.iter().flatten() {
            for resource in r.resources.iter().flatten() {
                let base = resource.split('/').next().unwrap_or_default();
                let t = if group.contains('*') || base.contains('*') {
                    Target::Unlistable(format!(
                        "the Export's permissions grant {resource} of API group {group:?}, which the issuer cannot look through"
                    ))
                } else {
                    Target::Permission {
                        group: group.clone(),
                        resource: base.to_string(),
                        names: names.clone(),
                    }
                };
                if !out.contains(&t) {
                    out.push(t);
                }
            }
        }
    }
    out
}

/// Whether an object found where a Grant would newly hold counts as another consumer's: any
/// object while the Grant is unpinned; else one not labelled with its pin (an unlabelled one
/// too: a copy handed over with deletion-policy Orphan keeps its data and loses the label),
/// or labelled with it but not strictly younger than the pin (`pinned`: when the Grant was
/// pinned, `None` when unknown): before its pin a Grant's identity writes nothing, so such an
/// object was left by an earlier consumer of that UID (a revoked Grant), not written through
/// this one.
pub fn counts(
    pin: Option<&str>,
    pinned: Option<Timestamp>,
    label: Option<&str>,
    created: Option<Timestamp>,
) -> bool {
    let Some(pin) = pin else {
        return true;
    };
    if label != Some(pin) {
        return true;
    }
    match (pinned, created) {
        (Some(p), Some(o)) => o <= p,
        _ => true,
    }
}

/// Objects a namespace holds from its creation, nobody's to hand over, as field selectors:
/// the cluster's CA bundles (OpenShift adds its service CA), the ServiceAccounts the cluster
/// makes (OpenShift adds `builder` and `deployer`), and the token and pull Secrets made for
/// them (before Kubernetes 1.24, and on OpenShift).
pub fn namespace_defaults(group: &str, resource: &str) -> &'static [&'static str] {
    match (group, resource) {
        ("", "configmaps") => &[
            "metadata.name!=kube-root-ca.crt",
            "metadata.name!=openshift-service-ca.crt",
        ],
        ("", "serviceaccounts") => &[
            "metadata.name!=default",
            "metadata.name!=builder",
            "metadata.name!=deployer",
        ],
        ("", "secrets") => &[
            "type!=kubernetes.io/service-account-token",
            "type!=kubernetes.io/dockercfg",
        ],
        _ => &[],
    }
}

/// The Blocked message for a place that needs a person: what it found, and the approval.
pub fn message(grant: &str, what: &str, finding: &Finding, annotation: &str) -> String {
    let name = what.split_once(' ').map_or(what, |(_, n)| n);
    let found = match finding {
        Finding::Object(example) => format!(
            "holds another consumer's objects (such as {example}), which this Grant's consumer would read: revoking a Grant never deletes provider data"
        ),
        Finding::Unchecked(why) => {
            format!("may hold another consumer's objects, and the issuer could not look ({why})")
        }
    };
    format!(
        "{what} {found}. Empty it, or let this Grant have it: kubectl annotate grant {grant} {annotation}={name}"
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn api(name: &str, namespaced: bool) -> ResolvedApi {
        ResolvedApi {
            name: name.into(),
            group: "example.org".into(),
            plural: name.split('.').next().unwrap_or_default().into(),
            namespaced,
            version: "v1".into(),
        }
    }

    fn rules(v: serde_json::Value) -> Vec<PolicyRule> {
        serde_json::from_value(v).unwrap()
    }

    #[test]
    fn permission_rules_become_resources_to_look_at() {
        let r = rules(json!([
            {"apiGroups": [""], "resources": ["secrets", "configmaps"], "verbs": ["get"]},
            {"apiGroups": [""], "resources": ["pods/log"], "verbs": ["get"]},
            {"apiGroups": [""], "resources": ["secrets"], "verbs": ["list"]},
            {"apiGroups": ["apps"], "resources": ["deployments"], "resourceNames": ["web"], "verbs": ["get"]},
            {"apiGroups": ["*"], "resources": ["widgets"], "verbs": ["get"]},
            {"nonResourceURLs": ["/healthz"], "verbs": ["get"]},
        ]));
        let p = |g: &str, r: &str, n: &[&str]| Target::Permission {
            group: g.into(),
            resource: r.into(),
            names: n.iter().map(|s| s.to_string()).collect(),
        };
        let t = permission_targets(&r);
        assert_eq!(t.len(), 5, "{t:?}");
        // Creating workloads reaches what a Pod mounts or runs as.
        let w = permission_targets(&rules(json!([
            {"apiGroups": ["apps"], "resources": ["deployments"], "verbs": ["create"]},
        ])));
        let names: Vec<String> = w
            .iter()
            .map(|t| match t {
                Target::Permission { resource, .. } => resource.clone(),
                other => format!("{other:?}"),
            })
            .collect();
        assert_eq!(
            names,
            [
                "secrets",
                "configmaps",
                "persistentvolumeclaims",
                "serviceaccounts",
                "deployments"
            ]
        );
        let read_only = permission_targets(&rules(json!([
            {"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list"]},
        ])));
        assert_eq!(
            read_only.len(),
            1,
            "reading pods mounts nothing: {read_only:?}"
        );
        // Writing what is known to start no Pod adds nothing; writing a CRD's objects does
        // (it may start Pods).
        let pod_free = permission_targets(&rules(json!([
            {"apiGroups": [""], "resources": ["configmaps"], "verbs": ["create"]},
            {"apiGroups": ["networking.k8s.io"], "resources": ["ingresses"], "verbs": ["*"]},
        ])));
        assert_eq!(pod_free.len(), 2, "{pod_free:?}");
        let crd = permission_targets(&rules(json!([
            {"apiGroups": ["argoproj.io"], "resources": ["workflows"], "verbs": ["create"]},
        ])));
        assert_eq!(crd.len(), 5, "{crd:?}");
        assert_eq!(t[0], p("", "secrets", &[]));
        assert_eq!(t[1], p("", "configmaps", &[]));
        assert_eq!(t[2], p("", "pods", &[]), "a subresource is its resource's");
        assert_eq!(t[3], p("apps", "deployments", &["web"]));
        assert!(matches!(&t[4], Target::Unlistable(m) if m.contains("\"*\"")));
    }

    #[test]
    fn a_grant_looks_where_it_would_read_first() {
        let resolved = Resolved {
            exports: vec!["e".into()],
            apis: vec![
                api("widgets.example.org", true),
                api("nodes.example.org", false),
            ],
            permissions: rules(
                json!([{"apiGroups": [""], "resources": ["secrets"], "verbs": ["get"]}]),
            ),
            namespaces: vec!["a".into(), "b".into(), "c".into(), "taken".into()],
        };
        let owned = |ns: &str| ns != "taken";
        let held = |ns: &str| ns == "b" || ns == "c";
        let none = BTreeSet::new();
        // Nothing granted yet: a and b (held, API not granted) get looked at; c too.
        let l = looks(&resolved, &owned, &held, &|_| false, &|_| true, &none);
        let whats: Vec<&str> = l.iter().map(|l| l.what.as_str()).collect();
        assert_eq!(
            whats,
            [
                "namespace a",
                "namespace b",
                "namespace c",
                "API nodes.example.org"
            ]
        );
        // Not held: the APIs and the permission resources; held: only APIs not granted.
        assert_eq!(l[0].targets.len(), 2);
        assert_eq!(l[1].targets.len(), 1);
        assert!(matches!(l[1].targets[0], Target::Api(_)));
        assert_eq!(l[3].namespace, None);
        // Everything granted and held: only the namespace without its Role yet.
        let l = looks(&resolved, &owned, &held, &|_| true, &|_| true, &none);
        let whats: Vec<&str> = l.iter().map(|l| l.what.as_str()).collect();
        assert_eq!(whats, ["namespace a"]);
        // Approved places are not looked at; a shared cluster-scoped API neither.
        let approved: BTreeSet<&str> = ["a", "b"].into();
        let l = looks(&resolved, &owned, &held, &|_| false, &|_| false, &approved);
        let whats: Vec<&str> = l.iter().map(|l| l.what.as_str()).collect();
        assert_eq!(whats, ["namespace c"]);
    }

    #[test]
    fn an_object_counts_unless_written_under_the_pin_after_it_was_set() {
        let t = |s: i64| Some(Timestamp::from_second(1_800_000_000 + s).unwrap());
        let pinned = t(0);
        assert!(counts(None, pinned, Some("u"), t(10)), "unpinned: anything");
        assert!(counts(Some("u"), pinned, Some("v"), t(10)), "another's");
        assert!(counts(Some("u"), pinned, None, t(10)), "unlabelled");
        assert!(
            counts(Some("u"), pinned, Some("u"), t(-10)),
            "left before the pin"
        );
        assert!(
            counts(Some("u"), pinned, Some("u"), t(0)),
            "the pin's second: not its own"
        );
        assert!(!counts(Some("u"), pinned, Some("u"), t(10)), "its own");
        assert!(
            counts(Some("u"), None, Some("u"), t(10)),
            "pin time unknown: counts"
        );
    }

    #[test]
    fn the_message_names_what_was_found_and_the_approval() {
        let m = message(
            "g",
            "namespace team",
            &Finding::Object("secrets team/db".into()),
            "iam.kbind.io/approve-handover",
        );
        assert!(
            m.starts_with(
                "namespace team holds another consumer's objects (such as secrets team/db)"
            ),
            "{m}"
        );
        assert!(
            m.ends_with("kubectl annotate grant g iam.kbind.io/approve-handover=team"),
            "{m}"
        );
        let m = message(
            "g",
            "API nodes.example.org",
            &Finding::Unchecked("forbidden".into()),
            "iam.kbind.io/approve-handover",
        );
        assert!(m.contains("could not look (forbidden)"), "{m}");
        assert!(m.ends_with("=nodes.example.org"), "{m}");
    }
}
