//! Poison isolation (docs/operations.md, "Poison items"): a root object on which two runs in a
//! row died (a hostile provider's answer that blows the pod's memory, a panic in a dependency) is
//! skipped until it changes, so it cannot starve every object after it on every run.
//!
//! Everything lives in annotations of the pass Lease, written only by writes the Lease gets
//! anyway, so a healthy run costs nothing extra:
//! - [`WORKING_ON`]: the items in progress, `<item>@<generation>`, recorded by each renewal.
//! - A run that took the Lease over from a holder that died (a released Lease is never taken
//!   over) is careful: it writes [`WORKING_ON`] at each item start as well, so if it dies too,
//!   the item it died on is known exactly. Only runs after a death pay this.
//! - [`SUSPECTS`]: what the dead holder was working on, kept by the run that took over.
//! - [`QUARANTINED`]: items two runs in a row died on: a run taking over from a dead holder
//!   quarantines what that holder was working on if the death before it was on the same item
//!   (a suspect). A first death seldom names its item (no renewal may have recorded it), so
//!   a poison item that kills at once is quarantined after three deaths, the last two on it.
//!   The record survives release; an item leaves it when it is seen at another generation (a
//!   person changed it). A run that lives clears the suspects.

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::time::Duration;

use tokio::sync::{Notify, watch};

pub const WORKING_ON: &str = "kbind.io/working-on";
pub const QUARANTINED: &str = "kbind.io/quarantined";
pub const SUSPECTS: &str = "kbind.io/suspects";

/// At most this many quarantined items are remembered (past it, the first names in sort order
/// are dropped, and so tried again): a Lease annotation must stay small.
const MAX_QUARANTINED: usize = 64;

/// How poison isolation names a root object: `<Kind>/<name>` (`[<namespace>/]` before the
/// name for a namespaced one). Names hold no `,` or `@`.
pub fn item(kind: &str, namespace: Option<&str>, name: &str) -> String {
    match namespace {
        Some(ns) => format!("{kind}/{ns}/{name}"),
        None => format!("{kind}/{name}"),
    }
}

/// The Lease annotations that concern poison isolation.
pub type Annotations = BTreeMap<String, String>;

/// `<item>@<generation>` entries, comma-separated. Malformed entries are ignored: the Lease
/// is writable by whoever may run the pass, and nothing in it may stop a run.
fn parse(value: Option<&String>) -> BTreeMap<String, i64> {
    value
        .map(|v| {
            v.split(',')
                .filter_map(|e| {
                    let (item, generation) = e.trim().rsplit_once('@')?;
                    let generation = generation.parse().ok()?;
                    (!item.is_empty()).then(|| (item.to_string(), generation))
                })
                .collect()
        })
        .unwrap_or_default()
}

fn render(entries: &BTreeMap<String, i64>) -> String {
    entries
        .iter()
        .map(|(i, g)| format!("{i}@{g}"))
        .collect::<Vec<_>>()
        .join(",")
}

/// What a run starts with, from the Lease it took.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Record {
    pub quarantined: BTreeMap<String, i64>,
    pub suspects: BTreeMap<String, i64>,
    pub careful: bool,
    /// Items added to [`Record::quarantined`] by this takeover.
    pub newly_quarantined: Vec<String>,
}

/// The record of a run that takes the Lease. `died`: the previous holder did not release it
/// (it was killed, or its pod failed). Pure: the takeover's Lease write carries the result.
pub fn take(old: &Annotations, died: bool) -> Record {
    let mut quarantined = parse(old.get(QUARANTINED));
    let mut newly_quarantined = Vec::new();
    let mut suspects = BTreeMap::new();
    if died {
        let before = parse(old.get(SUSPECTS));
        for (item, generation) in parse(old.get(WORKING_ON)) {
            if before.get(&item) == Some(&generation) {
                newly_quarantined.push(item.clone());
                quarantined.insert(item, generation);
            } else {
                suspects.insert(item, generation);
            }
        }
    }
    while quarantined.len() > MAX_QUARANTINED {
        quarantined.pop_first();
    }
    Record {
        quarantined,
        suspects,
        careful: died,
        newly_quarantined,
    }
}

/// Set `annotations` to say the record and what is in progress (none at a release).
fn annotate(
    annotations: &mut Annotations,
    quarantined: &BTreeMap<String, i64>,
    suspects: &BTreeMap<String, i64>,
    working_on: &BTreeMap<String, i64>,
) {
    let mut set = |key: &str, value: Option<String>| match value.filter(|v| !v.is_empty()) {
        Some(v) => {
            annotations.insert(key.to_string(), v);
        }
        None => {
            annotations.remove(key);
        }
    };
    set(QUARANTINED, Some(render(quarantined)));
    set(SUSPECTS, Some(render(suspects)));
    set(WORKING_ON, Some(render(working_on)));
}

/// Whether a pass may work on an item.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Verdict {
    Go,
    /// Two runs in a row died on it at this generation.
    Quarantined,
}

#[derive(Debug, Default)]
struct State {
    quarantined: BTreeMap<String, i64>,
    suspects: BTreeMap<String, i64>,
    careful: bool,
    working_on: BTreeMap<String, i64>,
    /// Quarantined by this run's takeover: passes that keep no condition of their own say so
    /// once, with an Event, on the run that quarantined it.
    fresh: Vec<String>,
    /// Bumped by each careful item start; the Lease writer reports the value it wrote.
    wanted: u64,
}

/// The run's view of the record, shared by the pass and the Lease renewal. Inert (never
/// quarantines, never writes) in a dry run, which holds no Lease.
#[derive(Debug)]
pub struct Tracker {
    state: Mutex<State>,
    /// Wakes the renewal for a careful item start.
    urgent: Notify,
    written: watch::Sender<u64>,
    /// How long a careful item start waits for its Lease write.
    wait: Duration,
}

impl Default for Tracker {
    fn default() -> Self {
        Self::new(Record::default(), Duration::from_secs(5))
    }
}

impl Tracker {
    pub fn new(record: Record, wait: Duration) -> Self {
        Self {
            state: Mutex::new(State {
                fresh: record.newly_quarantined,
                quarantined: record.quarantined,
                suspects: record.suspects,
                careful: record.careful,
                ..State::default()
            }),
            urgent: Notify::new(),
            written: watch::channel(0).0,
            wait,
        }
    }

    /// Whether `item` at `generation` may be worked on. An item quarantined at another
    /// generation was changed since: it leaves the record and is tried again.
    pub fn check(&self, item: &str, generation: i64) -> Verdict {
        let mut s = super::lock(&self.state);
        match s.quarantined.get(item) {
            Some(g) if *g == generation => Verdict::Quarantined,
            Some(_) => {
                s.quarantined.remove(item);
                Verdict::Go
            }
            None => Verdict::Go,
        }
    }

    /// Whether this run's takeover quarantined `item` (it has not been reported yet).
    pub fn newly_quarantined(&self, item: &str) -> bool {
        super::lock(&self.state).fresh.iter().any(|i| i == item)
    }

    /// Forget the quarantined items of `kind` not among `names` (deleted objects).
    pub fn forget_absent<'a>(&self, kind: &str, names: impl IntoIterator<Item = &'a str>) {
        let present: std::collections::BTreeSet<String> =
            names.into_iter().map(|n| item(kind, None, n)).collect();
        let prefix = format!("{kind}/");
        super::lock(&self.state)
            .quarantined
            .retain(|i, _| !i.starts_with(&prefix) || present.contains(i));
    }

    /// `item` is being worked on. In a careful run this waits (at most a few seconds) until a
    /// Lease write records it, so a death during it is blamed on it alone.
    pub async fn enter(&self, item: &str, generation: i64) {
        let target = {
            let mut s = super::lock(&self.state);
            s.working_on.insert(item.to_string(), generation);
            s.careful.then(|| {
                s.wanted += 1;
                s.wanted
            })
        };
        if let Some(target) = target {
            self.urgent.notify_one();
            let mut seen = self.written.subscribe();
            let recorded = tokio::time::timeout(self.wait, seen.wait_for(|w| *w >= target)).await;
            if !matches!(recorded, Ok(Ok(_))) {
                tracing::debug!(item, "the Lease did not record this item in time; going on");
            }
        }
        #[cfg(feature = "crash-points")]
        super::crash::entering(item);
    }

    /// `item` is done (no write: the next Lease write records it).
    pub fn leave(&self, item: &str) {
        super::lock(&self.state).working_on.remove(item);
    }

    /// Resolves when a careful item start wants a Lease write.
    pub async fn urgent(&self) {
        self.urgent.notified().await;
    }

    /// Annotate a Lease about to be written by the renewal; returns the token to report with
    /// [`Tracker::written`] once the write landed.
    pub fn annotate_renewal(&self, annotations: &mut Annotations) -> u64 {
        let s = super::lock(&self.state);
        annotate(annotations, &s.quarantined, &s.suspects, &s.working_on);
        s.wanted
    }

    pub fn written(&self, token: u64) {
        self.written.send_replace(token);
    }

    /// Annotate the Lease being released: the quarantine stays, nothing is in progress, and
    /// neither care nor suspicion carries over (this run lived).
    pub fn annotate_release(&self, annotations: &mut Annotations) {
        let s = super::lock(&self.state);
        annotate(
            annotations,
            &s.quarantined,
            &BTreeMap::new(),
            &BTreeMap::new(),
        );
    }

    /// Annotate the Lease being taken over with `record`.
    pub fn annotate_takeover(record: &Record, annotations: &mut Annotations) {
        annotate(
            annotations,
            &record.quarantined,
            &record.suspects,
            &BTreeMap::new(),
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    fn ann(pairs: &[(&str, &str)]) -> Annotations {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn only_two_deaths_in_a_row_on_the_same_item_quarantine_it() {
        let working = (WORKING_ON, "Connection/p@3");
        // A released Lease: nothing died, the record is kept, no care needed.
        let r = take(&ann(&[working, (QUARANTINED, "Connection/q@1")]), false);
        assert_eq!(r.quarantined, [("Connection/q".to_string(), 1)].into());
        assert!(!r.careful && r.newly_quarantined.is_empty() && r.suspects.is_empty());
        // A first death: the next run is careful and suspects what the holder worked on.
        let r = take(&ann(&[working]), true);
        assert!(r.careful && r.quarantined.is_empty());
        assert_eq!(r.suspects, [("Connection/p".to_string(), 3)].into());
        // A death on another item (or at another generation) than the one before: suspicion
        // moves, nothing is quarantined.
        let r = take(
            &ann(&[working, (SUSPECTS, "Connection/o@3,Connection/p@2")]),
            true,
        );
        assert!(r.quarantined.is_empty());
        assert_eq!(r.suspects, [("Connection/p".to_string(), 3)].into());
        // The second death in a row on it: quarantined at its generation.
        let r = take(&ann(&[working, (SUSPECTS, "Connection/p@3")]), true);
        assert_eq!(r.quarantined, [("Connection/p".to_string(), 3)].into());
        assert_eq!(r.newly_quarantined, ["Connection/p"]);
        assert!(r.careful && r.suspects.is_empty());
        let t = Tracker::new(r, Duration::from_millis(1));
        assert!(t.newly_quarantined("Connection/p"));
        assert!(!t.newly_quarantined("Connection/q"));
        assert_eq!(item("Connection", None, "p"), "Connection/p");
        assert_eq!(item("Binding", Some("ns"), "b"), "Binding/ns/b");
        // A run that died before starting an item blames nothing.
        let r = take(&ann(&[(SUSPECTS, "Connection/p@3")]), true);
        assert!(r.quarantined.is_empty() && r.suspects.is_empty() && r.careful);
    }

    #[test]
    fn malformed_entries_are_ignored_and_the_record_is_bounded() {
        let r = take(
            &ann(&[
                (SUSPECTS, "a@1,d@-1,e@5"),
                (WORKING_ON, "a@1,@2,b@x,c,d@-1, e@5 "),
            ]),
            true,
        );
        assert_eq!(
            r.quarantined,
            [("a".into(), 1), ("d".into(), -1), ("e".into(), 5)].into()
        );
        let many: Vec<String> = (0..100).map(|i| format!("c{i:03}@1")).collect();
        let r = take(&ann(&[(QUARANTINED, &many.join(","))]), false);
        assert_eq!(r.quarantined.len(), MAX_QUARANTINED);
    }

    #[test]
    fn an_item_changed_since_it_was_quarantined_is_tried_again() {
        let t = Tracker::new(
            Record {
                quarantined: [("Connection/p".into(), 3)].into(),
                ..Record::default()
            },
            Duration::from_millis(1),
        );
        assert_eq!(t.check("Connection/p", 3), Verdict::Quarantined);
        assert_eq!(t.check("Connection/other", 3), Verdict::Go);
        assert_eq!(t.check("Connection/p", 4), Verdict::Go);
        assert_eq!(t.check("Connection/p", 3), Verdict::Go, "forgotten");
        let mut a = Annotations::new();
        t.annotate_release(&mut a);
        assert!(a.is_empty(), "{a:?}");
        let absent = Tracker::new(
            Record {
                quarantined: [
                    ("Connection/gone".into(), 1),
                    ("Connection/here".into(), 1),
                    ("Binding/x".into(), 1),
                ]
                .into(),
                ..Record::default()
            },
            Duration::from_millis(1),
        );
        absent.forget_absent("Connection", ["here", "other"]);
        assert_eq!(
            absent.check("Connection/gone", 1),
            Verdict::Go,
            "deleted: forgotten"
        );
        assert_eq!(absent.check("Connection/here", 1), Verdict::Quarantined);
        assert_eq!(
            absent.check("Binding/x", 1),
            Verdict::Quarantined,
            "another kind"
        );
    }

    #[tokio::test]
    async fn the_lease_writes_say_what_is_in_progress_and_a_release_ends_care() {
        let t = Tracker::new(
            Record {
                quarantined: [("Connection/q".into(), 1)].into(),
                suspects: [("Connection/p".into(), 2)].into(),
                careful: true,
                newly_quarantined: vec![],
            },
            Duration::from_secs(5),
        );
        let t = Arc::new(t);
        // A careful item start waits for the renewal to write it.
        let writer = {
            let t = t.clone();
            tokio::spawn(async move {
                t.urgent().await;
                let mut a = Annotations::new();
                let token = t.annotate_renewal(&mut a);
                t.written(token);
                a
            })
        };
        t.enter("Connection/p", 2).await;
        let written = writer.await.unwrap();
        assert_eq!(written.get(WORKING_ON).unwrap(), "Connection/p@2");
        assert_eq!(written.get(QUARANTINED).unwrap(), "Connection/q@1");
        assert_eq!(written.get(SUSPECTS).unwrap(), "Connection/p@2");
        t.leave("Connection/p");
        let mut a = written;
        t.annotate_release(&mut a);
        assert_eq!(a, ann(&[(QUARANTINED, "Connection/q@1")]));
    }
}
