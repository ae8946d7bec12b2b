#!/usr/bin/env bash
# Starts and stops the real servers tests and the demo run against, all on 127.0.0.1:
#   etcd; two kube-apiservers ("consumer", "provider"), each with a kube-controller-manager;
#   SpiceDB (serve-testing for tests, serve with a preshared key for the demo);
#   with --kcp, one `kcp start` (its own embedded etcd) for the claims tests on real workspaces.
#
#   hack/testenv.sh up DIR [--spicedb-mode testing|serve] [--kcp]   start; writes DIR/env (exports)
#   hack/testenv.sh down DIR                                         stop everything started in DIR
#
# DIR/env exports, per cluster C in CONSUMER, PROVIDER:
#   KBIND_TEST_<C>_KUBECONFIG             admin (system:masters)
#   KBIND_TEST_<C>_RESTRICTED_KUBECONFIG  user kbind-restricted, no RBAC until a test grants it
#   KBIND_TEST_<C>_URL
# and KBIND_TEST_SPICEDB_URL (HTTP gateway), KBIND_TEST_SPICEDB_KEY (serve mode only),
# KBIND_TEST_KCP_KUBECONFIG (kcp's admin, at workspace root; --kcp only), and
# KBIND_TEST_PUSHGATEWAY_BIN: the Pushgateway binary, which each test that needs one starts itself
# (a group is per pass and shard, so concurrent tests would share groups in one Pushgateway).
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
usage="usage: $0 up|down DIR [--spicedb-mode testing|serve] [--kcp]"
cmd=${1:-}; dir=${2:-}
[ -n "$cmd" ] && [ -n "$dir" ] || { echo "$usage" >&2; exit 2; }
shift 2
spicedb_mode=testing; with_kcp=false
while [ $# -gt 0 ]; do
  case $1 in
    --spicedb-mode) spicedb_mode=${2:-testing}; shift 2 ;;
    --kcp) with_kcp=true; shift ;;
    *) echo "$usage" >&2; exit 2 ;;
  esac
done

cache=$("$here/build-servers.sh" --print-dir)
ver() { sed -n "s/^$1=//p" "$here/build-servers.sh"; }
KUBE_VERSION=$(ver KUBE_VERSION); ETCD_VERSION=$(ver ETCD_VERSION); SPICEDB_VERSION=$(ver SPICEDB_VERSION)
etcd_bin=$cache/etcd-$ETCD_VERSION
apiserver_bin=$cache/kube-apiserver-$KUBE_VERSION
kcm_bin=$cache/kube-controller-manager-$KUBE_VERSION
spicedb_bin=$cache/spicedb-$SPICEDB_VERSION
pushgateway_bin=$("$here/build-servers.sh" --print-pushgateway)
kcp_bin=$("$here/build-servers.sh" --print-kcp)

log() { echo "testenv: $*" >&2; }

down() {
  [ -f "$dir/pids" ] || return 0
  # Reverse start order: controllers and apiservers before etcd.
  tac "$dir/pids" | while read -r pid name; do
    kill "$pid" 2>/dev/null && log "stopped $name" || true
  done
  sleep 1
  tac "$dir/pids" | while read -r pid _; do kill -9 "$pid" 2>/dev/null || true; done
  rm -f "$dir/pids"
}

if [ "$cmd" = down ]; then down; exit 0; fi
[ "$cmd" = up ] || { echo "usage: $0 up|down DIR" >&2; exit 2; }

bins=("$etcd_bin" "$apiserver_bin" "$kcm_bin" "$spicedb_bin" "$pushgateway_bin")
$with_kcp && bins+=("$kcp_bin")
for b in "${bins[@]}"; do
  [ -x "$b" ] || { echo "testenv: $b is missing: run hack/build-servers.sh (the README test command does)" >&2; exit 1; }
done

mkdir -p "$dir"; : > "$dir/pids"
trap 'rc=$?; if [ $rc -ne 0 ]; then log "start failed; logs in $dir/*.log"; down; fi' EXIT

free_port() {
  python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1]); s.close()'
}

start() { # NAME CMD...
  local name=$1; shift
  "$@" >"$dir/$name.log" 2>&1 &
  echo "$! $name" >> "$dir/pids"
}

wait_for() { # NAME[:STEP] SECONDS CMD...   (the server's log is DIR/NAME.log)
  local name=$1 secs=$2; shift 2
  local deadline=$((SECONDS + secs))
  until "$@" >/dev/null 2>&1; do
    if [ $SECONDS -ge $deadline ]; then
      log "$name not ready after ${secs}s; last log lines:"; tail -n 20 "$dir/${name%%:*}.log" >&2; return 1
    fi
    sleep 0.5
  done
  log "$name ready"
}

# One throw-away CA signs every serving certificate.
pki=$dir/pki; mkdir -p "$pki"
openssl req -x509 -newkey rsa:2048 -nodes -days 2 -subj "/CN=kbind-testenv-ca" \
  -keyout "$pki/ca.key" -out "$pki/ca.crt" 2>/dev/null

serving_cert() { # NAME
  openssl req -newkey rsa:2048 -nodes -subj "/CN=$1" -keyout "$pki/$1.key" -out "$pki/$1.csr" 2>/dev/null
  printf 'subjectAltName=IP:127.0.0.1,DNS:localhost\n' > "$pki/$1.ext"
  openssl x509 -req -in "$pki/$1.csr" -CA "$pki/ca.crt" -CAkey "$pki/ca.key" -CAcreateserial \
    -days 2 -extfile "$pki/$1.ext" -out "$pki/$1.crt" 2>/dev/null
}

kubeconfig() { # FILE URL TOKEN USER
  cat > "$1" <<KC
apiVersion: v1
kind: Config
clusters:
- name: testenv
  cluster:
    server: $2
    certificate-authority-data: $(base64 -w0 "$pki/ca.crt")
users:
- name: $4
  user:
    token: $3
contexts:
- name: testenv
  context: {cluster: testenv, user: $4, namespace: default}
current-context: testenv
KC
}

# kcp first: it takes longest to be ready (its own etcd, then the root workspace's bootstrap), so
# it starts while the rest comes up and is waited for last. Every address it serves or advertises
# (its virtual workspaces' URLs in APIExportEndpointSlices) is 127.0.0.1.
if $with_kcp; then
  kcp_start=$SECONDS
  kcp_port=$(free_port)
  start kcp "$kcp_bin" start --root-directory="$dir/kcp" --bind-address=127.0.0.1 \
    --secure-port="$kcp_port" --external-hostname="127.0.0.1:$kcp_port" \
    --embedded-etcd-client-port="$(free_port)" --embedded-etcd-peer-port="$(free_port)"
fi

etcd_port=$(free_port); etcd_peer=$(free_port)
start etcd "$etcd_bin" --data-dir="$dir/etcd" --name=testenv \
  --listen-client-urls="http://127.0.0.1:$etcd_port" --advertise-client-urls="http://127.0.0.1:$etcd_port" \
  --listen-peer-urls="http://127.0.0.1:$etcd_peer" --initial-advertise-peer-urls="http://127.0.0.1:$etcd_peer" \
  --initial-cluster="testenv=http://127.0.0.1:$etcd_peer" --unsafe-no-fsync=true --log-level=warn
wait_for etcd 30 curl -sf "http://127.0.0.1:$etcd_port/health"

env_file=$dir/env; : > "$env_file"

for cluster in consumer provider; do
  upper=$(echo "$cluster" | tr a-z A-Z)
  port=$(free_port)
  serving_cert "$cluster"
  openssl genrsa -out "$pki/$cluster-sa.key" 2048 2>/dev/null
  admin_token=$(openssl rand -hex 24); restricted_token=$(openssl rand -hex 24)
  printf '%s,kbind-admin,uid-admin,"system:masters"\n%s,kbind-restricted,uid-restricted\n' \
    "$admin_token" "$restricted_token" > "$pki/$cluster-tokens.csv"
  url=https://127.0.0.1:$port
  start "$cluster-apiserver" "$apiserver_bin" \
    --etcd-servers="http://127.0.0.1:$etcd_port" --etcd-prefix="/$cluster" \
    --bind-address=127.0.0.1 --advertise-address=127.0.0.1 --secure-port="$port" \
    --tls-cert-file="$pki/$cluster.crt" --tls-private-key-file="$pki/$cluster.key" \
    --client-ca-file="$pki/ca.crt" --token-auth-file="$pki/$cluster-tokens.csv" \
    --authorization-mode=RBAC --service-cluster-ip-range=10.0.0.0/24 --allow-privileged=true \
    --service-account-issuer="$url" --service-account-key-file="$pki/$cluster-sa.key" \
    --service-account-signing-key-file="$pki/$cluster-sa.key" --api-audiences="$url" \
    --cert-dir="$dir/$cluster-certs"
  kubeconfig "$dir/$cluster-admin.kubeconfig" "$url" "$admin_token" kbind-admin
  kubeconfig "$dir/$cluster-restricted.kubeconfig" "$url" "$restricted_token" kbind-restricted
  {
    echo "export KBIND_TEST_${upper}_URL=$url"
    echo "export KBIND_TEST_${upper}_KUBECONFIG=$dir/$cluster-admin.kubeconfig"
    echo "export KBIND_TEST_${upper}_RESTRICTED_KUBECONFIG=$dir/$cluster-restricted.kubeconfig"
  } >> "$env_file"
  eval "${cluster}_url=$url; ${cluster}_token=$admin_token"
done

for cluster in consumer provider; do
  url_var=${cluster}_url; tok_var=${cluster}_token
  printf 'Authorization: Bearer %s\n' "${!tok_var}" > "$pki/$cluster-admin.header"
  wait_for "$cluster-apiserver" 90 curl -sf --cacert "$pki/ca.crt" -H "@$pki/$cluster-admin.header" "${!url_var}/readyz"
  start "$cluster-controller-manager" "$kcm_bin" \
    --kubeconfig="$dir/$cluster-admin.kubeconfig" --authentication-kubeconfig="$dir/$cluster-admin.kubeconfig" \
    --authorization-kubeconfig="$dir/$cluster-admin.kubeconfig" --bind-address=127.0.0.1 --secure-port="$(free_port)" \
    --leader-elect=false --root-ca-file="$pki/ca.crt" --service-account-private-key-file="$pki/$cluster-sa.key" \
    --use-service-account-credentials=false --controllers='*,-nodeipam,-nodelifecycle,-persistentvolume-binder,-attachdetach,-persistentvolume-expander,-cloud-node-lifecycle,-route,-service,-ttl,-bootstrapsigner,-tokencleaner'
done

grpc=$(free_port); http=$(free_port); ro_grpc=$(free_port); ro_http=$(free_port)
if [ "$spicedb_mode" = serve ]; then
  key=$(openssl rand -hex 16)
  start spicedb "$spicedb_bin" serve --grpc-preshared-key="$key" --datastore-engine=memory \
    --grpc-addr="127.0.0.1:$grpc" --http-enabled --http-addr="127.0.0.1:$http" \
    --metrics-enabled=false --telemetry-endpoint= --skip-release-check --dispatch-cluster-enabled=false
  echo "export KBIND_TEST_SPICEDB_KEY=$key" >> "$env_file"
else
  start spicedb "$spicedb_bin" serve-testing --grpc-addr="127.0.0.1:$grpc" --readonly-grpc-addr="127.0.0.1:$ro_grpc" \
    --http-enabled --http-addr="127.0.0.1:$http" --readonly-http-addr="127.0.0.1:$ro_http"
fi
echo "export KBIND_TEST_SPICEDB_URL=http://127.0.0.1:$http" >> "$env_file"
wait_for spicedb 60 curl -s -o /dev/null "http://127.0.0.1:$http/healthz"

# The controller managers are up once they have created the default ServiceAccount.
for cluster in consumer provider; do
  wait_for "$cluster-controller-manager" 90 kubectl --kubeconfig "$dir/$cluster-admin.kubeconfig" get serviceaccount default -n default
done
if $with_kcp; then
  kcp_admin=$dir/kcp/admin.kubeconfig
  wait_for kcp:readyz 180 sh -c "[ -f '$kcp_admin' ] && kubectl --kubeconfig '$kcp_admin' get --raw /readyz"
  # The root workspace's types exist once the bootstrap is done; tests create workspaces at once.
  wait_for kcp:bootstrap 60 kubectl --kubeconfig "$kcp_admin" get workspacetype universal
  log "kcp ready $((SECONDS - kcp_start))s after its start"
  echo "export KBIND_TEST_KCP_KUBECONFIG=$kcp_admin" >> "$env_file"
fi
kcp_crds=$("$here/build-servers.sh" --print-kcp-crds)
[ -d "$kcp_crds" ] && echo "export KBIND_TEST_KCP_CRDS=$kcp_crds" >> "$env_file"
echo "export KBIND_TEST_PUSHGATEWAY_BIN=$pushgateway_bin" >> "$env_file"
echo "export KBIND_TESTENV_DIR=$dir" >> "$env_file"
trap - EXIT
log "up: source $env_file"
