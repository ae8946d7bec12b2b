//! Flags of `kbind issue` (docs/issue.md "Flags").

use std::path::PathBuf;
use std::time::Duration;

use crate::pass::args::parse_duration;

/// Where the in-cluster CA lives in every pod.
pub const IN_CLUSTER_CA: &str = "/var/run/secrets/kubernetes.io/serviceaccount/ca.crt";

/// What confines the identities the issuer issues (docs/issue.md "Confinement").
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum Confinement {
    /// The shipped policies `kbind-grant-identities` and `kbind-grant-pins` (the Grants are
    /// their parameters): the issuer writes no admission policy, and issues nothing while they
    /// are missing.
    #[default]
    Shipped,
    /// A ValidatingAdmissionPolicy per Grant, written by the issuer: for providers that cannot
    /// run a policy with parameters (kcp), at the cost of the issuer's right to write, and so
    /// delete, admission policies.
    PerGrant,
}

#[derive(Debug, Clone, clap::Args)]
pub struct IssueArgs {
    /// Namespace holding every issued ServiceAccount and kubeconfig Secret; the issued
    /// kubeconfig's context namespace (the consumer's heartbeat Lease lives there).
    #[arg(long, env = "KBIND_GRANTS_NAMESPACE", default_value = "kbind-grants")]
    pub grants_namespace: String,
    /// The provider API URL consumers reach (https://…): the issued kubeconfig's server.
    /// Required, except with --print-kubeconfig.
    #[arg(
        long,
        env = "KBIND_SERVER_URL",
        required_unless_present = "print_kubeconfig"
    )]
    pub server_url: Option<String>,
    /// PEM file of the CA that signs the provider's serving certificate, embedded in the issued
    /// kubeconfig. Default: the in-cluster CA.
    #[arg(long, default_value = IN_CLUSTER_CA)]
    pub server_ca_file: PathBuf,
    /// Re-issue a token when less than this is left before it expires. Default: a third of the
    /// Grant's tokenTTL.
    #[arg(long, value_parser = parse_duration)]
    pub reissue_before: Option<Duration>,
    /// Only Grants matching this label selector (e.g. `tier=gold`), for one-off runs; Exports
    /// not named by them are left alone, and nothing of a deleted Grant is cleaned up.
    #[arg(long, short = 'l')]
    pub selector: Option<String>,
    /// How often a run sweeps fully (drift repair, what changed elsewhere: an Export, a
    /// namespace let go); a run in between reads only the Grants and heartbeats, and sweeps
    /// fully at once when a Grant is new, changed, deleting, has a token due, or has a
    /// heartbeat or an approval a run can act on (docs/issue.md "Full sweeps"). 0: every run
    /// (the default, so a one-off run does everything); the shipped CronJob runs every minute
    /// with 5m.
    #[arg(long, env = "KBIND_FULL_SWEEP_EVERY", default_value = "0s", value_parser = parse_duration)]
    pub full_sweep_every: Duration,
    /// After its work, keep looking (one LIST of the heartbeat Leases every 2 s) for this long
    /// while an issued Grant waits for its first heartbeat (for less than an hour), and
    /// pin it in this run as soon as one comes (docs/issue.md "Pin window"). Never past
    /// `--deadline`. 0: off (the default, so a one-off run ends when its work does); the shipped
    /// CronJob sets 30s.
    #[arg(long, env = "KBIND_PIN_WINDOW", default_value = "0s", value_parser = parse_duration)]
    pub pin_window: Duration,
    /// What confines the issued identities: the shipped policies, or one the issuer writes per
    /// Grant (for kcp, which cannot run the shipped ones).
    #[arg(long, env = "KBIND_CONFINEMENT", value_enum, default_value_t = Confinement::Shipped)]
    pub confinement: Confinement,
    /// Print the kubeconfig issued for this Grant (for out-of-band hand-over) and exit; writes
    /// nothing and takes no Lease.
    #[arg(long, value_name = "GRANT")]
    pub print_kubeconfig: Option<String>,
}
