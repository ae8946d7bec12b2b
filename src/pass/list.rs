//! Paginated LISTs: a pass never asks for a whole collection in one response.

use std::fmt::Debug;

use kube::api::{ListParams, PartialObjectMeta};
use kube::{Api, Resource};
use serde::de::DeserializeOwned;

pub const PAGE: u32 = 500;

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
    let mut lp = lp.clone().limit(PAGE);
    let mut out = Vec::new();
    loop {
        let page = api.list_metadata(&lp).await?;
        out.extend(page.items);
        match page.metadata.continue_.filter(|c| !c.is_empty()) {
            Some(c) => lp = lp.continue_token(&c),
            None => return Ok(out),
        }
    }
}

/// Every object matching `lp`, each mapped through `f` as its page arrives, so only the mapped
/// form is held (a LIST page carries managedFields and everything else the pass never reads).
pub async fn map_all<K, T>(
    api: &Api<K>,
    lp: &ListParams,
    f: impl Fn(K) -> T,
) -> Result<Vec<T>, kube::Error>
where
    K: Resource + Clone + DeserializeOwned + Debug,
{
    let mut lp = lp.clone().limit(PAGE);
    let mut out = Vec::new();
    loop {
        let page = api.list(&lp).await?;
        out.extend(page.items.into_iter().map(&f));
        match page.metadata.continue_.filter(|c| !c.is_empty()) {
            Some(c) => lp = lp.continue_token(&c),
            None => return Ok(out),
        }
    }
}
