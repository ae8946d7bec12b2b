#!/usr/bin/env bash
# `kbind claims` against a real kcp (v0.31.2, built from Go modules by
# `hack/build-servers.sh --with-kcp`): workspaces, the core export's virtual workspace, per-workspace
# writes, and kcp's own verdict on the claims kbind writes (PermissionClaimsValid). Not part of the
# test suite (a cold kcp build takes ~36 minutes on 2 cores); run it after changing src/claims.
# Exits non-zero on the first failed check.
set -euo pipefail
cd "$(dirname "$0")/.."

hack/build-servers.sh --with-kcp
cargo build --quiet --bin kbind
kbind=$PWD/target/debug/kbind
kcp_bin=$(hack/build-servers.sh --print-kcp)

dir=$(mktemp -d "${TMPDIR:-/tmp}/kbind-kcp.XXXXXX")
read -r port etcd_port peer_port < <(python3 -c 'import socket
s=[socket.socket() for _ in range(3)]
[x.bind(("127.0.0.1",0)) for x in s]
print(*[x.getsockname()[1] for x in s])')
"$kcp_bin" start --root-directory="$dir/root" --secure-port="$port" --bind-address=127.0.0.1 \
  --embedded-etcd-client-port="$etcd_port" --embedded-etcd-peer-port="$peer_port" >"$dir/kcp.log" 2>&1 &
kcp_pid=$!
cleanup() { kill "$kcp_pid" 2>/dev/null || true; wait "$kcp_pid" 2>/dev/null || true; rm -rf "$dir"; }
trap cleanup EXIT
trap 'exit 130' INT TERM

admin=$dir/root/admin.kubeconfig
for _ in $(seq 1 120); do
  [ -f "$admin" ] && kubectl --kubeconfig "$admin" get --raw /readyz >/dev/null 2>&1 && break
  kill -0 "$kcp_pid" 2>/dev/null || { tail -20 "$dir/kcp.log"; exit 1; }
  sleep 1
done
echo "kcp ready on 127.0.0.1:$port"
ws() { kubectl --kubeconfig "$admin" --server "https://127.0.0.1:$port/clusters/$1" "${@:2}"; }
sed "s#/clusters/root\$#/clusters/root:hub#" "$admin" >"$dir/hub.kubeconfig"
fail() { echo "FAIL: $*" >&2; exit 1; }
expect() { # expect WORKSPACE "want" : the compute binding's claims and kcp's PermissionClaimsValid
  local got
  got=$(ws "root:$1" get apibinding compute -o jsonpath='{range .spec.permissionClaims[*]}{.resource}={.state} {end}valid={.status.conditions[?(@.type=="PermissionClaimsValid")].status}')
  [ "$got" = "$2" ] || fail "$1: got '$got', want '$2'"
  echo "ok   $1: $got"
}
claims() {
  "$kbind" claims --kubeconfig "$dir/hub.kubeconfig" --lease-namespace kbind-system \
    --core-export core.kbind.io --core-export-path root:hub --core-binding core \
    --grant-namespace kbind-system -o json
}
binding() { # binding WORKSPACE NAME PATH EXPORT
  printf 'apiVersion: apis.kcp.io/v1alpha2\nkind: APIBinding\nmetadata: {name: %s}\nspec:\n  reference: {export: {path: "%s", name: %s}}\n' \
    "$2" "$3" "$4" | ws "root:$1" apply -f - >/dev/null
}

for w in hub prov storage t1 t2 t3; do
  printf 'apiVersion: tenancy.kcp.io/v1alpha1\nkind: Workspace\nmetadata: {name: %s}\n' "$w" | ws root apply -f - >/dev/null
done
for w in hub prov storage t1 t2 t3; do
  ws root wait --for=jsonpath='{.status.phase}'=Ready "workspace/$w" --timeout=60s >/dev/null
done
"$kbind" crds | ws root:hub apply --server-side -f - >/dev/null
ws root:hub create namespace kbind-system >/dev/null
ws root:hub wait --for condition=Established crd --all --timeout=60s >/dev/null
printf 'apiVersion: apis.kcp.io/v1alpha2\nkind: APIExport\nmetadata: {name: core.kbind.io}\nspec:\n  permissionClaims:\n  - {group: apis.kcp.io, resource: apibindings, verbs: ["get", "list", "watch"]}\n' \
  | ws root:hub apply -f - >/dev/null
printf 'apiVersion: apis.kcp.io/v1alpha2\nkind: APIExport\nmetadata: {name: storage.example.io}\nspec: {}\n' | ws root:storage apply -f - >/dev/null
for _ in $(seq 1 30); do
  hash=$(ws root:storage get apiexport storage.example.io -o jsonpath='{.status.identityHash}')
  [ -n "$hash" ] && break; sleep 1
done
cat <<EOF | ws root:prov apply -f - >/dev/null
apiVersion: apis.kcp.io/v1alpha2
kind: APIExport
metadata: {name: compute.example.io}
spec:
  permissionClaims:
  - {group: "", resource: configmaps, verbs: ["get", "list"]}
  - {group: "", resource: secrets, verbs: ["get"]}
  - {group: storage.example.io, resource: volumes, verbs: ["get", "list"], identityHash: $hash}
EOF
for t in t1 t2; do binding "$t" core root:hub core.kbind.io; done
for t in t1 t2 t3; do binding "$t" compute root:prov compute.example.io; done
catalog() {
  printf 'apiVersion: providers.kbind.io/v1alpha1\nkind: CatalogEntry\nmetadata: {name: compute}\nspec:\n  export: {path: "root:prov", name: compute.example.io}\n  requires:\n%s\n' "$1" \
    | ws root:hub apply -f - >/dev/null
}
catalog '  - {group: "", resource: configmaps}
  - {group: storage.example.io, resource: volumes, provider: storage}'

echo "== one run opens t1 and t2 (core bindings) and reconciles their provider bindings"
claims
expect t1 "configmaps=Accepted volumes=Rejected valid=True"
expect t2 "configmaps=Accepted volumes=Rejected valid=True"
[ -z "$(ws root:t3 get apibinding compute -o jsonpath='{.spec.permissionClaims}')" ] || fail "t3 holds no core binding and must not be touched"
echo "ok   t3: out of scope, untouched"

echo "== the tenant of t2 rejects secrets; the provider then requires secrets"
ws root:t2 patch apibinding compute --type=json -p '[{"op":"add","path":"/spec/permissionClaims/-","value":{"group":"","resource":"secrets","verbs":["get"],"identityHash":"","selector":{"matchAll":true},"state":"Rejected"}}]' >/dev/null
catalog '  - {group: "", resource: configmaps}
  - {group: "", resource: secrets}
  - {group: storage.example.io, resource: volumes, provider: storage}'
claims
expect t1 "configmaps=Accepted volumes=Rejected secrets=Accepted valid=True"
expect t2 "configmaps=Accepted volumes=Rejected secrets=Rejected valid=True"

echo "== t1 records consent to the composition"
t1=$(ws root:t1 get logicalcluster cluster -o jsonpath='{.metadata.annotations.kcp\.io/cluster}')
printf 'apiVersion: tenancy.kbind.io/v1alpha1\nkind: Grant\nmetadata: {name: t1-compute, namespace: kbind-system}\nspec:\n  workspace: %s\n  provider: compute\n  compositions:\n  - {group: storage.example.io, resource: volumes}\n' "$t1" \
  | ws root:hub apply -f - >/dev/null
claims
expect t1 "configmaps=Accepted volumes=Accepted secrets=Accepted valid=True"
expect t2 "configmaps=Accepted volumes=Rejected secrets=Rejected valid=True"

echo "== an unchanged run writes no binding"
out=$(claims)
echo "$out"
echo "$out" | grep -q '"data_writes":0' || fail "unchanged run wrote bindings"
echo "PASS: kbind claims against kcp $("$kcp_bin" --version 2>/dev/null | head -1)"
