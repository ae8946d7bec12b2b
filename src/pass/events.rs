//! Kubernetes Events on the objects a pass acts on. A batch job re-runs every few minutes, so an
//! Event is named after (object, reason, message): the same warning on the next run is not
//! written again while the first one lives.

use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::api::events::v1::Event;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use k8s_openapi::jiff::Timestamp;
use kube::api::{ObjectMeta, PostParams};
use kube::{Api, Client};
use sha2::{Digest, Sha256};

use crate::scrub::scrub;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EventType {
    Normal,
    Warning,
}

#[derive(Clone)]
pub struct Recorder {
    client: Client,
    controller: String,
    instance: String,
    dry_run: bool,
}

impl Recorder {
    pub fn new(client: Client, pass: &str, dry_run: bool) -> Self {
        Self {
            client,
            controller: format!("kbind.io/{pass}"),
            instance: crate::pass::lease::holder_identity(),
            dry_run,
        }
    }

    /// Publish an Event about `regarding`. Returns whether one was written. Failures are logged,
    /// never fatal: an Event is a courtesy, the status is the record.
    pub async fn publish(
        &self,
        regarding: &ObjectReference,
        type_: EventType,
        reason: &str,
        note: &str,
    ) -> bool {
        if self.dry_run {
            return false;
        }
        let note = scrub(note);
        let ns = regarding
            .namespace
            .clone()
            .unwrap_or_else(|| "default".into());
        let name = event_name(regarding, reason, &note);
        let now = Timestamp::now();
        let event = Event {
            metadata: ObjectMeta {
                name: Some(name),
                namespace: Some(ns.clone()),
                ..Default::default()
            },
            event_time: Some(MicroTime(now)),
            action: Some(reason.to_string()),
            reason: Some(reason.to_string()),
            note: Some(note),
            regarding: Some(regarding.clone()),
            reporting_controller: Some(self.controller.clone()),
            reporting_instance: Some(self.instance.chars().take(128).collect()),
            type_: Some(match type_ {
                EventType::Normal => "Normal".into(),
                EventType::Warning => "Warning".into(),
            }),
            ..Default::default()
        };
        let api: Api<Event> = Api::namespaced(self.client.clone(), &ns);
        match api.create(&PostParams::default(), &event).await {
            Ok(_) => true,
            Err(kube::Error::Api(s)) if s.is_already_exists() => false,
            Err(e) => {
                tracing::warn!(reason, error = %e, "could not record Event");
                false
            }
        }
    }
}

fn event_name(regarding: &ObjectReference, reason: &str, note: &str) -> String {
    let mut h = Sha256::new();
    for part in [regarding.uid.as_deref(), Some(reason), Some(note)] {
        h.update(part.unwrap_or("").as_bytes());
        h.update([0]);
    }
    let base: String = regarding
        .name
        .as_deref()
        .unwrap_or("object")
        .chars()
        .take(200)
        .collect();
    format!("{base}.kbind-{}", &hex::encode(h.finalize())[..12])
}
