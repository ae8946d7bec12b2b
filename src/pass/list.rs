//! Paginated LISTs: a pass never asks for a whole collection in one response.

use std::fmt::Debug;

use kube::api::{ListParams, PartialObjectMeta};
use kube::{Api, Resource};
use serde::de::DeserializeOwned;

pub const PAGE: u32 = 500;

/// Most pages one LIST may take (5 million objects): a server handing out continue tokens
/// forever must not keep a pass listing until its deadline.
pub const MAX_PAGES: usize = 10_000;

/// The error of a listing stopped at [`MAX_PAGES`] (for page loops outside this module).
pub fn too_many_pages() -> kube::Error {
    too_many_pages_of(PAGE)
}

pub fn too_many_pages_of(page: u32) -> kube::Error {
    kube::Error::Service(
        format!("the server returned more than {MAX_PAGES} pages of {page}; listing stopped")
            .into(),
    )
}

/// A page past the body cap (`retry::MAX_RESPONSE_BYTES`) is asked for again at half the size,
/// down to one object: the cap bounds memory, and a collection of large objects still lists in
/// smaller pages (the next pages keep the smaller size). Whether `e` was such a page and `lp`
/// now asks for less.
pub fn smaller(lp: &mut ListParams, e: &kube::Error) -> bool {
    let size = lp.limit.unwrap_or(PAGE);
    if size <= 1
        || !matches!(
            super::retry::Refused::of(e),
            Some(super::retry::Refused::TooLarge(_))
        )
    {
        return false;
    }
    tracing::debug!(
        size,
        "page past the body cap; asking for half as many objects"
    );
    lp.limit = Some(size / 2);
    true
}

/// Every object matching `lp`, fetched in pages.
pub async fn all<K>(api: &Api<K>, lp: &ListParams) -> Result<Vec<K>, kube::Error>
where
    K: Resource + Clone + DeserializeOwned + Debug,
{
    map_all(api, lp, |o| o).await
}

/// Metadata of every object matching `lp`, fetched in pages.
pub async fn metadata<K>(
    api: &Api<K>,
    lp: &ListParams,
) -> Result<Vec<PartialObjectMeta<K>>, kube::Error>
where
    K: Resource + Clone + DeserializeOwned + Debug,
{
    map_metadata(api, lp, |m| m).await
}

/// Metadata of every object matching `lp`, each mapped through `f` as its page arrives (a
/// CRD's managedFields name every field of its schema: thousands of CRDs' worth is held only
/// one page at a time).
pub async fn map_metadata<K, T>(
    api: &Api<K>,
    lp: &ListParams,
    f: impl Fn(PartialObjectMeta<K>) -> T,
) -> Result<Vec<T>, kube::Error>
where
    K: Resource + Clone + DeserializeOwned + Debug,
{
    let mut lp = lp.clone().limit(PAGE);
    let mut out = Vec::new();
    for _ in 0..MAX_PAGES {
        let page = match api.list_metadata(&lp).await {
            Err(e) if smaller(&mut lp, &e) => continue,
            r => r?,
        };
        out.extend(page.items.into_iter().map(&f));
        match page.metadata.continue_.filter(|c| !c.is_empty()) {
            Some(c) => lp = lp.continue_token(&c),
            None => return Ok(out),
        }
    }
    Err(too_many_pages())
}

/// Every object matching `lp`, each mapped through `f` as its page arrives, so only the mapped
/// form is held (a LIST page carries managedFields and everything else the pass never reads).
/// Pages of `lp.limit`, else of [`PAGE`]: a page is decoded whole, managedFields included, so
/// large objects want smaller pages.
pub async fn map_all<K, T>(
    api: &Api<K>,
    lp: &ListParams,
    f: impl Fn(K) -> T,
) -> Result<Vec<T>, kube::Error>
where
    K: Resource + Clone + DeserializeOwned + Debug,
{
    let size = lp.limit.unwrap_or(PAGE);
    let mut lp = lp.clone().limit(size);
    let mut out = Vec::new();
    for _ in 0..MAX_PAGES {
        let page = match api.list(&lp).await {
            Err(e) if smaller(&mut lp, &e) => continue,
            r => r?,
        };
        out.extend(page.items.into_iter().map(&f));
        match page.metadata.continue_.filter(|c| !c.is_empty()) {
            Some(c) => lp = lp.continue_token(&c),
            None => return Ok(out),
        }
    }
    Err(too_many_pages_of(size))
}

/// [`map_all`] for a cluster-scoped kind (read by name), where one object the client cannot decode (a CRD
/// whose schema is nested past the JSON reader's recursion limit, docs/hostile-inputs.md) must
/// not fail the listing: when a page does not decode, every object is read by name instead,
/// and those that do not decode come back by name with why, for the caller to report.
pub async fn map_decodable<K, T>(
    api: &Api<K>,
    lp: &ListParams,
    f: impl Fn(K) -> T,
) -> Result<(Vec<T>, Vec<(String, String)>), kube::Error>
where
    K: Resource<Scope = k8s_openapi::ClusterResourceScope> + Clone + DeserializeOwned + Debug,
{
    match map_all(api, lp, &f).await {
        Err(kube::Error::SerdeError(_)) => {}
        r => return r.map(|all| (all, Vec::new())),
    }
    let names = map_metadata(api, lp, |m| m.metadata.name.unwrap_or_default()).await?;
    let (mut out, mut undecodable) = (Vec::new(), Vec::new());
    for name in names {
        match api.get_opt(&name).await {
            Ok(Some(o)) => out.push(f(o)),
            Ok(None) => {} // deleted since the list
            Err(kube::Error::SerdeError(e)) => undecodable.push((name, e.to_string())),
            Err(e) => return Err(e),
        }
    }
    Ok((out, undecodable))
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::{Request, Response};
    use k8s_openapi::api::core::v1::ConfigMap;
    use kube::client::Body;

    /// One object nested past the JSON reader's recursion limit fails its page; the listing
    /// reads by name instead and returns the others, and that one by name.
    #[tokio::test]
    async fn an_object_that_does_not_decode_is_named_and_the_rest_are_returned() {
        use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition as Crd;
        let mut deep = serde_json::json!({"type": "string"});
        for _ in 0..200 {
            deep = serde_json::json!({"type": "object", "properties": {"a": deep}});
        }
        let crd = |name: &str, schema: serde_json::Value| {
            serde_json::json!({"apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
                "metadata": {"name": name}, "spec": {"group": "example.test", "scope": "Namespaced",
                    "names": {"plural": name, "kind": "W"},
                    "versions": [{"name": "v1", "served": true, "storage": true,
                        "schema": {"openAPIV3Schema": schema}}]}})
        };
        let flat = serde_json::json!({"type": "object"});
        let (good, bad) = (crd("good", flat), crd("deep", deep));
        let (mock, mut handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
        let server = tokio::spawn(async move {
            while let Some((req, send)) = handle.next_request().await {
                let path = req.uri().path().to_string();
                let metadata = req
                    .headers()
                    .get(http::header::ACCEPT)
                    .and_then(|v| v.to_str().ok())
                    .is_some_and(|v| v.contains("PartialObjectMetadataList"));
                let body = match path.rsplit('/').next() {
                    Some("good") => good.clone(),
                    Some("deep") => bad.clone(),
                    _ if metadata => serde_json::json!({"apiVersion": "meta.k8s.io/v1",
                        "kind": "PartialObjectMetadataList", "metadata": {},
                        "items": [{"metadata": {"name": "good"}}, {"metadata": {"name": "deep"}}]}),
                    _ => {
                        serde_json::json!({"apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinitionList",
                        "metadata": {}, "items": [good.clone(), bad.clone()]})
                    }
                };
                send.send_response(Response::new(Body::from(body.to_string().into_bytes())));
            }
        });
        let api: Api<Crd> = Api::all(kube::Client::new(mock, "default"));
        let (names, undecodable) = map_decodable(&api, &ListParams::default(), |n| {
            n.metadata.name.unwrap_or_default()
        })
        .await
        .unwrap();
        server.abort();
        assert_eq!(names, vec!["good".to_string()]);
        assert_eq!(undecodable.len(), 1);
        assert_eq!(undecodable[0].0, "deep");
        assert!(
            undecodable[0].1.contains("recursion limit"),
            "{undecodable:?}"
        );
    }

    /// A server that hands out a continue token on every page is cut off at MAX_PAGES.
    #[tokio::test]
    async fn endless_continue_tokens_stop_at_the_page_cap() {
        let (mock, mut handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
        let server = tokio::spawn(async move {
            let mut served = 0usize;
            while let Some((_, send)) = handle.next_request().await {
                served += 1;
                let page = serde_json::json!({"apiVersion": "v1", "kind": "ConfigMapList",
                    "metadata": {"continue": format!("page-{served}")}, "items": []});
                send.send_response(Response::new(Body::from(page.to_string().into_bytes())));
            }
            served
        });
        let api: Api<ConfigMap> = Api::all(kube::Client::new(mock, "default"));
        let err = all(&api, &ListParams::default()).await.unwrap_err();
        assert!(err.to_string().contains("more than 10000 pages"), "{err}");
        drop(api);
        assert_eq!(server.await.unwrap(), MAX_PAGES);
    }

    /// Pages are of the caller's limit when it sets one (large objects: smaller pages, see
    /// `connection::list`), else of [`PAGE`]; every page of one listing asks the same.
    #[tokio::test]
    async fn pages_are_of_the_callers_limit_or_of_page() {
        for (lp, want) in [
            (ListParams::default(), PAGE),
            (ListParams::default().limit(50), 50),
        ] {
            let (mock, mut handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
            let server = tokio::spawn(async move {
                let mut limits = Vec::new();
                while let Some((req, send)) = handle.next_request().await {
                    let query = req.uri().query().unwrap_or_default().to_string();
                    limits.push(
                        query
                            .split('&')
                            .find_map(|kv| kv.strip_prefix("limit="))
                            .and_then(|v| v.parse::<u32>().ok()),
                    );
                    let next = if limits.len() < 2 { "more" } else { "" };
                    let page = serde_json::json!({"apiVersion": "v1", "kind": "ConfigMapList",
                        "metadata": {"continue": next}, "items": []});
                    send.send_response(Response::new(Body::from(page.to_string().into_bytes())));
                }
                limits
            });
            let api: Api<ConfigMap> = Api::all(kube::Client::new(mock, "default"));
            map_all(&api, &lp, |c| c).await.unwrap();
            drop(api);
            assert_eq!(server.await.unwrap(), vec![Some(want); 2]);
        }
    }

    /// A client whose bodies are capped at `max_body`, as a pass's are (src/pass/retry.rs).
    fn capped(
        max_body: usize,
    ) -> (
        kube::Client,
        tower_test::mock::Handle<Request<Body>, Response<Body>>,
    ) {
        use tower::Layer;
        let (mock, handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
        let layer = crate::pass::retry::RetryLayer(crate::pass::retry::Policy {
            max_body,
            ..Default::default()
        });
        (kube::Client::new(layer.layer(mock), "default"), handle)
    }

    fn limit_of(req: &Request<Body>) -> usize {
        req.uri()
            .query()
            .unwrap_or_default()
            .split('&')
            .find_map(|kv| kv.strip_prefix("limit="))
            .and_then(|v| v.parse().ok())
            .unwrap_or(0)
    }

    /// A page past the body cap is asked for again at half the size (the cap bounds memory;
    /// large objects list in smaller pages), and the next page keeps the smaller size.
    #[tokio::test]
    async fn a_page_past_the_cap_is_asked_for_in_halves() {
        let (client, mut handle) = capped(4096);
        let server = tokio::spawn(async move {
            let mut limits = Vec::new();
            while let Some((req, send)) = handle.next_request().await {
                let limit = limit_of(&req);
                limits.push(limit);
                // Each object is ~40 bytes: more than ~100 of them pass the 4 KiB cap.
                let n = limit.min(3);
                let pad = "x".repeat(if limit > 100 { 8192 } else { 0 });
                let next = if limits.len() < 5 { "more" } else { "" };
                let items: Vec<_> = (0..n)
                    .map(|i| serde_json::json!({"metadata": {"name": format!("c{i}")}, "data": {"p": pad}}))
                    .collect();
                let page = serde_json::json!({"apiVersion": "v1", "kind": "ConfigMapList",
                    "metadata": {"continue": next}, "items": items});
                send.send_response(Response::new(Body::from(page.to_string().into_bytes())));
            }
            limits
        });
        let api: Api<ConfigMap> = Api::all(client);
        let got = all(&api, &ListParams::default()).await.unwrap();
        assert_eq!(got.len(), 6, "two pages of three");
        drop(api);
        assert_eq!(server.await.unwrap(), vec![500, 250, 125, 62, 62]);
    }

    /// A page with more items than asked is refused before it is decoded, and not asked again.
    #[tokio::test]
    async fn a_page_with_more_items_than_asked_is_refused() {
        let (client, mut handle) = capped(1 << 20);
        let server = tokio::spawn(async move {
            let mut served = 0;
            while let Some((req, send)) = handle.next_request().await {
                served += 1;
                let items = vec![serde_json::json!({}); limit_of(&req) + 1];
                let page = serde_json::json!({"apiVersion": "v1", "kind": "ConfigMapList",
                    "metadata": {}, "items": items});
                send.send_response(Response::new(Body::from(page.to_string().into_bytes())));
            }
            served
        });
        let api: Api<ConfigMap> = Api::all(client);
        let err = all(&api, &ListParams::default().limit(20))
            .await
            .unwrap_err();
        assert_eq!(
            crate::pass::retry::Refused::of(&err),
            Some(&crate::pass::retry::Refused::TooManyItems(20)),
            "{err}"
        );
        assert!(err.to_string().contains("more than 20 items"), "{err}");
        drop(api);
        assert_eq!(server.await.unwrap(), 1);
    }
}
