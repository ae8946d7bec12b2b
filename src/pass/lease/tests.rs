use super::*;

/// A Lease lost at a tick says what happened, even when no renewal attempt failed.
#[test]
fn an_expired_lease_names_its_cause() {
    let stalled = expiry_cause("", Duration::from_millis(2500), Duration::from_secs(3));
    assert!(
        stalled.contains("2.5s after the Lease expired"),
        "{stalled}"
    );
    assert!(stalled.contains("stalled"), "{stalled}");
    let failed = expiry_cause(
        "connection refused",
        Duration::ZERO,
        Duration::from_secs(61),
    );
    assert_eq!(
        failed,
        "the last renewal attempt failed: connection refused"
    );
}

#[test]
fn liveness() {
    let now = Timestamp::from_second(1_000_000).unwrap();
    let at = |s: i64| Some(MicroTime(Timestamp::from_second(s).unwrap()));
    let spec = |holder: Option<&str>, renew, dur| LeaseSpec {
        holder_identity: holder.map(String::from),
        renew_time: renew,
        lease_duration_seconds: Some(dur),
        ..Default::default()
    };
    assert!(is_live(&spec(Some("a"), at(999_990), 60), now));
    assert!(!is_live(&spec(Some("a"), at(999_000), 60), now), "expired");
    assert!(!is_live(&spec(None, at(999_990), 60), now), "released");
    assert!(!is_live(&spec(Some(""), at(999_990), 60), now), "released");
    assert!(!is_live(&spec(Some("a"), None, 60), now), "never renewed");
}

#[test]
fn identity_is_the_pod_else_host_and_pid_with_the_job_in_front() {
    assert_eq!(identity(Some("p-1"), None, "h", 7), "p-1");
    assert_eq!(identity(None, None, "h", 7), "h-7");
    assert_eq!(identity(Some("p-1"), Some("j"), "h", 7), "j/p-1");
    assert_eq!(identity(None, Some("j"), "h", 7), "j/h-7");
    assert_eq!(job_of("j/p-1"), Some("j"));
    assert_eq!(job_of("p-1"), None);
    assert_eq!(job_of("/p-1"), None);
}

#[test]
fn takeover_rule() {
    let now = Timestamp::from_second(1_000_000).unwrap();
    let spec = |holder: Option<&str>, renewed: i64| LeaseSpec {
        holder_identity: holder.map(String::from),
        renew_time: Some(MicroTime(Timestamp::from_second(renewed).unwrap())),
        lease_duration_seconds: Some(60),
        ..Default::default()
    };
    let live = 999_990;
    let expired = 999_000;
    let take = |p: &str| Verdict::Take {
        previous: Some(p.into()),
    };
    // Released: free to take, nobody taken over.
    assert_eq!(
        verdict(&spec(None, live), now, "j/b"),
        Verdict::Take { previous: None }
    );
    assert_eq!(
        verdict(&spec(Some(""), live), now, "j/b"),
        Verdict::Take { previous: None }
    );
    // A live holder of another Job, or of no Job, keeps it.
    assert_eq!(
        verdict(&spec(Some("k/a"), live), now, "j/b"),
        Verdict::Skip("k/a".into())
    );
    assert_eq!(
        verdict(&spec(Some("a"), live), now, "j/b"),
        Verdict::Skip("a".into())
    );
    assert_eq!(
        verdict(&spec(Some("j/a"), live), now, "b"),
        Verdict::Skip("j/a".into())
    );
    assert_eq!(
        verdict(&spec(Some("h-1"), live), now, "h-2"),
        Verdict::Skip("h-1".into())
    );
    // An earlier pod of our own Job, or our own identity (a restarted container): taken.
    assert_eq!(verdict(&spec(Some("j/a"), live), now, "j/b"), take("j/a"));
    assert_eq!(verdict(&spec(Some("j/b"), live), now, "j/b"), take("j/b"));
    assert_eq!(verdict(&spec(Some("h-1"), live), now, "h-1"), take("h-1"));
    // Expired: taken from anyone, and named.
    assert_eq!(
        verdict(&spec(Some("k/a"), expired), now, "j/b"),
        take("k/a")
    );
    assert_eq!(verdict(&spec(Some("a"), expired), now, "b"), take("a"));
}
