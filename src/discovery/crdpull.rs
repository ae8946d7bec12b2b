//! Provider CRD → consumer CRD. The consumer copy keeps one version (the provider's storage
//! version, else the first served one), served and stored locally, with conversion forced to
//! `None`: kbind installs no webhooks, so provider-side conversion is not reproduced.

use std::collections::BTreeMap;
use std::sync::Arc;

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::{
    CustomResourceConversion, CustomResourceDefinition, CustomResourceDefinitionSpec,
};
use kube::api::ObjectMeta;
use serde_json::Value;
use sha2::{Digest, Sha256};

use crate::api::core::ExportedApi;
use crate::api::keys;

/// A consumer CRD held as its JSON text. Decoded, a CRD takes some 50 times its JSON size
/// (every schema node is a struct of some 40 optional fields): a Connection's exports are held
/// as text and turned into a request body one at a time, when written (docs/performance.md
/// "Memory against hostile answers").
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CrdJson(Arc<str>);

impl CrdJson {
    pub fn of(crd: &CustomResourceDefinition) -> Self {
        Self(serde_json::to_string(crd).unwrap_or_default().into())
    }

    /// Its length in bytes: what holding it costs.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    pub fn decode(&self) -> Result<CustomResourceDefinition, serde_json::Error> {
        serde_json::from_str(&self.0)
    }

    fn value(&self) -> Result<Value, serde_json::Error> {
        serde_json::from_str(&self.0)
    }
}

/// An exported API and the consumer CRD kbind would install for it (without markers).
#[derive(Clone, Debug, PartialEq)]
pub struct Export {
    pub api: ExportedApi,
    pub crd: CrdJson,
    /// The provider converts between versions with a webhook that the consumer copy drops.
    pub webhook_conversion: bool,
}

/// The consumer form of a provider CRD, or `None` when no version is served.
pub fn from_provider_crd(provider: &CustomResourceDefinition) -> Option<Export> {
    let spec = &provider.spec;
    let version = spec
        .versions
        .iter()
        .find(|v| v.storage && v.served)
        .or_else(|| spec.versions.iter().find(|v| v.served))?;
    let mut v = version.clone();
    v.served = true;
    v.storage = true;
    v.deprecated = None;
    v.deprecation_warning = None;
    let crd = CustomResourceDefinition {
        metadata: ObjectMeta {
            name: Some(format!("{}.{}", spec.names.plural, spec.group)),
            ..Default::default()
        },
        spec: CustomResourceDefinitionSpec {
            group: spec.group.clone(),
            names: spec.names.clone(),
            scope: spec.scope.clone(),
            versions: vec![v],
            conversion: Some(CustomResourceConversion {
                strategy: "None".into(),
                webhook: None,
            }),
            preserve_unknown_fields: None,
        },
        status: None,
    };
    let webhook_conversion = spec
        .conversion
        .as_ref()
        .is_some_and(|c| c.strategy == "Webhook");
    Some(export_of(crd, webhook_conversion))
}

/// Describe a consumer CRD as an export (name, scope, served version, schema hash).
pub fn export_of(crd: CustomResourceDefinition, webhook_conversion: bool) -> Export {
    let storage = crd
        .spec
        .versions
        .iter()
        .find(|v| v.storage)
        .or(crd.spec.versions.first());
    let api = ExportedApi {
        name: format!("{}.{}", crd.spec.names.plural, crd.spec.group),
        scope: crd.spec.scope.clone(),
        version: storage.map(|v| v.name.clone()).unwrap_or_default(),
        schema_hash: schema_hash(&crd.spec),
    };
    Export {
        api,
        crd: CrdJson::of(&crd),
        webhook_conversion,
    }
}

/// A short, stable hash of the CRD spec kbind installs. serde_json maps are ordered, so the
/// serialization is canonical.
pub fn schema_hash(spec: &CustomResourceDefinitionSpec) -> String {
    let json = serde_json::to_vec(spec).unwrap_or_default();
    hex::encode(&Sha256::digest(&json)[..8])
}

/// A consumer CRD to write: the export's CRD and kbind's markers, made into a request body only
/// when written.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConsumerCrd {
    pub name: String,
    pub crd: CrdJson,
    pub labels: BTreeMap<String, String>,
    pub annotations: BTreeMap<String, String>,
}

impl ConsumerCrd {
    /// The request body: the CRD with exactly these labels and annotations.
    pub fn body(&self) -> Result<Value, serde_json::Error> {
        let mut v = self.crd.value()?;
        v["metadata"]["labels"] = serde_json::to_value(&self.labels)?;
        v["metadata"]["annotations"] = serde_json::to_value(&self.annotations)?;
        v["apiVersion"] = Value::from("apiextensions.k8s.io/v1");
        v["kind"] = Value::from("CustomResourceDefinition");
        Ok(v)
    }
}

/// The consumer CRD to write: the export's CRD with kbind's markers for `connection`.
pub fn with_markers(export: &Export, connection: &str) -> ConsumerCrd {
    ConsumerCrd {
        name: export.api.name.clone(),
        crd: export.crd.clone(),
        labels: BTreeMap::from([(keys::MANAGED.to_string(), "true".to_string())]),
        annotations: BTreeMap::from([
            (keys::CONNECTION.to_string(), connection.to_string()),
            (
                keys::SCHEMA_HASH.to_string(),
                export.api.schema_hash.clone(),
            ),
        ]),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::{
        CustomResourceDefinitionNames, CustomResourceDefinitionVersion, WebhookConversion,
    };

    fn version(name: &str, served: bool, storage: bool) -> CustomResourceDefinitionVersion {
        CustomResourceDefinitionVersion {
            name: name.into(),
            served,
            storage,
            ..Default::default()
        }
    }

    fn provider(
        versions: Vec<CustomResourceDefinitionVersion>,
        webhook: bool,
    ) -> CustomResourceDefinition {
        CustomResourceDefinition {
            metadata: ObjectMeta {
                name: Some("widgets.example.org".into()),
                uid: Some("u".into()),
                ..Default::default()
            },
            spec: CustomResourceDefinitionSpec {
                group: "example.org".into(),
                names: CustomResourceDefinitionNames {
                    plural: "widgets".into(),
                    kind: "Widget".into(),
                    ..Default::default()
                },
                scope: "Namespaced".into(),
                versions,
                conversion: webhook.then(|| CustomResourceConversion {
                    strategy: "Webhook".into(),
                    webhook: Some(WebhookConversion {
                        conversion_review_versions: vec!["v1".into()],
                        client_config: None,
                    }),
                }),
                preserve_unknown_fields: None,
            },
            status: None,
        }
    }

    #[test]
    fn version_selection() {
        let cases = [
            (
                vec![version("v1", true, false), version("v2", true, true)],
                Some("v2"),
            ),
            (
                vec![version("v1", false, true), version("v2", true, false)],
                Some("v2"),
            ),
            (
                vec![version("v1", true, false), version("v2", true, false)],
                Some("v1"),
            ),
            (vec![version("v1", false, true)], None),
            (vec![], None),
        ];
        for (versions, want) in cases {
            let got = from_provider_crd(&provider(versions.clone(), false));
            assert_eq!(
                got.as_ref().map(|e| e.api.version.as_str()),
                want,
                "{versions:?}"
            );
            if let Some(e) = got {
                let crd = e.crd.decode().unwrap();
                assert_eq!(crd.spec.versions.len(), 1);
                assert!(crd.spec.versions[0].served && crd.spec.versions[0].storage);
            }
        }
    }

    #[test]
    fn webhook_conversion_is_dropped_and_flagged() {
        let e = from_provider_crd(&provider(vec![version("v1", true, true)], true)).unwrap();
        assert!(e.webhook_conversion);
        let crd = e.crd.decode().unwrap();
        let conv = crd.spec.conversion.unwrap();
        assert_eq!(conv.strategy, "None");
        assert!(conv.webhook.is_none());
        assert!(
            crd.metadata.uid.is_none(),
            "provider identity fields are not copied"
        );
    }

    #[test]
    fn hash_follows_the_schema_only() {
        let a = from_provider_crd(&provider(vec![version("v1", true, true)], false)).unwrap();
        let mut p = provider(vec![version("v1", true, true)], false);
        p.metadata.resource_version = Some("999".into());
        assert_eq!(
            a.api.schema_hash,
            from_provider_crd(&p).unwrap().api.schema_hash
        );
        let mut v = version("v1", true, true);
        v.additional_printer_columns = Some(vec![]);
        assert_ne!(
            a.api.schema_hash,
            from_provider_crd(&provider(vec![v], false))
                .unwrap()
                .api
                .schema_hash
        );
        let m = with_markers(&a, "conn").body().unwrap();
        assert_eq!(m["metadata"]["labels"][keys::MANAGED], "true");
        assert_eq!(
            m["metadata"]["annotations"][keys::SCHEMA_HASH],
            a.api.schema_hash.as_str()
        );
        assert_eq!(m["metadata"]["name"], "widgets.example.org");
        assert_eq!(m["kind"], "CustomResourceDefinition");
        // The body decodes as the CRD it stands for.
        let crd: CustomResourceDefinition = serde_json::from_value(m).unwrap();
        assert_eq!(crd.spec.versions.len(), 1);
    }
}
