//! The desired DaemonSet `ttdrv-<policy>` of a policy: a pure function of the policy, the
//! controller settings and the effective node selection.
//!
//! The pod template runs the privileged agent with `updateStrategy: OnDelete`, so Kubernetes never
//! replaces an agent pod on its own: the controller's per-node state machine decides when.
//!
//! Host paths (each mounted under `/host`, the agent's host root; nothing else of the host is
//! visible):
//!
//! | host path | mode | why |
//! |---|---|---|
//! | `/sys` | ro | `/sys/module/tenstorrent/{version,refcnt}`, PCI devices (vendor 0x1e52) and the driver bound to each |
//! | `/proc` | ro | `/proc/*/fd` to name the processes holding `/dev/tenstorrent`, `/proc/version` |
//! | `/lib/modules` | ro | the kernel's build tree link (`/lib/modules/<release>/build`), DKMS installs |
//! | `/usr/src` | ro | kernel headers the module is built against; DKMS sources (host-install detection) |
//! | `/var/lib/dkms` | ro | DKMS state (host-install detection) |
//! | `/var/cache/tt-kmd` | rw | the per-kernel, per-version `.ko` cache |
//! | `/usr/local/bin` | rw | where tt-smi is installed |
//! | `/run/ttdp` | rw | the node-wide module lock, shared by every agent pod on the node, and the post-load validation record the readiness probe reads |
//! | `/dev` | ro | `/dev/tenstorrent/*` device presence |
//! | `/etc/udev/rules.d` | rw | tt-kmd's udev rule (`50-tenstorrent.rules`), put in place before each load so device nodes get the version's mode |
//! | `/run/udev` | ro | udevd's control socket, for `udevadm control --reload-rules` (at its own path, where udevadm looks; a socket on a read-only mount still accepts connections) |
//!
//! `/run/udev` is mounted only at its own path. `/lib/modules` and `/usr/src` are also mounted
//! read-only at their own paths: Debian and Ubuntu
//! kernel header trees refer to each other by absolute path, so the agent builds against
//! `/lib/modules/<release>/build` as the host sees it.
//!
//! `hostPID` is set only with `upgradePolicy.forceUnload`: signalling the processes that hold the
//! device needs the host's PID namespace; reading `/proc` through the mount above does not.
//!
//! With `module.signing`, the Secret it names (in the agents' namespace) is mounted read-only at
//! `/etc/ttdp/module-signing` (`tls.key`, `tls.crt`, mode 0400): a Secret volume is a tmpfs, so the key
//! reaches no disk. The controller never reads the Secret; the kubelet mounts it.

use std::collections::BTreeMap;

use k8s_openapi::api::apps::v1::{DaemonSet, DaemonSetSpec, DaemonSetUpdateStrategy};
use k8s_openapi::api::core::v1::{
    Affinity, ConfigMapVolumeSource, Container, EnvVar, EnvVarSource, ExecAction,
    HostPathVolumeSource, KeyToPath, ObjectFieldSelector, PodSpec, PodTemplateSpec, Probe,
    ResourceRequirements, SecretVolumeSource, SecurityContext, Toleration, Volume, VolumeMount,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta};
use kube::{Resource, ResourceExt};
use sha2::{Digest, Sha256};
use ttdp_api::TenstorrentDriverPolicy;
use ttdp_api::driver::v1alpha1::{CaBundleSource, PrebuiltSettings};
use ttdp_api::names::{self, annotations, env, labels};
use ttdp_api::node_selection::NodeSelection;

use crate::error::Error;
use crate::pure::builder_images::hashed_images;
use crate::settings::Settings;

mod module_signing;
use module_signing::{signing_env, signing_mount, signing_volume};

/// Where the host's root filesystem appears in the agent container.
pub const HOST_ROOT: &str = "/host";
/// The agent's entrypoint in the image.
pub const AGENT_COMMAND: &str = "ttdp-agent";
/// The agent's readiness-probe subcommand.
pub const PROBE_SUBCOMMAND: &str = "probe";
/// The readiness probe period (spec: "rechecks every 10s").
pub const PROBE_PERIOD_SECONDS: i32 = 10;
/// How long an agent may take to finish a module swap after SIGTERM.
pub const TERMINATION_GRACE_SECONDS: i64 = 120;
/// The priority class of agent pods.
pub const PRIORITY_CLASS: &str = "system-node-critical";
/// Where the agent finds the prebuilt server's CA bundle, when the policy names one.
pub const CA_BUNDLE_DIR: &str = "/etc/ttdp/prebuilt-ca";
/// The bundle's file name in [`CA_BUNDLE_DIR`], whatever its key in the ConfigMap or Secret.
const CA_BUNDLE_FILE: &str = "ca.crt";
const CA_BUNDLE_VOLUME: &str = "prebuilt-ca";
/// The taint a cordoned node carries.
pub const UNSCHEDULABLE_TAINT: &str = "node.kubernetes.io/unschedulable";

/// Host paths also mounted at their own path in the container (read-only), for kernel builds.
const BUILD_TREE_PATHS: [&str; 2] = ["/lib/modules", "/usr/src"];
/// Host paths mounted only at their own path: udevadm finds udevd's socket nowhere else.
const OWN_PATH_ONLY: [&str; 1] = ["/run/udev"];

/// One host path the agent mounts: volume name, host path, whether read-only, hostPath type.
struct HostMount {
    name: &'static str,
    path: &'static str,
    read_only: bool,
    kind: &'static str,
}

const HOST_MOUNTS: [HostMount; 11] = [
    HostMount {
        name: "host-sys",
        path: "/sys",
        read_only: true,
        kind: "Directory",
    },
    HostMount {
        name: "host-proc",
        path: "/proc",
        read_only: true,
        kind: "Directory",
    },
    HostMount {
        name: "host-lib-modules",
        path: "/lib/modules",
        read_only: true,
        kind: "Directory",
    },
    HostMount {
        name: "host-usr-src",
        path: "/usr/src",
        read_only: true,
        kind: "DirectoryOrCreate",
    },
    HostMount {
        name: "host-dkms",
        path: "/var/lib/dkms",
        read_only: true,
        kind: "DirectoryOrCreate",
    },
    HostMount {
        name: "host-kmd-cache",
        path: "/var/cache/tt-kmd",
        read_only: false,
        kind: "DirectoryOrCreate",
    },
    HostMount {
        name: "host-usr-local-bin",
        path: "/usr/local/bin",
        read_only: false,
        kind: "DirectoryOrCreate",
    },
    // The node-wide module lock: every agent pod on the node (an old one terminating, another
    // policy's during a hand-over) takes the same file, so one swap runs at a time.
    HostMount {
        name: "host-run-ttdp",
        path: "/run/ttdp",
        read_only: false,
        kind: "DirectoryOrCreate",
    },
    HostMount {
        name: "host-dev",
        path: "/dev",
        read_only: true,
        kind: "Directory",
    },
    // tt-kmd's udev rule, written before each load, and udevd's socket to have it reloaded
    HostMount {
        name: "host-udev-rules",
        path: "/etc/udev/rules.d",
        read_only: false,
        kind: "DirectoryOrCreate",
    },
    HostMount {
        name: "host-run-udev",
        path: "/run/udev",
        read_only: true,
        kind: "DirectoryOrCreate",
    },
];

/// The labels on agent pods of `policy` (also the DaemonSet's selector).
pub fn agent_pod_labels(policy: &str) -> BTreeMap<String, String> {
    BTreeMap::from([
        (
            labels::APP_NAME.to_owned(),
            labels::APP_NAME_AGENT.to_owned(),
        ),
        (labels::POLICY.to_owned(), policy.to_owned()),
    ])
}

/// The label selector (string form) of every agent pod of every policy.
pub fn all_agent_pods_selector() -> String {
    format!("{}={}", labels::APP_NAME, labels::APP_NAME_AGENT)
}

/// The desired DaemonSet of `policy`. `selection` is the policy's effective node selection,
/// including nodes excluded because an older policy owns them.
pub fn desired_daemonset(
    policy: &TenstorrentDriverPolicy,
    settings: &Settings,
    selection: &NodeSelection,
) -> Result<DaemonSet, Error> {
    let name = policy.name_any();
    let owner = policy
        .controller_owner_ref(&())
        .ok_or_else(|| Error::MissingUid {
            policy: name.clone(),
        })?;
    let mut template = pod_template(policy, settings, selection);
    if let Some(spec) = template.spec.as_mut() {
        settings.agent_pod.apply(spec);
    }
    let hash = template_hash(&template, &hashed_images(policy, settings))?;
    template
        .metadata
        .get_or_insert_with(ObjectMeta::default)
        .annotations
        .get_or_insert_with(BTreeMap::new)
        .insert(annotations::TEMPLATE_HASH.to_owned(), hash);
    let mut ds_labels = agent_pod_labels(&name);
    ds_labels.insert(
        labels::MANAGED_BY.to_owned(),
        names::CONTROLLER_MANAGER.to_owned(),
    );
    Ok(DaemonSet {
        metadata: ObjectMeta {
            name: Some(names::daemonset_name(&name)),
            namespace: Some(settings.namespace.clone()),
            labels: Some(ds_labels),
            owner_references: Some(vec![owner]),
            ..Default::default()
        },
        spec: Some(DaemonSetSpec {
            selector: LabelSelector {
                match_labels: Some(agent_pod_labels(&name)),
                match_expressions: None,
            },
            template,
            update_strategy: Some(DaemonSetUpdateStrategy {
                type_: Some("OnDelete".to_owned()),
                rolling_update: None,
            }),
            ..Default::default()
        }),
        status: None,
    })
}

/// The template hash a DaemonSet's pods carry (the annotation on its pod template).
pub fn daemonset_template_hash(ds: &DaemonSet) -> Option<&str> {
    ds.spec
        .as_ref()?
        .template
        .metadata
        .as_ref()?
        .annotations
        .as_ref()?
        .get(annotations::TEMPLATE_HASH)
        .map(String::as_str)
}

/// sha256 (hex) of the template's JSON, computed before the hash annotation is added and
/// without the node affinity and selector: which nodes run an agent (the selector, nodes
/// excluded for another policy, the node's compiler family) is the DaemonSet controller's
/// business and must not restart the agents elsewhere. The image is `images`, every image the
/// policy's DaemonSets run, so all of them carry one hash and a node moving between them is
/// not a node to upgrade.
fn template_hash(template: &PodTemplateSpec, images: &str) -> Result<String, Error> {
    let mut hashed = template.clone();
    if let Some(spec) = hashed.spec.as_mut() {
        spec.affinity = None;
        spec.node_selector = None;
        for container in &mut spec.containers {
            container.image = Some(images.to_owned());
        }
    }
    if let Some(labels) = hashed.metadata.as_mut().and_then(|m| m.labels.as_mut()) {
        labels.remove(ttdp_api::names::compiler::BUILDER_GCC_LABEL);
    }
    let json = serde_json::to_vec(&hashed).map_err(Error::Serialize)?;
    Ok(hex::encode(Sha256::digest(&json)))
}

fn pod_template(
    policy: &TenstorrentDriverPolicy,
    settings: &Settings,
    selection: &NodeSelection,
) -> PodTemplateSpec {
    PodTemplateSpec {
        metadata: Some(ObjectMeta {
            labels: Some(agent_pod_labels(&policy.name_any())),
            ..Default::default()
        }),
        spec: Some(PodSpec {
            containers: vec![agent_container(policy, settings)],
            host_pid: policy.spec.upgrade_policy.force_unload.then_some(true),
            priority_class_name: Some(PRIORITY_CLASS.to_owned()),
            service_account_name: Some(settings.agent_service_account.clone()),
            termination_grace_period_seconds: Some(TERMINATION_GRACE_SECONDS),
            tolerations: Some(tolerations()),
            affinity: Some(Affinity {
                node_affinity: Some(selection.node_affinity()),
                ..Default::default()
            }),
            volumes: Some(
                host_volumes()
                    .into_iter()
                    .chain(ca_bundle_volume(policy))
                    .chain(signing_volume(policy))
                    .collect(),
            ),
            ..Default::default()
        }),
    }
}

/// The agent: privileged, with the host's paths mounted, ready when the target is loaded.
fn agent_container(policy: &TenstorrentDriverPolicy, settings: &Settings) -> Container {
    let spec = &policy.spec;
    let image = spec
        .installer
        .image
        .clone()
        .unwrap_or_else(|| settings.default_image.clone());
    Container {
        name: names::AGENT_CONTAINER.to_owned(),
        image: Some(image),
        image_pull_policy: Some(spec.installer.image_pull_policy.clone()),
        command: Some(vec![AGENT_COMMAND.to_owned()]),
        env: Some(agent_env(policy, settings)),
        security_context: Some(SecurityContext {
            privileged: Some(true),
            ..Default::default()
        }),
        readiness_probe: Some(Probe {
            exec: Some(ExecAction {
                command: Some(vec![AGENT_COMMAND.to_owned(), PROBE_SUBCOMMAND.to_owned()]),
            }),
            period_seconds: Some(PROBE_PERIOD_SECONDS),
            timeout_seconds: Some(5),
            failure_threshold: Some(1),
            success_threshold: Some(1),
            ..Default::default()
        }),
        resources: Some(ResourceRequirements {
            requests: Some(BTreeMap::from([
                ("cpu".to_owned(), Quantity("50m".to_owned())),
                ("memory".to_owned(), Quantity("128Mi".to_owned())),
            ])),
            ..Default::default()
        }),
        volume_mounts: Some(
            host_mounts()
                .into_iter()
                .chain(ca_bundle_mount(policy))
                .chain(signing_mount(policy))
                .collect(),
        ),
        termination_message_policy: Some("FallbackToLogsOnError".to_owned()),
        ..Default::default()
    }
}

/// Every host path under the host root, and the kernel headers also at their own paths: Debian
/// and Ubuntu header trees refer to each other by absolute path, so `make` must run against the
/// host's paths.
fn host_mounts() -> Vec<VolumeMount> {
    let under_root = HOST_MOUNTS
        .iter()
        .filter(|m| !OWN_PATH_ONLY.contains(&m.path))
        .map(|m| VolumeMount {
            name: m.name.to_owned(),
            mount_path: format!("{HOST_ROOT}{}", m.path),
            read_only: Some(m.read_only),
            ..Default::default()
        });
    let build_tree = HOST_MOUNTS
        .iter()
        .filter(|m| BUILD_TREE_PATHS.contains(&m.path) || OWN_PATH_ONLY.contains(&m.path))
        .map(|m| VolumeMount {
            name: m.name.to_owned(),
            mount_path: m.path.to_owned(),
            read_only: Some(true),
            ..Default::default()
        });
    under_root.chain(build_tree).collect()
}

/// The host paths the agent mounts.
fn host_volumes() -> Vec<Volume> {
    HOST_MOUNTS
        .iter()
        .map(|m| Volume {
            name: m.name.to_owned(),
            host_path: Some(HostPathVolumeSource {
                path: m.path.to_owned(),
                type_: Some(m.kind.to_owned()),
            }),
            ..Default::default()
        })
        .collect()
}

/// The prebuilt server's CA bundle (`spec.source.prebuilt.caBundle`), as a ConfigMap or Secret
/// volume holding the one key as [`CA_BUNDLE_FILE`].
fn ca_bundle_volume(policy: &TenstorrentDriverPolicy) -> Option<Volume> {
    let bundle = ca_bundle(policy)?;
    let items = Some(vec![KeyToPath {
        key: bundle.key.clone(),
        path: CA_BUNDLE_FILE.to_owned(),
        mode: None,
    }]);
    Some(Volume {
        name: CA_BUNDLE_VOLUME.to_owned(),
        config_map: bundle
            .config_map_name
            .as_ref()
            .map(|name| ConfigMapVolumeSource {
                name: name.clone(),
                items: items.clone(),
                ..Default::default()
            }),
        secret: bundle.secret_name.as_ref().map(|name| SecretVolumeSource {
            secret_name: Some(name.clone()),
            items,
            ..Default::default()
        }),
        ..Default::default()
    })
}

fn ca_bundle_mount(policy: &TenstorrentDriverPolicy) -> Option<VolumeMount> {
    ca_bundle(policy).map(|_| VolumeMount {
        name: CA_BUNDLE_VOLUME.to_owned(),
        mount_path: CA_BUNDLE_DIR.to_owned(),
        read_only: Some(true),
        ..Default::default()
    })
}

fn ca_bundle(policy: &TenstorrentDriverPolicy) -> Option<&CaBundleSource> {
    prebuilt(policy)?.ca_bundle.as_ref()
}

fn prebuilt(policy: &TenstorrentDriverPolicy) -> Option<&PrebuiltSettings> {
    policy.spec.source.as_ref()?.prebuilt.as_ref()
}

/// The agent's prebuilt settings, every one spelled out (the trust switches too, so an image's
/// environment cannot turn them on).
fn prebuilt_env(prebuilt: &PrebuiltSettings) -> Vec<(&'static str, String)> {
    let mut vars = vec![
        (env::TT_KMD_PREBUILT_URL, prebuilt.url.clone()),
        (env::TT_KMD_PREBUILT_FALLBACK, prebuilt.fallback.clone()),
        (
            env::TT_KMD_PREBUILT_TRUST_SERVER_CHECKSUM,
            prebuilt.trust_server_checksum.to_string(),
        ),
        (
            env::TT_KMD_PREBUILT_ALLOW_INSECURE_HTTP,
            prebuilt.allow_insecure_http.to_string(),
        ),
        (
            env::TT_KMD_PREBUILT_ALLOW_CROSS_HOST_REDIRECTS,
            prebuilt.allow_cross_host_redirects.to_string(),
        ),
    ];
    if !prebuilt.checksums.is_empty() {
        // the agent's form: one JSON object of "<version>/<kernelRelease>" to the sha256
        let pins: serde_json::Map<String, serde_json::Value> = prebuilt
            .checksums
            .iter()
            .map(|c| {
                let key = format!("{}/{}", c.version, c.kernel_release);
                (key, serde_json::Value::from(c.sha256.clone()))
            })
            .collect();
        vars.push((
            env::TT_KMD_PREBUILT_SHA256,
            serde_json::Value::from(pins).to_string(),
        ));
    }
    vars
}

/// Tolerate every NoSchedule and NoExecute taint (a cordoned node keeps its agent; the agent
/// is what upgrades it), naming the unschedulable taint explicitly for readers.
fn tolerations() -> Vec<Toleration> {
    let exists = |key: Option<&str>, effect: &str| Toleration {
        key: key.map(str::to_owned),
        operator: Some("Exists".to_owned()),
        effect: Some(effect.to_owned()),
        ..Default::default()
    };
    vec![
        exists(Some(UNSCHEDULABLE_TAINT), "NoSchedule"),
        exists(None, "NoSchedule"),
        exists(None, "NoExecute"),
    ]
}

fn agent_env(policy: &TenstorrentDriverPolicy, settings: &Settings) -> Vec<EnvVar> {
    let value = |name: &str, value: String| EnvVar {
        name: name.to_owned(),
        value: Some(value),
        value_from: None,
    };
    let field = |name: &str, path: &str| EnvVar {
        name: name.to_owned(),
        value: None,
        value_from: Some(EnvVarSource {
            field_ref: Some(ObjectFieldSelector {
                api_version: None,
                field_path: path.to_owned(),
            }),
            ..Default::default()
        }),
    };
    let mut vars = vec![
        value(env::TT_KMD_VERSION, policy.spec.version.clone()),
        value(
            env::TT_FORCE_UNLOAD,
            policy.spec.upgrade_policy.force_unload.to_string(),
        ),
        // No TT_SMI_VERSION: the image's own ENV names the tt-smi it carries, so the node
        // label cannot name one the node does not have when installer.image is overridden.
        value(env::LOG_FORMAT, "json".to_owned()),
        // Set here, never left to the image's environment: `none` or `file:` reporting and the
        // simulated kernel would swap drivers without the controller's grant.
        value(env::REPORT, "kube".to_owned()),
        value(env::KERNEL, "real".to_owned()),
        field(env::NODE_NAME, "spec.nodeName"),
        field(env::POD_NAME, "metadata.name"),
        field(env::POD_NAMESPACE, "metadata.namespace"),
    ];
    // The policy's repository (a mirror), else the chart's; unset: the agent's default.
    let source = policy.spec.source.as_ref();
    if let Some(repo) = source
        .and_then(|s| s.repository.as_ref())
        .or(settings.kmd_repository.as_ref())
    {
        vars.push(value(env::TT_KMD_REPOSITORY, repo.clone()));
    }
    if let Some(commit) = source.and_then(|s| s.commit.as_ref()) {
        vars.push(value(env::TT_KMD_COMMIT, commit.clone()));
    }
    if let Some(prebuilt) = prebuilt(policy) {
        vars.extend(prebuilt_env(prebuilt).into_iter().map(|(n, v)| value(n, v)));
    }
    if ca_bundle(policy).is_some() {
        vars.push(value(
            env::TT_KMD_PREBUILT_CA_FILE,
            format!("{CA_BUNDLE_DIR}/{CA_BUNDLE_FILE}"),
        ));
    }
    vars.extend(signing_env(policy, &settings.namespace));
    // Only when set, like the settings below: a policy without parameters keeps its template
    // hash. The readiness probe reads it too (ready only with the parameters loaded).
    let parameters = policy.spec.kernel_parameters();
    if !parameters.is_empty() {
        vars.push(value(env::TT_KMD_PARAMETERS, parameters));
    }
    // The readiness probe runs in the same container and reads the same variables. Only what
    // differs from the agent's defaults is set, so the template (and its hash) of a policy that
    // keeps the defaults is the one it had before validation existed: no agent restarts.
    let validation = &policy.spec.upgrade_policy.validation;
    if !validation.enable {
        vars.push(value(env::VALIDATE_DEVICES, "false".to_owned()));
    }
    if let Some(command) = validation.command.as_ref().filter(|_| validation.enable) {
        vars.push(value(
            env::VALIDATION_COMMAND,
            serde_json::Value::from(command.clone()).to_string(),
        ));
        vars.push(value(
            env::VALIDATION_TIMEOUT,
            format!("{}s", validation.timeout_seconds),
        ));
    }
    vars
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
    use std::collections::BTreeSet;
    use ttdp_api::TenstorrentDriverPolicySpec;
    use ttdp_api::node_selection::affinity_matches;

    use crate::settings::AgentPodSettings;

    fn policy(name: &str, version: &str) -> TenstorrentDriverPolicy {
        let spec: TenstorrentDriverPolicySpec =
            serde_json::from_value(serde_json::json!({"version": version, "nodeAffinity": {}}))
                .unwrap();
        let mut p = TenstorrentDriverPolicy::new(name, spec);
        p.metadata.uid = Some(format!("uid-{name}"));
        p
    }

    fn render(p: &TenstorrentDriverPolicy) -> DaemonSet {
        let sel = NodeSelection::new(&p.spec.user_selector()).unwrap();
        desired_daemonset(p, &Settings::default(), &sel).unwrap()
    }

    fn pod_spec(ds: &DaemonSet) -> &PodSpec {
        ds.spec.as_ref().unwrap().template.spec.as_ref().unwrap()
    }

    fn env_of(ds: &DaemonSet) -> BTreeMap<String, EnvVar> {
        pod_spec(ds).containers[0]
            .env
            .clone()
            .unwrap()
            .into_iter()
            .map(|e| (e.name.clone(), e))
            .collect()
    }

    /// `p`'s DaemonSet with the chart's agent pod settings `json`.
    fn with_agent_pod(p: &TenstorrentDriverPolicy, json: &str) -> DaemonSet {
        let sel = NodeSelection::new(&p.spec.user_selector()).unwrap();
        let settings = Settings {
            agent_pod: AgentPodSettings::parse(json).unwrap(),
            ..Settings::default()
        };
        desired_daemonset(p, &settings, &sel).unwrap()
    }

    #[test]
    fn the_admins_agent_pod_settings_reach_the_daemonset_and_restart_agents_only_when_they_run_differently()
     {
        let p = policy("fleet", "2.8.0");
        let with = |json: &str| with_agent_pod(&p, json);
        let plain = with("");
        let secrets = with(r#"{"imagePullSecrets":["mirror-creds"]}"#);
        let pulled = pod_spec(&secrets).image_pull_secrets.clone().unwrap();
        assert_eq!(pulled[0].name, "mirror-creds");
        assert_ne!(
            daemonset_template_hash(&secrets),
            daemonset_template_hash(&plain),
            "a pod that pulls differently is a new agent"
        );
        let selected = with(r#"{"nodeSelector":{"kubernetes.io/arch":"amd64"}}"#);
        assert_eq!(
            pod_spec(&selected).node_selector.as_ref().unwrap()["kubernetes.io/arch"],
            "amd64"
        );
        assert_eq!(
            daemonset_template_hash(&selected),
            daemonset_template_hash(&plain),
            "which nodes run an agent restarts none"
        );
    }

    #[test]
    fn the_agents_cache_limit_and_scan_period_are_in_its_env_only_when_set() {
        let p = policy("fleet", "2.8.0");
        let with = |json: &str| with_agent_pod(&p, json);
        let plain = env_of(&with(""));
        assert!(!plain.contains_key(env::CACHE_SIZE_LIMIT));
        assert!(!plain.contains_key(env::KERNEL_SCAN_PERIOD));
        let tuned = with(r#"{"cacheSizeLimit":"8Gi","kernelScanPeriod":"5m"}"#);
        let vars = env_of(&tuned);
        assert_eq!(vars[env::CACHE_SIZE_LIMIT].value.as_deref(), Some("8Gi"));
        assert_eq!(vars[env::KERNEL_SCAN_PERIOD].value.as_deref(), Some("5m"));
        assert_ne!(
            daemonset_template_hash(&tuned),
            daemonset_template_hash(&with("")),
            "agents given another limit are new agents"
        );
    }

    #[test]
    fn named_owned_and_updated_on_delete() {
        let ds = render(&policy("fleet", "2.8.0"));
        assert_eq!(ds.metadata.name.as_deref(), Some("ttdrv-fleet"));
        assert_eq!(
            ds.metadata.namespace.as_deref(),
            Some(names::DEFAULT_NAMESPACE)
        );
        let owner = &ds.metadata.owner_references.as_ref().unwrap()[0];
        assert_eq!(owner.kind, "TenstorrentDriverPolicy");
        assert_eq!(owner.name, "fleet");
        assert_eq!(owner.uid, "uid-fleet");
        assert_eq!(owner.controller, Some(true));
        let spec = ds.spec.as_ref().unwrap();
        assert_eq!(
            spec.update_strategy.as_ref().unwrap().type_.as_deref(),
            Some("OnDelete")
        );
        let pod_labels = spec
            .template
            .metadata
            .as_ref()
            .unwrap()
            .labels
            .as_ref()
            .unwrap();
        assert_eq!(
            pod_labels.get(labels::POLICY).map(String::as_str),
            Some("fleet")
        );
        assert_eq!(spec.selector.match_labels.as_ref(), Some(pod_labels));
    }

    #[test]
    fn a_policy_without_uid_cannot_own_its_daemonset() {
        let mut p = policy("fleet", "2.8.0");
        p.metadata.uid = None;
        let sel = NodeSelection::new(&LabelSelector::default()).unwrap();
        let err = desired_daemonset(&p, &Settings::default(), &sel).unwrap_err();
        assert!(err.to_string().contains("fleet"), "{err}");
    }

    #[test]
    fn agent_is_privileged_probed_every_ten_seconds_and_node_critical() {
        let ds = render(&policy("fleet", "2.8.0"));
        let spec = pod_spec(&ds);
        let c = &spec.containers[0];
        assert_eq!(c.security_context.as_ref().unwrap().privileged, Some(true));
        let probe = c.readiness_probe.as_ref().unwrap();
        assert_eq!(probe.period_seconds, Some(10));
        assert_eq!(
            probe.exec.as_ref().unwrap().command.as_deref(),
            Some(&["ttdp-agent".to_owned(), "probe".to_owned()][..])
        );
        assert_eq!(
            spec.priority_class_name.as_deref(),
            Some("system-node-critical")
        );
        assert_eq!(spec.host_pid, None, "hostPID only with forceUnload");
    }

    #[test]
    fn validation_settings_reach_the_agent_and_its_probe() {
        // the defaults (validation on, no command) are the agent's own: nothing is set
        let defaults = env_of(&render(&policy("fleet", "2.8.0")));
        assert!(!defaults.contains_key(env::VALIDATE_DEVICES));
        assert!(!defaults.contains_key(env::VALIDATION_COMMAND));

        let mut p = policy("fleet", "2.8.0");
        p.spec.upgrade_policy.validation.command = Some(vec![
            "tt-smi".into(),
            "-s".into(),
            "--snapshot_no_tty".into(),
        ]);
        p.spec.upgrade_policy.validation.timeout_seconds = 90;
        let with_command = env_of(&render(&p));
        assert_eq!(
            with_command[env::VALIDATION_COMMAND].value.as_deref(),
            Some(r#"["tt-smi","-s","--snapshot_no_tty"]"#)
        );
        assert_eq!(
            with_command[env::VALIDATION_TIMEOUT].value.as_deref(),
            Some("90s")
        );

        p.spec.upgrade_policy.validation.enable = false;
        let off = env_of(&render(&p));
        assert_eq!(off[env::VALIDATE_DEVICES].value.as_deref(), Some("false"));
        assert!(!off.contains_key(env::VALIDATION_COMMAND));
    }

    #[test]
    fn host_pid_only_with_force_unload() {
        let mut p = policy("fleet", "2.8.0");
        p.spec.upgrade_policy.force_unload = true;
        let ds = render(&p);
        assert_eq!(pod_spec(&ds).host_pid, Some(true));
        assert_eq!(
            env_of(&ds)[env::TT_FORCE_UNLOAD].value.as_deref(),
            Some("true")
        );
    }

    #[test]
    fn only_the_documented_host_paths_with_write_access_only_to_cache_bin_lock_and_rules() {
        let ds = render(&policy("fleet", "2.8.0"));
        let spec = pod_spec(&ds);
        let host_paths: BTreeSet<&str> = spec
            .volumes
            .as_ref()
            .unwrap()
            .iter()
            .map(|v| v.host_path.as_ref().unwrap().path.as_str())
            .collect();
        assert_eq!(
            host_paths,
            BTreeSet::from([
                "/sys",
                "/proc",
                "/lib/modules",
                "/usr/src",
                "/var/lib/dkms",
                "/var/cache/tt-kmd",
                "/usr/local/bin",
                "/run/ttdp",
                "/dev",
                "/etc/udev/rules.d",
                "/run/udev"
            ])
        );
        assert!(!host_paths.contains("/"), "never the whole host root");
        let writable: BTreeSet<&str> = spec.containers[0]
            .volume_mounts
            .as_ref()
            .unwrap()
            .iter()
            .filter(|m| m.read_only != Some(true))
            .map(|m| m.mount_path.as_str())
            .collect();
        assert_eq!(
            writable,
            BTreeSet::from([
                "/host/var/cache/tt-kmd",
                "/host/usr/local/bin",
                "/host/run/ttdp",
                "/host/etc/udev/rules.d"
            ])
        );
        let own_paths: BTreeSet<&str> = spec.containers[0]
            .volume_mounts
            .as_ref()
            .unwrap()
            .iter()
            .filter(|m| !m.mount_path.starts_with("/host/"))
            .map(|m| m.mount_path.as_str())
            .collect();
        assert_eq!(
            own_paths,
            BTreeSet::from(["/lib/modules", "/usr/src", "/run/udev"]),
            "kernel headers also at their own paths, for builds; udevd's socket only there"
        );
    }

    /// Parameters reach the agent (and its readiness probe) only when set, so a policy
    /// without them keeps its template, and a change of them alone changes the template.
    #[test]
    fn module_parameters_are_passed_only_when_set() {
        let plain = policy("fleet", "2.8.0");
        assert!(!env_of(&render(&plain)).contains_key(env::TT_KMD_PARAMETERS));
        let mut empty = plain.clone();
        empty.spec.module = Some(Default::default());
        assert_eq!(
            render(&empty),
            render(&plain),
            "an empty list changes nothing"
        );
        let mut set = plain.clone();
        set.spec.module = Some(ttdp_api::driver::v1alpha1::ModuleSettings {
            parameters: vec!["reset_limit=5".into(), "debug=1".into()],
            signing: None,
        });
        let ds = render(&set);
        assert_eq!(
            env_of(&ds)[env::TT_KMD_PARAMETERS].value.as_deref(),
            Some("reset_limit=5 debug=1")
        );
        assert_ne!(ds, render(&plain));
    }

    /// The policy's repository wins over the chart's; the pin is passed only when set.
    #[test]
    fn the_policy_source_reaches_the_agent() {
        let settings = Settings {
            kmd_repository: Some("https://chart.example/tt-kmd.git".into()),
            ..Settings::default()
        };
        let render_with = |p: &TenstorrentDriverPolicy| {
            let sel = NodeSelection::new(&p.spec.user_selector()).unwrap();
            desired_daemonset(p, &settings, &sel).unwrap()
        };
        let plain = policy("fleet", "2.8.0");
        let e = env_of(&render_with(&plain));
        assert_eq!(
            e[env::TT_KMD_REPOSITORY].value.as_deref(),
            Some("https://chart.example/tt-kmd.git")
        );
        assert!(!e.contains_key(env::TT_KMD_COMMIT));
        let mut mirrored = plain.clone();
        mirrored.spec.source = Some(ttdp_api::driver::v1alpha1::SourceSettings {
            repository: Some("https://mirror.example/tt-kmd.git".into()),
            commit: Some("0123456789abcdef0123456789abcdef01234567".into()),
            prebuilt: None,
        });
        let e = env_of(&render_with(&mirrored));
        assert_eq!(
            e[env::TT_KMD_REPOSITORY].value.as_deref(),
            Some("https://mirror.example/tt-kmd.git")
        );
        assert_eq!(
            e[env::TT_KMD_COMMIT].value.as_deref(),
            Some("0123456789abcdef0123456789abcdef01234567")
        );
    }

    /// The prebuilt server reaches the agent, and its CA bundle is mounted read-only from the
    /// ConfigMap or Secret the policy names, under one file name whatever its key.
    #[test]
    fn the_prebuilt_server_and_its_ca_bundle_reach_the_agent() {
        use ttdp_api::driver::v1alpha1::{
            CaBundleSource, PinnedChecksum, PrebuiltSettings, SourceSettings,
        };
        let plain = policy("fleet", "2.8.0");
        let e = env_of(&render(&plain));
        assert!(!e.contains_key(env::TT_KMD_PREBUILT_URL));
        assert!(!e.contains_key(env::TT_KMD_PREBUILT_CA_FILE));
        let url = "https://ko.example/tt-kmd/{version}/{kernelRelease}/tenstorrent.ko";
        let with_bundle = |bundle: CaBundleSource| {
            let mut p = plain.clone();
            p.spec.source = Some(SourceSettings {
                prebuilt: Some(PrebuiltSettings {
                    url: url.into(),
                    fallback: "Fail".into(),
                    ca_bundle: Some(bundle),
                    checksums: vec![PinnedChecksum {
                        version: "2.8.0".into(),
                        kernel_release: "6.8.0-sim".into(),
                        sha256: "ab".repeat(32),
                    }],
                    trust_server_checksum: false,
                    allow_insecure_http: false,
                    allow_cross_host_redirects: true,
                }),
                ..SourceSettings::default()
            });
            render(&p)
        };
        let ds = with_bundle(CaBundleSource {
            config_map_name: Some("ko-ca".into()),
            secret_name: None,
            key: "bundle.pem".into(),
        });
        let e = env_of(&ds);
        assert_eq!(e[env::TT_KMD_PREBUILT_URL].value.as_deref(), Some(url));
        assert_eq!(
            e[env::TT_KMD_PREBUILT_FALLBACK].value.as_deref(),
            Some("Fail")
        );
        let pins: BTreeMap<String, String> =
            serde_json::from_str(e[env::TT_KMD_PREBUILT_SHA256].value.as_deref().unwrap()).unwrap();
        assert_eq!(
            pins,
            BTreeMap::from([("2.8.0/6.8.0-sim".to_owned(), "ab".repeat(32))])
        );
        // the trust switches are always spelled out, false included
        for (name, want) in [
            (env::TT_KMD_PREBUILT_TRUST_SERVER_CHECKSUM, "false"),
            (env::TT_KMD_PREBUILT_ALLOW_INSECURE_HTTP, "false"),
            (env::TT_KMD_PREBUILT_ALLOW_CROSS_HOST_REDIRECTS, "true"),
        ] {
            assert_eq!(e[name].value.as_deref(), Some(want), "{name}");
        }
        let ca_file = e[env::TT_KMD_PREBUILT_CA_FILE].value.clone().unwrap();
        assert_eq!(ca_file, format!("{CA_BUNDLE_DIR}/ca.crt"));
        let volume = |ds: &DaemonSet| {
            pod_spec(ds)
                .volumes
                .as_ref()
                .unwrap()
                .iter()
                .find(|v| v.name == CA_BUNDLE_VOLUME)
                .cloned()
                .unwrap()
        };
        let cm = volume(&ds).config_map.unwrap();
        assert_eq!(cm.name, "ko-ca");
        let items = cm.items.unwrap();
        assert_eq!(
            (items[0].key.as_str(), items[0].path.as_str()),
            ("bundle.pem", "ca.crt")
        );
        let mount = pod_spec(&ds).containers[0]
            .volume_mounts
            .as_ref()
            .unwrap()
            .iter()
            .find(|m| m.name == CA_BUNDLE_VOLUME)
            .cloned()
            .unwrap();
        assert_eq!(
            (mount.mount_path.as_str(), mount.read_only),
            (CA_BUNDLE_DIR, Some(true))
        );

        let ds = with_bundle(CaBundleSource {
            config_map_name: None,
            secret_name: Some("ko-tls".into()),
            key: "ca.crt".into(),
        });
        let v = volume(&ds);
        assert!(v.config_map.is_none());
        assert_eq!(v.secret.unwrap().secret_name.as_deref(), Some("ko-tls"));
    }

    /// The image's environment cannot choose where the agent reports or which kernel it
    /// loads into: both are set on every agent, so a swap always waits for the grant.
    #[test]
    fn reporting_and_kernel_are_set_explicitly_on_every_agent() {
        let e = env_of(&render(&policy("fleet", "2.8.0")));
        assert_eq!(e[env::REPORT].value.as_deref(), Some("kube"));
        assert_eq!(e[env::KERNEL].value.as_deref(), Some("real"));
        assert!(e[env::REPORT].value_from.is_none() && e[env::KERNEL].value_from.is_none());
    }

    #[test]
    fn env_carries_version_and_downward_api() {
        let ds = render(&policy("fleet", "2.8.0"));
        let e = env_of(&ds);
        assert_eq!(e[env::TT_KMD_VERSION].value.as_deref(), Some("2.8.0"));
        assert_eq!(e[env::TT_FORCE_UNLOAD].value.as_deref(), Some("false"));
        assert!(
            !e.contains_key(env::TT_SMI_VERSION),
            "the tt-smi label's version comes from the image's own ENV"
        );
        let path = |k: &str| {
            e[k].value_from
                .as_ref()
                .unwrap()
                .field_ref
                .as_ref()
                .unwrap()
                .field_path
                .clone()
        };
        assert_eq!(path(env::NODE_NAME), "spec.nodeName");
        assert_eq!(path(env::POD_NAME), "metadata.name");
        assert_eq!(path(env::POD_NAMESPACE), "metadata.namespace");
        assert!(
            !e.contains_key(env::TT_KMD_REPOSITORY),
            "agent default unless configured"
        );
    }

    #[test]
    fn image_defaults_to_the_chart_image_and_follows_the_override() {
        let ds = render(&policy("fleet", "2.8.0"));
        let c = &pod_spec(&ds).containers[0];
        assert_eq!(
            c.image.as_deref(),
            Some(crate::settings::default_image().as_str())
        );
        assert_eq!(c.image_pull_policy.as_deref(), Some("IfNotPresent"));
        let mut p = policy("fleet", "2.8.0");
        p.spec.installer.image = Some("example.com/builder:sha-abc".into());
        p.spec.installer.image_pull_policy = "Always".into();
        let ds = render(&p);
        let c = &pod_spec(&ds).containers[0];
        assert_eq!(c.image.as_deref(), Some("example.com/builder:sha-abc"));
        assert_eq!(c.image_pull_policy.as_deref(), Some("Always"));
    }

    #[test]
    fn tolerates_cordon_and_every_noschedule_noexecute_taint() {
        let ds = render(&policy("fleet", "2.8.0"));
        let t = pod_spec(&ds).tolerations.clone().unwrap();
        let tolerates = |key: &str, effect: &str| {
            t.iter().any(|t| {
                t.operator.as_deref() == Some("Exists")
                    && t.effect.as_deref() == Some(effect)
                    && t.key.as_deref().is_none_or(|k| k == key)
            })
        };
        assert!(tolerates(UNSCHEDULABLE_TAINT, "NoSchedule"));
        assert!(tolerates("node.kubernetes.io/not-ready", "NoExecute"));
        assert!(tolerates("example.com/anything", "NoSchedule"));
    }

    #[test]
    fn affinity_is_the_selection_and_excludes_conflicting_nodes() {
        let mut p = policy("fleet", "2.8.0");
        p.spec.node_affinity = Some(LabelSelector {
            match_labels: Some(BTreeMap::from([("pool".into(), "a".into())])),
            match_expressions: None,
        });
        let mut sel = NodeSelection::new(&p.spec.user_selector()).unwrap();
        sel.excluded.insert("n2".into());
        let ds = desired_daemonset(&p, &Settings::default(), &sel).unwrap();
        let affinity = pod_spec(&ds)
            .affinity
            .as_ref()
            .unwrap()
            .node_affinity
            .as_ref()
            .unwrap();
        let tt = BTreeMap::from([
            ("pool".to_owned(), "a".to_owned()),
            (labels::NFD_TENSTORRENT.to_owned(), "true".to_owned()),
        ]);
        assert!(affinity_matches(affinity, "n1", &tt));
        assert!(!affinity_matches(affinity, "n2", &tt), "excluded node");
        let mut skipped = tt.clone();
        skipped.insert(labels::SKIP.into(), "true".into());
        assert!(!affinity_matches(affinity, "n1", &skipped));
        let mut other_pool = tt.clone();
        other_pool.insert("pool".into(), "b".into());
        assert!(!affinity_matches(affinity, "n1", &other_pool));
    }

    /// The API server accepts a `metadata.name` field requirement only with exactly one value
    /// for `In` and `NotIn`: nodes owned by older policies are excluded one requirement each.
    #[test]
    fn every_excluded_node_gets_its_own_single_value_field_requirement() {
        let p = policy("fleet", "2.8.0");
        let mut sel = NodeSelection::new(&p.spec.user_selector()).unwrap();
        for n in ["n2", "n3", "n4"] {
            sel.excluded.insert(n.into());
        }
        let ds = desired_daemonset(&p, &Settings::default(), &sel).unwrap();
        let affinity = pod_spec(&ds)
            .affinity
            .as_ref()
            .unwrap()
            .node_affinity
            .as_ref()
            .unwrap();
        let terms = &affinity
            .required_during_scheduling_ignored_during_execution
            .as_ref()
            .unwrap()
            .node_selector_terms;
        assert_eq!(terms.len(), 1, "one term: its requirements are ANDed");
        let fields = terms[0].match_fields.as_ref().unwrap();
        let excluded: Vec<(&str, &str, &[String])> = fields
            .iter()
            .map(|r| {
                (
                    r.key.as_str(),
                    r.operator.as_str(),
                    r.values.as_deref().unwrap(),
                )
            })
            .collect();
        assert_eq!(
            excluded,
            vec![
                ("metadata.name", "NotIn", &["n2".to_owned()][..]),
                ("metadata.name", "NotIn", &["n3".to_owned()][..]),
                ("metadata.name", "NotIn", &["n4".to_owned()][..]),
            ]
        );
        let tt = BTreeMap::from([(labels::NFD_TENSTORRENT.to_owned(), "true".to_owned())]);
        assert!(affinity_matches(affinity, "n1", &tt));
        for n in ["n2", "n3", "n4"] {
            assert!(!affinity_matches(affinity, n, &tt), "{n} is excluded");
        }
        let none = render(&p);
        let term = &pod_spec(&none)
            .affinity
            .as_ref()
            .unwrap()
            .node_affinity
            .as_ref()
            .unwrap()
            .required_during_scheduling_ignored_during_execution
            .as_ref()
            .unwrap()
            .node_selector_terms[0];
        assert_eq!(
            term.match_fields, None,
            "no field requirement without exclusions"
        );
    }

    #[test]
    fn template_hash_follows_the_template() {
        let a = render(&policy("fleet", "2.8.0"));
        let again = render(&policy("fleet", "2.8.0"));
        let b = render(&policy("fleet", "2.7.0"));
        let ha = daemonset_template_hash(&a).unwrap();
        assert_eq!(ha.len(), 64);
        assert_eq!(
            ha,
            daemonset_template_hash(&again).unwrap(),
            "deterministic"
        );
        assert_ne!(
            ha,
            daemonset_template_hash(&b).unwrap(),
            "version changes the hash"
        );
        let mut p = policy("fleet", "2.8.0");
        p.spec.installer.image = Some("example.com/builder:2".into());
        assert_ne!(
            ha,
            daemonset_template_hash(&render(&p)).unwrap(),
            "image changes the hash"
        );
        let mut other_nodes = policy("fleet", "2.8.0");
        other_nodes.spec.node_affinity = Some(LabelSelector {
            match_labels: Some(BTreeMap::from([("pool".into(), "b".into())])),
            match_expressions: None,
        });
        assert_eq!(
            ha,
            daemonset_template_hash(&render(&other_nodes)).unwrap(),
            "changing which nodes run agents does not restart agents"
        );
        let mut paused = policy("fleet", "2.8.0");
        paused.spec.paused = true;
        assert_eq!(
            ha,
            daemonset_template_hash(&render(&paused)).unwrap(),
            "pausing does not"
        );
    }

    #[test]
    fn the_signing_secret_is_mounted_read_only_and_named_to_the_agent() {
        use super::module_signing::{SIGNING_DIR, SIGNING_VOLUME};
        use ttdp_api::driver::module_settings::ModuleSigning;
        let plain = policy("fleet", "2.8.0");
        let mut signed = plain.clone();
        signed.spec.module = Some(ttdp_api::driver::v1alpha1::ModuleSettings {
            parameters: Vec::new(),
            signing: Some(ModuleSigning {
                secret_name: "tt-kmd-signing".into(),
            }),
        });
        let ds = render(&signed);
        let env = env_of(&ds);
        assert_eq!(
            env[env::MODULE_SIGNING_DIR].value.as_deref(),
            Some(SIGNING_DIR)
        );
        assert_eq!(
            env[env::MODULE_SIGNING_SECRET].value.as_deref(),
            Some(format!("{}/tt-kmd-signing", names::DEFAULT_NAMESPACE).as_str())
        );
        let volume = pod_spec(&ds)
            .volumes
            .as_ref()
            .unwrap()
            .iter()
            .find(|v| v.name == SIGNING_VOLUME)
            .expect("the signing volume");
        let secret = volume.secret.as_ref().expect("a Secret volume");
        assert_eq!(secret.secret_name.as_deref(), Some("tt-kmd-signing"));
        assert_eq!(secret.default_mode, Some(0o400), "root alone reads the key");
        assert_eq!(
            secret.optional,
            Some(true),
            "a missing Secret lets the agent start and say so"
        );
        let keys: Vec<&str> = secret
            .items
            .as_ref()
            .unwrap()
            .iter()
            .map(|i| i.key.as_str())
            .collect();
        assert_eq!(keys, ["tls.key", "tls.crt"]);
        assert!(volume.host_path.is_none());
        let mount = pod_spec(&ds).containers[0]
            .volume_mounts
            .as_ref()
            .unwrap()
            .iter()
            .find(|m| m.name == SIGNING_VOLUME)
            .expect("the signing mount");
        assert_eq!(
            (mount.mount_path.as_str(), mount.read_only),
            (SIGNING_DIR, Some(true))
        );

        let unsigned = render(&plain);
        assert!(!env_of(&unsigned).contains_key(env::MODULE_SIGNING_DIR));
        assert!(
            pod_spec(&unsigned)
                .volumes
                .as_ref()
                .unwrap()
                .iter()
                .all(|v| v.name != SIGNING_VOLUME),
            "no signing, no Secret volume"
        );
        assert_ne!(
            daemonset_template_hash(&ds),
            daemonset_template_hash(&unsigned),
            "turning signing on restarts the agents with the key"
        );
    }
}
