//! The one list of kbind's passes and one-off commands, and the command line's subcommands. This
//! module alone may name every pass (a test in tests/layering.rs keeps it so): `main` dispatches
//! through [`run`], `kbind uninstall` and `kbind status` get the descriptors from here, and the
//! deploy, install and RBAC tests read their lists of passes from [`PASSES`]. A new pass is its
//! own folder, one entry here, and its own deploy, job, docs and test files (docs/architecture.md,
//! "Adding a pass").

use clap::Subcommand;

use crate::api::keys;
use crate::pass::CommonArgs;
use crate::pass::descriptor::{Descriptor, Finalized, Finalizer, Kind};

const CORE: &str = "core.kbind.io";
const CONNECTION: Kind = Kind {
    group: CORE,
    kind: "Connection",
};
const CLUSTER_BINDING: Kind = Kind {
    group: CORE,
    kind: "ClusterBinding",
};
const BINDING: Kind = Kind {
    group: CORE,
    kind: "Binding",
};
const SECRET: Kind = Kind {
    group: "",
    kind: "Secret",
};
const CATALOG_ENTRY: Kind = Kind {
    group: "providers.kbind.io",
    kind: "CatalogEntry",
};
const TENANCY_GRANT: Kind = Kind {
    group: "tenancy.kbind.io",
    kind: "Grant",
};
const RELATIONSHIP_SOURCE: Kind = Kind {
    group: "agentprimitives.authzed.com",
    kind: "RelationshipSource",
};
const ISSUED_GRANT: Kind = Kind {
    group: "iam.kbind.io",
    kind: "Grant",
};
const EXPORT: Kind = Kind {
    group: "catalog.kbind.io",
    kind: "Export",
};
const COLLECTION: Kind = Kind {
    group: "catalog.kbind.io",
    kind: "Collection",
};

const fn cleanup(kind: Kind) -> Finalizer {
    Finalizer {
        name: keys::CLEANUP_FINALIZER,
        on: Finalized::Kind(kind),
    }
}

/// Namespace of the consumer, hub and provider passes' Jobs (and so their Leases).
pub const INSTALL_NAMESPACE: &str = "kbind-system";

pub const SCHEMA: Descriptor = Descriptor {
    name: crate::schema::PASS,
    takes_lease: true,
    role: "consumer",
    namespace: INSTALL_NAMESPACE,
    finalizers: &[
        cleanup(BINDING),
        cleanup(CLUSTER_BINDING),
        cleanup(CONNECTION),
        cleanup(SECRET),
    ],
    shows: &[CONNECTION, CLUSTER_BINDING, BINDING],
    jobs: &["cronjob.yaml", "oneoff-job.yaml"],
};

pub const RESYNC: Descriptor = Descriptor {
    name: crate::resync::PASS,
    takes_lease: true,
    role: "consumer",
    namespace: INSTALL_NAMESPACE,
    finalizers: &[Finalizer {
        name: keys::SYNCER_FINALIZER,
        on: Finalized::ManagedKinds,
    }],
    shows: &[CLUSTER_BINDING, BINDING],
    jobs: &["cronjob.yaml", "indexed-job.yaml"],
};

pub const CLAIMS: Descriptor = Descriptor {
    name: crate::claims::PASS,
    takes_lease: true,
    role: "hub",
    namespace: INSTALL_NAMESPACE,
    finalizers: &[],
    shows: &[CATALOG_ENTRY, TENANCY_GRANT],
    jobs: &["cronjob.yaml"],
};

pub const RELSYNC: Descriptor = Descriptor {
    name: crate::relsync::PASS,
    takes_lease: true,
    role: "directory",
    namespace: "kbind-relsync",
    finalizers: &[Finalizer {
        name: crate::api::relsync::CLEANUP_FINALIZER,
        on: Finalized::Kind(RELATIONSHIP_SOURCE),
    }],
    shows: &[RELATIONSHIP_SOURCE],
    jobs: &["cronjob.yaml"],
};

pub const ISSUE: Descriptor = Descriptor {
    name: crate::issue::PASS,
    takes_lease: true,
    role: "provider",
    namespace: INSTALL_NAMESPACE,
    finalizers: &[Finalizer {
        name: crate::api::iam::REVOKE_FINALIZER,
        on: Finalized::Kind(ISSUED_GRANT),
    }],
    shows: &[EXPORT, COLLECTION, ISSUED_GRANT],
    jobs: &["cronjob.yaml"],
};

/// `kbind bind`, run once on the consumer (a one-off Job or a terminal): no Lease, no CronJob.
pub const BIND: Descriptor = Descriptor {
    name: crate::bind::COMMAND,
    takes_lease: false,
    role: "consumer",
    namespace: INSTALL_NAMESPACE,
    finalizers: &[],
    shows: &[],
    jobs: &["oneoff-job.yaml"],
};

/// Every pass, in the order the docs and `kbind uninstall` list them.
pub const PASSES: &[Descriptor] = &[SCHEMA, RESYNC, CLAIMS, RELSYNC, ISSUE];

/// Every command that runs as a Job: the passes and the one-off commands.
pub const JOBS: &[Descriptor] = &[SCHEMA, RESYNC, CLAIMS, RELSYNC, ISSUE, BIND];

/// The pass or one-off command named `name`.
pub fn find(name: &str) -> Option<&'static Descriptor> {
    JOBS.iter().find(|d| d.name == name)
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// One pass over every Connection: credentials, cluster identity, exported-API discovery,
    /// consumer CRD install per pullPolicy/updatePolicy, the setup side of bindings, autoBind
    /// and teardown. --max-items bounds the Connections handled in one run.
    Schema(crate::schema::args::SchemaArgs),
    /// One pass over every bound API: consumer spec up to the provider, provider status down,
    /// conflicts, deletion and the heartbeat; per-API counts recorded on the bindings.
    /// --max-items bounds instance writes in one run.
    Resync(crate::resync::args::ResyncArgs),
    /// One pass over every CatalogEntry: each tenant APIBinding to its export gets the claims its
    /// requirements and the workspace's Grant call for (core bindings first). --max-items bounds
    /// binding writes in one run. `kbind claims export <entry>` renders the export's claims.
    Claims(Box<crate::claims::args::ClaimsArgs>),
    /// One pass over due RelationshipSources: upstream directory memberships (Slack, a SCIM
    /// bridge) into SpiceDB. --max-items bounds the scopes handled in one run across sources.
    Relsync(Box<crate::relsync::args::RelsyncArgs>),
    /// Provider side of the service layer: one pass over every Grant (iam.kbind.io): its
    /// ServiceAccount, RBAC and write-confining admission policy, a token re-issued before it
    /// expires into a kubeconfig Secret, revocation on deletion. --max-items bounds the Grants
    /// written in one run. `--print-kubeconfig GRANT` prints an issued kubeconfig.
    Issue(crate::issue::IssueArgs),
    /// Read-only overview of every kbind resource on the cluster: Connections, ClusterBindings
    /// and Bindings (per-API counts), CatalogEntries, RelationshipSources and Grants, as tables
    /// (or -o json|yaml). Kinds not installed are skipped. Takes no Lease and writes nothing.
    /// Exit 0 when everything is Ready, 3 when something is not.
    Status(crate::status::StatusArgs),
    /// Bind this cluster to a provider in one command: validate --provider-kubeconfig as kbind
    /// schema would, check the chosen APIs (--apis, or --export) are exported, then write the
    /// Secret (in --credential-namespace), the Connection and a ClusterBinding (or, with
    /// --namespace, a Binding), all named --name. A second run writes nothing. Refuses (exit 2)
    /// to overwrite objects it did not write, unless --force. --dry-run prints the manifests
    /// (docs/binding-flow.md).
    Bind(Box<crate::bind::BindArgs>),
    /// Print the CustomResourceDefinitions kbind uses (what deploy/crds/ holds).
    Crds {
        /// Print the kcp CRDs (APIBinding, APIExport, APIExportEndpointSlice, LogicalCluster)
        /// instead, for running `kbind claims` against a plain Kubernetes API server.
        #[arg(long)]
        kcp: bool,
    },
    /// Release every finalizer kbind put on objects (core.kbind.io/syncer, core.kbind.io/cleanup,
    /// kbind.io/relsync-cleanup, iam.kbind.io/revoke), so deleting kbind leaves nothing
    /// Terminating. A dry run unless --yes (alias --confirm). Suspend or delete the kbind
    /// CronJobs first: with --yes it refuses (exit 2) while a pass Lease is held, unless --force.
    /// Deletes nothing; prints what to delete next (docs/operations.md, "Uninstall"). Exit 1 if
    /// an object could not be released.
    Uninstall(crate::uninstall::UninstallArgs),
    /// Print the version.
    Version,
}

/// Run one command; returns the process exit code.
pub fn run(common: CommonArgs, command: Command) -> i32 {
    use crate::pass::run as pass;
    match command {
        Command::Schema(args) => {
            block_on(pass(SCHEMA, common, |ctx| crate::schema::run(ctx, args)))
        }
        Command::Resync(args) => {
            block_on(pass(RESYNC, common, |ctx| crate::resync::run(ctx, args)))
        }
        Command::Claims(args) => match args.command.clone() {
            Some(crate::claims::args::ClaimsCommand::Export { entry, hub }) => {
                crate::set_command(CLAIMS.name);
                block_on(crate::claims::export::run(common, entry, hub))
            }
            None => block_on(pass(CLAIMS, common, |ctx| crate::claims::run(ctx, *args))),
        },
        Command::Relsync(args) => {
            block_on(pass(RELSYNC, common, |ctx| crate::relsync::run(ctx, *args)))
        }
        Command::Issue(args) => match args.print_kubeconfig.clone() {
            Some(grant) => block_on(crate::issue::print_kubeconfig(common, grant)),
            None => block_on(pass(ISSUE, common, |ctx| crate::issue::run(ctx, args))),
        },
        Command::Status(args) => block_on(crate::status::run(common, args, PASSES)),
        Command::Crds { kcp } => crate::crds::print(kcp),
        Command::Bind(args) => block_on(crate::bind::run(common, *args)),
        Command::Uninstall(args) => block_on(crate::uninstall::run(common, args, PASSES)),
        Command::Version => {
            println!("kbind {}", env!("CARGO_PKG_VERSION"));
            0
        }
    }
}

fn block_on<F: std::future::Future<Output = i32>>(f: F) -> i32 {
    match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt.block_on(f),
        Err(e) => {
            eprintln!("kbind: cannot start the async runtime: {e}");
            1
        }
    }
}

#[cfg(test)]
mod tests;
