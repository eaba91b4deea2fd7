//! [`PodRef`]: which pod an event, decision or failure is about.

use std::fmt;

use k8s_openapi::api::core::v1::Pod;

/// A pod by namespace, name and UID. Displays as `namespace/name`, as `kubectl drain` prints it.
///
/// The UID tells a pod apart from a later pod with the same name (a StatefulSet replica, a pod
/// recreated by its owner): the drain waits for this UID to disappear.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct PodRef {
    /// The pod's namespace.
    pub namespace: String,
    /// The pod's name.
    pub name: String,
    /// The pod's UID (empty only for pods built by hand without one).
    pub uid: String,
}

impl PodRef {
    /// The reference to `pod`.
    pub fn of(pod: &Pod) -> Self {
        Self {
            namespace: pod.metadata.namespace.clone().unwrap_or_default(),
            name: pod.metadata.name.clone().unwrap_or_default(),
            uid: pod.metadata.uid.clone().unwrap_or_default(),
        }
    }
}

impl fmt::Display for PodRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.namespace, self.name)
    }
}

/// A namespaced object by namespace and name, e.g. a PodDisruptionBudget or a DaemonSet.
/// Displays as `namespace/name`.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ObjectKey {
    /// The object's namespace.
    pub namespace: String,
    /// The object's name.
    pub name: String,
}

impl ObjectKey {
    /// The key of `namespace/name`.
    pub fn new(namespace: impl Into<String>, name: impl Into<String>) -> Self {
        Self {
            namespace: namespace.into(),
            name: name.into(),
        }
    }
}

impl fmt::Display for ObjectKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.namespace, self.name)
    }
}
