//! Reading and stamping `metadata` on JSON objects: names, uids, timestamps, resourceVersions.

use rand::Rng;
use serde_json::{Map, Value};

/// `metadata.<field>` (`name`, `namespace`, `uid`, `resourceVersion`) or "".
pub fn text<'a>(obj: &'a Value, field: &str) -> &'a str {
    obj["metadata"][field].as_str().unwrap_or_default()
}

/// The elements of `list` (none when it is not an array).
pub fn items(list: &Value) -> impl Iterator<Item = &Value> {
    list.as_array().into_iter().flatten()
}

/// Whether `metadata.finalizers` holds any.
pub fn has_finalizers(obj: &Value) -> bool {
    items(&obj["metadata"]["finalizers"]).next().is_some()
}

/// Whether `metadata.deletionTimestamp` is set.
pub fn is_deleting(obj: &Value) -> bool {
    obj["metadata"]["deletionTimestamp"].is_string()
}

/// Set a metadata field (`metadata` is created when missing; nothing happens to a value that
/// is not an object).
pub fn set(obj: &mut Value, field: &str, value: Value) {
    if let Some(o) = obj.as_object_mut() {
        let metadata = o.entry("metadata").or_insert(Value::Null);
        if !metadata.is_object() {
            *metadata = Value::Object(Map::new());
        }
        metadata[field] = value;
    }
}

/// Remove a metadata field.
pub fn remove(obj: &mut Value, field: &str) {
    if let Some(m) = obj.get_mut("metadata").and_then(Value::as_object_mut) {
        m.remove(field);
    }
}

/// The time `seconds` from now as the API server writes it (RFC 3339, seconds).
pub fn timestamp(seconds: i64) -> Value {
    let now = jiff::Timestamp::now();
    let then = now.checked_add(jiff::SignedDuration::from_secs(seconds));
    let then = then.unwrap_or(now).strftime("%Y-%m-%dT%H:%M:%SZ");
    Value::String(then.to_string())
}

/// A fresh random uid in the layout of a version 4 UUID.
pub fn new_uid() -> String {
    let h = format!("{:032x}", rand::rng().random::<u128>());
    let (a, b, c, d, e) = (&h[0..8], &h[8..12], &h[13..16], &h[16..20], &h[20..32]);
    format!("{a}-{b}-4{c}-{d}-{e}")
}

/// Five random lowercase alphanumerics, the suffix `generateName` gets.
pub fn name_suffix() -> String {
    const ALPHABET: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";
    let mut rng = rand::rng();
    (0..5)
        .map(|_| ALPHABET[rng.random_range(0..ALPHABET.len())] as char)
        .collect()
}
