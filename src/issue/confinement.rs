//! Whether the shipped admission policies that confine issued identities are in force
//! (docs/issue.md "Confinement"). Present is not enough: a binding that only audits, a policy
//! that fails open, or a pins binding that selects no Grant confines nothing, and the issuer
//! issues nothing while any of that holds.

use k8s_openapi::api::admissionregistration::v1::ValidatingAdmissionPolicySpec;
use k8s_openapi::api::admissionregistration::v1::{
    MatchResources, ValidatingAdmissionPolicy, ValidatingAdmissionPolicyBinding,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use serde_json::Value;

use crate::api::iam::{IDENTITIES_POLICY, PINS_POLICY};

/// The policies as this version of kbind ships them (the chart renders the same; tests/deploy.rs
/// checks it).
const SHIPPED_YAML: &str = include_str!("../../deploy/components/provider/issue-rbac.yaml");

/// The shipped spec of the policy `name`; `None` only if this build ships no such policy.
fn shipped_spec(name: &str) -> Option<ValidatingAdmissionPolicySpec> {
    let docs: Vec<Value> = serde_saphyr::from_multiple(SHIPPED_YAML).ok()?;
    let doc = docs
        .into_iter()
        .find(|d| d["kind"] == "ValidatingAdmissionPolicy" && d["metadata"]["name"] == name)?;
    serde_json::from_value(doc.get("spec")?.clone()).ok()
}

/// `matchConstraints` without what the apiserver fills in by default, so the shipped and the
/// stored forms compare equal.
fn constraints(spec: &ValidatingAdmissionPolicySpec) -> Value {
    let mut v = serde_json::to_value(&spec.match_constraints).unwrap_or(Value::Null);
    if let Some(m) = v.as_object_mut() {
        if m.get("matchPolicy").is_some_and(|p| p == "Equivalent") {
            m.remove("matchPolicy");
        }
        for s in ["namespaceSelector", "objectSelector"] {
            if m.get(s)
                .is_some_and(|x| x.as_object().is_some_and(|o| o.is_empty()))
            {
                m.remove(s);
            }
        }
        for rules in ["resourceRules", "excludeResourceRules"] {
            for r in m
                .get_mut(rules)
                .and_then(Value::as_array_mut)
                .into_iter()
                .flatten()
            {
                if let Some(r) = r.as_object_mut()
                    && r.get("scope").is_some_and(|s| s == "*")
                {
                    r.remove("scope");
                }
            }
        }
    }
    v
}

/// What a policy checks, for comparing with the shipped one: which requests it matches, under
/// which conditions, its parameters, variables and validation expressions (messages may differ).
fn checks(spec: &ValidatingAdmissionPolicySpec) -> [(&'static str, Value); 5] {
    let pairs = |v: Option<Vec<(String, String)>>| serde_json::to_value(v.unwrap_or_default());
    [
        ("matchConstraints", constraints(spec)),
        (
            "matchConditions",
            pairs(spec.match_conditions.as_ref().map(|m| {
                m.iter()
                    .map(|c| (c.name.clone(), c.expression.clone()))
                    .collect()
            }))
            .unwrap_or(Value::Null),
        ),
        (
            "variables",
            pairs(spec.variables.as_ref().map(|m| {
                m.iter()
                    .map(|c| (c.name.clone(), c.expression.clone()))
                    .collect()
            }))
            .unwrap_or(Value::Null),
        ),
        (
            "paramKind",
            serde_json::to_value(&spec.param_kind).unwrap_or(Value::Null),
        ),
        (
            "validations",
            serde_json::to_value(
                spec.validations
                    .iter()
                    .flatten()
                    .map(|v| v.expression.clone())
                    .collect::<Vec<_>>(),
            )
            .unwrap_or(Value::Null),
        ),
    ]
}

/// The fields of `live` whose checks differ from the shipped policy `name`'s.
fn differs(name: &str, live: &ValidatingAdmissionPolicySpec) -> Vec<&'static str> {
    let Some(shipped) = shipped_spec(name) else {
        return vec!["(this build ships no such policy)"];
    };
    checks(live)
        .into_iter()
        .zip(checks(&shipped))
        .filter(|((_, a), (_, b))| a != b)
        .map(|((field, _), _)| field)
        .collect()
}

/// One shipped policy and its binding (same name), as read.
pub struct Observed<'a> {
    pub name: &'a str,
    pub policy: Option<&'a ValidatingAdmissionPolicy>,
    pub binding: Option<&'a ValidatingAdmissionPolicyBinding>,
}

fn everything(s: Option<&LabelSelector>) -> bool {
    s.is_none_or(|s| {
        s.match_labels.as_ref().is_none_or(|m| m.is_empty())
            && s.match_expressions.as_ref().is_none_or(Vec::is_empty)
    })
}

/// A binding's `matchResources` narrows nothing the policy matches (the apiserver defaults it
/// to empty selectors).
fn narrows(m: Option<&MatchResources>) -> bool {
    m.is_some_and(|m| {
        !everything(m.namespace_selector.as_ref())
            || !everything(m.object_selector.as_ref())
            || m.resource_rules.as_ref().is_some_and(|r| !r.is_empty())
            || m.exclude_resource_rules
                .as_ref()
                .is_some_and(|r| !r.is_empty())
    })
}

/// What keeps one shipped policy from confining, one line each naming the object; empty when
/// it is in force as shipped.
pub fn gaps(o: &Observed<'_>) -> Vec<String> {
    let (name, mut out) = (o.name, Vec::new());
    match o.policy.and_then(|p| p.spec.as_ref()) {
        None => out.push(format!("ValidatingAdmissionPolicy {name} is missing")),
        Some(spec) => {
            if spec.failure_policy.as_deref() == Some("Ignore") {
                out.push(format!(
                    "ValidatingAdmissionPolicy {name} has failurePolicy Ignore (a check that fails would admit the write)"
                ));
            }
            let changed = differs(name, spec);
            if !changed.is_empty() {
                out.push(format!(
                    "ValidatingAdmissionPolicy {name} checks other than this kbind ships ({}): apply this version's provider manifests or chart",
                    changed.join(", ")
                ));
            }
        }
    }
    let Some(spec) = o.binding.and_then(|b| b.spec.as_ref()) else {
        out.push(format!(
            "ValidatingAdmissionPolicyBinding {name} is missing"
        ));
        return out;
    };
    if spec.policy_name.as_deref() != Some(name) {
        out.push(format!(
            "ValidatingAdmissionPolicyBinding {name} binds {:?}, not {name}",
            spec.policy_name.as_deref().unwrap_or_default()
        ));
    }
    if !spec
        .validation_actions
        .as_ref()
        .is_some_and(|a| a.iter().any(|a| a == "Deny"))
    {
        out.push(format!(
            "ValidatingAdmissionPolicyBinding {name} does not deny (validationActions {:?})",
            spec.validation_actions.clone().unwrap_or_default()
        ));
    }
    if narrows(spec.match_resources.as_ref()) {
        out.push(format!(
            "ValidatingAdmissionPolicyBinding {name} narrows what the policy applies to (matchResources)"
        ));
    }
    if name == PINS_POLICY {
        let all = spec.param_ref.as_ref().is_some_and(|r| {
            r.name.is_none() && r.selector.is_some() && everything(r.selector.as_ref())
        });
        if !all {
            out.push(format!(
                "ValidatingAdmissionPolicyBinding {name} does not take every Grant as a parameter (paramRef.selector: {{}})"
            ));
        }
    }
    out
}

/// The shipped policies' names, in the order they are checked and reported.
pub const SHIPPED: [&str; 2] = [IDENTITIES_POLICY, PINS_POLICY];

#[cfg(test)]
mod tests;
