//! Overlapping policies: a node selected by two policies belongs to the older one (creation
//! time, then name); the newer one reports it as Conflict and its DaemonSet excludes it, so two
//! agents never fight over one module. Policies being deleted own nothing.

use std::collections::BTreeMap;
use std::sync::Arc;

use kube::ResourceExt;
use ttdp_api::TenstorrentDriverPolicy;
use ttdp_api::node_selection::NodeSelection;

use crate::pure::cached::CachedNode;

/// The effective selection of a policy (user selector, NFD label, no skip label).
pub fn selection_of(policy: &TenstorrentDriverPolicy, require_nfd: bool) -> Option<NodeSelection> {
    let mut s = NodeSelection::new(&policy.spec.user_selector()).ok()?;
    s.require_nfd = require_nfd;
    Some(s)
}

fn age_key(p: &TenstorrentDriverPolicy) -> (Option<k8s_openapi::jiff::Timestamp>, String) {
    (
        p.metadata.creation_timestamp.as_ref().map(|t| t.0),
        p.name_any(),
    )
}

/// The policies older than `this` that could own its nodes.
#[derive(Clone, Debug, Default)]
pub struct OlderPolicies {
    older: Vec<(String, NodeSelection)>,
}

impl OlderPolicies {
    /// The live, valid policies among `all` that are older than `this`.
    pub fn of(
        this: &TenstorrentDriverPolicy,
        all: &[Arc<TenstorrentDriverPolicy>],
        require_nfd: bool,
    ) -> Self {
        let mine = age_key(this);
        let older = all
            .iter()
            .filter(|p| p.uid() != this.uid() || p.name_any() != this.name_any())
            .filter(|p| p.metadata.deletion_timestamp.is_none())
            .filter(|p| age_key(p) < mine)
            .filter_map(|p| Some((p.name_any(), selection_of(p, require_nfd)?)))
            .collect();
        Self { older }
    }

    /// The oldest other policy that also selects this node, if any.
    pub fn owner(&self, node: &str, labels: &BTreeMap<String, String>) -> Option<&str> {
        self.older
            .iter()
            .find(|(_, s)| s.matches(node, labels))
            .map(|(name, _)| name.as_str())
    }
}

/// The nodes `selection` matches, in name order (the planner hands out slots in that order and
/// the status lists nodes so), and the others.
pub fn split_by_selection(
    nodes: Vec<Arc<CachedNode>>,
    selection: &NodeSelection,
) -> (Vec<Arc<CachedNode>>, Vec<Arc<CachedNode>>) {
    let (mut matched, unmatched): (Vec<_>, Vec<_>) = nodes
        .into_iter()
        .partition(|n| selection.matches(n.name(), n.labels()));
    matched.sort_unstable_by(|a, b| a.name().cmp(b.name()));
    (matched, unmatched)
}

/// The matched nodes an older policy owns, with that policy.
pub fn conflicts_of(
    matched: &[Arc<CachedNode>],
    older: &OlderPolicies,
) -> BTreeMap<String, String> {
    matched
        .iter()
        .filter_map(|n| {
            let owner = older.owner(n.name(), n.labels())?;
            Some((n.name().to_owned(), owner.to_owned()))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
    use k8s_openapi::jiff::Timestamp;
    use ttdp_api::TenstorrentDriverPolicySpec;
    use ttdp_api::names::labels;

    fn policy(name: &str, created: i64, pool: Option<&str>) -> Arc<TenstorrentDriverPolicy> {
        let affinity = match pool {
            Some(p) => serde_json::json!({"matchLabels": {"pool": p}}),
            None => serde_json::json!({}),
        };
        let spec: TenstorrentDriverPolicySpec = serde_json::from_value(
            serde_json::json!({"version": "2.8.0", "nodeAffinity": affinity}),
        )
        .unwrap();
        let mut p = TenstorrentDriverPolicy::new(name, spec);
        p.metadata.uid = Some(format!("uid-{name}"));
        p.metadata.creation_timestamp = Some(Time(
            Timestamp::from_second(1_800_000_000 + created).unwrap(),
        ));
        Arc::new(p)
    }

    fn node(pool: &str) -> BTreeMap<String, String> {
        BTreeMap::from([
            ("pool".to_owned(), pool.to_owned()),
            (labels::NFD_TENSTORRENT.to_owned(), "true".to_owned()),
        ])
    }

    #[test]
    fn the_older_policy_owns_shared_nodes() {
        let fleet = policy("fleet", 10, None);
        let canary = policy("canary", 20, Some("canary"));
        let all = vec![fleet.clone(), canary.clone()];
        let for_canary = OlderPolicies::of(&canary, &all, true);
        assert_eq!(for_canary.owner("n1", &node("canary")), Some("fleet"));
        let for_fleet = OlderPolicies::of(&fleet, &all, true);
        assert_eq!(
            for_fleet.owner("n1", &node("canary")),
            None,
            "the older one owns it"
        );
    }

    #[test]
    fn same_creation_time_breaks_ties_by_name_and_deleted_policies_own_nothing() {
        let a = policy("a", 10, None);
        let b = policy("b", 10, None);
        let all = vec![a.clone(), b.clone()];
        assert_eq!(
            OlderPolicies::of(&b, &all, true).owner("n1", &node("x")),
            Some("a")
        );
        assert_eq!(
            OlderPolicies::of(&a, &all, true).owner("n1", &node("x")),
            None
        );
        let mut deleting = (*a).clone();
        deleting.metadata.deletion_timestamp = Some(Time(Timestamp::UNIX_EPOCH));
        let all = vec![Arc::new(deleting), b.clone()];
        assert_eq!(
            OlderPolicies::of(&b, &all, true).owner("n1", &node("x")),
            None
        );
    }

    #[test]
    fn disjoint_selectors_do_not_conflict() {
        let prod = policy("prod", 10, Some("prod"));
        let canary = policy("canary", 20, Some("canary"));
        let all = vec![prod, canary.clone()];
        assert_eq!(
            OlderPolicies::of(&canary, &all, true).owner("n1", &node("canary")),
            None
        );
    }
}
