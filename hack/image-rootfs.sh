#!/bin/sh
# Assembles the files the kbind image carries besides the binary, what the distroless
# static-debian12:nonroot base provided (docs/operations.md, "The image"), from this Debian
# system's packages `ca-certificates` and `tzdata`:
#   etc/ssl/certs/ca-certificates.crt  Debian's Mozilla CA bundle (kbind's TLS roots)
#   usr/share/zoneinfo/                tzdata
#   etc/passwd, etc/group              root, nobody and the non-root user nonroot (65532:65532)
#   home/nonroot (0700, 65532), root (0700), tmp (1777)
#   usr/share/doc/<pkg>/copyright      the two packages' licences
# One script for both builds: the Dockerfile's `rootfs-debian` stage runs it in
# debian:bookworm-slim, and hack/image.sh runs it on the build machine, so the two cannot drift.
#   hack/image-rootfs.sh <empty or missing output directory>
# Needs root (the home directory belongs to 65532).
set -eu
out=${1:?usage: hack/image-rootfs.sh <output directory>}
for f in /usr/share/ca-certificates/mozilla /usr/share/zoneinfo/UTC; do
  [ -e "$f" ] || { echo "image-rootfs: $f missing: apt-get install ca-certificates tzdata" >&2; exit 1; }
done
mkdir -p "$out"
if [ -n "$(ls -A "$out")" ]; then
  echo "image-rootfs: $out is not empty" >&2
  exit 1
fi

# The bundle is built from the package's certificates, not copied from
# /etc/ssl/certs/ca-certificates.crt: that file also holds the machine's own additions
# (/usr/local/share/ca-certificates), which must not end up in the image.
mkdir -p "$out/etc/ssl/certs"
LC_ALL=C
export LC_ALL
for c in /usr/share/ca-certificates/mozilla/*.crt; do
  cat "$c"
  # every certificate on lines of its own, as update-ca-certificates writes them
  [ -z "$(tail -c 1 "$c")" ] || echo
done > "$out/etc/ssl/certs/ca-certificates.crt"
chmod 0644 "$out/etc/ssl/certs/ca-certificates.crt"

mkdir -p "$out/usr/share"
cp -a /usr/share/zoneinfo "$out/usr/share/zoneinfo"
# /usr/share/zoneinfo/localtime points at /etc/localtime, which the image does not have (the
# time zone is UTC unless TZ says otherwise).
rm -f "$out/usr/share/zoneinfo/localtime"

for pkg in ca-certificates tzdata; do
  mkdir -p "$out/usr/share/doc/$pkg"
  cp /usr/share/doc/$pkg/copyright "$out/usr/share/doc/$pkg/copyright"
done

cat > "$out/etc/passwd" <<'EOF'
root:x:0:0:root:/root:/sbin/nologin
nobody:x:65534:65534:nobody:/nonexistent:/sbin/nologin
nonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin
EOF
cat > "$out/etc/group" <<'EOF'
root:x:0:
nobody:x:65534:
tty:x:5:
staff:x:50:
nonroot:x:65532:
EOF
chmod 0644 "$out/etc/passwd" "$out/etc/group"

mkdir -p "$out/home/nonroot" "$out/root" "$out/tmp"
chown 65532:65532 "$out/home/nonroot"
chmod 0700 "$out/home/nonroot" "$out/root"
chmod 1777 "$out/tmp"
chmod 0755 "$out" "$out/etc" "$out/home"
