#!/usr/bin/env bash
# The real node: two small Kubernetes clusters ("consumer" and "provider"), each with one Ready
# node (kubelet + containerd + runc + the CNI bridge) that runs real Pods, for the tests that
# install kbind's manifests and run its CronJobs (tests/node.rs; docs/testing.md "The real node").
#
#   hack/node.sh up DIR      start; writes DIR/env (shell exports); prints the bring-up time
#   hack/node.sh down DIR    stop everything started in DIR and remove what it left
#   hack/node.sh check DIR   exit 1 naming any process, mount, cgroup or namespace left behind
#
# Everything runs inside network namespaces this script creates, one per node, joined by one
# veth pair and linked to nothing else: no default route, DNS pointed at an address where nothing
# listens. Each node's namespace holds its etcd, kube-apiserver (on :443 of the node IP and of the
# `kubernetes` Service IP, so Pods reach it without kube-proxy), controller manager, scheduler,
# containerd and kubelet, and the Pods. Tests and kubectl reach the servers through loopback
# forwarders (hack/netns-forward.py). Each node also has a private mount namespace (tmpfs on /run,
# its own /var/log and /etc/resolv.conf), so every mount containerd and kubelet make goes with it.
# The consumer node's namespace also holds the servers its Pods talk to besides the provider:
# SpiceDB and a Pushgateway (DIR/env names them).
#
# Needs: the server cache (hack/build-servers.sh: kubelet and kube-scheduler too), containerd,
# runc and containernetworking-plugins (hack/node-packages.sh installs them), root, nsenter,
# unshare, ip, musl-gcc (the pause image).
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
cmd=${1:-}; dir=${2:-}
[ -n "$cmd" ] && [ -n "$dir" ] || { echo "usage: $0 up|down|check DIR" >&2; exit 2; }

log() { echo "node: $*" >&2; }

cache=$("$here/build-servers.sh" --print-dir)
ver() { sed -n "s/^$1=//p" "$here/build-servers.sh"; }
KUBE_VERSION=$(ver KUBE_VERSION); ETCD_VERSION=$(ver ETCD_VERSION); SPICEDB_VERSION=$(ver SPICEDB_VERSION)

NODES="consumer provider"
# Node IPs on the link between the two namespaces, Pod CIDRs, and the Service range (the same in
# both clusters: each namespace has its own 10.96.0.1).
declare -A NODE_IP=([consumer]=10.250.0.10 [provider]=10.250.0.20)
declare -A POD_CIDR=([consumer]=10.244.0.0/24 [provider]=10.244.1.0/24)
declare -A POD_GW=([consumer]=10.244.0.1 [provider]=10.244.1.1)
SERVICE_CIDR=10.96.0.0/16 SERVICE_IP=10.96.0.1 DNS_IP=10.96.0.10
PAUSE_IMAGE=kbind.local/pause:3.10
# kubelet with protectKernelDefaults checks these instead of rewriting them; inside the node's
# mount namespace it reads files with the values it expects, the machine's stay untouched.
declare -A KERNEL_DEFAULTS=([vm/overcommit_memory]=1 [vm/panic_on_oom]=0 [kernel/panic]=10
  [kernel/panic_on_oops]=1 [kernel/keys/root_maxkeys]=1000000 [kernel/keys/root_maxbytes]=25000000)

holder_pid() { cat "$dir/$1/holder.pid" 2>/dev/null || true; }
in_node() { # NODE CMD...: run CMD in the node's network and mount namespaces
  local pid; pid=$(holder_pid "$1"); shift
  nsenter -t "$pid" --net --mount -- "$@"
}
cgroup_root() { echo "kbind-node-$1-$(basename "$dir")"; }
cgroup_controllers() { # the v1 hierarchies (hybrid mode) and the unified one
  awk '$3 == "cgroup" || $3 == "cgroup2" {print $2}' /proc/self/mounts
}

# ---------------------------------------------------------------------------------------------
down() {
  [ -d "$dir" ] || return 0
  local node pid
  # Servers first (they would restart Pods), in reverse start order, then every Pod and shim,
  # then the holders: with their last process gone the namespaces and their mounts go too.
  if [ -f "$dir/pids" ]; then
    tac "$dir/pids" | while read -r pid name; do kill "$pid" 2>/dev/null && log "stopped $name" || true; done
    sleep 1
    tac "$dir/pids" | while read -r pid _; do kill -9 "$pid" 2>/dev/null || true; done
  fi
  for node in $NODES; do kill_cgroup_tree "$node"; done
  kill_namespace_members
  for node in $NODES; do
    pid=$(holder_pid "$node")
    [ -n "$pid" ] && kill -9 "$pid" 2>/dev/null || true
  done
  sleep 0.5
  for node in $NODES; do remove_cgroups "$node"; done
  rm -f "$dir/pids"
}

# Every process in the node's cgroup tree (the Pods' containers), in every hierarchy.
kill_cgroup_tree() {
  local node=$1 ctl root
  root=$(cgroup_root "$node")
  for _ in 1 2 3; do
    for ctl in $(cgroup_controllers); do
      [ -d "$ctl/$root" ] || continue
      find "$ctl/$root" -name cgroup.procs -exec cat {} + 2>/dev/null | xargs -r kill -9 2>/dev/null || true
    done
    sleep 0.2
  done
}

# Every process left in the nodes' namespaces but their holders (containerd's shims detach from
# the servers that started them), found by the namespaces recorded at `up`.
is_holder() { local node; for node in $NODES; do [ "$1" = "$(holder_pid "$node")" ] && return 0; done; return 1; }
kill_namespace_members() {
  [ -f "$dir/namespaces" ] || return 0
  local p ns kind
  for p in /proc/[0-9]*; do
    is_holder "${p#/proc/}" && continue
    for kind in net mnt; do
      ns=$(readlink "$p/ns/$kind" 2>/dev/null) || continue
      grep -qxF "$ns" "$dir/namespaces" && kill -9 "${p#/proc/}" 2>/dev/null || true
    done
  done
}

remove_cgroups() {
  local node=$1 ctl root
  root=$(cgroup_root "$node")
  for ctl in $(cgroup_controllers); do
    [ -d "$ctl/$root" ] || continue
    find "$ctl/$root" -depth -type d -exec rmdir {} + 2>/dev/null || true
  done
}

check() {
  local bad=0 node ctl root p pid
  for node in $NODES; do
    root=$(cgroup_root "$node")
    for ctl in $(cgroup_controllers); do
      [ -d "$ctl/$root" ] && { echo "node: left behind: cgroup $ctl/$root" >&2; bad=1; }
    done
  done
  if [ -f "$dir/namespaces" ]; then
    while read -r ns; do
      for p in /proc/[0-9]*; do
        for kind in net mnt; do
          [ "$(readlink "$p/ns/$kind" 2>/dev/null)" = "$ns" ] || continue
          echo "node: left behind: process ${p#/proc/} ($(tr '\0' ' ' < "$p/cmdline" | cut -c1-80)) in $ns" >&2
          bad=1
        done
      done
    done < "$dir/namespaces"
  fi
  if grep -qF " $dir" /proc/self/mountinfo; then
    echo "node: left behind: mounts under $dir:" >&2; grep -F " $dir" /proc/self/mountinfo >&2; bad=1
  fi
  for p in $(pgrep -f 'containerd-shim|kubelet|netns-forward' || true); do
    if tr '\0' ' ' < "/proc/$p/cmdline" 2>/dev/null | grep -qF "$dir"; then
      echo "node: left behind: process $p" >&2; bad=1
    fi
  done
  [ $bad = 0 ] && log "nothing left behind"
  return $bad
}

case $cmd in
  down) down; exit 0 ;;
  check) check; exit $? ;;
  up) ;;
  *) echo "usage: $0 up|down|check DIR" >&2; exit 2 ;;
esac

# ---------------------------------------------------------------------------------------------
# up
t0=$(date +%s.%N)
[ "$(id -u)" = 0 ] || { echo "node: needs root (network and mount namespaces, cgroups)" >&2; exit 1; }
need() { [ -x "$1" ] || { echo "node: $1 is missing: $2" >&2; exit 1; }; }
for b in etcd-$ETCD_VERSION kube-apiserver-$KUBE_VERSION kube-controller-manager-$KUBE_VERSION \
  kube-scheduler-$KUBE_VERSION kubelet-$KUBE_VERSION spicedb-$SPICEDB_VERSION; do
  need "$cache/$b" "run hack/build-servers.sh (the README test command does)"
done
for b in /usr/bin/containerd /usr/sbin/runc /usr/bin/ctr /usr/lib/cni/bridge /usr/lib/cni/host-local /usr/lib/cni/loopback; do
  need "$b" "run hack/node-packages.sh (the README test command does)"
done
runc=$(command -v runc)

mkdir -p "$dir"; : > "$dir/pids"; : > "$dir/namespaces"
trap 'rc=$?; if [ $rc -ne 0 ]; then log "start failed; logs in $dir/*/*.log"; down; fi' EXIT

start() { # NAME NODE CMD...: a server inside NODE's namespaces (nsenter execs it: $! is its pid)
  local name=$1 node=$2 pid; shift 2
  pid=$(holder_pid "$node")
  nsenter -t "$pid" --net --mount -- "$@" >"$dir/$node/$name.log" 2>&1 &
  echo "$! $node-$name" >> "$dir/pids"
}
wait_for() { # WHAT SECONDS CMD...
  local what=$1 secs=$2; shift 2
  local deadline=$((SECONDS + secs))
  until "$@" >/dev/null 2>&1; do
    if [ $SECONDS -ge $deadline ]; then log "$what not ready after ${secs}s"; return 1; fi
    sleep 0.3
  done
}
free_port() {
  python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1]); s.close()'
}

# One throw-away CA for both clusters and every server in the namespaces.
pki=$dir/pki; mkdir -p "$pki"
openssl req -x509 -newkey rsa:2048 -nodes -days 2 -subj "/CN=kbind-node-ca" \
  -keyout "$pki/ca.key" -out "$pki/ca.crt" 2>/dev/null
cert() { # NAME CN SANS [O]
  local subj="/CN=$2"; [ -n "${4:-}" ] && subj="/O=$4$subj"
  openssl req -newkey rsa:2048 -nodes -subj "$subj" -keyout "$pki/$1.key" -out "$pki/$1.csr" 2>/dev/null
  printf 'subjectAltName=%s\n' "$3" > "$pki/$1.ext"
  openssl x509 -req -in "$pki/$1.csr" -CA "$pki/ca.crt" -CAkey "$pki/ca.key" -CAcreateserial \
    -days 2 -extfile "$pki/$1.ext" -out "$pki/$1.crt" 2>/dev/null
  rm -f "$pki/$1.csr" "$pki/$1.ext"
}
kubeconfig() { # FILE URL TOKEN USER
  cat > "$1" <<KC
apiVersion: v1
kind: Config
clusters:
- name: node
  cluster:
    server: $2
    certificate-authority-data: $(base64 -w0 "$pki/ca.crt")
users:
- name: $4
  user:
    token: $3
contexts:
- name: node
  context: {cluster: node, user: $4, namespace: default}
current-context: node
KC
}

# The pause image (no registry: built here from tools/node/pause.c).
pause_bin=$cache/pause-$(sha256sum "$here/../tools/node/pause.c" | cut -c1-12)
if [ ! -x "$pause_bin" ]; then
  musl-gcc -static -Os -s -o "$pause_bin.tmp" "$here/../tools/node/pause.c"
  mv "$pause_bin.tmp" "$pause_bin"
fi
python3 "$here/scratch-image.py" "$PAUSE_IMAGE" "$dir/pause.tar" --entrypoint /pause "$pause_bin:/pause"

# --- namespaces ------------------------------------------------------------------------------
for node in $NODES; do
  d=$dir/$node; mkdir -p "$d"/{varlog,kubelet,containerd,cni,sysctl,etcd}
  echo "nameserver $DNS_IP" > "$d/resolv.conf"
  mounts="mount -t tmpfs tmpfs /run && mount --bind '$d/varlog' /var/log && mount --bind '$d/resolv.conf' /etc/resolv.conf"
  for k in "${!KERNEL_DEFAULTS[@]}"; do
    f=$d/sysctl/${k//\//.}; echo "${KERNEL_DEFAULTS[$k]}" > "$f"
    mounts+=" && mount --bind '$f' /proc/sys/$k"
  done
  # The holder: a process that owns the node's network and mount namespaces until `down`.
  unshare --net --mount --propagation private --fork -- \
    sh -c "$mounts && echo \$\$ > '$d/holder.pid.tmp' && exec sleep infinity" >"$d/holder.log" 2>&1 &
  wait_for "$node holder" 10 test -s "$d/holder.pid.tmp"
  mv "$d/holder.pid.tmp" "$d/holder.pid"
  readlink "/proc/$(holder_pid "$node")/ns/net" >> "$dir/namespaces"
  readlink "/proc/$(holder_pid "$node")/ns/mnt" >> "$dir/namespaces"
done

# The link between the two nodes, created inside the consumer's namespace: nothing of it is
# ever in this machine's own namespace.
pc=$(holder_pid consumer); pp=$(holder_pid provider)
nsenter -t "$pc" --net ip link add kbn-consumer type veth peer name kbn-provider
nsenter -t "$pc" --net ip link set kbn-provider netns "$pp"
for node in $NODES; do
  other=consumer; [ "$node" = consumer ] && other=provider
  p=$(holder_pid "$node")
  nsenter -t "$p" --net sh -c "
    ip link set lo up &&
    ip addr add ${NODE_IP[$node]}/24 dev kbn-$node &&
    ip addr add $SERVICE_IP/32 dev kbn-$node &&
    ip link set kbn-$node up &&
    ip route add ${POD_CIDR[$other]} via ${NODE_IP[$other]} &&
    echo 1 > /proc/sys/net/ipv4/ip_forward"
done

# --- per node: PKI, etcd, apiserver, controllers, containerd, kubelet ----------------------------
for node in $NODES; do
  d=$dir/$node; ip=${NODE_IP[$node]}
  cert "$node-apiserver" kube-apiserver \
    "IP:$SERVICE_IP,IP:$ip,IP:127.0.0.1,DNS:localhost,DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc,DNS:kubernetes.default.svc.cluster.local"
  cert "$node-kubelet" "$node-node" "IP:$ip,DNS:$node-node"
  cert "$node-apiserver-kubelet-client" kube-apiserver-kubelet-client "DNS:kube-apiserver-kubelet-client"
  openssl genrsa -out "$pki/$node-sa.key" 2048 2>/dev/null
  admin=$(openssl rand -hex 24); kubelet_token=$(openssl rand -hex 24)
  printf '%s,kbind-admin,uid-admin,"system:masters"\n%s,system:node:%s-node,uid-node,"system:nodes"\n' \
    "$admin" "$kubelet_token" "$node" > "$pki/$node-tokens.csv"
  kubeconfig "$d/admin-inside.kubeconfig" "https://127.0.0.1:443" "$admin" kbind-admin
  kubeconfig "$d/kubelet.kubeconfig" "https://$ip:443" "$kubelet_token" "system:node:$node-node"

  start etcd "$node" "$cache/etcd-$ETCD_VERSION" --data-dir="$d/etcd" --name=node \
    --listen-client-urls=http://127.0.0.1:2379 --advertise-client-urls=http://127.0.0.1:2379 \
    --listen-peer-urls=http://127.0.0.1:2380 --initial-advertise-peer-urls=http://127.0.0.1:2380 \
    --initial-cluster=node=http://127.0.0.1:2380 --unsafe-no-fsync=true --log-level=warn
  start apiserver "$node" "$cache/kube-apiserver-$KUBE_VERSION" \
    --etcd-servers=http://127.0.0.1:2379 --bind-address=0.0.0.0 --secure-port=443 --advertise-address="$ip" \
    --tls-cert-file="$pki/$node-apiserver.crt" --tls-private-key-file="$pki/$node-apiserver.key" \
    --client-ca-file="$pki/ca.crt" --token-auth-file="$pki/$node-tokens.csv" \
    --authorization-mode=Node,RBAC --enable-admission-plugins=NodeRestriction \
    --service-cluster-ip-range=$SERVICE_CIDR --allow-privileged=true \
    --service-account-issuer=https://kubernetes.default.svc.cluster.local \
    --service-account-key-file="$pki/$node-sa.key" --service-account-signing-key-file="$pki/$node-sa.key" \
    --kubelet-client-certificate="$pki/$node-apiserver-kubelet-client.crt" \
    --kubelet-client-key="$pki/$node-apiserver-kubelet-client.key" \
    --kubelet-certificate-authority="$pki/ca.crt" --kubelet-preferred-address-types=InternalIP \
    --cert-dir="$d/apiserver-certs" --profiling=false

  # containerd: its own root under DIR; state, socket and the Pods' network namespaces in the
  # node's /run (a tmpfs that goes with the mount namespace).
  cat > "$d/cni/10-bridge.conflist" <<CNI
{"cniVersion": "0.4.0", "name": "kbind-node", "plugins": [
  {"type": "bridge", "bridge": "cni0", "isGateway": true, "ipMasq": false,
   "ipam": {"type": "host-local", "ranges": [[{"subnet": "${POD_CIDR[$node]}", "gateway": "${POD_GW[$node]}"}]],
            "routes": [{"dst": "0.0.0.0/0"}], "dataDir": "/run/cni-ipam"}},
  {"type": "loopback"}]}
CNI
  # The overlayfs snapshotter needs a directory overlayfs can use as an upper layer; the
  # filesystem under DIR may not be one (overlayfs itself, when the machine is a container).
  # Probe it inside the node's mount namespace; else the native snapshotter (copies; the
  # images here are a few MiB). KBIND_NODE_SNAPSHOTTER overrides.
  snapshotter=${KBIND_NODE_SNAPSHOTTER:-}
  if [ -z "$snapshotter" ]; then
    probe=$d/containerd/overlay-probe; mkdir -p "$probe"/{lower,upper,work,merged}
    if in_node "$node" mount -t overlay overlay \
        -o "lowerdir=$probe/lower,upperdir=$probe/upper,workdir=$probe/work" "$probe/merged" 2>/dev/null; then
      in_node "$node" umount "$probe/merged"; snapshotter=overlayfs
    else
      snapshotter=native
    fi
    rm -rf "$probe"
  fi
  echo "$snapshotter" > "$d/snapshotter"
  log "$node containerd: $snapshotter snapshotter ($(findmnt -n -o FSTYPE --target "$d") under $d)"
  cat > "$d/containerd.toml" <<TOML
version = 2
root = "$d/containerd"
state = "/run/containerd"
disabled_plugins = ["io.containerd.snapshotter.v1.aufs", "io.containerd.snapshotter.v1.btrfs",
  "io.containerd.snapshotter.v1.zfs", "io.containerd.snapshotter.v1.devmapper",
  "io.containerd.internal.v1.tracing", "io.containerd.tracing.processor.v1.otlp"]
[grpc]
  address = "/run/containerd/containerd.sock"
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "$PAUSE_IMAGE"
  # root here has no CAP_SYS_RESOURCE: a negative oom_score_adj fails every sandbox.
  restrict_oom_score_adj = true
  enable_selinux = false
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "$snapshotter"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
        BinaryName = "$runc"
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "/usr/lib/cni"
    conf_dir = "$d/cni"
TOML
  start containerd "$node" /usr/bin/containerd --config "$d/containerd.toml"
done

for node in $NODES; do
  d=$dir/$node
  wait_for "$node apiserver" 90 in_node "$node" curl -sf --cacert "$pki/ca.crt" \
    -H "Authorization: Bearer $(sed -n 's/^ *token: //p' "$d/admin-inside.kubeconfig")" https://127.0.0.1:443/readyz
  log "$node apiserver ready"
  start controller-manager "$node" "$cache/kube-controller-manager-$KUBE_VERSION" \
    --kubeconfig="$d/admin-inside.kubeconfig" --authentication-kubeconfig="$d/admin-inside.kubeconfig" \
    --authorization-kubeconfig="$d/admin-inside.kubeconfig" --bind-address=127.0.0.1 --secure-port=10257 \
    --leader-elect=false --root-ca-file="$pki/ca.crt" --service-account-private-key-file="$pki/$node-sa.key" \
    --use-service-account-credentials=true \
    --controllers='*,-cloud-node-lifecycle,-route,-service,-nodeipam,-bootstrapsigner,-tokencleaner'
  start scheduler "$node" "$cache/kube-scheduler-$KUBE_VERSION" \
    --kubeconfig="$d/admin-inside.kubeconfig" --authentication-kubeconfig="$d/admin-inside.kubeconfig" \
    --authorization-kubeconfig="$d/admin-inside.kubeconfig" --bind-address=127.0.0.1 --secure-port=10259 \
    --leader-elect=false

  wait_for "$node containerd" 30 in_node "$node" ctr --address /run/containerd/containerd.sock version
  # Unpacked into the snapshotter the CRI uses (ctr's own default is overlayfs).
  import=(ctr --address /run/containerd/containerd.sock -n k8s.io images import --snapshotter "$(cat "$d/snapshotter")")
  in_node "$node" "${import[@]}" "$dir/pause.tar" >/dev/null
  for image in ${KBIND_NODE_IMAGES:-}; do
    image=$(realpath "$image")  # nsenter --mount leaves the working directory behind
    in_node "$node" "${import[@]}" "$image" >/dev/null
  done

  # kubelet: cgroupfs driver under a cgroup root of its own (removed at `down`).
  root=$(cgroup_root "$node")
  for ctl in $(cgroup_controllers); do
    mkdir -p "$ctl/$root"
    if [ -f "$ctl/cpuset.cpus" ]; then
      cat "$ctl/cpuset.cpus" > "$ctl/$root/cpuset.cpus"; cat "$ctl/cpuset.mems" > "$ctl/$root/cpuset.mems"
    fi
  done
  cat > "$d/kubelet.yaml" <<YAML
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
# This machine mounts cgroup v1 (hybrid); kubelet 1.36 refuses v1 unless told otherwise.
failCgroupV1: false
cgroupDriver: cgroupfs
cgroupRoot: /$root
containerRuntimeEndpoint: unix:///run/containerd/containerd.sock
address: ${NODE_IP[$node]}
port: 10250
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: 10248
tlsCertFile: $pki/$node-kubelet.crt
tlsPrivateKeyFile: $pki/$node-kubelet.key
authentication:
  anonymous: {enabled: false}
  webhook: {enabled: false}
  x509: {clientCAFile: $pki/ca.crt}
authorization: {mode: AlwaysAllow}
clusterDNS: [$DNS_IP]
clusterDomain: cluster.local
resolvConf: $d/resolv.conf
# Check the kernel settings kubelet wants (given to it in its mount namespace), never write them.
protectKernelDefaults: true
failSwapOn: false
# Images are imported, never pulled: never collect them.
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
evictionHard: {memory.available: "50Mi", nodefs.available: "1%", imagefs.available: "1%"}
serializeImagePulls: false
registerNode: true
YAML
  start kubelet "$node" "$cache/kubelet-$KUBE_VERSION" --config="$d/kubelet.yaml" \
    --kubeconfig="$d/kubelet.kubeconfig" --root-dir="$d/kubelet" --hostname-override="$node-node" \
    --node-ip="${NODE_IP[$node]}" --v=1
done

# SpiceDB (serve-testing: each preshared key its own store) for relsync's Pods, inside the
# consumer's namespace on its node IP, its HTTP gateway on TLS signed by the node CA: Pods trust
# it through a mounted CA bundle (docs/operations.md "Trusting a private CA").
cert spicedb spicedb "IP:${NODE_IP[consumer]},IP:127.0.0.1"
start spicedb consumer "$cache/spicedb-$SPICEDB_VERSION" serve-testing \
  --grpc-addr=127.0.0.1:50051 --readonly-grpc-addr=127.0.0.1:50052 \
  --http-enabled --http-addr="${NODE_IP[consumer]}:8443" --readonly-http-addr=127.0.0.1:8444 \
  --http-tls-cert-path="$pki/spicedb.crt" --http-tls-key-path="$pki/spicedb.key"

# Loopback forwarders: the apiservers and SpiceDB, for tests and kubectl.
env_file=$dir/env; : > "$env_file"
forwards=()
for node in $NODES; do
  upper=$(echo "$node" | tr a-z A-Z)
  port=$(free_port)
  sed "s#https://127.0.0.1:443#https://127.0.0.1:$port#" "$dir/$node/admin-inside.kubeconfig" > "$dir/$node-admin.kubeconfig"
  python3 "$here/netns-forward.py" --netns "$(holder_pid "$node")" "127.0.0.1:$port=127.0.0.1:443" \
    >"$dir/$node/forward.log" 2>&1 &
  echo "$! $node-forward" >> "$dir/pids"
  {
    echo "export KBIND_NODE_${upper}_KUBECONFIG=$dir/$node-admin.kubeconfig"
    echo "export KBIND_NODE_${upper}_HOLDER_PID=$(holder_pid "$node")"
    echo "export KBIND_NODE_${upper}_IP=${NODE_IP[$node]}"
    # What a Pod of the other cluster dials to reach this apiserver.
    echo "export KBIND_NODE_${upper}_URL=https://${NODE_IP[$node]}:443"
  } >> "$env_file"
done
echo "export KBIND_NODE_CA=$pki/ca.crt" >> "$env_file"
port=$(free_port)
python3 "$here/netns-forward.py" --netns "$(holder_pid consumer)" "127.0.0.1:$port=${NODE_IP[consumer]}:8443" \
  >"$dir/consumer/spicedb-forward.log" 2>&1 &
echo "$! consumer-spicedb-forward" >> "$dir/pids"
{
  echo "export KBIND_NODE_SPICEDB_URL=https://${NODE_IP[consumer]}:8443"
  echo "export KBIND_NODE_SPICEDB_LOCAL_URL=https://127.0.0.1:$port"
} >> "$env_file"
# The kbind image the Pods run (imported from KBIND_NODE_IMAGES above).
for image in ${KBIND_NODE_IMAGES:-}; do
  ref=$(tar -xOf "$image" manifest.json | python3 -c 'import json,sys; print(json.load(sys.stdin)[0]["RepoTags"][0])')
  case $ref in */kbind:*|kbind:*) echo "export KBIND_NODE_IMAGE=$ref" >> "$env_file" ;; esac
done

for node in $NODES; do
  wait_for "$node node Ready" 90 sh -c \
    "kubectl --kubeconfig '$dir/$node-admin.kubeconfig' get node $node-node -o jsonpath='{.status.conditions[?(@.type==\"Ready\")].status}' | grep -qx True"
  wait_for "$node default ServiceAccount" 60 kubectl --kubeconfig "$dir/$node-admin.kubeconfig" get serviceaccount default -n default
  log "$node-node Ready"
done
wait_for spicedb 60 curl -sf --cacert "$pki/ca.crt" -o /dev/null "https://127.0.0.1:$port/healthz"

echo "export KBIND_NODE_DIR=$dir" >> "$env_file"
trap - EXIT
log "up in $(python3 -c "import time; print(f'{time.time() - $t0:.1f}')") s: source $env_file"
