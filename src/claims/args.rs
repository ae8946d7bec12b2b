//! Flags of `kbind claims`: where the hub's core export and binding are, and where consent is
//! recorded. The names are configuration, never built in.

use crate::pass::PassError;

use super::hub::SlimBinding;

#[derive(Debug, Clone, clap::Args)]
pub struct ClaimsArgs {
    /// Only CatalogEntries matching this label selector (e.g. `tier=platform`), for one-off runs
    /// in a maintenance window. Core bindings are still reconciled.
    #[arg(long, short = 'l')]
    pub selector: Option<String>,
    #[command(flatten)]
    pub hub: HubArgs,
    #[command(flatten)]
    pub write: crate::pass::concurrency::WriteConcurrencyArgs,
    #[command(subcommand)]
    pub command: Option<ClaimsCommand>,
}

#[derive(Debug, Clone, clap::Subcommand)]
pub enum ClaimsCommand {
    /// Print the APIExport permission claims a CatalogEntry's requirements call for (YAML, ready
    /// for `kubectl apply --server-side`), from the same function that computes bindings' claims.
    Export {
        /// The CatalogEntry.
        entry: String,
        #[command(flatten)]
        hub: HubArgs,
    },
}

#[derive(Debug, Clone, Default, clap::Args)]
pub struct HubArgs {
    /// Name of the hub's core APIExport (e.g. core.example.io). Its virtual workspace is where
    /// bindings are read; required on kcp.
    #[arg(long)]
    pub core_export: Option<String>,
    /// Workspace path of the core APIExport (e.g. root:hub).
    #[arg(long, default_value = "")]
    pub core_export_path: String,
    /// Name of the core APIBinding every tenant workspace holds (e.g. core). Only workspaces
    /// holding it are in scope.
    #[arg(long)]
    pub core_binding: Option<String>,
    /// APIExportEndpointSlice of the core export (default: the core export's name).
    #[arg(long)]
    pub core_endpoint_slice: Option<String>,
    /// Namespace on the hub holding Grants (workspaces' consent to compositions). Without it no
    /// composition is ever accepted.
    #[arg(long)]
    pub grant_namespace: Option<String>,
    /// A plain API server with kbind's kcp CRDs: no `/clusters` paths; a binding's workspace is
    /// its `kcp.io/cluster` annotation.
    #[arg(long)]
    pub single_cluster: bool,
    /// With --single-cluster: the workspace name of bindings without a `kcp.io/cluster`
    /// annotation (what Grants name).
    #[arg(long, default_value = "")]
    pub cluster_name: String,
}

/// The hub's own export and binding.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Core {
    pub export: String,
    pub path: String,
    pub binding: String,
}

impl Core {
    /// The hub's binding to its core export in some workspace.
    pub fn is_core_binding(&self, b: &SlimBinding) -> bool {
        b.name == self.binding
            && b.export.name == self.export
            && (b.export.path.is_empty() || b.export.path == self.path)
    }
}

impl HubArgs {
    /// The core configuration: both names or neither (single-cluster mode may go without).
    pub fn core(&self) -> Result<Option<Core>, PassError> {
        match (&self.core_export, &self.core_binding) {
            (Some(export), Some(binding)) if !export.is_empty() && !binding.is_empty() => {
                Ok(Some(Core {
                    export: export.clone(),
                    path: self.core_export_path.clone(),
                    binding: binding.clone(),
                }))
            }
            (None, None) => Ok(None),
            _ => Err(PassError::Config(
                "--core-export and --core-binding go together (both non-empty)".into(),
            )),
        }
    }
}
