//! Whether the shipped admission policies that confine issued identities are in force
//! (docs/issue.md "Confinement"). Present is not enough: a binding that only audits, a policy
//! that fails open, or a pins binding that selects no Grant confines nothing, and the issuer
//! issues nothing while any of that holds.

use k8s_openapi::api::admissionregistration::v1::{
    MatchResources, ValidatingAdmissionPolicy, ValidatingAdmissionPolicyBinding,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;

use crate::api::iam::{IDENTITIES_POLICY, PINS_POLICY};

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
            let param = spec.param_kind.as_ref();
            let grant = param.is_some_and(|p| {
                p.kind.as_deref() == Some("Grant")
                    && p.api_version.as_deref() == Some("iam.kbind.io/v1alpha1")
            });
            if name == PINS_POLICY && !grant {
                out.push(format!(
                    "ValidatingAdmissionPolicy {name} does not take its parameters from Grants (paramKind Grant, iam.kbind.io/v1alpha1)"
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
