//! Flags of `kbind bind` (the flags every command takes are in src/pass/args.rs).

use std::path::PathBuf;

use crate::connection::KubeconfigField;

#[derive(Debug, Clone, clap::Args)]
#[command(group(clap::ArgGroup::new("what").args(["export", "apis"]).multiple(false)))]
pub struct BindArgs {
    /// The provider kubeconfig to bind with (e.g. a Grant's issued kubeconfig). It must pass the
    /// rules `kbind schema` applies to a Connection's Secret: self-contained, no proxy-url,
    /// insecure-skip-tls-verify, http:// server or impersonation (docs/schema.md "Credentials").
    #[arg(long, value_name = "FILE")]
    pub provider_kubeconfig: PathBuf,
    /// Name of the Connection, of its Secret (in --credential-namespace) and of the
    /// ClusterBinding (or Binding).
    #[arg(long)]
    pub name: String,
    /// Bind the APIs of this provider Export (`catalog.kbind.io/v1alpha1`, its spec.apis),
    /// read on the provider with the given kubeconfig.
    #[arg(long, value_name = "EXPORT")]
    pub export: Option<String>,
    /// Bind these APIs (`<plural>.<group>`, comma-separated or repeated). Each must be
    /// exported by the provider. Without --apis or --export the command lists what the provider
    /// exports and exits 2.
    #[arg(long, value_delimiter = ',', value_name = "API")]
    pub apis: Vec<String>,
    /// Write a Binding in this namespace (namespaced APIs only) instead of a ClusterBinding.
    #[arg(long, short = 'n')]
    pub namespace: Option<String>,
    /// Namespace of the consumer Secret: one of `kbind schema`'s and `kbind resync`'s
    /// --credential-namespace. Default: the install namespace, as theirs ($POD_NAMESPACE in a
    /// Pod, else kbind-system).
    #[arg(long, default_value_t = crate::pass::args::install_namespace())]
    pub credential_namespace: String,
    /// Re-allow a kubeconfig field refused by default (repeatable), as the passes'
    /// --allow-kubeconfig-field; they must re-allow it too.
    #[arg(long = "allow-kubeconfig-field", value_enum)]
    pub allow_kubeconfig_fields: Vec<KubeconfigField>,
    /// `<namespace>/<name>` of the Grant's issued Secret on the provider (the Grant's
    /// status.secretRef). Recorded as annotation core.kbind.io/grant-secret on the consumer
    /// Secret, so `kbind schema` pulls each re-issued kubeconfig from it; its
    /// iam.kbind.io/grant and iam.kbind.io/expires-at annotations are copied. The kubeconfig must
    /// be allowed to read it. Default: the Secret a kubeconfig issued by `kbind issue` names in
    /// its context's iam.kbind.io/grant extension (none for any other kubeconfig).
    #[arg(long, value_name = "NAMESPACE/NAME")]
    pub grant_secret: Option<String>,
    /// A label `KEY=VALUE` put on every object written (repeatable), e.g. to select the
    /// Connection with `kbind schema --selector`.
    #[arg(long = "label", short = 'l', value_name = "KEY=VALUE")]
    pub labels: Vec<String>,
    /// Overwrite a Secret, Connection or binding of that name that `kbind bind` did not write.
    #[arg(long)]
    pub force: bool,
    /// With --dry-run: print the Secret with its data (the provider credential) instead of a
    /// redacted placeholder.
    #[arg(long)]
    pub include_secret: bool,
}
