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
    let permissions = permission_targets(
        &resolved.permissions,
        resolved.apis.iter().any(|a| a.namespaced),
    );
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

/// Whether a rule may create or change objects.
fn writes(r: &PolicyRule) -> bool {
    r.verbs
        .iter()
        .any(|v| matches!(v.as_str(), "create" | "update" | "patch" | "*"))
}

/// Whether a rule lets its holder create or change what may run Pods: a write on anything but
/// the built-in resources known to start none. Fails closed: a CRD may start Pods (a workflow,
/// a pipeline run, a virtual machine), and those mount what the namespace holds; an Ingress
/// names a Secret its controller serves.
fn runs_workloads(r: &PolicyRule) -> bool {
    const POD_FREE_GROUPS: [&str; 6] = [
        "rbac.authorization.k8s.io",
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
    writes(r)
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

/// Why a rule reaches past the objects it names, where the issuer cannot look: acting as
/// another user or ServiceAccount (`impersonate`), or granting more than it holds
/// (`escalate`, `bind`), each also held through `*` on what it applies to.
fn reaches_beyond(r: &PolicyRule) -> Option<String> {
    let verb = |v: &str| r.verbs.iter().any(|x| x == v || x == "*");
    let named = |groups: &[&str], resources: &[&str]| {
        r.api_groups
            .iter()
            .flatten()
            .any(|g| g == "*" || groups.contains(&g.as_str()))
            && r.resources.iter().flatten().any(|res| {
                let base = res.split('/').next().unwrap_or_default();
                base == "*" || resources.contains(&base)
            })
    };
    let impersonates = verb("impersonate")
        && (named(&[""], &["users", "groups", "serviceaccounts"])
            || named(&["authentication.k8s.io"], &["userextras", "uids"]));
    let grants = (verb("escalate") || verb("bind"))
        && named(&["rbac.authorization.k8s.io"], &["roles", "clusterroles"]);
    let why = match (impersonates, grants) {
        (true, _) => "impersonate, acting as whoever it names",
        (_, true) => "escalate or bind on roles, granting more than it holds",
        _ => return None,
    };
    Some(format!(
        "the Export's permissions grant {why}, which the issuer cannot look through"
    ))
}

/// The targets one resource rule names: each resource (a subresource counts as its resource:
/// the logs of a pod are the pod's), with its `resourceNames`; [`Target::Unlistable`] for a
/// `*` or a rule reaching past what it names.
fn rule_targets(r: &PolicyRule) -> Vec<Target> {
    if let Some(why) = reaches_beyond(r) {
        return vec![Target::Unlistable(why)];
    }
    let names = r.resource_names.clone().unwrap_or_default();
    let mut out = Vec::new();
    for group in r.api_groups.iter().flatten() {
        for resource in r.resources.iter().flatten() {
            let base = resource.split('/').next().unwrap_or_default();
            out.push(if group.contains('*') || base.contains('*') {
                Target::Unlistable(format!(
                    "the Export's permissions grant {resource} of API group {group:?}, which the issuer cannot look through"
                ))
            } else {
                Target::Permission {
                    group: group.clone(),
                    resource: base.to_string(),
                    names: names.clone(),
                }
            });
        }
    }
    out
}

fn resource_rules(rules: &[PolicyRule]) -> impl Iterator<Item = &PolicyRule> {
    rules
        .iter()
        .filter(|r| r.non_resource_urls.as_ref().is_none_or(Vec::is_empty))
}

/// The resources an Export's resource rules reach in a Grant's namespaces, each once. Any verb
/// counts: a write answers with the object it wrote. A Grant that creates or changes workloads
/// reaches what a Pod can mount or run as there (Secrets, ConfigMaps, PersistentVolumeClaims,
/// ServiceAccounts) too: through a rule, or through its exported namespaced APIs
/// (`workloads`), whose objects the provider may run Pods for.
pub fn permission_targets(rules: &[PolicyRule], workloads: bool) -> Vec<Target> {
    let mut out: Vec<Target> = Vec::new();
    if workloads || resource_rules(rules).any(runs_workloads) {
        out.extend(MOUNTABLE.iter().map(|r| Target::Permission {
            group: String::new(),
            resource: (*r).to_string(),
            names: Vec::new(),
        }));
    }
    for t in resource_rules(rules).flat_map(rule_targets) {
        if !out.contains(&t) {
            out.push(t);
        }
    }
    out
}

/// The resources an Export's resource rules let its identity write, each once and with no
/// names (an object carrying a UID counts wherever it is): where a revoked Grant's consumer
/// may have left objects labelled with its cluster's UID (docs/issue.md "Confinement"). A
/// subresource is left out: a status write keeps the labels, and the shipped policy refuses
/// every other.
pub fn written_targets(rules: &[PolicyRule]) -> Vec<Target> {
    let mut out: Vec<Target> = Vec::new();
    let writing = resource_rules(rules)
        .filter(|r| writes(r) || reaches_beyond(r).is_some())
        .map(|r| match reaches_beyond(r) {
            Some(_) => r.clone(),
            None => PolicyRule {
                resources: r
                    .resources
                    .as_ref()
                    .map(|v| v.iter().filter(|x| !x.contains('/')).cloned().collect()),
                ..r.clone()
            },
        })
        .collect::<Vec<_>>();
    for t in writing.iter().flat_map(rule_targets) {
        let t = match t {
            Target::Permission {
                group, resource, ..
            } => Target::Permission {
                group,
                resource,
                names: Vec::new(),
            },
            other => other,
        };
        if !out.contains(&t) {
            out.push(t);
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
    let approve = format!("kubectl annotate grant {grant} {annotation}={name}");
    match finding {
        Finding::Object(example) => format!(
            "{what} holds another consumer's objects (such as {example}), which this Grant's consumer would read: revoking a Grant never deletes provider data. Empty it, or let this Grant have it: {approve}"
        ),
        Finding::Unchecked(why) => format!(
            "{what} may hold another consumer's objects, and the issuer could not look ({why}). Let this Grant have it: {approve}; or let the issuer look (a LIST refused: give kbind-issue `list` on it, docs/issue.md \"Read isolation\")"
        ),
    }
}

#[cfg(test)]
mod tests;
