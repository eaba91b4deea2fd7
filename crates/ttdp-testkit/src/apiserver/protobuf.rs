//! Decoding of the few Kubernetes protobuf request bodies kubectl's typed clients send, so the
//! server can stay JSON-only otherwise: `Eviction` (kubectl drain), `DeleteOptions`, and the
//! `Namespace`, `ConfigMap` and `ServiceAccount` that `kubectl create namespace|configmap|
//! serviceaccount` send. Other protobuf bodies are answered with 415 Unsupported Media Type.

use serde_json::{Map, Value, json};

use super::status::ApiError;

/// The content type kubectl's typed clients use for built-in types.
pub const CONTENT_TYPE: &str = "application/vnd.kubernetes.protobuf";

const MAGIC: &[u8] = b"k8s\0";

enum Field<'a> {
    Varint(u64),
    Bytes(&'a [u8]),
}

fn varint(buf: &[u8], pos: &mut usize) -> Option<u64> {
    let mut out = 0u64;
    for shift in (0..64).step_by(7) {
        let b = *buf.get(*pos)?;
        *pos += 1;
        out |= u64::from(b & 0x7f) << shift;
        if b & 0x80 == 0 {
            return Some(out);
        }
    }
    None
}

fn fields(buf: &[u8]) -> Option<Vec<(u64, Field<'_>)>> {
    let mut pos = 0;
    let mut out = Vec::new();
    while pos < buf.len() {
        let key = varint(buf, &mut pos)?;
        let (number, wire) = (key >> 3, key & 7);
        match wire {
            0 => out.push((number, Field::Varint(varint(buf, &mut pos)?))),
            2 => {
                let len = usize::try_from(varint(buf, &mut pos)?).ok()?;
                let end = pos.checked_add(len)?;
                out.push((number, Field::Bytes(buf.get(pos..end)?)));
                pos = end;
            }
            1 => pos += 8,
            5 => pos += 4,
            _ => return None,
        }
    }
    Some(out)
}

fn string(b: &[u8]) -> Value {
    json!(String::from_utf8_lossy(b))
}

/// A `map<string, string>` entry (key = 1, value = 2).
fn map_entry(buf: &[u8]) -> Option<(String, Value)> {
    let mut key = String::new();
    let mut value = json!("");
    for (n, f) in fields(buf)? {
        if let Field::Bytes(b) = f {
            match n {
                1 => key = String::from_utf8_lossy(b).into_owned(),
                2 => value = string(b),
                _ => {}
            }
        }
    }
    Some((key, value))
}

fn object_meta(buf: &[u8]) -> Option<Value> {
    let mut m = Map::new();
    let mut labels = Map::new();
    let mut annotations = Map::new();
    let mut finalizers = Vec::new();
    for (n, f) in fields(buf)? {
        if let Field::Bytes(b) = f {
            match n {
                1 => {
                    m.insert("name".into(), string(b));
                }
                2 => {
                    m.insert("generateName".into(), string(b));
                }
                3 => {
                    m.insert("namespace".into(), string(b));
                }
                11 => {
                    let (k, v) = map_entry(b)?;
                    labels.insert(k, v);
                }
                12 => {
                    let (k, v) = map_entry(b)?;
                    annotations.insert(k, v);
                }
                14 => finalizers.push(string(b)),
                _ => {}
            }
        }
    }
    if !labels.is_empty() {
        m.insert("labels".into(), Value::Object(labels));
    }
    if !annotations.is_empty() {
        m.insert("annotations".into(), Value::Object(annotations));
    }
    if !finalizers.is_empty() {
        m.insert("finalizers".into(), Value::Array(finalizers));
    }
    Some(Value::Object(m))
}

fn delete_options(buf: &[u8]) -> Option<Value> {
    let mut m = Map::new();
    let mut dry_run = Vec::new();
    for (n, f) in fields(buf)? {
        match (n, f) {
            (1, Field::Varint(v)) => {
                m.insert("gracePeriodSeconds".into(), json!(v as i64));
            }
            (2, Field::Bytes(b)) => {
                let mut p = Map::new();
                for (pn, pf) in fields(b)? {
                    if let Field::Bytes(pb) = pf {
                        match pn {
                            1 => p.insert("uid".into(), string(pb)),
                            2 => p.insert("resourceVersion".into(), string(pb)),
                            _ => None,
                        };
                    }
                }
                m.insert("preconditions".into(), Value::Object(p));
            }
            (3, Field::Varint(v)) => {
                m.insert("orphanDependents".into(), json!(v != 0));
            }
            (4, Field::Bytes(b)) => {
                m.insert("propagationPolicy".into(), string(b));
            }
            (5, Field::Bytes(b)) => dry_run.push(string(b)),
            _ => {}
        }
    }
    if !dry_run.is_empty() {
        m.insert("dryRun".into(), Value::Array(dry_run));
    }
    Some(Value::Object(m))
}

/// Decode a protobuf body into the JSON the server works with.
pub fn decode(body: &[u8]) -> Result<Value, ApiError> {
    let unsupported = || ApiError::unsupported_body(CONTENT_TYPE);
    let envelope = body.strip_prefix(MAGIC).ok_or_else(unsupported)?;
    let mut kind = String::new();
    let mut api_version = String::new();
    let mut raw: &[u8] = &[];
    for (n, f) in fields(envelope).ok_or_else(unsupported)? {
        match (n, f) {
            (1, Field::Bytes(type_meta)) => {
                for (tn, tf) in fields(type_meta).ok_or_else(unsupported)? {
                    if let Field::Bytes(b) = tf {
                        match tn {
                            1 => api_version = String::from_utf8_lossy(b).into_owned(),
                            2 => kind = String::from_utf8_lossy(b).into_owned(),
                            _ => {}
                        }
                    }
                }
            }
            (2, Field::Bytes(b)) => raw = b,
            _ => {}
        }
    }
    match kind.as_str() {
        "Eviction" => {
            let mut out = json!({"apiVersion": api_version, "kind": kind});
            for (n, f) in fields(raw).ok_or_else(unsupported)? {
                match (n, f) {
                    (1, Field::Bytes(b)) => {
                        out["metadata"] = object_meta(b).ok_or_else(unsupported)?
                    }
                    (2, Field::Bytes(b)) => {
                        out["deleteOptions"] = delete_options(b).ok_or_else(unsupported)?
                    }
                    _ => {}
                }
            }
            Ok(out)
        }
        "Namespace" | "ServiceAccount" | "ConfigMap" => {
            let mut out = json!({"apiVersion": api_version, "kind": kind});
            let mut data = Map::new();
            for (n, f) in fields(raw).ok_or_else(unsupported)? {
                match (n, f) {
                    (1, Field::Bytes(b)) => {
                        out["metadata"] = object_meta(b).ok_or_else(unsupported)?
                    }
                    (2, Field::Bytes(b)) if kind == "ConfigMap" => {
                        let (k, v) = map_entry(b).ok_or_else(unsupported)?;
                        data.insert(k, v);
                    }
                    (4, Field::Varint(v)) if kind == "ConfigMap" => {
                        out["immutable"] = json!(v != 0)
                    }
                    _ => {}
                }
            }
            if !data.is_empty() {
                out["data"] = Value::Object(data);
            }
            Ok(out)
        }
        "DeleteOptions" => {
            let mut out = delete_options(raw).ok_or_else(unsupported)?;
            out["kind"] = json!(kind);
            out["apiVersion"] = json!(api_version);
            Ok(out)
        }
        _ => Err(unsupported()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn field_bytes(n: u8, b: &[u8]) -> Vec<u8> {
        let mut out = vec![(n << 3) | 2, b.len() as u8];
        out.extend_from_slice(b);
        out
    }

    #[test]
    fn decodes_an_eviction_with_grace_period() {
        let meta = [field_bytes(1, b"p1"), field_bytes(3, b"ns")].concat();
        let opts = vec![1 << 3, 7];
        let raw = [field_bytes(1, &meta), field_bytes(2, &opts)].concat();
        let type_meta = [field_bytes(1, b"policy/v1"), field_bytes(2, b"Eviction")].concat();
        let body = [
            MAGIC.to_vec(),
            field_bytes(1, &type_meta),
            field_bytes(2, &raw),
        ]
        .concat();
        let v = decode(&body).unwrap();
        assert_eq!(v["metadata"]["name"], "p1");
        assert_eq!(v["metadata"]["namespace"], "ns");
        assert_eq!(v["deleteOptions"]["gracePeriodSeconds"], 7);
    }
}
