//! What a cluster admin adds to every agent pod, beside what the policy says: pull secrets for a
//! private registry, the HTTP proxy, resources, tolerations, a node selector, and the agent's
//! `.ko` cache limit and kernel scan period (the chart's `agent.*` and `proxy.*` values, given
//! to the controller as one JSON document).

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{
    Container, EnvVar, LocalObjectReference, PodSpec, ResourceRequirements, Toleration,
};
use serde::{Deserialize, Serialize};
use ttdp_api::duration::parse_duration;
use ttdp_api::names::env;
use ttdp_api::size::parse_size;

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
    /// The most the agent's `.ko` cache may hold (`TTDP_CACHE_SIZE_LIMIT`: bytes, or with a
    /// `Ki`, `Mi` or `Gi` suffix); unset: the agent's default, `2Gi`.
    #[serde(default)]
    pub cache_size_limit: Option<String>,
    /// How often the agent looks for installed kernels and prunes its cache
    /// (`TTDP_KERNEL_SCAN_PERIOD`, such as `60s` or `10m`); unset: the agent's default, `60s`.
    #[serde(default)]
    pub kernel_scan_period: Option<String>,
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
        let mut settings: Self = serde_json::from_str(json).map_err(|e| {
            format!(
                "not the agent pod settings (imagePullSecrets, resources, tolerations, nodeSelector, proxy, cacheSizeLimit, kernelScanPeriod): {e}"
            )
        })?;
        settings.cache_size_limit = checked(settings.cache_size_limit, "cacheSizeLimit", |v| {
            parse_size(v).map(|_| ())
        })?;
        settings.kernel_scan_period = checked(
            settings.kernel_scan_period,
            "kernelScanPeriod",
            |v| match parse_duration(v)? {
                d if d.is_zero() => Err("a scan period must be longer than 0".to_owned()),
                _ => Ok(()),
            },
        )?;
        Ok(settings)
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
        let vars = agent.env.get_or_insert_with(Vec::new);
        let var = |name: String, value: &String| EnvVar {
            name,
            value: Some(value.clone()),
            value_from: None,
        };
        // only what the admin set: the agent's own defaults stay its own
        let tuning = [
            (env::CACHE_SIZE_LIMIT, &self.cache_size_limit),
            (env::KERNEL_SCAN_PERIOD, &self.kernel_scan_period),
        ];
        for (name, value) in tuning {
            if let Some(value) = value {
                vars.push(var(name.to_owned(), value));
            }
        }
        let proxy = &self.proxy;
        let proxies = [
            ("HTTP_PROXY", &proxy.http_proxy),
            ("HTTPS_PROXY", &proxy.https_proxy),
            ("NO_PROXY", &proxy.no_proxy),
        ];
        for (name, value) in proxies {
            let Some(value) = value.as_ref().filter(|v| !v.trim().is_empty()) else {
                continue;
            };
            // Both cases: libcurl (git) reads `http_proxy` in lower case only.
            for name in [name.to_owned(), name.to_lowercase()] {
                vars.push(var(name, value));
            }
        }
    }
}

/// `value` trimmed, `None` when blank (the chart's empty default), or the error `check` finds
/// in it, naming the setting and the value.
fn checked(
    value: Option<String>,
    setting: &str,
    check: impl Fn(&str) -> Result<(), String>,
) -> Result<Option<String>, String> {
    let Some(value) = value.map(|v| v.trim().to_owned()).filter(|v| !v.is_empty()) else {
        return Ok(None);
    };
    check(&value).map_err(|e| format!("agent {setting} {value:?}: {e}"))?;
    Ok(Some(value))
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
    fn the_cache_limit_and_scan_period_reach_the_agent_only_when_set() {
        let settings =
            AgentPodSettings::parse(r#"{"cacheSizeLimit":"4Gi","kernelScanPeriod":"10m"}"#)
                .unwrap();
        let mut spec = agent_spec();
        settings.apply(&mut spec);
        let env: BTreeMap<_, _> = (spec.containers[0].env.iter().flatten())
            .map(|e| (e.name.as_str(), e.value.as_deref().unwrap()))
            .collect();
        assert_eq!(env[env::CACHE_SIZE_LIMIT], "4Gi");
        assert_eq!(env[env::KERNEL_SCAN_PERIOD], "10m");
        for unset in [
            r#"{}"#,
            r#"{"cacheSizeLimit":"","kernelScanPeriod":" "}"#,
            r#"{"cacheSizeLimit":null}"#,
        ] {
            let mut spec = agent_spec();
            AgentPodSettings::parse(unset).unwrap().apply(&mut spec);
            assert_eq!(spec, agent_spec(), "{unset}: the agent keeps its defaults");
        }
    }

    #[test]
    fn a_bad_cache_limit_or_scan_period_is_an_error_naming_it() {
        for (json, named) in [
            (
                r#"{"cacheSizeLimit":"2GB"}"#,
                r#"agent cacheSizeLimit "2GB""#,
            ),
            (
                r#"{"cacheSizeLimit":"lots"}"#,
                r#"agent cacheSizeLimit "lots""#,
            ),
            (
                r#"{"kernelScanPeriod":"1 minute"}"#,
                r#"agent kernelScanPeriod "1 minute""#,
            ),
            (
                r#"{"kernelScanPeriod":"0s"}"#,
                r#"agent kernelScanPeriod "0s""#,
            ),
        ] {
            let err = AgentPodSettings::parse(json).unwrap_err();
            assert!(err.contains(named), "{json}: {err}");
        }
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
