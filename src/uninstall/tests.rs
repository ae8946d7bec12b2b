use super::scan::{kind_report, resource_of};
use super::*;
use crate::api::iam as iam_api;
use crate::api::relsync as relsync_api;

/// Passes as the registry describes them (this module gets them as an argument).
fn passes() -> Vec<Descriptor> {
    ["schema", "resync", "claims", "relsync"]
        .into_iter()
        .map(|name| Descriptor {
            name,
            takes_lease: true,
            role: "r",
            namespace: if name == "relsync" {
                "kbind-relsync"
            } else {
                "kbind-system"
            },
            finalizers: &[],
            shows: &[],
            jobs: &[],
        })
        .collect()
}

#[test]
fn only_pass_leases_count() {
    let passes = passes();
    for yes in [
        "kbind-schema",
        "kbind-resync",
        "kbind-claims",
        "kbind-relsync",
        "kbind-resync-0-of-4",
        "kbind-schema-12-of-16",
    ] {
        assert!(is_pass_lease(&passes, yes), "{yes}");
    }
    for no in [
        "consumer-1234",
        "kbind-status",
        "kbind-resync-",
        "kbind-resync-a-of-4",
        "kbind-resync-1-of-",
        "kbind-resyncx",
        "kbind-resync-0-of-4-x",
        "schema",
    ] {
        assert!(!is_pass_lease(&passes, no), "{no}");
    }
}

#[test]
fn managers_are_the_ones_that_added_the_finalizers() {
    assert_eq!(
        kind_report::<Connection>(keys::CLEANUP_FINALIZER, "schema").manager,
        "kbind-schema-finalizer"
    );
    assert_eq!(
        kind_report::<RelationshipSource>(relsync_api::CLEANUP_FINALIZER, "relsync").manager,
        "kbind-relsync-finalizer"
    );
    assert_eq!(resource_of::<Secret>(), "secrets");
    assert_eq!(resource_of::<Binding>(), "bindings.core.kbind.io");
}

fn issued_grant(status: serde_json::Value) -> IssuedGrant {
    serde_json::from_value(json!({
        "apiVersion": "iam.kbind.io/v1alpha1", "kind": "Grant",
        "metadata": {"name": "g"},
        "spec": {"export": "x", "consumer": "c"},
        "status": status,
    }))
    .unwrap()
}

#[test]
fn a_grant_is_released_by_the_issuers_manager_and_says_how_to_revoke_by_hand() {
    assert_eq!(
        kind_report::<IssuedGrant>(iam_api::REVOKE_FINALIZER, "issue").manager,
        "kbind-issue-finalizer"
    );
    assert_eq!(
        revoke_commands("ns", "g"),
        [
            "kubectl delete serviceaccount,secret -n ns kbind-grant-g --ignore-not-found",
            "kubectl delete rolebinding,role -n ns kbind-grant-g --ignore-not-found",
            "kubectl delete rolebinding,role -A -l iam.kbind.io/grant=g --ignore-not-found",
            "kubectl delete clusterrolebinding,clusterrole kbind-grant-g --ignore-not-found",
            "kubectl delete validatingadmissionpolicybinding,validatingadmissionpolicy kbind-grant-g --ignore-not-found",
        ]
    );
    // The namespace the status names wins over the flag; without one, the flag.
    let g = issued_grant(
        json!({"secretRef": {"namespace": "issued-here", "name": "kbind-grant-g"},
        "expiresAt": "2026-01-02T03:04:05Z"}),
    );
    let u = unrevoked(&g, "kbind-grants");
    assert_eq!(u.namespace, "issued-here");
    assert_eq!(u.token_expires_at.as_deref(), Some("2026-01-02T03:04:05Z"));
    let g = issued_grant(json!({"serviceAccount": "sa-ns/kbind-grant-g"}));
    assert_eq!(unrevoked(&g, "kbind-grants").namespace, "sa-ns");
    let u = unrevoked(&issued_grant(json!({})), "kbind-grants");
    assert_eq!(u.namespace, "kbind-grants");
    assert_eq!(u.token_expires_at, None);

    let mut k = kind_report::<IssuedGrant>(iam_api::REVOKE_FINALIZER, "issue");
    k.objects = vec![ObjectReport {
        namespace: None,
        name: "g".into(),
        uid: String::new(),
        deleting: true,
        outcome: Outcome::WouldRelease,
        error: None,
        unrevoked: Some(u),
    }];
    k.found = 1;
    let r = Report {
        command: "uninstall",
        dry_run: true,
        leases_held: vec![],
        lease_check_error: None,
        kinds: vec![k],
        found: 1,
        released: 0,
        failed: 0,
        next: next_steps(),
    };
    let text = render(&r, Some(OutputFormat::Text), false);
    assert!(
        text.contains(
            "Grant (grants.iam.kbind.io) iam.kbind.io/revoke: 1 to release\n  would release g (deleting)\n    WARNING: releasing skips revocation: "
        ),
        "{text}"
    );
    assert!(text.contains("stay until the cluster's garbage collector removes them once the Grant is gone (each names it as owner; not the policy, nor objects issued before 0.3, nor where no collector runs), and its token keeps working until then, at most until it expires. Revoke by hand:\n      kubectl delete serviceaccount,secret -n kbind-grants kbind-grant-g --ignore-not-found\n"), "{text}");
    let j: serde_json::Value =
        serde_json::from_str(&render(&r, Some(OutputFormat::Json), false)).unwrap();
    assert_eq!(
        j["kinds"][0]["objects"][0]["unrevoked"]["revokeByHand"][0],
        "kubectl delete serviceaccount,secret -n kbind-grants kbind-grant-g --ignore-not-found"
    );
}

#[test]
fn leases_are_looked_for_in_every_namespace_a_pass_runs_in_unless_one_is_named() {
    let passes = passes();
    #[derive(clap::Parser)]
    struct Flags {
        #[command(flatten)]
        common: CommonArgs,
    }
    let mut common = <Flags as clap::Parser>::try_parse_from(["kbind"])
        .unwrap()
        .common;
    // SAFETY of the assertion: POD_NAMESPACE is not set in unit tests.
    assert_eq!(
        lease_namespaces(&common, &passes),
        ["kbind-system", "kbind-relsync"]
    );
    common.lease_namespace = Some("ops".into());
    assert_eq!(lease_namespaces(&common, &passes), ["ops"]);
}
