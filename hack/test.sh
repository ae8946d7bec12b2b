#!/usr/bin/env bash
# The whole test suite: builds the real servers if they are not cached, starts them once,
# runs every test against them, scans what kbind emitted for the credentials the tests used, and
# stops them (also on failure or Ctrl-C).
#   hack/test.sh                 cargo test
#   hack/test.sh -- <filter>     extra arguments go to the test runner
#   KBIND_TEST_RUNNER=nextest hack/test.sh
set -euo pipefail
cd "$(dirname "$0")/.."

start=$SECONDS
hack/build-servers.sh
echo "test.sh: servers ready after $((SECONDS - start))s"

dir=$(mktemp -d "${TMPDIR:-/tmp}/kbind-testenv.XXXXXX")
cleanup() { hack/testenv.sh down "$dir"; rm -rf "$dir"; }
trap cleanup EXIT
trap 'exit 130' INT TERM
hack/testenv.sh up "$dir"
# shellcheck disable=SC1091
source "$dir/env"

[ "${1:-}" = "--" ] && shift
# Every kbind run's output is kept here for the secret scan after the tests.
export KBIND_TEST_EMIT_DIR=$dir/emitted
mkdir -p "$KBIND_TEST_EMIT_DIR"
t0=$SECONDS
if [ "${KBIND_TEST_RUNNER:-cargo}" = nextest ]; then
  cargo nextest run --all-targets "$@"
else
  cargo test --all-targets "$@"
fi
echo "test.sh: tests took $((SECONDS - t0))s (total $((SECONDS - start))s)"
hack/secret-scan.sh "$dir" "$KBIND_TEST_EMIT_DIR"
hack/deps.sh
