//! The complete binding flow of docs/binding-flow.md, from nothing to synced objects with only
//! kbind commands and plain manifests: the provider exports a CRD and an Export, a Grant is
//! created, `kbind issue` runs, the provider admin hands the kubeconfig over
//! (`kbind issue --print-kubeconfig`), `kbind bind` runs with it on the consumer, then the
//! consumer's schema and resync as their CronJobs would; the token is re-issued and the consumer
//! follows without a person; deleting the Grant stops the consumer with a clear condition.

use crate::support;

use std::time::Duration;

use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use kbind::api::core::ClusterBinding;
use kbind::api::iam::Grant;
use kube::api::PostParams;
use kube::{Api, ResourceExt};
use serde_json::{Value, json};
use support::fx::cond;
use support::issue_fx::{Ix, api_of, client_of, ready, status_code, token_of, widget};

/// Every kbind run of the flow must succeed: exit 0, and nothing failed inside the pass.
fn ok(what: &str, (code, s, err): (i32, Value, String)) -> Value {
    assert_eq!(code, 0, "{what}: {s}\n{err}");
    assert_ne!(s["outcome"], "failed", "{what}: {s}");
    s
}

fn kubeconfig_of(s: &Secret) -> String {
    String::from_utf8(s.data.as_ref().unwrap()["kubeconfig"].0.clone()).unwrap()
}

#[tokio::test]
#[cfg_attr(
    not(feature = "servers"),
    ignore = "needs the test servers: run hack/test.sh"
)]
async fn from_nothing_to_synced_objects_through_a_rotation_and_a_revocation() {
    let ix = Ix::pinning("flow").await;
    let fx = &ix.fx;
    let admin = fx.env.provider.to_str().unwrap().to_string();

    // 1. Provider: an exported CRD, an Export offering it, a Grant for one consumer (10m: the
    //    shortest TTL TokenRequest allows, so a re-issue can be forced below).
    let api = fx
        .provider_crd("widgets", "Namespaced", Some("true"), None)
        .await;
    let export = format!("{}-e", fx.label);
    ix.export(&export, &[&api], json!([])).await;
    let grant = format!("{}-g", fx.label);
    // The consumer's objects live in fx.ns; names and namespaces are kept on the provider.
    ix.grant_in(&grant, &export, "10m", &[&fx.ns]).await;

    // 2. The issuer issues; the provider admin hands the kubeconfig over out of band.
    ix.run(&[]);
    let g = ix.get_grant(&grant).await;
    assert_eq!(ready(&g).0, "True", "{:?}", g.status);
    let secret_ref = g.status.as_ref().unwrap().secret_ref.clone().unwrap();
    let out = support::kbind_command(&[
        "issue",
        "--kubeconfig",
        &admin,
        "--print-kubeconfig",
        &grant,
    ])
    .output()
    .unwrap();
    assert!(out.status.success());
    let handed = String::from_utf8(out.stdout).unwrap();
    let file = support::temp_file("flow-kubeconfig", &handed);

    // The issued identity reaches its Export in its Grant's namespace and nothing else.
    let issued = client_of(&handed).await;
    assert_eq!(
        status_code(
            api_of(&issued, &fx.group, "widgets", Some(&fx.ns))
                .list(&Default::default())
                .await
        ),
        200
    );
    assert_eq!(
        status_code(
            api_of(&issued, &fx.group, "widgets", None)
                .list(&Default::default())
                .await
        ),
        403,
        "no cluster-wide read: other consumers' objects"
    );
    assert_eq!(
        status_code(
            Api::<ConfigMap>::namespaced(issued.clone(), "kube-system")
                .list(&Default::default())
                .await
        ),
        403,
        "outside the Export"
    );

    // 3. Consumer: kbind bind with the handed-over kubeconfig as docs/binding-flow.md step 4
    //    shows it (the Export's name, no --grant-secret: the kubeconfig names its Grant's
    //    Secret and may read its own Export), then schema and resync.
    let consumer = fx.env.consumer.to_string_lossy().to_string();
    let label = format!("kbind-test={}", fx.label);
    let name = format!("{}-p", fx.label);
    let grant_secret = format!("{}/{}", secret_ref.namespace, secret_ref.name);
    let file_s = file.to_string_lossy().to_string();
    let bind_args = [
        "bind",
        "--kubeconfig",
        &consumer,
        "--provider-kubeconfig",
        &file_s,
        "--name",
        &name,
        "--credential-namespace",
        &fx.ns,
        "--label",
        &label,
        "--export",
        &export,
        "-o",
        "json",
    ];
    let b = ok("bind", support::kbind(&bind_args));
    assert_eq!(b["writes"], 3, "{b}");
    assert_eq!(b["apis"], json!([api]), "the Export's APIs: {b}");
    let bound = Api::<Secret>::namespaced(fx.consumer.clone(), &fx.ns)
        .get(&name)
        .await
        .unwrap();
    let annotations = bound.annotations();
    assert_eq!(
        annotations.get("core.kbind.io/grant-secret"),
        Some(&grant_secret),
        "rotation by pull is set up from the kubeconfig alone: {annotations:?}"
    );
    assert_eq!(annotations.get("iam.kbind.io/grant"), Some(&grant));
    let again = ok("bind again", support::kbind(&bind_args));
    assert_eq!(again["writes"], 0, "{again}");
    ok("schema", fx.try_pass("schema", &[]));
    let st = fx.conn(&name).await.status.unwrap();
    assert_eq!(cond(&st.conditions, "Ready").0, "True", "{st:?}");
    support::wait_established(&Api::all(fx.consumer.clone()), &api).await;

    // A consumer object; the first resync writes the heartbeat (attributed to the Grant), the
    // issuer's next run pins this consumer cluster, and from then on the object syncs.
    api_of(&fx.consumer, &fx.group, "widgets", Some(&fx.ns))
        .create(&PostParams::default(), &widget(&fx.group, "w1", None))
        .await
        .unwrap();
    ok("resync before the pin", fx.try_pass("resync", &[]));
    let bindings = Api::<ClusterBinding>::all(fx.consumer.clone());
    let pinned = |b: ClusterBinding| {
        let status = b.status.unwrap_or_default();
        let (status, reason, message) = cond(&status.conditions, "ConsumerPinned");
        (status.to_string(), reason.to_string(), message.to_string())
    };
    let (status, reason, message) = pinned(bindings.get(&name).await.unwrap());
    assert_eq!(
        (status.as_str(), reason.as_str()),
        ("False", "NotPinned"),
        "the binding says why nothing syncs yet: {message}"
    );
    assert!(message.contains("kbind issue"), "and what to do: {message}");
    ix.run(&[]);
    assert!(
        ix.get_grant(&grant)
            .await
            .status
            .unwrap()
            .consumer_cluster
            .is_some(),
        "the issuer pinned the consumer cluster from its heartbeat"
    );
    let provider_widgets = api_of(&fx.provider, &fx.group, "widgets", Some(&fx.ns));
    let mut copy = None;
    for _ in 0..20 {
        ok("resync", fx.try_pass("resync", &[]));
        if let Some(w) = provider_widgets.get_opt("w1").await.unwrap() {
            copy = Some(w);
            break;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let copy = copy.expect("the consumer object arrives on the provider");
    assert_eq!(
        pinned(bindings.get(&name).await.unwrap()).1,
        "Pinned",
        "the binding says the refusals are over"
    );
    assert_eq!(copy.data["spec"], json!({"size": 1}));

    // Provider status comes back down.
    let mut p = copy.clone();
    p.data["status"] = json!({"phase": "Provisioned"});
    provider_widgets
        .replace_status("w1", &PostParams::default(), &p)
        .await
        .unwrap();
    ok("resync", fx.try_pass("resync", &[]));
    let local = api_of(&fx.consumer, &fx.group, "widgets", Some(&fx.ns))
        .get("w1")
        .await
        .unwrap();
    assert_eq!(local.data["status"]["phase"], "Provisioned");

    // 4. Rotation: a re-issue forced now (10m TTL, re-issue when less than 10m is left); the
    //    consumer's next schema run pulls it, and resync keeps syncing with the new token.
    let secrets = Api::<Secret>::namespaced(fx.consumer.clone(), &fx.ns);
    let before = kubeconfig_of(&secrets.get(&name).await.unwrap());
    let s = ix.run(&["--reissue-before", "10m"]);
    assert!(s["data_writes"].as_u64().unwrap_or(0) >= 1, "{s}");
    let reissued = ix.kubeconfig(&grant).await;
    assert_ne!(token_of(&reissued), token_of(&before), "a new token");
    ok("schema after the re-issue", fx.try_pass("schema", &[]));
    let pulled = secrets.get(&name).await.unwrap();
    assert_eq!(
        token_of(&kubeconfig_of(&pulled)),
        token_of(&reissued),
        "the consumer pulled the re-issued kubeconfig"
    );
    let st = fx.conn(&name).await.status.unwrap();
    assert_eq!(cond(&st.conditions, "Ready").0, "True", "{st:?}");
    let mut w = local.clone();
    w.data["spec"] = json!({"size": 7});
    api_of(&fx.consumer, &fx.group, "widgets", Some(&fx.ns))
        .replace("w1", &PostParams::default(), &w)
        .await
        .unwrap();
    ok("resync after the rotation", fx.try_pass("resync", &[]));
    assert_eq!(
        provider_widgets.get("w1").await.unwrap().data["spec"],
        json!({"size": 7}),
        "the change made after the rotation arrived"
    );
    // A further schema run has nothing to pull.
    let s = ok("schema, unchanged", fx.try_pass("schema", &[]));
    assert_eq!(s["data_writes"], 0, "{s}");
    assert_eq!(
        secrets.get(&name).await.unwrap().resource_version(),
        pulled.resource_version()
    );

    // 5. Deleting the Grant revokes the identity; the consumer stops with a clear condition.
    Api::<Grant>::all(fx.provider.clone())
        .delete(&grant, &Default::default())
        .await
        .unwrap();
    ix.run(&[]);
    // (The apiserver's token authenticator sees the ServiceAccount gone a moment after the
    // RBAC: a run in between reads IdentityForbidden, then every run CredentialRejected.)
    let mut last = (String::new(), String::new());
    for _ in 0..40 {
        let _ = fx.try_pass("schema", &[]);
        let st = fx.conn(&name).await.status.unwrap();
        let (status, r, _) = cond(&st.conditions, "Connected");
        last = (status.to_string(), r.to_string());
        if r == "CredentialRejected" {
            break;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    assert_eq!(last, ("False".into(), "CredentialRejected".into()));
}

/// #31 item 10 for the service layer, as the shipped CronJobs fire: `kbind bind` with the
/// issued kubeconfig, then at the next tick the consumer's schema and resync (its
/// `--first-sync-window=30s`) and the provider's issuer (its `--pin-window=30s`) start
/// together. Schema connects the new Connection, resync writes the first heartbeat and is
/// refused while unpinned, the issuer's run of that same tick pins it, and resync's next try
/// syncs: the first object reaches the provider at that tick, not a period later. At the next
/// tick nothing is followed or written, twice over.
#[tokio::test]
#[cfg_attr(
    not(feature = "servers"),
    ignore = "needs the test servers: run hack/test.sh"
)]
async fn a_new_consumer_of_the_service_layer_syncs_at_the_first_tick_after_it_binds() {
    let ix = Ix::pinning("flow-tick").await;
    let fx = &ix.fx;
    let api = fx
        .provider_crd("widgets", "Namespaced", Some("true"), None)
        .await;
    let export = format!("{}-e", fx.label);
    ix.export(&export, &[&api], json!([])).await;
    let grant = format!("{}-g", fx.label);
    ix.grant_in(&grant, &export, "1h", &[&fx.ns]).await;
    ix.run(&[]);
    assert_eq!(ready(&ix.get_grant(&grant).await).1, "Issued");
    let file = support::temp_file("flow-tick-kubeconfig", &ix.kubeconfig(&grant).await);
    let file = file.to_string_lossy().to_string();
    let consumer = fx.env.consumer.to_string_lossy().to_string();
    let label = format!("kbind-test={}", fx.label);
    let name = format!("{}-p", fx.label);
    ok(
        "bind",
        support::kbind(&[
            "bind",
            "--kubeconfig",
            &consumer,
            "--provider-kubeconfig",
            &file,
            "--name",
            &name,
            "--credential-namespace",
            &fx.ns,
            "--label",
            &label,
            "--export",
            &export,
            "-o",
            "json",
        ]),
    );

    let issue_args = ix.args(
        fx.env.provider.to_str().unwrap(),
        &["--full-sweep-every", "1h", "--pin-window", "30s"],
    );
    // The tick: the three CronJobs' runs start together, the issuer's a moment ahead (its
    // window begun: no test can rely on which Pod starts first, so the test fixes the order in
    // which the issuer has already read the heartbeats when the first one is written). The
    // object is created as soon as its CRD is Established (a script, a GitOps retry).
    let crds = Api::all(fx.consumer.clone());
    let create = async {
        for _ in 0..300 {
            if matches!(crds.get_opt(&api).await, Ok(Some(_))) {
                support::wait_established(&crds, &api).await;
                api_of(&fx.consumer, &fx.group, "widgets", Some(&fx.ns))
                    .create(&PostParams::default(), &widget(&fx.group, "w1", None))
                    .await
                    .unwrap();
                return;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        panic!("kbind schema did not install the consumer CRD within 30 s");
    };
    let mut consumer_runs = None;
    let slot = &mut consumer_runs;
    let issue = support::when_logged(
        support::kbind_command(&issue_args),
        "pin window: following",
        |_| async move {
            let (schema, resync, ()) = tokio::join!(
                fx.try_pass_async("schema", &[]),
                fx.try_pass_async("resync", &["--first-sync-window=30s"]),
                create,
            );
            *slot = Some((schema, resync));
        },
    )
    .await;
    let (schema, resync) = consumer_runs.expect("the consumer's runs");
    let (schema, resync, issue) = (
        ok("schema", schema),
        ok("resync", resync),
        ok("issue", support::outcome(issue)),
    );
    assert_eq!(
        issue["counts"]["pinWindowSweeps"], 1,
        "the first heartbeat came in the issuer's window: {issue}"
    );
    assert!(
        ix.get_grant(&grant)
            .await
            .status
            .unwrap()
            .consumer_cluster
            .is_some(),
        "the issuer's run of the tick pinned the consumer: {issue}"
    );
    let provider_widgets = api_of(&fx.provider, &fx.group, "widgets", Some(&fx.ns));
    let copy = provider_widgets.get_opt("w1").await.unwrap();
    assert!(
        copy.is_some(),
        "the first object reached the provider at the tick after kbind bind:\nschema {schema}\nresync {resync}\nissue {issue}"
    );
    // Refused before the pin (the usual order) it says Pinned now; synced after the pin, it
    // never had reason to say anything.
    let st = Api::<ClusterBinding>::all(fx.consumer.clone())
        .get(&name)
        .await
        .unwrap()
        .status
        .unwrap_or_default();
    if let Some(c) = st.conditions.iter().find(|c| c.type_ == "ConsumerPinned") {
        assert_eq!(c.reason, "Pinned", "{st:?}");
    }

    // The next ticks: nothing to follow, nothing written.
    for round in 1..=2 {
        let (schema, resync, issue) = tokio::join!(
            fx.try_pass_async("schema", &[]),
            fx.try_pass_async("resync", &["--first-sync-window=30s"]),
            support::kbind_async(&issue_args),
        );
        for (what, s) in [("schema", schema), ("resync", resync), ("issue", issue)] {
            let s = ok(what, s);
            assert_eq!(s["data_writes"], 0, "round {round}, {what}: {s}");
            assert!(
                s["counts"]["pinWindowLooks"].is_null(),
                "round {round}, {what}: {s}"
            );
            assert!(
                s["counts"]["firstSyncLooks"].is_null(),
                "round {round}, {what}: {s}"
            );
        }
    }
    ix.revoke(&[&grant]).await;
}
