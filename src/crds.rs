//! `kbind crds`: every CRD kbind's passes read or write, generated from the Rust types so the
//! checked-in manifests cannot drift from the code (a test compares them).

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::CustomResourceExt;

use crate::api::{catalog, core, iam, kcp, providers, relsync};

/// The CRDs a kbind installation owns, in `deploy/crds/` order.
pub fn kbind_crds() -> Vec<CustomResourceDefinition> {
    vec![
        core::Connection::crd(),
        core::ClusterBinding::crd(),
        core::Binding::crd(),
        providers::CatalogEntry::crd(),
        providers::Grant::crd(),
        relsync::RelationshipSource::crd(),
        relsync::AgentIdentity::crd(),
        catalog::Export::crd(),
        catalog::Collection::crd(),
        iam::Grant::crd(),
    ]
}

/// The kcp CRDs kbind reads and writes, for plain-apiserver installs and tests (kcp serves
/// these itself).
pub fn kcp_crds() -> Vec<CustomResourceDefinition> {
    vec![
        kcp::APIBinding::crd(),
        kcp::APIExport::crd(),
        kcp::APIExportEndpointSlice::crd(),
        kcp::LogicalCluster::crd(),
    ]
}

/// `kbind crds [--kcp]`: print them; returns the exit code.
pub fn print(kcp: bool) -> i32 {
    let crds = if kcp { kcp_crds() } else { kbind_crds() };
    match to_yaml(&crds) {
        Ok(y) => {
            use std::io::Write;
            // A closed pipe (`| head`) is not an error worth a panic.
            let _ = std::io::stdout().write_all(y.as_bytes());
            0
        }
        Err(e) => {
            crate::logging::print_error("crds", &e);
            1
        }
    }
}

/// Render CRDs as one multi-document YAML stream.
pub fn to_yaml(crds: &[CustomResourceDefinition]) -> Result<String, serde_saphyr::ser::Error> {
    let mut out = String::new();
    for crd in crds {
        out.push_str("---\n");
        out.push_str(&serde_saphyr::to_string(crd)?);
    }
    Ok(out)
}
