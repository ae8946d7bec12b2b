# syntax=docker/dockerfile:1
# The kbind image: one static binary (musl, no libc needed at run time) on distroless/static,
# run as the non-root user 65532.
#
#   docker buildx build --platform linux/amd64,linux/arm64 \
#     --build-arg REVISION=$(git rev-parse HEAD) -t ghcr.io/<you>/kbind:0.2.0 --push .
#
# The builder stage runs on the build machine's own platform ($BUILDPLATFORM) and cross-compiles
# for each $TARGETARCH, so a multi-arch build needs no emulation. Then pin the pushed digest in
# the manifests (docs/operations.md, "The image").

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

# No shell, no libc; CA certificates (kbind reads the system roots) and tzdata only. The
# `nonroot` tag's user is 65532:65532, as the manifests' securityContext says.
FROM gcr.io/distroless/static-debian12:nonroot
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
COPY --from=builder /kbind /kbind
USER 65532:65532
ENTRYPOINT ["/kbind"]
