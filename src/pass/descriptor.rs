//! What the framework and the operator commands (`kbind status`, `kbind uninstall`) know of a
//! pass without importing it: its name, Lease, deploy role, the kinds it finalizes and reports on,
//! and its Job definitions. `src/registry.rs` holds one per pass; it alone names every pass
//! (docs/architecture.md, "The registry").

use crate::api::keys;

/// A kind, by API group and kind name (`""` group: the core API).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct Kind {
    pub group: &'static str,
    pub kind: &'static str,
}

/// Which objects of a kind carry a finalizer of a pass.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Finalized {
    /// Every object of this kind that carries it.
    Kind(Kind),
    /// Objects of every consumer CRD kbind manages (`core.kbind.io/managed`): the synced kinds,
    /// known only at run time.
    ManagedKinds,
}

/// A finalizer a pass adds, and where.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Finalizer {
    pub name: &'static str,
    pub on: Finalized,
}

/// One command that runs as a Job.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Descriptor {
    /// The subcommand, `kbind <name>`, and the `<pass>` in every derived name.
    pub name: &'static str,
    /// A pass takes the Lease `kbind-<name>[-<i>-of-<n>]`; a one-off command (`kbind bind`) does
    /// not, and has no CronJob.
    pub takes_lease: bool,
    /// The deploy role whose RBAC and overlay carry it: `deploy/components/<role>/`, `deploy/<role>`.
    pub role: &'static str,
    /// Where its Jobs run, and so its Lease lives, in the shipped manifests.
    pub namespace: &'static str,
    /// The finalizers it adds: `kbind uninstall` releases each.
    pub finalizers: &'static [Finalizer],
    /// The kinds `kbind status` shows for it: those it reconciles and the inputs it reads.
    pub shows: &'static [Kind],
    /// Its Job definitions, file names under `jobs/<name>/` (the CronJob first when it has one).
    pub jobs: &'static [&'static str],
}

impl Descriptor {
    /// The field manager of its server-side apply writes.
    pub fn field_manager(&self) -> String {
        keys::field_manager(self.name)
    }

    /// The field manager that owns its finalizers, apart from its other writes so releasing one
    /// never drops a field the pass still wants.
    pub fn finalizer_manager(&self) -> String {
        keys::finalizer_manager(self.name)
    }

    /// Its RBAC manifest, relative to the repository root.
    pub fn rbac_file(&self) -> String {
        format!("deploy/components/{}/{}-rbac.yaml", self.role, self.name)
    }

    /// Whether `lease` is this pass's Lease, for any shard: `kbind-<name>` or
    /// `kbind-<name>-<i>-of-<n>` (docs/contract.md "Keys").
    pub fn is_lease(&self, lease: &str) -> bool {
        let digits = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
        self.takes_lease
            && lease
                .strip_prefix(keys::PASS_PREFIX)
                .and_then(|rest| rest.strip_prefix(self.name))
                .is_some_and(|tail| {
                    tail.is_empty()
                        || tail
                            .strip_prefix('-')
                            .and_then(|t| t.split_once("-of-"))
                            .is_some_and(|(i, n)| digits(i) && digits(n))
                })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const P: Descriptor = Descriptor {
        name: "resync",
        takes_lease: true,
        role: "consumer",
        namespace: "kbind-system",
        finalizers: &[],
        shows: &[],
        jobs: &[],
    };

    #[test]
    fn a_pass_knows_its_lease_for_every_shard_and_nothing_else() {
        for yes in [
            "kbind-resync",
            "kbind-resync-0-of-4",
            "kbind-resync-12-of-16",
        ] {
            assert!(P.is_lease(yes), "{yes}");
        }
        for no in [
            "kbind-resyncs",
            "kbind-resync-",
            "kbind-resync-a-of-4",
            "kbind-resync-1-of-",
            "kbind-schema",
            "resync",
            "kbind-",
        ] {
            assert!(!P.is_lease(no), "{no}");
        }
        let one_off = Descriptor {
            takes_lease: false,
            ..P
        };
        assert!(!one_off.is_lease("kbind-resync"));
    }

    #[test]
    fn derived_names_follow_the_contract() {
        assert_eq!(P.field_manager(), "kbind-resync");
        assert_eq!(P.finalizer_manager(), "kbind-resync-finalizer");
        assert_eq!(P.rbac_file(), "deploy/components/consumer/resync-rbac.yaml");
    }
}
