//! What a cluster admin adds to every agent pod, beside what the policy says: pull secrets for a
//! private registry, the HTTP proxy, resources, tolerations and a node selector (the chart's
//! `agent.*` and `proxy.*` values, given to the controller as one JSON document).

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{
    Container, EnvVar, LocalObjectReference, PodSpec, ResourceRequirements, Toleration,
};
use serde::{Deserialize, Serialize};

/// The proxy for the agent's downloads: the git clone of the source and the prebuilt module.
#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct AgentProxy {
    /// `HTTP_PROXY`.
    #[serde(default)]
    pub http_proxy: Option<String>,
    /// `HTTPS_PROXY`.
    #[serde(default)]
    pub https_proxy: Option<String>,
    /// `NO_PROXY`: hosts, domains and networks reached directly.
    #[serde(default)]
    pub no_proxy: Option<String>,
}

/// Additions to every agent pod.
#[derive(Clone, Debug, Default, PartialEq, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct AgentPodSettings {
    /// Secrets (names, in the agents' namespace) for pulling the agent image.
    #[serde(default)]
    pub image_pull_secrets: Vec<String>,
    /// The agent container's resources (default: small requests, no limits).
    #[serde(default)]
    pub resources: Option<ResourceRequirements>,
    /// Tolerations beside the agent's own (it tolerates every NoSchedule and NoExecute taint).
    #[serde(default)]
    pub tolerations: Vec<Toleration>,
    /// Labels a node must carry to run an agent, beside the policy's selection.
    #[serde(default)]
    pub node_selector: BTreeMap<String, String>,
    /// The proxy.
    #[serde(default)]
    pub proxy: AgentProxy,
}

// Its fields hold no floating-point value: equality is reflexive.
impl Eq for AgentPodSettings {}

impl AgentPodSettings {
    /// The settings in `json` (empty: none). The error says what is wrong, for the flag's
    /// message.
    pub fn parse(json: &str) -> Result<Self, String> {
        if json.trim().is_empty() {
            return Ok(Self::default());
        }
        serde_json::from_str(json).map_err(|e| {
            format!(
                "not the agent pod settings (imagePullSecrets, resources, tolerations, nodeSelector, proxy): {e}"
            )
        })
    }

    /// Adds the settings to an agent pod's `spec`, whose first container is the agent.
    pub fn apply(&self, spec: &mut PodSpec) {
        if !self.image_pull_secrets.is_empty() {
            let secrets = self
                .image_pull_secrets
                .iter()
                .map(|name| LocalObjectReference { name: name.clone() });
            spec.image_pull_secrets = Some(secrets.collect());
        }
        if !self.tolerations.is_empty() {
            let tolerations = spec.tolerations.get_or_insert_with(Vec::new);
            tolerations.extend(self.tolerations.iter().cloned());
        }
        if !self.node_selector.is_empty() {
            spec.node_selector = Some(self.node_selector.clone());
        }
        if let Some(agent) = spec.containers.first_mut() {
            self.apply_to_agent(agent);
        }
    }

    fn apply_to_agent(&self, agent: &mut Container) {
        if let Some(resources) = &self.resources {
            agent.resources = Some(resources.clone());
        }
        let proxy = &self.proxy;
        let vars = [
            ("HTTP_PROXY", &proxy.http_proxy),
            ("HTTPS_PROXY", &proxy.https_proxy),
            ("NO_PROXY", &proxy.no_proxy),
        ];
        let env = agent.env.get_or_insert_with(Vec::new);
        for (name, value) in vars {
            let Some(value) = value.as_ref().filter(|v| !v.trim().is_empty()) else {
                continue;
            };
            // Both cases: libcurl (git) reads `http_proxy` in lower case only.
            for name in [name.to_owned(), name.to_lowercase()] {
                env.push(EnvVar {
                    name,
                    value: Some(value.clone()),
                    value_from: None,
                });
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

    fn agent_spec() -> PodSpec {
        PodSpec {
            containers: vec![Container {
                name: "agent".into(),
                env: Some(vec![]),
                ..Container::default()
            }],
            tolerations: Some(vec![Toleration::default()]),
            ..PodSpec::default()
        }
    }

    #[test]
    fn the_charts_values_reach_the_agent_pod() {
        let settings = AgentPodSettings::parse(
            r#"{"imagePullSecrets":["mirror-creds"],
                "resources":{"limits":{"memory":"1Gi"}},
                "tolerations":[{"key":"dedicated","operator":"Exists"}],
                "nodeSelector":{"kubernetes.io/arch":"amd64"},
                "proxy":{"httpsProxy":"http://proxy:3128","noProxy":"10.0.0.0/8,.svc"}}"#,
        )
        .unwrap();
        let mut spec = agent_spec();
        settings.apply(&mut spec);
        let secrets = spec.image_pull_secrets.unwrap();
        assert_eq!(secrets[0].name, "mirror-creds");
        assert_eq!(
            spec.tolerations.unwrap().len(),
            2,
            "added to the agent's own"
        );
        assert_eq!(spec.node_selector.unwrap()["kubernetes.io/arch"], "amd64");
        let agent = &spec.containers[0];
        let limits = agent.resources.as_ref().unwrap().limits.as_ref().unwrap();
        assert_eq!(limits["memory"], Quantity("1Gi".into()));
        let env: BTreeMap<_, _> = (agent.env.iter().flatten())
            .map(|e| (e.name.as_str(), e.value.as_deref().unwrap()))
            .collect();
        assert_eq!(env["HTTPS_PROXY"], "http://proxy:3128");
        assert_eq!(env["https_proxy"], "http://proxy:3128");
        assert_eq!(env["no_proxy"], "10.0.0.0/8,.svc");
        assert!(!env.contains_key("HTTP_PROXY"), "unset stays unset");
    }

    #[test]
    fn no_settings_change_nothing_and_a_typo_is_an_error() {
        let mut spec = agent_spec();
        AgentPodSettings::parse("").unwrap().apply(&mut spec);
        assert_eq!(spec, agent_spec());
        let err = AgentPodSettings::parse(r#"{"imagePullSecret":["x"]}"#).unwrap_err();
        assert!(
            err.contains("imagePullSecret") && err.contains("unknown field"),
            "{err}"
        );
    }
}
