//! Bindings kcp maintains itself. A WorkspaceType with `defaultAPIBindingLifecycle: Maintain`
//! makes kcp rewrite the claims of the default bindings it created in each workspace of the type
//! (every claim of the export, `Accepted`) whenever it reconciles the workspace. kbind writing
//! them would start a fight neither side ends, with a write on every run, so such bindings are
//! found here and left to kcp; the CatalogEntry says so (docs/claims.md "Bindings kcp
//! maintains").
//!
//! Only bindings carrying kcp's generated default-binding name are looked at (one hash each), so
//! the usual binding costs no request; a workspace holding default bindings costs one read of
//! its LogicalCluster, and each WorkspaceType is read once per run.

use std::collections::{BTreeMap, BTreeSet};

use serde_json::Value;
use sha2::{Digest, Sha224};

use super::hub::{Hub, HubError, SlimBinding};

const LOGICAL_CLUSTERS: &str = "apis/core.kcp.io/v1alpha1/logicalclusters";
const WORKSPACE_TYPES: &str = "apis/tenancy.kcp.io/v1alpha1/workspacetypes";
/// Where kcp records a workspace's type (`<path>:<name>`) on its LogicalCluster.
const TYPE_ANNOTATION: &str = "internal.tenancy.kcp.io/type";
/// How deep `spec.extend.with` is followed (kcp's own types nest two or three deep).
const MAX_TYPES: usize = 16;

/// kcp's name for the default binding of export `path:export` in logical cluster `cluster`
/// (its workspace initializer): the export's name (at most 247 characters), `-`, and the first
/// five characters, lowercased, of the SHA-224 of `<cluster>|<path>|<export>` written in base 62.
pub fn default_binding_name(cluster: &str, path: &str, export: &str) -> String {
    let digest = Sha224::digest(format!("{cluster}|{path}|{export}").as_bytes());
    let suffix: String = base62(&digest).chars().take(5).collect();
    let prefix: String = export.chars().take(253 - 1 - 5).collect();
    format!("{prefix}-{}", suffix.to_lowercase())
}

/// A big-endian unsigned integer in base 62, most significant digit first, digits `0-9a-zA-Z`
/// (Go's `big.Int.Text(62)`).
fn base62(bytes: &[u8]) -> String {
    const DIGITS: &[u8; 62] = b"0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ";
    let mut n: Vec<u8> = bytes.iter().copied().skip_while(|b| *b == 0).collect();
    let mut out = Vec::new();
    while !n.is_empty() {
        let mut rem: u32 = 0;
        let mut quotient = Vec::with_capacity(n.len());
        for b in &n {
            let cur = (rem << 8) | u32::from(*b);
            let q = cur / 62;
            rem = cur % 62;
            if !(quotient.is_empty() && q == 0) {
                // q < 256: cur < 62 * 256.
                quotient.push(q as u8);
            }
        }
        out.push(DIGITS[rem as usize]);
        n = quotient;
    }
    if out.is_empty() {
        out.push(b'0');
    }
    out.reverse();
    String::from_utf8_lossy(&out).into_owned()
}

/// Why kbind leaves a binding alone: kcp maintains it (the WorkspaceType, `<path>:<name>`), or
/// whether it does could not be read (the reason), in which case it is not written either.
pub type Maintained = BTreeMap<String, Result<String, String>>;

/// The bindings among `bindings` that kcp maintains, by [`SlimBinding::key`].
pub async fn find(hub: &Hub, bindings: &[&SlimBinding]) -> Maintained {
    let mut out = Maintained::new();
    let mut types = Types::default();
    // A workspace's type, read once however many default bindings it holds.
    let mut workspace_types: BTreeMap<String, Result<Option<String>, String>> = BTreeMap::new();
    for b in bindings {
        if b.name != default_binding_name(&b.cluster, &b.export.path, &b.export.name) {
            continue;
        }
        let workspace_type = match workspace_types.get(&b.cluster) {
            Some(read) => read.clone(),
            None => {
                let read = workspace_type(hub, &b.cluster)
                    .await
                    .map_err(|e| e.to_string());
                workspace_types.insert(b.cluster.clone(), read.clone());
                read
            }
        };
        let verdict = match workspace_type {
            Ok(Some(type_)) => maintained_by(hub, b, type_, &mut types).await,
            other => other,
        };
        match verdict {
            Ok(Some(type_)) => {
                out.insert(b.key(), Ok(type_));
            }
            Ok(None) => {}
            Err(e) => {
                out.insert(b.key(), Err(e));
            }
        }
    }
    out
}

/// The WorkspaceType of logical cluster `cluster` (`<path>:<name>`), from its LogicalCluster.
async fn workspace_type(hub: &Hub, cluster: &str) -> Result<Option<String>, HubError> {
    let what = format!("reading the LogicalCluster of workspace {cluster}");
    let lc = hub
        .get_in_workspace(cluster, LOGICAL_CLUSTERS, "cluster", &what)
        .await?;
    Ok(lc.and_then(|lc| {
        lc["metadata"]["annotations"][TYPE_ANNOTATION]
            .as_str()
            .map(String::from)
    }))
}

/// `type_` when that WorkspaceType (or one it extends) makes kcp maintain `b`.
async fn maintained_by(
    hub: &Hub,
    b: &SlimBinding,
    type_: String,
    types: &mut Types,
) -> Result<Option<String>, String> {
    let defaults = types
        .maintained_defaults(hub, &type_)
        .await
        .map_err(|e| e.to_string())?;
    let export = (b.export.path.clone(), b.export.name.clone());
    Ok(defaults.contains(&export).then_some(type_))
}

/// WorkspaceTypes read this run: per type, the default bindings (path, export) kcp maintains in
/// its workspaces, over the type and every type it extends.
#[derive(Default)]
struct Types(BTreeMap<String, BTreeSet<(String, String)>>);

impl Types {
    async fn maintained_defaults(
        &mut self,
        hub: &Hub,
        type_: &str,
    ) -> Result<&BTreeSet<(String, String)>, HubError> {
        if !self.0.contains_key(type_) {
            let found = resolve(hub, type_).await?;
            self.0.insert(type_.to_string(), found);
        }
        Ok(&self.0[type_])
    }
}

/// Walk `type_` and the types it extends (depth first, each once, at most [`MAX_TYPES`]).
async fn resolve(hub: &Hub, type_: &str) -> Result<BTreeSet<(String, String)>, HubError> {
    let mut out = BTreeSet::new();
    let mut seen = BTreeSet::new();
    let mut queue = vec![type_.to_string()];
    while let Some(next) = queue.pop() {
        if !seen.insert(next.clone()) || seen.len() > MAX_TYPES {
            continue;
        }
        let Some((path, name)) = next.rsplit_once(':') else {
            continue;
        };
        let what = format!("reading WorkspaceType {next}");
        let Some(wt) = hub
            .get_in_workspace(path, WORKSPACE_TYPES, name, &what)
            .await?
        else {
            continue;
        };
        out.extend(maintained_of(&wt));
        for base in wt["spec"]["extend"]["with"]
            .as_array()
            .into_iter()
            .flatten()
        {
            if let (Some(p), Some(n)) = (base["path"].as_str(), base["name"].as_str()) {
                queue.push(format!("{p}:{n}"));
            }
        }
    }
    Ok(out)
}

/// The default bindings (path, export) one WorkspaceType maintains: none unless its lifecycle is
/// `Maintain`; a default without a path is in the type's own logical cluster.
fn maintained_of(wt: &Value) -> Vec<(String, String)> {
    if wt["spec"]["defaultAPIBindingLifecycle"] != "Maintain" {
        return Vec::new();
    }
    let own = wt["metadata"]["annotations"]["kcp.io/cluster"]
        .as_str()
        .unwrap_or_default();
    wt["spec"]["defaultAPIBindings"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|d| {
            let export = d["export"].as_str()?;
            let path = d["path"].as_str().filter(|p| !p.is_empty()).unwrap_or(own);
            Some((path.to_string(), export.to_string()))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// Names kcp v0.31.2 generated for the default bindings of one workspace (read back from a
    /// real kcp in tests/kcp.rs's Maintain scenario).
    #[test]
    fn default_binding_names_are_kcps() {
        let cluster = "2x3je1dciclur7kc";
        assert_eq!(
            default_binding_name(
                cluster,
                "root:kt-maint-a7b3976-1:prov-a7b1924-5",
                "compute.example.io"
            ),
            "compute.example.io-5hzri"
        );
        assert_eq!(
            default_binding_name(
                cluster,
                "root:kt-maint-a7b3976-1:storage-a7bf3d4-3",
                "storage.example.io"
            ),
            "storage.example.io-7cwkp"
        );
    }

    #[test]
    fn base62_is_gos() {
        assert_eq!(base62(&[]), "0");
        assert_eq!(base62(&[0, 61]), "Z");
        assert_eq!(base62(&[0, 62]), "10");
        assert_eq!(base62(&[1, 0]), "48"); // 256 = 4*62 + 8
    }

    #[test]
    fn only_maintain_types_maintain_and_a_default_without_path_is_the_types_own() {
        let wt = |lifecycle: &str| {
            json!({"metadata": {"annotations": {"kcp.io/cluster": "abc"}},
                "spec": {"defaultAPIBindingLifecycle": lifecycle, "defaultAPIBindings": [
                    {"path": "root:prov", "export": "compute"}, {"export": "local"}]}})
        };
        assert_eq!(
            maintained_of(&wt("Maintain")),
            vec![
                ("root:prov".to_string(), "compute".to_string()),
                ("abc".to_string(), "local".to_string())
            ]
        );
        assert!(maintained_of(&wt("InitializeOnly")).is_empty());
        assert!(
            maintained_of(&json!({"spec": {"defaultAPIBindings": [{"export": "x"}]}})).is_empty()
        );
    }
}
