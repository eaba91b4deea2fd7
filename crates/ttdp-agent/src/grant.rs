//! The controller's go-ahead for a swap, as the agent sees it: the node annotation
//! [`annotations::UPGRADE_GRANT`] (`<policy>/<version>`), written by the controller once the
//! node holds a `maxUnavailable` slot and, with drain enabled, is cordoned and drained.
//!
//! The agent unloads a loaded module of another version (and, with forceUnload, kills the
//! processes holding it) only when [`decide`] says [`GrantDecision::Granted`]; a first install
//! (nothing loaded) needs no grant. Pure: the reading is the [`Reporter`](crate::Reporter)'s.
//! It must not write the grant: only the controller does (the chart's admission policy refuses
//! the agent any change to its node's annotations).

use ttdp_api::names::{self, annotations};
use ttdp_kmod::KmdVersion;

/// What the agent's backend knows about the grant.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum GrantView {
    /// No controller stands behind this backend (a report file, no reporting: a VM, the demo,
    /// a node run by hand): there is no one to wait for.
    NotEnforced,
    /// The node's grant annotation and this agent's policy.
    Node {
        /// The value of [`annotations::UPGRADE_GRANT`] on the node, `None` when absent.
        grant: Option<String>,
        /// The policy whose DaemonSet runs this agent (its pod's `driver.tenstorrent.com/policy`
        /// label), `None` when unknown: then only the version must match.
        policy: Option<String>,
    },
}

/// Whether the agent may swap the loaded module now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum GrantDecision {
    /// Yes: the controller granted this node the upgrade to the target.
    Granted,
    /// No: keep the module loaded and every holder alive; the message says why and what to do.
    Waiting {
        /// What the agent waits for.
        message: String,
    },
}

/// The decision for swapping `loaded` (the loaded version, `None` when unknown) for `target`.
pub fn decide(view: &GrantView, loaded: Option<&str>, target: &KmdVersion) -> GrantDecision {
    let (grant, policy) = match view {
        GrantView::NotEnforced => return GrantDecision::Granted,
        GrantView::Node { grant, policy } => (grant.as_deref(), policy.as_deref()),
    };
    let parsed = grant.and_then(names::parse_upgrade_grant);
    if let Some((p, v)) = parsed
        && v == target.as_str()
        && policy.is_none_or(|mine| mine == p)
    {
        return GrantDecision::Granted;
    }
    let expected = names::upgrade_grant(policy.unwrap_or("<policy>"), target.as_str());
    let found = grant.map_or(String::new(), |g| {
        format!(" (the node's grant {g} is for another policy or version)")
    });
    GrantDecision::Waiting {
        message: format!(
            "tt-kmd {} is loaded; waiting for the controller to grant this node its upgrade to {target} (node annotation {}={expected}){found}: it does so when the node's turn comes within upgradePolicy.maxUnavailable, after cordoning and draining it. Until then the module stays loaded and no process is stopped",
            loaded.unwrap_or("(unknown version)"),
            annotations::UPGRADE_GRANT,
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(grant: Option<&str>, policy: Option<&str>) -> GrantView {
        GrantView::Node {
            grant: grant.map(str::to_string),
            policy: policy.map(str::to_string),
        }
    }

    #[test]
    fn only_this_policys_grant_for_the_target_lets_the_swap_go() {
        let target: KmdVersion = "2.8.0".parse().unwrap();
        let go = |view: &GrantView| decide(view, Some("2.7.0"), &target) == GrantDecision::Granted;
        assert!(
            go(&GrantView::NotEnforced),
            "no controller, nothing to wait for"
        );
        assert!(go(&node(Some("fleet/2.8.0"), Some("fleet"))));
        assert!(go(&node(Some("fleet/2.8.0"), None)), "policy unknown");
        for (grant, policy) in [
            (None, Some("fleet")),
            (Some("fleet/2.7.0"), Some("fleet")),
            (Some("lab/2.8.0"), Some("fleet")),
            (Some("2.8.0"), Some("fleet")),
            (Some(""), None),
        ] {
            assert!(!go(&node(grant, policy)), "{grant:?} {policy:?}");
        }
    }

    #[test]
    fn waiting_says_for_what_and_that_nothing_is_stopped() {
        let GrantDecision::Waiting { message } = decide(
            &node(Some("fleet/2.7.0"), Some("fleet")),
            Some("2.7.0"),
            &"2.8.0".parse().unwrap(),
        ) else {
            panic!("a grant for another version is no grant")
        };
        assert!(
            message.contains("tt-kmd 2.7.0 is loaded")
                && message.contains("driver.tenstorrent.com/upgrade-grant=fleet/2.8.0")
                && message.contains("fleet/2.7.0 is for another policy or version")
                && message.contains("no process is stopped"),
            "{message}"
        );
    }
}
