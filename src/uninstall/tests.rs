use super::*;

#[test]
fn only_pass_leases_count() {
    for yes in [
        "kbind-schema",
        "kbind-resync",
        "kbind-claims",
        "kbind-relsync",
        "kbind-resync-0-of-4",
        "kbind-schema-12-of-16",
    ] {
        assert!(is_pass_lease(yes), "{yes}");
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
        assert!(!is_pass_lease(no), "{no}");
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
        crate::relsync::cleanup::manager(&keys::field_manager("relsync"))
    );
    assert_eq!(resource_of::<Secret>(), "secrets");
    assert_eq!(resource_of::<Binding>(), "bindings.core.kbind.io");
}
