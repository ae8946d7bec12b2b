//! The pin window (docs/issue.md "Pin window"). A new consumer's first heartbeat is written by
//! its `kbind resync` a few seconds after the tick at which the issuer's own run starts, so a run
//! that only looked once would pin it a whole period later, and the consumer's first writes
//! would be refused until then. With `--pin-window`, once a run has done its work it keeps
//! looking at the heartbeat Leases (one LIST every [`EVERY`]) while an issued Grant waits for
//! its first heartbeat ([`super::plan::sweep::awaits_pin`]), and sweeps at once when one comes.
//! A run with no such Grant ends as before.

use std::time::{Duration, Instant};

use crate::api::iam::Grant;
use crate::pass::budget::Exhausted;

use super::{Run, observe};

/// How often the window looks.
const EVERY: Duration = Duration::from_secs(2);

impl Run<'_> {
    /// Follow `awaiting` until none waits, the window ends or the deadline nears (a lost
    /// Lease, SIGTERM). `Some`: a sweep of the window stopped early.
    pub(super) async fn pin_window(&mut self, mut awaiting: Vec<Grant>) -> Option<Exhausted> {
        let end = Instant::now() + self.args.pin_window;
        let mut looks = 0i64;
        let mut stopped = None;
        while !awaiting.is_empty() {
            if Instant::now() + EVERY >= end || self.ctx.budget.would_cross_deadline(EVERY * 2) {
                break;
            }
            tokio::time::sleep(EVERY).await;
            looks += 1;
            match observe::heartbeat_came(&self.ctx.client, &self.cfg.namespace, &awaiting).await {
                Ok(false) => continue,
                Ok(true) => {}
                Err(e) => {
                    tracing::warn!(error = %crate::scrub::scrub(&e.to_string()), "pin window: reading the heartbeats failed; the next run looks again");
                    break;
                }
            }
            tracing::info!("pin window: a first heartbeat came; sweeping");
            self.summary.count("pinWindowSweeps", 1);
            match self.full_sweep().await {
                Ok(swept) => {
                    self.summary.sweep = Some(crate::pass::summary::Sweep::Full);
                    awaiting = swept.awaiting;
                    stopped = swept.stopped;
                    if stopped.is_some() {
                        break;
                    }
                }
                Err(e) => {
                    tracing::warn!(error = %e, "pin window: the sweep failed; the next run sweeps again");
                    break;
                }
            }
        }
        if looks > 0 {
            self.summary.count("pinWindowLooks", looks);
        }
        stopped
    }
}
