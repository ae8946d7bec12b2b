use super::conditions::{now, reason};
use super::*;

#[test]
fn auto_bind_name_taken_is_a_condition() {
    let case = Case::default();
    let st = plan_status(&case.observed(), &[], &[], AutoBindView::NameTaken, now());
    assert_eq!(
        reason(&st.connection.conditions, AUTO_BIND),
        "False/NameTaken"
    );
    assert_eq!(st.autobind, AutoBind::Leave, "never touched");
    let st = plan_status(
        &case.observed(),
        &[],
        &[],
        AutoBindView::Maintained(None),
        now(),
    );
    assert_eq!(
        reason(&st.connection.conditions, AUTO_BIND),
        "True/Maintained"
    );
    let st = plan_status(&case.observed(), &[], &[], AutoBindView::Off, now());
    assert!(
        !st.connection
            .conditions
            .iter()
            .any(|c| c.type_ == AUTO_BIND)
    );
}

#[test]
fn auto_bind_needs_two_empty_discoveries_to_delete() {
    let existing = binding(None, "c", "c", &["a.x.io"]);
    let mut case = Case {
        exports: vec![],
        ..Default::default()
    };
    let first = plan_status(
        &case.observed(),
        &[],
        &[],
        AutoBindView::Maintained(Some(&existing)),
        now(),
    );
    assert_eq!(
        first.autobind,
        AutoBind::Leave,
        "one empty discovery may be a flapping label"
    );
    assert_eq!(first.connection.empty_discoveries, Some(1));
    case.status = first.connection;
    let second = plan_status(
        &case.observed(),
        &[],
        &[],
        AutoBindView::Maintained(Some(&existing)),
        now(),
    );
    assert_eq!(second.autobind, AutoBind::Delete);

    // A consumer CRD of the binding still holds objects: the provider withdrawing its exports
    // does not delete them; the Connection names the CRDs, run after run, until they are empty.
    let mut held = Case {
        exports: vec![],
        holding: [("a.x.io".to_string(), Holding::Objects)].into(),
        ..Default::default()
    };
    for run in 0..3 {
        let p = plan_status(
            &held.observed(),
            &[],
            &[],
            AutoBindView::Maintained(Some(&existing)),
            now(),
        );
        assert_eq!(p.autobind, AutoBind::Leave, "run {run}");
        let c = p
            .connection
            .conditions
            .iter()
            .find(|c| c.type_ == AUTO_BIND);
        let c = c.expect("AutoBind condition");
        assert_eq!(
            (c.status.as_str(), c.reason.as_str()),
            ("False", EXPORTS_WITHDRAWN)
        );
        assert!(c.message.contains("a.x.io"), "{}", c.message);
        assert_eq!(exports_withdrawn(&p.connection), Some(c.message.as_str()));
        held.status = p.connection;
    }
    held.holding = [(
        "a.x.io".to_string(),
        Holding::Unreadable("forbidden".into()),
    )]
    .into();
    let unsure = plan_status(
        &held.observed(),
        &[],
        &[],
        AutoBindView::Maintained(Some(&existing)),
        now(),
    );
    assert_eq!(unsure.autobind, AutoBind::Leave, "unreadable: kept");
    let m = exports_withdrawn(&unsure.connection).expect("ExportsWithdrawn");
    assert!(m.contains("a.x.io (objects not listed: forbidden)"), "{m}");
    held.holding.clear();
    let emptied = plan_status(
        &held.observed(),
        &[],
        &[],
        AutoBindView::Maintained(Some(&existing)),
        now(),
    );
    assert_eq!(
        emptied.autobind,
        AutoBind::Delete,
        "emptied by a person: deleted"
    );
    assert_eq!(
        reason(&emptied.connection.conditions, AUTO_BIND),
        "True/Maintained"
    );
}

#[test]
fn auto_bind_lists_every_export_and_carries_the_connections_labels() {
    let case = Case::default();
    assert_eq!(
        plan_status(
            &case.observed(),
            &[],
            &[],
            AutoBindView::Maintained(None),
            now()
        )
        .autobind,
        AutoBind::Apply(vec!["a.x.io".into(), "b.x.io".into()])
    );
    let same = binding(None, "c", "c", &["a.x.io", "b.x.io"]);
    assert_eq!(
        plan_status(
            &case.observed(),
            &[],
            &[],
            AutoBindView::Maintained(Some(&same)),
            now()
        )
        .autobind,
        AutoBind::Leave
    );
    assert_eq!(
        plan_status(&case.observed(), &[], &[], AutoBindView::Off, now()).autobind,
        AutoBind::Leave,
        "autoBind off leaves it"
    );
    // The Connection's labels go onto the binding (a selector picking the Connection picks
    // it); labels someone else added stay without a write.
    let labelled = Case {
        labels: [("team".to_string(), "a".to_string())].into(),
        ..Default::default()
    };
    let verdict = |b: &BindingView| {
        plan_status(
            &labelled.observed(),
            &[],
            &[],
            AutoBindView::Maintained(Some(b)),
            now(),
        )
        .autobind
    };
    assert_eq!(
        verdict(&same),
        AutoBind::Apply(vec!["a.x.io".into(), "b.x.io".into()]),
        "the label is missing"
    );
    let mut both = same.clone();
    both.labels = [("team", "a"), ("owner", "x")]
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .into();
    assert_eq!(verdict(&both), AutoBind::Leave);
    both.labels.insert("team".into(), "b".into());
    assert_ne!(verdict(&both), AutoBind::Leave, "another value");
}

#[test]
fn a_non_empty_discovery_resets_the_count_of_empty_ones() {
    let reset = Case {
        status: ConnectionStatus {
            empty_discoveries: Some(1),
            ..Default::default()
        },
        ..Default::default()
    };
    assert_eq!(
        plan_status(
            &reset.observed(),
            &[],
            &[],
            AutoBindView::Maintained(None),
            now()
        )
        .connection
        .empty_discoveries,
        None
    );
}

#[test]
fn more_exports_than_a_binding_lists_leave_it_and_say_why() {
    let many = |n: usize| Case {
        exports: (0..n)
            .map(|i| export(&format!("r{i:03}.x.io"), "Namespaced", "h"))
            .collect(),
        ..Default::default()
    };
    let existing = binding(None, "c", "c", &["a.x.io"]);
    for view in [
        AutoBindView::Maintained(None),
        AutoBindView::Maintained(Some(&existing)),
    ] {
        let over = plan_status(
            &many(crate::api::core::MAX_BINDING_APIS + 1).observed(),
            &[],
            &[],
            view,
            now(),
        );
        assert_eq!(
            over.autobind,
            AutoBind::Leave,
            "the binding's CRD would refuse it"
        );
        let c = over
            .connection
            .conditions
            .iter()
            .find(|c| c.type_ == AUTO_BIND)
            .expect("AutoBind condition");
        assert_eq!(
            (c.status.as_str(), c.reason.as_str()),
            ("False", TOO_MANY_APIS)
        );
        assert!(
            c.message.contains("exports 501 APIs") && c.message.contains("at most 500"),
            "{}",
            c.message
        );
    }
    // A run that does not discover (the provider unreachable) keeps what the last one found.
    let mut blind = many(0);
    blind.discovery_error = Some(discovery_failed(500));
    blind.status = plan_status(
        &many(crate::api::core::MAX_BINDING_APIS + 1).observed(),
        &[],
        &[],
        AutoBindView::Maintained(None),
        now(),
    )
    .connection;
    let after = plan_status(
        &blind.observed(),
        &[],
        &[],
        AutoBindView::Maintained(None),
        now(),
    );
    assert_eq!(after.autobind, AutoBind::Leave);
    assert_eq!(
        reason(&after.connection.conditions, AUTO_BIND),
        format!("False/{TOO_MANY_APIS}")
    );

    // At the limit it is maintained as always.
    let at = plan_status(
        &many(crate::api::core::MAX_BINDING_APIS).observed(),
        &[],
        &[],
        AutoBindView::Maintained(None),
        now(),
    );
    assert!(matches!(&at.autobind, AutoBind::Apply(apis) if apis.len() == 500));
    assert_eq!(
        reason(&at.connection.conditions, AUTO_BIND),
        "True/Maintained"
    );
}
