//! Fault injection: make chosen requests fail (any status, or a 409 conflict), slow them down,
//! or cut every open watch, so tests can prove clients retry and resume correctly.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use rand::Rng;
use tokio::sync::broadcast;

/// What an injected fault does.
#[derive(Debug, Clone, PartialEq)]
pub enum FaultEffect {
    /// Answer with this HTTP status and a matching `Status` body (e.g. 500, 503, 429; a 409
    /// reads as for a stale resourceVersion).
    Error(u16),
    /// Delay the request, then serve it normally.
    Latency(Duration),
}

/// One fault rule, built from [`Fault::error`], [`Fault::conflict`] or [`Fault::latency`]
/// and narrowed by its other methods. Unset filters match everything.
#[derive(Debug, Clone, PartialEq)]
pub struct Fault {
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

    fn matches(&self, verb: &str, resource: &str, subresource: &str, name: &str) -> bool {
        self.verb.as_deref().is_none_or(|v| v == verb)
            && self.resource.as_deref().is_none_or(|r| r == resource)
            && self.subresource.as_deref().is_none_or(|s| s == subresource)
            && self.name.as_deref().is_none_or(|n| n == name)
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
    pub fn watch_drops(&self) -> broadcast::Receiver<()> {
        self.drop_watches.subscribe()
    }

    /// The effects that fire for this request (consuming their `times` budget).
    pub fn decide(
        &self,
        verb: &str,
        resource: &str,
        subresource: &str,
        name: &str,
    ) -> Vec<FaultEffect> {
        let mut rng = rand::rng();
        let mut out = Vec::new();
        let mut rules = self.lock();
        for rule in rules.iter_mut() {
            if !rule.matches(verb, resource, subresource, name) || rule.remaining == Some(0) {
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
