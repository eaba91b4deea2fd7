//! Every label, annotation, environment variable, finalizer and object name ttdp uses.
//!
//! Other crates use these constants instead of string literals, so a key is spelled once.

/// The API group of ttdp's custom resources.
pub const GROUP: &str = "driver.tenstorrent.com";
/// The kernel module's name, as in `/sys/module/tenstorrent`.
pub const MODULE_NAME: &str = "tenstorrent";
/// The default tt-kmd source repository.
pub const DEFAULT_KMD_REPOSITORY: &str = "https://github.com/tenstorrent/tt-kmd.git";
/// The device directory workloads open; holding a file under it raises the module's refcnt.
pub const DEVICE_PATH: &str = "/dev/tenstorrent";
/// Extended resources whose name starts with this prefix use the device.
pub const DEVICE_RESOURCE_PREFIX: &str = "tenstorrent.com/";
/// The finalizer the controller puts on each policy, so deletion can uncordon and clean up.
pub const FINALIZER: &str = "driver.tenstorrent.com/cleanup";
/// Field manager of the controller's server-side applies.
pub const CONTROLLER_MANAGER: &str = "ttdp-controller";
/// Field manager of the agent's writes.
pub const AGENT_MANAGER: &str = "ttdp-agent";
/// The chart's default operator namespace.
pub const DEFAULT_NAMESPACE: &str = "tt-k8s-driver-manager-system";
/// The default deploy gate (`controller.deployGates` in the chart).
pub const DEFAULT_DEPLOY_GATE: &str = "tenstorrent.com/deploy.tt-telemetry";
/// The value a deploy gate label is set to while its node is being upgraded.
pub const DEPLOY_GATE_CLOSED: &str = "false";
/// Prefix of each policy's DaemonSet name.
pub const DAEMONSET_PREFIX: &str = "ttdrv-";
/// Prefix of the cordon owner string the controller records on nodes it cordons.
pub const CORDON_OWNER_PREFIX: &str = "ttdp/";
/// Name of the agent container in the DaemonSet pods.
pub const AGENT_CONTAINER: &str = "agent";
/// The longest policy name: `ttdrv-<name>` must be a DNS label (63 characters) and the name is
/// also a label value on the agent pods.
pub const MAX_POLICY_NAME_LEN: usize = 63 - DAEMONSET_PREFIX.len();

/// The DaemonSet name of the policy called `policy`: `ttdrv-<policy>`.
pub fn daemonset_name(policy: &str) -> String {
    format!("{DAEMONSET_PREFIX}{policy}")
}

/// The owner string the controller records when it cordons a node for `policy`: `ttdp/<policy>`.
pub fn cordon_owner(policy: &str) -> String {
    format!("{CORDON_OWNER_PREFIX}{policy}")
}

/// The value of the [`annotations::UPGRADE_GRANT`] annotation the controller writes when it grants
/// a node the upgrade of `policy` to `version`: `<policy>/<version>`.
pub fn upgrade_grant(policy: &str, version: &str) -> String {
    format!("{policy}/{version}")
}

/// The policy and version of an [`annotations::UPGRADE_GRANT`] value (`<policy>/<version>`),
/// `None` when it is not of that form.
pub fn parse_upgrade_grant(value: &str) -> Option<(&str, &str)> {
    let (policy, version) = value.split_once('/')?;
    (!policy.is_empty() && !version.is_empty() && !version.contains('/'))
        .then_some((policy, version))
}

/// The value of the [`annotations::DEPLOY_GATES`] annotation when `policy` closes `gates`:
/// `<policy>:<gate>,<gate>`. The owner keeps another policy's release (an overlapping policy, or
/// one being deleted) from reopening gates the owner closed while it drains the node.
pub fn deploy_gates(policy: &str, gates: &[String]) -> String {
    format!("{policy}:{}", gates.join(","))
}

/// The policy that closed the gates (`None` for a value written without an owner) and the
/// gates of an [`annotations::DEPLOY_GATES`] value. Neither a label key nor a policy name may
/// hold a `:`, so the split is unambiguous.
pub fn parse_deploy_gates(value: &str) -> (Option<&str>, impl Iterator<Item = &str>) {
    let (owner, gates) = match value.split_once(':') {
        Some((owner, gates)) => (Some(owner), gates),
        None => (None, value),
    };
    let gates = gates.split(',').map(str::trim).filter(|g| !g.is_empty());
    (owner, gates)
}

/// Node labels.
pub mod labels {
    /// The running module's version, from `/sys/module/tenstorrent/version`; set by the agent.
    pub const KMD_VERSION: &str = "driver.tenstorrent.com/kmd-version";
    /// The version of the tt-smi binary the agent copied to the host.
    pub const TT_SMI_VERSION: &str = "tt-smi.driver.tenstorrent.com/version";
    /// `container` or `host`: who manages the node's driver.
    pub const INSTALL_MODE: &str = "driver.tenstorrent.com/install-mode";
    /// Any value opts the node out of ttdp entirely.
    pub const SKIP: &str = "driver.tenstorrent.com/skip";
    /// [`ALLOW_NO_ROLLBACK_ENABLED`] lets the agent unload the loaded module even when no `.ko`
    /// of it can be had to load back if the new version fails (a per-node opt-in; without it the
    /// agent reports `NoRollbackPath` and leaves the module loaded).
    pub const ALLOW_NO_ROLLBACK: &str = "driver.tenstorrent.com/allow-no-rollback";
    /// The value of [`ALLOW_NO_ROLLBACK`] that opts in.
    pub const ALLOW_NO_ROLLBACK_ENABLED: &str = "true";
    /// Set by Node Feature Discovery on nodes with a Tenstorrent PCI device (vendor 0x1e52,
    /// class 0x1200).
    pub const NFD_TENSTORRENT: &str = "feature.node.kubernetes.io/pci-1200_1e52.present";
    /// The value of [`NFD_TENSTORRENT`] on Tenstorrent nodes.
    pub const NFD_PRESENT: &str = "true";
    /// On agent pods: the name of the policy whose DaemonSet made them.
    pub const POLICY: &str = "driver.tenstorrent.com/policy";
    /// On agent pods and DaemonSets: `app.kubernetes.io/name`.
    pub const APP_NAME: &str = "app.kubernetes.io/name";
    /// The value of [`APP_NAME`] on agent pods.
    pub const APP_NAME_AGENT: &str = "ttdp-agent";
    /// `app.kubernetes.io/managed-by` on objects the controller creates.
    pub const MANAGED_BY: &str = "app.kubernetes.io/managed-by";
    /// On nodes in flight or Failed: the node's state in its policy's rollout (`Draining`,
    /// `Failed`, ...), for `kubectl get nodes -L`; written by the controller with
    /// [`super::annotations::UPGRADE_RECORD`], absent on settled nodes.
    pub const UPGRADE_STATE: &str = "driver.tenstorrent.com/upgrade-state";
}

/// Values of the [`labels::INSTALL_MODE`] label.
pub mod install_mode {
    /// ttdp builds and loads the module in its container.
    pub const CONTAINER: &str = "container";
    /// The host manages the module (DKMS); ttdp only observes.
    pub const HOST: &str = "host";
}

/// Annotations.
pub mod annotations {
    /// On the DaemonSet pod template: sha256 of the rendered template.
    pub const TEMPLATE_HASH: &str = "driver.tenstorrent.com/template-hash";
    /// On nodes: the owner (`ttdp/<policy>`) that cordoned the node.
    pub const CORDONED_BY: &str = "driver.tenstorrent.com/cordoned-by";
    /// On nodes: when the cordon in [`CORDONED_BY`] was placed (RFC 3339).
    pub const CORDONED_AT: &str = "driver.tenstorrent.com/cordoned-at";
    /// On nodes: the policy that closed the deploy gates and the gate keys it set to `false`,
    /// as `<policy>:<gate>,<gate>` ([`super::deploy_gates`]).
    pub const DEPLOY_GATES: &str = "driver.tenstorrent.com/deploy-gates";
    /// On agent pods: the agent's latest report (JSON of `AgentReport`).
    pub const AGENT_REPORT: &str = "driver.tenstorrent.com/agent-report";
    /// On nodes: set by `kubectl tt driver retry` (any value, usually a timestamp) to ask the
    /// controller to retry the node's Failed upgrade now; the controller removes it.
    pub const RETRY: &str = "driver.tenstorrent.com/retry";
    /// On nodes: the controller's go-ahead for the agent to swap a loaded module,
    /// `<policy>/<version>` ([`super::upgrade_grant`]). Written by the controller only while the
    /// node holds a `maxUnavailable` slot and, with drain enabled, once it is cordoned and
    /// drained; removed when the node is released. The agent reads it and never unloads a loaded
    /// module or kills a holder without it; the agent may not write it (admission policy).
    pub const UPGRADE_GRANT: &str = "driver.tenstorrent.com/upgrade-grant";
    /// On nodes in flight or Failed: the node's durable upgrade record (JSON of
    /// [`crate::node_record::NodeRecord`]: policy, state, target, since, attempts, reason),
    /// written by the controller before it acts on the node; what a restarted controller
    /// resumes from when the policy's status lost the node.
    pub const UPGRADE_RECORD: &str = "driver.tenstorrent.com/upgrade-record";
}

/// Environment variables of the agent container.
pub mod env {
    /// The tt-kmd version the agent must make loaded.
    pub const TT_KMD_VERSION: &str = "TT_KMD_VERSION";
    /// The node the agent runs on (downward API `spec.nodeName`).
    pub const NODE_NAME: &str = "NODE_NAME";
    /// The agent pod's name (downward API).
    pub const POD_NAME: &str = "POD_NAME";
    /// The agent pod's namespace (downward API).
    pub const POD_NAMESPACE: &str = "POD_NAMESPACE";
    /// `true`: SIGKILL processes holding the device before unloading.
    pub const TT_FORCE_UNLOAD: &str = "TT_FORCE_UNLOAD";
    /// The version of the tt-smi binary bundled in the builder image.
    pub const TT_SMI_VERSION: &str = "TT_SMI_VERSION";
    /// The git repository tt-kmd is fetched from.
    pub const TT_KMD_REPOSITORY: &str = "TT_KMD_REPOSITORY";
    /// Module parameters passed to `finit_module` (`spec.module.parameters`, space-separated
    /// `name=value`); unset or empty: none.
    pub const TT_KMD_PARAMETERS: &str = "TT_KMD_PARAMETERS";
    /// The commit the release tag must point at when the target is built
    /// (`spec.source.commit`); unset: any.
    pub const TT_KMD_COMMIT: &str = "TT_KMD_COMMIT";
    /// URL template of ready-built modules (`spec.source.prebuilt.url`, with `{version}` and
    /// `{kernelRelease}`); unset: every cache miss is built.
    pub const TT_KMD_PREBUILT_URL: &str = "TT_KMD_PREBUILT_URL";
    /// `Build` (the default) or `Fail`: what a prebuilt module the server lacks means
    /// (`spec.source.prebuilt.fallback`).
    pub const TT_KMD_PREBUILT_FALLBACK: &str = "TT_KMD_PREBUILT_FALLBACK";
    /// A PEM file of CA certificates trusted for the prebuilt server in addition to the
    /// system's (`spec.source.prebuilt.caBundle`, mounted by the DaemonSet).
    pub const TT_KMD_PREBUILT_CA_FILE: &str = "TT_KMD_PREBUILT_CA_FILE";
    /// The pinned checksums of prebuilt modules, a JSON object of `<version>/<kernelRelease>` to
    /// hex sha256 (`spec.source.prebuilt.checksums`); unset or empty: none.
    pub const TT_KMD_PREBUILT_SHA256: &str = "TT_KMD_PREBUILT_SHA256";
    /// `true`: a prebuilt module without a pinned checksum is trusted on the server's `.sha256`
    /// file (`spec.source.prebuilt.trustServerChecksum`); default false.
    pub const TT_KMD_PREBUILT_TRUST_SERVER_CHECKSUM: &str = "TT_KMD_PREBUILT_TRUST_SERVER_CHECKSUM";
    /// `true`: prebuilt downloads may use plain http (`spec.source.prebuilt.allowInsecureHttp`);
    /// default false.
    pub const TT_KMD_PREBUILT_ALLOW_INSECURE_HTTP: &str = "TT_KMD_PREBUILT_ALLOW_INSECURE_HTTP";
    /// `true`: prebuilt downloads follow redirects to other hosts
    /// (`spec.source.prebuilt.allowCrossHostRedirects`); default false.
    pub const TT_KMD_PREBUILT_ALLOW_CROSS_HOST_REDIRECTS: &str =
        "TT_KMD_PREBUILT_ALLOW_CROSS_HOST_REDIRECTS";
    /// Where the host's root filesystem is mounted in the agent container.
    pub const HOST_ROOT: &str = "TTDP_HOST_ROOT";
    /// `real` (the default) or `sim`: which kernel the agent talks to (`sim` only in builds
    /// with the agent's `sim` feature; the DaemonSet always sets `real`).
    pub const KERNEL: &str = "TTDP_KERNEL";
    /// `json` or `text`.
    pub const LOG_FORMAT: &str = "TTDP_LOG_FORMAT";
    /// Where the agent reports: `kube` (the default), `file:PATH` or `none`. In a pod only `kube`
    /// is accepted (the others enforce no upgrade grant); the DaemonSet always sets it.
    pub const REPORT: &str = "TTDP_REPORT";
    /// The bundled tt-smi binary in the builder image (`none` skips tt-smi).
    pub const TT_SMI_PATH: &str = "TTDP_TT_SMI_PATH";
    /// The `.ko` cache directory as the agent sees it.
    pub const CACHE_DIR: &str = "TTDP_CACHE_DIR";
    /// How often the agent re-reads the module (the spec's 10 s).
    pub const PROBE_PERIOD: &str = "TTDP_PROBE_PERIOD";
    /// First back-off after a failure or while the device is held.
    pub const RETRY_INITIAL: &str = "TTDP_RETRY_INITIAL";
    /// Longest back-off.
    pub const RETRY_MAX: &str = "TTDP_RETRY_MAX";
    /// `make -j` job count for module builds.
    pub const BUILD_JOBS: &str = "TTDP_BUILD_JOBS";
    /// Deadline of the tt-kmd source fetch.
    pub const FETCH_TIMEOUT: &str = "TTDP_FETCH_TIMEOUT";
    /// Deadline of the module build.
    pub const BUILD_TIMEOUT: &str = "TTDP_BUILD_TIMEOUT";
    /// Scratch directory for fetched sources.
    pub const BUILD_DIR: &str = "TTDP_BUILD_DIR";
    /// The kernel build tree as the agent sees it; `{release}` stands for the kernel release
    /// (e.g. `/lib/modules/{release}/build` when the host's `/lib/modules` and `/usr/src` are
    /// mounted at their own paths, as Debian and Ubuntu headers need).
    pub const KERNEL_BUILD_DIR: &str = "TTDP_KERNEL_BUILD_DIR";
    /// Extra `make` arguments for module builds.
    pub const MAKE_ARGS: &str = "TTDP_MAKE_ARGS";
    /// With force unload: how long to wait for refcnt 0 after killing the holders.
    pub const UNLOAD_WAIT: &str = "TTDP_UNLOAD_WAIT";
    /// How often labels and the report are rewritten even when nothing changed.
    pub const RESYNC_PERIOD: &str = "TTDP_RESYNC_PERIOD";
    /// The directory of the node-wide module lock as the agent sees it (default
    /// `<host root>/run/ttdp`, where the DaemonSet mounts the host's `/run/ttdp`).
    pub const LOCK_DIR: &str = "TTDP_LOCK_DIR";
    /// `true` (the default): after a load, and in the readiness probe, every Tenstorrent PCI
    /// device must be bound to the `tenstorrent` driver with its `/dev/tenstorrent` node
    /// (`upgradePolicy.validation.enable`).
    pub const VALIDATE_DEVICES: &str = "TTDP_VALIDATE_DEVICES";
    /// The post-load validation command as a JSON array of strings
    /// (`upgradePolicy.validation.command`); unset or empty: none.
    pub const VALIDATION_COMMAND: &str = "TTDP_VALIDATION_COMMAND";
    /// How long the validation command may run (`upgradePolicy.validation.timeoutSeconds`).
    pub const VALIDATION_TIMEOUT: &str = "TTDP_VALIDATION_TIMEOUT";
    /// How long, after a load, the devices may take to be bound and get their nodes.
    pub const VALIDATION_DEVICE_WAIT: &str = "TTDP_VALIDATION_DEVICE_WAIT";
    /// The `udevadm` the agent runs to reload udev's rules after putting tt-kmd's rule in place
    /// (default `udevadm` on `PATH`; `none`: write the rule, never run udevadm).
    pub const UDEVADM: &str = "TTDP_UDEVADM";
    /// The directory holding the module signing key (`tls.key`) and its certificate
    /// (`tls.crt`), the Secret of `spec.module.signing` mounted read-only; unset: modules are not
    /// signed.
    pub const MODULE_SIGNING_DIR: &str = "TTDP_MODULE_SIGNING_DIR";
    /// `<namespace>/<name>` of the Secret mounted at [`MODULE_SIGNING_DIR`], for messages.
    pub const MODULE_SIGNING_SECRET: &str = "TTDP_MODULE_SIGNING_SECRET";
    /// How often the agent looks for installed kernels to prepare the target module for and
    /// prunes the `.ko` cache (default `60s`).
    pub const KERNEL_SCAN_PERIOD: &str = "TTDP_KERNEL_SCAN_PERIOD";
    /// The most the `.ko` cache may hold, in bytes, or with a `Ki`, `Mi` or `Gi` suffix
    /// (default `2Gi`).
    pub const CACHE_SIZE_LIMIT: &str = "TTDP_CACHE_SIZE_LIMIT";
}

/// Which compiler built a node's kernel, and the builder images that match it.
pub mod compiler {
    /// On nodes: the family of the compiler that built the running kernel, as the agent read it
    /// from `/proc/version` (`gcc-13`, `clang-18`, `unknown`). The controller runs each node's
    /// agent from the builder image of that family.
    pub const KERNEL_COMPILER_LABEL: &str = "driver.tenstorrent.com/kernel-compiler";
    /// On family DaemonSets and their pods: the GCC major version their builder image carries.
    pub const BUILDER_GCC_LABEL: &str = "driver.tenstorrent.com/builder-gcc";
    /// In builder images: the GCC major version the image builds modules with. An agent whose
    /// image names another major than the kernel's does not build.
    pub const BUILDER_GCC_ENV: &str = "TTDP_BUILDER_GCC";
    /// Prefix of the DaemonSets that run one compiler family's builder image: never the
    /// default DaemonSet's prefix, so no policy name can make the two collide.
    pub const FAMILY_DAEMONSET_PREFIX: &str = "ttkmd-gcc";

    /// The kernel-compiler label value of GCC `major`: `gcc-<major>`.
    pub fn gcc_label_value(major: u32) -> String {
        format!("gcc-{major}")
    }

    /// The DaemonSet running GCC `major`'s builder image for `policy`: `ttkmd-gcc<major>-<policy>`.
    pub fn family_daemonset_name(policy: &str, major: u32) -> String {
        format!("{FAMILY_DAEMONSET_PREFIX}{major}-{policy}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn upgrade_grants_round_trip() {
        let value = upgrade_grant("fleet", "2.8.0");
        assert_eq!(value, "fleet/2.8.0");
        assert_eq!(parse_upgrade_grant(&value), Some(("fleet", "2.8.0")));
        for bad in ["", "fleet", "/2.8.0", "fleet/", "a/b/c"] {
            assert_eq!(parse_upgrade_grant(bad), None, "{bad}");
        }
    }
}
