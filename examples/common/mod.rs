//! What every benchmark needs: the harness environment, an admin client, and the real binary
//! run to its one-line JSON summary. Included by each `examples/bench_*.rs` as `mod common;`.
#![allow(dead_code)]

use std::ffi::OsStr;

use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Client, Config};
use serde_json::Value;

/// A variable `hack/bench.sh` sets (from the test servers' env file).
pub fn env(k: &str) -> String {
    std::env::var(k).unwrap_or_else(|_| panic!("{k} unset: run through hack/bench.sh"))
}

/// An admin client for the cluster behind `path`.
pub async fn client(path: &str) -> Client {
    let kc = Kubeconfig::read_from(path).expect("kubeconfig");
    let config = Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default())
        .await
        .expect("config");
    Client::try_from(config).expect("client")
}

/// Run the release `kbind` (`KBIND_BIN`) and return its summary line. Logs go to stderr at
/// `BENCH_LOG` (default `warn`).
pub fn kbind<S: AsRef<OsStr>>(args: &[S]) -> Value {
    let bin = std::env::var("KBIND_BIN").unwrap_or_else(|_| "target/release/kbind".into());
    let out = std::process::Command::new(bin)
        .args(args)
        .env(
            "RUST_LOG",
            std::env::var("BENCH_LOG").unwrap_or_else(|_| "warn".into()),
        )
        .output()
        .expect("run kbind");
    eprint!("{}", String::from_utf8_lossy(&out.stderr));
    let stdout = String::from_utf8_lossy(&out.stdout);
    stdout
        .lines()
        .rev()
        .find_map(|l| serde_json::from_str(l).ok())
        .unwrap_or_else(|| panic!("no summary: {stdout}"))
}
