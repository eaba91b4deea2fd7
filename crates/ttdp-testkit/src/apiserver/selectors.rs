//! Label and field selectors, reduced to what the demo's programs send: a comma-separated
//! conjunction of `key=value` (or `key==value`) terms. Any other operator (`!=`, `in`,
//! `notin`, `!key`, a bare `key`, `>`/`<`) is refused with a 400 naming the term, so a
//! client never gets a list filtered by a selector the imitation misread.

use serde_json::Value;

use super::status::ApiError;

/// A parsed selector: every `(key, value)` pair must match.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Selector {
    terms: Vec<(String, String)>,
}

impl Selector {
    /// Parse a `labelSelector` or `fieldSelector` query parameter (empty selects everything).
    pub fn parse(s: &str) -> Result<Self, ApiError> {
        let mut terms = Vec::new();
        for term in s.split(',').map(str::trim).filter(|t| !t.is_empty()) {
            terms.push(parse_term(term, s)?);
        }
        Ok(Self { terms })
    }

    /// The `matchLabels` of a `metav1.LabelSelector`, as PodDisruptionBudgets carry it (the
    /// cluster refuses budgets with `matchExpressions`).
    pub fn from_match_labels(selector: &Value) -> Self {
        let terms = selector["matchLabels"]
            .as_object()
            .into_iter()
            .flatten()
            .map(|(k, v)| (k.clone(), v.as_str().unwrap_or_default().to_string()))
            .collect();
        Self { terms }
    }

    /// Whether an object's `metadata.labels` satisfy the selector.
    pub fn matches_labels(&self, labels: &Value) -> bool {
        self.terms
            .iter()
            .all(|(key, value)| labels.get(key).and_then(Value::as_str) == Some(value))
    }

    /// Whether the object's fields (dotted paths such as `spec.nodeName`) satisfy the
    /// selector; any path is accepted (the real server allows only a few per type).
    pub fn matches_fields(&self, object: &Value) -> bool {
        self.terms
            .iter()
            .all(|(path, value)| field_value(object, path) == *value)
    }
}

fn parse_term(term: &str, whole: &str) -> Result<(String, String), ApiError> {
    let unsupported = || {
        ApiError::bad_request(format!(
            "unsupported selector term '{term}' in '{whole}': this imitation API server supports only key=value terms"
        ))
    };
    let (key, value) = term
        .split_once("==")
        .or_else(|| term.split_once('='))
        .ok_or_else(unsupported)?;
    let (key, value) = (key.trim(), value.trim());
    let plain = |s: &str| !s.contains(['!', '=', '(', ')', ' ', '<', '>']);
    if key.is_empty() || !plain(key) || !plain(value) {
        return Err(unsupported());
    }
    Ok((key.to_string(), value.to_string()))
}

/// The string value of a field (empty when unset or not a scalar).
fn field_value(object: &Value, path: &str) -> String {
    let field = path
        .split('.')
        .fold(object, |current, segment| &current[segment]);
    match field {
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

    #[test]
    fn equality_terms_all_have_to_match() {
        let labels = json!({"app": "a", "tier": "web"});
        for (sel, want) in [
            ("app=a", true),
            ("app==a", true),
            ("app=a,tier=db", false),
            ("missing=a", false),
            ("", true),
        ] {
            assert_eq!(
                Selector::parse(sel).unwrap().matches_labels(&labels),
                want,
                "{sel:?}"
            );
        }
        let pod = json!({"spec": {"nodeName": "n1"}, "metadata": {"name": "p"}});
        let fields = |s: &str| Selector::parse(s).unwrap().matches_fields(&pod);
        assert!(fields("spec.nodeName=n1,metadata.name=p"));
        assert!(!fields("spec.nodeName==n2"));
    }

    #[test]
    fn other_operators_are_refused_not_misread() {
        for sel in [
            "app!=a",
            "tier in (web)",
            "tier notin (web)",
            "!app",
            "app",
            "n>4",
        ] {
            let err = Selector::parse(sel).unwrap_err();
            assert_eq!(err.code, 400, "{sel:?}");
            assert!(err.message.contains("only key=value"), "{}", err.message);
        }
    }
}
