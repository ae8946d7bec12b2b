//! The test servers themselves: each is real, reachable and behaves as the rest of the suite
//! relies on.

use crate::support;

use std::collections::BTreeSet;

use k8s_openapi::api::core::v1::ConfigMap;
use k8s_openapi::api::core::v1::Namespace;
use k8s_openapi::api::rbac::v1::{PolicyRule, Role, RoleBinding, RoleRef, Subject};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::{
    CustomResourceDefinition, CustomResourceDefinitionNames, CustomResourceDefinitionSpec,
    CustomResourceDefinitionVersion, CustomResourceValidation, JSONSchemaProps,
};
use kube::Api;
use kube::api::{ApiResource, DynamicObject, ListParams, ObjectMeta, PostParams};
use kube::core::GroupVersionKind;
use serde_json::json;

use kbind_testkit::{Fault, scim, slack};

fn widget_crd(group: &str) -> CustomResourceDefinition {
    let schema: JSONSchemaProps = serde_json::from_value(json!({
        "type": "object",
        "properties": {"spec": {"type": "object", "x-kubernetes-preserve-unknown-fields": true}}
    }))
    .unwrap();
    CustomResourceDefinition {
        metadata: ObjectMeta {
            name: Some(format!("widgets.{group}")),
            ..Default::default()
        },
        spec: CustomResourceDefinitionSpec {
            group: group.into(),
            names: CustomResourceDefinitionNames {
                plural: "widgets".into(),
                kind: "Widget".into(),
                ..Default::default()
            },
            scope: "Namespaced".into(),
            versions: vec![CustomResourceDefinitionVersion {
                name: "v1".into(),
                served: true,
                storage: true,
                schema: Some(CustomResourceValidation {
                    open_api_v3_schema: Some(schema),
                }),
                ..Default::default()
            }],
            ..Default::default()
        },
        status: None,
    }
}

#[tokio::test]
#[cfg_attr(
    not(feature = "servers"),
    ignore = "needs the test servers: run hack/test.sh"
)]
async fn crd_created_and_object_round_tripped_on_each_apiserver() {
    let env = support::env();
    for (side, client) in [
        ("consumer", env.consumer().await),
        ("provider", env.provider().await),
    ] {
        let group = format!("{}.servers.kbind.io", support::unique("g"));
        support::apply_crds(&client, &[widget_crd(&group)]).await;
        let ns = support::namespace(&client, side).await;
        let ar = ApiResource::from_gvk_with_plural(
            &GroupVersionKind::gvk(&group, "v1", "Widget"),
            "widgets",
        );
        let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), &ns, &ar);
        let obj = DynamicObject::new("w1", &ar).data(json!({"spec": {"size": 3, "side": side}}));
        api.create(&PostParams::default(), &obj)
            .await
            .expect("create widget");
        let back = api.get("w1").await.expect("get widget");
        assert_eq!(
            back.data["spec"],
            json!({"size": 3, "side": side}),
            "{side}"
        );
    }
}

#[tokio::test]
#[cfg_attr(
    not(feature = "servers"),
    ignore = "needs the test servers: run hack/test.sh"
)]
async fn the_two_apiservers_are_different_clusters() {
    let env = support::env();
    let uid = |c: kube::Client| async move {
        Api::<Namespace>::all(c)
            .get("kube-system")
            .await
            .expect("kube-system")
            .metadata
            .uid
            .expect("uid")
    };
    assert_ne!(
        uid(env.consumer().await).await,
        uid(env.provider().await).await
    );
}

#[tokio::test]
#[cfg_attr(
    not(feature = "servers"),
    ignore = "needs the test servers: run hack/test.sh"
)]
async fn restricted_identity_is_refused_until_a_test_grants_it() {
    let env = support::env();
    let admin = env.provider().await;
    let restricted = support::client(&env.provider_restricted).await;
    let ns = support::namespace(&admin, "restricted").await;
    let cms: Api<ConfigMap> = Api::namespaced(restricted.clone(), &ns);
    match cms.list(&ListParams::default()).await {
        Err(kube::Error::Api(s)) => assert_eq!(s.code, 403, "{s:?}"),
        other => panic!("expected 403, got {other:?}"),
    }
    // A test shapes the restricted identity's RBAC.
    let role = Role {
        metadata: ObjectMeta {
            name: Some("read-cm".into()),
            ..Default::default()
        },
        rules: Some(vec![PolicyRule {
            api_groups: Some(vec!["".into()]),
            resources: Some(vec!["configmaps".into()]),
            verbs: vec!["list".into()],
            ..Default::default()
        }]),
    };
    Api::<Role>::namespaced(admin.clone(), &ns)
        .create(&PostParams::default(), &role)
        .await
        .unwrap();
    let rb = RoleBinding {
        metadata: ObjectMeta {
            name: Some("read-cm".into()),
            ..Default::default()
        },
        role_ref: RoleRef {
            api_group: "rbac.authorization.k8s.io".into(),
            kind: "Role".into(),
            name: "read-cm".into(),
        },
        subjects: Some(vec![Subject {
            kind: "User".into(),
            name: "kbind-restricted".into(),
            ..Default::default()
        }]),
    };
    Api::<RoleBinding>::namespaced(admin, &ns)
        .create(&PostParams::default(), &rb)
        .await
        .unwrap();
    let mut ok = false;
    for _ in 0..50 {
        if cms.list(&ListParams::default()).await.is_ok() {
            ok = true;
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    assert!(ok, "RBAC grant did not take effect");
}

#[tokio::test]
#[cfg_attr(
    not(feature = "servers"),
    ignore = "needs the test servers: run hack/test.sh"
)]
async fn spicedb_relationship_written_and_read_back() {
    let env = support::env();
    let http = reqwest::Client::new();
    // serve-testing: every bearer token is its own store.
    let token = support::unique("spicedb");
    let post = |path: &str, body: serde_json::Value| {
        http.post(format!("{}{path}", env.spicedb_url))
            .bearer_auth(&token)
            .json(&body)
            .send()
    };
    let schema = "definition user {}\ndefinition slack_channel {\n  relation member: user\n}";
    let r = post("/v1/schema/write", json!({"schema": schema}))
        .await
        .unwrap();
    assert!(r.status().is_success(), "{}", r.text().await.unwrap());
    let r = post(
        "/v1/relationships/write",
        json!({"updates": [{"operation": "OPERATION_TOUCH", "relationship": {
            "resource": {"objectType": "slack_channel", "objectId": "c1"},
            "relation": "member",
            "subject": {"object": {"objectType": "user", "objectId": "ada"}}}}]}),
    )
    .await
    .unwrap();
    assert!(r.status().is_success(), "{}", r.text().await.unwrap());
    let r = post(
        "/v1/relationships/read",
        json!({"consistency": {"fullyConsistent": true}, "relationshipFilter": {"resourceType": "slack_channel"}}),
    )
    .await
    .unwrap();
    let body = r.text().await.unwrap();
    assert!(body.contains("\"objectId\":\"ada\""), "{body}");
    // Another token sees another, empty store.
    let other = http
        .post(format!("{}/v1/relationships/read", env.spicedb_url))
        .bearer_auth(support::unique("other"))
        .json(&json!({"consistency": {"fullyConsistent": true}, "relationshipFilter": {"resourceType": "slack_channel"}}))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    // The other store has not even the schema: isolation is per token.
    assert!(
        !other.contains("\"objectId\":\"ada\""),
        "stores are not isolated: {other}"
    );
    assert!(other.contains("not found"), "{other}");
}

#[tokio::test]
async fn slack_fake_pages_short_and_empty_with_live_cursors_and_throttles() {
    kbind::install_crypto_provider();
    let users = (0..250)
        .map(|i| slack::User {
            id: format!("U{i:04}"),
            ..Default::default()
        })
        .collect();
    let ws = slack::Workspace {
        token: "xoxb-test".into(),
        users,
        max_page: 100,
        short_pages: true,
        empty_pages: true,
        ..Default::default()
    };
    let fake = slack::start(ws, 0).await.unwrap();
    let http = reqwest::Client::new();
    let call = |cursor: String| {
        http.post(format!("{}/api/users.list", fake.url()))
            .bearer_auth("xoxb-test")
            .header("content-type", "application/x-www-form-urlencoded")
            .body(format!("limit=200&cursor={cursor}"))
            .send()
    };
    let (mut seen, mut cursor, mut pages, mut empty) = (BTreeSet::new(), String::new(), 0, 0);
    loop {
        let v: serde_json::Value = call(cursor.clone()).await.unwrap().json().await.unwrap();
        assert_eq!(v["ok"], true, "{v}");
        let members = v["members"].as_array().unwrap();
        if members.is_empty() {
            empty += 1;
        }
        for m in members {
            assert!(
                seen.insert(m["id"].as_str().unwrap().to_string()),
                "duplicate {m}"
            );
        }
        pages += 1;
        cursor = v["response_metadata"]["next_cursor"]
            .as_str()
            .unwrap_or("")
            .to_string();
        if cursor.is_empty() {
            break;
        }
    }
    assert_eq!(seen.len(), 250);
    assert!(empty > 0 && pages > 6, "pages {pages} empty {empty}");

    fake.state.control().push_fault(
        "users.list",
        Fault::TooManyRequests {
            retry_after: Some(7),
        },
    );
    fake.state
        .control()
        .push_fault("users.list", Fault::TooManyRequests { retry_after: None });
    fake.state
        .control()
        .push_fault("users.list", Fault::OkFalseRatelimited);
    let r = call(String::new()).await.unwrap();
    assert_eq!(r.status(), 429);
    assert_eq!(r.headers()["retry-after"], "7");
    let r = call(String::new()).await.unwrap();
    assert_eq!(r.status(), 429);
    assert!(r.headers().get("retry-after").is_none());
    let r = call(String::new()).await.unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(
        r.json::<serde_json::Value>().await.unwrap()["error"],
        "ratelimited"
    );
    // A token in the query string is refused, as for newer Slack apps.
    let v: serde_json::Value = http
        .get(format!("{}/api/users.list?token=xoxb-test", fake.url()))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(v["ok"], false);
    assert_eq!(fake.state.control().calls("users.list"), pages + 4);
}

#[tokio::test]
async fn scim_fake_pages_by_start_index_and_throttles() {
    kbind::install_crypto_provider();
    let users = (0..250)
        .map(|i| scim::ScimUser {
            id: format!("u{i}"),
            user_name: format!("user{i}"),
            active: true,
            ..Default::default()
        })
        .collect();
    let dir = scim::Directory {
        token: "scim-token".into(),
        users,
        max_results: 100,
        ..Default::default()
    };
    let fake = scim::start(dir, 0).await.unwrap();
    let http = reqwest::Client::new();
    let get = |start: usize| {
        http.get(format!(
            "{}/scim/Users?startIndex={start}&count=500",
            fake.url()
        ))
        .bearer_auth("scim-token")
        .send()
    };
    let (mut start, mut ids) = (1, BTreeSet::new());
    loop {
        let v: serde_json::Value = get(start).await.unwrap().json().await.unwrap();
        assert_eq!(v["totalResults"], 250);
        let got = v["Resources"].as_array().unwrap();
        assert!(got.len() <= 100, "server cap not applied");
        ids.extend(got.iter().map(|u| u["id"].as_str().unwrap().to_string()));
        start += got.len();
        if got.is_empty() || start > 250 {
            break;
        }
    }
    assert_eq!(ids.len(), 250);
    fake.state.control().push_fault(
        "Users",
        Fault::TooManyRequests {
            retry_after: Some(2),
        },
    );
    let r = get(1).await.unwrap();
    assert_eq!(r.status(), 429);
    assert_eq!(r.headers()["retry-after"], "2");
    let r = http
        .get(format!("{}/scim/Users", fake.url()))
        .bearer_auth("wrong")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 401);
}
