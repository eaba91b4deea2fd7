//! What a paused policy asks for. A pause freezes the rollout where it stands: the agent
//! DaemonSet is not re-applied, so the agents keep the version, module parameters and signing
//! Secret they were given, and the state machine must aim at the same ones. Otherwise a
//! version staged while paused ("change it now, unpause in the window") would turn every Done
//! node into one that is behind, start it with no slot and fail it at the step deadline. So while paused the
//! controller acts on the spec with the DaemonSet's version, parameters and signing Secret
//! (whatever it derives from the spec then matches what the agents run); nodes in flight
//! finish towards them (a pause holds nobody out of service), every other node keeps its state,
//! and the staged change starts when the pause ends.

use k8s_openapi::api::apps::v1::DaemonSet;
use ttdp_api::TenstorrentDriverPolicySpec;
use ttdp_api::driver::module_settings::ModuleSigning;
use ttdp_api::driver::v1alpha1::{ModuleSettings, RolloutStatus};
use ttdp_api::names::env;

/// The version, module parameters and signing Secret an applied agent DaemonSet gives its
/// agents.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AppliedTarget {
    /// `TT_KMD_VERSION` of the agent container.
    pub version: String,
    /// `TT_KMD_PARAMETERS` of the agent container, split (empty when unset).
    pub parameters: Vec<String>,
    /// The name of the signing Secret (`spec.module.signing.secretName`), from the agent
    /// container's `TTDP_MODULE_SIGNING_SECRET` (`<namespace>/<name>`); `None` without signing.
    pub signing_secret: Option<String>,
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
            signing_secret: var(env::MODULE_SIGNING_SECRET).map(|s| match s.split_once('/') {
                Some((_namespace, name)) => name.to_owned(),
                None => s,
            }),
        })
    }
}

/// The spec a paused policy is acted on with: `spec` with the applied DaemonSet's version,
/// parameters and signing Secret. `None` when the policy is not paused, nothing was applied
/// yet, or the applied target already is the spec's (nothing is staged).
pub fn as_applied(
    spec: &TenstorrentDriverPolicySpec,
    applied: Option<AppliedTarget>,
) -> Option<TenstorrentDriverPolicySpec> {
    let applied = applied.filter(|_| spec.paused)?;
    let module = spec.module.as_ref();
    let parameters = module.map(|m| m.parameters.clone()).unwrap_or_default();
    let signing_secret = module
        .and_then(|m| m.signing.as_ref())
        .map(|s| s.secret_name.clone());
    if applied.version == spec.version
        && applied.parameters == parameters
        && applied.signing_secret == signing_secret
    {
        return None;
    }
    let mut frozen = spec.clone();
    frozen.version = applied.version;
    let signing = applied
        .signing_secret
        .map(|secret_name| ModuleSigning { secret_name });
    if !applied.parameters.is_empty() || signing.is_some() || frozen.module.is_some() {
        let module = frozen.module.get_or_insert_with(ModuleSettings::default);
        module.parameters = applied.parameters;
        module.signing = signing;
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
            signing_secret: None,
        })
    }

    fn signed_by(applied: Option<AppliedTarget>, secret: &str) -> Option<AppliedTarget> {
        applied.map(|a| AppliedTarget {
            signing_secret: Some(secret.to_owned()),
            ..a
        })
    }

    fn with_signing(
        mut spec: TenstorrentDriverPolicySpec,
        secret: &str,
    ) -> TenstorrentDriverPolicySpec {
        spec.module
            .get_or_insert_with(ModuleSettings::default)
            .signing = Some(ModuleSigning {
            secret_name: secret.to_owned(),
        });
        spec
    }

    fn signing_secret(spec: &TenstorrentDriverPolicySpec) -> Option<&str> {
        spec.module
            .as_ref()
            .and_then(|m| m.signing.as_ref())
            .map(|s| s.secret_name.as_str())
    }

    #[test]
    fn a_signing_secret_set_while_paused_is_held_at_none() {
        let staged = with_signing(spec("2.7.0", true, &[]), "tt-kmd-signing");
        let frozen = as_applied(&staged, applied("2.7.0", &[])).unwrap();
        assert_eq!(signing_secret(&frozen), None);
        assert_eq!(frozen.version, "2.7.0");
    }

    #[test]
    fn a_signing_secret_changed_or_removed_while_paused_is_held_at_the_applied_one() {
        let given = signed_by(applied("2.7.0", &["a=1"]), "old-key");
        let changed = with_signing(spec("2.7.0", true, &["a=1"]), "new-key");
        let frozen = as_applied(&changed, given.clone()).unwrap();
        assert_eq!(signing_secret(&frozen), Some("old-key"));
        assert_eq!(frozen.kernel_parameters(), "a=1");
        let mut removed = spec("2.7.0", true, &[]);
        removed.module = None;
        let frozen = as_applied(&removed, signed_by(applied("2.7.0", &[]), "old-key")).unwrap();
        assert_eq!(signing_secret(&frozen), Some("old-key"));
        let unchanged = with_signing(spec("2.7.0", true, &["a=1"]), "old-key");
        assert_eq!(as_applied(&unchanged, given), None);
    }

    #[test]
    fn a_signing_secret_staged_with_a_version_is_held_with_it() {
        let staged = with_signing(spec("2.8.0", true, &[]), "tt-kmd-signing");
        let frozen = as_applied(&staged, applied("2.7.0", &[])).unwrap();
        assert_eq!(
            (frozen.version.as_str(), signing_secret(&frozen)),
            ("2.7.0", None)
        );
        let unpaused = TenstorrentDriverPolicySpec {
            paused: false,
            ..staged
        };
        assert_eq!(as_applied(&unpaused, applied("2.7.0", &[])), None);
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
                        {"name": env::MODULE_SIGNING_SECRET, "value": "ttdp-system/tt-kmd-signing"},
                    ],
                }]}},
            },
        }))
        .unwrap();
        assert_eq!(
            AppliedTarget::of(&ds),
            signed_by(applied("2.7.0", &["a=1", "b=2"]), "tt-kmd-signing")
        );
    }
}
