//! Object storage: every object as JSON, one global `resourceVersion` counter (like etcd's
//! revision), and a bounded history of change events that watches replay and resume from.

use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::sync::Arc;

use serde_json::Value;
use tokio::sync::broadcast;

use super::owner_index::OwnerIndex;

/// The kind of a change, as watch events name it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ChangeKind {
    /// The object was created.
    Added,
    /// The object was changed.
    Modified,
    /// The object was removed.
    Deleted,
}

/// One stored change.
#[derive(Debug, Clone)]
pub struct Change {
    /// The resourceVersion this change produced.
    pub revision: u64,
    /// Storage key (`group/plural`).
    pub storage: String,
    /// What happened.
    pub kind: ChangeKind,
    /// The object after the change (for deletes: the last state, with the delete's revision).
    /// Shared with the store's current copy: a change costs no copy of the object.
    pub object: Arc<Value>,
    /// The object before the change (None for creates); watches with selectors use it to turn
    /// an object leaving the selection into DELETED and one entering it into ADDED.
    pub previous: Option<Arc<Value>>,
}

/// Namespace ("" for cluster-scoped) and name.
pub type ObjectKey = (String, String);

/// The object store.
#[derive(Debug)]
pub struct Store {
    objects: BTreeMap<String, BTreeMap<ObjectKey, Arc<Value>>>,
    revision: u64,
    history: VecDeque<Arc<Change>>,
    history_limit: usize,
    /// Oldest revision a watch may still resume from.
    compacted: u64,
    changes: broadcast::Sender<Arc<Change>>,
    last_change: HashMap<String, u64>,
    /// The owner graph of everything stored, for garbage collection.
    pub owners: OwnerIndex,
    /// Pods by `spec.nodeName`, as the real server's watch cache indexes them: kubelets and
    /// drains list one node's pods among thousands.
    pods_by_node: HashMap<String, BTreeSet<ObjectKey>>,
}

/// The storage key of pods.
const PODS: &str = "/pods";

impl Store {
    /// An empty store keeping `history_limit` change events.
    pub fn new(history_limit: usize) -> Self {
        let (changes, _) = broadcast::channel(4096);
        Self {
            objects: BTreeMap::new(),
            revision: 1,
            history: VecDeque::new(),
            history_limit: history_limit.max(1),
            compacted: 1,
            changes,
            last_change: HashMap::new(),
            owners: OwnerIndex::default(),
            pods_by_node: HashMap::new(),
        }
    }

    /// The current (latest) revision.
    pub fn revision(&self) -> u64 {
        self.revision
    }

    /// The oldest revision still resumable by a watch.
    pub fn compacted_revision(&self) -> u64 {
        self.compacted
    }

    /// Take the next revision number for a write.
    pub fn next_revision(&mut self) -> u64 {
        self.revision += 1;
        self.revision
    }

    /// One object.
    pub fn get(&self, storage: &str, namespace: &str, name: &str) -> Option<&Value> {
        self.get_shared(storage, namespace, name).map(|v| &**v)
    }

    /// One object, shared (a writer copies it only to change it).
    pub fn get_shared(&self, storage: &str, namespace: &str, name: &str) -> Option<&Arc<Value>> {
        self.objects
            .get(storage)
            .and_then(|m| m.get(&(namespace.to_string(), name.to_string())))
    }

    /// All objects of a storage key, in key order (namespace, name); `namespace` filters.
    pub fn list(&self, storage: &str, namespace: Option<&str>) -> Vec<&Value> {
        let Some(m) = self.objects.get(storage) else {
            return Vec::new();
        };
        match namespace {
            None => m.values().map(|v| &**v).collect(),
            Some(want) => m
                .range((want.to_string(), String::new())..)
                .take_while(|((ns, _), _)| ns == want)
                .map(|(_, v)| &**v)
                .collect(),
        }
    }

    /// The objects of a storage key bound to `node` (`spec.nodeName`), in key order; `namespace`
    /// filters. None when that storage key is not indexed by node (only pods are).
    pub fn list_on_node(
        &self,
        storage: &str,
        node: &str,
        namespace: Option<&str>,
    ) -> Option<Vec<&Value>> {
        if storage != PODS {
            return None;
        }
        let (Some(keys), Some(pods)) = (self.pods_by_node.get(node), self.objects.get(PODS)) else {
            return Some(Vec::new());
        };
        Some(
            keys.iter()
                .filter(|(ns, _)| namespace.is_none_or(|want| want == ns))
                .filter_map(|key| pods.get(key).map(|v| &**v))
                .collect(),
        )
    }

    fn index_pod(&mut self, key: &ObjectKey, before: Option<&Value>, after: Option<&Value>) {
        let node = |pod: Option<&Value>| {
            pod.and_then(|p| p["spec"]["nodeName"].as_str())
                .filter(|n| !n.is_empty())
                .map(str::to_string)
        };
        let (old, new) = (node(before), node(after));
        if old == new {
            return;
        }
        if let Some(old) = old
            && let Some(keys) = self.pods_by_node.get_mut(&old)
        {
            keys.remove(key);
            if keys.is_empty() {
                self.pods_by_node.remove(&old);
            }
        }
        if let Some(new) = new {
            self.pods_by_node
                .entry(new)
                .or_default()
                .insert(key.clone());
        }
    }

    /// The objects of a storage key as they were at `revision` (current state with the later
    /// changes undone), in key order; None when the history no longer reaches back that far.
    pub fn snapshot(
        &self,
        storage: &str,
        namespace: Option<&str>,
        revision: u64,
    ) -> Option<Vec<Value>> {
        if revision < self.compacted {
            return None;
        }
        let mut objects: BTreeMap<ObjectKey, Value> = self
            .objects
            .get(storage)
            .map(|m| m.iter().map(|(k, v)| (k.clone(), (**v).clone())).collect())
            .unwrap_or_default();
        for change in self.history.iter().rev() {
            if change.revision <= revision {
                break;
            }
            if change.storage != storage {
                continue;
            }
            let key = (
                change.object["metadata"]["namespace"]
                    .as_str()
                    .unwrap_or_default()
                    .to_string(),
                change.object["metadata"]["name"]
                    .as_str()
                    .unwrap_or_default()
                    .to_string(),
            );
            match &change.previous {
                Some(previous) => objects.insert(key, (**previous).clone()),
                None => objects.remove(&key),
            };
        }
        Some(
            objects
                .into_iter()
                .filter(|((ns, _), _)| namespace.is_none_or(|want| want == ns))
                .map(|(_, v)| v)
                .collect(),
        )
    }

    /// The revision of the last change to a storage key (0: never changed).
    pub fn last_change(&self, storage: &str) -> u64 {
        self.last_change.get(storage).copied().unwrap_or(0)
    }

    /// Store `object` (already stamped with `revision`) and record the change.
    pub fn put(
        &mut self,
        storage: &str,
        namespace: &str,
        name: &str,
        object: Value,
        revision: u64,
    ) {
        self.put_shared(storage, namespace, name, Arc::new(object), revision);
    }

    /// [`Store::put`] of an object the caller keeps sharing.
    pub fn put_shared(
        &mut self,
        storage: &str,
        namespace: &str,
        name: &str,
        object: Arc<Value>,
        revision: u64,
    ) {
        let key = (namespace.to_string(), name.to_string());
        let previous = self
            .objects
            .entry(storage.to_string())
            .or_default()
            .insert(key.clone(), object.clone());
        self.owners.stored(
            (storage.to_string(), namespace.to_string(), name.to_string()),
            previous.as_deref(),
            &object,
        );
        let kind = if previous.is_some() {
            ChangeKind::Modified
        } else {
            ChangeKind::Added
        };
        if storage == PODS {
            self.index_pod(&key, previous.as_deref(), Some(&object));
        }
        self.record(Change {
            revision,
            storage: storage.to_string(),
            kind,
            object,
            previous,
        });
    }

    /// Remove an object; `last` is its final state stamped with `revision`.
    pub fn remove(
        &mut self,
        storage: &str,
        namespace: &str,
        name: &str,
        last: Value,
        revision: u64,
    ) {
        let key = (namespace.to_string(), name.to_string());
        let previous = self.objects.get_mut(storage).and_then(|m| m.remove(&key));
        if storage == PODS {
            self.index_pod(&key, previous.as_deref(), None);
        }
        self.owners.removed(&last);
        self.record(Change {
            revision,
            storage: storage.to_string(),
            kind: ChangeKind::Deleted,
            object: Arc::new(last),
            previous,
        });
    }

    fn record(&mut self, change: Change) {
        self.last_change
            .insert(change.storage.clone(), change.revision);
        let change = Arc::new(change);
        self.history.push_back(change.clone());
        while self.history.len() > self.history_limit {
            if let Some(old) = self.history.pop_front() {
                self.compacted = old.revision;
            }
        }
        // Nobody listening is fine.
        let _ = self.changes.send(change);
    }

    /// Changes after `revision` for one storage key, or None when `revision` is older than the
    /// kept history (the caller answers 410 Gone).
    pub fn changes_since(&self, storage: &str, revision: u64) -> Option<Vec<Arc<Change>>> {
        if revision < self.compacted {
            return None;
        }
        Some(
            self.history
                .iter()
                .filter(|c| c.revision > revision && c.storage == storage)
                .cloned()
                .collect(),
        )
    }

    /// Subscribe to future changes (call while holding the state lock, together with
    /// [`Store::changes_since`], so nothing is missed or duplicated).
    pub fn subscribe(&self) -> broadcast::Receiver<Arc<Change>> {
        self.changes.subscribe()
    }
}
