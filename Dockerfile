# syntax=docker/dockerfile:1
# posgate container image: build with the Rust toolchain, run on a minimal non-root base.
#   docker build -t posgate:dev .
#   docker run --rm posgate:dev serve --help
# The runtime image has no shell: the Kubernetes manifests (k8s/) use the built-in
# preStop `sleep` action, and `kubectl exec deploy/posgate -- posgate ...` for the CLI.

FROM rust:1-bookworm AS build
WORKDIR /src
COPY . .
# --locked: exactly the versions in Cargo.lock. The cache mounts keep the registry and
# the target directory between builds (BuildKit); the binary is copied out of them.
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    cargo build --release --locked -p posgate --bin posgate \
    && install -D -m 0755 target/release/posgate /out/posgate

# Debian 12 like the builder (same glibc), with CA certificates (rustls-native-certs
# reads them for rediss:// and terminals when no CA file is given) and no shell.
FROM gcr.io/distroless/cc-debian12:nonroot
COPY --from=build /out/posgate /usr/local/bin/posgate
# 65532:65532, "nonroot"; the Deployment's securityContext uses the same ids.
USER 65532:65532
EXPOSE 8080
ENTRYPOINT ["posgate"]
CMD ["serve"]
