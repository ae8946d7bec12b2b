//! A provider CRD as a LIST page carries it, decoded no further than its JSON text, name and
//! deletion timestamp.
//! A page is then held at its own size, and each CRD is decoded (some 50 times its JSON size)
//! one at a time (docs/performance.md "Memory against hostile answers").

use std::borrow::Cow;

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::ObjectMeta;
use kube::core::ClusterResourceScope;
use serde::{Deserialize, Deserializer};
use serde_json::value::RawValue;

/// One provider CRD: its name, whether it is being deleted, and its JSON text.
#[derive(Clone, Debug)]
pub struct RawCrd {
    pub metadata: ObjectMeta,
    pub text: Box<RawValue>,
}

impl RawCrd {
    pub fn decode(&self) -> Result<CustomResourceDefinition, serde_json::Error> {
        serde_json::from_str(self.text.get())
    }
}

impl<'de> Deserialize<'de> for RawCrd {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(Deserialize, Default)]
        #[serde(rename_all = "camelCase")]
        struct Name {
            #[serde(default)]
            name: Option<String>,
            #[serde(default)]
            deletion_timestamp: Option<k8s_openapi::apimachinery::pkg::apis::meta::v1::Time>,
        }
        #[derive(Deserialize)]
        struct Head {
            #[serde(default)]
            metadata: Name,
        }
        let text = Box::<RawValue>::deserialize(d)?;
        let head: Head = serde_json::from_str(text.get()).map_err(serde::de::Error::custom)?;
        Ok(Self {
            metadata: ObjectMeta {
                name: head.metadata.name,
                deletion_timestamp: head.metadata.deletion_timestamp,
                ..Default::default()
            },
            text,
        })
    }
}

impl kube::Resource for RawCrd {
    type DynamicType = ();
    type Scope = ClusterResourceScope;

    fn kind(_: &()) -> Cow<'_, str> {
        "CustomResourceDefinition".into()
    }
    fn group(_: &()) -> Cow<'_, str> {
        "apiextensions.k8s.io".into()
    }
    fn version(_: &()) -> Cow<'_, str> {
        "v1".into()
    }
    fn plural(_: &()) -> Cow<'_, str> {
        "customresourcedefinitions".into()
    }
    fn meta(&self) -> &ObjectMeta {
        &self.metadata
    }
    fn meta_mut(&mut self) -> &mut ObjectMeta {
        &mut self.metadata
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_page_item_keeps_its_text_name_and_deletion_only() {
        let text = r#"{"apiVersion":"apiextensions.k8s.io/v1","kind":"CustomResourceDefinition","metadata":{"name":"widgets.example.org","uid":"u"},"spec":{"group":"example.org","names":{"plural":"widgets","kind":"Widget"},"scope":"Namespaced","versions":[]}}"#;
        let r: RawCrd = serde_json::from_str(text).unwrap();
        assert_eq!(r.metadata.name.as_deref(), Some("widgets.example.org"));
        assert!(r.metadata.uid.is_none());
        assert!(r.metadata.deletion_timestamp.is_none());
        let deleting: RawCrd = serde_json::from_str(&text.replace(
            r#""uid":"u""#,
            r#""uid":"u","deletionTimestamp":"2026-12-04T10:00:00Z""#,
        ))
        .unwrap();
        assert!(deleting.metadata.deletion_timestamp.is_some());
        assert_eq!(r.text.get(), text);
        assert_eq!(r.decode().unwrap().spec.names.plural, "widgets");
        let list: kube::core::ObjectList<RawCrd> = serde_json::from_str(&format!(
            r#"{{"apiVersion":"v1","kind":"List","metadata":{{"continue":"c"}},"items":[{text},{text}]}}"#
        ))
        .unwrap();
        assert_eq!(list.items.len(), 2);
        assert_eq!(list.metadata.continue_.as_deref(), Some("c"));
    }
}
