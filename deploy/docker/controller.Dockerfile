# The ttdp controller: one static binary on a distroless, non-root base.
# Build from the repository root:  cargo xtask image controller
FROM docker.io/library/rust:1.89-bookworm AS build
RUN rustup target add x86_64-unknown-linux-musl && apt-get update \
    && apt-get install -y --no-install-recommends musl-tools && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY . .
RUN cargo build --release --locked --target x86_64-unknown-linux-musl -p ttdp-controller \
    && cp target/x86_64-unknown-linux-musl/release/ttdp-controller /ttdp-controller

FROM gcr.io/distroless/static-debian12:nonroot
COPY --from=build /ttdp-controller /usr/local/bin/ttdp-controller
USER 65532:65532
ENTRYPOINT ["/usr/local/bin/ttdp-controller"]
