use super::*;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelectorRequirement;
use serde_json::json;

fn labels(l: &[(&str, &str)]) -> BTreeMap<String, String> {
    l.iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

fn expr(key: &str, op: &str, values: &[&str]) -> LabelSelectorRequirement {
    LabelSelectorRequirement {
        key: key.into(),
        operator: op.into(),
        values: (!values.is_empty()).then(|| values.iter().map(|v| v.to_string()).collect()),
    }
}

fn sel(ml: &[(&str, &str)], me: Vec<LabelSelectorRequirement>) -> LabelSelector {
    LabelSelector {
        match_labels: (!ml.is_empty()).then(|| labels(ml)),
        match_expressions: (!me.is_empty()).then_some(me),
    }
}

#[test]
fn selectors_match_as_kubernetes_does() {
    let team = labels(&[("team", "a"), ("tier", "gold")]);
    let none = labels(&[]);
    let cases: Vec<(LabelSelector, &BTreeMap<String, String>, bool)> = vec![
        // {} matches every namespace, labelled or not.
        (LabelSelector::default(), &team, true),
        (LabelSelector::default(), &none, true),
        (sel(&[("team", "a")], vec![]), &team, true),
        (sel(&[("team", "b")], vec![]), &team, false),
        (sel(&[("team", "a")], vec![]), &none, false),
        // Every term must hold.
        (
            sel(&[("team", "a")], vec![expr("tier", "In", &["silver"])]),
            &team,
            false,
        ),
        (
            sel(&[], vec![expr("tier", "In", &["silver", "gold"])]),
            &team,
            true,
        ),
        (
            sel(&[], vec![expr("tier", "NotIn", &["gold"])]),
            &team,
            false,
        ),
        // NotIn holds where the key is absent.
        (
            sel(&[], vec![expr("tier", "NotIn", &["gold"])]),
            &none,
            true,
        ),
        (sel(&[], vec![expr("team", "Exists", &[])]), &team, true),
        (sel(&[], vec![expr("team", "Exists", &[])]), &none, false),
        (
            sel(&[], vec![expr("team", "DoesNotExist", &[])]),
            &none,
            true,
        ),
        (
            sel(&[], vec![expr("team", "DoesNotExist", &[])]),
            &team,
            false,
        ),
    ];
    for (i, (s, l, want)) in cases.into_iter().enumerate() {
        assert_eq!(matches(&s, l), Ok(want), "case {i}: {s:?} on {l:?}");
    }
}

#[test]
fn a_selector_kubernetes_would_refuse_is_an_error_naming_the_term() {
    let l = labels(&[("team", "a")]);
    let e = matches(&sel(&[], vec![expr("team", "Equals", &["a"])]), &l).unwrap_err();
    assert!(e.to_string().contains("\"Equals\" on key \"team\""), "{e}");
    let e = matches(&sel(&[], vec![expr("team", "In", &[])]), &l).unwrap_err();
    assert_eq!(
        e,
        SelectorError::NoValues {
            key: "team".into(),
            operator: "In".into()
        }
    );
    let e = matches(&sel(&[], vec![expr("team", "Exists", &["a"])]), &l).unwrap_err();
    assert!(matches!(e, SelectorError::UnexpectedValues { .. }), "{e}");
}

fn connection(spec: serde_json::Value) -> Connection {
    let mut s = json!({"kubeconfigSecretRef": {"namespace": "kbind-system", "name": "p"}});
    s.as_object_mut()
        .unwrap()
        .extend(spec.as_object().unwrap().clone());
    serde_json::from_value(
        json!({"apiVersion": "core.kbind.io/v1alpha1", "kind": "Connection",
        "metadata": {"name": "provider"}, "spec": s}),
    )
    .unwrap()
}

#[test]
fn a_binding_is_admitted_only_where_the_connection_says() {
    let ns = NamespaceLabels::of(&[
        (
            "team-a",
            &[("kubernetes.io/metadata.name", "team-a"), ("kbind", "yes")],
        ),
        ("team-b", &[("kubernetes.io/metadata.name", "team-b")]),
    ]);
    // Omitted: no namespaced Binding, and the message names the field and an example value.
    let c = connection(json!({}));
    let Admission::NotAllowed(m) = admission(&c, "team-a", &ns) else {
        panic!("admitted without spec.bindingNamespaces")
    };
    assert!(m.contains("spec.bindingNamespaces is not set"), "{m}");
    assert!(m.contains("kubernetes.io/metadata.name: team-a"), "{m}");
    // {}: every namespace, even one the list did not hold.
    let c = connection(json!({"bindingNamespaces": {}}));
    assert_eq!(admission(&c, "team-b", &ns), Admission::Admitted);
    assert_eq!(admission(&c, "new", &ns), Admission::Admitted);
    let c = connection(json!({"bindingNamespaces": {"matchLabels": {"kbind": "yes"}}}));
    assert_eq!(admission(&c, "team-a", &ns), Admission::Admitted);
    let Admission::NotAllowed(m) = admission(&c, "team-b", &ns) else {
        panic!("team-b admitted")
    };
    assert!(
        m.contains("namespace team-b does not match Connection provider's"),
        "{m}"
    );
    // A selector Kubernetes would refuse admits nothing, and says which term.
    let c = connection(json!({"bindingNamespaces":
        {"matchExpressions": [{"key": "kbind", "operator": "in", "values": ["yes"]}]}}));
    let Admission::NotAllowed(m) = admission(&c, "team-a", &ns) else {
        panic!("an invalid selector admitted")
    };
    assert!(
        m.contains("is not a valid selector") && m.contains("\"in\""),
        "{m}"
    );
    // Labels that could not be read: nothing is admitted, not even by {}.
    let c = connection(json!({"bindingNamespaces": {}}));
    let unread = NamespaceLabels(Err("forbidden".into()));
    let Admission::NotAllowed(m) = admission(&c, "team-a", &unread) else {
        panic!("admitted without reading labels")
    };
    assert!(m.contains("could not be read (forbidden)"), "{m}");
}

#[test]
fn adoption_needs_its_own_consent() {
    let ns = NamespaceLabels::of(&[("team-a", &[("adopt", "yes")]), ("team-b", &[])]);
    let c = connection(json!({"bindingNamespaces": {}}));
    assert!(!may_adopt(&c, "team-a", &ns), "omitted: nobody adopts");
    let c = connection(json!({"adoptionNamespaces": {"matchLabels": {"adopt": "yes"}}}));
    assert!(may_adopt(&c, "team-a", &ns));
    assert!(!may_adopt(&c, "team-b", &ns));
    assert!(!may_adopt(&c, "team-a", &NamespaceLabels(Err("x".into()))));
}
