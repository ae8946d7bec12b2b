#!/usr/bin/env bash
# Crash and fault soak (not part of the suite).
# - schema|resync|claims|relsync: the crash-point tests with any number of points. Each pass's
#   tests abort a run after N random data writes (the crash knob) or send it SIGKILL/SIGTERM after
#   a random delay, rerun it, and compare the final state with that of an uninterrupted run.
# - faults: tests/faults.rs N times, each with its own fault sequence: every pass behind fault
#   proxies at a 5% rate until it converges on the unfaulted result.
# - model: tests/model.rs with N random seeds (docs/testing.md): random sequences of user and
#   world actions and (killed) runs, checked against the reference model after every step.
# Starts and stops the servers as hack/test.sh does, then prints one figure line per pass.
#   hack/soak.sh [--count N] [--steps N] [--pass schema|resync|claims|relsync|faults|model|all] [--seed S]
#     --count  points per crash test and signal, rounds of the fault tests, or seeds of the model
#              test (default 20; the suite tries every write of a cold run, one moment per
#              signal, one fault round, three fixed model seeds)
#     --steps  model only (implies --pass model): N random steps in all, half in schema/resync
#              sequences and half in relsync ones, seeds drawn from the soak's seed on until each
#              half is reached; prints steps, kbind runs, kills, violations (failing sequences,
#              each with its replay lines), wall time and where the time went
#     --seed   replay a soak run (every run prints its seed)
set -euo pipefail
cd "$(dirname "$0")/.."

count=20 steps= pass= seed=${KBIND_SOAK_SEED:-$(date +%s%N)}
while [ $# -gt 0 ]; do
  case $1 in
    --count) count=$2; shift 2 ;;
    --steps) steps=$2; shift 2 ;;
    --pass) pass=$2; shift 2 ;;
    --seed) seed=$2; shift 2 ;;
    *) echo "usage: $0 [--count N] [--steps N] [--pass schema|resync|claims|relsync|faults|model|all] [--seed S]" >&2; exit 2 ;;
  esac
done
if [ -n "$steps" ]; then
  [[ $steps =~ ^[1-9][0-9]*$ ]] || { echo "soak: --steps must be a positive integer" >&2; exit 2; }
  [ -z "$pass" ] || [ "$pass" = model ] || { echo "soak: --steps is for --pass model only" >&2; exit 2; }
  pass=model
fi
pass=${pass:-all}
case $pass in
  all) passes="schema resync claims relsync faults model" ;;
  schema|resync|claims|relsync|faults|model) passes=$pass ;;
  *) echo "soak: unknown pass $pass" >&2; exit 2 ;;
esac
[[ $count =~ ^[1-9][0-9]*$ ]] || { echo "soak: --count must be a positive integer" >&2; exit 2; }

hack/build-servers.sh
dir=$(mktemp -d "${TMPDIR:-/tmp}/kbind-soak.XXXXXX")
cleanup() { hack/testenv.sh down "$dir"; rm -rf "$dir"; }
trap cleanup EXIT
trap 'exit 130' INT TERM
hack/testenv.sh up "$dir"
# shellcheck disable=SC1091
source "$dir/env"
export KBIND_TEST_EMIT_DIR=$dir/emitted KBIND_SOAK_COUNT=$count KBIND_SOAK_SEED=$seed
mkdir -p "$KBIND_TEST_EMIT_DIR"
if [ -n "$steps" ]; then
  echo "soak: model: $steps random steps, KBIND_SOAK_SEED=$seed"
else
  echo "soak: $count points per crash test and signal (or fault rounds, or model seeds), KBIND_SOAK_SEED=$seed"
fi

rc=0
for p in $passes; do
  if [ "$p" = faults ]; then
    for i in $(seq 1 "$count"); do
      KBIND_FAULT_SEED=$((seed + i)) cargo test --features servers --test suite faults:: -- --nocapture 2>&1 \
        | tee -a "$dir/faults.log" || rc=1
    done
    continue
  fi
  if [ "$p" = model ] && [ -n "$steps" ]; then
    # Seeds seed+1, seed+2, ... until each half of the steps is reached; the wall time is the
    # tests' own (built first).
    cargo test --features servers --test suite --no-run
    started=$(date +%s)
    KBIND_MODEL_TOTAL_STEPS=$steps KBIND_MODEL_SEED_BASE=$seed \
      cargo test --features servers --test suite model:: -- --nocapture 2>&1 | tee "$dir/model.log" || rc=1
    model_wall=$(($(date +%s) - started))
    continue
  fi
  if [ "$p" = model ]; then
    # Seeds seed+1 .. seed+N; each failing seed prints its own replay line.
    seeds=$(seq -s, $((seed % 1000000000 + 1)) $((seed % 1000000000 + count)))
    KBIND_MODEL_SEEDS=$seeds cargo test --features servers --test suite model:: -- --nocapture 2>&1 \
      | tee "$dir/model.log" || rc=1
    continue
  fi
  # Every crash-point test of a pass has "killed" in its name; --nocapture shows the figures.
  # The tests are modules of one binary (docs/testing.md "One test binary"): list the pass's.
  if ! cargo test --features servers --test suite --no-run; then
    rc=1
    continue
  fi
  mapfile -t killed < <(cargo test --features servers --test suite -- --list 2>/dev/null \
    | sed -n "s/^\($p::.*killed.*\): test\$/\1/p")
  if [ "${#killed[@]}" -eq 0 ]; then
    echo "soak.sh: no crash-point test of $p (a test named $p::…killed…)" >&2
    rc=1
    continue
  fi
  cargo test --features servers --test suite -- --exact --nocapture "${killed[@]}" 2>&1 \
    | tee "$dir/$p.log" || rc=1
done
hack/secret-scan.sh "$dir" "$KBIND_TEST_EMIT_DIR" || rc=1

if [[ " $passes " == *" faults "* ]]; then
  awk -v rounds="$count" '
    /^fault-figures / {
      for (i = 2; i <= NF; i++) {
        split($i, kv, "=")
        if (kv[1] == "test") t = kv[2]
        else if (kv[1] == "runs") runs[t] += kv[2]
        else if (kv[1] == "requests") req[t] += kv[2]
        else if (kv[1] == "injected") inj[t] += kv[2]
        else { kind[kv[1]] += kv[2] }
      }
      conv[t]++
    }
    END {
      # A round converges only when its final state equals the unfaulted one: nothing lost.
      for (t in conv)
        printf "soak: faults %s: rounds %d, converged %d, kbind runs %d, requests %d, faults injected %d, data lost %s\n", t, rounds, conv[t], runs[t], req[t], inj[t], (conv[t] == rounds ? "0" : "unknown in rounds that failed (see above)")
      line = "soak: faults by kind:"
      for (k in kind) line = line " " k "=" kind[k]
      print line
    }' "$dir/faults.log"
fi
if [[ " $passes " == *" model "* ]] && [ -n "$steps" ]; then
  awk -v wall="${model_wall:-0}" '
    /^model-soak / {
      delete g
      for (i = 2; i <= NF; i++) { split($i, kv, "="); g[kv[1]] = kv[2] }
      st[g["kind"]] = g["steps"]; n++
      steps += g["steps"]; runs += g["runs"]; killed += g["killed"]
      viol += g["violations"]; secs += g["secs"]
      for (x in g) if (x ~ /^t_/) t[substr(x, 3)] += g[x]
    }
    END {
      if (n < 2) { print "soak: model: no totals (a test did not finish; see above)"; exit }
      printf "soak: model: steps %d (schema/resync %d, relsync %d), kbind runs %d, killed %d, violations %d, wall %d s\n", steps, st["schema/resync"], st["relsync"], runs, killed, viol, wall
      line = "soak: model: where the time went (both tests, " sprintf("%.0f", secs) " s):"
      for (k in t) line = line sprintf(" %s %.0f s (%.0f%%)", k, t[k], 100 * t[k] / secs)
      print line
    }' "$dir/model.log"
  # Each failure is printed as it happens and again in the test's closing message: once each.
  grep -E '^(replay|shrunk)' "$dir/model.log" | awk '!seen[$0]++' | sed 's/^/soak: model: /' || true
  [ "$(grep -c '^model-soak ' "$dir/model.log")" = 2 ] || rc=1
elif [[ " $passes " == *" model "* ]]; then
  awk '
    /^model-figures / {
      t = ($2 == "relsync") ? "relsync" : "schema/resync"
      for (i = 2; i <= NF; i++) { split($i, kv, "="); f[kv[1]] = kv[2] }
      total++; n[t]++; steps[t] += f["steps"]; runs[t] += f["runs"]; killed[t] += f["killed"]
      if (f["result"] == "ok") ok[t]++; else failed[t] = failed[t] " " f["seed"] "(" f["check"] ")"
      delete f
    }
    END {
      if (total == 0) { print "soak: model: no figures (the test did not finish; see above)"; exit }
      for (t in n)
        printf "soak: model %s: seeds %d, passed %d, steps %d, kbind runs %d, killed %d%s\n", t, n[t], ok[t], steps[t], runs[t], killed[t], (failed[t] == "" ? "" : ", failed:" failed[t])
    }' "$dir/model.log"
  grep -q '^model-figures ' "$dir/model.log" || rc=1
fi
passes=${passes/faults/}
for p in ${passes/model/}; do
  awk -v pass="$p" '
    /^crash-figures / {
      for (i = 2; i <= NF; i++) { split($i, kv, "="); f[kv[1]] = kv[2] }
      tried += f["tried"]; converged += f["converged"]; lost += f["data_lost"]; n++
    }
    END {
      if (n == 0) { printf "soak: %s: no figures (the tests did not finish; see above)\n", pass; exit }
      printf "soak: %s: crash points tried %d, converged %d, data lost %d\n", pass, tried, converged, lost
    }' "$dir/$p.log"
  grep -q '^crash-figures ' "$dir/$p.log" || rc=1
done
exit $rc
