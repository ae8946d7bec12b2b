use super::*;

pub(super) fn now() -> Timestamp {
    Timestamp::from_second(1_700_000_000).unwrap()
}

pub(super) fn reason(conds: &[Condition], t: &str) -> String {
    conds
        .iter()
        .find(|c| c.type_ == t)
        .map(|c| format!("{}/{}", c.status, c.reason))
        .unwrap_or_default()
}

#[test]
fn connection_conditions() {
    let case = Case::default();
    let st = plan_status(&case.observed(), &[], &[], AutoBindView::Off, now()).connection;
    assert_eq!(reason(&st.conditions, READY), "True/Ready");
    assert_eq!(
        (
            st.remote_cluster_uid.as_deref(),
            st.local_cluster_uid.as_deref()
        ),
        (Some("remote"), Some("local"))
    );
    assert_eq!(st.exported_apis.len(), 2);

    let changed = Case {
        status: ConnectionStatus {
            remote_cluster_uid: Some("pinned".into()),
            ..Default::default()
        },
        ..Default::default()
    };
    let st = plan_status(&changed.observed(), &[], &[], AutoBindView::Off, now()).connection;
    assert_eq!(
        reason(&st.conditions, CONNECTED),
        "False/ClusterIdentityChanged"
    );
    assert_eq!(
        st.remote_cluster_uid.as_deref(),
        Some("pinned"),
        "never re-pinned"
    );
    assert!(
        st.exported_apis.is_empty(),
        "nothing discovered from the other cluster"
    );

    let case = Case::default();
    let mut o = case.observed();
    o.credentials = Err(CredentialError::SecretNotFound {
        namespace: "n".into(),
        name: "s".into(),
    });
    o.remote_uid = None;
    o.discovery = None;
    let st = plan_status(&o, &[], &[], AutoBindView::Off, now()).connection;
    assert_eq!(reason(&st.conditions, SECRET_VALID), "False/SecretNotFound");
    assert_eq!(reason(&st.conditions, READY), "False/SecretNotFound");

    let mut o = case.observed();
    o.discovery = Some(Err(discovery_failed(403)));
    let st = plan_status(&o, &[], &[], AutoBindView::Off, now()).connection;
    assert_eq!(
        reason(&st.conditions, PERMISSION_DENIED),
        "True/DiscoveryForbidden"
    );
    assert_eq!(reason(&st.conditions, READY), "False/DiscoveryForbidden");
}

#[test]
fn credential_rotation_is_a_condition_that_never_blocks_ready() {
    use crate::connection::KubeconfigField;
    use crate::connection::refresh::{RefreshError, Refreshed};
    let refused = RefreshError::Refused {
        from: "kbind-grants/g".into(),
        source: CredentialError::FieldNotAllowed {
            namespace: "n".into(),
            name: "s".into(),
            what: format!("cluster.proxy-url ({:?})", KubeconfigField::ProxyUrl),
        },
    };
    // (pull outcome, CredentialRotation as status/reason, "" when absent)
    let cases: Vec<(Option<Result<Refreshed, RefreshError>>, &str)> = vec![
        (None, ""),
        (Some(Ok(Refreshed::Current)), "True/Current"),
        // Same reason as Current: the run after a pull changes no condition.
        (Some(Ok(Refreshed::Updated)), "True/Current"),
        (Some(Ok(Refreshed::WouldUpdate)), "False/PullPending"),
        (Some(Err(refused)), "False/KubeconfigFieldNotAllowed"),
    ];
    for (refresh, want) in cases {
        let case = Case::default();
        let mut o = case.observed();
        o.refresh = refresh.clone();
        let st = plan_status(&o, &[], &[], AutoBindView::Off, now()).connection;
        assert_eq!(
            reason(&st.conditions, CREDENTIAL_ROTATION),
            want,
            "{refresh:?}"
        );
        assert_eq!(reason(&st.conditions, READY), "True/Ready", "{refresh:?}");
    }
    // A Secret that lost its annotation loses the condition.
    let mut case = Case::default();
    case.status.conditions = plan_status(
        &Observed {
            refresh: Some(Ok(Refreshed::Current)),
            ..case.observed()
        },
        &[],
        &[],
        AutoBindView::Off,
        now(),
    )
    .connection
    .conditions;
    let st = plan_status(&case.observed(), &[], &[], AutoBindView::Off, now()).connection;
    assert_eq!(reason(&st.conditions, CREDENTIAL_ROTATION), "");
}

#[test]
fn a_rejected_credential_is_credential_rejected() {
    let case = Case {
        remote: Some(Err(IdentityError::Unauthorized(std::sync::Arc::new(
            kube::Error::Api(
                kube::core::Status::failure("Unauthorized", "Unauthorized")
                    .with_code(401)
                    .boxed(),
            ),
        )))),
        ..Default::default()
    };
    let st = plan_status(&case.observed(), &[], &[], AutoBindView::Off, now()).connection;
    assert_eq!(
        reason(&st.conditions, CONNECTED),
        "False/CredentialRejected"
    );
    assert_eq!(reason(&st.conditions, READY), "False/CredentialRejected");
}

/// A binding never says `Permitted` while its Connection's identity read or discovery was
/// refused: its PermissionDenied names what was refused, as the Connection's does.
/// The provider refusing the identity read (`kube-system` is forbidden).
fn forbidden() -> IdentityError {
    IdentityError::Forbidden(std::sync::Arc::new(kube::Error::Api(Box::new(
        kube::core::Status {
            code: 403,
            message: "namespaces \"kube-system\" is forbidden".into(),
            ..Default::default()
        },
    ))))
}

#[test]
fn a_refused_identity_read_or_discovery_is_every_bindings_permission_denied() {
    let bindings = vec![
        binding(None, "cb", "c", &["a.x.io"]),
        binding(Some("ns"), "b", "c", &["a.x.io"]),
    ];
    let cases = [
        (
            "identity read refused",
            Case {
                bindings: bindings.clone(),
                remote: Some(Err(forbidden())),
                ..Default::default()
            },
            "True/IdentityForbidden",
        ),
        (
            "discovery refused",
            Case {
                bindings: bindings.clone(),
                discovery_error: Some(discovery_failed(403)),
                ..Default::default()
            },
            "True/DiscoveryForbidden",
        ),
        (
            "discovery failed, nothing refused",
            Case {
                bindings: bindings.clone(),
                discovery_error: Some(discovery_failed(500)),
                ..Default::default()
            },
            "False/Permitted",
        ),
        (
            "nothing refused",
            Case {
                bindings: bindings.clone(),
                crds: BTreeMap::from([("a.x.io".into(), meta(true, Some("c"), Some("h1")))]),
                ..Default::default()
            },
            "False/Permitted",
        ),
    ];
    for (what, case, want) in cases {
        let plan = plan_status(&case.observed(), &[], &[], AutoBindView::Off, now());
        assert_eq!(plan.bindings.len(), 2, "{what}");
        for (key, st) in &plan.bindings {
            assert_eq!(
                reason(&st.conditions, PERMISSION_DENIED),
                want,
                "{what}: {key}"
            );
            if want.starts_with("True") {
                let msg = &st
                    .conditions
                    .iter()
                    .find(|c| c.type_ == PERMISSION_DENIED)
                    .unwrap()
                    .message;
                assert!(msg.contains("forbidden"), "{what}: {msg}");
                assert_eq!(
                    reason(&plan.connection.conditions, PERMISSION_DENIED),
                    want,
                    "{what}: the Connection says the same"
                );
            }
        }
    }
}

#[test]
fn binding_setup_status() {
    let case = Case {
        bindings: vec![
            binding(None, "ok", "c", &["a.x.io"]),
            binding(Some("ns"), "scoped", "c", &["b.x.io"]),
            binding(None, "foreign", "c", &["b.x.io"]),
            binding(None, "missing", "c", &["z.x.io"]),
        ],
        crds: BTreeMap::from([
            ("a.x.io".into(), meta(true, Some("c"), Some("h1"))),
            ("b.x.io".into(), meta(false, None, None)),
        ]),
        ..Default::default()
    };
    let plan = plan_status(&case.observed(), &[], &[], AutoBindView::Off, now());
    let by_name: BTreeMap<String, &BindingStatus> = plan
        .bindings
        .iter()
        .map(|(k, s)| (k.name.clone(), s))
        .collect();
    assert_eq!(reason(&by_name["ok"].conditions, READY), "True/Bound");
    assert_eq!(
        reason(&by_name["ok"].conditions, SYNCED),
        "True/SchemasInstalled"
    );
    assert_eq!(
        by_name["ok"].bound_apis[0].schema_hash.as_deref(),
        Some("h1")
    );
    assert_eq!(
        reason(&by_name["scoped"].conditions, READY),
        "False/ClusterScopedAPI"
    );
    assert_eq!(
        reason(&by_name["foreign"].conditions, READY),
        "False/ForeignCRD"
    );
    assert_eq!(
        reason(&by_name["missing"].conditions, READY),
        "False/APINotExported"
    );

    // A forbidden CRD write is the binding's setup-level PermissionDenied.
    let case = Case {
        bindings: vec![binding(None, "ok", "c", &["a.x.io"])],
        ..Default::default()
    };
    let o = case.observed();
    let actions = plan_crds(&o);
    let plan = plan_status(
        &o,
        &actions,
        &[CrdOutcome::Forbidden("no".into())],
        AutoBindView::Off,
        now(),
    );
    assert_eq!(
        reason(&plan.bindings[0].1.conditions, PERMISSION_DENIED),
        "True/CRDWriteForbidden"
    );
    assert_eq!(
        reason(&plan.connection.conditions, PERMISSION_DENIED),
        "True/CRDWriteForbidden"
    );

    // An unchanged binding is not rewritten.
    let mut case = Case {
        bindings: vec![binding(None, "ok", "c", &["a.x.io"])],
        crds: BTreeMap::from([("a.x.io".into(), meta(true, Some("c"), Some("h1")))]),
        ..Default::default()
    };
    let first = plan_status(&case.observed(), &[], &[], AutoBindView::Off, now());
    case.bindings[0].status = first.bindings[0].1.clone();
    assert!(
        plan_status(&case.observed(), &[], &[], AutoBindView::Off, now())
            .bindings
            .is_empty()
    );
}

#[test]
fn bound_apis_carry_warnings_for_webhook_conversion_and_shadowing() {
    let mut webhook = export("a.x.io", "Namespaced", "h1");
    webhook.webhook_conversion = true;
    let case = Case {
        exports: vec![webhook],
        bindings: vec![
            binding(None, "cb", "c", &["a.x.io"]),
            binding(Some("ns"), "b", "c", &["a.x.io"]),
        ],
        crds: BTreeMap::from([("a.x.io".into(), meta(true, Some("c"), Some("h1")))]),
        ..Default::default()
    };
    let plan = plan_status(&case.observed(), &[], &[], AutoBindView::Off, now());
    let ready = |name: &str| {
        let st = &plan
            .bindings
            .iter()
            .find(|(k, _)| k.name == name)
            .unwrap()
            .1;
        st.conditions
            .iter()
            .find(|c| c.type_ == READY)
            .cloned()
            .unwrap()
    };
    let cb = ready("cb");
    assert_eq!(cb.status, "True");
    assert!(
        cb.message
            .contains("provider-side conversion is not reproduced"),
        "{}",
        cb.message
    );
    let b = ready("b");
    assert!(
        b.message
            .contains("ClusterBinding cb, which takes precedence"),
        "{}",
        b.message
    );
}

#[test]
fn a_binding_its_connection_does_not_serve_installs_nothing_and_says_why() {
    use crate::bindings::admission::Admission;
    let mut refused = binding(Some("team-b"), "w", "c", &["a.x.io"]);
    refused.admission = Admission::NotAllowed("namespace team-b does not match".into());
    // What it had bound while admitted goes; the counts resync owns stay for resync.
    refused.status.bound_apis = vec![BoundApi {
        name: "a.x.io".into(),
        schema_hash: Some("h1".into()),
        in_sync: Some(3),
        ..Default::default()
    }];
    let mut case = Case {
        bindings: vec![refused],
        ..Default::default()
    };
    assert_eq!(case.actions(), Vec::<String>::new(), "no CRD for it");
    // Another, admitted Binding of the same API still gets its CRD.
    case.bindings
        .push(binding(Some("team-a"), "w", "c", &["a.x.io"]));
    assert_eq!(case.actions(), ["create a.x.io"]);
    case.bindings.pop();
    let plan = plan_status(&case.observed(), &[], &[], AutoBindView::Off, now());
    let st = &plan.bindings[0].1;
    assert_eq!(reason(&st.conditions, READY), "False/NamespaceNotAllowed");
    assert_eq!(reason(&st.conditions, SYNCED), "False/SetupIncomplete");
    assert_eq!(
        reason(&st.conditions, PERMISSION_DENIED),
        "True/NamespaceNotAllowed"
    );
    let ready = st.conditions.iter().find(|c| c.type_ == READY).unwrap();
    assert_eq!(ready.message, "namespace team-b does not match");
    assert_eq!(st.bound_apis.len(), 1);
    assert_eq!(st.bound_apis[0].schema_hash, None);
    assert_eq!(st.bound_apis[0].in_sync, Some(3));
    // The Connection is not made unready by a Binding it refuses.
    assert_eq!(reason(&plan.connection.conditions, READY), "True/Ready");
    // A second run changes nothing.
    case.bindings[0].status = st.clone();
    let again = plan_status(&case.observed(), &[], &[], AutoBindView::Off, now());
    assert!(again.bindings.is_empty(), "{:?}", again.bindings);
}
