//! The `kbind` command: parses the command line and runs one pass.
#![forbid(unsafe_code)]

use std::io::IsTerminal;

use clap::Parser;

use kbind::cli::{Cli, Command};
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
    // Colour only on a terminal: `--log-format=text` in a pod or a file must stay plain text.
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::stderr().is_terminal())
        .with_writer(std::io::stderr);
    if json {
        builder.json().init();
    } else {
        builder.init();
    }
    if let Some(e) = bad_env {
        tracing::warn!(error = %e, level = level.as_str(), "RUST_LOG does not parse; using --log-level");
    }
}

fn block_on<F: std::future::Future<Output = i32>>(f: F) -> i32 {
    match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt.block_on(f),
        Err(e) => {
            eprintln!("kbind: cannot start the async runtime: {e}");
            1
        }
    }
}

fn main() {
    let cli = Cli::parse();
    init_logging(cli.common.log_format, cli.common.log_level);
    let code = match cli.command {
        Command::Resync(args) => {
            block_on(kbind::pass::run(kbind::resync::PASS, cli.common, |ctx| {
                kbind::resync::run(ctx, args)
            }))
        }
        Command::Schema(args) => {
            block_on(kbind::pass::run(kbind::schema::PASS, cli.common, |ctx| {
                kbind::schema::run(ctx, args)
            }))
        }
        Command::Claims(args) => match args.command.clone() {
            Some(kbind::claims::args::ClaimsCommand::Export { entry, hub }) => {
                kbind::set_command(kbind::claims::PASS);
                block_on(kbind::claims::export::run(cli.common, entry, hub))
            }
            None => block_on(kbind::pass::run(kbind::claims::PASS, cli.common, |ctx| {
                kbind::claims::run(ctx, *args)
            })),
        },
        Command::Relsync(args) => {
            block_on(kbind::pass::run(kbind::relsync::PASS, cli.common, |ctx| {
                kbind::relsync::run(ctx, *args)
            }))
        }
        Command::Issue(args) => match args.print_kubeconfig.clone() {
            Some(grant) => block_on(kbind::issue::print_kubeconfig(cli.common, grant)),
            None => block_on(kbind::pass::run(kbind::issue::PASS, cli.common, |ctx| {
                kbind::issue::run(ctx, args)
            })),
        },
        Command::Status(args) => block_on(kbind::status::run(cli.common, args)),
        Command::Crds { kcp } => {
            let crds = if kcp {
                kbind::crds::kcp_crds()
            } else {
                kbind::crds::kbind_crds()
            };
            match kbind::crds::to_yaml(&crds) {
                Ok(y) => {
                    use std::io::Write;
                    // A closed pipe (`| head`) is not an error worth a panic.
                    let _ = std::io::stdout().write_all(y.as_bytes());
                    0
                }
                Err(e) => {
                    eprintln!("kbind crds: {e}");
                    1
                }
            }
        }
        Command::Bind(args) => block_on(kbind::bind::run(cli.common, *args)),
        Command::Uninstall(args) => block_on(kbind::uninstall::run(cli.common, args)),
        Command::Version => {
            println!("kbind {}", env!("CARGO_PKG_VERSION"));
            0
        }
    };
    std::process::exit(code);
}
