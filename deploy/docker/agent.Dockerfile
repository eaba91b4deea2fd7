# The builder (agent) image each ttdrv-<policy> DaemonSet runs: the ttdp-agent binary, what
# building tt-kmd against the host's headers needs (make, gcc matching the supported host
# kernels, libelf, git), and a self-contained tt-smi (PyInstaller build, no host Python needed).
# Build from the repository root:  cargo xtask image agent
# The chart's driver.ttSmiVersion names the same default. The agent labels its node with the
# TT_SMI_VERSION set below, so the label always names the tt-smi this image carries.
ARG TT_SMI_VERSION=3.0.0

FROM docker.io/library/rust:1.89-bookworm AS agent
RUN rustup target add x86_64-unknown-linux-musl && apt-get update \
    && apt-get install -y --no-install-recommends musl-tools && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY . .
RUN cargo build --release --locked --target x86_64-unknown-linux-musl -p ttdp-agent \
    && cp target/x86_64-unknown-linux-musl/release/ttdp-agent /ttdp-agent

FROM docker.io/library/python:3.11-slim-bookworm AS ttsmi
ARG TT_SMI_VERSION
RUN pip install --no-cache-dir "tt-smi==${TT_SMI_VERSION}" pyinstaller \
    && pyinstaller --onefile --name tt-smi "$(command -v tt-smi)" \
    && install -m 0755 dist/tt-smi /tt-smi

FROM docker.io/library/debian:bookworm-slim
ARG TT_SMI_VERSION
# gcc-12 builds modules for Debian 12 / Ubuntu 22.04+ kernels; gcc-13/14 are added for newer
# hosts (the kernel's compiler is read from /proc/version and preferred when present).
RUN apt-get update && apt-get install -y --no-install-recommends \
        make gcc gcc-12 libelf-dev git ca-certificates kmod bc flex bison \
    && rm -rf /var/lib/apt/lists/*
COPY --from=agent /ttdp-agent /usr/local/bin/ttdp-agent
COPY --from=ttsmi /tt-smi /opt/ttdp/tt-smi
ENV TT_SMI_VERSION=${TT_SMI_VERSION} \
    TTDP_TT_SMI_PATH=/opt/ttdp/tt-smi \
    TTDP_HOST_ROOT=/host \
    TTDP_LOG_FORMAT=json
ENTRYPOINT ["/usr/local/bin/ttdp-agent"]
CMD ["run"]
