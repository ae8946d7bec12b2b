//! The one line a pass prints when it ends (JSON when stdout is not a terminal), and the list
//! of writes a dry run would make.

use std::collections::BTreeMap;

use serde::Serialize;

use super::args::OutputFormat;
use super::writes::Writes;

/// A write the pass would make (dry run) or made.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct PlannedWrite {
    /// create, update, patch, delete, apply-status, …
    pub verb: String,
    /// `Kind namespace/name` or `Kind name`, or an upstream target such as `spicedb`.
    pub target: String,
    /// What changes, in a few words.
    #[serde(skip_serializing_if = "String::is_empty")]
    pub detail: String,
}

/// How a run ended, serialised as the summary line has always spelled it (a user contract:
/// docs/operations.md "Exit codes and the summary line").
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Outcome {
    /// The pass went over everything it owns.
    #[default]
    Completed,
    /// It stopped early (budget, deadline, SIGTERM, lost Lease); the next run continues.
    Partial,
    /// Another run holds the pass Lease.
    Skipped,
    /// `--dry-run`: nothing was written.
    DryRun,
    /// No progress was possible (the exit code says why).
    Failed,
}

impl Outcome {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Completed => "completed",
            Self::Partial => "partial",
            Self::Skipped => "skipped",
            Self::DryRun => "dry-run",
            Self::Failed => "failed",
        }
    }
}

impl std::fmt::Display for Outcome {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Why a pass stopped before going over everything, for [`Summary::finish`].
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Stopped {
    /// The summary message (`stopped early (…); …`).
    pub message: String,
    /// Where the next run resumes, kept in the pass Lease.
    pub resume_after: Option<String>,
}

#[derive(Clone, Debug, Default, Serialize)]
pub struct Summary {
    pub pass: String,
    pub outcome: Outcome,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub message: String,
    pub dry_run: bool,
    /// Data writes: instances, CRDs, binding specs, APIBindings, SpiceDB relationships.
    pub data_writes: u64,
    /// Leases and per-root-object status bookkeeping.
    pub bookkeeping_writes: u64,
    pub requests: u64,
    pub duration_seconds: f64,
    /// Peak resident memory of this process (Linux `VmHWM`), for capacity planning.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub peak_rss_bytes: Option<u64>,
    /// Pass-specific counters (objects seen, conflicts, scopes, …).
    pub counts: BTreeMap<String, i64>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub planned: Vec<PlannedWrite>,
    /// Where the next run resumes, when this one stopped early (kept in the pass Lease).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub resume_after: Option<String>,
    /// The holder whose Lease this run took over: a run that died holding it (the Lease had
    /// expired), or an earlier pod of the same Job. Named as docs/contract.md "A run" spells it.
    #[serde(rename = "leaseTakenOver", skip_serializing_if = "Option::is_none")]
    pub lease_taken_over: Option<String>,
    /// Whether this run reconciled every root object or only what changed, for passes that
    /// sweep fully only now and then (`kbind schema --full-sweep-every`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sweep: Option<Sweep>,
}

/// What a run covered (docs/schema.md "Full sweeps").
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Sweep {
    /// Every root object (of its shard and selector).
    Full,
    /// Only the root objects that changed since they were last reconciled.
    Changed,
}

impl Summary {
    pub fn new(pass: &str, dry_run: bool) -> Self {
        Self {
            pass: pass.into(),
            dry_run,
            ..Default::default()
        }
    }

    pub fn count(&mut self, key: &str, n: i64) {
        *self.counts.entry(key.to_string()).or_default() += n;
    }

    /// The ending every pass writes: the writes it made (or planned, under `--dry-run`), and the
    /// outcome: `partial` with the message and resume cursor when it stopped early, else
    /// `dry-run` or `completed`.
    pub fn finish(&mut self, writes: Writes, stopped: Option<Stopped>) {
        self.outcome = if writes.dry_run() {
            Outcome::DryRun
        } else {
            Outcome::Completed
        };
        self.data_writes = writes.data;
        self.bookkeeping_writes = writes.bookkeeping;
        self.planned = writes.planned;
        if let Some(s) = stopped {
            self.outcome = Outcome::Partial;
            self.message = s.message;
            self.resume_after = s.resume_after;
        }
    }

    /// Render for stdout: the asked format, else text on a terminal and one JSON line otherwise.
    pub fn render(&self, format: Option<OutputFormat>, is_tty: bool) -> String {
        let format = format.unwrap_or(if is_tty {
            OutputFormat::Text
        } else {
            OutputFormat::Json
        });
        // Printed here and nowhere else: its message (a failure's text, a holder's name) is
        // scrubbed here, whatever built it.
        let shown = Self {
            message: crate::scrub::scrub_bounded(&self.message, 1024),
            ..self.clone()
        };
        match format {
            OutputFormat::Json => serde_json::to_string(&shown).unwrap_or_default(),
            OutputFormat::Yaml => serde_saphyr::to_string(&shown).unwrap_or_default(),
            OutputFormat::Text => shown.render_text(),
        }
    }

    fn render_text(&self) -> String {
        let mut out = String::new();
        for w in &self.planned {
            out.push_str(&format!("would {} {}", w.verb, w.target));
            if !w.detail.is_empty() {
                out.push_str(&format!(": {}", w.detail));
            }
            out.push('\n');
        }
        let mut counts: Vec<String> = self
            .counts
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect();
        if let Some(previous) = &self.lease_taken_over {
            counts.push(format!("leaseTakenOver={previous}"));
        }
        out.push_str(&format!(
            "kbind {}: {}{} (data writes {}, bookkeeping writes {}, requests {}, {:.1}s){}",
            self.pass,
            self.outcome,
            if self.message.is_empty() {
                String::new()
            } else {
                format!(": {}", self.message)
            },
            self.data_writes,
            self.bookkeeping_writes,
            self.requests,
            self.duration_seconds,
            if counts.is_empty() {
                String::new()
            } else {
                format!(" {}", counts.join(" "))
            },
        ));
        out
    }
}

/// This process's peak resident set size, where the OS tells it (Linux).
pub fn peak_rss_bytes() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb * 1024)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_when_not_a_terminal() {
        let mut s = Summary::new("schema", false);
        s.outcome = Outcome::Completed;
        s.count("connections", 2);
        let line = s.render(None, false);
        let v: serde_json::Value = serde_json::from_str(&line).unwrap();
        assert_eq!(v["counts"]["connections"], 2);
        assert!(!line.contains('\n'));
        let text = s.render(None, true);
        assert_eq!(
            s.render(Some(OutputFormat::Text), false),
            text,
            "an explicit format wins"
        );
        assert!(text.starts_with("kbind schema: completed"), "{text}");
        assert!(text.contains("connections=2"));
        assert!(
            v.get("leaseTakenOver").is_none(),
            "only when taken over: {line}"
        );
        s.lease_taken_over = Some("kbind-resync-1/pod-a".into());
        let v: serde_json::Value = serde_json::from_str(&s.render(None, false)).unwrap();
        assert_eq!(v["leaseTakenOver"], "kbind-resync-1/pod-a");
        assert!(
            s.render(None, true)
                .ends_with(" leaseTakenOver=kbind-resync-1/pod-a"),
            "{}",
            s.render(None, true)
        );
    }

    #[test]
    fn dry_run_lists_planned_writes() {
        let mut s = Summary::new("resync", true);
        s.outcome = Outcome::DryRun;
        s.planned.push(PlannedWrite {
            verb: "create".into(),
            target: "Widget a/b".into(),
            detail: "spec".into(),
        });
        assert!(
            s.render(Some(OutputFormat::Text), false)
                .starts_with("would create Widget a/b: spec\n")
        );
        let y = s.render(Some(OutputFormat::Yaml), false);
        assert!(y.contains("verb: create"), "{y}");
    }

    #[test]
    fn outcomes_keep_their_spelling() {
        for (o, want) in [
            (Outcome::Completed, "completed"),
            (Outcome::Partial, "partial"),
            (Outcome::Skipped, "skipped"),
            (Outcome::DryRun, "dry-run"),
            (Outcome::Failed, "failed"),
        ] {
            assert_eq!(serde_json::to_value(o).unwrap(), want);
            assert_eq!(o.to_string(), want);
            let mut s = Summary::new("schema", false);
            s.outcome = o;
            let v: serde_json::Value = serde_json::from_str(&s.render(None, false)).unwrap();
            assert_eq!(v["outcome"], want);
        }
    }

    #[test]
    fn finish_says_partial_when_stopped_even_in_a_dry_run() {
        let mut s = Summary::new("resync", true);
        let mut w = Writes::new(true);
        assert!(!w.will("create", "Widget a/b", ""));
        s.finish(w, None);
        assert_eq!(s.outcome, Outcome::DryRun);
        assert_eq!(s.planned.len(), 1);
        let mut w = Writes::new(false);
        w.data_done();
        let stop = Stopped {
            message: "stopped early (MaxItems); the next run continues".into(),
            resume_after: Some("x".into()),
        };
        s.finish(w, Some(stop));
        assert_eq!(
            (s.outcome, s.data_writes, s.resume_after.as_deref()),
            (Outcome::Partial, 1, Some("x"))
        );
    }
}
