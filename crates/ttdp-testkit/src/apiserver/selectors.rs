//! What a list or watch selects: a namespace and label and field selectors, reduced to what the
//! demo's programs send: a comma-separated conjunction of `key=value` (or `key==value`) terms.
//! Any other operator (`!=`, `in`, `notin`, `!key`, a bare `key`, `>`/`<`) is refused with a
//! 400 naming the term, so a client never gets a list filtered by a selector the imitation
//! misread.

use std::collections::HashMap;

use serde_json::Value;

use super::status::ApiError;

/// `(key, value)` pairs that must all match.
type Terms = Vec<(String, String)>;

/// The objects a list or watch selects.
#[derive(Debug, Clone, Default)]
pub struct Selection {
    namespace: Option<String>,
    labels: Terms,
    /// Dotted paths such as `spec.nodeName`; any path is accepted (the real server allows only
    /// a few per type).
    fields: Terms,
}

impl Selection {
    /// From a request's namespace (None: all) and its `labelSelector` and `fieldSelector`.
    pub fn from_query(
        namespace: Option<&str>,
        query: &HashMap<String, String>,
    ) -> Result<Self, ApiError> {
        let terms = |key: &str| parse(query.get(key).map(String::as_str).unwrap_or_default());
        Ok(Self {
            namespace: namespace.map(str::to_string),
            labels: terms("labelSelector")?,
            fields: terms("fieldSelector")?,
        })
    }

    /// The namespace selected (None: all).
    pub fn namespace(&self) -> Option<&str> {
        self.namespace.as_deref()
    }

    /// Whether the object is selected.
    pub fn matches(&self, obj: &Value) -> bool {
        self.namespace
            .as_deref()
            .is_none_or(|ns| obj["metadata"]["namespace"].as_str() == Some(ns))
            && labels_match(&self.labels, &obj["metadata"]["labels"])
            && (self.fields.iter()).all(|(path, value)| field_value(obj, path) == *value)
    }
}

/// Whether `labels` (an object's `metadata.labels`) carry every term.
pub fn labels_match(terms: &[(String, String)], labels: &Value) -> bool {
    (terms.iter()).all(|(key, value)| labels.get(key).and_then(Value::as_str) == Some(value))
}

/// The terms of a `metav1.LabelSelector`'s `matchLabels`, as PodDisruptionBudgets carry it (the
/// cluster refuses budgets with `matchExpressions`).
pub fn match_labels(selector: &Value) -> Terms {
    let pairs = selector["matchLabels"].as_object().into_iter().flatten();
    let text = |v: &Value| v.as_str().unwrap_or_default().to_string();
    pairs.map(|(k, v)| (k.clone(), text(v))).collect()
}

/// Parse a selector query parameter (empty selects everything).
fn parse(whole: &str) -> Result<Terms, ApiError> {
    let terms = whole.split(',').map(str::trim).filter(|t| !t.is_empty());
    terms.map(|term| parse_term(term, whole)).collect()
}

fn parse_term(term: &str, whole: &str) -> Result<(String, String), ApiError> {
    let unsupported = || {
        ApiError::bad_request(format!(
            "unsupported selector term '{term}' in '{whole}': this imitation API server supports only key=value terms"
        ))
    };
    let (key, value) = term.split_once('=').ok_or_else(unsupported)?;
    let value = value.strip_prefix('=').unwrap_or(value);
    let (key, value) = (key.trim(), value.trim());
    let plain = |s: &str| !s.contains(['!', '=', '(', ')', ' ', '<', '>']);
    if key.is_empty() || !plain(key) || !plain(value) {
        return Err(unsupported());
    }
    Ok((key.to_string(), value.to_string()))
}

/// The string value of a field (empty when unset or not a scalar).
fn field_value(object: &Value, path: &str) -> String {
    match path.split('.').fold(object, |current, seg| &current[seg]) {
        Value::String(s) => s.clone(),
        Value::Bool(b) => b.to_string(),
        Value::Number(n) => n.to_string(),
        _ => String::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn selection(labels: &str, fields: &str) -> Result<Selection, ApiError> {
        let query = [("labelSelector", labels), ("fieldSelector", fields)];
        let query = query.map(|(k, v)| (k.to_string(), v.to_string()));
        Selection::from_query(Some("ns"), &HashMap::from(query))
    }

    #[test]
    fn equality_terms_all_have_to_match() {
        let pod = json!({"metadata": {"name": "p", "namespace": "ns",
            "labels": {"app": "a", "tier": "web"}}, "spec": {"nodeName": "n1"}});
        for (labels, fields, want) in [
            ("app=a", "", true),
            ("app==a", "spec.nodeName=n1,metadata.name=p", true),
            ("app=a,tier=db", "", false),
            ("missing=a", "", false),
            ("", "spec.nodeName==n2", false),
            ("", "", true),
        ] {
            let selected = selection(labels, fields).unwrap().matches(&pod);
            assert_eq!(selected, want, "{labels:?} {fields:?}");
        }
        let elsewhere = json!({"metadata": {"namespace": "other"}});
        assert!(!selection("", "").unwrap().matches(&elsewhere));
    }

    #[test]
    fn other_operators_are_refused_not_misread() {
        for sel in ["app!=a", "tier in (web)", "!app", "app", "n>4"] {
            let err = selection(sel, "").unwrap_err();
            assert_eq!(err.code, 400, "{sel:?}");
            assert!(err.message.contains("only key=value"), "{}", err.message);
        }
    }
}
