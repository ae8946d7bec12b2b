//! Peak memory of `kbind schema` against hostile provider answers (#28 item 5): one Connection per
//! shape, each behind its own loopback apiserver that answers the identity read truthfully and
//! the CRD LIST with the shape; one run per shape, its peak RSS against the healthy baseline and
//! the CronJob's 256 MiB limit. `hack/bench.sh hostile` (the consumer is a real apiserver).

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};

use axum::body::Body;
use axum::http::{Request, Response};
use common::{client, env, kbind};
use k8s_openapi::api::core::v1::{Namespace, Secret};
use kbind::api::core::Connection;
use kube::Api;
use kube::api::{Patch, PatchParams, PostParams};
use serde_json::{Value, json};

const LIMIT_MIB: f64 = 256.0;

#[derive(Clone, Copy, Debug)]
enum Shape {
    /// One small exported CRD: the baseline.
    Healthy,
    /// Every CRD LIST page is JSON padded past the body cap (chunked, no Content-Length).
    OverCap,
    /// A page of as many real-looking CRDs as asked for, just under the body cap in all.
    NearCap,
    /// 2 MiB of `{},{},...`: 700,000 items where 500 were asked for.
    TinyItems,
    /// One item more than asked for.
    MoreThanAsked,
}

impl Shape {
    fn name(self) -> &'static str {
        match self {
            Self::Healthy => "healthy",
            Self::OverCap => "over-cap",
            Self::NearCap => "near-cap",
            Self::TinyItems => "tiny-items",
            Self::MoreThanAsked => "more-than-asked",
        }
    }
}

/// An exported CRD whose schema has `props` properties (about 60 bytes each).
fn crd(i: usize, props: usize) -> Value {
    let properties: serde_json::Map<String, Value> = (0..props)
        .map(|p| {
            (
                format!("field{p:05}"),
                json!({"type": "string", "description": "a field"}),
            )
        })
        .collect();
    json!({"apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
        "metadata": {"name": format!("w{i}s.hostile.bench.kbind.io"), "uid": format!("u{i}"),
            "labels": {"core.kbind.io/exported": "true"}},
        "spec": {"group": "hostile.bench.kbind.io", "scope": "Namespaced",
            "names": {"plural": format!("w{i}s"), "kind": format!("W{i}"), "singular": format!("w{i}")},
            "versions": [{"name": "v1", "served": true, "storage": true,
                "schema": {"openAPIV3Schema": {"type": "object", "properties": {
                    "spec": {"type": "object", "properties": properties}}}}}]}})
}

fn list(items: Vec<Value>) -> String {
    json!({"kind": "CustomResourceDefinitionList", "apiVersion": "apiextensions.k8s.io/v1",
        "metadata": {"resourceVersion": "1"}, "items": items})
    .to_string()
}

/// The CRD LIST answer of `shape` to a request for `limit` objects.
fn answer(shape: Shape, limit: usize) -> Body {
    let cap = kbind::pass::retry::MAX_RESPONSE_BYTES;
    match shape {
        Shape::Healthy => Body::from(list(vec![crd(0, 10)])),
        Shape::OverCap => {
            let head = r#"{"kind":"CustomResourceDefinitionList","apiVersion":"apiextensions.k8s.io/v1","metadata":{},"items":["#;
            let spaces = bytes::Bytes::from(vec![b' '; 64 << 10]);
            let chunks = std::iter::once(bytes::Bytes::from_static(head.as_bytes()))
                .chain(std::iter::repeat_n(spaces, cap / (64 << 10) + 16))
                .chain(std::iter::once(bytes::Bytes::from_static(b"]}")));
            Body::from_stream(futures::stream::iter(
                chunks.map(Ok::<_, std::convert::Infallible>),
            ))
        }
        Shape::NearCap => {
            // As many as asked, together about 90 % of the cap.
            let per = cap * 9 / 10 / limit.max(1);
            let props = per / 60;
            Body::from(list((0..limit).map(|i| crd(i, props)).collect()))
        }
        Shape::TinyItems => {
            let mut s = String::from(r#"{"kind":"List","apiVersion":"v1","metadata":{},"items":["#);
            for _ in 0..700_000 {
                s.push_str("{},");
            }
            s.push_str("{}]}");
            Body::from(s)
        }
        Shape::MoreThanAsked => Body::from(list((0..=limit).map(|i| crd(i, 1)).collect())),
    }
}

/// A provider apiserver on loopback answering as `shape`; returns its URL and a request count.
async fn provider(shape: Shape) -> (String, Arc<AtomicU32>) {
    let served = Arc::new(AtomicU32::new(0));
    let counter = served.clone();
    let app = axum::Router::new().fallback(move |req: Request<Body>| {
        let counter = counter.clone();
        async move {
            counter.fetch_add(1, Ordering::SeqCst);
            let json = |status: u16, body: Body| {
                Response::builder()
                    .status(status)
                    .header("content-type", "application/json")
                    .body(body)
                    .unwrap()
            };
            let path = req.uri().path();
            if path == "/api/v1/namespaces/kube-system" {
                let ns = json!({"kind": "Namespace", "apiVersion": "v1",
                    "metadata": {"name": "kube-system", "uid": format!("bench-hostile-{}", shape.name())}});
                return json(200, Body::from(ns.to_string()));
            }
            if path == "/apis/apiextensions.k8s.io/v1/customresourcedefinitions" {
                let limit = req
                    .uri()
                    .query()
                    .unwrap_or_default()
                    .split('&')
                    .find_map(|kv| kv.strip_prefix("limit="))
                    .and_then(|v| v.parse().ok())
                    .unwrap_or(500);
                return json(200, answer(shape, limit));
            }
            let not_found = json!({"kind": "Status", "apiVersion": "v1", "status": "Failure",
                "reason": "NotFound", "code": 404, "message": "not found"});
            json(404, Body::from(not_found.to_string()))
        }
    });
    let listener = tokio::net::TcpListener::bind(("127.0.0.1", 0))
        .await
        .unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    (url, served)
}

fn kubeconfig(server: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: p\n  cluster:\n    server: {server}\nusers:\n- name: u\n  user:\n    token: bench\ncontexts:\n- name: p\n  context:\n    cluster: p\n    user: u\ncurrent-context: p\n"
    )
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    kbind::install_crypto_provider();
    let consumer_path = env("KBIND_TEST_CONSUMER_KUBECONFIG");
    let consumer = client(&consumer_path).await;
    common::install_crds(&consumer, &kbind::crds::kbind_crds()).await;
    let ns = format!("bench-hostile-{}", std::process::id());
    let body: Namespace = serde_json::from_value(json!({"metadata": {"name": ns}})).unwrap();
    Api::<Namespace>::all(consumer.clone())
        .create(&PostParams::default(), &body)
        .await
        .expect("namespace");
    println!(
        "bench hostile: kbind schema, one run per hostile CRD LIST shape; body cap {} MiB, CronJob memory limit {LIMIT_MIB} MiB",
        kbind::pass::retry::MAX_RESPONSE_BYTES >> 20
    );
    let shapes = [
        Shape::Healthy,
        Shape::OverCap,
        Shape::NearCap,
        Shape::TinyItems,
        Shape::MoreThanAsked,
    ];
    let mut baseline = None;
    for shape in shapes {
        let name = shape.name();
        let (url, served) = provider(shape).await;
        let secret: Secret = serde_json::from_value(json!({"metadata": {"name": name},
            "stringData": {"kubeconfig": kubeconfig(&url)}}))
        .unwrap();
        Api::<Secret>::namespaced(consumer.clone(), &ns)
            .patch(
                name,
                &PatchParams::apply("bench").force(),
                &Patch::Apply(&secret),
            )
            .await
            .expect("secret");
        let conn: Connection = serde_json::from_value(json!({"apiVersion": "core.kbind.io/v1alpha1",
            "kind": "Connection", "metadata": {"name": format!("{ns}-{name}"), "labels": {"bench-hostile": format!("{ns}-{name}")}},
            "spec": {"kubeconfigSecretRef": {"namespace": ns, "name": name}, "schema": {"source": "CRD"}}}))
        .unwrap();
        Api::<Connection>::all(consumer.clone())
            .create(&PostParams::default(), &conn)
            .await
            .expect("connection");
        let selector = format!("bench-hostile={ns}-{name}");
        let s = kbind(&[
            "schema",
            "--kubeconfig",
            &consumer_path,
            "--lease-namespace",
            &ns,
            "--credential-namespace",
            &ns,
            "--allow-kubeconfig-field",
            "http",
            "--selector",
            &selector,
            "--deadline",
            "120s",
            "-o",
            "json",
        ]);
        let st = Api::<Connection>::all(consumer.clone())
            .get(&format!("{ns}-{name}"))
            .await
            .expect("connection")
            .status
            .unwrap_or_default();
        let ready = st
            .conditions
            .iter()
            .find(|c| c.type_ == "Ready")
            .map(|c| format!("{} {}: {}", c.status, c.reason, c.message))
            .unwrap_or_default();
        let rss = s["peak_rss_bytes"].as_f64().unwrap_or(0.0) / 1048576.0;
        let base = *baseline.get_or_insert(rss);
        println!(
            "{name:<16} {:>6.2}s  provider requests {:>3}  peak RSS {rss:>6.1} MiB  x{:.2} of healthy  {}",
            s["duration_seconds"].as_f64().unwrap_or(0.0),
            served.load(Ordering::SeqCst),
            rss / base,
            if rss < LIMIT_MIB {
                "under the limit"
            } else {
                "OVER THE LIMIT"
            }
        );
        println!(
            "{:<16} Ready={}",
            "",
            ready.chars().take(160).collect::<String>()
        );
    }
    let _ = Api::<Namespace>::all(consumer)
        .delete(&ns, &Default::default())
        .await;
}
