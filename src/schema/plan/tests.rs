use super::*;
use crate::api::core::{ExportedApi, SchemaPolicy};
use crate::discovery::crdpull::Export;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinitionSpec;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use k8s_openapi::jiff::Timestamp;

fn export(name: &str, scope: &str, hash: &str) -> Export {
    Export {
        api: ExportedApi {
            name: name.into(),
            scope: scope.into(),
            version: "v1".into(),
            schema_hash: hash.into(),
        },
        crd: crate::discovery::crdpull::CrdJson::of(
            &k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition {
                metadata: kube::api::ObjectMeta {
                    name: Some(name.into()),
                    ..Default::default()
                },
                spec: CustomResourceDefinitionSpec::default(),
                status: None,
            },
        ),
        webhook_conversion: false,
    }
}

fn binding(ns: Option<&str>, name: &str, conn: &str, apis: &[&str]) -> BindingView {
    BindingView {
        key: BindingKey {
            namespace: ns.map(String::from),
            name: name.into(),
        },
        connection: conn.into(),
        apis: apis.iter().map(|s| s.to_string()).collect(),
        ..Default::default()
    }
}

fn meta(managed: bool, conn: Option<&str>, hash: Option<&str>) -> CrdMeta {
    CrdMeta {
        uid: "uid".into(),
        managed,
        connection: conn.map(String::from),
        schema_hash: hash.map(String::from),
        created: managed && hash.is_some(),
        deleting: false,
    }
}

struct Case {
    policy: SchemaPolicy,
    source: SchemaSource,
    exports: Vec<Export>,
    bindings: Vec<BindingView>,
    crds: BTreeMap<String, CrdMeta>,
    status: ConnectionStatus,
    remote: Option<Result<String, IdentityError>>,
    /// Discovery failed this way instead of finding `exports`.
    discovery_error: Option<DiscoveryError>,
    /// Consumer CRDs of the autoBind binding found holding objects.
    holding: BTreeMap<String, Holding>,
    /// The Connection's labels.
    labels: BTreeMap<String, String>,
}

impl Default for Case {
    fn default() -> Self {
        Self {
            policy: SchemaPolicy::default(),
            source: SchemaSource::Crd,
            exports: vec![
                export("a.x.io", "Namespaced", "h1"),
                export("b.x.io", "Cluster", "h2"),
            ],
            bindings: vec![],
            crds: BTreeMap::new(),
            status: ConnectionStatus::default(),
            remote: Some(Ok("remote".into())),
            discovery_error: None,
            holding: BTreeMap::new(),
            labels: BTreeMap::new(),
        }
    }
}

impl Case {
    fn observed(&self) -> Observed<'_> {
        Observed {
            name: "c",
            labels: &self.labels,
            generation: Some(1),
            policy: &self.policy,
            status: &self.status,
            credentials: Ok(()),
            refresh: None,
            remote_uid: self.remote.clone(),
            local_uid: "local",
            discovery: Some(match &self.discovery_error {
                Some(e) => Err(e.clone()),
                None => Ok(Discovered {
                    source: self.source,
                    exports: self.exports.clone(),
                    skipped: vec![],
                }),
            }),
            bindings: &self.bindings,
            consumer_crds: &self.crds,
            holding: self.holding.clone(),
        }
    }
    fn actions(&self) -> Vec<String> {
        plan_crds(&self.observed())
            .iter()
            .map(|a| match a {
                CrdAction::Create(_) => format!("create {}", a.name()),
                CrdAction::Update(_) => format!("update {}", a.name()),
                CrdAction::Stamp { .. } => format!("stamp {}", a.name()),
            })
            .collect()
    }
}

fn policy(pull: PullPolicy, update: UpdatePolicy) -> SchemaPolicy {
    SchemaPolicy {
        source: SchemaSource::Auto,
        pull_policy: pull,
        update_policy: update,
    }
}

/// Discovery failing with HTTP `code` from the provider.
pub(super) fn discovery_failed(code: u16) -> DiscoveryError {
    DiscoveryError::Kube {
        what: "listing exported provider CRDs".into(),
        source: std::sync::Arc::new(kube::Error::Api(
            match code {
                403 => kube::core::Status::failure(
                    "customresourcedefinitions.apiextensions.k8s.io is forbidden",
                    "Forbidden",
                ),
                _ => kube::core::Status::failure("etcd unavailable", "InternalError"),
            }
            .with_code(code)
            .boxed(),
        )),
    }
}

#[test]
fn install_table() {
    let bound_a = vec![binding(None, "cb", "c", &["a.x.io"])];
    let cases: Vec<(&str, Case, Vec<&str>)> = vec![
        (
            "Bound installs only bound",
            Case {
                bindings: bound_a.clone(),
                ..Default::default()
            },
            vec!["create a.x.io"],
        ),
        (
            "Bound ignores other Connections' bindings",
            Case {
                bindings: vec![binding(None, "cb", "other", &["a.x.io"])],
                ..Default::default()
            },
            vec![],
        ),
        (
            "All installs every export",
            Case {
                policy: policy(PullPolicy::All, UpdatePolicy::Always),
                ..Default::default()
            },
            vec!["create a.x.io", "create b.x.io"],
        ),
        (
            "None never creates",
            Case {
                policy: policy(PullPolicy::None, UpdatePolicy::Always),
                bindings: bound_a.clone(),
                ..Default::default()
            },
            vec![],
        ),
        (
            "None + CRD stamps an unmarked CRD a binding lists",
            Case {
                policy: policy(PullPolicy::None, UpdatePolicy::Always),
                bindings: bound_a.clone(),
                crds: BTreeMap::from([
                    ("a.x.io".into(), meta(false, None, None)),
                    ("b.x.io".into(), meta(false, None, None)),
                ]),
                ..Default::default()
            },
            vec!["stamp a.x.io"],
        ),
        (
            "None stamps nothing no binding lists",
            Case {
                policy: policy(PullPolicy::None, UpdatePolicy::Always),
                bindings: vec![binding(None, "cb", "other", &["a.x.io"])],
                crds: BTreeMap::from([("a.x.io".into(), meta(false, None, None))]),
                ..Default::default()
            },
            vec![],
        ),
        (
            "None never updates a CRD it stamped, whatever the provider's schema",
            Case {
                policy: policy(PullPolicy::None, UpdatePolicy::Always),
                bindings: bound_a.clone(),
                crds: BTreeMap::from([("a.x.io".into(), meta(true, Some("c"), None))]),
                ..Default::default()
            },
            vec![],
        ),
        (
            "None + OpenAPI only reads",
            Case {
                policy: policy(PullPolicy::None, UpdatePolicy::Always),
                source: SchemaSource::OpenApi,
                crds: BTreeMap::from([("a.x.io".into(), meta(false, None, None))]),
                ..Default::default()
            },
            vec![],
        ),
        (
            "Always updates drift",
            Case {
                bindings: bound_a.clone(),
                crds: BTreeMap::from([("a.x.io".into(), meta(true, Some("c"), Some("old")))]),
                ..Default::default()
            },
            vec!["update a.x.io"],
        ),
        (
            "Always + OpenAPI + Bound updates too (deviation)",
            Case {
                source: SchemaSource::OpenApi,
                bindings: bound_a.clone(),
                crds: BTreeMap::from([("a.x.io".into(), meta(true, Some("c"), Some("old")))]),
                ..Default::default()
            },
            vec!["update a.x.io"],
        ),
        (
            "in sync: nothing",
            Case {
                bindings: bound_a.clone(),
                crds: BTreeMap::from([("a.x.io".into(), meta(true, Some("c"), Some("h1")))]),
                ..Default::default()
            },
            vec![],
        ),
        (
            "Once pins",
            Case {
                policy: policy(PullPolicy::Bound, UpdatePolicy::Once),
                bindings: bound_a.clone(),
                crds: BTreeMap::from([("a.x.io".into(), meta(true, Some("c"), Some("old")))]),
                ..Default::default()
            },
            vec![],
        ),
        (
            "unmarked under Bound is foreign",
            Case {
                bindings: bound_a.clone(),
                crds: BTreeMap::from([("a.x.io".into(), meta(false, None, None))]),
                ..Default::default()
            },
            vec![],
        ),
        (
            "another Connection's is foreign",
            Case {
                bindings: bound_a.clone(),
                crds: BTreeMap::from([("a.x.io".into(), meta(true, Some("d"), Some("old")))]),
                ..Default::default()
            },
            vec![],
        ),
        (
            "deleting CRD waits",
            Case {
                bindings: bound_a.clone(),
                crds: BTreeMap::from([(
                    "a.x.io".into(),
                    CrdMeta {
                        deleting: true,
                        ..meta(true, Some("c"), Some("old"))
                    },
                )]),
                ..Default::default()
            },
            vec![],
        ),
        (
            "namespaced Binding cannot pull a cluster-scoped API",
            Case {
                bindings: vec![binding(Some("ns"), "b", "c", &["b.x.io"])],
                ..Default::default()
            },
            vec![],
        ),
        (
            "identity changed: nothing",
            Case {
                bindings: bound_a.clone(),
                status: ConnectionStatus {
                    remote_cluster_uid: Some("pinned".into()),
                    ..Default::default()
                },
                ..Default::default()
            },
            vec![],
        ),
        (
            "identity unreadable: nothing",
            Case {
                bindings: bound_a,
                remote: Some(Err(IdentityError::Forbidden(std::sync::Arc::new(
                    kube::Error::Api(Box::new(kube::core::Status {
                        code: 403,
                        message: "no".into(),
                        ..Default::default()
                    })),
                )))),
                ..Default::default()
            },
            vec![],
        ),
    ];
    for (what, case, want) in cases {
        assert_eq!(case.actions(), want, "{what}");
    }
}

/// Only a CRD kbind creates carries `core.kbind.io/created`; an update keeps the record exactly
/// as observed (a CRD created before the record existed, or stamped, never gains it).
#[test]
fn the_creation_record_is_written_only_at_creation() {
    let created = |a: &CrdAction| match a {
        CrdAction::Create(c) | CrdAction::Update(c) => {
            c.annotations.get(crate::api::keys::CREATED).cloned()
        }
        CrdAction::Stamp { .. } => None,
    };
    let bound = vec![binding(None, "cb", "c", &["a.x.io"])];
    let case = Case {
        bindings: bound.clone(),
        ..Default::default()
    };
    let actions = plan_crds(&case.observed());
    assert_eq!(created(&actions[0]).as_deref(), Some("true"), "create");
    let after = crds_after(&case.observed(), &actions, &[CrdOutcome::Done]);
    assert!(after["a.x.io"].created, "a created CRD is known as created");
    for (was_created, want) in [(true, Some("true")), (false, None)] {
        let case = Case {
            bindings: bound.clone(),
            crds: BTreeMap::from([(
                "a.x.io".into(),
                CrdMeta {
                    created: was_created,
                    ..meta(true, Some("c"), Some("old"))
                },
            )]),
            ..Default::default()
        };
        let actions = plan_crds(&case.observed());
        assert!(matches!(actions[0], CrdAction::Update(_)));
        assert_eq!(
            created(&actions[0]).as_deref(),
            want,
            "update of {was_created}"
        );
        let after = crds_after(&case.observed(), &actions, &[CrdOutcome::Done]);
        assert_eq!(after["a.x.io"].created, was_created);
    }
}

/// autoBind: the binding it keeps, and when it may delete it.
mod autobind;
/// The statuses plan_status records: the Connection's and its bindings' conditions.
mod conditions;
