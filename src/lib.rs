//! kbind: batch reconcilers for cross-cluster API binding, permission-claim upkeep and
//! directory-to-SpiceDB sync, each one bounded pass run as a Kubernetes CronJob.

#![forbid(unsafe_code)]
// No function over 80 lines outside tests (clippy.toml; docs/architecture.md "Layout", Sizes).
#![cfg_attr(not(test), warn(clippy::too_many_lines))]

pub mod api;
pub mod bind;
pub mod bindings;
pub mod claims;
pub mod cli;
pub mod connection;
pub mod crds;
pub mod discovery;
pub mod issue;
pub mod logging;
pub mod pass;
pub mod registry;
pub mod relsync;
pub mod resync;
pub mod schema;
pub mod scrub;
pub mod secrets;
pub mod status;
pub mod uninstall;
pub mod upstream;

/// Install ring as the process-wide rustls provider (reqwest is built without one so only ring
/// is linked). Idempotent.
pub fn install_crypto_provider() {
    let _ = rustls::crypto::ring::default_provider().install_default();
}

static COMMAND: std::sync::OnceLock<&'static str> = std::sync::OnceLock::new();

/// Name the pass (or command) this process runs, for the User-Agent of every client it builds
/// afterwards. First call wins: one process runs one pass.
pub fn set_command(name: &'static str) {
    let _ = COMMAND.set(name);
}

/// `kbind/<version> (<pass>)`: the User-Agent of every client kbind builds (Kubernetes and
/// upstream HTTP), so audit and access logs tell the passes apart (docs/operations.md, "Logs").
pub fn user_agent() -> String {
    format!(
        "kbind/{} ({})",
        env!("CARGO_PKG_VERSION"),
        COMMAND.get().copied().unwrap_or("kbind")
    )
}

/// A one-shot loopback HTTP server for unit tests: answers the first request with `200` and
/// `body` (JSON), and returns the request head it read, to check what a client sent.
#[cfg(test)]
pub(crate) fn record_one_request(body: &'static str) -> (String, std::thread::JoinHandle<String>) {
    use std::io::{Read, Write};
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind loopback");
    let url = format!("http://{}", listener.local_addr().expect("local addr"));
    let server = std::thread::spawn(move || {
        let (mut s, _) = listener.accept().expect("accept");
        let (mut head, mut buf) = (Vec::new(), [0u8; 4096]);
        while !head.windows(4).any(|w| w == b"\r\n\r\n") {
            let n = s.read(&mut buf).expect("read");
            if n == 0 {
                break;
            }
            head.extend_from_slice(&buf[..n]);
        }
        let answer = format!(
            "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
            body.len()
        );
        s.write_all(answer.as_bytes()).expect("write");
        String::from_utf8_lossy(&head).into_owned()
    });
    (url, server)
}

/// The User-Agent header lines of a request head, lower-cased names.
#[cfg(test)]
pub(crate) fn user_agent_lines(head: &str) -> Vec<String> {
    head.lines()
        .filter_map(|l| {
            let (name, value) = l.split_once(':')?;
            name.eq_ignore_ascii_case("user-agent")
                .then(|| value.trim().to_string())
        })
        .collect()
}
