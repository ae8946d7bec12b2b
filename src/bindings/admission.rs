//! Which namespaces may use a Connection (docs/schema.md "Namespaced Bindings"). A Connection
//! carries a credential its owner chose; without this, a tenant who may create a Binding in any
//! namespace drives that credential: CRD installs, sync, and with `conflictPolicy: Adopt` the
//! takeover of provider objects kbind did not create. The Connection names the namespaces whose
//! Bindings it serves (`spec.bindingNamespaces`) and those whose Bindings may adopt
//! (`spec.adoptionNamespaces`), by label selector with Kubernetes semantics. ClusterBindings are
//! cluster-admin objects and are not affected.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Namespace;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use kube::api::ListParams;
use kube::{Api, Client, ResourceExt};

use crate::api::core::Connection;
use crate::pass::list;

/// The reason a Binding gets when its Connection does not admit its namespace.
pub const NAMESPACE_NOT_ALLOWED: &str = "NamespaceNotAllowed";

/// Whether a binding may use its Connection.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum Admission {
    /// A ClusterBinding, or a Binding in a namespace the Connection admits.
    #[default]
    Admitted,
    /// A Binding its Connection does not serve: the message says why and what to set.
    NotAllowed(String),
}

impl Admission {
    pub fn admitted(&self) -> bool {
        matches!(self, Self::Admitted)
    }
}

/// A label selector Kubernetes would refuse.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SelectorError {
    #[error(
        "matchExpressions: operator {operator:?} on key {key:?} is not In, NotIn, Exists or DoesNotExist"
    )]
    UnknownOperator { key: String, operator: String },
    #[error("matchExpressions: {operator} on key {key:?} needs at least one value")]
    NoValues { key: String, operator: String },
    #[error("matchExpressions: {operator} on key {key:?} takes no values")]
    UnexpectedValues { key: String, operator: String },
}

/// Whether `labels` match `sel` (Kubernetes semantics: every term must hold; `{}` matches all).
pub fn matches(
    sel: &LabelSelector,
    labels: &BTreeMap<String, String>,
) -> Result<bool, SelectorError> {
    let mut all = true;
    for (k, v) in sel.match_labels.iter().flatten() {
        all &= labels.get(k) == Some(v);
    }
    for e in sel.match_expressions.iter().flatten() {
        let values = e.values.as_deref().unwrap_or_default();
        let (key, operator) = (e.key.clone(), e.operator.clone());
        let got = labels.get(&e.key);
        let holds = match e.operator.as_str() {
            "In" | "NotIn" if values.is_empty() => {
                return Err(SelectorError::NoValues { key, operator });
            }
            "Exists" | "DoesNotExist" if !values.is_empty() => {
                return Err(SelectorError::UnexpectedValues { key, operator });
            }
            "In" => got.is_some_and(|g| values.contains(g)),
            "NotIn" => !got.is_some_and(|g| values.contains(g)),
            "Exists" => got.is_some(),
            "DoesNotExist" => got.is_none(),
            _ => return Err(SelectorError::UnknownOperator { key, operator }),
        };
        all &= holds;
    }
    Ok(all)
}

/// The labels (and UIDs) of the namespaces, read once per run (one LIST of metadata, only when
/// needed: a namespaced Binding exists, or resync syncs a namespaced API). A failed read admits
/// nothing: when unsure, a tenant's Binding does not drive the credential.
#[derive(Clone, Debug)]
pub struct NamespaceLabels(Result<BTreeMap<String, BTreeMap<String, String>>, String>);

/// Namespace name → UID, from the same read.
pub type NamespaceUids = BTreeMap<String, String>;

impl NamespaceLabels {
    pub async fn read(client: &Client, needed: bool) -> (Self, NamespaceUids) {
        if !needed {
            return (Self(Ok(BTreeMap::new())), BTreeMap::new());
        }
        let api = Api::<Namespace>::all(client.clone());
        match list::metadata(&api, &ListParams::default()).await {
            Ok(ns) => {
                let uids = ns
                    .iter()
                    .filter_map(|n| Some((n.name_any(), n.metadata.uid.clone()?)))
                    .collect();
                let labels = ns
                    .into_iter()
                    .map(|n| (n.name_any(), n.metadata.labels.unwrap_or_default()))
                    .collect();
                (Self(Ok(labels)), uids)
            }
            Err(e) => {
                let why = e.to_string();
                tracing::warn!(error = %why, "namespaces unreadable: no namespaced Binding is admitted this run");
                (Self(Err(why)), BTreeMap::new())
            }
        }
    }

    #[cfg(test)]
    pub fn of(ns: &[(&str, &[(&str, &str)])]) -> Self {
        Self(Ok(ns
            .iter()
            .map(|(n, l)| {
                let l = l.iter().map(|(k, v)| (k.to_string(), v.to_string()));
                (n.to_string(), l.collect())
            })
            .collect()))
    }
}

/// Whether the Connection admits a Binding in `namespace`, and if not, what to set.
pub fn admission(conn: &Connection, namespace: &str, labels: &NamespaceLabels) -> Admission {
    let name = conn.name_any();
    let not = |why: String| Admission::NotAllowed(why);
    let Some(sel) = &conn.spec.binding_namespaces else {
        return not(format!(
            "Connection {name} serves no namespaced Binding: its spec.bindingNamespaces is not set; \
             its owner may admit this namespace, e.g. spec.bindingNamespaces: {{matchLabels: \
             {{kubernetes.io/metadata.name: {namespace}}}}}, or bind with a ClusterBinding"
        ));
    };
    match namespace_matches(sel, namespace, labels) {
        Ok(true) => Admission::Admitted,
        Ok(false) => not(format!(
            "namespace {namespace} does not match Connection {name}'s spec.bindingNamespaces; \
             its owner may admit it there, or label the namespace to match"
        )),
        Err(NoMatch::Selector(why)) => not(format!(
            "Connection {name}'s spec.bindingNamespaces is not a valid selector: {why}"
        )),
        Err(NoMatch::Unread(why)) => not(format!(
            "the labels of namespace {namespace} could not be read ({why}); retried next run"
        )),
    }
}

/// Whether a Binding in `namespace` may adopt provider objects kbind did not create.
pub fn may_adopt(conn: &Connection, namespace: &str, labels: &NamespaceLabels) -> bool {
    conn.spec
        .adoption_namespaces
        .as_ref()
        .is_some_and(|sel| matches!(namespace_matches(sel, namespace, labels), Ok(true)))
}

enum NoMatch {
    Selector(SelectorError),
    Unread(String),
}

fn namespace_matches(
    sel: &LabelSelector,
    namespace: &str,
    labels: &NamespaceLabels,
) -> Result<bool, NoMatch> {
    let all = labels.0.as_ref().map_err(|e| NoMatch::Unread(e.clone()))?;
    let empty = BTreeMap::new();
    matches(sel, all.get(namespace).unwrap_or(&empty)).map_err(NoMatch::Selector)
}

#[cfg(test)]
mod tests;
