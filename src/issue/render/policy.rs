//! The per-Grant admission policy (`--confinement per-grant`, docs/issue.md "Confinement"),
//! for providers that cannot run the shipped policies with parameters (kcp).

use serde_json::{Value, json};

use super::{Resolved, object_name, username};
use crate::api::iam::GRANT_KEY;
use crate::api::keys;

/// A CEL string literal of a value already checked to hold no quote or backslash.
fn lit(s: &str) -> String {
    format!("'{s}'")
}

/// The per-Grant ValidatingAdmissionPolicy (docs/issue.md "Confinement"): requests of the
/// Grant's ServiceAccount on the Export's objects (and status) and on Leases must keep to its own consumer cluster and Grant. `pinned` is the consumer-cluster
/// value once known; until then every object write is refused.
pub fn policy_spec(r: &Resolved, namespace: &str, grant: &str, pinned: Option<&str>) -> Value {
    let mut rules: Vec<Value> = r
        .apis
        .iter()
        .map(|a| {
            json!({
                "apiGroups": [a.group],
                "apiVersions": ["*"],
                "resources": [a.plural, format!("{}/status", a.plural)],
                "operations": ["CREATE", "UPDATE", "DELETE"],
            })
        })
        .collect();
    rules.push(json!({"apiGroups": ["coordination.k8s.io"], "apiVersions": ["*"], "resources": ["leases"], "operations": ["CREATE", "UPDATE", "DELETE"]}));
    let label = |obj: &str, key: &str| {
        format!(
            "({obj} == null || !has({obj}.metadata.labels) || !({k} in {obj}.metadata.labels) ? '' : {obj}.metadata.labels[{k}])",
            k = lit(key)
        )
    };
    json!({
        "failurePolicy": "Fail",
        "matchConstraints": {"resourceRules": rules},
        "matchConditions": [{
            "name": "issued-identity",
            "expression": format!("request.userInfo.username == {}", lit(&username(namespace, grant))),
        }],
        "variables": [
            {"name": "isLease", "expression": "request.resource.group == 'coordination.k8s.io' && request.resource.resource == 'leases'"},
            {"name": "pinned", "expression": lit(pinned.unwrap_or(""))},
            {"name": "newCluster", "expression": label("object", keys::CONSUMER_CLUSTER)},
            {"name": "oldCluster", "expression": label("oldObject", keys::CONSUMER_CLUSTER)},
            {"name": "newGrant", "expression": label("object", GRANT_KEY)},
            {"name": "oldGrant", "expression": label("oldObject", GRANT_KEY)},
        ],
        "validations": [
            {
                "expression": format!("!variables.isLease || (request.namespace == {ns} && (object == null || (variables.newGrant == {g} && object.metadata.name == {n})) && (oldObject == null || (variables.oldGrant == {g} && oldObject.metadata.name == {n})))", ns = lit(namespace), g = lit(grant), n = lit(&object_name(grant))),
                "message": format!("this identity may only write its heartbeat Lease {namespace}/{}, labelled {GRANT_KEY}={grant}", object_name(grant)),
                "reason": "Forbidden",
            },
            {
                "expression": "variables.isLease || variables.pinned != ''",
                "message": format!("the consumer cluster of Grant {grant} {}: kbind resync's heartbeat pins it at the next kbind issue run, then writes are allowed", crate::api::iam::NOT_PINNED),
                "reason": "Forbidden",
            },
            {
                "expression": format!("variables.isLease || ((object == null || variables.newCluster == variables.pinned || (request.operation == 'UPDATE' && variables.newCluster == '')) && (oldObject == null || variables.oldCluster == variables.pinned))"),
                "messageExpression": format!("'Grant {grant} may only write objects labelled {}=' + variables.pinned", keys::CONSUMER_CLUSTER),
                "reason": "Forbidden",
            },
        ],
    })
}
