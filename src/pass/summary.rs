//! The one line a pass prints when it ends (JSON when stdout is not a terminal), and the list
//! of writes a dry run would make.

use std::collections::BTreeMap;

use serde::Serialize;

use super::args::OutputFormat;

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

#[derive(Clone, Debug, Default, Serialize)]
pub struct Summary {
    pub pass: String,
    /// completed | partial | skipped | dry-run | failed
    pub outcome: String,
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
    /// expired), or an earlier pod of the same Job. Named as the CONTRACT spells it.
    #[serde(rename = "leaseTakenOver", skip_serializing_if = "Option::is_none")]
    pub lease_taken_over: Option<String>,
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

    /// Render for stdout: the asked format, else text on a terminal and one JSON line otherwise.
    pub fn render(&self, format: Option<OutputFormat>, is_tty: bool) -> String {
        let format = format.unwrap_or(if is_tty {
            OutputFormat::Text
        } else {
            OutputFormat::Json
        });
        match format {
            OutputFormat::Json => serde_json::to_string(self).unwrap_or_default(),
            OutputFormat::Yaml => serde_saphyr::to_string(self).unwrap_or_default(),
            OutputFormat::Text => self.render_text(),
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
        s.outcome = "completed".into();
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
        s.outcome = "dry-run".into();
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
}
