#!/usr/bin/env bash
# Builds the real test servers (etcd, kube-apiserver, kube-controller-manager, SpiceDB, the
# Prometheus Pushgateway; kubelet and kube-scheduler for the real node of hack/node.sh) and the
# test tool helm (tests/install.rs renders and lints charts/kbind) from Go modules into a
# version-keyed cache outside the repo, and extracts kcp's published CRDs from its module.
# Anything already in the cache is reused.
# Usage: hack/build-servers.sh                 (all)
#        hack/build-servers.sh --print-dir      (print the cache dir and exit)
#        hack/build-servers.sh --print-helm     (print the helm binary's path)
#        hack/build-servers.sh --print-pushgateway (print the Pushgateway binary's path)
#        hack/build-servers.sh --print-kcp-crds (print where kcp's published CRDs are kept)
#        hack/build-servers.sh --with-kcp       (also kcp: the test suite's claims tests on real
#                                                workspaces, tests/kcp.rs; hack/test.sh passes it)
#        hack/build-servers.sh --print-kcp      (print the kcp binary's path)
# kcp is the slowest: ~10 min on 2 cores after the kube servers; all of them with an empty Go
# build cache ~23 min (docs/testing.md "Real kcp").
set -euo pipefail

KUBE_VERSION=v1.36.3
ETCD_VERSION=v3.6.16
SPICEDB_VERSION=v1.56.2
KCP_VERSION=v0.31.2
HELM_VERSION=v3.22.0
PUSHGATEWAY_VERSION=v1.11.1

root=$(cd "$(dirname "$0")/.." && pwd)
cache=${KBIND_SERVER_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/kbind/bin}
mkdir -p "$cache"

if [ "${1:-}" = "--print-dir" ]; then echo "$cache"; exit 0; fi
if [ "${1:-}" = "--print-kcp-crds" ]; then echo "$cache/kcp-crds-$KCP_VERSION"; exit 0; fi
if [ "${1:-}" = "--print-helm" ]; then echo "$cache/helm-$HELM_VERSION"; exit 0; fi
if [ "${1:-}" = "--print-pushgateway" ]; then echo "$cache/pushgateway-$PUSHGATEWAY_VERSION"; exit 0; fi
if [ "${1:-}" = "--print-kcp" ]; then echo "$cache/kcp-$KCP_VERSION"; exit 0; fi
if ! command -v go >/dev/null 2>&1; then
  echo "build-servers: Go is needed to build the test servers (only Go; nothing is downloaded but modules)" >&2
  exit 1
fi

export CGO_ENABLED=0 GOFLAGS=-buildvcs=false

# build NAME VERSION MODULE_DIR PACKAGE [LDFLAGS]
build() {
  local name=$1 version=$2 dir=$3 pkg=$4 ldflags=${5:-}
  local out="$cache/$name-$version"
  if [ -x "$out" ]; then echo "build-servers: $name $version cached"; return; fi
  echo "build-servers: building $name $version (first time on this machine; minutes)"
  local start=$SECONDS
  (cd "$root/tools/servers/$dir" && go build -trimpath -ldflags "-s -w $ldflags" -o "$out.tmp" "$pkg")
  mv "$out.tmp" "$out"
  echo "build-servers: built $name $version in $((SECONDS - start))s"
}

kube_ldflags() {
  local v=${KUBE_VERSION#v} major minor
  major=${v%%.*}; minor=${v#*.}; minor=${minor%%.*}
  local f=""
  for p in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    f+=" -X $p.gitVersion=$KUBE_VERSION -X $p.gitMajor=$major -X $p.gitMinor=$minor"
  done
  echo "$f"
}

build etcd "$ETCD_VERSION" etcd go.etcd.io/etcd/server/v3
build kube-apiserver "$KUBE_VERSION" kube k8s.io/kubernetes/cmd/kube-apiserver "$(kube_ldflags)"
build kube-controller-manager "$KUBE_VERSION" kube k8s.io/kubernetes/cmd/kube-controller-manager "$(kube_ldflags)"
# The real node (hack/node.sh): same module, so most packages come from the build cache above.
build kube-scheduler "$KUBE_VERSION" kube k8s.io/kubernetes/cmd/kube-scheduler "$(kube_ldflags)"
build kubelet "$KUBE_VERSION" kube k8s.io/kubernetes/cmd/kubelet "$(kube_ldflags)"
build spicedb "$SPICEDB_VERSION" spicedb github.com/authzed/spicedb/cmd/spicedb \
  "-X github.com/jzelinskie/cobrautil/v2.Version=$SPICEDB_VERSION"
build helm "$HELM_VERSION" helm helm.sh/helm/v3/cmd/helm \
  "-X helm.sh/helm/v3/internal/version.version=$HELM_VERSION"
# The Pushgateway's own release stamps prometheus/common/version the same way (without the "v").
build pushgateway "$PUSHGATEWAY_VERSION" pushgateway github.com/prometheus/pushgateway \
  "-X github.com/prometheus/common/version.Version=${PUSHGATEWAY_VERSION#v}"

# kcp's own published CRDs (APIBinding, APIExport, APIExportEndpointSlice, LogicalCluster), taken
# from its Go module (nothing vendored), so a test checks the objects kbind writes against them.
kcp_crds="$cache/kcp-crds-$KCP_VERSION"
if [ -f "$kcp_crds/apis.kcp.io_apibindings.yaml" ]; then
  echo "build-servers: kcp $KCP_VERSION CRDs cached"
else
  mod_dir=$(cd "$root/tools/servers/kube" && GOFLAGS=-mod=mod go mod download -json "github.com/kcp-dev/kcp@$KCP_VERSION" \
    | python3 -c 'import json,sys; print(json.load(sys.stdin)["Dir"])')
  mkdir -p "$kcp_crds.tmp"
  for f in apis.kcp.io_apibindings apis.kcp.io_apiexports apis.kcp.io_apiexportendpointslices core.kcp.io_logicalclusters; do
    cp "$mod_dir/config/crds/$f.yaml" "$kcp_crds.tmp/"
  done
  chmod -R u+w "$kcp_crds.tmp"
  rm -rf "$kcp_crds"; mv "$kcp_crds.tmp" "$kcp_crds"
  echo "build-servers: kcp $KCP_VERSION CRDs extracted from its Go module"
fi

if [ "${1:-}" = "--with-kcp" ]; then
  kcp_version_flags=""
  for p in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    kcp_version_flags+=" -X $p.gitVersion=v1.35.1+kcp-$KCP_VERSION -X $p.gitMajor=1 -X $p.gitMinor=35"
  done
  GOFLAGS="$GOFLAGS -mod=mod" build kcp "$KCP_VERSION" kcp github.com/kcp-dev/kcp/cmd/kcp "$kcp_version_flags"
fi
