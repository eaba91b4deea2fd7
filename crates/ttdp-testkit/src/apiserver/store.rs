//! Object storage: every object as JSON, one global `resourceVersion` counter (like etcd's
//! revision), and a bounded history of changes that watches resume from.

use std::collections::{BTreeMap, VecDeque};
use std::sync::Arc;

use serde_json::Value;
use tokio::sync::broadcast;

/// How many changes watches can resume from before a `resourceVersion` is 410 Gone.
const HISTORY: usize = 10_000;

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
    pub object: Value,
    /// The object before the change (None for creates); watches with selectors use it to turn
    /// an object leaving the selection into DELETED and one entering it into ADDED.
    pub previous: Option<Value>,
}

/// Namespace ("" for cluster-scoped) and name.
type ObjectKey = (String, String);

/// The object store.
#[derive(Debug)]
pub struct Store {
    objects: BTreeMap<String, BTreeMap<ObjectKey, Value>>,
    revision: u64,
    history: VecDeque<Arc<Change>>,
    /// Oldest revision a watch may still resume from.
    compacted: u64,
    changes: broadcast::Sender<Arc<Change>>,
}

impl Default for Store {
    fn default() -> Self {
        Self {
            objects: BTreeMap::new(),
            revision: 1,
            history: VecDeque::new(),
            compacted: 1,
            changes: broadcast::channel(4096).0,
        }
    }
}

impl Store {
    /// The current (latest) revision.
    pub fn revision(&self) -> u64 {
        self.revision
    }

    /// The oldest revision still resumable by a watch.
    pub fn compacted_revision(&self) -> u64 {
        self.compacted
    }

    /// One object.
    pub fn get(&self, storage: &str, namespace: &str, name: &str) -> Option<&Value> {
        self.objects
            .get(storage)?
            .get(&(namespace.to_string(), name.to_string()))
    }

    /// All objects of a storage key, in key order (namespace, name); `namespace` filters.
    pub fn list(&self, storage: &str, namespace: Option<&str>) -> Vec<&Value> {
        let Some(m) = self.objects.get(storage) else {
            return Vec::new();
        };
        m.iter()
            .filter(|((ns, _), _)| namespace.is_none_or(|want| want == ns))
            .map(|(_, v)| v)
            .collect()
    }

    /// Store `object` under a new revision, which is stamped into its `resourceVersion`, and
    /// record the change. Returns the stored object.
    pub fn put(&mut self, storage: &str, namespace: &str, name: &str, mut object: Value) -> Value {
        self.revision += 1;
        object["metadata"]["resourceVersion"] = Value::String(self.revision.to_string());
        let previous = self
            .objects
            .entry(storage.to_string())
            .or_default()
            .insert((namespace.to_string(), name.to_string()), object.clone());
        let kind = if previous.is_some() {
            ChangeKind::Modified
        } else {
            ChangeKind::Added
        };
        self.record(storage, kind, object.clone(), previous);
        object
    }

    /// Remove an object (its last state gets the removal's revision); None when absent.
    pub fn remove(&mut self, storage: &str, namespace: &str, name: &str) -> Option<Value> {
        let key = (namespace.to_string(), name.to_string());
        let previous = self.objects.get_mut(storage)?.remove(&key)?;
        self.revision += 1;
        let mut last = previous.clone();
        last["metadata"]["resourceVersion"] = Value::String(self.revision.to_string());
        self.record(storage, ChangeKind::Deleted, last.clone(), Some(previous));
        Some(last)
    }

    fn record(&mut self, storage: &str, kind: ChangeKind, object: Value, previous: Option<Value>) {
        let change = Arc::new(Change {
            revision: self.revision,
            storage: storage.to_string(),
            kind,
            object,
            previous,
        });
        self.history.push_back(change.clone());
        while self.history.len() > HISTORY {
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
