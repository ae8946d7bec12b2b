#!/usr/bin/env bash
# The suite's secret scan (run by hack/test.sh after the tests, while the servers still run):
# everything kbind emitted (each run's stdout and stderr, kept by the tests in $KBIND_TEST_EMIT_DIR),
# the status of every kbind object and every Event kbind reported on both clusters, searched for
# the credentials the suite used: the apiservers' admin and restricted tokens, the SpiceDB key,
# the tests' Slack/SCIM tokens, and any ServiceAccount token (a JWT). Exits 1 naming what leaked.
#   hack/secret-scan.sh TESTENV_DIR EMIT_DIR
set -euo pipefail
testenv=$1 emitted=$2
# shellcheck disable=SC1091
source "$testenv/env"
scan=$(mktemp -d)
trap 'rm -rf "$scan"' EXIT

# What must never appear. Test constants are listed here as they are written in tests/.
{
  cut -d, -f1 "$testenv"/pki/*-tokens.csv
  [ -n "${KBIND_TEST_SPICEDB_KEY:-}" ] && echo "$KBIND_TEST_SPICEDB_KEY"
  echo "xoxb-test-0000-secret"
  grep -rhoE '"(xox[bpae]-|scim-)[A-Za-z0-9-]{6,}"' tests | tr -d '"' | sort -u
} | awk 'length >= 8' | sort -u >"$scan/secrets"

for cluster in CONSUMER PROVIDER; do
  kc_var=KBIND_TEST_${cluster}_KUBECONFIG
  kc=${!kc_var}
  kubectl --kubeconfig "$kc" get events.events.k8s.io -A -o json \
    | python3 -c 'import json,sys
for e in json.load(sys.stdin)["items"]:
    if (e.get("reportingController") or "").startswith("kbind.io/"):
        print(json.dumps(e))' >"$scan/events-$cluster.json"
  for kind in connections.core.kbind.io clusterbindings.core.kbind.io bindings.core.kbind.io \
      catalogentries.providers.kbind.io relationshipsources.agentprimitives.authzed.com; do
    # A cluster without this CRD has nothing to scan for it.
    kubectl --kubeconfig "$kc" get "$kind" -A -o json 2>/dev/null \
      | python3 -c 'import json,sys
text = sys.stdin.read()
for o in (json.loads(text)["items"] if text.strip() else []):
    print(json.dumps({"name": o["metadata"]["name"], "status": o.get("status")}))' >>"$scan/status-$cluster.json" || true
  done
done

runs=$(find "$emitted" -type f | wc -l)
events=$(cat "$scan"/events-*.json | wc -l)
statuses=$(cat "$scan"/status-*.json | wc -l)
leaks=0
while IFS= read -r secret; do
  if hits=$(grep -rlF -- "$secret" "$emitted" "$scan"/events-*.json "$scan"/status-*.json 2>/dev/null); then
    echo "secret-scan: a credential (${secret:0:4}…) appears in: $hits" >&2
    leaks=$((leaks + 1))
  fi
done <"$scan/secrets"
# ServiceAccount tokens are JWTs: none may appear anywhere kbind wrote.
if hits=$(grep -rlE 'eyJhbGciOi[A-Za-z0-9_-]{10,}\.[A-Za-z0-9_-]{10,}\.' "$emitted" "$scan"/events-*.json "$scan"/status-*.json 2>/dev/null); then
  echo "secret-scan: a JWT appears in: $hits" >&2
  leaks=$((leaks + 1))
fi
echo "secret-scan: $(wc -l <"$scan/secrets") credentials and any JWT searched in $runs kbind runs' output, $events Events and $statuses statuses: $leaks found"
[ "$leaks" -eq 0 ]
