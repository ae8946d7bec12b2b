#!/usr/bin/env bash
# The suite's secret scan (run by hack/test.sh after the tests, while the servers and the real
# node still run):
# everything kbind emitted (each run's stdout and stderr, kept by the tests in $KBIND_TEST_EMIT_DIR),
# and on every cluster (both test clusters, both of the real node's) every object of every listable kind except Secrets (kbind's objects whole,
# annotations included; Leases; the provider copies; APIBindings; Events), searched for the
# credentials the suite used: the apiservers' admin and restricted tokens, the SpiceDB key, the
# tests' Slack/SCIM tokens, and any ServiceAccount token (a JWT), each also in its base64, JSON-
# escaped and leading-part forms. Exits 1 naming what leaked.
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
  # The real node's clusters (hack/node.sh), when it ran: their tokens too.
  [ -n "${KBIND_NODE_DIR:-}" ] && cut -d, -f1 "$KBIND_NODE_DIR"/pki/*-tokens.csv
  [ -n "${KBIND_TEST_SPICEDB_KEY:-}" ] && echo "$KBIND_TEST_SPICEDB_KEY"
  echo "xoxb-test-0000-secret"
  grep -rhoE '"(xox[bpae]-|scim-)[A-Za-z0-9-]{6,}"' tests | tr -d '"' | sort -u
} | awk 'length >= 8' | sort -u >"$scan/secrets"

# Partial and escaped forms: base64 (a value copied into data), JSON-escaped, and the leading
# 16 characters of a long secret (a cut-off echo).
python3 - "$scan/secrets" >"$scan/forms" <<'PY'
import base64, json, sys
out = set()
for line in open(sys.argv[1]):
    s = line.rstrip("\n")
    if not s:
        continue
    out.add(s)
    out.add(base64.b64encode(s.encode()).decode().rstrip("="))
    out.add(json.dumps(s)[1:-1])
    if len(s) >= 24:
        out.add(s[:16])
for f in sorted(out):
    if len(f) >= 8:
        print(f)
PY

clusters="TEST_CONSUMER TEST_PROVIDER"
[ -n "${KBIND_NODE_DIR:-}" ] && clusters+=" NODE_CONSUMER NODE_PROVIDER"
for cluster in $clusters; do
  kc_var=KBIND_${cluster}_KUBECONFIG
  kc=${!kc_var}
  kubectl --kubeconfig "$kc" get events.events.k8s.io -A -o json \
    | python3 -c 'import json,sys
for e in json.load(sys.stdin)["items"]:
    if (e.get("reportingController") or "").startswith("kbind.io/"):
        print(json.dumps(e))' >"$scan/events-$cluster.json"
  # Every listable kind but Secrets (which hold the credentials by design) and Events (above),
  # whole objects: annotations, Leases, provider copies, APIBinding status included.
  kinds=$(kubectl --kubeconfig "$kc" api-resources --verbs=list -o name 2>/dev/null \
    | grep -vE '^(secrets|events|events\.events\.k8s\.io|componentstatuses|tokenreviews\..*|.*reviews\..*)$' || true)
  # One request for all kinds (a kind the cluster cannot list is skipped by kubectl with a warning).
  kubectl --kubeconfig "$kc" get "$(echo $kinds | tr ' ' ',')" -A -o json 2>/dev/null \
    | python3 -c 'import json,sys
text = sys.stdin.read()
for o in (json.loads(text).get("items", []) if text.strip() else []):
    o.get("metadata", {}).pop("managedFields", None)
    print(json.dumps(o))' >"$scan/objects-$cluster.json" || true
done

runs=$(find "$emitted" -type f | wc -l)
events=$(cat "$scan"/events-*.json | wc -l)
objects=$(cat "$scan"/objects-*.json | wc -l)
leaks=0
# One pass over everything for all forms at once; only on a hit, which form and where.
if grep -rqF -f "$scan/forms" "$emitted" "$scan"/events-*.json "$scan"/objects-*.json 2>/dev/null; then
  while IFS= read -r secret; do
    if hits=$(grep -rlF -- "$secret" "$emitted" "$scan"/events-*.json "$scan"/objects-*.json 2>/dev/null); then
      echo "secret-scan: a credential (${secret:0:4}…) appears in: $hits" >&2
      leaks=$((leaks + 1))
    fi
  done <"$scan/forms"
fi
# ServiceAccount tokens are JWTs: none may appear anywhere kbind wrote.
if hits=$(grep -rlE 'eyJhbGciOi[A-Za-z0-9_-]{10,}\.[A-Za-z0-9_-]{10,}\.' "$emitted" "$scan"/events-*.json "$scan"/objects-*.json 2>/dev/null); then
  echo "secret-scan: a JWT appears in: $hits" >&2
  leaks=$((leaks + 1))
fi
echo "secret-scan: $(wc -l <"$scan/secrets") credentials ($(wc -l <"$scan/forms") forms) and any JWT searched in $runs kbind runs' output, $events Events and $objects objects: $leaks found"
[ "$leaks" -eq 0 ]
