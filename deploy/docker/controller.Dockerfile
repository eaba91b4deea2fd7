# The ttdp controller: one static binary and the CA certificates, nothing else, run as a
# non-root user. `cargo xtask image controller` prepares the build context (see
# docs/images.md) and runs whichever engine answers (docker, podman or buildah). The context:
#   ttdp-controller          the static controller binary;
#   ca-certificates.crt      the CA bundle of the agent's Debian root filesystem (the pinned
#                            ca-certificates package), for an API server with a public CA.
FROM scratch
COPY ca-certificates.crt /etc/ssl/certs/ca-certificates.crt
COPY ttdp-controller /usr/local/bin/ttdp-controller
USER 65532:65532
ENTRYPOINT ["/usr/local/bin/ttdp-controller"]
