#!/usr/bin/env bash
# The whole test suite: builds the real servers and the image (hack/image.sh, as root) if they are
# not cached, starts the servers once,
# runs every test against them, scans what kbind emitted for the credentials the tests used, and
# stops them (also on failure or Ctrl-C).
#   hack/test.sh                 cargo test
#   hack/test.sh -- <filter>     extra arguments go to the test runner
#   hack/test.sh --node-only [-- [<filter>] [--nocapture]]   only the tests on the real node
#                                (tests/node.rs); <filter> narrows them to node::<filter>
#   KBIND_TEST_RUNNER=nextest hack/test.sh
# The real node (hack/node.sh: kubelet, containerd, runc in network namespaces of its own) is
# brought up beside the servers for tests/node.rs and torn down after, and the run fails if it
# left anything behind (docs/testing.md "The real node").
# The integration tests that need the servers run only with the feature `servers` (passed below);
# a plain `cargo test` reports them ignored.
set -euo pipefail
cd "$(dirname "$0")/.."
node_only=false
if [ "${1:-}" = "--node-only" ]; then node_only=true; shift; fi

start=$SECONDS
# Disk (docs/testing.md "Disk"): a clean run writes about 4 GiB under target/ and 2 GiB under
# $TMPDIR (servers, the node, the image's podman storage). Say so up front rather than fail
# twenty minutes in with "No space left on device" from the linker.
target=${CARGO_TARGET_DIR:-target}
mkdir -p "$target"
for where in "$target" "${TMPDIR:-/tmp}"; do
  free=$(df -Pk "$where" | awk 'NR == 2 { print int($4 / 1048576) }')
  echo "test.sh: ${free} GiB free for $where"
  if [ "$free" -lt 6 ]; then
    echo "test.sh: warning: less than 6 GiB free for $where; a clean run may run out of disk" >&2
  fi
done
# A one-shot run gains nothing from incremental compilation, which doubles what target/ holds.
if [ -n "${CI:-}" ]; then export CARGO_INCREMENTAL=0; fi
# Style and lints first: a red lint fails in seconds, before any server starts.
cargo fmt --all --check
cargo clippy --quiet --workspace --all-targets -- -D warnings
echo "test.sh: fmt and clippy clean after $((SECONDS - start))s"
# The product holds no test-only code: kbind built as users build it has neither the crash knob
# (feature `crash-points`, enabled only by kbind's dev-dependency on itself) nor the stand-ins of
# crates/kbind-testkit. Features do not depend on the profile, so this debug build has exactly
# the features of `cargo build --release --bin kbind`. (The `cargo test` below puts the test build
# of the binary back in place.)
cargo build --quiet --bin kbind
product=${CARGO_TARGET_DIR:-target}/debug/kbind
for name in KBIND_CRASH_AFTER_WRITES KBIND_CRASH_AT_ITEM kbind_testkit kbind-fake-upstreams; do
  if grep -qaF "$name" "$product"; then
    echo "test.sh: $product contains $name: test-only code is compiled into the product" >&2
    exit 1
  fi
done

hack/node-packages.sh
hack/build-servers.sh --with-kcp
echo "test.sh: servers ready after $((SECONDS - start))s"
# The image ghcr.io/kbind/kbind:<version> in target/image/kbind.tar, from the Dockerfile's final
# stage (tests/image.rs checks it). Not rebuilt while the archive is newer than every input
# (src/, crates/, Cargo.*, Dockerfile, the image scripts); a cold build takes over 10 minutes.
hack/image.sh
echo "test.sh: image ready after $((SECONDS - start))s"

dir=$(mktemp -d "${TMPDIR:-/tmp}/kbind-testenv.XXXXXX")
cleanup() {
  local rc=$?
  hack/node.sh down "$dir/node" || true
  hack/node.sh check "$dir/node" || rc=1
  hack/testenv.sh down "$dir"
  rm -rf "$dir"
  exit $rc
}
trap cleanup EXIT
trap 'exit 130' INT TERM
hack/testenv.sh up "$dir" --kcp
# shellcheck disable=SC1091
source "$dir/env"
KBIND_NODE_IMAGES=target/image/kbind.tar hack/node.sh up "$dir/node"
# shellcheck disable=SC1091
source "$dir/node/env"

[ "${1:-}" = "--" ] && shift

# Every kbind run's output is kept here for the secret scan after the tests.
export KBIND_TEST_EMIT_DIR=$dir/emitted
mkdir -p "$KBIND_TEST_EMIT_DIR"
t0=$SECONDS
# The Slack and SCIM stand-ins' binary, which tests/node.rs runs inside the node's namespace
# (`cargo test` does not build another package's binaries).
cargo build --quiet -p kbind-testkit --bin kbind-fake-upstreams
if $node_only; then
  # The node's tests are the suite's area node:: (docs/testing.md "One test binary"). What
  # follows -- goes to the test binary: a first word that is not a flag narrows the area to
  # node::<word> (`--node-only -- an_issued --nocapture`).
  filter=node::
  if [ $# -gt 0 ] && [ "${1#-}" = "$1" ]; then filter="node::$1"; shift; fi
  cargo test --features kbind/servers --test suite "$filter" -- "$@"
elif [ "${KBIND_TEST_RUNNER:-cargo}" = nextest ]; then
  cargo nextest run --workspace --all-targets --features kbind/servers "$@"
else
  cargo test --workspace --all-targets --features kbind/servers "$@"
fi
echo "test.sh: tests took $((SECONDS - t0))s (total $((SECONDS - start))s)"
# The real node's figures (docs/performance.md "On a real node"), which cargo does not show for
# a test that passed.
[ -f "$dir/node/figures.txt" ] && sed 's/^/test.sh: /' "$dir/node/figures.txt"
echo "test.sh: target/ holds $(du -sh "$target" | cut -f1)"
hack/secret-scan.sh "$dir" "$KBIND_TEST_EMIT_DIR"
hack/deps.sh
