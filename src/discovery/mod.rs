//! Exported-API discovery on the provider, by source: labelled CRDs, or discovery plus
//! `/openapi/v3` for CRD-less providers. `Auto` falls through to OpenAPI only after a
//! *successful* empty CRD list: a failed list (Forbidden included) is an error, not a fallback.
//!
//! Shared by `kbind schema` (which installs consumer CRDs from what it finds) and `kbind bind`
//! (which checks the APIs it binds are exported): `crdpull` turns a provider CRD into the
//! consumer's, `openapi` synthesizes one for CRD-less providers.

pub mod crdpull;
pub mod openapi;
mod raw;

use std::collections::BTreeMap;
use std::sync::Arc;

use kube::api::ListParams;
use kube::{Api, Client};

use crate::api::core::SchemaSource;
use crate::api::keys;
use crate::pass::StatusCode;
use crdpull::{Export, export_of, from_provider_crd};
use openapi::{DiscoveredVersion, is_builtin_group, synthesize};

/// Result of discovery on the provider.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Discovered {
    pub source: SchemaSource,
    /// Sorted by name.
    pub exports: Vec<Export>,
    /// Candidates that could not be exported, with why (e.g. no served version).
    pub skipped: Vec<(String, String)>,
}

/// Why discovery failed. Clone, so the schema pass's per-run memo can hand one provider's
/// failure to every Connection that shares it; the kube error is shared, not copied.
#[derive(Clone, Debug, thiserror::Error)]
pub enum DiscoveryError {
    #[error("{what}: {source}")]
    Kube {
        what: String,
        #[source]
        source: Arc<kube::Error>,
    },
    #[error(
        "the provider exports more than kbind holds for one Connection ({exports} CRDs, {kib} KiB of schema; at most {max_exports} and {max_kib} KiB): export fewer CRDs (label core.kbind.io/exported)"
    )]
    TooLarge {
        exports: usize,
        kib: usize,
        max_exports: usize,
        max_kib: usize,
    },
    #[error("invalid OpenAPI path {path}: {source}")]
    Path {
        path: String,
        #[source]
        source: Arc<http::Error>,
    },
}

impl DiscoveryError {
    /// The provider refused us (HTTP 403): the Connection says `PermissionDenied`, not `Ready=False`.
    pub fn forbidden(&self) -> bool {
        matches!(self, Self::Kube { source, .. } if source.is_forbidden())
    }
}

fn error(what: impl Into<String>, e: kube::Error) -> DiscoveryError {
    DiscoveryError::Kube {
        what: what.into(),
        source: Arc::new(e),
    }
}

/// Discover the provider's exports for `source`.
pub async fn discover(
    provider: &Client,
    source: SchemaSource,
) -> Result<Discovered, DiscoveryError> {
    match source {
        SchemaSource::Crd => crd_source(provider).await,
        SchemaSource::OpenApi => openapi_source(provider).await,
        SchemaSource::Auto => {
            let d = crd_source(provider).await?;
            if d.exports.is_empty() {
                openapi_source(provider).await
            } else {
                Ok(d)
            }
        }
    }
}

/// Provider CRDs per LIST page. A page is held as JSON text, each CRD decoded on its own.
const CRD_PAGE: u32 = 50;

/// Most JSON text of consumer CRDs one Connection's exports may hold (48 MiB), and most
/// exports: a provider exporting more is refused with a message saying so, before it can push
/// the pass past its memory limit (docs/hostile-inputs.md).
pub const MAX_EXPORT_BYTES: usize = 48 << 20;
pub const MAX_EXPORTS: usize = 2000;

/// Provider CRDs labelled `core.kbind.io/exported=true` (exact value) with a served version.
/// A CRD being deleted is withdrawn: the provider refuses new objects of it, and its deletion
/// may wait on finalizers for as long as they take (docs/schema.md, step 4).
async fn crd_source(provider: &Client) -> Result<Discovered, DiscoveryError> {
    let api: Api<raw::RawCrd> = Api::all(provider.clone());
    let mut lp = ListParams::default()
        .labels(&format!("{}=true", keys::EXPORTED))
        .limit(CRD_PAGE);
    let mut d = Discovered {
        source: SchemaSource::Crd,
        ..Default::default()
    };
    let mut pages = 0;
    loop {
        // Endless continue tokens must not hold the pass (docs/hostile-inputs.md).
        if pages == crate::pass::list::MAX_PAGES {
            let e = crate::pass::list::too_many_pages_of(lp.limit.unwrap_or(CRD_PAGE));
            return Err(error("listing exported provider CRDs", e));
        }
        pages += 1;
        let page = match api.list(&lp).await {
            Ok(p) => p,
            // A page past the body cap: the same page in halves (src/pass/list.rs).
            Err(e) if crate::pass::list::smaller(&mut lp, &e) => continue,
            // One CRD the client cannot decode (a schema nested past the JSON reader's
            // recursion limit) must not hide every other export: read them one by one.
            Err(kube::Error::SerdeError(_)) => {
                one_by_one(&api, &lp, &mut d).await?;
                break;
            }
            Err(e) => return Err(error("listing exported provider CRDs", e)),
        };
        for item in page
            .items
            .iter()
            .filter(|i| i.metadata.deletion_timestamp.is_none())
        {
            let name = item.metadata.name.clone().unwrap_or_default();
            match item.decode() {
                Ok(crd) => match from_provider_crd(&crd) {
                    Some(e) => d.exports.push(e),
                    None => d.skipped.push((name, "no served version".into())),
                },
                Err(e) => d.skipped.push((name, unreadable(&e))),
            }
        }
        check_size(&d)?;
        match page.metadata.continue_.filter(|c| !c.is_empty()) {
            Some(c) => lp = lp.continue_token(&c),
            None => break,
        }
    }
    d.exports.sort_by(|a, b| a.api.name.cmp(&b.api.name));
    Ok(d)
}

/// Why a provider CRD cannot be exported: its definition does not decode.
fn unreadable(e: &serde_json::Error) -> String {
    format!("its definition cannot be read ({e}); is its schema nested too deeply?")
}

/// Refuse a provider whose exports exceed [`MAX_EXPORT_BYTES`] or [`MAX_EXPORTS`].
fn check_size(d: &Discovered) -> Result<(), DiscoveryError> {
    within(d, MAX_EXPORT_BYTES, MAX_EXPORTS)
}

fn within(d: &Discovered, max_bytes: usize, max_exports: usize) -> Result<(), DiscoveryError> {
    let bytes: usize = d.exports.iter().map(|e| e.crd.len()).sum();
    if bytes > max_bytes || d.exports.len() > max_exports {
        return Err(DiscoveryError::TooLarge {
            exports: d.exports.len(),
            kib: bytes >> 10,
            max_exports,
            max_kib: max_bytes >> 10,
        });
    }
    Ok(())
}

/// The rest of a CRD list (from `lp`'s page on) read by name: a CRD that cannot be decoded is
/// skipped with the reason, so its binding says `ExportUnusable` and the others are unaffected.
async fn one_by_one(
    raw: &Api<raw::RawCrd>,
    lp: &ListParams,
    d: &mut Discovered,
) -> Result<(), DiscoveryError> {
    let names = crate::pass::list::metadata(raw, lp)
        .await
        .map_err(|e| error("listing exported provider CRDs", e))?;
    for meta in &names {
        let name = meta.metadata.name.clone().unwrap_or_default();
        match raw
            .get_opt(&name)
            .await
            .map(|o| o.map(|item| item.decode()))
        {
            Ok(Some(Ok(crd))) if crd.metadata.deletion_timestamp.is_some() => {}
            Ok(Some(Ok(crd))) => match from_provider_crd(&crd) {
                Some(e) => d.exports.push(e),
                None => d.skipped.push((name, "no served version".into())),
            },
            Ok(Some(Err(e))) | Err(kube::Error::SerdeError(e)) => {
                d.skipped.push((name, unreadable(&e)))
            }
            Ok(None) => {} // deleted since the list
            Err(e) => return Err(error(format!("reading provider CRD {name}"), e)),
        }
        check_size(d)?;
    }
    Ok(())
}

/// Non-built-in discovery groups, each synthesized into a CRD from `/openapi/v3`.
async fn openapi_source(provider: &Client) -> Result<Discovered, DiscoveryError> {
    let groups = provider
        .list_api_groups()
        .await
        .map_err(|e| error("listing API groups", e))?;
    let mut versions: BTreeMap<(String, String), Vec<DiscoveredVersion>> = BTreeMap::new();
    let mut gv_paths = Vec::new();
    for g in groups.groups.iter().filter(|g| !is_builtin_group(&g.name)) {
        let preferred = g.preferred_version.as_ref().map(|p| p.version.clone());
        for v in &g.versions {
            let list = match provider.list_api_group_resources(&v.group_version).await {
                Ok(l) => l,
                // The group went away between the two reads: nothing to export from it.
                Err(e) if e.is_not_found() => continue,
                Err(e) => {
                    return Err(error(
                        format!("listing resources of {}", v.group_version),
                        e,
                    ));
                }
            };
            let with_status: Vec<&str> = list
                .resources
                .iter()
                .filter_map(|r| r.name.strip_suffix("/status"))
                .collect();
            let mut any = false;
            for r in list.resources.iter().filter(|r| !r.name.contains('/')) {
                any = true;
                versions
                    .entry((g.name.clone(), r.name.clone()))
                    .or_default()
                    .push(DiscoveredVersion {
                        group: g.name.clone(),
                        version: v.version.clone(),
                        kind: r.kind.clone(),
                        plural: r.name.clone(),
                        singular: r.singular_name.clone(),
                        namespaced: r.namespaced,
                        has_status: with_status.contains(&r.name.as_str()),
                        preferred: preferred.as_deref() == Some(v.version.as_str()),
                    });
            }
            if any {
                gv_paths.push(format!("apis/{}", v.group_version));
            }
        }
    }
    let docs = openapi_docs(provider, &gv_paths).await?;
    let mut d = Discovered {
        source: SchemaSource::OpenApi,
        ..Default::default()
    };
    for ((group, plural), vs) in versions {
        match synthesize(&vs, &docs) {
            Ok(crd) => {
                d.exports.push(export_of(crd, false));
                check_size(&d)?;
            }
            Err(e) => d.skipped.push((format!("{plural}.{group}"), e.to_string())),
        }
    }
    d.exports.sort_by(|a, b| a.api.name.cmp(&b.api.name));
    Ok(d)
}

/// Fetch the OpenAPI v3 document of each discovered group-version.
async fn openapi_docs(
    provider: &Client,
    paths: &[String],
) -> Result<BTreeMap<String, serde_json::Value>, DiscoveryError> {
    let get = |uri: String| async move {
        let req = http::Request::get(&uri)
            .body(Vec::new())
            .map_err(|e| DiscoveryError::Path {
                path: uri.clone(),
                source: Arc::new(e),
            })?;
        match provider.request::<serde_json::Value>(req).await {
            Ok(doc) => Ok(Some(doc)),
            // Published in discovery but not (or no longer) in OpenAPI: its APIs are skipped
            // as having no schema; the rest of discovery stands.
            Err(e) if e.is_not_found() => Ok(None),
            Err(e) => Err(error("reading /openapi/v3", e)),
        }
    };
    let mut docs = BTreeMap::new();
    for p in paths {
        // The plain path, not the index's hashed serverRelativeURL: a hash goes stale when the
        // provider's APIs change mid-pass, and the server then answers with a redirect.
        if let Some(doc) = get(format!("/openapi/v3/{p}")).await? {
            docs.insert(p.clone(), doc);
        }
    }
    Ok(docs)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Past either cap the provider is refused with a message naming both figures; at the cap
    /// it is not.
    #[test]
    fn a_provider_exporting_more_than_a_connection_holds_is_refused() {
        let crd = k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition::default();
        let one = crdpull::export_of(crd, false);
        let size = one.crd.len();
        let d = |n: usize| Discovered {
            exports: vec![one.clone(); n],
            ..Default::default()
        };
        assert!(within(&d(4), 4 * size, 4).is_ok());
        let e = within(&d(5), 4 * size, 10).unwrap_err();
        assert!(!e.forbidden());
        let message = e.to_string();
        assert!(message.contains("(5 CRDs,"), "{message}");
        assert!(message.contains("export fewer CRDs"), "{message}");
        assert!(within(&d(5), 100 * size, 4).is_err());
    }
}
