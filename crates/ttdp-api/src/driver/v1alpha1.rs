//! `driver.tenstorrent.com/v1alpha1`: the `TenstorrentDriverPolicy` custom resource.
//!
//! Defaults live both here (serde) and in the generated schema, so `kubectl get ttdp -o yaml`
//! shows them. Validation rules are CEL (`x-kubernetes-validations`) in the schema; the one
//! thing CEL cannot check, the `podSelectorLabel` grammar, is checked by
//! [`TenstorrentDriverPolicySpec::validate`] and reported by the controller as `InvalidSpec`.

use k8s_openapi::apimachinery::pkg::apis::meta::v1 as metav1;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::{CustomResource, KubeSchema};
use serde::{Deserialize, Serialize};

pub use super::module_settings::{ModuleParameterError, ModuleSettings};
pub use super::node_kernels::{
    KernelNotReady, MAX_KERNEL_MESSAGE_CHARS, MAX_KERNELS_LISTED, NextKernelState, NextKernels,
    NodeStartLoad,
};
pub use super::policy_status::{
    MAX_NODE_MESSAGE_CHARS, NodeState, NodeStatus, RolloutStatus, Summary,
    TenstorrentDriverPolicyStatus, WAITING_FOR_SLOT, WAITING_TO_START, condition, rollout_phase,
};
pub use super::rollout_guards::{
    CanaryPolicy, MaintenanceSchedule, MaintenanceWindow, ScheduleError, WaitForCompletion,
    WindowState,
};
pub use super::source_settings::{
    CaBundleSource, PinnedChecksum, PrebuiltSettings, SourceSettings,
};
use crate::selector::{Selector, SelectorError};

/// Regular expression (RE2, as used in the CEL rules) for a label key.
pub const LABEL_KEY_PATTERN: &str = "^([a-z0-9]([-a-z0-9]*[a-z0-9])?([.][a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$";
/// Regular expression (RE2) for a label value.
pub const LABEL_VALUE_PATTERN: &str = "^(([A-Za-z0-9][-A-Za-z0-9_.]{0,61})?[A-Za-z0-9])?$";
/// Regular expression for `spec.version`.
pub const VERSION_PATTERN: &str = "^[0-9]+[.][0-9]+[.][0-9]+$";

/// Desired state: which tt-kmd version runs on which Tenstorrent nodes, and how to get there.
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[kube(
    group = "driver.tenstorrent.com",
    version = "v1alpha1",
    kind = "TenstorrentDriverPolicy",
    plural = "tenstorrentdriverpolicies",
    singular = "tenstorrentdriverpolicy",
    shortname = "ttdp",
    category = "tenstorrent",
    status = "TenstorrentDriverPolicyStatus",
    derive = "PartialEq",
    doc = "Installs and upgrades the tt-kmd kernel driver on the Tenstorrent nodes it selects.",
    printcolumn(name = "Version", type_ = "string", json_path = ".spec.version"),
    printcolumn(name = "Matched", type_ = "integer", json_path = ".status.summary.matched"),
    printcolumn(name = "UpToDate", type_ = "integer", json_path = ".status.summary.upToDate"),
    printcolumn(name = "InProgress", type_ = "integer", json_path = ".status.summary.inProgress"),
    printcolumn(name = "Failed", type_ = "integer", json_path = ".status.summary.failed"),
    printcolumn(name = "Paused", type_ = "boolean", json_path = ".spec.paused"),
    // Canary, Soaking, Halted, RollingBack, ...; empty for a policy without a canary
    printcolumn(name = "Rollout", type_ = "string", json_path = ".status.rollout.phase"),
    printcolumn(name = "Age", type_ = "date", json_path = ".metadata.creationTimestamp"),
    validation = Rule::new("size(self.metadata.name) <= 57").message(
        "metadata.name must be at most 57 characters: the DaemonSet ttdrv-<name> must fit in 63"
    ),
)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("has(self.nodeAffinity) != has(self.nodeSelector)").message(
    "set exactly one of spec.nodeAffinity and spec.nodeSelector (a deprecated alias); use nodeAffinity: {} to select every Tenstorrent node"
))]
pub struct TenstorrentDriverPolicySpec {
    /// tt-kmd release tag without the `ttkmd-` prefix, e.g. `2.8.0`.
    #[schemars(length(max = 32))]
    #[x_kube(validation = Rule::new("self.matches('^[0-9]+[.][0-9]+[.][0-9]+$')").message(
        "spec.version must be a tt-kmd release like 2.8.0 (MAJOR.MINOR.PATCH, without the ttkmd- prefix)"
    ))]
    pub version: String,

    /// Which nodes to manage, a standard label selector (`matchLabels` and/or
    /// `matchExpressions`). `{}` selects all nodes; it is always ANDed with the Node Feature
    /// Discovery label of Tenstorrent devices and with "no `driver.tenstorrent.com/skip` label".
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "label_selector_schema")]
    pub node_affinity: Option<metav1::LabelSelector>,

    /// Deprecated alias of `nodeAffinity` (same shape). Set one of the two.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "label_selector_schema")]
    pub node_selector: Option<metav1::LabelSelector>,

    /// Soft stop: no node leaves Pending or Done; nodes already cordoned finish their upgrade
    /// and are uncordoned; changes to version, module parameters or module signing made while
    /// paused are staged until unpaused; the DaemonSet keeps running.
    #[serde(default)]
    pub paused: bool,

    /// How upgrades proceed node by node.
    #[serde(default)]
    pub upgrade_policy: UpgradePolicy,

    /// Builder (agent) image overrides.
    #[serde(default)]
    pub installer: Installer,

    /// How the module is loaded (its parameters) and signed (for Secure Boot). Unset: the
    /// module's defaults, unsigned.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub module: Option<ModuleSettings>,

    /// Where tt-kmd is fetched from, and the commit its tag is pinned to. Unset: the chart's
    /// repository, any commit.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source: Option<SourceSettings>,
}

/// How a version change is rolled out.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new(
    "!self.forceUnload || !has(self.drain) || self.drain.enable || (has(self.forceUnloadWithoutDrain) && self.forceUnloadWithoutDrain)"
).message(
    "spec.upgradePolicy.forceUnload with drain.enable: false SIGKILLs the processes of workloads that were never evicted; enable the drain, or set upgradePolicy.forceUnloadWithoutDrain: true to accept that"
))]
pub struct UpgradePolicy {
    /// Cordon and drain before swapping the module.
    #[serde(default)]
    pub drain: DrainPolicy,

    /// Last resort: SIGKILL every process still holding `/dev/tenstorrent` after the drain,
    /// before unloading the module.
    #[serde(default)]
    pub force_unload: bool,

    /// Accept that `forceUnload` with `drain.enable: false` SIGKILLs the processes of workloads
    /// nothing evicted first. Without it the API server refuses that combination.
    #[serde(default)]
    pub force_unload_without_drain: bool,

    /// How many nodes may be cordoned for an upgrade at once, each from its Cordoning until its
    /// cordon is lifted in Uncordoning: an integer >= 1 or a percentage of matched nodes such as
    /// `"25%"` (rounded down, at least 1).
    #[serde(default = "default_max_unavailable")]
    #[x_kube(validation = Rule::new("string(self).matches('^([1-9][0-9]*|([1-9][0-9]?|100)%)$')").message(
        "spec.upgradePolicy.maxUnavailable must be an integer >= 1 or a percentage from 1% to 100% such as \"25%\""
    ))]
    pub max_unavailable: IntOrString,

    /// How long, in seconds, a node may stay in one step (Cordoning, Draining, Upgrading)
    /// without moving on: past it the node fails with `NodeTimeout` (its agent pod never
    /// started or never got Ready, its drain or its module swap made no progress), frees its
    /// slot and counts against the failure budget. Counted from when the node entered the step
    /// (its `lastTransitionTime`), so a controller restart does not reset it. In Draining the
    /// longer of this and `drain.timeoutSeconds` applies.
    #[serde(default = "default_node_timeout_seconds")]
    #[x_kube(validation = Rule::new("self >= 1 && self <= 604800").message(
        "spec.upgradePolicy.nodeTimeoutSeconds must be from 1 to 604800 (7 days): the seconds a node may spend in one step before it fails with NodeTimeout"
    ))]
    pub node_timeout_seconds: i64,

    /// How a node proves the new driver works after the load, before it is Ready.
    #[serde(default)]
    pub validation: ValidationPolicy,

    /// Upgrade a few nodes first and let them run (soak) before the rest. Unset: no canary.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub canary: Option<CanaryPolicy>,

    /// On a cordoned node, wait for matching pods (jobs) to finish before evicting anything.
    /// Unset: drain at once.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub wait_for_completion: Option<WaitForCompletion>,

    /// Maintenance windows: no node starts Cordoning outside them. Unset: any time.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub schedule: Option<MaintenanceSchedule>,
}

/// Post-load validation: a failed one loads the previous version back and fails the node.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("self.enable || !has(self.command)").message(
    "spec.upgradePolicy.validation.command runs only with validation.enable: true; remove the command or enable validation"
))]
pub struct ValidationPolicy {
    /// Every Tenstorrent PCI device (vendor 1e52) must be bound to the `tenstorrent` driver with
    /// its `/dev/tenstorrent/<n>` node (checked again by the readiness probe). `false`: the
    /// loaded version alone makes the node Ready.
    #[serde(default = "yes")]
    pub enable: bool,

    /// Optional command from the agent image that must also exit 0, e.g.
    /// `["tt-smi", "-s", "--snapshot_no_tty"]`; it runs in the agent container (host root at
    /// `/host`). Unset: none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 32), inner(length(max = 4096)))]
    #[x_kube(validation = Rule::new("self[0] != ''").message(
        "spec.upgradePolicy.validation.command must start with the program to run, e.g. [\"tt-smi\", \"-s\"]"
    ))]
    pub command: Option<Vec<String>>,

    /// Seconds the command may run before it counts as failed.
    #[serde(default = "default_validation_timeout_seconds")]
    #[x_kube(validation = Rule::new("self >= 1 && self <= 300").message(
        "spec.upgradePolicy.validation.timeoutSeconds must be from 1 to 300: the seconds the validation command may run"
    ))]
    pub timeout_seconds: i64,
}

/// The two-pass drain before a node's module is swapped.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct DrainPolicy {
    /// Pass 1: cordon and evict pods that use `/dev/tenstorrent`. `false` skips Cordoning and
    /// Draining entirely.
    #[serde(default = "yes")]
    pub enable: bool,

    /// Pass 2: full `kubectl drain` semantics on the cordoned node (every pod not managed by a
    /// DaemonSet), which catches containers that reach the device without a hostPath mount.
    #[serde(default = "yes")]
    pub full_node: bool,

    /// Restricts pass 2 to pods matching this label selector (`key=value`, `key`,
    /// `key notin (a,b)`, ...). Empty: every pod.
    #[serde(default)]
    #[schemars(length(max = 1024))]
    pub pod_selector_label: String,

    /// Evict bare pods (no controller, or whose DaemonSet is gone) instead of skipping them.
    /// Without it they stay on the node, the drain goes on, and the node's message and an
    /// Event name them. Applies to both passes.
    #[serde(default)]
    pub force: bool,

    /// Evict pods with `emptyDir` volumes (their data is lost), in both passes. Off: such a pod,
    /// one that uses the device included, stops the drain with `DrainRefused`, naming it.
    #[serde(default = "yes")]
    pub delete_empty_dir: bool,

    /// Per-node drain deadline in seconds.
    #[serde(default = "default_timeout_seconds")]
    #[x_kube(validation = Rule::new("self >= 1").message(
        "spec.upgradePolicy.drain.timeoutSeconds must be at least 1"
    ))]
    pub timeout_seconds: i64,
}

/// Per-policy override of the builder (agent) image.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct Installer {
    /// The builder image, run on every node of the policy. Unset: each node runs the chart's
    /// builder image of the gcc that built its kernel (`driver.builderImages`, else
    /// `driver.image`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 512))]
    pub image: Option<String>,

    /// `Always`, `IfNotPresent` or `Never`.
    #[serde(default = "default_pull_policy")]
    #[schemars(length(max = 16))]
    #[x_kube(validation = Rule::new("self in ['Always', 'IfNotPresent', 'Never']").message(
        "spec.installer.imagePullPolicy must be one of Always, IfNotPresent, Never"
    ))]
    pub image_pull_policy: String,
}

fn yes() -> bool {
    true
}
fn default_timeout_seconds() -> i64 {
    600
}
/// Long enough for a cache-cold build on a slow host (fetch and `make modules` usually take
/// 1-2 minutes), short enough that a dead node does not hold its slot for long.
fn default_node_timeout_seconds() -> i64 {
    1800
}
fn default_validation_timeout_seconds() -> i64 {
    60
}
fn default_max_unavailable() -> IntOrString {
    IntOrString::Int(1)
}
fn default_pull_policy() -> String {
    "IfNotPresent".to_owned()
}

impl Default for UpgradePolicy {
    fn default() -> Self {
        Self {
            drain: DrainPolicy::default(),
            force_unload: false,
            force_unload_without_drain: false,
            max_unavailable: default_max_unavailable(),
            node_timeout_seconds: default_node_timeout_seconds(),
            validation: ValidationPolicy::default(),
            canary: None,
            wait_for_completion: None,
            schedule: None,
        }
    }
}

impl Default for ValidationPolicy {
    fn default() -> Self {
        Self {
            enable: true,
            command: None,
            timeout_seconds: default_validation_timeout_seconds(),
        }
    }
}

impl Default for DrainPolicy {
    fn default() -> Self {
        Self {
            enable: true,
            full_node: true,
            pod_selector_label: String::new(),
            force: false,
            delete_empty_dir: true,
            timeout_seconds: default_timeout_seconds(),
        }
    }
}

impl Default for Installer {
    fn default() -> Self {
        Self {
            image: None,
            image_pull_policy: default_pull_policy(),
        }
    }
}

/// The OpenAPI schema of a `metav1.LabelSelector`, bounded (so the API server can estimate the
/// cost of the CEL rules) and with rules that every key, value and operator is well formed.
fn label_selector_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    let key_rule = format!("self.matches('{LABEL_KEY_PATTERN}')");
    let value_rule = format!("self.matches('{LABEL_VALUE_PATTERN}')");
    let key_msg = "label keys must be an optional DNS-subdomain prefix and '/', then 1-63 alphanumerics, '-', '_' or '.', starting and ending with an alphanumeric";
    let value_msg = "label values must be at most 63 alphanumerics, '-', '_' or '.', starting and ending with an alphanumeric";
    let value = serde_json::json!({"type": "string", "maxLength": 63,
        "x-kubernetes-validations": [{"rule": value_rule, "message": value_msg}]});
    schemars::json_schema!({
        "description": "A label selector: matchLabels AND matchExpressions. {} selects everything.",
        "type": "object",
        "properties": {
            "matchLabels": {
                "type": "object",
                "maxProperties": 64,
                "additionalProperties": value,
                "x-kubernetes-validations": [{
                    "rule": format!("self.all(k, k.matches('{LABEL_KEY_PATTERN}'))"),
                    "message": key_msg,
                }],
            },
            "matchExpressions": {
                "type": "array",
                "maxItems": 32,
                "items": {
                    "type": "object",
                    "required": ["key", "operator"],
                    "properties": {
                        "key": {"type": "string", "maxLength": 317,
                            "x-kubernetes-validations": [{"rule": key_rule, "message": key_msg}]},
                        "operator": {"type": "string", "maxLength": 16,
                            "x-kubernetes-validations": [{
                                "rule": "self in ['In', 'NotIn', 'Exists', 'DoesNotExist']",
                                "message": "operator must be one of In, NotIn, Exists, DoesNotExist",
                            }]},
                        "values": {"type": "array", "maxItems": 64, "items": value},
                    },
                    "x-kubernetes-validations": [{
                        "rule": "self.operator in ['In', 'NotIn'] ? (has(self.values) && size(self.values) > 0) : (!has(self.values) || size(self.values) == 0)",
                        "message": "operators In and NotIn need at least one value; Exists and DoesNotExist take none",
                    }],
                },
            },
        },
    })
}

/// A spec problem the schema cannot express.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SpecError {
    /// `upgradePolicy.drain.podSelectorLabel` is not a label selector.
    #[error("spec.upgradePolicy.drain.podSelectorLabel: {0}")]
    PodSelectorLabel(#[source] SelectorError),
    /// `nodeAffinity`/`nodeSelector` is not a valid selector.
    #[error("spec.nodeAffinity: {0}")]
    NodeAffinity(#[source] SelectorError),
    /// `maxUnavailable` is neither a positive integer nor a percentage.
    #[error(
        "spec.upgradePolicy.maxUnavailable {0:?} must be an integer >= 1 or a percentage such as \"25%\""
    )]
    MaxUnavailable(String),
    /// `upgradePolicy.waitForCompletion.podSelector` is not a label selector.
    #[error("spec.upgradePolicy.waitForCompletion.podSelector: {0}")]
    WaitForCompletion(#[source] SelectorError),
    /// `upgradePolicy.schedule` cannot be used.
    #[error(transparent)]
    Schedule(#[from] ScheduleError),
    /// `module.parameters` has a malformed or repeated entry.
    #[error(transparent)]
    ModuleParameters(#[from] ModuleParameterError),
}

impl TenstorrentDriverPolicySpec {
    /// The user's node selector: `nodeAffinity`, else the deprecated `nodeSelector`, else `{}`.
    pub fn user_selector(&self) -> metav1::LabelSelector {
        self.node_affinity
            .clone()
            .or_else(|| self.node_selector.clone())
            .unwrap_or_default()
    }

    /// The parsed `podSelectorLabel` (empty selects every pod).
    pub fn pod_selector(&self) -> Result<Selector, SpecError> {
        Selector::parse(&self.upgrade_policy.drain.pod_selector_label)
            .map_err(SpecError::PodSelectorLabel)
    }

    /// The parsed `waitForCompletion.podSelector` (None: no wait).
    pub fn wait_for_completion_selector(&self) -> Result<Option<Selector>, SpecError> {
        self.upgrade_policy
            .wait_for_completion
            .as_ref()
            .map(|w| Selector::parse(&w.pod_selector).map_err(SpecError::WaitForCompletion))
            .transpose()
    }

    /// How many nodes may be in flight at once when `matched` nodes are selected: an integer
    /// as given, a percentage of `matched` rounded down; never less than 1.
    pub fn max_unavailable(&self, matched: usize) -> Result<usize, SpecError> {
        match &self.upgrade_policy.max_unavailable {
            IntOrString::Int(n) if *n >= 1 => Ok(*n as usize),
            IntOrString::String(s) if !s.ends_with('%') => s
                .parse::<usize>()
                .ok()
                .filter(|n| *n >= 1)
                .ok_or_else(|| SpecError::MaxUnavailable(s.clone())),
            IntOrString::String(s) => {
                let pct = s
                    .strip_suffix('%')
                    .and_then(|p| p.parse::<usize>().ok())
                    .filter(|p| (1..=100).contains(p))
                    .ok_or_else(|| SpecError::MaxUnavailable(s.clone()))?;
                Ok((matched * pct / 100).max(1))
            }
            IntOrString::Int(n) => Err(SpecError::MaxUnavailable(n.to_string())),
        }
    }

    /// Checks what the schema cannot: everything the controller needs to act on the spec.
    pub fn validate(&self) -> Result<(), SpecError> {
        self.pod_selector()?;
        Selector::from_label_selector(&self.user_selector()).map_err(SpecError::NodeAffinity)?;
        self.max_unavailable(1)?;
        self.wait_for_completion_selector()?;
        if let Some(schedule) = &self.upgrade_policy.schedule {
            schedule.validate()?;
        }
        if let Some(module) = &self.module {
            module.validate()?;
        }
        Ok(())
    }
}
