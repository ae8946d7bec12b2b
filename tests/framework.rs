//! The pass framework against a real apiserver: Leases, status writes racing another writer.

use crate::support;

use k8s_openapi::api::coordination::v1::Lease;
use kbind::api::core::{Connection, ConnectionSpec, SecretKeyRef};
use kbind::pass::lease::{self, Acquired};
use kbind::pass::status::{apply_status, retry_on_conflict};
use kube::Api;
use kube::api::{Patch, PatchParams, PostParams};
use kube::config::Kubeconfig;
use serde_json::json;

#[tokio::test]
#[cfg_attr(
    not(feature = "servers"),
    ignore = "needs the test servers: run hack/test.sh"
)]
async fn one_run_holds_the_lease_and_a_concurrent_run_skips() {
    let env = support::env();
    let client = env.consumer().await;
    let ns = support::namespace(&client, "lease").await;
    let (a, b) = tokio::join!(
        lease::acquire(client.clone(), &ns, "kbind-schema", "run-a", 600),
        lease::acquire(client.clone(), &ns, "kbind-schema", "run-b", 600),
    );
    let (a, b) = (a.unwrap(), b.unwrap());
    let (winner, loser) = match (&a, &b) {
        (Acquired::Held(_), Acquired::HeldBy(h)) => ("run-a", h.clone()),
        (Acquired::HeldBy(h), Acquired::Held(_)) => ("run-b", h.clone()),
        other => panic!("exactly one run must hold the Lease: {other:?}"),
    };
    assert_eq!(loser, winner, "the skipping run names the holder");
    // Released, the next run takes it at once.
    for r in [a, b] {
        if let Acquired::Held(g) = r {
            g.release(None, None).await;
        }
    }
    assert!(matches!(
        lease::acquire(client.clone(), &ns, "kbind-schema", "run-c", 600)
            .await
            .unwrap(),
        Acquired::Held(_)
    ));
}

#[tokio::test]
#[cfg_attr(
    not(feature = "servers"),
    ignore = "needs the test servers: run hack/test.sh"
)]
async fn an_expired_lease_is_taken_over() {
    let env = support::env();
    let client = env.consumer().await;
    let ns = support::namespace(&client, "lease").await;
    // A crashed run: holds for 1 s and never releases.
    let Acquired::Held(_crashed) =
        lease::acquire(client.clone(), &ns, "kbind-resync", "crashed", 1)
            .await
            .unwrap()
    else {
        panic!("first run must get the Lease")
    };
    assert!(matches!(
        lease::acquire(client.clone(), &ns, "kbind-resync", "early", 600).await.unwrap(),
        Acquired::HeldBy(h) if h == "crashed"
    ));
    tokio::time::sleep(std::time::Duration::from_millis(1500)).await;
    assert!(matches!(
        lease::acquire(client.clone(), &ns, "kbind-resync", "next", 600)
            .await
            .unwrap(),
        Acquired::Held(_)
    ));
    let l = Api::<Lease>::namespaced(client, &ns)
        .get("kbind-resync")
        .await
        .unwrap();
    let spec = l.spec.unwrap();
    assert_eq!(spec.holder_identity.as_deref(), Some("next"));
    assert_eq!(spec.lease_transitions, Some(1));
}

#[tokio::test]
#[cfg_attr(
    not(feature = "servers"),
    ignore = "needs the test servers: run hack/test.sh"
)]
async fn a_status_write_racing_another_writer_is_retried_not_lost() {
    let env = support::env();
    let client = env.consumer().await;
    support::kbind_crds(&client).await;
    let api: Api<Connection> = Api::all(client.clone());
    let name = support::unique("race");
    let spec = ConnectionSpec {
        kubeconfig_secret_ref: SecretKeyRef {
            namespace: "ns".into(),
            name: "s".into(),
            key: "kubeconfig".into(),
        },
        schema: Default::default(),
        auto_bind: false,
        binding_namespaces: None,
        adoption_namespaces: None,
    };
    api.create(&PostParams::default(), &Connection::new(&name, spec))
        .await
        .unwrap();
    let stale_rv = api
        .get(&name)
        .await
        .unwrap()
        .metadata
        .resource_version
        .unwrap();

    // Another writer (a different field manager) changes the status in between.
    api.patch_status(
        &name,
        &PatchParams::apply("someone-else").force(),
        &Patch::Apply(
            json!({"apiVersion": "core.kbind.io/v1alpha1", "kind": "Connection",
            "status": {"activeSchemaSource": "CRD"}}),
        ),
    )
    .await
    .unwrap();

    // Our write with the stale resourceVersion is refused…
    let err = apply_status(
        &api,
        &name,
        "kbind-schema",
        json!({"emptyDiscoveries": 1}),
        Some(&stale_rv),
    )
    .await
    .expect_err("a stale precondition must fail");
    assert!(
        matches!(&err, kube::Error::Api(s) if s.is_conflict()),
        "{err}"
    );

    // …and retried after a re-read, keeping both writers' fields.
    let mut attempts = 0;
    retry_on_conflict(5, || {
        attempts += 1;
        let (api, name, first, stale) =
            (api.clone(), name.clone(), attempts == 1, stale_rv.clone());
        async move {
            // The first attempt still carries the stale version; a retry re-reads.
            let rv = if first {
                stale
            } else {
                api.get(&name)
                    .await?
                    .metadata
                    .resource_version
                    .unwrap_or_default()
            };
            apply_status(
                &api,
                &name,
                "kbind-schema",
                json!({"emptyDiscoveries": 1}),
                Some(&rv),
            )
            .await
        }
    })
    .await
    .unwrap();
    assert_eq!(attempts, 2, "one conflict, one success");
    let status = api.get(&name).await.unwrap().status.unwrap();
    assert_eq!(status.empty_discoveries, Some(1));
    assert_eq!(
        status.active_schema_source.as_deref(),
        Some("CRD"),
        "the other writer's field survived"
    );
}

#[tokio::test]
#[cfg_attr(
    not(feature = "servers"),
    ignore = "needs the test servers: run hack/test.sh"
)]
async fn events_are_written_once_per_object_reason_and_message_and_scrubbed() {
    let env = support::env();
    let client = env.consumer().await;
    let ns = support::namespace(&client, "events").await;
    let cm = k8s_openapi::api::core::v1::ConfigMap {
        metadata: kube::api::ObjectMeta {
            name: Some("target".into()),
            ..Default::default()
        },
        ..Default::default()
    };
    let cm = Api::<k8s_openapi::api::core::v1::ConfigMap>::namespaced(client.clone(), &ns)
        .create(&PostParams::default(), &cm)
        .await
        .unwrap();
    let regarding = k8s_openapi::api::core::v1::ObjectReference {
        api_version: Some("v1".into()),
        kind: Some("ConfigMap".into()),
        name: cm.metadata.name.clone(),
        namespace: Some(ns.clone()),
        uid: cm.metadata.uid.clone(),
        ..Default::default()
    };
    let rec = kbind::pass::events::Recorder::new(client.clone(), "resync", false);
    let note = "provider rejected the write: POST https://provider/apis/x?token=s3cr3t failed";
    assert!(
        rec.publish(
            &regarding,
            kbind::pass::events::EventType::Warning,
            "Rejected",
            note
        )
        .await
    );
    // The next run reports the same thing: no second Event.
    assert!(
        !rec.publish(
            &regarding,
            kbind::pass::events::EventType::Warning,
            "Rejected",
            note
        )
        .await
    );
    let events = Api::<k8s_openapi::api::events::v1::Event>::namespaced(client.clone(), &ns)
        .list(&Default::default())
        .await
        .unwrap();
    assert_eq!(events.items.len(), 1);
    let e = &events.items[0];
    let text = e.note.clone().unwrap_or_default();
    assert!(
        !text.contains("s3cr3t") && !text.contains('?'),
        "scrubbed: {text}"
    );
    assert_eq!(e.reporting_controller.as_deref(), Some("kbind.io/resync"));
    // A dry run records nothing.
    let dry = kbind::pass::events::Recorder::new(client, "resync", true);
    assert!(
        !dry.publish(
            &regarding,
            kbind::pass::events::EventType::Warning,
            "Other",
            "x"
        )
        .await
    );
}

/// `KUBECONFIG=a:b` as kubectl reads it: the context (and current-context) in the first file,
/// the cluster and user in the second, whose own context of that name (pointing nowhere) and
/// own current-context are shadowed by the first's. A pass connects with it and runs.
#[tokio::test]
#[cfg_attr(
    not(feature = "servers"),
    ignore = "needs the test servers: run hack/test.sh"
)]
async fn a_kubeconfig_path_list_is_merged_as_kubectl_merges_it() {
    let env = support::env();
    let client = env.consumer().await;
    support::kbind_crds(&client).await;
    let ns = support::namespace(&client, "kubeconfig-list").await;
    let admin = serde_json::to_value(Kubeconfig::read_from(&env.consumer).unwrap()).unwrap();
    let first = json!({"apiVersion": "v1", "kind": "Config", "current-context": "split",
        "contexts": [{"name": "split", "context": {"cluster": "split-cluster", "user": "split-user"}}]});
    let second = json!({"apiVersion": "v1", "kind": "Config", "current-context": "nowhere",
        "clusters": [{"name": "split-cluster", "cluster": admin["clusters"][0]["cluster"]},
            {"name": "nowhere", "cluster": {"server": "https://127.0.0.1:1"}}],
        "users": [{"name": "split-user", "user": admin["users"][0]["user"]}],
        "contexts": [{"name": "split", "context": {"cluster": "nowhere", "user": "split-user"}},
            {"name": "nowhere", "context": {"cluster": "nowhere", "user": "split-user"}}]});
    // JSON is YAML.
    let a = support::temp_file("kubeconfig-contexts", &first.to_string());
    let b = support::temp_file("kubeconfig-clusters", &second.to_string());
    let list = std::env::join_paths([&a, &b]).unwrap();
    let selector = format!("kbind.test/none={ns}");
    let out = support::kbind_command(&[
        "schema",
        "--selector",
        &selector,
        "--lease-namespace",
        &ns,
        "--deadline",
        "30s",
        "-o",
        "json",
    ])
    .env("KUBECONFIG", &list)
    .output()
    .unwrap();
    let _ = (std::fs::remove_file(&a), std::fs::remove_file(&b));
    let (code, summary, stderr) = support::outcome(out);
    assert_eq!(code, 0, "{summary}\n{stderr}");
    assert_eq!(summary["outcome"], "completed", "{summary}\n{stderr}");
    // The run's Lease is on the server the merged kubeconfig names.
    let lease = Api::<Lease>::namespaced(client, &ns)
        .get("kbind-schema")
        .await
        .unwrap();
    assert!(lease.spec.is_some());
}
