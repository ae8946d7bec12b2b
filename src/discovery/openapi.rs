//! Synthesizes consumer `CustomResourceDefinition`s for providers whose APIs are not backed by
//! CRDs (aggregated API servers), from the discovery and OpenAPI v3 documents they still publish.
//!
//! Per the spec, "$ref schemas are replaced with permissive object schemas preserving unknown
//! fields, not fully resolved" (references are never followed, so cycles and long reference
//! chains cannot loop). kbind makes the replacement *untyped* (any value, unknown fields kept):
//! a reference often names a string-valued type such as metav1.Time (docs/deviations.md); the "discovery-preferred version [is] selected for storage", and
//! "discovered status subresources are" reconstructed. Short names, printer columns and the scale
//! subresource are not. Schemas are rebuilt from a keyword whitelist so the result is structural,
//! as kube-apiserver requires, and the output is deterministic so callers can hash it.

use std::collections::BTreeMap;

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use serde_json::{Map, Value, json};

/// Deeper subtrees become the permissive node. Each level nests the CRD's JSON two deeper, so
/// this also keeps the CRD readable by parsers with serde_json's default recursion limit (128).
const MAX_DEPTH: usize = 32;
/// Schema nodes processed per `synthesize` call, all versions together.
const MAX_NODES: usize = 20_000;
const TYPES: [&str; 6] = ["object", "array", "string", "integer", "number", "boolean"];
const SCALARS: [&str; 4] = ["string", "integer", "number", "boolean"];
const ROOT_FIELDS: [&str; 3] = ["apiVersion", "kind", "metadata"];
const PRESERVE: &str = "x-kubernetes-preserve-unknown-fields";
const INT_OR_STRING: &str = "x-kubernetes-int-or-string";
const LIST_TYPE: &str = "x-kubernetes-list-type";
const MAP_KEYS: &str = "x-kubernetes-list-map-keys";
const MAP_TYPE: &str = "x-kubernetes-map-type";

/// One resource version as discovery reports it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DiscoveredVersion {
    pub group: String,
    pub version: String,
    pub kind: String,
    pub plural: String,
    /// May be empty; the lowercased kind is used then.
    pub singular: String,
    pub namespaced: bool,
    /// Discovery listed `<plural>/status`.
    pub has_status: bool,
    /// This version is the group's discovery-preferred version.
    pub preferred: bool,
}

#[derive(Debug, thiserror::Error)]
pub enum SynthError {
    #[error("no versions discovered for the API")]
    NoVersions,
    #[error("API {api}: inconsistent discovery: {detail}")]
    Inconsistent { api: String, detail: String },
    #[error("API {api}: no OpenAPI v3 schema found for version {version}")]
    NoSchema { api: String, version: String },
    #[error("API {api}: OpenAPI schema exceeds the limit of processed schema nodes")]
    TooLarge { api: String },
    #[error("API {api}: synthesized CustomResourceDefinition is invalid: {source}")]
    InvalidSchema {
        api: String,
        source: serde_json::Error,
    },
}

/// True for API groups that belong to Kubernetes itself and are never exported.
pub fn is_builtin_group(group: &str) -> bool {
    let core = matches!(
        group,
        "" | "apps" | "batch" | "autoscaling" | "policy" | "extensions"
    );
    core || group == "k8s.io" || group.ends_with(".k8s.io")
}

/// Synthesize the consumer CRD for one API (all `versions` share group and plural).
/// `docs` maps `"apis/<group>/<version>"` to that group-version's OpenAPI v3 document.
pub fn synthesize(
    versions: &[DiscoveredVersion],
    docs: &BTreeMap<String, Value>,
) -> Result<CustomResourceDefinition, SynthError> {
    let first = versions.first().ok_or(SynthError::NoVersions)?;
    let api = format!("{}.{}", first.plural, first.group);
    if let Some(detail) = inconsistency(versions, first) {
        return Err(SynthError::Inconsistent { api, detail });
    }
    let storage = versions.iter().position(|v| v.preferred).unwrap_or(0);
    let order = std::iter::once(storage).chain((0..versions.len()).filter(|&i| i != storage));
    let mut walker = Walker {
        api: api.clone(),
        nodes: 0,
    };
    let mut crd_versions = Vec::with_capacity(versions.len());
    for i in order {
        let v = &versions[i];
        let no_schema = || SynthError::NoSchema {
            api: api.clone(),
            version: v.version.clone(),
        };
        let schema = walker.root(find_schema(docs, v).ok_or_else(no_schema)?)?;
        let mut version = json!({
            "name": v.version, "served": true, "storage": i == storage,
            "schema": {"openAPIV3Schema": schema},
        });
        if v.has_status {
            version["subresources"] = json!({"status": {}});
        }
        crd_versions.push(version);
    }
    let singular = (versions.iter().map(|v| v.singular.as_str()))
        .find(|s| !s.is_empty())
        .map_or_else(|| first.kind.to_lowercase(), str::to_owned);
    let crd = json!({
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": api},
        "spec": {
            "group": first.group,
            "names": {
                "plural": first.plural, "singular": singular,
                "kind": first.kind, "listKind": format!("{}List", first.kind),
            },
            "scope": if first.namespaced { "Namespaced" } else { "Cluster" },
            "versions": crd_versions,
            "conversion": {"strategy": "None"},
        },
    });
    // Built as JSON; this is where each schema is converted to `JSONSchemaProps`.
    serde_json::from_value(crd).map_err(|source| SynthError::InvalidSchema { api, source })
}

/// Why `versions` cannot form one CRD, if they cannot.
fn inconsistency(versions: &[DiscoveredVersion], first: &DiscoveredVersion) -> Option<String> {
    let differs = |v: &&DiscoveredVersion| {
        (v.group != first.group || v.plural != first.plural)
            || (v.kind != first.kind || v.namespaced != first.namespaced)
    };
    let repeated = |(i, v): &(usize, &DiscoveredVersion)| {
        v.version.is_empty() || versions[..*i].iter().any(|o| o.version == v.version)
    };
    if first.group.is_empty() || first.plural.is_empty() || first.kind.is_empty() {
        Some("empty group, plural or kind".into())
    } else if let Some(v) = versions.iter().find(differs) {
        Some(format!(
            "{} differs in group, plural, kind or scope",
            v.version
        ))
    } else {
        let (_, v) = versions.iter().enumerate().find(repeated)?;
        Some(format!("version {:?} is empty or repeated", v.version))
    }
}

/// The `components.schemas` entry whose `x-kubernetes-group-version-kind` names this version.
fn find_schema<'a>(docs: &'a BTreeMap<String, Value>, v: &DiscoveredVersion) -> Option<&'a Value> {
    let doc = docs.get(&format!("apis/{}/{}", v.group, v.version))?;
    let is_this = |gvk: &Value| {
        let field = |key| gvk.get(key).map_or(Some(""), Value::as_str);
        [field("group"), field("version"), field("kind")]
            == [Some(&*v.group), Some(&*v.version), Some(&*v.kind)]
    };
    let schemas = doc.get("components")?.get("schemas")?.as_object()?;
    schemas.values().find(|s| {
        let gvks = s
            .get("x-kubernetes-group-version-kind")
            .and_then(Value::as_array);
        gvks.is_some_and(|gvks| gvks.iter().any(is_this))
    })
}

/// The schema used in place of every `$ref` and of subtrees below `MAX_DEPTH`.
/// An untyped node accepting any value, as structural schemas allow.
fn untyped(description: Option<&str>) -> Map<String, Value> {
    let mut out = Map::from_iter([(PRESERVE.into(), true.into())]);
    if let Some(d) = description {
        out.insert("description".into(), d.into());
    }
    out
}

fn is_true(v: Option<&Value>) -> bool {
    v == Some(&Value::Bool(true))
}

fn text<'a>(m: &'a Map<String, Value>, key: &str) -> Option<&'a str> {
    m.get(key)?.as_str()
}

fn is_scalar(ty: Option<&Value>) -> bool {
    ty.and_then(Value::as_str)
        .is_some_and(|t| SCALARS.contains(&t))
}

/// Value-validation keywords copied verbatim when well-formed; everything not handled here or
/// in `Walker` (`readOnly`, `default`, `oneOf`, `uniqueItems`, `x-kubernetes-patch-*`, ...) is dropped.
fn keep(key: &str, v: &Value) -> bool {
    match key {
        "description" | "title" | "format" | "pattern" => v.is_string(),
        "maximum" | "minimum" => v.is_number(),
        "multipleOf" => v.as_f64().is_some_and(|n| n > 0.0),
        "maxLength" | "minLength" | "maxItems" | "minItems" | "maxProperties" | "minProperties" => {
            v.as_i64().is_some_and(|n| n >= 0)
        }
        "exclusiveMaximum" | "exclusiveMinimum" | "nullable" => v.is_boolean(),
        "enum" => v
            .as_array()
            .is_some_and(|e| !e.is_empty() && e.iter().all(|x| !x.is_array() && !x.is_object())),
        _ => false,
    }
}

/// `allOf: [{$ref}]`, the way OpenAPI wraps a reference to add a description or default.
fn single_ref(src: &Map<String, Value>) -> Option<&Map<String, Value>> {
    match src.get("allOf")?.as_array()?.as_slice() {
        [Value::Object(inner)] if inner.contains_key("$ref") => Some(inner),
        _ => None,
    }
}

/// `required`, limited to properties that survived.
fn required(src: &Map<String, Value>, props: &Map<String, Value>) -> Option<Value> {
    let names: Vec<Value> = (src.get("required")?.as_array()?.iter())
        .filter(|n| n.as_str().is_some_and(|n| props.contains_key(n)))
        .cloned()
        .collect();
    (!names.is_empty()).then_some(Value::Array(names))
}

/// A list-map needs distinct keys that are required, non-nullable, scalar item properties.
fn map_keys_ok(keys: Option<&Value>, items: &Map<String, Value>) -> bool {
    let keys = keys
        .and_then(Value::as_array)
        .map_or(&[][..], Vec::as_slice);
    let required = items.get("required").and_then(Value::as_array);
    let key_ok = |(i, k): (usize, &Value)| {
        let prop = k.as_str().and_then(|k| items.get("properties")?.get(k));
        !keys[..i].contains(k)
            && required.is_some_and(|r| r.contains(k))
            && prop.is_some_and(|p| is_scalar(p.get("type")) && !is_true(p.get("nullable")))
    };
    !keys.is_empty() && keys.iter().enumerate().all(key_ok)
}

/// Rebuilds schemas depth-first, counting nodes against `MAX_NODES`.
struct Walker {
    api: String,
    nodes: usize,
}

type Node = Result<Map<String, Value>, SynthError>;
type Done = Result<(), SynthError>;

impl Walker {
    fn root(&mut self, src: &Value) -> Result<Value, SynthError> {
        let empty = Map::new();
        let src = src.as_object().unwrap_or(&empty);
        let mut props = Map::new();
        for (name, child) in src
            .get("properties")
            .and_then(Value::as_object)
            .into_iter()
            .flatten()
        {
            if !ROOT_FIELDS.contains(&name.as_str()) {
                props.insert(name.clone(), Value::Object(self.node(child, 1)?));
            }
        }
        let mut out = Map::new();
        if props.is_empty() || is_true(src.get(PRESERVE)) {
            out.insert(PRESERVE.into(), true.into());
        }
        if let Some(req) = required(src, &props) {
            out.insert("required".into(), req);
        }
        if let Some(d) = text(src, "description") {
            out.insert("description".into(), d.into());
        }
        props.insert("apiVersion".into(), json!({"type": "string"}));
        props.insert("kind".into(), json!({"type": "string"}));
        props.insert("metadata".into(), json!({"type": "object"}));
        out.insert("type".into(), "object".into());
        out.insert("properties".into(), Value::Object(props));
        Ok(Value::Object(out))
    }

    fn node(&mut self, v: &Value, depth: usize) -> Node {
        self.nodes += 1;
        if self.nodes > MAX_NODES {
            return Err(SynthError::TooLarge {
                api: self.api.clone(),
            });
        }
        let Some(src) = v.as_object() else {
            return Ok(untyped(None));
        };
        let desc = text(src, "description");
        // A reference may name a string-valued type (metav1.Time, Quantity, IntOrString): the
        // untyped preserve-unknown node accepts any value, where an object schema would not.
        if depth > MAX_DEPTH || src.contains_key("$ref") {
            return Ok(untyped(desc));
        }
        if let Some(inner) = single_ref(src) {
            return Ok(untyped(desc.or_else(|| text(inner, "description"))));
        }
        let mut out: Map<String, Value> = (src.iter().filter(|(k, v)| keep(k, v)))
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        if is_true(src.get(INT_OR_STRING)) {
            out.insert(INT_OR_STRING.into(), true.into());
            return Ok(out); // int-or-string nodes must not have a type
        }
        let has = |key| src.contains_key(key);
        let ty = match text(src, "type").filter(|t| TYPES.contains(t)) {
            Some(ty) => ty,
            None if has("properties") || has("additionalProperties") => "object",
            None if has("items") => "array",
            None => return Ok(untyped(desc)),
        };
        match ty {
            "object" => self.object(src, &mut out, depth)?,
            "array" => self.array(src, &mut out, depth)?,
            _ => {}
        }
        out.insert("type".into(), ty.into());
        Ok(out)
    }

    fn object(
        &mut self,
        src: &Map<String, Value>,
        out: &mut Map<String, Value>,
        depth: usize,
    ) -> Done {
        let mut props = Map::new();
        for (name, child) in src
            .get("properties")
            .and_then(Value::as_object)
            .into_iter()
            .flatten()
        {
            props.insert(name.clone(), Value::Object(self.node(child, depth + 1)?));
        }
        // CRDs forbid `additionalProperties` next to `properties`, and `false` altogether; an
        // open map, or an object without known fields, preserves what it is given instead.
        let mut preserve = is_true(src.get(PRESERVE));
        match src.get("additionalProperties") {
            Some(ap @ Value::Object(_)) if props.is_empty() => {
                let schema = self.node(ap, depth + 1)?;
                out.insert("additionalProperties".into(), Value::Object(schema));
            }
            Some(Value::Object(_) | Value::Bool(true)) => preserve = true,
            _ => {}
        }
        if preserve || (props.is_empty() && !out.contains_key("additionalProperties")) {
            out.insert(PRESERVE.into(), true.into());
        }
        if let Some(req) = required(src, &props) {
            out.insert("required".into(), req);
        }
        if !props.is_empty() {
            out.insert("properties".into(), Value::Object(props));
        }
        if let Some(t @ ("atomic" | "granular")) = text(src, MAP_TYPE) {
            out.insert(MAP_TYPE.into(), t.into());
        }
        Ok(())
    }

    fn array(
        &mut self,
        src: &Map<String, Value>,
        out: &mut Map<String, Value>,
        depth: usize,
    ) -> Done {
        // Tuple-form `items` (an array of schemas) is not allowed in CRDs.
        let items = match src.get("items") {
            Some(i @ Value::Object(_)) => self.node(i, depth + 1)?,
            _ => untyped(None),
        };
        // Set and map lists are kept only where kube-apiserver accepts them.
        let keyed = !is_true(items.get("nullable"));
        let list_type = match text(src, LIST_TYPE) {
            Some("atomic") => Some("atomic"),
            Some("set") if keyed && is_scalar(items.get("type")) => Some("set"),
            Some("map") if keyed && map_keys_ok(src.get(MAP_KEYS), &items) => Some("map"),
            _ => None,
        };
        if let Some(t) = list_type {
            out.insert(LIST_TYPE.into(), t.into());
        }
        if let (Some("map"), Some(keys)) = (list_type, src.get(MAP_KEYS)) {
            out.insert(MAP_KEYS.into(), keys.clone());
        }
        out.insert("items".into(), Value::Object(items));
        Ok(())
    }
}

#[cfg(test)]
mod tests;
