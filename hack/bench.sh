#!/usr/bin/env bash
# Benchmarks (not part of the test suite): starts fresh servers, runs one benchmark, stops them.
#   hack/bench.sh schema        (BENCH_CONNECTIONS=50 BENCH_APIS=20 by default)
#   hack/bench.sh resync        (BENCH_OBJECTS=10000 BENCH_APIS=1 by default)
#   hack/bench.sh claims        (BENCH_BINDINGS=5000 by default)
#   hack/bench.sh claims-kcp    (BENCH_WORKSPACES=100 by default; on a real kcp)
#   hack/bench.sh hostile       (peak RSS of kbind schema against hostile provider CRD LIST answers)
#   hack/bench.sh first-sync    (time to first sync under the CronJob schedules: BENCH_PERIOD=10 s ticks, BENCH_SAMPLES=8)
#   hack/bench.sh first-sync-service (the same for a consumer of the service layer, from kbind bind: BENCH_SAMPLES=5)
#   hack/bench.sh relsync       (BENCH_CHANNELS=2000 BENCH_USERS=5000 BENCH_RATE_SCALE=60 BENCH_CONCURRENCY=16 BENCH_PACE=0.9)
# resync, claims and schema also take BENCH_LATENCY (e.g. 5ms: every request kbind and the baselines send
# goes through a loopback proxy adding that delay) and BENCH_CONCURRENCY (default 16: kbind's
# --write-concurrency and the parallel baseline's workers); docs/performance.md has the figures.
# BENCH_PROFILE=debug uses the debug build (no release build needed; slower per request).
# BENCH_KBIND_BIN=<path> measures another kbind binary (e.g. an older build, for a before/after);
# BENCH_BASELINES=none (resync, schema) skips the baselines, for scale runs that measure kbind alone;
# BENCH_SECRETS=per-connection (schema) gives every Connection its own credential.
set -euo pipefail
cd "$(dirname "$0")/.."
what=${1:-schema}
example=bench_${what//-/_}
servers=(); env_flags=()
if [ "$what" = claims-kcp ]; then servers=(--with-kcp); env_flags=(--kcp); fi
hack/build-servers.sh "${servers[@]}"
profile=${BENCH_PROFILE:-release}
case "$profile" in
  release) cargo build --release --quiet --bin kbind --example "$example" ;;
  debug) cargo build --quiet --bin kbind --example "$example" ;;
  *) echo "BENCH_PROFILE: release or debug" >&2; exit 2 ;;
esac
dir=$(mktemp -d "${TMPDIR:-/tmp}/kbind-bench.XXXXXX")
cleanup() { hack/testenv.sh down "$dir"; rm -rf "$dir"; }
trap cleanup EXIT
trap 'exit 130' INT TERM
hack/testenv.sh up "$dir" "${env_flags[@]}"
# shellcheck disable=SC1091
source "$dir/env"
target=${CARGO_TARGET_DIR:-$PWD/target}
KBIND_BIN=${BENCH_KBIND_BIN:-$target/$profile/kbind} "$target/$profile/examples/$example"
