//! The pin window (docs/issue.md "Pin window"). A new consumer's first heartbeat is written by
//! its `kbind resync` a few seconds after the tick at which the issuer's own run starts, so a run
//! that only looked once would pin it a whole period later, and the consumer's first writes
//! would be refused until then. With `--pin-window`, once a run has done its work it keeps
//! looking at the heartbeat Leases (one LIST every [`EVERY`]) while an issued Grant waits for
//! its first heartbeat ([`super::plan::sweep::awaits_pin`]), and sweeps at once when one comes.
//! A run with no such Grant ends as before.

use std::time::{Duration, Instant};

use crate::api::iam::Grant;

use super::{Run, observe};

/// How often the window looks.
const EVERY: Duration = Duration::from_secs(2);
/// What a sweep is assumed to take at least (a run between full sweeps has not timed one).
const MIN_SWEEP: Duration = Duration::from_secs(10);

impl Run<'_> {
    /// Follow `awaiting` until none waits, the window ends or the deadline nears (a lost
    /// Lease, SIGTERM). A sweep starts only with time left for two as long as `swept` (the
    /// run's own sweep took that long), or [`MIN_SWEEP`]. The run's work is done before the window: a window
    /// sweep that stops early is logged, and the next run does the rest.
    pub(super) async fn pin_window(&mut self, mut awaiting: Vec<Grant>, swept: Duration) {
        if awaiting.is_empty() {
            return;
        }
        tracing::info!(
            grants = awaiting.len(),
            window = ?self.args.pin_window,
            "pin window: following the Grants waiting for their first heartbeat"
        );
        let end = Instant::now() + self.args.pin_window;
        let mut looks = 0i64;
        while !awaiting.is_empty() {
            if Instant::now() + EVERY >= end || self.ctx.budget.would_cross_deadline(EVERY * 2) {
                break;
            }
            tokio::time::sleep(EVERY).await;
            if self.ctx.budget.check().is_err() {
                break;
            }
            looks += 1;
            match observe::heartbeat_came(&self.ctx.client, &self.cfg.namespace, &awaiting).await {
                Ok(false) => continue,
                Ok(true) => {}
                Err(e) => {
                    tracing::warn!(error = %e, "pin window: reading the heartbeats failed; the next run looks again");
                    break;
                }
            }
            if self
                .ctx
                .budget
                .would_cross_deadline(swept.max(MIN_SWEEP) * 2)
            {
                tracing::info!(
                    "pin window: a first heartbeat came, too near the deadline to sweep; the next run pins it"
                );
                break;
            }
            tracing::info!("pin window: a first heartbeat came; sweeping");
            match self.full_sweep().await {
                Ok(s) => {
                    self.summary.count("pinWindowSweeps", 1);
                    self.summary.counts.remove("unchanged");
                    awaiting = s.awaiting;
                    if let Some(why) = s.stopped {
                        tracing::info!(why = %why, "pin window: its sweep stopped early; the next run continues");
                        break;
                    }
                    // A run with --selector is no full sweep (its Lease records none).
                    if self.args.selector.is_none() {
                        self.summary.sweep = Some(crate::pass::summary::Sweep::Full);
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
    }
}
