//! Log lines are scrubbed where they leave the process, whatever a call site put in a field (an
//! error's text, a URL, a message quoting an upstream's answer): every log line, command error
//! line and panic message written to stderr went through [`crate::scrub`] first
//! (docs/architecture.md "Errors"); clap's usage errors quote only the command line. A field is
//! also bounded, so one huge upstream answer cannot flood the log.

use std::io::Write;

use serde_json::Value;
use tracing_subscriber::fmt::MakeWriter;

/// Longest string a JSON log line keeps per field.
const FIELD_MAX: usize = 2048;
/// Longest text log line.
const LINE_MAX: usize = 8192;

/// stderr, one scrubbed line per event. `json`: the lines are JSON objects (`--log-format json`),
/// scrubbed string by string so each stays valid JSON.
#[derive(Clone, Copy, Debug)]
pub struct ScrubbedStderr {
    pub json: bool,
}

impl<'a> MakeWriter<'a> for ScrubbedStderr {
    type Writer = Line;

    fn make_writer(&'a self) -> Line {
        Line {
            buf: Vec::new(),
            json: self.json,
        }
    }
}

/// One event's formatted output, held until the formatter is done with it (it writes an event
/// in one or more pieces, then drops the writer).
pub struct Line {
    buf: Vec<u8>,
    json: bool,
}

impl Write for Line {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        self.buf.extend_from_slice(b);
        Ok(b.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Drop for Line {
    fn drop(&mut self) {
        if self.buf.is_empty() {
            return;
        }
        let line = scrub_line(&self.buf, self.json);
        // Nowhere to report a failed write to stderr.
        let _ = std::io::stderr().lock().write_all(line.as_bytes());
    }
}

/// A panic's message goes through the scrub too: Rust quotes what it was handling (a string
/// being sliced, an error being unwrapped) in it.
pub fn scrub_panics() {
    std::panic::set_hook(Box::new(|info| {
        let text = crate::scrub::scrub_bounded(&info.to_string(), LINE_MAX);
        // A hook that panicked (stderr gone) would abort the process.
        let _ = writeln!(std::io::stderr().lock(), "kbind panicked: {text}");
    }));
}

/// A command's error line on stderr (`kbind <command>: <error>`), scrubbed and bounded: the one
/// way a command other than a pass's run reports why it failed.
pub fn print_error(command: &str, error: &dyn std::fmt::Display) {
    eprintln!(
        "kbind {command}: {}",
        crate::scrub::scrub_bounded(&error.to_string(), LINE_MAX)
    );
}

/// A formatted log line as it may be printed: scrubbed, bounded, ending in one newline.
pub fn scrub_line(raw: &[u8], json: bool) -> String {
    let text = String::from_utf8_lossy(raw);
    let text = text.trim_end_matches('\n');
    if json && let Ok(mut v) = serde_json::from_str::<Value>(text) {
        scrub_strings(&mut v);
        return format!("{v}\n");
    }
    format!("{}\n", crate::scrub::scrub_bounded(text, LINE_MAX))
}

fn scrub_strings(v: &mut Value) {
    match v {
        Value::String(s) => *s = crate::scrub::scrub_bounded(s, FIELD_MAX),
        Value::Array(a) => a.iter_mut().for_each(scrub_strings),
        Value::Object(o) => o.values_mut().for_each(scrub_strings),
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Whatever a call site logged, the printed line carries no query string, credential field
    /// or registered secret; a JSON line stays one valid JSON object, a huge field is cut.
    #[test]
    fn a_line_is_printed_scrubbed_and_bounded() {
        crate::scrub::register_secret("log-test-secret-9f8e7d");
        let error =
            "GET https://h.example/x?sig=abc\" failed: token=t0ps3cr3t, key log-test-secret-9f8e7d";
        let json = serde_json::json!({"level": "WARN", "fields": {"message": "failed", "error": error, "big": "x".repeat(10_000), "n": 3}});
        let out = scrub_line(format!("{json}\n").as_bytes(), true);
        assert!(
            out.ends_with('\n') && out.matches('\n').count() == 1,
            "{out}"
        );
        let v: Value = serde_json::from_str(&out).expect("still JSON");
        let e = v["fields"]["error"].as_str().unwrap();
        assert!(e.starts_with("GET https://h.example/x"), "{e}");
        for secret in ["sig=abc", "t0ps3cr3t", "log-test-secret-9f8e7d"] {
            assert!(!out.contains(secret), "{secret}: {out}");
        }
        assert_eq!(v["fields"]["n"], 3);
        assert!(v["fields"]["big"].as_str().unwrap().len() <= FIELD_MAX);

        let text = format!("2026-12-05T00:00:00Z  WARN failed error={error}\n");
        let out = scrub_line(text.as_bytes(), false);
        assert!(out.contains("error=GET https://h.example/x"), "{out}");
        for secret in ["sig=abc", "t0ps3cr3t", "log-test-secret-9f8e7d"] {
            assert!(!out.contains(secret), "{secret}: {out}");
        }
        // A value right after its field's name, as the text format prints it.
        let jwt = "eyJhbGciOiJSUzI1NiJ9.eyJzdWIiOiJsb2cifQ.c2lnbmF0dXJlLWxvZw";
        let out = scrub_line(format!("WARN failed error={jwt}\n").as_bytes(), false);
        assert_eq!(out, "WARN failed error=[REDACTED]\n");
        let long = scrub_line("y".repeat(20_000).as_bytes(), false);
        assert!(long.len() <= LINE_MAX + 1 && long.ends_with('\n'));
        // Not JSON after all (a formatter's partial line): scrubbed as text.
        let out = scrub_line(b"{ not json token=abcdef12345", true);
        assert!(!out.contains("abcdef12345"), "{out}");
    }

    /// Pieces written separately make one line, printed once the writer is dropped.
    #[test]
    fn pieces_make_one_line() {
        let mut w = ScrubbedStderr { json: false }.make_writer();
        w.write_all(b"a ").unwrap();
        w.write_all(b"b\n").unwrap();
        assert_eq!(w.buf, b"a b\n");
        w.buf.clear();
    }
}
