//! The pure part of `kbind bind`: which APIs to bind (checked against what the provider
//! exports), the objects to write (Secret, Connection, ClusterBinding or Binding), and per object
//! whether to create it, update it or leave it alone. No I/O here.

use std::collections::{BTreeMap, BTreeSet};

use serde_json::{Value, json};

use super::BindError;
use crate::api::core::ExportedApi;
use crate::api::keys;

/// The field manager of every `kbind bind` write; an object without it in `managedFields` was
/// not written by `kbind bind` and is not overwritten without `--force`.
pub const MANAGER: &str = "kbind-bind";

/// Which APIs the user asked for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Chosen {
    /// `--apis`.
    Apis(Vec<String>),
    /// `--export`: the Export's `spec.apis[].name`.
    Export { name: String, apis: Vec<String> },
    /// Neither flag.
    Nothing,
}

/// The Grant's issued Secret on the provider, when the kubeconfig came from one.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct GrantInfo {
    pub namespace: String,
    pub name: String,
    /// `iam.kbind.io/grant` of the issued Secret, when known.
    pub grant: Option<String>,
    /// `iam.kbind.io/expires-at` of the issued Secret, when known.
    pub expires_at: Option<String>,
}

/// Everything the plan is made from.
#[derive(Clone, Debug)]
pub struct Inputs<'a> {
    pub name: &'a str,
    pub credential_namespace: &'a str,
    /// `--namespace`: a Binding there instead of a ClusterBinding.
    pub binding_namespace: Option<&'a str>,
    /// The Secret key Connections read (`kubeconfig`).
    pub key: &'a str,
    pub kubeconfig: &'a [u8],
    pub chosen: &'a Chosen,
    /// What the provider exports, sorted by name.
    pub exports: &'a [ExportedApi],
    pub grant: Option<&'a GrantInfo>,
    /// `--label`, on every object written.
    pub labels: &'a BTreeMap<String, String>,
}

/// The APIs to bind: the chosen ones, each exported (and namespaced, for a Binding), sorted and
/// without duplicates.
pub fn choose_apis(i: &Inputs<'_>) -> Result<Vec<String>, BindError> {
    let exported: Vec<String> = i.exports.iter().map(|e| e.name.clone()).collect();
    let chosen: BTreeSet<String> = match i.chosen {
        Chosen::Apis(a) => a
            .iter()
            .map(|s| s.trim().to_string())
            .filter(|s| !s.is_empty())
            .collect(),
        Chosen::Export { name, apis } if apis.is_empty() => {
            return Err(BindError::ExportEmpty {
                export: name.clone(),
            });
        }
        Chosen::Export { apis, .. } => apis.iter().cloned().collect(),
        Chosen::Nothing => BTreeSet::new(),
    };
    if chosen.is_empty() {
        return Err(BindError::NothingChosen { exported });
    }
    let missing: Vec<String> = chosen
        .iter()
        .filter(|a| !exported.contains(a))
        .cloned()
        .collect();
    if !missing.is_empty() {
        return Err(BindError::NotExported {
            missing,
            export: match i.chosen {
                Chosen::Export { name, .. } => Some(name.clone()),
                _ => None,
            },
            exported,
        });
    }
    if let Some(ns) = i.binding_namespace {
        let cluster: Vec<String> = i
            .exports
            .iter()
            .filter(|e| chosen.contains(&e.name) && e.scope == "Cluster")
            .map(|e| e.name.clone())
            .collect();
        if !cluster.is_empty() {
            return Err(BindError::ClusterScopedInBinding {
                namespace: ns.to_string(),
                apis: cluster,
            });
        }
    }
    Ok(chosen.into_iter().collect())
}

/// What an object is, for messages and for the API to write it with.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Secret,
    Connection,
    ClusterBinding,
    Binding,
}

impl Kind {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Secret => "Secret",
            Self::Connection => "Connection",
            Self::ClusterBinding => "ClusterBinding",
            Self::Binding => "Binding",
        }
    }
}

/// One object `kbind bind` writes: its server-side apply body.
#[derive(Clone, Debug, PartialEq)]
pub struct Desired {
    pub kind: Kind,
    pub namespace: Option<String>,
    pub name: String,
    pub body: Value,
}

impl Desired {
    /// `Kind namespace/name` (or `Kind name`), as messages name it.
    pub fn key(&self) -> String {
        match &self.namespace {
            Some(ns) => format!("{} {ns}/{}", self.kind.as_str(), self.name),
            None => format!("{} {}", self.kind.as_str(), self.name),
        }
    }
}

fn metadata(name: &str, namespace: Option<&str>, labels: &BTreeMap<String, String>) -> Value {
    let mut m = json!({"name": name});
    if let Some(ns) = namespace {
        m["namespace"] = json!(ns);
    }
    if !labels.is_empty() {
        m["labels"] = json!(labels);
    }
    m
}

/// The Secret, the Connection and the binding, in the order they are written (the Secret first,
/// so a `kbind schema` run in between finds it).
pub fn desired(i: &Inputs<'_>, apis: &[String]) -> Vec<Desired> {
    // ByteString serializes as base64, as the API server returns `data`: compared as is.
    let b64 = json!(k8s_openapi::ByteString(i.kubeconfig.to_vec()));
    let mut secret_meta = metadata(i.name, Some(i.credential_namespace), i.labels);
    if let Some(g) = i.grant {
        let mut ann = BTreeMap::from([(
            keys::GRANT_SECRET.to_string(),
            format!("{}/{}", g.namespace, g.name),
        )]);
        if let Some(v) = &g.grant {
            ann.insert(keys::IAM_GRANT.into(), v.clone());
        }
        if let Some(v) = &g.expires_at {
            ann.insert(keys::IAM_EXPIRES_AT.into(), v.clone());
        }
        secret_meta["annotations"] = json!(ann);
    }
    let secret = json!({
        "apiVersion": "v1", "kind": "Secret", "metadata": secret_meta,
        "type": "Opaque", "data": {i.key: b64},
    });
    let mut connection = json!({
        "apiVersion": "core.kbind.io/v1alpha1", "kind": "Connection",
        "metadata": metadata(i.name, None, i.labels),
        "spec": {"kubeconfigSecretRef": {
            "namespace": i.credential_namespace, "name": i.name, "key": i.key}},
    });
    // Binding into a namespace is the operator's consent that it may use this Connection
    // (docs/schema.md "Namespaced Bindings"): only that namespace, by its immutable name label.
    if let Some(ns) = i.binding_namespace {
        connection["spec"]["bindingNamespaces"] =
            json!({"matchLabels": {"kubernetes.io/metadata.name": ns}});
    }
    let api_refs: Vec<Value> = apis.iter().map(|a| json!({"name": a})).collect();
    let (kind, binding_kind) = match i.binding_namespace {
        Some(_) => (Kind::Binding, "Binding"),
        None => (Kind::ClusterBinding, "ClusterBinding"),
    };
    let binding = json!({
        "apiVersion": "core.kbind.io/v1alpha1", "kind": binding_kind,
        "metadata": metadata(i.name, i.binding_namespace, i.labels),
        "spec": {"connectionRef": {"name": i.name}, "apis": api_refs},
    });
    vec![
        Desired {
            kind: Kind::Secret,
            namespace: Some(i.credential_namespace.to_string()),
            name: i.name.to_string(),
            body: secret,
        },
        Desired {
            kind: Kind::Connection,
            namespace: None,
            name: i.name.to_string(),
            body: connection,
        },
        Desired {
            kind,
            namespace: i.binding_namespace.map(str::to_string),
            name: i.name.to_string(),
            body: binding,
        },
    ]
}

/// What to do with one object.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub enum Action {
    Create,
    Update,
    Unchanged,
}

impl Action {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Create => "created",
            Self::Update => "updated",
            Self::Unchanged => "unchanged",
        }
    }
}

/// Compare first: an object of ours that already holds everything `want` says is left alone (a
/// second `kbind bind` writes nothing). An existing object `kbind bind` never wrote is refused
/// unless `force` (then written, so it is ours from then on); a Connection naming another Secret
/// is refused always (the reference is immutable).
pub fn decide(want: &Desired, have: Option<&Value>, force: bool) -> Result<Action, BindError> {
    let Some(have) = have else {
        return Ok(Action::Create);
    };
    let ours = have["metadata"]["managedFields"]
        .as_array()
        .is_some_and(|m| m.iter().any(|f| f["manager"] == MANAGER));
    if !ours && !force {
        return Err(BindError::Foreign { object: want.key() });
    }
    if want.kind == Kind::Connection {
        let (w, h) = (
            &want.body["spec"]["kubeconfigSecretRef"],
            &have["spec"]["kubeconfigSecretRef"],
        );
        let same = |f: &str| {
            w[f] == h[f]
                || (f == "key" && h[f].is_null() && w[f] == crate::api::keys::KUBECONFIG_KEY)
        };
        let differs = !(same("namespace") && same("name") && same("key"));
        if !h.is_null() && differs {
            return Err(BindError::SecretRefImmutable {
                connection: want.name.clone(),
                has: format!(
                    "{}/{}",
                    h["namespace"].as_str().unwrap_or_default(),
                    h["name"].as_str().unwrap_or_default()
                ),
                wants: format!(
                    "{}/{}",
                    w["namespace"].as_str().unwrap_or_default(),
                    w["name"].as_str().unwrap_or_default()
                ),
            });
        }
    }
    // A forced foreign object is written even when it matches, so it is ours from then on.
    Ok(if ours && contains(have, &want.body) {
        Action::Unchanged
    } else {
        Action::Update
    })
}

/// Whether `have` holds everything `want` says: objects key by key (other keys allowed), lists
/// of the same length with every wanted element held by one of them, scalars equal.
pub fn contains(have: &Value, want: &Value) -> bool {
    match (have, want) {
        (Value::Object(h), Value::Object(w)) => w
            .iter()
            .all(|(k, wv)| h.get(k).is_some_and(|hv| contains(hv, wv))),
        (Value::Array(h), Value::Array(w)) => {
            h.len() == w.len() && w.iter().all(|wv| h.iter().any(|hv| contains(hv, wv)))
        }
        _ => have == want,
    }
}

/// A Connection `kbind bind` would reuse must still reach the provider it pinned: a kubeconfig
/// for another cluster under the same name is refused (use another `--name`).
pub fn check_identity(
    name: &str,
    connection: Option<&Value>,
    provider_uid: &str,
) -> Result<(), BindError> {
    let pinned = connection.and_then(|c| c["status"]["remoteClusterUID"].as_str());
    match pinned {
        Some(p) if p != provider_uid => Err(BindError::IdentityMismatch {
            connection: name.to_string(),
            pinned: p.to_string(),
            provider: provider_uid.to_string(),
        }),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests;
