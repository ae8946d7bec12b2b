//! Bookkeeping of a pass's writes: a dry run records what it would write and writes nothing; a
//! real run counts data and bookkeeping writes separately and, in test builds (feature
//! `crash-points`), trips the crash knob after each data write.

use super::summary::PlannedWrite;

#[derive(Debug, Default)]
pub struct Writes {
    dry_run: bool,
    pub planned: Vec<PlannedWrite>,
    pub data: u64,
    pub bookkeeping: u64,
}

impl Writes {
    pub fn new(dry_run: bool) -> Self {
        Self {
            dry_run,
            ..Default::default()
        }
    }

    /// Announce a write. Returns whether to perform it (false in a dry run, where it is recorded).
    pub fn will(
        &mut self,
        verb: &str,
        target: impl Into<String>,
        detail: impl Into<String>,
    ) -> bool {
        if self.dry_run {
            self.planned.push(PlannedWrite {
                verb: verb.into(),
                target: target.into(),
                detail: detail.into(),
            });
        }
        !self.dry_run
    }

    /// A data write succeeded.
    pub fn data_done(&mut self) {
        self.data += 1;
        #[cfg(feature = "crash-points")]
        super::crash::data_write();
    }

    /// A bookkeeping write (status counters, finalizers) succeeded.
    pub fn bookkeeping_done(&mut self) {
        self.bookkeeping += 1;
    }

    /// A fresh tally for one object's writes run beside others' (src/pass/concurrency.rs);
    /// [`Writes::absorb`] adds it back. The crash knob counts each write as it happens.
    pub fn for_one(&self) -> Self {
        Self::new(self.dry_run)
    }

    /// Add the writes of a [`Writes::for_one`] tally (its planned writes after this one's).
    pub fn absorb(&mut self, other: Writes) {
        self.planned.extend(other.planned);
        self.data += other.data;
        self.bookkeeping += other.bookkeeping;
    }

    pub fn dry_run(&self) -> bool {
        self.dry_run
    }
}
