use super::*;
use serde_json::{Value, json};

/// The two policies and bindings exactly as deploy/components/provider/issue-rbac.yaml ships them.
fn shipped() -> Vec<Value> {
    let docs: Vec<Value> = serde_saphyr::from_multiple(include_str!(
        "../../../deploy/components/provider/issue-rbac.yaml"
    ))
    .unwrap();
    docs.into_iter()
        .filter(|d| {
            d["kind"]
                .as_str()
                .is_some_and(|k| k.starts_with("ValidatingAdmissionPolicy"))
                && SHIPPED.contains(&d["metadata"]["name"].as_str().unwrap_or_default())
        })
        .collect()
}

/// The gaps of both shipped policies after `change` edits the documents.
fn gaps_after(change: impl Fn(&mut Vec<Value>)) -> Vec<String> {
    let mut docs = shipped();
    assert_eq!(docs.len(), 4);
    change(&mut docs);
    let find = |kind: &str, name: &str| {
        docs.iter()
            .find(|d| d["kind"] == kind && d["metadata"]["name"] == name)
            .cloned()
    };
    let mut out = Vec::new();
    for name in SHIPPED {
        let policy: Option<ValidatingAdmissionPolicy> =
            find("ValidatingAdmissionPolicy", name).map(|d| serde_json::from_value(d).unwrap());
        let binding: Option<ValidatingAdmissionPolicyBinding> =
            find("ValidatingAdmissionPolicyBinding", name)
                .map(|d| serde_json::from_value(d).unwrap());
        out.extend(gaps(&Observed {
            name,
            policy: policy.as_ref(),
            binding: binding.as_ref(),
        }));
    }
    out
}

/// Edit the document of `kind` named `name`.
fn edit(docs: &mut [Value], kind: &str, name: &str, f: impl Fn(&mut Value)) {
    let d = docs
        .iter_mut()
        .find(|d| d["kind"] == kind && d["metadata"]["name"] == name)
        .unwrap();
    f(d);
}

const VAP: &str = "ValidatingAdmissionPolicy";
const VAPB: &str = "ValidatingAdmissionPolicyBinding";

#[test]
fn the_shipped_policies_are_in_force_and_each_weakening_is_named() {
    assert_eq!(gaps_after(|_| {}), Vec::<String>::new());
    // As the apiserver returns them: matchResources defaulted to empty selectors.
    assert_eq!(
        gaps_after(|d| {
            for name in SHIPPED {
                edit(
                    d,
                    VAPB,
                    name,
                    |b| b["spec"]["matchResources"] = json!({"namespaceSelector": {}, "objectSelector": {}, "matchPolicy": "Equivalent"}),
                );
            }
        }),
        Vec::<String>::new()
    );
    // As the apiserver stores them: rules scoped "*", matchPolicy and empty selectors filled in,
    // messages reworded.
    assert_eq!(
        gaps_after(|d| {
            for name in SHIPPED {
                edit(d, VAP, name, |p| {
                    let m = &mut p["spec"]["matchConstraints"];
                    m["matchPolicy"] = json!("Equivalent");
                    m["namespaceSelector"] = json!({});
                    if m.get("objectSelector").is_none() {
                        m["objectSelector"] = json!({});
                    }
                    for r in m["resourceRules"].as_array_mut().unwrap() {
                        r["scope"] = json!("*");
                    }
                    p["spec"]["validations"][0]["message"] = json!("reworded");
                });
            }
        }),
        Vec::<String>::new()
    );
    // Deny alongside Audit or Warn still denies.
    assert_eq!(
        gaps_after(|d| edit(d, VAPB, IDENTITIES_POLICY, |b| {
            b["spec"]["validationActions"] = json!(["Warn", "Deny"])
        })),
        Vec::<String>::new()
    );

    type Change = Box<dyn Fn(&mut Vec<Value>)>;
    let cases: Vec<(&str, Change)> = vec![
        (
            "ValidatingAdmissionPolicy kbind-grant-identities is missing",
            Box::new(|d| {
                d.retain(|x| !(x["kind"] == VAP && x["metadata"]["name"] == IDENTITIES_POLICY))
            }),
        ),
        (
            "ValidatingAdmissionPolicyBinding kbind-grant-pins is missing",
            Box::new(|d| {
                d.retain(|x| !(x["kind"] == VAPB && x["metadata"]["name"] == PINS_POLICY))
            }),
        ),
        (
            "ValidatingAdmissionPolicyBinding kbind-grant-identities does not deny (validationActions [\"Audit\"])",
            Box::new(|d| {
                edit(d, VAPB, IDENTITIES_POLICY, |b| {
                    b["spec"]["validationActions"] = json!(["Audit"])
                })
            }),
        ),
        (
            "ValidatingAdmissionPolicy kbind-grant-pins has failurePolicy Ignore (a check that fails would admit the write)",
            Box::new(|d| {
                edit(d, VAP, PINS_POLICY, |p| {
                    p["spec"]["failurePolicy"] = json!("Ignore")
                })
            }),
        ),
        (
            "ValidatingAdmissionPolicy kbind-grant-pins checks other than this kbind ships (paramKind): apply this version's provider manifests or chart",
            Box::new(|d| {
                edit(d, VAP, PINS_POLICY, |p| {
                    p["spec"]["paramKind"] = json!({"apiVersion": "v1", "kind": "ConfigMap"})
                })
            }),
        ),
        (
            "ValidatingAdmissionPolicyBinding kbind-grant-identities binds \"something-else\", not kbind-grant-identities",
            Box::new(|d| {
                edit(d, VAPB, IDENTITIES_POLICY, |b| {
                    b["spec"]["policyName"] = json!("something-else")
                })
            }),
        ),
        (
            "ValidatingAdmissionPolicyBinding kbind-grant-identities narrows what the policy applies to (matchResources)",
            Box::new(|d| {
                edit(d, VAPB, IDENTITIES_POLICY, |b| {
                    b["spec"]["matchResources"] =
                        json!({"namespaceSelector": {"matchLabels": {"x": "y"}}})
                })
            }),
        ),
        (
            "ValidatingAdmissionPolicyBinding kbind-grant-pins does not take every Grant as a parameter (paramRef.selector: {})",
            Box::new(|d| {
                edit(
                    d,
                    VAPB,
                    PINS_POLICY,
                    |b| {
                        b["spec"]["paramRef"] =
                            json!({"name": "one-grant", "parameterNotFoundAction": "Allow"})
                    },
                )
            }),
        ),
        (
            "ValidatingAdmissionPolicyBinding kbind-grant-pins does not take every Grant as a parameter (paramRef.selector: {})",
            Box::new(|d| {
                edit(d, VAPB, PINS_POLICY, |b| {
                    b["spec"]["paramRef"]["selector"] =
                        json!({"matchLabels": {"nothing": "matches"}})
                })
            }),
        ),
    ];
    let differs = |fields: &str| {
        format!(
            "ValidatingAdmissionPolicy kbind-grant-identities checks other than this kbind ships ({fields}): apply this version's provider manifests or chart"
        )
    };
    let more: Vec<(String, Change)> = vec![
        (
            differs("validations"),
            Box::new(|d| {
                edit(d, VAP, IDENTITIES_POLICY, |p| {
                    p["spec"]["validations"][1]["expression"] = json!("true")
                })
            }),
        ),
        (
            differs("matchConditions"),
            Box::new(|d| {
                edit(d, VAP, IDENTITIES_POLICY, |p| {
                    p["spec"]["matchConditions"]
                        .as_array_mut()
                        .unwrap()
                        .push(json!({"name": "never", "expression": "false"}))
                })
            }),
        ),
        (
            differs("matchConstraints"),
            Box::new(|d| {
                edit(d, VAP, IDENTITIES_POLICY, |p| {
                    p["spec"]["matchConstraints"]["namespaceSelector"] =
                        json!({"matchLabels": {"x": "y"}})
                })
            }),
        ),
        (
            differs("matchConstraints, variables"),
            Box::new(|d| {
                edit(d, VAP, IDENTITIES_POLICY, |p| {
                    p["spec"]["matchConstraints"]["resourceRules"][0]["resources"] =
                        json!(["configmaps"]);
                    p["spec"]["variables"][0]["expression"] = json!("'x'");
                })
            }),
        ),
    ];
    for (want, change) in more {
        assert_eq!(gaps_after(change), vec![want.clone()], "{want}");
    }
    for (want, change) in cases {
        assert_eq!(gaps_after(change), vec![want.to_string()], "{want}");
    }
}
