//! A pass identity built from a `deploy/components/<role>/<pass>-rbac.yaml` file: its ServiceAccount, its
//! ClusterRole (minus what a test takes away) under a unique name with a binding, and its Roles
//! (the Lease, and where the file has one, the credential Secrets) in the test's namespace,
//! which stands for the install namespace. The "missing rule" tests use it to show each rule is needed, and
//! that kbind names the missing permission.

use std::path::PathBuf;

use k8s_openapi::api::admissionregistration::v1::{
    ValidatingAdmissionPolicy, ValidatingAdmissionPolicyBinding,
};
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding, Role, RoleBinding};
use kube::Api;
use kube::api::PostParams;
use serde_json::{Value, json};

/// What to take away from the file's ClusterRole.
#[derive(Clone, Copy, Debug)]
pub enum Without<'a> {
    Nothing,
    /// Every rule's access to this resource.
    Resource(&'a str),
    /// One verb on one resource.
    Verb {
        resource: &'a str,
        verb: &'a str,
    },
}

/// The documents of a repository YAML file.
pub fn rbac_documents(file: &str) -> Vec<Value> {
    let path = format!("{}/{file}", env!("CARGO_MANIFEST_DIR"));
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("read {file}: {e}"));
    serde_saphyr::from_multiple::<Value>(&text)
        .unwrap_or_else(|e| panic!("parse {file}: {e}"))
        .into_iter()
        .filter(|d| !d.is_null())
        .collect()
}

fn grants(roles: &[&mut Value]) -> usize {
    roles
        .iter()
        .flat_map(|r| r["rules"].as_array().cloned().unwrap_or_default())
        .map(|r| {
            r["resources"].as_array().map_or(0, Vec::len)
                * r["verbs"].as_array().map_or(0, Vec::len)
        })
        .sum()
}

/// Take `without` away from every role of the file (ClusterRole and Roles alike).
fn take_away(roles: &mut [&mut Value], without: Without<'_>, file: &str) {
    let before = grants(roles);
    if let Without::Nothing = without {
        return;
    }
    for role in roles.iter_mut() {
        let Some(rules) = role["rules"].as_array_mut() else {
            continue;
        };
        match without {
            Without::Nothing => {}
            Without::Resource(resource) => {
                for rule in rules.iter_mut() {
                    if let Some(resources) = rule["resources"].as_array_mut() {
                        resources.retain(|r| r != resource);
                    }
                }
            }
            Without::Verb { resource, verb } => {
                for rule in rules.iter_mut() {
                    let on = rule["resources"]
                        .as_array()
                        .is_some_and(|r| r.iter().any(|r| r == resource));
                    if on && let Some(verbs) = rule["verbs"].as_array_mut() {
                        verbs.retain(|v| v != verb);
                    }
                }
            }
        }
        rules.retain(|r| {
            r["resources"].as_array().is_some_and(|r| !r.is_empty())
                && r["verbs"].as_array().is_some_and(|v| !v.is_empty())
        });
    }
    assert!(
        grants(roles) < before,
        "{file} grants nothing like {without:?}"
    );
}

/// A pass identity; [`PassIdentity::remove`] deletes its cluster-scoped objects.
pub struct PassIdentity {
    /// A kubeconfig file for the ServiceAccount (a fresh token).
    pub kubeconfig: PathBuf,
    client: kube::Client,
    cluster_role: String,
    /// The file's admission policies, made to match this identity (same names as the role).
    pub policies: Vec<String>,
}

impl PassIdentity {
    pub fn kubeconfig(&self) -> String {
        self.kubeconfig.to_string_lossy().to_string()
    }

    /// Delete the ClusterRole and its binding, and the policies (namespaced objects go with the
    /// namespace).
    pub async fn remove(&self) {
        let dp = kube::api::DeleteParams::default();
        for name in &self.policies {
            let _ = Api::<ValidatingAdmissionPolicyBinding>::all(self.client.clone())
                .delete(name, &dp)
                .await;
            let _ = Api::<ValidatingAdmissionPolicy>::all(self.client.clone())
                .delete(name, &dp)
                .await;
        }
        let _ = Api::<ClusterRoleBinding>::all(self.client.clone())
            .delete(&self.cluster_role, &dp)
            .await;
        let _ = Api::<ClusterRole>::all(self.client.clone())
            .delete(&self.cluster_role, &dp)
            .await;
        let _ = std::fs::remove_file(&self.kubeconfig);
    }
}

/// Create the identity of `file`'s pass in namespace `ns` of the cluster behind
/// `admin_kubeconfig`, minus `without`.
pub async fn pass_identity(
    admin_kubeconfig: &PathBuf,
    file: &str,
    ns: &str,
    without: Without<'_>,
) -> PassIdentity {
    let client = super::client(admin_kubeconfig).await;
    let docs = rbac_documents(file);
    let find = |kind: &str, name: Option<&str>| -> Value {
        docs.iter()
            .find(|d| d["kind"] == kind && name.is_none_or(|n| d["metadata"]["name"] == n))
            .cloned()
            .unwrap_or_else(|| panic!("no {kind} in {file}"))
    };
    let sa = find("ServiceAccount", None)["metadata"]["name"]
        .as_str()
        .expect("ServiceAccount name")
        .to_string();
    let subject = json!([{"kind": "ServiceAccount", "name": sa, "namespace": ns}]);
    let kubeconfig = super::service_account_kubeconfig(admin_kubeconfig, ns, &sa).await;

    let name = super::unique(&sa);
    let mut role = find("ClusterRole", Some(&sa));
    role["metadata"] = json!({"name": name});
    let mut roles: Vec<Value> = docs
        .iter()
        .filter(|d| d["kind"] == "Role")
        .cloned()
        .collect();
    {
        let mut all: Vec<&mut Value> = std::iter::once(&mut role).chain(roles.iter_mut()).collect();
        take_away(&mut all, without, file);
    }
    let role: ClusterRole = serde_json::from_value(role).expect("ClusterRole");
    Api::<ClusterRole>::all(client.clone())
        .create(&PostParams::default(), &role)
        .await
        .expect("create ClusterRole");
    let crb: ClusterRoleBinding = serde_json::from_value(json!({"metadata": {"name": name},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": name},
        "subjects": subject}))
    .expect("ClusterRoleBinding");
    Api::<ClusterRoleBinding>::all(client.clone())
        .create(&PostParams::default(), &crb)
        .await
        .expect("create ClusterRoleBinding");

    // Every Role of the file, in the test's namespace (it holds the Lease and the Secrets).
    for mut r in roles {
        let role_name = r["metadata"]["name"].clone();
        r["metadata"] = json!({"name": role_name, "namespace": ns});
        let r: Role = serde_json::from_value(r).expect("Role");
        Api::<Role>::namespaced(client.clone(), ns)
            .create(&PostParams::default(), &r)
            .await
            .expect("create Role");
        let rb: RoleBinding = serde_json::from_value(json!({
            "metadata": {"name": role_name, "namespace": ns},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": role_name},
            "subjects": subject}))
        .expect("RoleBinding");
        Api::<RoleBinding>::namespaced(client.clone(), ns)
            .create(&PostParams::default(), &rb)
            .await
            .expect("create RoleBinding");
    }
    let policies = confine(&client, &docs, ns, &sa).await;
    PassIdentity {
        kubeconfig: super::temp_file("pass-identity", &kubeconfig),
        client,
        cluster_role: name,
        policies,
    }
}

/// The file's ValidatingAdmissionPolicies naming the pass's identity (and bindings), as shipped but matching the
/// identity in `ns` rather than the one in kbind-system, under names of their own: the pass
/// runs confined as it would be installed. Returns their names.
async fn confine(client: &kube::Client, docs: &[Value], ns: &str, sa: &str) -> Vec<String> {
    let shipped = format!("system:serviceaccount:kbind-system:{sa}");
    let mine = format!("system:serviceaccount:{ns}:{sa}");
    let mut names = Vec::new();
    // The policies naming the pass's identity; the ones confining issued identities match no
    // pass and are installed as shipped (`super::grant_policies`).
    for d in docs.iter().filter(|d| {
        d["kind"] == "ValidatingAdmissionPolicy" && d["spec"].to_string().contains(&shipped)
    }) {
        let name = super::unique(d["metadata"]["name"].as_str().expect("policy name"));
        let text = d["spec"].to_string();
        let spec: Value = serde_json::from_str(&text.replace(&shipped, &mine)).expect("spec");
        let policy: ValidatingAdmissionPolicy =
            serde_json::from_value(json!({"metadata": {"name": name}, "spec": spec}))
                .expect("ValidatingAdmissionPolicy");
        Api::<ValidatingAdmissionPolicy>::all(client.clone())
            .create(&PostParams::default(), &policy)
            .await
            .expect("create ValidatingAdmissionPolicy");
        let binding: ValidatingAdmissionPolicyBinding = serde_json::from_value(json!({
            "metadata": {"name": name},
            "spec": {"policyName": name, "validationActions": ["Deny"]}}))
        .expect("ValidatingAdmissionPolicyBinding");
        Api::<ValidatingAdmissionPolicyBinding>::all(client.clone())
            .create(&PostParams::default(), &binding)
            .await
            .expect("create ValidatingAdmissionPolicyBinding");
        names.push(name);
    }
    names
}
