#!/usr/bin/env bash
# Builds the kbind image ghcr.io/kbind/kbind:<Cargo.toml version> on this machine, with no image
# registry, and writes it as a docker-archive to target/image/kbind.tar (import it with
# `ctr -n k8s.io images import target/image/kbind.tar`, `podman load` or `docker load`).
#   hack/image.sh            build unless the archive is newer than every input
#   hack/image.sh --force    build anyway
# It builds the Dockerfile's final stage `image` itself, with podman: the static release binary
# and the rootfs (hack/image-rootfs.sh) are made here and handed in as the stages `builder` and
# `rootfs`, whose base images (rust, debian) are never pulled (docs/operations.md, "The image").
# Needs root (the rootfs has a file owned by 65532; podman runs rootful); installs podman,
# musl-tools, ca-certificates and tzdata with apt-get and the musl Rust target with rustup when
# missing, and says so.
set -euo pipefail
cd "$(dirname "$0")/.."

force=0
case "${1:-}" in
  --force) force=1 ;;
  "") ;;
  *) echo "usage: hack/image.sh [--force]" >&2; exit 2 ;;
esac

out=target/image
archive=$out/kbind.tar
version=$(sed -n '/^\[package\]/,/^\[/s/^version = "\(.*\)"$/\1/p' Cargo.toml | head -n 1)
image=ghcr.io/kbind/kbind:$version
inputs=(src crates Cargo.toml Cargo.lock Dockerfile .dockerignore hack/image.sh hack/image-rootfs.sh)
mib() { awk -v b="$1" 'BEGIN { printf "%.1f MiB", b / 1048576 }'; }

if [ "$force" = 0 ] && [ -f "$archive" ] && [ -f "$out/version.txt" ] &&
  [ -z "$(find "${inputs[@]}" -newer "$archive" -print -quit)" ]; then
  echo "image: $archive ($image) is newer than every input (${inputs[*]}): not rebuilt" \
    "(hack/image.sh --force rebuilds)"
  echo "image: archive $(mib "$(stat -c %s "$archive")"); at its build, inside it: $(cat "$out/version.txt")"
  exit 0
fi

start=$SECONDS
case "$(uname -m)" in
  x86_64) triple=x86_64-unknown-linux-musl arch=amd64 ;;
  aarch64) triple=aarch64-unknown-linux-musl arch=arm64 ;;
  *) echo "image: no musl target for $(uname -m)" >&2; exit 1 ;;
esac
if [ "$(id -u)" != 0 ]; then
  echo "image: run as root (the rootfs holds /home/nonroot owned by 65532; podman runs rootful)" >&2
  exit 1
fi
missing=()
command -v podman >/dev/null || missing+=(podman)
command -v musl-gcc >/dev/null || missing+=(musl-tools)
[ -d /usr/share/ca-certificates/mozilla ] || missing+=(ca-certificates)
[ -e /usr/share/zoneinfo/UTC ] || missing+=(tzdata)
if [ "${#missing[@]}" -gt 0 ]; then
  echo "image: installing the Debian packages ${missing[*]} (apt-get)"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi
if ! rustup target list --installed | grep -qx "$triple"; then
  echo "image: adding the Rust target $triple (rustup)"
  rustup target add "$triple"
fi

# The binary, as the Dockerfile's builder stage builds it ([profile.release]: fat LTO, one
# codegen unit; on 2 cores a cold build takes over 10 minutes).
t0=$SECONDS
env "CC_${triple//-/_}=musl-gcc" \
  nice -n 10 cargo build --release --locked --bin kbind --target "$triple"
echo "image: release binary ($triple) built in $((SECONDS - t0))s"
bin=${CARGO_TARGET_DIR:-target}/$triple/release/kbind

rm -rf "$out/builder" "$out/rootfs" "$archive" "$out/version.txt" "$out/build-args"
mkdir -p "$out/builder"
cp "$bin" "$out/builder/kbind"
chmod 0755 "$out/builder/kbind"
hack/image-rootfs.sh "$out/rootfs"
# The published build takes bookworm's current packages; this one the machine's installed ones.
echo "image: rootfs from this machine's $(dpkg-query -W -f '${Package} ${Version}, ' \
  ca-certificates tzdata 2>/dev/null | sed 's/, $//')"

# podman with its own storage and state, removed at exit: nothing is shared with other podman
# users of this machine, nothing is pulled. cgroupfs and the file event log work without systemd.
work=$(mktemp -d "${TMPDIR:-/tmp}/kbind-image.XXXXXX")
trap 'rm -rf "$work"' EXIT
podman=(podman --root "$work/root" --runroot "$work/run" --tmpdir "$work/tmp"
  --storage-driver vfs --cgroup-manager cgroupfs --events-backend file)

# The build arguments, kept for tests/image.rs (it checks the labels against the Dockerfile's).
revision=$(git rev-parse HEAD 2>/dev/null || echo unknown)
if [ "$revision" != unknown ] && ! git diff --quiet HEAD -- "${inputs[@]}" 2>/dev/null; then
  revision=$revision-dirty
fi
echo "REVISION=$revision" > "$work/build-args"
# Reproducible: the files' times and the image's creation time are the commit's.
when=$(git log -1 --format=%ct 2>/dev/null || echo 0)

t0=$SECONDS
"${podman[@]}" build --quiet --target image --identity-label=false --timestamp "$when" \
  --build-context builder="$out/builder" --build-context rootfs="$out/rootfs" \
  --build-arg "REVISION=$revision" --build-arg "TARGETARCH=$arch" \
  -t "$image" -f Dockerfile . >/dev/null
"${podman[@]}" save --quiet --format docker-archive -o "$work/kbind.tar" "$image"
echo "image: $image built from the Dockerfile's stage \`image\` in $((SECONDS - t0))s"

# `kbind version` from inside the image: run as a container (its user and entrypoint) when the
# machine lets podman start one, else in a chroot of the image's files. podman asks runc to set
# rlimits; a machine without CAP_SYS_RESOURCE refuses to raise them, lowering always works.
if got=$("${podman[@]}" run --rm --network none --ulimit nofile=1024:1024 --ulimit nproc=1024:1024 \
  "$image" version 2>"$work/run.err"); then
  how="podman run --rm $image version"
else
  echo "image: podman run failed here ($(head -n 1 "$work/run.err")); using a chroot instead"
  mkdir "$work/fs"
  cid=$("${podman[@]}" create "$image")
  "${podman[@]}" export "$cid" | tar -x -C "$work/fs"
  "${podman[@]}" rm "$cid" >/dev/null
  got=$(chroot --userspec=65532:65532 "$work/fs" /kbind version)
  how="chroot --userspec=65532:65532 <the image's files> /kbind version"
fi
if [ "$got" != "kbind $version" ]; then
  echo "image: $how printed '$got', not 'kbind $version'" >&2
  exit 1
fi

mv "$work/build-args" "$out/build-args"
echo "$got ($how)" > "$out/version.txt"
mv "$work/kbind.tar" "$archive"
size=$("${podman[@]}" image inspect --format '{{.Size}}' "$image")
echo "image: $archive: $image, image $(mib "$size"), archive $(mib "$(stat -c %s "$archive")")," \
  "gzipped $(mib "$(gzip -c "$archive" | wc -c)"), binary $(mib "$(stat -c %s "$bin")")"
echo "image: inside it: $got ($how)"
echo "image: done in $((SECONDS - start))s"
