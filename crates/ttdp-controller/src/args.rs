//! The controller's command-line flags (each also an environment variable `TTDP_*`), reusable by
//! any binary that embeds the controller (flatten [`ControllerArgs`] into its own clap parser).

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::time::Duration;

use clap::{ArgAction, Args};

use crate::runtime::process::leader::LeaderElection;
use crate::runtime::process::run::RunOptions;
use crate::settings::{self, AgentPodSettings, Settings};

/// Flags of the controller.
#[derive(Args, Clone, Debug, PartialEq, Eq)]
pub struct ControllerArgs {
    /// Namespace of the DaemonSets and of the leader-election Lease.
    #[arg(long, env = "TTDP_NAMESPACE", default_value = ttdp_api::names::DEFAULT_NAMESPACE)]
    pub namespace: String,

    /// Agent (builder) image for policies without installer.image (the chart's driver.image).
    #[arg(long, env = "TTDP_DEFAULT_IMAGE", default_value_t = settings::default_image())]
    pub default_image: String,

    /// Node label keys set to "false" while a node is upgraded, comma-separated; empty disables.
    #[arg(long, env = "TTDP_DEPLOY_GATES", value_delimiter = ',', default_value = ttdp_api::names::DEFAULT_DEPLOY_GATE)]
    pub deploy_gates: Vec<String>,

    /// Select only nodes with the NFD label feature.node.kubernetes.io/pci-1200_1e52.present=true.
    #[arg(long, env = "TTDP_REQUIRE_NFD", default_value_t = true, action = ArgAction::Set)]
    pub require_nfd: bool,

    /// tt-kmd git repository passed to agents (default: the agent's own default).
    #[arg(long, env = "TTDP_KMD_REPOSITORY")]
    pub kmd_repository: Option<String>,

    /// Service account of the agent pods.
    #[arg(long, env = "TTDP_AGENT_SERVICE_ACCOUNT", default_value = settings::DEFAULT_AGENT_SERVICE_ACCOUNT)]
    pub agent_service_account: String,

    /// First back-off (seconds) before a Failed node is retried; doubles per attempt.
    #[arg(long, env = "TTDP_RETRY_BASE_SECONDS", default_value_t = 30)]
    pub retry_base_seconds: u64,

    /// Longest back-off (seconds) before a Failed node is retried.
    #[arg(long, env = "TTDP_RETRY_MAX_SECONDS", default_value_t = 600)]
    pub retry_max_seconds: u64,

    /// Manage only the policies matching this label selector (default: every policy).
    #[arg(long, env = "TTDP_POLICY_SELECTOR")]
    pub policy_selector: Option<String>,

    /// Address of /metrics, /healthz and /readyz; empty disables the server.
    #[arg(long, env = "TTDP_METRICS_ADDRESS", default_value = "0.0.0.0:8080")]
    pub metrics_address: String,

    /// Elect a leader through a Lease, so only one replica acts.
    #[arg(long, env = "TTDP_LEADER_ELECTION", default_value_t = true, action = ArgAction::Set)]
    pub leader_election: bool,

    /// Name of the leader-election Lease.
    #[arg(long, env = "TTDP_LEASE_NAME", default_value = "ttdp-controller")]
    pub lease_name: String,

    /// Lease duration in seconds.
    #[arg(long, env = "TTDP_LEASE_DURATION_SECONDS", default_value_t = 15)]
    pub lease_duration_seconds: u64,

    /// What to add to every agent pod, as JSON: `imagePullSecrets` (names), `resources`,
    /// `tolerations`, `nodeSelector` and `proxy` (`httpProxy`, `httpsProxy`, `noProxy`).
    #[arg(long, env = "TTDP_AGENT_POD", default_value = "", value_parser = AgentPodSettings::parse)]
    pub agent_pod: AgentPodSettings,

    /// The builder image of each GCC major, as a JSON object (`{"11": "repo:tag-gcc11", ...}`,
    /// the chart's driver.builderImages): each node's agent runs the image of the compiler that
    /// built its kernel. Empty: `<default image>-gcc<N>` for 11 to 14.
    #[arg(long, env = "TTDP_BUILDER_IMAGES", default_value = "", value_parser = parse_builder_images)]
    pub builder_images: BTreeMap<u32, String>,

    /// This replica's identity (the pod name; the hostname by default).
    #[arg(long, env = "TTDP_POD_NAME")]
    pub pod_name: Option<String>,
}

/// A flag value that does not parse.
#[derive(Debug, thiserror::Error)]
#[error("--metrics-address {value:?} is not an address like 0.0.0.0:8080: {source}")]
pub struct BadAddress {
    value: String,
    #[source]
    source: std::net::AddrParseError,
}

impl ControllerArgs {
    /// The reconciler settings.
    pub fn settings(&self) -> Settings {
        Settings {
            namespace: self.namespace.clone(),
            default_image: self.default_image.clone(),
            deploy_gates: self
                .deploy_gates
                .iter()
                .map(|g| g.trim().to_owned())
                .filter(|g| !g.is_empty())
                .collect(),
            require_nfd: self.require_nfd,
            kmd_repository: self.kmd_repository.clone().filter(|r| !r.is_empty()),
            agent_service_account: self.agent_service_account.clone(),
            retry_base: Duration::from_secs(self.retry_base_seconds.max(1)),
            retry_max: Duration::from_secs(
                self.retry_max_seconds.max(self.retry_base_seconds).max(1),
            ),
            policy_selector: self
                .policy_selector
                .clone()
                .filter(|s| !s.trim().is_empty()),
            agent_pod: self.agent_pod.clone(),
            builder_images: self.builder_images.clone(),
        }
    }

    /// The process options.
    pub fn run_options(&self) -> Result<RunOptions, BadAddress> {
        let admin_address = match self.metrics_address.trim() {
            "" => None,
            a => Some(a.parse::<SocketAddr>().map_err(|source| BadAddress {
                value: a.to_owned(),
                source,
            })?),
        };
        let identity = self
            .pod_name
            .clone()
            .or_else(|| std::env::var("HOSTNAME").ok())
            .unwrap_or_else(|| format!("ttdp-controller-{}", std::process::id()));
        Ok(RunOptions {
            admin_address,
            leader_election: self.leader_election.then(|| LeaderElection {
                lease_name: self.lease_name.clone(),
                namespace: self.namespace.clone(),
                identity: identity.clone(),
                duration_seconds: self.lease_duration_seconds.max(2),
            }),
            instance: Some(identity),
            drain_client: None,
            metrics: None,
            readiness: None,
        })
    }
}

/// `{"13": "image", ...}` (empty text: none): GCC majors to builder images.
fn parse_builder_images(s: &str) -> Result<BTreeMap<u32, String>, String> {
    if s.trim().is_empty() {
        return Ok(BTreeMap::new());
    }
    let named: BTreeMap<String, String> = serde_json::from_str(s).map_err(|e| {
        format!("expected a JSON object such as {{\"13\": \"repo:tag-gcc13\"}}: {e}")
    })?;
    named
        .into_iter()
        .map(|(major, image)| {
            let parsed = major
                .parse::<u32>()
                .map_err(|_| format!("{major:?} is not a GCC major version such as \"13\""))?;
            if image.trim().is_empty() {
                return Err(format!("the image of gcc {major} is empty"));
            }
            Ok((parsed, image))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser, Debug)]
    struct Cli {
        #[command(flatten)]
        args: ControllerArgs,
    }

    #[test]
    fn defaults_match_the_chart() {
        let cli = Cli::try_parse_from(["ttdp-controller"]).unwrap();
        let s = cli.args.settings();
        assert_eq!(
            s.deploy_gates,
            vec![ttdp_api::names::DEFAULT_DEPLOY_GATE.to_owned()]
        );
        assert!(s.require_nfd);
        assert!(
            s.default_image
                .starts_with("ghcr.io/tenstorrent/tt-k8s-driver-manager-builder:")
        );
        let o = cli.args.run_options().unwrap();
        assert_eq!(o.admin_address, Some("0.0.0.0:8080".parse().unwrap()));
        assert_eq!(o.leader_election.unwrap().lease_name, "ttdp-controller");
    }

    #[test]
    fn empty_gates_disable_and_flags_override() {
        let cli = Cli::try_parse_from([
            "ttdp-controller",
            "--deploy-gates=",
            "--require-nfd=false",
            "--leader-election=false",
            "--metrics-address=",
            "--deploy-gates=a.example/x,b.example/y",
        ])
        .unwrap();
        let s = cli.args.settings();
        assert_eq!(
            s.deploy_gates,
            vec!["a.example/x".to_owned(), "b.example/y".to_owned()]
        );
        assert!(!s.require_nfd);
        let o = cli.args.run_options().unwrap();
        assert!(o.leader_election.is_none() && o.admin_address.is_none());
        let cli = Cli::try_parse_from(["ttdp-controller", "--deploy-gates="]).unwrap();
        assert!(cli.args.settings().deploy_gates.is_empty());
        let bad = Cli::try_parse_from(["ttdp-controller", "--metrics-address=nope"]).unwrap();
        assert!(bad.args.run_options().is_err());
    }

    #[test]
    fn builder_images_are_a_json_map_of_gcc_majors() {
        let cli = Cli::try_parse_from(["ttdp-controller"]).unwrap();
        assert!(cli.args.settings().builder_images.is_empty());
        let cli = Cli::try_parse_from([
            "ttdp-controller",
            r#"--builder-images={"11":"m/b:1-gcc11","13":"m/b:1-gcc13"}"#,
        ])
        .unwrap();
        let images = cli.args.settings().builder_images;
        assert_eq!(images.get(&13).map(String::as_str), Some("m/b:1-gcc13"));
        assert_eq!(images.len(), 2);
        for bad in [r#"{"gcc13":"x"}"#, r#"{"13":""}"#, "[1]"] {
            let arg = format!("--builder-images={bad}");
            assert!(
                Cli::try_parse_from(["ttdp-controller", arg.as_str()]).is_err(),
                "{bad}"
            );
        }
    }
}
