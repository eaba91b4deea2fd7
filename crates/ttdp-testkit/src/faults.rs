//! Fault injection: make chosen requests fail (any status, or a 409 conflict), slow them down,
//! answer as a server without the API, empty a list, expire a watch, or cut every open watch,
//! so tests can prove clients retry, resume and explain correctly.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use rand::Rng;
use tokio::sync::broadcast;

use crate::fault_proxy::Target;

/// What an injected fault does.
#[derive(Debug, Clone, PartialEq)]
pub enum FaultEffect {
    /// Answer with this HTTP status and a `Status` body (e.g. 500 or 503; a 409 reads as for a
    /// stale resourceVersion).
    Error(u16),
    /// Delay the request, then serve it normally.
    Latency(Duration),
    /// Answer as a server that does not serve the API at all (a CRD not installed, an API
    /// group disabled): 404 with kube-apiserver's plain-text `404 page not found`, not a
    /// `Status`.
    NotServed,
    /// Forward the list, then drop every item (the server's resourceVersion is kept, so a watch
    /// may start from it): a cluster where nothing of this kind exists.
    EmptyList,
    /// Answer a watch as kube-apiserver does when the asked-for `resourceVersion` was compacted
    /// away: one `ERROR` event carrying a 410 `Expired` Status, then the end. The client must
    /// list again.
    ExpiredWatch,
}

/// One fault rule, built from [`Fault::error`], [`Fault::conflict`], [`Fault::latency`],
/// [`Fault::not_served`], [`Fault::empty_list`] or [`Fault::expired_watch`]
/// and narrowed by its other methods. Unset filters match everything.
#[derive(Debug, Clone, PartialEq)]
pub struct Fault {
    group: Option<String>,
    verb: Option<String>,
    resource: Option<String>,
    subresource: Option<String>,
    name: Option<String>,
    effect: FaultEffect,
    /// Chance per matching request, 0.0..=1.0.
    probability: f64,
    /// How many more times it may fire (None: unlimited).
    remaining: Option<u32>,
}

impl Fault {
    fn new(effect: FaultEffect) -> Self {
        Self {
            group: None,
            verb: None,
            resource: None,
            subresource: None,
            name: None,
            effect,
            probability: 1.0,
            remaining: None,
        }
    }

    /// Fail matching requests with `status`.
    pub fn error(status: u16) -> Self {
        Self::new(FaultEffect::Error(status))
    }

    /// Fail matching requests with 409 Conflict.
    pub fn conflict() -> Self {
        Self::new(FaultEffect::Error(409))
    }

    /// Delay matching requests.
    pub fn latency(delay: Duration) -> Self {
        Self::new(FaultEffect::Latency(delay))
    }

    /// Every request for `resource` of API `group` (`""` for core) is answered as
    /// [`FaultEffect::NotServed`].
    pub fn not_served(group: &str, resource: &str) -> Self {
        Self::new(FaultEffect::NotServed)
            .group(group)
            .resource(resource)
    }

    /// Lists of `resource` of `group` come back empty ([`FaultEffect::EmptyList`]).
    pub fn empty_list(group: &str, resource: &str) -> Self {
        let rule = Self::new(FaultEffect::EmptyList).group(group);
        rule.resource(resource).verb("list")
    }

    /// Watches of `resource` of `group` are answered as [`FaultEffect::ExpiredWatch`].
    pub fn expired_watch(group: &str, resource: &str) -> Self {
        let rule = Self::new(FaultEffect::ExpiredWatch).group(group);
        rule.resource(resource).verb("watch")
    }

    /// Only for this API group (`""` for core).
    pub fn group(mut self, group: &str) -> Self {
        self.group = Some(group.to_string());
        self
    }

    /// Only for this Kubernetes verb (`get`, `list`, `watch`, `create`, `update`, `patch`,
    /// `delete`, `deletecollection`).
    pub fn verb(mut self, verb: &str) -> Self {
        self.verb = Some(verb.to_string());
        self
    }

    /// Only for this resource plural, e.g. `nodes`.
    pub fn resource(mut self, resource: &str) -> Self {
        self.resource = Some(resource.to_string());
        self
    }

    /// Only for this subresource, e.g. `status` or `eviction`.
    pub fn subresource(mut self, subresource: &str) -> Self {
        self.subresource = Some(subresource.to_string());
        self
    }

    /// Only for this object name.
    pub fn name(mut self, name: &str) -> Self {
        self.name = Some(name.to_string());
        self
    }

    /// Fire with this probability (0.0..=1.0).
    pub fn probability(mut self, p: f64) -> Self {
        self.probability = p.clamp(0.0, 1.0);
        self
    }

    /// Fire at most `n` times.
    pub fn times(mut self, n: u32) -> Self {
        self.remaining = Some(n);
        self
    }

    fn matches(&self, verb: &str, target: &Target) -> bool {
        let filters = [
            (&self.group, target.group.as_str()),
            (&self.verb, verb),
            (&self.resource, &target.resource),
            (&self.subresource, &target.subresource),
            (&self.name, &target.name),
        ];
        filters
            .iter()
            .all(|(want, got)| want.as_deref().is_none_or(|w| w == *got))
    }
}

/// The server's fault rules.
#[derive(Debug, Clone)]
pub struct Faults {
    rules: Arc<Mutex<Vec<Fault>>>,
    drop_watches: broadcast::Sender<()>,
}

impl Default for Faults {
    fn default() -> Self {
        let (drop_watches, _) = broadcast::channel(16);
        Self {
            rules: Arc::new(Mutex::new(Vec::new())),
            drop_watches,
        }
    }
}

impl Faults {
    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<Fault>> {
        self.rules.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Add a rule.
    pub fn inject(&self, fault: Fault) {
        self.lock().push(fault);
    }

    /// Remove every rule.
    pub fn clear(&self) {
        self.lock().clear();
    }

    /// Close every open watch now (clients see the stream end and must re-watch).
    pub fn drop_watches(&self) {
        let _ = self.drop_watches.send(());
    }

    /// A receiver that fires when [`Faults::drop_watches`] is called.
    pub(crate) fn watch_drops(&self) -> broadcast::Receiver<()> {
        self.drop_watches.subscribe()
    }

    /// The effects that fire for this request (consuming their `times` budget).
    pub(crate) fn decide(&self, verb: &str, target: &Target) -> Vec<FaultEffect> {
        let mut rng = rand::rng();
        let mut out = Vec::new();
        let mut rules = self.lock();
        for rule in rules.iter_mut() {
            if !rule.matches(verb, target) || rule.remaining == Some(0) {
                continue;
            }
            if rule.probability < 1.0 && rng.random::<f64>() >= rule.probability {
                continue;
            }
            if let Some(n) = rule.remaining.as_mut() {
                *n -= 1;
            }
            out.push(rule.effect.clone());
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rules_match_group_resource_verb_and_times() {
        let faults = Faults::default();
        faults.inject(Fault::not_served("events.k8s.io", "events").times(1));
        let target = |group: &str| Target {
            group: group.into(),
            resource: "events".into(),
            ..Target::default()
        };
        let modern = target("events.k8s.io");
        assert_eq!(faults.decide("list", &target("")), vec![]);
        assert_eq!(faults.decide("list", &modern), vec![FaultEffect::NotServed]);
        assert_eq!(faults.decide("list", &modern), vec![], "used up");
        faults.inject(Fault::empty_list("", "events"));
        assert_eq!(faults.decide("get", &target("")), vec![], "lists only");
        assert_eq!(
            faults.decide("list", &target("")),
            vec![FaultEffect::EmptyList]
        );
    }
}
