# The builder (agent) image each ttdrv-<policy> DaemonSet runs. One definition for docker,
# podman and buildah: `cargo xtask image agent` prepares the build context and runs whichever
# engine answers (see docs/images.md). The context holds:
#   rootfs.tar  Debian 12 minbase plus what building tt-kmd needs (make, gcc-12, libelf, kmod,
#               git, ca-certificates, linux-kbuild-6.1), made by mmdebstrap from the versions
#               pinned in deploy/docker/image-pins.yaml;
#   ttdp-agent  the static agent binary;
#   tt-smi      a self-contained tt-smi (PyInstaller onefile; the image has no Python).
# The agent labels its node with TT_SMI_VERSION, so the label names the tt-smi this image
# carries. Its default equals ttSmi.version in image-pins.yaml and the chart's
# driver.ttSmiVersion (a test checks all three).
ARG TT_SMI_VERSION=6.8.0

FROM scratch
ARG TT_SMI_VERSION
ADD rootfs.tar /
COPY ttdp-agent /usr/local/bin/ttdp-agent
COPY tt-smi /opt/ttdp/tt-smi
# An image built FROM scratch has no PATH, and the readiness probe execs plain `ttdp-agent`.
ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    TT_SMI_VERSION=${TT_SMI_VERSION} \
    TTDP_TT_SMI_PATH=/opt/ttdp/tt-smi \
    TTDP_HOST_ROOT=/host \
    TTDP_LOG_FORMAT=json
ENTRYPOINT ["/usr/local/bin/ttdp-agent"]
CMD ["run"]
