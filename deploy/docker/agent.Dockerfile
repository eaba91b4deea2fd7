# The builder (agent) image each ttdrv-<policy> DaemonSet runs, one per compiler family (the
# major gcc version that built the node's kernel). One definition for docker, podman and
# buildah: `cargo xtask image agent [--gcc 11|12|13|14]` prepares the build context and runs
# whichever engine answers (see docs/images.md). The context holds:
#   rootfs.tar  Debian minbase (bookworm for gcc 11 and 12, trixie for 13 and 14) plus what
#               building tt-kmd needs (make, gcc-<N> also named gcc, libelf, kmod, git,
#               ca-certificates, the suite's linux-kbuild), made by mmdebstrap from the versions
#               pinned in deploy/docker/image-pins.yaml;
#   ttdp-agent  the static agent binary;
#   tt-smi      a self-contained tt-smi (PyInstaller onefile; the image has no Python).
# The agent labels its node with TT_SMI_VERSION, so the label names the tt-smi this image
# carries. Its default equals ttSmi.version in image-pins.yaml and the chart's
# driver.ttSmiVersion (a test checks all three).
ARG TT_SMI_VERSION=6.8.0
# The compiler family the image builds for; the plain `cargo xtask image agent` is gcc 12.
ARG TTDP_BUILDER_GCC=12

FROM scratch
ARG TT_SMI_VERSION
ARG TTDP_BUILDER_GCC
ADD rootfs.tar /
COPY ttdp-agent /usr/local/bin/ttdp-agent
COPY tt-smi /opt/ttdp/tt-smi
# An image built FROM scratch has no PATH, and the readiness probe execs plain `ttdp-agent`.
ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    TT_SMI_VERSION=${TT_SMI_VERSION} \
    TTDP_BUILDER_GCC=${TTDP_BUILDER_GCC} \
    TTDP_TT_SMI_PATH=/opt/ttdp/tt-smi \
    TTDP_HOST_ROOT=/host \
    TTDP_LOG_FORMAT=json
ENTRYPOINT ["/usr/local/bin/ttdp-agent"]
CMD ["run"]
