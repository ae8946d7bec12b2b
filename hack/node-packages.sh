#!/usr/bin/env bash
# Installs, when missing, what the real node (hack/node.sh) and the image build (hack/image.sh)
# need from Debian's packages and rustup, and says what it installs:
#   containerd, runc, containernetworking-plugins   the node's container runtime and CNI plugins
#   podman                                          builds the kbind image (no registry needed)
#   musl-tools                                      musl-gcc: the static kbind binary and pause
#   rustup target x86_64-unknown-linux-musl         the static kbind binary
# Needs root for apt-get (the machines this runs on are root).
set -euo pipefail

missing=()
for p in containerd runc containernetworking-plugins podman musl-tools; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "node-packages: installing Debian packages: ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null \
    || { apt-get update -qq && apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null; }
else
  echo "node-packages: containerd, runc, containernetworking-plugins, podman, musl-tools present"
fi
if ! rustup target list --installed | grep -qx x86_64-unknown-linux-musl; then
  echo "node-packages: adding the Rust target x86_64-unknown-linux-musl"
  rustup target add x86_64-unknown-linux-musl
fi
