//! The controller's configuration, as resolved from flags and environment (see `args`).

use std::collections::BTreeMap;
use std::time::Duration;

pub use crate::pure::agent_pod::{AgentPodSettings, AgentProxy};

/// Everything the reconciler needs to know that is not in a policy.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Settings {
    /// The namespace the DaemonSets (and the leader-election Lease) live in.
    pub namespace: String,
    /// The agent image used when a policy sets no `installer.image` (the chart's `driver.image`).
    pub default_image: String,
    /// Node label keys set to `"false"` while a node is upgraded (`controller.deployGates`).
    pub deploy_gates: Vec<String>,
    /// Whether nodes must carry the NFD Tenstorrent label to be selected.
    pub require_nfd: bool,
    /// The tt-kmd git repository passed to agents; `None` leaves the agent's default.
    pub kmd_repository: Option<String>,
    /// The service account agent pods run as.
    pub agent_service_account: String,
    /// First back-off before a Failed node is retried; doubles per attempt.
    pub retry_base: Duration,
    /// Longest back-off before a Failed node is retried.
    pub retry_max: Duration,
    /// A label selector limiting the policies this controller manages (`None`: every policy).
    /// Policies it does not select are neither reconciled nor considered for overlaps: for
    /// controllers sharing a cluster (tests, a canary controller), never for two controllers
    /// managing overlapping nodes.
    pub policy_selector: Option<String>,
    /// What the admin adds to every agent pod: pull secrets, proxy, resources, tolerations and
    /// a node selector.
    pub agent_pod: AgentPodSettings,
    /// The builder image of each GCC major the admin named (`driver.builderImages`); empty:
    /// derived from the default image (see [`Settings::served_builder_images`]).
    pub builder_images: BTreeMap<u32, String>,
}

impl Settings {
    /// The builder image of each GCC major a node's kernel may be built by.
    pub fn served_builder_images(&self) -> BTreeMap<u32, String> {
        crate::pure::builder_images::builder_images(&self.builder_images, &self.default_image)
    }
}

impl Default for Settings {
    fn default() -> Self {
        Self {
            namespace: ttdp_api::names::DEFAULT_NAMESPACE.to_owned(),
            default_image: default_image(),
            deploy_gates: vec![ttdp_api::names::DEFAULT_DEPLOY_GATE.to_owned()],
            require_nfd: true,
            kmd_repository: None,
            agent_service_account: DEFAULT_AGENT_SERVICE_ACCOUNT.to_owned(),
            retry_base: Duration::from_secs(30),
            retry_max: Duration::from_secs(600),
            policy_selector: None,
            agent_pod: AgentPodSettings::default(),
            builder_images: BTreeMap::new(),
        }
    }
}

/// Repository of the default agent (builder) image.
pub const DEFAULT_IMAGE_REPOSITORY: &str = "ghcr.io/tenstorrent/tt-k8s-driver-manager-builder";
/// The agent pods' service account (created by the chart).
pub const DEFAULT_AGENT_SERVICE_ACCOUNT: &str = "ttdp-agent";

/// `ghcr.io/tenstorrent/tt-k8s-driver-manager-builder:<this crate's version>`.
pub fn default_image() -> String {
    format!("{DEFAULT_IMAGE_REPOSITORY}:{}", env!("CARGO_PKG_VERSION"))
}
