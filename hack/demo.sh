#!/usr/bin/env bash
# The demo: builds what is missing, starts local real servers (two kube-apiservers with etcd and
# controller managers, SpiceDB), applies the config/demo objects, runs every available kbind pass
# once with the real binary, prints the resulting statuses, and stops the servers.
set -euo pipefail
cd "$(dirname "$0")/.."

hack/build-servers.sh
cargo build --quiet --bin kbind
cargo build --quiet -p kbind-testkit --bin kbind-fake-upstreams
target=${CARGO_TARGET_DIR:-$PWD/target}
kbind=$target/debug/kbind

dir=$(mktemp -d "${TMPDIR:-/tmp}/kbind-demo.XXXXXX")
fakes_pid=
cleanup() { [ -n "$fakes_pid" ] && kill "$fakes_pid" 2>/dev/null; hack/testenv.sh down "$dir"; rm -rf "$dir"; }
trap cleanup EXIT
trap 'exit 130' INT TERM
hack/testenv.sh up "$dir" --spicedb-mode serve
# shellcheck disable=SC1091
source "$dir/env"
consumer=(kubectl --kubeconfig "$KBIND_TEST_CONSUMER_KUBECONFIG")
provider=(kubectl --kubeconfig "$KBIND_TEST_PROVIDER_KUBECONFIG")

step() { printf '\n== %s\n' "$*"; }

step "install kbind's CRDs on the consumer, and the job namespaces (kbind-system; kbind-relsync for relsync)"
"$kbind" crds | "${consumer[@]}" apply --server-side -f - >/dev/null
"${consumer[@]}" apply -f deploy/base/namespace.yaml -f deploy/components/directory/namespace.yaml >/dev/null
"${consumer[@]}" wait --for condition=Established crd --all --timeout=60s >/dev/null

step "provider: export an API (label core.kbind.io/exported=true)"
"${provider[@]}" apply -f config/demo/provider.yaml

step "consumer: the provider's kubeconfig as a Secret, a Connection, a ClusterBinding"
"${consumer[@]}" -n kbind-system create secret generic provider-kubeconfig \
  --from-file=kubeconfig="$KBIND_TEST_PROVIDER_KUBECONFIG" >/dev/null
"${consumer[@]}" apply -f config/demo/consumer.yaml

step "kbind schema --dry-run (plans, writes nothing)"
"$kbind" schema --kubeconfig "$KBIND_TEST_CONSUMER_KUBECONFIG" --lease-namespace kbind-system --dry-run

step "kbind schema"
"$kbind" schema --kubeconfig "$KBIND_TEST_CONSUMER_KUBECONFIG" --lease-namespace kbind-system -o text

step "kbind schema again: nothing changed, nothing written"
"$kbind" schema --kubeconfig "$KBIND_TEST_CONSUMER_KUBECONFIG" --lease-namespace kbind-system -o text

step "consumer: a Database in namespace team-a"
"${consumer[@]}" create namespace team-a >/dev/null
cat <<'YAML' | "${consumer[@]}" apply -f -
apiVersion: demo.kbind.io/v1
kind: Database
metadata: {name: orders, namespace: team-a}
spec: {engine: postgres, storageGB: 20}
YAML

step "kbind resync: the spec goes up to the provider"
"$kbind" resync --kubeconfig "$KBIND_TEST_CONSUMER_KUBECONFIG" --lease-namespace kbind-system -o text
"${provider[@]}" get databases -n team-a -L core.kbind.io/consumer-cluster

step "the provider's controller reports status; kbind resync brings it down"
"${provider[@]}" patch database orders -n team-a --subresource=status --type=merge \
  -p '{"status":{"phase":"Ready","endpoint":"orders.db.provider.example:5432"}}' >/dev/null
"$kbind" resync --kubeconfig "$KBIND_TEST_CONSUMER_KUBECONFIG" --lease-namespace kbind-system -o text
"${consumer[@]}" get database orders -n team-a -o jsonpath='consumer sees: phase={.status.phase} endpoint={.status.endpoint}{"\n"}'

step "statuses"
"${consumer[@]}" get connections.core.kbind.io -o wide
"${consumer[@]}" get clusterbindings.core.kbind.io
"${consumer[@]}" get clusterbinding databases -o jsonpath='{range .status.boundAPIs[*]}{.name}: inSync={.inSync} pending={.pending} conflicts={.conflictCount}{"\n"}{end}'
"${consumer[@]}" get crd databases.demo.kbind.io -L core.kbind.io/managed
"${consumer[@]}" get connection demo-provider -o jsonpath='{range .status.conditions[*]}{.type}={.status} ({.reason}){"\n"}{end}'

step "hub (the provider apiserver, single-cluster mode): kcp's CRDs, an export, its catalog entry, two tenants' bindings, team-a's consent"
"$kbind" crds --kcp | "${provider[@]}" apply --server-side -f - >/dev/null
"$kbind" crds | "${provider[@]}" apply --server-side -f - >/dev/null
"${provider[@]}" create namespace kbind-system >/dev/null
"${provider[@]}" wait --for condition=Established crd --all --timeout=60s >/dev/null
"${provider[@]}" apply -f config/demo/claims.yaml
claims=("$kbind" claims --single-cluster --kubeconfig "$KBIND_TEST_PROVIDER_KUBECONFIG" --lease-namespace kbind-system --grant-namespace kbind-system -o text)
show_claims() {
  "${provider[@]}" get apibindings.apis.kcp.io compute-team-a compute-team-b \
    -o jsonpath='{range .items[*]}{.metadata.name}:{range .spec.permissionClaims[*]} {.resource}={.state}{end}{"\n"}{end}'
}

step "kbind claims: own requirement Accepted everywhere, the composition only where consented"
"${claims[@]}"
show_claims

step "the provider grows a requirement (secrets); the next run brings every binding along"
"${provider[@]}" patch catalogentry compute --type=json \
  -p '[{"op":"add","path":"/spec/requires/-","value":{"group":"","resource":"secrets"}}]' >/dev/null
"${claims[@]}"
show_claims
"${provider[@]}" get catalogentry compute -o jsonpath='{range .status.conditions[*]}{.type}={.status} ({.reason}) {.message}{"\n"}{end}'

step "relsync: local Slack and SCIM stand-ins, the SpiceDB schema, two RelationshipSources"
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1]); s.close()'; }
slack_port=$(free_port); scim_port=$(free_port)
"$target/debug/kbind-fake-upstreams" --slack-port "$slack_port" --scim-port "$scim_port" \
  --slack-token xoxb-demo --scim-token scim-demo 2>"$dir/fakes.log" &
fakes_pid=$!
printf '%s' "$KBIND_TEST_SPICEDB_KEY" > "$dir/spicedb.key"
python3 -c 'import json,sys; print(json.dumps({"schema": open(sys.argv[1]).read()}))' config/samples/spicedb-schema.zed |
  curl -sf -X POST -H "Authorization: Bearer $KBIND_TEST_SPICEDB_KEY" "$KBIND_TEST_SPICEDB_URL/v1/schema/write" -d @- >/dev/null
"${consumer[@]}" -n team-a create secret generic directory-tokens \
  --from-literal=slack=xoxb-demo --from-literal=scim=scim-demo >/dev/null
cat <<YAML | "${consumer[@]}" apply -f -
apiVersion: agentprimitives.authzed.com/v1alpha1
kind: AgentIdentity
metadata: {name: directory-sync, namespace: team-a}
spec:
  credentials:
  - {name: slack-bot, secretRef: {name: directory-tokens, key: slack}}
  - {name: scim, secretRef: {name: directory-tokens, key: scim}, allowedHosts: ["127.0.0.1:$scim_port"]}
---
apiVersion: agentprimitives.authzed.com/v1alpha1
kind: RelationshipSource
metadata: {name: slack, namespace: team-a}
spec: {kind: slack, auth: {agentIdentity: directory-sync, credential: slack-bot}}
---
apiVersion: agentprimitives.authzed.com/v1alpha1
kind: RelationshipSource
metadata: {name: onepassword, namespace: team-a}
spec:
  kind: onepassword
  baseURL: http://127.0.0.1:$scim_port
  auth: {agentIdentity: directory-sync, credential: scim}
YAML

step "relsync's identity (deploy/components/directory/relsync-rbac.yaml): its own namespace kbind-relsync, no Secret access anywhere yet"
"${consumer[@]}" apply -f deploy/components/directory/relsync-rbac.yaml >/dev/null
relsync_kc="$dir/relsync.kubeconfig"
cp "$KBIND_TEST_CONSUMER_KUBECONFIG" "$relsync_kc"
kc_user=$(kubectl --kubeconfig "$relsync_kc" config view -o jsonpath='{.contexts[0].context.user}')
kubectl --kubeconfig "$relsync_kc" config set-credentials "$kc_user" \
  --token="$("${consumer[@]}" -n kbind-relsync create token kbind-relsync)" >/dev/null
relsync=("$kbind" relsync --kubeconfig "$relsync_kc" --lease-namespace kbind-relsync
  --spicedb-url "$KBIND_TEST_SPICEDB_URL" --spicedb-token-file "$dir/spicedb.key"
  --slack-api-url "http://127.0.0.1:$slack_port/api" -o text --log-format text)
show_ready() {
  "${consumer[@]}" get relationshipsources -n team-a \
    -o jsonpath='{range .items[*]}{.metadata.name}: {range .status.conditions[?(@.type=="Ready")]}{.status} {.reason}: {.message}{end}{"\n"}{end}'
}

step "kbind relsync as kbind-relsync/kbind-relsync: team-a has not granted it its Secrets"
"${relsync[@]}"
show_ready

step "team-a grants it (deploy/components/directory/relsync-credentials-example.yaml); kbind relsync: memberships into SpiceDB"
"${consumer[@]}" apply -f deploy/components/directory/relsync-credentials-example.yaml >/dev/null
for _ in 1 2 3 4 5 6 7 8 9 10; do
  "${consumer[@]}" auth can-i get secrets -n team-a --as system:serviceaccount:kbind-relsync:kbind-relsync >/dev/null 2>&1 && break
  sleep 0.5
done
"${relsync[@]}"
"${consumer[@]}" get relationshipsources -n team-a
"${consumer[@]}" get relationshipsource slack -n team-a \
  -o jsonpath='slack lastPass: written={.status.sync.lastPass.written} joinMisses={.status.sync.lastPass.joinMisses}{"\n"}'
for t in slack_channel scim_group; do
  curl -sf -X POST -H "Authorization: Bearer $KBIND_TEST_SPICEDB_KEY" "$KBIND_TEST_SPICEDB_URL/v1/relationships/read" \
    -d "{\"consistency\":{\"fullyConsistent\":true},\"relationshipFilter\":{\"resourceType\":\"$t\"}}" |
    python3 -c 'import json,sys
for l in sys.stdin:
    r=json.loads(l)["result"]["relationship"]
    print("  %s:%s#%s@%s:%s" % (r["resource"]["objectType"], r["resource"]["objectId"], r["relation"], r["subject"]["object"]["objectType"], r["subject"]["object"]["objectId"]))'
done

step "kbind relsync again: not due before its interval, nothing written"
"${relsync[@]}"

step "service layer, provider side: the provider component (the issuer's RBAC and the policies confining every issued identity), a second exported API, an Export of it, a Grant for team-b's cluster; kbind issue"
"${provider[@]}" apply -f deploy/base/namespace.yaml -f deploy/components/provider/grants-namespace.yaml \
  -f deploy/components/provider/issue-rbac.yaml >/dev/null
"${provider[@]}" apply -f config/demo/service.yaml
"${provider[@]}" wait --for condition=Established crd caches.demo.kbind.io --timeout=60s >/dev/null
issue=("$kbind" issue --kubeconfig "$KBIND_TEST_PROVIDER_KUBECONFIG" --lease-namespace kbind-system
  --server-url "$KBIND_TEST_PROVIDER_URL" --server-ca-file "$dir/pki/ca.crt" -o text)
"${issue[@]}"
"${provider[@]}" get grants.iam.kbind.io team-b
"${provider[@]}" -n kbind-grants get serviceaccount,secret kbind-grant-team-b

step "the provider admin hands the kubeconfig over (kbind issue --print-kubeconfig); on the consumer, kbind bind"
"$kbind" issue --kubeconfig "$KBIND_TEST_PROVIDER_KUBECONFIG" --print-kubeconfig team-b > "$dir/team-b.kubeconfig"
"$kbind" bind --kubeconfig "$KBIND_TEST_CONSUMER_KUBECONFIG" --provider-kubeconfig "$dir/team-b.kubeconfig" \
  --name caches --apis caches.demo.kbind.io --grant-secret kbind-grants/kbind-grant-team-b -o text
"$kbind" schema --kubeconfig "$KBIND_TEST_CONSUMER_KUBECONFIG" --lease-namespace kbind-system -o text
"${consumer[@]}" wait --for condition=Established crd caches.demo.kbind.io --timeout=60s >/dev/null

step "a Cache on the consumer; resync's heartbeat names the Grant, the issuer pins this consumer cluster, then the Cache syncs"
cat <<'YAML' | "${consumer[@]}" apply -f -
apiVersion: demo.kbind.io/v1
kind: Cache
metadata: {name: sessions, namespace: team-a}
spec: {memoryMB: 256}
YAML
"$kbind" resync --kubeconfig "$KBIND_TEST_CONSUMER_KUBECONFIG" --lease-namespace kbind-system -o text || true
"${issue[@]}"
"${provider[@]}" get grants.iam.kbind.io team-b -o jsonpath='pinned consumer cluster: {.status.consumerCluster}{"\n"}'
# (The apiserver applies the Grant's new pin to the shipped policy a moment after the issuer wrote it.)
for _ in 1 2 3 4 5 6 7 8 9 10; do
  "$kbind" resync --kubeconfig "$KBIND_TEST_CONSUMER_KUBECONFIG" --lease-namespace kbind-system -o text
  "${provider[@]}" get cache sessions -n team-a >/dev/null 2>&1 && break
  sleep 1
done
"${provider[@]}" get caches -n team-a -L core.kbind.io/consumer-cluster

step "rotation: the issuer re-issues (forced: --reissue-before 10m), the consumer's next kbind schema pulls it"
"${issue[@]}" --reissue-before 10m
"$kbind" schema --kubeconfig "$KBIND_TEST_CONSUMER_KUBECONFIG" --lease-namespace kbind-system -o text
"${consumer[@]}" get connection caches -o jsonpath='{range .status.conditions[?(@.type=="CredentialRotation")]}{.type}={.status} ({.reason}){"\n"}{end}'

step "kbind status: every kbind resource on the consumer, read-only (exit 3 if something is not Ready)"
"$kbind" status --kubeconfig "$KBIND_TEST_CONSUMER_KUBECONFIG" || echo "(kbind status exit code $?)"

step "kbind status on the hub: the catalog entry and the consent"
"$kbind" status --kubeconfig "$KBIND_TEST_PROVIDER_KUBECONFIG" || echo "(kbind status exit code $?)"
