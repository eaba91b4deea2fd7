//! Object storage: every object as JSON, one global `resourceVersion` counter (like etcd's
//! revision), and a bounded history of changes that watches resume from.

use std::collections::{BTreeMap, VecDeque};
use std::sync::Arc;

use serde_json::Value;
use tokio::sync::broadcast;

use super::meta;

/// How many changes watches can resume from before a `resourceVersion` is 410 Gone.
const HISTORY: usize = 10_000;

/// One stored change.
#[derive(Debug, Clone)]
pub struct Change {
    /// The resourceVersion this change produced.
    pub revision: u64,
    /// Storage key (`group/plural`).
    pub storage: String,
    /// The object after the change (for deletes: the last state, with the delete's revision).
    pub object: Value,
    /// The object before the change (None for creates); watches with selectors use it to turn
    /// an object leaving the selection into DELETED and one entering it into ADDED.
    pub previous: Option<Value>,
    /// Whether the change removed the object.
    pub deleted: bool,
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

fn key(namespace: &str, name: &str) -> ObjectKey {
    (namespace.to_string(), name.to_string())
}

/// An object's own key.
fn key_of(object: &Value) -> ObjectKey {
    key(meta::text(object, "namespace"), meta::text(object, "name"))
}

impl Store {
    /// The current (latest) revision.
    pub fn revision(&self) -> u64 {
        self.revision
    }

    /// One object.
    pub fn get(&self, storage: &str, namespace: &str, name: &str) -> Option<&Value> {
        self.objects.get(storage)?.get(&key(namespace, name))
    }

    /// All objects of a storage key, in key order (namespace, name); `namespace` filters.
    pub fn list(&self, storage: &str, namespace: Option<&str>) -> Vec<&Value> {
        let objects = self.objects.get(storage).into_iter().flatten();
        let selected = objects.filter(|((ns, _), _)| namespace.is_none_or(|want| want == ns));
        selected.map(|(_, v)| v).collect()
    }

    /// Store `object` (under its namespace and name) with a new revision, which is stamped into
    /// its `resourceVersion`, and record the change. Returns the stored object.
    pub fn put(&mut self, storage: &str, mut object: Value) -> Value {
        self.revision += 1;
        object["metadata"]["resourceVersion"] = Value::String(self.revision.to_string());
        let previous = self
            .objects
            .entry(storage.to_string())
            .or_default()
            .insert(key_of(&object), object.clone());
        self.record(storage, object.clone(), previous, false);
        object
    }

    /// Remove the stored object with `object`'s namespace and name (its last state gets the
    /// removal's revision); None when absent.
    pub fn remove(&mut self, storage: &str, object: &Value) -> Option<Value> {
        let previous = self.objects.get_mut(storage)?.remove(&key_of(object))?;
        self.revision += 1;
        let mut last = previous.clone();
        last["metadata"]["resourceVersion"] = Value::String(self.revision.to_string());
        self.record(storage, last.clone(), Some(previous), true);
        Some(last)
    }

    fn record(&mut self, storage: &str, object: Value, previous: Option<Value>, deleted: bool) {
        let change = Arc::new(Change {
            revision: self.revision,
            storage: storage.to_string(),
            object,
            previous,
            deleted,
        });
        self.history.push_back(change.clone());
        if self.history.len() > HISTORY
            && let Some(old) = self.history.pop_front()
        {
            self.compacted = old.revision;
        }
        // Nobody listening is fine.
        let _ = self.changes.send(change);
    }

    /// Changes after `revision` for one storage key, or Err with the oldest resumable revision
    /// when `revision` is older than the kept history (the caller answers 410 Gone).
    pub fn changes_since(&self, storage: &str, revision: u64) -> Result<Vec<Arc<Change>>, u64> {
        if revision < self.compacted {
            return Err(self.compacted);
        }
        let after = self.history.iter().filter(|c| c.revision > revision);
        Ok(after.filter(|c| c.storage == storage).cloned().collect())
    }

    /// Subscribe to future changes (call while holding the state lock, together with
    /// [`Store::changes_since`], so nothing is missed or duplicated).
    pub fn subscribe(&self) -> broadcast::Receiver<Arc<Change>> {
        self.changes.subscribe()
    }
}
