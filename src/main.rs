//! The `kbind` command: parses the command line and runs one command through the registry
//! (src/registry.rs).
#![forbid(unsafe_code)]

use std::io::IsTerminal;

use clap::Parser;

use kbind::cli::Cli;
use kbind::pass::args::{LogFormat, LogLevel};

/// `--log-level` sets the level; `RUST_LOG`, when set (and not empty), wins. A `RUST_LOG` that
/// does not parse is reported and `--log-level` used instead.
fn init_logging(format: Option<LogFormat>, level: LogLevel) {
    let mut bad_env = None;
    let filter = match std::env::var("RUST_LOG") {
        Ok(v) if !v.trim().is_empty() => {
            tracing_subscriber::EnvFilter::try_new(&v).unwrap_or_else(|e| {
                bad_env = Some(e.to_string());
                tracing_subscriber::EnvFilter::new(level.filter())
            })
        }
        _ => tracing_subscriber::EnvFilter::new(level.filter()),
    };
    let json = match format {
        Some(LogFormat::Json) => true,
        Some(LogFormat::Text) => false,
        None => !std::io::stderr().is_terminal(),
    };
    // No colour: its escape codes glue a field's name to its value, and the scrub must see the
    // value as a word of its own (src/logging.rs).
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(false)
        .with_writer(kbind::logging::ScrubbedStderr { json });
    if json {
        builder.json().init();
    } else {
        builder.init();
    }
    if let Some(e) = bad_env {
        tracing::warn!(error = %e, level = level.as_str(), "RUST_LOG does not parse; using --log-level");
    }
}

fn main() {
    kbind::logging::scrub_panics();
    let cli = Cli::parse();
    init_logging(cli.common.log_format, cli.common.log_level);
    std::process::exit(kbind::registry::run(cli.common, cli.command));
}
