use super::*;
use crate::api::catalog::{ClusterScopedAccess, ExportApi, ExportRef};
use crate::issue::args::Confinement;
use crate::issue::render::Desired;
use k8s_openapi::api::rbac::v1::PolicyRule;

/// The Grant of every plan here, with the UID the apiserver gave it.
const G: GrantRef<'static> = GrantRef {
    name: "g",
    uid: "0b5e4c6a-grant-uid",
    created: None,
};

fn t(s: i64) -> Timestamp {
    Timestamp::from_second(s).unwrap()
}

fn api(name: &str) -> ResolvedApi {
    let (plural, group) = name.split_once('.').unwrap();
    ResolvedApi {
        name: name.into(),
        group: group.into(),
        plural: plural.into(),
        namespaced: !plural.starts_with("cluster"),
        version: "v1".into(),
    }
}

/// Plan `s` as the only Grant, on a provider with no namespaces yet.
fn plan_alone(
    s: &GrantSpec,
    pin: Option<&str>,
    cat: &Catalog,
    issued: &Issued,
    c: &Config,
) -> Result<GrantPlan, Blocked> {
    let tenancy = tenancy(
        &[GrantView {
            name: "g",
            created: None,
            spec: s,
        }],
        cat,
    );
    let p = Provider {
        catalog: cat,
        tenancy: &tenancy,
        namespaces: &BTreeSet::new(),
        in_use: &BTreeMap::new(),
        handover: &BTreeMap::new(),
        cfg: c,
    };
    plan_grant(G, s, pin, None, issued, &BTreeMap::new(), &p)
}

fn catalog() -> Catalog {
    let mut c = Catalog::default();
    for n in ["widgets.example.org", "gadgets.example.org"] {
        c.exported.insert(n.into(), api(n));
    }
    let export = |apis: &[&str], permissions: Vec<PolicyRule>| ExportSpec {
        description: String::new(),
        apis: apis
            .iter()
            .map(|a| ExportApi {
                name: a.to_string(),
            })
            .collect(),
        permissions,
        cluster_scoped_access: ClusterScopedAccess::Exclusive,
    };
    let cm = PolicyRule {
        api_groups: Some(vec![String::new()]),
        resources: Some(vec!["configmaps".into()]),
        verbs: vec!["get".into()],
        ..Default::default()
    };
    c.exports.insert(
        "widgets".into(),
        export(&["widgets.example.org"], vec![cm.clone()]),
    );
    c.exports.insert(
        "both".into(),
        export(&["gadgets.example.org", "widgets.example.org"], vec![cm]),
    );
    c.exports
        .insert("broken".into(), export(&["nothere.example.org"], vec![]));
    c.collections.insert(
        "all".into(),
        CollectionSpec {
            description: String::new(),
            exports: vec![
                ExportRef {
                    name: "widgets".into(),
                },
                ExportRef {
                    name: "both".into(),
                },
            ],
        },
    );
    c
}

fn spec(export: Option<&str>, collection: Option<&str>) -> GrantSpec {
    GrantSpec {
        export: export.map(Into::into),
        collection: collection.map(Into::into),
        consumer: "team-a".into(),
        token_ttl: "24h".into(),
        namespaces: vec!["team-a".into()],
    }
}

fn cfg(now: i64) -> Config {
    Config {
        namespace: "kbind-grants".into(),
        server: "https://provider.example:6443".into(),
        ca_pem: b"-----BEGIN CERTIFICATE-----\nx\n-----END CERTIFICATE-----\n".to_vec(),
        reissue_before: None,
        now: t(now),
        confinement: Confinement::PerGrant,
    }
}

fn issued_with_secret(c: &Config, token: &str, expires: i64) -> Issued {
    Issued {
        sa_uid: Some("sa-1".into()),
        secret: Some(SecretObs {
            expires_at: Some(t(expires)),
            sa_uid: "sa-1".into(),
            token: Some(token.into()),
            kubeconfig: Some(render::kubeconfig(
                &c.server,
                &c.ca_pem,
                token,
                &c.namespace,
                "g",
            )),
        }),
        ..Default::default()
    }
}

mod namespaces;
mod pin;
mod resolve_and_tokens;
mod rules;
