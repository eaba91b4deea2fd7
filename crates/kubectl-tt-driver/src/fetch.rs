//! Reading the cluster into a [`Fleet`]: policies, Nodes, DaemonSets and Events. The only module
//! besides [`crate::watch`] and [`crate::mutate`] that talks to the API server; it never writes.
//!
//! Policies are required (their absence is an error the user can act on); Nodes, DaemonSets and
//! Events only enrich the view, so a failure to read them (typically RBAC) becomes a warning.

use std::collections::BTreeMap;

use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::{Event, Node, Pod};
use k8s_openapi::api::events::v1 as events_v1;
use kube::Api;
use kube::api::{ListParams, ObjectList};
use serde::de::DeserializeOwned;
use ttdp_api::TenstorrentDriverPolicy;
use ttdp_api::names::{DEFAULT_NAMESPACE, daemonset_name, labels};

use crate::connection::Connection;
use crate::error::{Error, is_not_found};
use crate::fleet::{
    DaemonSetFacts, EventFacts, Fleet, NodeFacts, PodFacts, PolicyView, natural_cmp, policy_name,
};

/// The resource name of policies, as kubectl spells it.
pub const POLICY_RESOURCE: &str = "tenstorrentdriverpolicies.driver.tenstorrent.com";

/// Page size of list requests (a 5,000-node fleet takes 10 pages).
const PAGE: u32 = 500;

/// What a view needs besides the policies.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Extras {
    /// Read Nodes (cordoned-by, nodes omitted from large statuses).
    pub nodes: bool,
    /// Read the policies' DaemonSets.
    pub daemonsets: bool,
}

/// A fleet and the warnings gathered while reading it.
#[derive(Clone, Debug, Default)]
pub struct Fetched {
    /// The fleet.
    pub fleet: Fleet,
    /// Things that could not be read, for stderr.
    pub warnings: Vec<String>,
}

/// Lists every object, following `continue` tokens.
async fn list_all<K>(api: &Api<K>, params: &ListParams) -> Result<Vec<K>, kube::Error>
where
    K: Clone + DeserializeOwned + std::fmt::Debug,
{
    let mut items = Vec::new();
    let mut params = params.clone().limit(PAGE);
    loop {
        let page: ObjectList<K> = api.list(&params).await?;
        items.extend(page.items);
        match page.metadata.continue_.filter(|c| !c.is_empty()) {
            Some(token) => params = params.continue_token(&token),
            None => return Ok(items),
        }
    }
}

impl Connection {
    fn error(&self, err: kube::Error, verb: &str, resource: &str) -> Error {
        Error::from_kube(err, verb, resource, &self.server)
    }

    /// Every policy, sorted by name. A 404 means the CRD is not installed.
    pub async fn policies(&self) -> Result<Vec<TenstorrentDriverPolicy>, Error> {
        let api: Api<TenstorrentDriverPolicy> = Api::all(self.client.clone());
        let mut items = match list_all(&api, &ListParams::default()).await {
            Ok(items) => items,
            Err(e) if is_not_found(&e) => return Err(Error::CrdNotInstalled),
            Err(e) => return Err(self.error(e, "list", POLICY_RESOURCE)),
        };
        items.sort_by(|a, b| policy_name(a).cmp(policy_name(b)));
        Ok(items)
    }

    /// One policy. A 404 is "not found" if policies can be listed, else "CRD not installed".
    pub async fn policy(&self, name: &str) -> Result<TenstorrentDriverPolicy, Error> {
        let api: Api<TenstorrentDriverPolicy> = Api::all(self.client.clone());
        match api.get(name).await {
            Ok(p) => Ok(p),
            Err(e) if is_not_found(&e) => match api.list(&ListParams::default().limit(1)).await {
                Err(e) if is_not_found(&e) => Err(Error::CrdNotInstalled),
                _ => Err(Error::PolicyNotFound {
                    name: name.to_owned(),
                }),
            },
            Err(e) => Err(self.error(e, "get", POLICY_RESOURCE)),
        }
    }

    /// Every Node, by name.
    pub async fn nodes(&self) -> Result<BTreeMap<String, NodeFacts>, Error> {
        let api: Api<Node> = Api::all(self.client.clone());
        let nodes = list_all(&api, &ListParams::default())
            .await
            .map_err(|e| self.error(e, "list", "nodes"))?;
        Ok(nodes
            .iter()
            .map(NodeFacts::from)
            .map(|n| (n.name.clone(), n))
            .collect())
    }

    /// The DaemonSets `ttdrv-<policy>` of these policies, by policy name: in `-n` if given,
    /// else in every namespace (preferring the chart's default namespace when a name appears in
    /// several).
    pub async fn daemonsets(
        &self,
        policies: &[&str],
    ) -> Result<BTreeMap<String, DaemonSetFacts>, Error> {
        let api: Api<DaemonSet> = match &self.namespace {
            Some(ns) => Api::namespaced(self.client.clone(), ns),
            None => Api::all(self.client.clone()),
        };
        let all = list_all(&api, &ListParams::default())
            .await
            .map_err(|e| self.error(e, "list", "daemonsets.apps"))?;
        let mut found: BTreeMap<String, DaemonSetFacts> = BTreeMap::new();
        for policy in policies {
            let wanted = daemonset_name(policy);
            let mut candidates: Vec<DaemonSetFacts> = all
                .iter()
                .filter(|d| d.metadata.name.as_deref() == Some(wanted.as_str()))
                .map(DaemonSetFacts::from)
                .collect();
            candidates.sort_by_key(|d| (d.namespace != DEFAULT_NAMESPACE, d.namespace.clone()));
            if let Some(first) = candidates.into_iter().next() {
                found.insert((*policy).to_owned(), first);
            }
        }
        Ok(found)
    }

    /// The agent pods of a policy (label `driver.tenstorrent.com/policy=<policy>`), in
    /// `namespace` (its DaemonSet's), else `-n`, else every namespace; sorted by node.
    pub async fn agent_pods(
        &self,
        policy: &str,
        namespace: Option<&str>,
    ) -> Result<Vec<PodFacts>, Error> {
        let api: Api<Pod> = match namespace.or(self.namespace.as_deref()) {
            Some(ns) => Api::namespaced(self.client.clone(), ns),
            None => Api::all(self.client.clone()),
        };
        let params = ListParams::default().labels(&format!("{}={policy}", labels::POLICY));
        let pods = list_all(&api, &params)
            .await
            .map_err(|e| self.error(e, "list", "pods"))?;
        let mut facts: Vec<PodFacts> = pods.iter().map(PodFacts::from).collect();
        facts.sort_by(|a, b| natural_cmp(&a.node, &b.node).then_with(|| a.name.cmp(&b.name)));
        Ok(facts)
    }

    /// Events about a policy. A server shows every Event through both `events.k8s.io/v1` and
    /// `core/v1`, so one list is enough: `events.k8s.io/v1` (what the controller writes), or
    /// `core/v1` from servers that lack that API or its field selectors (400/403/404).
    pub async fn events(&self, policy: &str) -> Result<Vec<EventFacts>, Error> {
        let kind = "TenstorrentDriverPolicy";
        let modern: Api<events_v1::Event> = Api::all(self.client.clone());
        let params =
            ListParams::default().fields(&format!("regarding.kind={kind},regarding.name={policy}"));
        match list_all(&modern, &params).await {
            Ok(events) => Ok(events
                .iter()
                .filter(|e| {
                    let regarding = e.regarding.as_ref();
                    regarding.and_then(|r| r.kind.as_deref()) == Some(kind)
                        && regarding.and_then(|r| r.name.as_deref()) == Some(policy)
                })
                .map(|e| EventFacts {
                    type_: e.type_.clone().unwrap_or_default(),
                    reason: e.reason.clone().unwrap_or_default(),
                    last_seen: e
                        .series
                        .as_ref()
                        .map(|s| s.last_observed_time.0)
                        .or_else(|| e.event_time.as_ref().map(|t| t.0))
                        .or_else(|| e.deprecated_last_timestamp.as_ref().map(|t| t.0))
                        .or_else(|| e.metadata.creation_timestamp.as_ref().map(|t| t.0)),
                    count: e
                        .series
                        .as_ref()
                        .map(|s| s.count)
                        .or(e.deprecated_count)
                        .unwrap_or(1),
                    from: e
                        .reporting_controller
                        .clone()
                        .filter(|c| !c.is_empty())
                        .or_else(|| {
                            e.deprecated_source
                                .as_ref()
                                .and_then(|s| s.component.clone())
                        })
                        .unwrap_or_default(),
                    message: e.note.clone().unwrap_or_default(),
                })
                .collect()),
            Err(kube::Error::Api(s)) if matches!(s.code, 400 | 403 | 404) => {
                self.core_events(kind, policy).await
            }
            Err(e) => Err(self.error(e, "list", "events.events.k8s.io")),
        }
    }

    /// Events about a policy from `core/v1`, for servers without `events.k8s.io/v1`.
    async fn core_events(&self, kind: &str, policy: &str) -> Result<Vec<EventFacts>, Error> {
        let core: Api<Event> = Api::all(self.client.clone());
        let params = ListParams::default().fields(&format!(
            "involvedObject.kind={kind},involvedObject.name={policy}"
        ));
        let events = list_all(&core, &params)
            .await
            .map_err(|e| self.error(e, "list", "events"))?;
        Ok(events
            .iter()
            .filter(|e| {
                e.involved_object.kind.as_deref() == Some(kind)
                    && e.involved_object.name.as_deref() == Some(policy)
            })
            .map(|e| EventFacts {
                type_: e.type_.clone().unwrap_or_default(),
                reason: e.reason.clone().unwrap_or_default(),
                last_seen: e
                    .last_timestamp
                    .as_ref()
                    .map(|t| t.0)
                    .or_else(|| e.event_time.as_ref().map(|t| t.0))
                    .or_else(|| e.metadata.creation_timestamp.as_ref().map(|t| t.0)),
                count: e.count.unwrap_or(1),
                from: e
                    .reporting_component
                    .clone()
                    .filter(|c| !c.is_empty())
                    .or_else(|| e.source.as_ref().and_then(|s| s.component.clone()))
                    .unwrap_or_default(),
                message: e.message.clone().unwrap_or_default(),
            })
            .collect())
    }

    /// The fleet: every policy (or only `only`), with the extras asked for. Missing extras
    /// become warnings.
    pub async fn fleet(&self, only: Option<&str>, extras: Extras) -> Result<Fetched, Error> {
        let policies = match only {
            Some(name) => vec![self.policy(name).await?],
            None => self.policies().await?,
        };
        let mut warnings = Vec::new();
        let nodes = if extras.nodes && !policies.is_empty() {
            match self.nodes().await {
                Ok(nodes) => nodes,
                Err(e) => {
                    warnings.push(format!(
                        "cannot read nodes, so CORDONED-BY and the nodes omitted from large statuses are not shown: {e}"
                    ));
                    BTreeMap::new()
                }
            }
        } else {
            BTreeMap::new()
        };
        let mut daemonsets = BTreeMap::new();
        if extras.daemonsets && !policies.is_empty() {
            let names: Vec<&str> = policies.iter().map(policy_name).collect();
            match self.daemonsets(&names).await {
                Ok(found) => daemonsets = found,
                Err(e) => warnings.push(format!(
                    "cannot read daemonsets, so DaemonSet readiness is not shown: {e}"
                )),
            }
        }
        let policies = policies
            .into_iter()
            .map(|policy| PolicyView {
                daemonset: daemonsets.remove(policy_name(&policy)),
                policy,
            })
            .collect();
        Ok(Fetched {
            fleet: Fleet { policies, nodes },
            warnings,
        })
    }
}
