//! What a paused policy asks for. A pause freezes the rollout where it stands: the agent
//! DaemonSet is not re-applied, so the agents keep the version and module parameters they were
//! given, and the state machine must aim at the same ones. Otherwise a version staged while
//! paused ("change it now, unpause in the window") would turn every Done node into one that is
//! behind, start it with no slot and fail it at the step deadline. So while paused the
//! controller acts on the spec with the DaemonSet's version and parameters; nodes in flight
//! finish towards them (a pause holds nobody out of service), every other node keeps its state,
//! and the staged change starts when the pause ends.

use k8s_openapi::api::apps::v1::DaemonSet;
use ttdp_api::TenstorrentDriverPolicySpec;
use ttdp_api::driver::v1alpha1::{ModuleSettings, RolloutStatus};
use ttdp_api::names::env;

/// The version and module parameters an applied agent DaemonSet gives its agents.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AppliedTarget {
    /// `TT_KMD_VERSION` of the agent container.
    pub version: String,
    /// `TT_KMD_PARAMETERS` of the agent container, split (empty when unset).
    pub parameters: Vec<String>,
}

impl AppliedTarget {
    /// What `ds`'s agent container is told to load; `None` without a version in its template.
    pub fn of(ds: &DaemonSet) -> Option<Self> {
        let pod = ds.spec.as_ref()?.template.spec.as_ref()?;
        let vars = pod.containers.first()?.env.as_ref()?;
        let var = |name: &str| {
            vars.iter()
                .find(|v| v.name == name)
                .and_then(|v| v.value.clone())
        };
        Some(Self {
            version: var(env::TT_KMD_VERSION)?,
            parameters: var(env::TT_KMD_PARAMETERS)
                .map(|p| p.split_whitespace().map(str::to_owned).collect())
                .unwrap_or_default(),
        })
    }
}

/// The spec a paused policy is acted on with: `spec` with the applied DaemonSet's version and
/// parameters. `None` when the policy is not paused, nothing was applied yet, or the applied
/// target already is the spec's (nothing is staged).
pub fn as_applied(
    spec: &TenstorrentDriverPolicySpec,
    applied: Option<AppliedTarget>,
) -> Option<TenstorrentDriverPolicySpec> {
    let applied = applied.filter(|_| spec.paused)?;
    let parameters = spec
        .module
        .as_ref()
        .map(|m| m.parameters.clone())
        .unwrap_or_default();
    if applied.version == spec.version && applied.parameters == parameters {
        return None;
    }
    let mut frozen = spec.clone();
    frozen.version = applied.version;
    if !applied.parameters.is_empty() || frozen.module.is_some() {
        frozen
            .module
            .get_or_insert_with(ModuleSettings::default)
            .parameters = applied.parameters;
    }
    Some(frozen)
}

/// The spec a reconcile acts on, and the version whose rollout the canary follows: `spec` as it
/// is, or while paused [`as_applied`], with the canary kept on the rollout it recorded
/// (`recorded`) so that no new rollout begins for a staged version.
pub fn acted_on(
    spec: &TenstorrentDriverPolicySpec,
    applied: Option<AppliedTarget>,
    recorded: Option<&RolloutStatus>,
) -> (TenstorrentDriverPolicySpec, String) {
    match as_applied(spec, applied) {
        Some(held) => {
            let rollout_target =
                recorded.map_or_else(|| held.version.clone(), |r| r.target_version.clone());
            (held, rollout_target)
        }
        None => (spec.clone(), spec.version.clone()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn spec(version: &str, paused: bool, parameters: &[&str]) -> TenstorrentDriverPolicySpec {
        serde_json::from_value(json!({
            "version": version,
            "nodeAffinity": {},
            "paused": paused,
            "module": {"parameters": parameters},
        }))
        .unwrap()
    }

    fn applied(version: &str, parameters: &[&str]) -> Option<AppliedTarget> {
        Some(AppliedTarget {
            version: version.to_owned(),
            parameters: parameters.iter().map(|p| (*p).to_owned()).collect(),
        })
    }

    #[test]
    fn a_version_staged_while_paused_is_held_at_the_applied_one() {
        let frozen = as_applied(&spec("2.8.0", true, &[]), applied("2.7.0", &[])).unwrap();
        assert_eq!(frozen.version, "2.7.0");
        assert!(frozen.paused);
    }

    #[test]
    fn parameters_staged_while_paused_are_held_too() {
        let staged = spec("2.8.0", true, &["reset_limit=5"]);
        let frozen = as_applied(&staged, applied("2.8.0", &["auto_reset=0"])).unwrap();
        assert_eq!(frozen.kernel_parameters(), "auto_reset=0");
    }

    #[test]
    fn nothing_is_held_unpaused_unapplied_or_unchanged() {
        assert_eq!(
            as_applied(&spec("2.8.0", false, &[]), applied("2.7.0", &[])),
            None
        );
        assert_eq!(as_applied(&spec("2.8.0", true, &[]), None), None);
        assert_eq!(
            as_applied(&spec("2.8.0", true, &["a=1"]), applied("2.8.0", &["a=1"])),
            None
        );
    }

    #[test]
    fn the_applied_target_is_read_from_the_agent_container() {
        let ds: DaemonSet = serde_json::from_value(json!({
            "metadata": {"name": "ttdrv-p"},
            "spec": {
                "selector": {},
                "template": {"spec": {"containers": [{
                    "name": "agent",
                    "env": [
                        {"name": env::TT_KMD_VERSION, "value": "2.7.0"},
                        {"name": env::TT_KMD_PARAMETERS, "value": "a=1 b=2"},
                    ],
                }]}},
            },
        }))
        .unwrap();
        assert_eq!(AppliedTarget::of(&ds), applied("2.7.0", &["a=1", "b=2"]));
    }
}
