//! The pure half of the model-based test (tests/model.rs, docs/testing.md): a seeded generator,
//! the steps it draws (with a one-line text form, so a failing sequence can be replayed or
//! shrunk), and the reference model the checks compare the servers with. No I/O here.
#![allow(dead_code)]

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

use serde_json::Value;

/// splitmix64: small, seedable, the same on every platform.
#[derive(Clone, Debug)]
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Rng(seed)
    }
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    /// Uniform in `0..n` (n > 0).
    pub fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n
    }
    pub fn pick<T: Clone>(&mut self, xs: &[T]) -> T {
        xs[self.below(xs.len() as u64) as usize].clone()
    }
}

/// Consumer namespaces (`a`, `b`) times names (`w0`..`w2`): few enough that names recur.
pub const NAMESPACES: u8 = 2;
pub const NAMES: u8 = 3;

/// A namespace/name slot, the same on both clusters.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Key {
    pub ns: u8,
    pub name: u8,
}

impl Key {
    pub fn all() -> Vec<Key> {
        (0..NAMESPACES)
            .flat_map(|ns| (0..NAMES).map(move |name| Key { ns, name }))
            .collect()
    }
    pub fn object_name(&self) -> String {
        format!("w{}", self.name)
    }
}

impl fmt::Display for Key {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/w{}", (b'a' + self.ns) as char, self.name)
    }
}

fn parse_key(s: &str) -> Option<Key> {
    let (ns, name) = s.split_once('/')?;
    let ns = ns.bytes().next()?.checked_sub(b'a')?;
    let name: u8 = name.strip_prefix('w')?.parse().ok()?;
    (ns < NAMESPACES && name < NAMES && s.len() == 4).then_some(Key { ns, name })
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Pass {
    Schema,
    Resync,
}

impl Pass {
    pub fn name(self) -> &'static str {
        match self {
            Pass::Schema => "schema",
            Pass::Resync => "resync",
        }
    }
}

/// How a run ends.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kill {
    /// Runs to the end.
    No,
    /// `KBIND_CRASH_AFTER_WRITES=n`: aborts right after its nth data write (a run with fewer
    /// writes completes).
    AfterWrites(u64),
    /// SIGKILL this many milliseconds after the start (a run that ends sooner completes).
    Sigkill(u64),
}

/// A binding's `spec.orphans` (docs/resync.md "Orphans").
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Orphans {
    #[default]
    Keep,
    Delete,
    Restore,
}

impl Orphans {
    pub const ALL: [Orphans; 3] = [Orphans::Keep, Orphans::Delete, Orphans::Restore];

    pub fn name(self) -> &'static str {
        match self {
            Orphans::Keep => "Keep",
            Orphans::Delete => "Delete",
            Orphans::Restore => "Restore",
        }
    }

    fn parse(s: &str) -> Option<Self> {
        Orphans::ALL.into_iter().find(|o| o.name() == s)
    }
}

/// Which binding: the ClusterBinding, or the Binding in namespace `b`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Cover {
    Cluster,
    Ns,
}

/// The namespace (index) the Binding lives in and covers: `b`.
pub const BINDING_NS: u8 = 1;

/// One step of a sequence: a user or world action, a run, or a settle (two clean rounds, the
/// full comparison with the model, and a third round that must write nothing).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Step {
    /// The consumer creates an object (spec `{size}`).
    Create {
        key: Key,
        size: u32,
    },
    /// The consumer changes an object's spec.
    Update {
        key: Key,
        size: u32,
    },
    /// The consumer deletes an object.
    Delete {
        key: Key,
    },
    /// The provider's controller writes `status.phase` on the copy.
    ProviderStatus {
        key: Key,
        phase: u32,
    },
    /// Someone else creates a provider object without kbind's markers.
    Foreign {
        key: Key,
        size: u32,
    },
    /// Delete the ClusterBinding.
    Unbind,
    /// Create the ClusterBinding again, same name.
    Rebind,
    /// Create the Binding in namespace `b` (same name each time).
    NsBind,
    /// Delete the Binding in namespace `b`.
    NsUnbind,
    /// Set a binding's `spec.orphans`.
    Orphans {
        on: Cover,
        policy: Orphans,
    },
    /// The provider re-issues the credential: the Grant's Secret on the provider gets a fresh
    /// token of the same ServiceAccount; `kbind schema` pulls it (rotation by pull).
    Reissue,
    /// Rewrite the Connection's Secret: a fresh token of the same ServiceAccount, or the same
    /// kubeconfig with other bytes.
    Rotate {
        fresh: bool,
    },
    Run {
        pass: Pass,
        kill: Kill,
    },
    Settle,
}

impl Step {
    /// The step's kind, as the sequence summary counts them.
    pub fn kind(&self) -> &'static str {
        match self {
            Step::Create { .. } => "create",
            Step::Update { .. } => "update",
            Step::Delete { .. } => "delete",
            Step::ProviderStatus { .. } => "status",
            Step::Foreign { .. } => "foreign",
            Step::Unbind => "unbind",
            Step::Rebind => "rebind",
            Step::NsBind => "bind b",
            Step::NsUnbind => "unbind b",
            Step::Orphans { .. } => "orphans",
            Step::Reissue => "reissue",
            Step::Rotate { .. } => "rotate",
            Step::Run { .. } => "run",
            Step::Settle => "settle",
        }
    }

    /// Whether the step may legitimately change conditions and kbind's annotations: the quiet
    /// window of invariant 3 starts again after it. Status written by the provider and a rotated
    /// or re-issued Secret of the same identity change neither.
    pub fn disturbs(&self) -> bool {
        !matches!(
            self,
            Step::ProviderStatus { .. }
                | Step::Rotate { .. }
                | Step::Reissue
                | Step::Run { .. }
                | Step::Settle
        )
    }
}

impl fmt::Display for Step {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Step::Create { key, size } => write!(f, "create {key} size={size}"),
            Step::Update { key, size } => write!(f, "update {key} size={size}"),
            Step::Delete { key } => write!(f, "delete {key}"),
            Step::ProviderStatus { key, phase } => write!(f, "status {key} phase={phase}"),
            Step::Foreign { key, size } => write!(f, "foreign {key} size={size}"),
            Step::Unbind => write!(f, "unbind"),
            Step::Rebind => write!(f, "rebind"),
            Step::NsBind => write!(f, "bind b"),
            Step::NsUnbind => write!(f, "unbind b"),
            Step::Orphans {
                on: Cover::Cluster,
                policy,
            } => write!(f, "orphans {}", policy.name()),
            Step::Orphans {
                on: Cover::Ns,
                policy,
            } => write!(f, "orphans b {}", policy.name()),
            Step::Reissue => write!(f, "reissue"),
            Step::Rotate { fresh: true } => write!(f, "rotate token"),
            Step::Rotate { fresh: false } => write!(f, "rotate same"),
            Step::Run { pass, kill } => {
                write!(f, "run {}", pass.name())?;
                match kill {
                    Kill::No => Ok(()),
                    Kill::AfterWrites(n) => write!(f, " crash={n}"),
                    Kill::Sigkill(ms) => write!(f, " kill={ms}ms"),
                }
            }
            Step::Settle => write!(f, "settle"),
        }
    }
}

/// Parse one step as [`Step`]'s `Display` writes it.
pub fn parse_step(s: &str) -> Option<Step> {
    let words: Vec<&str> = s.split_whitespace().collect();
    let num = |w: &str, k: &str| -> Option<u32> { w.strip_prefix(k)?.parse().ok() };
    Some(match words.as_slice() {
        ["create", k, n] => Step::Create {
            key: parse_key(k)?,
            size: num(n, "size=")?,
        },
        ["update", k, n] => Step::Update {
            key: parse_key(k)?,
            size: num(n, "size=")?,
        },
        ["delete", k] => Step::Delete { key: parse_key(k)? },
        ["status", k, n] => Step::ProviderStatus {
            key: parse_key(k)?,
            phase: num(n, "phase=")?,
        },
        ["foreign", k, n] => Step::Foreign {
            key: parse_key(k)?,
            size: num(n, "size=")?,
        },
        ["unbind"] => Step::Unbind,
        ["rebind"] => Step::Rebind,
        ["bind", "b"] => Step::NsBind,
        ["unbind", "b"] => Step::NsUnbind,
        ["orphans", p] => Step::Orphans {
            on: Cover::Cluster,
            policy: Orphans::parse(p)?,
        },
        ["orphans", "b", p] => Step::Orphans {
            on: Cover::Ns,
            policy: Orphans::parse(p)?,
        },
        ["reissue"] => Step::Reissue,
        ["rotate", "token"] => Step::Rotate { fresh: true },
        ["rotate", "same"] => Step::Rotate { fresh: false },
        ["settle"] => Step::Settle,
        ["run", p, rest @ ..] => {
            let pass = match *p {
                "schema" => Pass::Schema,
                "resync" => Pass::Resync,
                _ => return None,
            };
            let kill = match rest {
                [] => Kill::No,
                [k] if k.starts_with("crash=") => Kill::AfterWrites(num(k, "crash=")?.into()),
                [k] => Kill::Sigkill(k.strip_prefix("kill=")?.strip_suffix("ms")?.parse().ok()?),
                _ => return None,
            };
            Step::Run { pass, kill }
        }
        _ => return None,
    })
}

/// A `;`-separated list of steps (the replay form).
pub fn parse_steps(s: &str) -> Result<Vec<Step>, String> {
    s.split(';')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(|s| parse_step(s).ok_or_else(|| format!("cannot parse step {s:?}")))
        .collect()
}

pub fn format_steps(steps: &[Step]) -> String {
    steps
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join("; ")
}

/// What the model knows of a provider object.
#[derive(Clone, Debug, PartialEq)]
pub enum PObj {
    /// Created by someone else, no kbind markers: kbind must never touch it.
    Foreign { size: u32 },
    /// A copy kbind made. `may_go`: its consumer object was deleted through the syncer
    /// finalizer, the one path by which provider data may be deleted. `status`: what the
    /// provider's controller last wrote (kbind never writes provider status).
    Copy { may_go: bool, status: Option<Value> },
}

/// A live consumer object.
#[derive(Clone, Debug, PartialEq)]
pub struct CObj {
    pub size: u32,
    pub uid: String,
}

/// The reference model: what the user and the world did, and what must hold because of it.
#[derive(Clone, Debug, Default)]
pub struct Model {
    /// The ClusterBinding exists (and is not being deleted).
    pub bound: bool,
    /// The Binding in namespace `b` exists (and is not being deleted).
    pub ns_bound: bool,
    /// Each binding's `spec.orphans` (kept when it is deleted and created again).
    pub orphans: Orphans,
    pub ns_orphans: Orphans,
    /// Observed: the consumer CRD is Established (consumer objects can be written).
    pub crd_ready: bool,
    /// Observed after an unbind: the ClusterBinding is gone and no consumer CRD is being
    /// deleted.
    pub teardown_done: bool,
    /// Observed after `unbind b`: the Binding is gone.
    pub ns_teardown_done: bool,
    /// The ClusterBinding was deleted while no Binding lived, and no binding was created since:
    /// its teardown removes the consumer CRD, and every copy is marked `Unbound`.
    pub crd_must_go: bool,
    pub consumer: BTreeMap<Key, CObj>,
    /// Deleted while holding the syncer finalizer, not yet released.
    pub terminating: BTreeSet<Key>,
    pub provider: BTreeMap<Key, PObj>,
    /// An action happened since the last clean resync run: the next runs have writes to make,
    /// so that is when killing one tells most.
    pub pending_work: bool,
}

impl Model {
    pub fn foreign(&self, k: &Key) -> bool {
        matches!(self.provider.get(k), Some(PObj::Foreign { .. }))
    }

    /// The live binding that covers slot `k` (docs/resync.md "Gate"): the ClusterBinding first,
    /// else the Binding in `k`'s namespace.
    pub fn cover(&self, k: &Key) -> Option<Cover> {
        if self.bound {
            Some(Cover::Cluster)
        } else if self.ns_bound && k.ns == BINDING_NS {
            Some(Cover::Ns)
        } else {
            None
        }
    }

    /// The `spec.orphans` that applies to an orphan at `k`: its covering binding's.
    pub fn orphan_policy(&self, k: &Key) -> Option<Orphans> {
        self.cover(k).map(|c| self.policy_of(c))
    }

    pub fn policy_of(&self, c: Cover) -> Orphans {
        match c {
            Cover::Cluster => self.orphans,
            Cover::Ns => self.ns_orphans,
        }
    }
}

/// At most this many foreign objects per sequence: each holds its name for good.
const MAX_FOREIGN: usize = 2;
/// A settle at least this often.
pub const SETTLE_EVERY: usize = 16;

#[derive(Clone, Copy)]
enum Kind {
    Create,
    Update,
    Delete,
    Status,
    Foreign,
    Unbind,
    Rebind,
    NsBind,
    NsUnbind,
    Orphans,
    Reissue,
    Rotate,
    Run,
    Settle,
}

/// Draw the next step from the model: only steps that make sense in its state, weighted. Every
/// step takes exactly one number from `seq` (and draws the rest from a generator seeded with
/// it), so where a run's timing changed one step, the steps after it still come from the same
/// numbers.
pub fn generate(seq: &mut Rng, m: &Model, since_settle: usize) -> Step {
    let mut rng = Rng::new(seq.next_u64());
    let rng = &mut rng;
    if since_settle >= SETTLE_EVERY {
        return Step::Settle;
    }
    let free: Vec<Key> = Key::all()
        .into_iter()
        .filter(|k| !m.consumer.contains_key(k) && !m.terminating.contains(k))
        .collect();
    let live: Vec<Key> = m.consumer.keys().copied().collect();
    let copies: Vec<Key> = m
        .provider
        .iter()
        .filter(|(_, p)| matches!(p, PObj::Copy { may_go: false, .. }))
        .map(|(k, _)| *k)
        .collect();
    let unclaimed: Vec<Key> = Key::all()
        .into_iter()
        .filter(|k| !m.provider.contains_key(k))
        .collect();
    let foreign = m
        .provider
        .values()
        .filter(|p| matches!(p, PObj::Foreign { .. }))
        .count();
    // Consumer objects can be written whenever the CRD is served, covered by a binding or not.
    let consumer_ok = m.crd_ready;
    let mut kinds: Vec<(u64, Kind)> = vec![
        (36, Kind::Run),
        (3, Kind::Settle),
        (4, Kind::Rotate),
        (3, Kind::Reissue),
    ];
    if consumer_ok && !free.is_empty() {
        kinds.push((30, Kind::Create));
    }
    if consumer_ok && !live.is_empty() {
        kinds.push((20, Kind::Update));
        kinds.push((14, Kind::Delete));
    }
    if !copies.is_empty() {
        kinds.push((8, Kind::Status));
    }
    if foreign < MAX_FOREIGN && !unclaimed.is_empty() {
        kinds.push((5, Kind::Foreign));
    }
    if m.bound && m.crd_ready {
        // Most telling with something to keep.
        kinds.push((if m.provider.is_empty() { 1 } else { 5 }, Kind::Unbind));
    }
    if !m.bound && m.teardown_done {
        kinds.push((40, Kind::Rebind));
    }
    if !m.ns_bound && m.ns_teardown_done {
        kinds.push((4, Kind::NsBind));
    }
    if m.ns_bound {
        kinds.push((3, Kind::NsUnbind));
    }
    let live_bindings: Vec<Cover> = [(m.bound, Cover::Cluster), (m.ns_bound, Cover::Ns)]
        .into_iter()
        .filter_map(|(b, c)| b.then_some(c))
        .collect();
    if !live_bindings.is_empty() {
        kinds.push((4, Kind::Orphans));
    }
    let total: u64 = kinds.iter().map(|(w, _)| w).sum();
    let mut r = rng.below(total);
    let kind = kinds
        .iter()
        .find(|(w, _)| {
            if r < *w {
                true
            } else {
                r -= w;
                false
            }
        })
        .map(|(_, k)| *k)
        .unwrap_or(Kind::Run);
    match kind {
        Kind::Create => {
            // Half the time a name the provider already holds (an orphan to re-adopt, or a
            // foreign object to conflict with), when there is one.
            let held: Vec<Key> = free
                .iter()
                .filter(|k| m.provider.contains_key(k))
                .copied()
                .collect();
            let from = if !held.is_empty() && rng.below(2) == 0 {
                &held
            } else {
                &free
            };
            Step::Create {
                key: rng.pick(from),
                size: rng.below(5) as u32,
            }
        }
        Kind::Update => Step::Update {
            key: rng.pick(&live),
            size: rng.below(5) as u32,
        },
        Kind::Delete => Step::Delete {
            key: rng.pick(&live),
        },
        Kind::Status => Step::ProviderStatus {
            key: rng.pick(&copies),
            phase: rng.below(4) as u32,
        },
        Kind::Foreign => Step::Foreign {
            key: rng.pick(&unclaimed),
            size: 100 + rng.below(100) as u32,
        },
        Kind::Unbind => Step::Unbind,
        Kind::Rebind => Step::Rebind,
        Kind::NsBind => Step::NsBind,
        Kind::NsUnbind => Step::NsUnbind,
        Kind::Orphans => {
            let on = rng.pick(&live_bindings);
            let others: Vec<Orphans> = Orphans::ALL
                .into_iter()
                .filter(|p| *p != m.policy_of(on))
                .collect();
            Step::Orphans {
                on,
                policy: rng.pick(&others),
            }
        }
        Kind::Reissue => Step::Reissue,
        Kind::Rotate => Step::Rotate {
            fresh: rng.below(2) == 0,
        },
        Kind::Settle => Step::Settle,
        Kind::Run => {
            let pass = if rng.below(10) < 3 {
                Pass::Schema
            } else {
                Pass::Resync
            };
            let r = rng.below(100);
            let at = if m.pending_work { 2 } else { 1 };
            let kill = if r < 20 * at {
                // Most runs between actions write little: the first write most often.
                Kill::AfterWrites([1, 1, 2, 3][rng.below(4) as usize])
            } else if r < 28 * at {
                Kill::Sigkill(20 + rng.below(250))
            } else {
                Kill::No
            };
            Step::Run { pass, kill }
        }
    }
}

/// The relsync sequences: Slack channels `C1`..`C3` (`C1` is never archived, so the upstream
/// never enumerates zero channels) and users `U1`..`U4`.
pub const CHANNELS: u8 = 3;
pub const USERS: u8 = 4;

/// One step of a relsync sequence.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RStep {
    Join {
        ch: u8,
        user: u8,
    },
    Leave {
        ch: u8,
        user: u8,
    },
    /// The user is deactivated in Slack (a join miss from then on).
    Deactivate {
        user: u8,
    },
    Reactivate {
        user: u8,
    },
    /// The channel is archived (no longer enumerated: reaped).
    Archive {
        ch: u8,
    },
    Unarchive {
        ch: u8,
    },
    Run {
        kill: Kill,
    },
    Settle,
}

impl RStep {
    /// See [`Step::disturbs`].
    pub fn disturbs(&self) -> bool {
        !matches!(self, RStep::Run { .. } | RStep::Settle)
    }
}

impl fmt::Display for RStep {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RStep::Join { ch, user } => write!(f, "join C{} U{}", ch + 1, user + 1),
            RStep::Leave { ch, user } => write!(f, "leave C{} U{}", ch + 1, user + 1),
            RStep::Deactivate { user } => write!(f, "deactivate U{}", user + 1),
            RStep::Reactivate { user } => write!(f, "reactivate U{}", user + 1),
            RStep::Archive { ch } => write!(f, "archive C{}", ch + 1),
            RStep::Unarchive { ch } => write!(f, "unarchive C{}", ch + 1),
            RStep::Run { kill } => match kill {
                Kill::No => write!(f, "run relsync"),
                Kill::AfterWrites(n) => write!(f, "run relsync crash={n}"),
                Kill::Sigkill(ms) => write!(f, "run relsync kill={ms}ms"),
            },
            RStep::Settle => write!(f, "settle"),
        }
    }
}

pub fn parse_rstep(s: &str) -> Option<RStep> {
    let words: Vec<&str> = s.split_whitespace().collect();
    let id = |w: &str, p: char, max: u8| -> Option<u8> {
        let n: u8 = w.strip_prefix(p)?.parse().ok()?;
        (1..=max).contains(&n).then_some(n - 1)
    };
    let ch = |w: &str| id(w, 'C', CHANNELS);
    let user = |w: &str| id(w, 'U', USERS);
    Some(match words.as_slice() {
        ["join", c, u] => RStep::Join {
            ch: ch(c)?,
            user: user(u)?,
        },
        ["leave", c, u] => RStep::Leave {
            ch: ch(c)?,
            user: user(u)?,
        },
        ["deactivate", u] => RStep::Deactivate { user: user(u)? },
        ["reactivate", u] => RStep::Reactivate { user: user(u)? },
        ["archive", c] => RStep::Archive { ch: ch(c)? },
        ["unarchive", c] => RStep::Unarchive { ch: ch(c)? },
        ["settle"] => RStep::Settle,
        ["run", "relsync"] => RStep::Run { kill: Kill::No },
        ["run", "relsync", k] => match parse_step(&format!("run resync {k}"))? {
            Step::Run { kill, .. } => RStep::Run { kill },
            _ => return None,
        },
        _ => return None,
    })
}

pub fn parse_rsteps(s: &str) -> Result<Vec<RStep>, String> {
    s.split(';')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(|s| parse_rstep(s).ok_or_else(|| format!("cannot parse step {s:?}")))
        .collect()
}

/// The Slack workspace as the relsync model sees it (the stand-in is kept equal to it).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RModel {
    pub members: Vec<BTreeSet<u8>>,
    pub archived: BTreeSet<u8>,
    pub deactivated: BTreeSet<u8>,
    /// As [`Model::pending_work`].
    pub pending_work: bool,
}

impl Default for RModel {
    /// C1: U1 U2; C2: U2 U3; C3 (private): U4.
    fn default() -> Self {
        RModel {
            members: vec![[0, 1].into(), [1, 2].into(), [3].into()],
            archived: BTreeSet::new(),
            deactivated: BTreeSet::new(),
            pending_work: false,
        }
    }
}

pub fn email(user: u8) -> String {
    format!("u{}@example.com", user + 1)
}

impl RModel {
    /// The relationships SpiceDB must hold once the runs converged, as the relsync fixture's
    /// `held` reads them: (channel relationships, workspace relationships).
    pub fn expected(&self) -> (BTreeSet<String>, BTreeSet<String>) {
        let mut channels = BTreeSet::new();
        for (ch, members) in self.members.iter().enumerate() {
            if self.archived.contains(&(ch as u8)) {
                continue;
            }
            channels.insert(format!("C{}#workspace@T1", ch + 1));
            for u in members.iter().filter(|u| !self.deactivated.contains(u)) {
                channels.insert(format!("C{}#member@{}", ch + 1, email(*u)));
            }
        }
        let workspace = (0..USERS)
            .filter(|u| !self.deactivated.contains(u))
            .map(|u| format!("T1#member@{}", email(u)))
            .collect();
        (channels, workspace)
    }
}

/// Draw the next relsync step (as [`generate`]: one number of `seq` per step).
pub fn rgenerate(seq: &mut Rng, m: &RModel, since_settle: usize) -> RStep {
    let mut rng = Rng::new(seq.next_u64());
    let rng = &mut rng;
    if since_settle >= SETTLE_EVERY {
        return RStep::Settle;
    }
    let pairs = |member: bool| -> Vec<(u8, u8)> {
        (0..CHANNELS)
            .flat_map(|c| (0..USERS).map(move |u| (c, u)))
            .filter(|(c, u)| m.members[*c as usize].contains(u) == member)
            .collect()
    };
    let (joinable, leavable) = (pairs(false), pairs(true));
    let active: Vec<u8> = (0..USERS).filter(|u| !m.deactivated.contains(u)).collect();
    let inactive: Vec<u8> = m.deactivated.iter().copied().collect();
    let archivable: Vec<u8> = (1..CHANNELS).filter(|c| !m.archived.contains(c)).collect();
    let archived: Vec<u8> = m.archived.iter().copied().collect();
    let mut kinds: Vec<(u64, u8)> = vec![(36, 0), (3, 1)];
    if !joinable.is_empty() {
        kinds.push((18, 2));
    }
    if !leavable.is_empty() {
        kinds.push((14, 3));
    }
    if active.len() > 1 {
        kinds.push((4, 4));
    }
    if !inactive.is_empty() {
        kinds.push((6, 5));
    }
    if !archivable.is_empty() {
        kinds.push((4, 6));
    }
    if !archived.is_empty() {
        kinds.push((6, 7));
    }
    let total: u64 = kinds.iter().map(|(w, _)| w).sum();
    let mut r = rng.below(total);
    let mut kind = 0;
    for (w, k) in &kinds {
        if r < *w {
            kind = *k;
            break;
        }
        r -= w;
    }
    match kind {
        1 => RStep::Settle,
        2 => {
            let (ch, user) = rng.pick(&joinable);
            RStep::Join { ch, user }
        }
        3 => {
            let (ch, user) = rng.pick(&leavable);
            RStep::Leave { ch, user }
        }
        4 => RStep::Deactivate {
            user: rng.pick(&active),
        },
        5 => RStep::Reactivate {
            user: rng.pick(&inactive),
        },
        6 => RStep::Archive {
            ch: rng.pick(&archivable),
        },
        7 => RStep::Unarchive {
            ch: rng.pick(&archived),
        },
        _ => {
            let r = rng.below(100);
            let at = if m.pending_work { 2 } else { 1 };
            let kill = if r < 20 * at {
                Kill::AfterWrites([1, 1, 2, 3][rng.below(4) as usize])
            } else if r < 28 * at {
                Kill::Sigkill(20 + rng.below(400))
            } else {
                Kill::No
            };
            RStep::Run { kill }
        }
    }
}
