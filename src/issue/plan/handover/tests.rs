//! Table tests of the hand-over and pin checks' plan.

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
    let t = permission_targets(&r, false);
    assert_eq!(t.len(), 5, "{t:?}");
    // Creating workloads reaches what a Pod mounts or runs as.
    let w = permission_targets(
        &rules(json!([
            {"apiGroups": ["apps"], "resources": ["deployments"], "verbs": ["create"]},
        ])),
        false,
    );
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
    let read_only = permission_targets(
        &rules(json!([
            {"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list"]},
        ])),
        false,
    );
    assert_eq!(
        read_only.len(),
        1,
        "reading pods mounts nothing: {read_only:?}"
    );
    // Writing what is known to start no Pod adds nothing; writing a CRD's objects does
    // (it may start Pods).
    let pod_free = permission_targets(
        &rules(json!([
            {"apiGroups": [""], "resources": ["configmaps"], "verbs": ["create"]},
            {"apiGroups": ["networking.k8s.io"], "resources": ["ingresses"], "verbs": ["get"]},
        ])),
        false,
    );
    assert_eq!(pod_free.len(), 2, "{pod_free:?}");
    // An Ingress names a Secret its controller serves.
    let ingress = permission_targets(
        &rules(json!([
            {"apiGroups": ["networking.k8s.io"], "resources": ["ingresses"], "verbs": ["create"]},
        ])),
        false,
    );
    assert_eq!(ingress.len(), 5, "{ingress:?}");
    // Exported namespaced APIs may start Pods too: what they mount counts without a rule.
    let exported = permission_targets(&[], true);
    assert_eq!(exported.len(), 4, "{exported:?}");
    assert!(permission_targets(&[], false).is_empty());
    let crd = permission_targets(
        &rules(json!([
            {"apiGroups": ["argoproj.io"], "resources": ["workflows"], "verbs": ["create"]},
        ])),
        false,
    );
    assert_eq!(crd.len(), 5, "{crd:?}");
    assert_eq!(t[0], p("", "secrets", &[]));
    assert_eq!(t[1], p("", "configmaps", &[]));
    assert_eq!(t[2], p("", "pods", &[]), "a subresource is its resource's");
    assert_eq!(t[3], p("apps", "deployments", &["web"]));
    assert!(matches!(&t[4], Target::Unlistable(m) if m.contains("\"*\"")));
}

#[test]
fn a_rule_acting_as_another_or_granting_more_cannot_be_looked_through() {
    let unlistable = |v: serde_json::Value| {
        let t = permission_targets(&rules(json!([v])), false);
        t.iter().any(|t| matches!(t, Target::Unlistable(_)))
    };
    for (rule, want) in [
        (
            json!({"apiGroups": [""], "resources": ["serviceaccounts"], "verbs": ["impersonate"]}),
            true,
        ),
        (
            json!({"apiGroups": [""], "resources": ["serviceaccounts"], "verbs": ["*"]}),
            true,
        ),
        (
            json!({"apiGroups": [""], "resources": ["users"], "verbs": ["impersonate"]}),
            true,
        ),
        (
            json!({"apiGroups": ["authentication.k8s.io"], "resources": ["uids"], "verbs": ["impersonate"]}),
            true,
        ),
        (
            json!({"apiGroups": ["rbac.authorization.k8s.io"], "resources": ["roles"], "verbs": ["escalate"]}),
            true,
        ),
        (
            json!({"apiGroups": ["rbac.authorization.k8s.io"], "resources": ["clusterroles"], "resourceNames": ["admin"], "verbs": ["bind"]}),
            true,
        ),
        (
            json!({"apiGroups": ["rbac.authorization.k8s.io"], "resources": ["roles"], "verbs": ["*"]}),
            true,
        ),
        (
            json!({"apiGroups": ["rbac.authorization.k8s.io"], "resources": ["roles"], "verbs": ["create", "get"]}),
            false,
        ),
        (
            json!({"apiGroups": [""], "resources": ["serviceaccounts"], "verbs": ["get", "create"]}),
            false,
        ),
    ] {
        assert_eq!(unlistable(rule.clone()), want, "{rule}");
    }
}

#[test]
fn what_a_revoked_grant_may_have_written_is_what_its_rules_write() {
    let t = written_targets(&rules(json!([
        {"apiGroups": [""], "resources": ["configmaps"], "resourceNames": ["settings"], "verbs": ["update"]},
        {"apiGroups": [""], "resources": ["secrets"], "verbs": ["get", "list"]},
        {"apiGroups": ["apps"], "resources": ["deployments", "deployments/scale"], "verbs": ["create"]},
        {"apiGroups": [""], "resources": ["configmaps"], "verbs": ["patch"]},
        {"apiGroups": ["example.org"], "resources": ["*"], "verbs": ["*"]},
        {"apiGroups": [""], "resources": ["users"], "verbs": ["impersonate"]},
        {"apiGroups": [""], "resources": ["serviceaccounts/token", "pods/status"], "verbs": ["create", "update"]},
        {"nonResourceURLs": ["/healthz"], "verbs": ["get"]},
    ])));
    let p = |g: &str, r: &str| Target::Permission {
        group: g.into(),
        resource: r.into(),
        names: Vec::new(),
    };
    // Reading writes nothing; names are dropped (a labelled object counts anywhere); what
    // a Pod mounts is not written by creating the Pod; a subresource write labels nothing.
    assert_eq!(t.len(), 4, "{t:?}");
    assert_eq!(t[0], p("", "configmaps"));
    assert_eq!(t[1], p("apps", "deployments"));
    assert!(matches!(&t[2], Target::Unlistable(m) if m.contains("\"example.org\"")));
    assert!(matches!(&t[3], Target::Unlistable(m) if m.contains("impersonate")));
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
    // Not held: the APIs, and the permission resources with what the namespaced API's
    // Pods may mount (secrets once); held: only APIs not granted.
    assert_eq!(l[0].targets.len(), 5, "{:?}", l[0].targets);
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
        m.starts_with("namespace team holds another consumer's objects (such as secrets team/db)"),
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
    assert!(
        m.contains("kubectl annotate grant g iam.kbind.io/approve-handover=nodes.example.org;"),
        "{m}"
    );
    // Emptying what could not be looked at helps nothing: the message says how to let it look.
    assert!(!m.contains("Empty it"), "{m}");
    assert!(m.contains("give kbind-issue `list` on it"), "{m}");
}
