#!/usr/bin/env bash
# The dependency check the README test command runs: cargo-deny's licenses, bans and sources,
# offline (deny.toml says what is allowed). cargo-deny is built from crates.io into the same
# cache as the test servers the first time (a few minutes), then reused.
# Advisories need the RustSec database from the network: not checked here.
set -euo pipefail
cd "$(dirname "$0")/.."
CARGO_DENY_VERSION=0.20.2
cache=$(hack/build-servers.sh --print-dir)
root=$cache/cargo-deny-$CARGO_DENY_VERSION
if [ ! -x "$root/bin/cargo-deny" ]; then
  echo "deps: building cargo-deny $CARGO_DENY_VERSION (first time on this machine; minutes)"
  cargo install cargo-deny --version "$CARGO_DENY_VERSION" --locked --root "$root.tmp" --quiet
  mv "$root.tmp" "$root"
fi
# cargo-deny reads `cargo metadata` for every platform, so the crates of targets the build never
# compiled (Windows-only ones, ...) must be in the local registry too: fetch them (crates.io
# only), after which the check itself runs offline.
cargo fetch --locked --quiet
"$root/bin/cargo-deny" --offline --log-level error check licenses bans sources
echo "deps: licenses, bans and sources ok (advisories not checked: no RustSec database offline)"
