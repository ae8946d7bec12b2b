use super::*;

const GROUP: &str = "widgets.example.io";
const API: &str = "widgets.widgets.example.io";
const OPEN: &str = PRESERVE;

fn ver(version: &str, preferred: bool, has_status: bool) -> DiscoveredVersion {
    let (group, kind, plural) = (GROUP.into(), "Widget".into(), "widgets".into());
    let (version, singular, namespaced) = (version.into(), String::new(), true);
    DiscoveredVersion {
        group,
        version,
        kind,
        plural,
        singular,
        namespaced,
        has_status,
        preferred,
    }
}

/// The Widget schema as kube-openapi emits it, with `spec` given by the test.
fn widget(version: &str, spec: Value) -> Value {
    json!({
        "description": "Widget is an example aggregated resource.",
        "type": "object",
        "required": ["spec"],
        "properties": {
            "apiVersion": {"description": "APIVersion defines the versioned schema.", "type": "string"},
            "kind": {"description": "Kind is a string value.", "type": "string"},
            "metadata": {"default": {}, "allOf": [{"$ref": "#/components/schemas/io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta"}]},
            "spec": spec,
            "status": {"default": {}, "allOf": [{"$ref": format!("#/components/schemas/io.example.widgets.{version}.WidgetStatus")}]}
        },
        "x-kubernetes-group-version-kind": [{"group": GROUP, "kind": "Widget", "version": version}]
    })
}

/// An OpenAPI v3 document as served at /openapi/v3/apis/<group>/<version>, keyed for `docs`.
fn doc(version: &str, widget: Value) -> (String, Value) {
    let mut doc = json!({
        "openapi": "3.0.0", "info": {"title": "Kubernetes", "version": "v1.33.0"}, "paths": {},
        "components": {"schemas": {
            "io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta": {"type": "object", "properties": {"name": {"type": "string"}}}
        }}
    });
    let schemas = &mut doc["components"]["schemas"];
    schemas[format!("io.example.widgets.{version}.Widget")] = widget;
    schemas[format!("io.example.widgets.{version}.WidgetList")] = json!({
        "type": "object",
        "properties": {"items": {"type": "array", "items": {"$ref": format!("#/components/schemas/io.example.widgets.{version}.Widget")}}},
        "x-kubernetes-group-version-kind": [{"group": GROUP, "kind": "WidgetList", "version": version}]
    });
    (format!("apis/{GROUP}/{version}"), doc)
}

fn docs_for(versions: &[&str]) -> BTreeMap<String, Value> {
    let spec =
        json!({"type": "object", "properties": {"size": {"type": "integer", "format": "int32"}}});
    versions
        .iter()
        .map(|v| doc(v, widget(v, spec.clone())))
        .collect()
}

fn schema(crd: &CustomResourceDefinition, i: usize) -> Value {
    serde_json::to_value(&crd.spec.versions[i].schema).unwrap()["openAPIV3Schema"].take()
}

fn root_of(widget_schema: Value) -> Value {
    let docs = BTreeMap::from([doc("v1", widget_schema)]);
    schema(&synthesize(&[ver("v1", true, true)], &docs).unwrap(), 0)
}

fn spec_of(spec: Value) -> Value {
    root_of(widget("v1", spec))["properties"]["spec"].take()
}

/// The structural-schema rules kube-apiserver enforces that this module relies on.
fn assert_structural(s: &Value, path: &str) {
    let typed = s.get("type").is_some() || s.get(OPEN).is_some() || s.get(INT_OR_STRING).is_some();
    assert!(typed, "{path}: {s}");
    for bad in "$ref allOf oneOf anyOf readOnly x-kubernetes-group-version-kind".split(' ') {
        assert!(s.get(bad).is_none(), "{bad} at {path}");
    }
    assert!(s.get("properties").is_none() || s.get("additionalProperties").is_none());
    for (k, p) in s["properties"].as_object().into_iter().flatten() {
        assert_structural(p, &format!("{path}.{k}"));
    }
    for k in ["items", "additionalProperties"] {
        (s.get(k).into_iter()).for_each(|c| assert_structural(c, &format!("{path}.{k}")));
    }
}

#[test]
fn storage_is_preferred_version_else_first() {
    // (discovered versions in order, the preferred one, expected CRD versions in order)
    let cases = [
        (
            &["v1alpha1", "v1", "v2"][..],
            Some("v1"),
            &["v1", "v1alpha1", "v2"][..],
        ),
        (&["v1beta1", "v1"], None, &["v1beta1", "v1"]),
        (&["v1"], Some("v1"), &["v1"]),
    ];
    for (input, preferred, want) in cases {
        let versions: Vec<_> = input
            .iter()
            .map(|v| ver(v, Some(*v) == preferred, false))
            .collect();
        let crd = synthesize(&versions, &docs_for(input)).unwrap();
        let got: Vec<_> = (crd.spec.versions.iter())
            .map(|v| (v.name.as_str(), v.storage, v.served))
            .collect();
        let want: Vec<_> = want
            .iter()
            .enumerate()
            .map(|(i, v)| (*v, i == 0, true))
            .collect();
        assert_eq!(got, want);
    }
}

#[test]
fn names_scope_conversion_and_root() {
    let mut versions = [ver("v1", true, false)];
    versions[0].namespaced = false;
    let crd = synthesize(&versions, &docs_for(&["v1"])).unwrap();
    assert_eq!(
        serde_json::to_value(&crd.metadata).unwrap(),
        json!({"name": API})
    );
    let names = serde_json::to_value(&crd.spec.names).unwrap();
    let want = json!({"kind": "Widget", "listKind": "WidgetList", "plural": "widgets", "singular": "widget"});
    assert_eq!(names, want);
    assert_eq!(
        (crd.spec.group.as_str(), crd.spec.scope.as_str()),
        (GROUP, "Cluster")
    );
    let conversion = serde_json::to_value(&crd.spec.conversion).unwrap();
    assert_eq!(conversion, json!({"strategy": "None"}));
    let root = schema(&crd, 0);
    let props = &root["properties"];
    let string = json!({"type": "string"});
    assert_eq!([&props["apiVersion"], &props["kind"]], [&string, &string]);
    assert_eq!(props["metadata"], json!({"type": "object"}));
    assert_eq!(
        props["spec"]["properties"]["size"],
        json!({"type": "integer", "format": "int32"})
    );
    assert_eq!(
        [&root["type"], &root["required"]],
        [&json!("object"), &json!(["spec"])]
    );
}

#[test]
fn status_subresource_only_where_discovered() {
    let versions = [ver("v1", true, true), ver("v1beta1", false, false)];
    let crd = synthesize(&versions, &docs_for(&["v1", "v1beta1"])).unwrap();
    let to_json = |v: &_| serde_json::to_value(v).unwrap();
    let got: Vec<_> = crd
        .spec
        .versions
        .iter()
        .map(|v| to_json(&v.subresources))
        .collect();
    assert_eq!(got, [json!({"status": {}}), Value::Null]);
}

#[test]
fn refs_become_permissive_nodes_everywhere() {
    let r = json!({"$ref": "#/components/schemas/io.example.widgets.v1.Gear", "description": "A gear."});
    // Untyped: the referenced type may be a string (metav1.Time) or a number.
    let want = json!({OPEN: true, "description": "A gear."});
    // [spec schema, JSON pointer to where the reference was]
    let cases = json!([
        [{"properties": {"a": {"properties": {"b": {"properties": {"c": r}}}}}}, "/properties/a/properties/b/properties/c"],
        [{"properties": {"gears": {"type": "array", "items": r}}}, "/properties/gears/items"],
        [{"properties": {"byName": {"type": "object", "additionalProperties": r}}}, "/properties/byName/additionalProperties"],
        [r, ""],
    ]);
    for case in cases.as_array().unwrap() {
        let out = spec_of(case[0].clone());
        assert_eq!(
            out.pointer(case[1].as_str().unwrap()),
            Some(&want),
            "{}",
            case[1]
        );
        assert!(!out.to_string().contains("$ref"));
    }
}

#[test]
fn self_reference_terminates_with_permissive_child() {
    let mut schema = widget("v1", json!({"type": "object"}));
    schema["properties"]["child"] =
        json!({"$ref": "#/components/schemas/io.example.widgets.v1.Widget"});
    assert_eq!(root_of(schema)["properties"]["child"], json!({OPEN: true}));
}

#[test]
fn all_of_wrapped_ref_keeps_description() {
    let target = "#/components/schemas/io.example.widgets.v1.WidgetSpec";
    let spec = json!({"description": "Desired state.", "default": {}, "allOf": [{"$ref": target}]});
    // Defaults are dropped: they may not validate, and the provider defaults anyway.
    let want = json!({OPEN: true, "description": "Desired state."});
    assert_eq!(spec_of(spec), want);
}

#[test]
fn missing_doc_or_schema_is_no_schema() {
    let mut wrong_kind = docs_for(&["v1"]);
    for d in wrong_kind.values_mut() {
        let w = &mut d["components"]["schemas"]["io.example.widgets.v1.Widget"];
        w["x-kubernetes-group-version-kind"][0]["kind"] = json!("Gadget");
    }
    let cases = [
        (BTreeMap::new(), "v1"),
        (wrong_kind, "v1"),
        (docs_for(&["v1"]), "v2"),
    ];
    for (docs, missing) in cases {
        let err =
            synthesize(&[ver("v1", true, false), ver("v2", false, false)], &docs).unwrap_err();
        let SynthError::NoSchema { api, version } = &err else {
            panic!("{err}")
        };
        assert_eq!((api.as_str(), version.as_str()), (API, missing));
        assert!(err.to_string().contains(API) && err.to_string().contains(missing));
    }
}

#[test]
fn builtin_groups() {
    let builtin = [
        "apps",
        "batch",
        "",
        "networking.k8s.io",
        "metrics.k8s.io",
        "extensions",
    ];
    let exported = [
        "widgets.example.org",
        "example.com",
        "cluster.x-k8s.io",
        "k8s.io.example.com",
    ];
    for (groups, want) in [(&builtin[..], true), (&exported[..], false)] {
        groups
            .iter()
            .for_each(|g| assert_eq!(is_builtin_group(g), want, "{g:?}"));
    }
}

#[test]
fn untyped_nodes_get_typed_and_bad_keywords_dropped() {
    let item =
        json!({"type": "object", "required": ["name"], "properties": {"name": {"type": "string"}}});
    // [input, expected]
    let cases = json!([
        [{"properties": {"x": {"type": "string", "readOnly": true}}}, {"type": "object", "properties": {"x": {"type": "string"}}}],
        [{"items": {"type": "string"}}, {"type": "array", "items": {"type": "string"}}],
        [{"type": "array", "uniqueItems": true}, {"type": "array", "items": {OPEN: true}}],
        [{"description": "anything", "default": 3}, {OPEN: true, "description": "anything"}],
        [{"type": "string", "format": "int-or-string", INT_OR_STRING: true}, {"format": "int-or-string", INT_OR_STRING: true}],
        [{"type": "object", "additionalProperties": false, "properties": {"a": {"type": "integer", "format": "int64", "default": 1}}},
         {"type": "object", "properties": {"a": {"type": "integer", "format": "int64"}}}],
        [{"type": "object", "additionalProperties": false}, {"type": "object", OPEN: true}],
        [{"type": "object", "additionalProperties": {"type": "string"}}, {"type": "object", "additionalProperties": {"type": "string"}}],
        [{"type": "string", "oneOf": [{"type": "string"}], "x-kubernetes-patch-strategy": "merge", "enum": ["a", "b"]}, {"type": "string", "enum": ["a", "b"]}],
        [{"type": "array", "items": {"type": "string"}, MAP_KEYS: ["name"]}, {"type": "array", "items": {"type": "string"}}],
        [{"type": "array", "items": {"type": "string"}, LIST_TYPE: "set"}, {"type": "array", "items": {"type": "string"}, LIST_TYPE: "set"}],
        [{"type": "array", "items": {"type": "string", "nullable": true}, LIST_TYPE: "set"}, {"type": "array", "items": {"type": "string", "nullable": true}}],
        [{"type": "array", "items": {"$ref": "#/x"}, LIST_TYPE: "map", MAP_KEYS: ["name"]}, {"type": "array", "items": {OPEN: true}}],
        [{"type": "array", "items": item, LIST_TYPE: "map", MAP_KEYS: ["name"], "x-kubernetes-patch-merge-key": "name"},
         {"type": "array", "items": item, LIST_TYPE: "map", MAP_KEYS: ["name"]}],
    ]);
    for case in cases.as_array().unwrap() {
        let got = spec_of(json!({"properties": {"f": case[0]}}))["properties"]["f"].take();
        assert_eq!(got, case[1], "{}", case[0]);
    }
}

#[test]
fn deep_nesting_is_bounded() {
    let mut spec = json!({"type": "string"});
    for _ in 0..200 {
        spec = json!({"type": "object", "properties": {"child": spec}});
    }
    let docs = BTreeMap::from([doc("v1", widget("v1", spec))]);
    let crd = synthesize(&[ver("v1", true, false)], &docs).unwrap();
    // The CRD survives a round trip through serde_json's default recursion limit.
    let text = serde_json::to_string(&crd).unwrap();
    let back: CustomResourceDefinition = serde_json::from_str(&text).unwrap();
    let (mut node, mut depth) = (schema(&back, 0)["properties"]["spec"].take(), 1);
    while let Some(child) = node.get_mut("properties").and_then(|p| p.get_mut("child")) {
        (node, depth) = (child.take(), depth + 1);
    }
    assert_eq!((depth, node), (MAX_DEPTH + 1, json!({OPEN: true})));
}

#[test]
fn too_many_nodes_is_too_large() {
    let props: Map<String, Value> = (0..MAX_NODES)
        .map(|i| (format!("f{i}"), json!({})))
        .collect();
    let docs = BTreeMap::from([doc("v1", widget("v1", json!({"properties": props})))]);
    let err = synthesize(&[ver("v1", true, false)], &docs).unwrap_err();
    assert!(matches!(err, SynthError::TooLarge { api } if api == API));
}

#[test]
fn inconsistent_or_empty_input_is_rejected() {
    let docs = docs_for(&["v1", "v2"]);
    assert!(matches!(
        synthesize(&[], &docs),
        Err(SynthError::NoVersions)
    ));
    let mut other_kind = ver("v2", false, false);
    other_kind.kind = "Gadget".into();
    for second in [other_kind, ver("v1", false, false)] {
        let result = synthesize(&[ver("v1", true, false), second], &docs);
        assert!(matches!(result, Err(SynthError::Inconsistent { api, .. }) if api == API));
    }
}

#[test]
fn output_is_deterministic_and_structural() {
    let spec = json!({"properties": {
        "z": {"allOf": [{"$ref": "#/a"}]}, "a": {"type": "array", "items": {"properties": {"k": {}}}},
        "m": {"additionalProperties": {"$ref": "#/b"}}, "q": {"anyOf": [{"type": "integer"}]},
        "n": {"type": "object", "properties": {"x": {"type": "string"}}, "additionalProperties": {"type": "string"}},
    }});
    let mut docs = docs_for(&["v1beta1"]);
    docs.extend([doc("v1", widget("v1", spec))]);
    let versions = [ver("v1beta1", false, false), ver("v1", true, true)];
    let first = serde_json::to_string(&synthesize(&versions, &docs).unwrap()).unwrap();
    let second = serde_json::to_string(&synthesize(&versions, &docs).unwrap()).unwrap();
    assert_eq!(first, second);
    let crd: CustomResourceDefinition = serde_json::from_str(&first).unwrap();
    for i in 0..crd.spec.versions.len() {
        assert_structural(&schema(&crd, i), "root");
    }
}
