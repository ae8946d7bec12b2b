# The kbind image: one static-ish binary on distroless, run as a non-root user.
#
#   docker build -t ghcr.io/<you>/kbind:<version> .
#
# then point the job manifests at it (deploy/kustomization.yaml: `images:`).

FROM rust:1-bookworm AS builder
WORKDIR /build
# Only what the binary is built from (tests, examples, hack/ and tools/ are not needed). The
# test-only crate under crates/ is never compiled into kbind, but cargo reads every workspace
# member's manifest.
COPY Cargo.toml Cargo.lock ./
COPY src ./src
COPY crates ./crates
RUN cargo build --release --locked --bin kbind

# glibc and CA certificates, no shell; the `nonroot` tag runs as 65532:65532.
FROM gcr.io/distroless/cc-debian12:nonroot
COPY --from=builder /build/target/release/kbind /kbind
USER 65532:65532
ENTRYPOINT ["/kbind"]
