# syntax=docker/dockerfile:1
# The kbind image: one static binary (musl, no libc needed at run time) on a FROM-scratch root
# with what the distroless static base provided (CA bundle, tzdata, passwd/group with the
# non-root user 65532), run as 65532.
#
#   docker buildx build --platform linux/amd64,linux/arm64 \
#     --build-arg REVISION=$(git rev-parse HEAD) -t ghcr.io/<you>/kbind:0.2.0 --push .
#
# The builder and rootfs stages run on the build machine's own platform ($BUILDPLATFORM): the
# builder cross-compiles for each $TARGETARCH, the rootfs holds no executable, so a multi-arch
# build needs no emulation. Then pin the pushed digest in the manifests (docs/operations.md,
# "The image").
#
# hack/image.sh builds the final stage `image` on a machine with no image registry: it builds the
# same binary and rootfs there and hands them in as the stages `builder` and `rootfs`
# (`podman build --target image --build-context builder=<dir> --build-context rootfs=<dir>`), so
# the stages before `image` must leave /kbind and the rootfs at the paths `image` copies from.

FROM --platform=$BUILDPLATFORM rust:1-bookworm AS builder
ARG TARGETARCH
WORKDIR /build
# The Rust target and a C compiler for it (ring, the TLS crypto, has C and assembly parts).
RUN set -eu; \
    case "$TARGETARCH" in \
      amd64) triple=x86_64-unknown-linux-musl; pkgs=musl-tools ;; \
      arm64) triple=aarch64-unknown-linux-musl; pkgs=gcc-aarch64-linux-gnu ;; \
      *) echo "unsupported TARGETARCH=$TARGETARCH" >&2; exit 1 ;; \
    esac; \
    apt-get update; \
    apt-get install -y --no-install-recommends $pkgs; \
    rm -rf /var/lib/apt/lists/*; \
    rustup target add "$triple"; \
    echo "$triple" > /tmp/triple
# Only what the binary is built from (tests, examples, hack/ and tools/ are not needed). The
# test-only crate under crates/ is never compiled into kbind, but cargo reads every workspace
# member's manifest.
COPY Cargo.toml Cargo.lock ./
COPY src ./src
COPY crates ./crates
# [profile.release] in Cargo.toml: fat LTO, one codegen unit, symbols stripped.
RUN set -eu; \
    triple=$(cat /tmp/triple); \
    export CC_x86_64_unknown_linux_musl=musl-gcc \
           CC_aarch64_unknown_linux_musl=aarch64-linux-gnu-gcc \
           CARGO_TARGET_AARCH64_UNKNOWN_LINUX_MUSL_LINKER=aarch64-linux-gnu-gcc; \
    cargo build --release --locked --bin kbind --target "$triple"; \
    cp "target/$triple/release/kbind" /kbind

# The files of distroless/static-debian12:nonroot, from Debian bookworm's packages, assembled by
# the script hack/image.sh also runs (it says what it writes).
FROM --platform=$BUILDPLATFORM debian:bookworm-slim AS rootfs-debian
RUN set -eu; \
    apt-get update; \
    apt-get install -y --no-install-recommends ca-certificates tzdata; \
    rm -rf /var/lib/apt/lists/*
COPY hack/image-rootfs.sh /usr/local/bin/image-rootfs.sh
RUN sh /usr/local/bin/image-rootfs.sh /rootfs

# The rootfs alone, so that `COPY --from=rootfs / /` below copies the same tree whether this
# stage or hack/image.sh's directory provides it.
FROM scratch AS rootfs
COPY --from=rootfs-debian /rootfs/ /

# No shell, no libc; CA certificates (kbind reads the system roots, SSL_CERT_FILE as the
# distroless base set it) and tzdata only. The user is 65532:65532 (`nonroot`), as the
# manifests' securityContext says.
FROM scratch AS image
ARG VERSION=0.2.0
ARG REVISION=unknown
LABEL org.opencontainers.image.title="kbind" \
      org.opencontainers.image.description="Batch reconcilers for cross-cluster API binding, permission claims and directory-to-SpiceDB sync, run as Kubernetes CronJobs" \
      org.opencontainers.image.source="https://github.com/kbind/kbind" \
      org.opencontainers.image.documentation="https://github.com/kbind/kbind/blob/main/docs/operations.md" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.vendor="kbind" \
      org.opencontainers.image.version="$VERSION" \
      org.opencontainers.image.revision="$REVISION"
COPY --from=rootfs / /
COPY --from=builder /kbind /kbind
ENV SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt
USER 65532:65532
ENTRYPOINT ["/kbind"]
