//! Who owns whom, kept current on every store write, so garbage collection visits only the
//! objects a write can have affected instead of the whole store (the real garbage collector
//! keeps the same kind of graph, fed by its watches).

use std::collections::{BTreeSet, HashMap};

use serde_json::Value;

use super::meta;

/// Where an object is stored: storage key, namespace ("" when cluster-scoped) and name.
pub type Location = (String, String, String);

/// The owner graph and the objects garbage collection still has to look at.
#[derive(Debug, Default)]
pub struct OwnerIndex {
    located: HashMap<String, Location>,
    dependents: HashMap<String, BTreeSet<String>>,
    dirty: BTreeSet<String>,
}

/// The uids an object's `ownerReferences` name.
pub fn owner_uids(obj: &Value) -> BTreeSet<String> {
    obj["metadata"]["ownerReferences"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|r| r["uid"].as_str().map(str::to_string))
        .collect()
}

/// What garbage collection reacts to: owners, deletion and finalizers.
fn gc_relevant(obj: &Value) -> (&Value, &Value, &Value) {
    let m = &obj["metadata"];
    (
        &m["ownerReferences"],
        &m["deletionTimestamp"],
        &m["finalizers"],
    )
}

impl OwnerIndex {
    /// Record that `object` was stored at `location`, replacing `previous`.
    pub fn stored(&mut self, location: Location, previous: Option<&Value>, object: &Value) {
        let uid = meta::uid(object).to_string();
        if uid.is_empty() {
            return;
        }
        self.located.insert(uid.clone(), location);
        if previous.is_some_and(|p| gc_relevant(p) == gc_relevant(object)) {
            return;
        }
        let before = previous.map(owner_uids).unwrap_or_default();
        let after = owner_uids(object);
        self.unlink(&uid, before.difference(&after));
        for owner in &after {
            self.dependents
                .entry(owner.clone())
                .or_default()
                .insert(uid.clone());
        }
        self.dirty.extend(before.into_iter().chain(after));
        self.dirty.insert(uid);
    }

    /// Record that `last` was removed from storage.
    pub fn removed(&mut self, last: &Value) {
        let uid = meta::uid(last).to_string();
        self.located.remove(&uid);
        let owners = owner_uids(last);
        self.unlink(&uid, owners.iter());
        self.dirty.extend(owners);
        self.dirty.insert(uid);
    }

    fn unlink<'a>(&mut self, uid: &str, owners: impl Iterator<Item = &'a String>) {
        for owner in owners {
            if let Some(set) = self.dependents.get_mut(owner) {
                set.remove(uid);
                if set.is_empty() {
                    self.dependents.remove(owner);
                }
            }
        }
    }

    /// Where the object with `uid` is stored, if it exists.
    pub fn locate(&self, uid: &str) -> Option<&Location> {
        self.located.get(uid)
    }

    /// The uids of the objects that name `uid` as an owner.
    pub fn dependents_of(&self, uid: &str) -> Vec<String> {
        self.dependents
            .get(uid)
            .map(|s| s.iter().cloned().collect())
            .unwrap_or_default()
    }

    /// The uids changed since the last call (their own state, or a dependent's or owner's).
    pub fn take_dirty(&mut self) -> BTreeSet<String> {
        std::mem::take(&mut self.dirty)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use serde_json::json;

    fn obj(uid: &str, owners: &[&str]) -> Value {
        let refs: Vec<Value> = owners.iter().map(|o| json!({"uid": o})).collect();
        json!({"metadata": {"uid": uid, "ownerReferences": refs}})
    }

    fn at(name: &str) -> Location {
        ("/pods".into(), "ns".into(), name.into())
    }

    #[test]
    fn tracks_dependents_through_owner_changes_and_removal() {
        let mut index = OwnerIndex::default();
        index.stored(at("a"), None, &obj("a", &["o1"]));
        assert_eq!(index.dependents_of("o1"), vec!["a".to_string()]);
        assert_eq!(
            index.take_dirty().into_iter().collect::<Vec<_>>(),
            vec!["a", "o1"]
        );

        index.stored(at("a"), Some(&obj("a", &["o1"])), &obj("a", &["o2"]));
        assert!(index.dependents_of("o1").is_empty());
        assert_eq!(index.dependents_of("o2"), vec!["a".to_string()]);
        assert_eq!(index.take_dirty().len(), 3, "a, its old and its new owner");

        index.removed(&obj("a", &["o2"]));
        assert!(index.dependents_of("o2").is_empty());
        assert!(index.locate("a").is_none());
        assert_eq!(index.take_dirty().len(), 2);
    }

    #[test]
    fn a_write_that_leaves_owners_and_deletion_alone_is_not_dirty() {
        let mut index = OwnerIndex::default();
        let before = obj("a", &["o1"]);
        index.stored(at("a"), None, &before);
        index.take_dirty();
        let mut after = before.clone();
        after["status"] = json!({"phase": "Running"});
        index.stored(at("a"), Some(&before), &after);
        assert!(index.take_dirty().is_empty());
        assert_eq!(index.locate("a"), Some(&at("a")));

        let mut deleting = after.clone();
        deleting["metadata"]["deletionTimestamp"] = json!("2026-01-01T00:00:00Z");
        index.stored(at("a"), Some(&after), &deleting);
        assert!(index.take_dirty().contains("a"));
    }
}
