//! Label selectors (every operator of the real grammar) and field selectors (`=`, `==`, `!=` on
//! any dotted field path).

use serde_json::Value;

use super::status::ApiError;

#[derive(Debug, Clone, PartialEq)]
enum LabelOp {
    Exists,
    NotExists,
    Equals(String),
    NotEquals(String),
    In(Vec<String>),
    NotIn(Vec<String>),
    Greater(i64),
    Less(i64),
}

/// A parsed label selector string (`app=a,tier in (x,y),!legacy`).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct LabelSelector {
    requirements: Vec<(String, LabelOp)>,
}

fn split_top_level(s: &str) -> Vec<String> {
    let mut parts = Vec::new();
    let mut depth = 0i32;
    let mut current = String::new();
    for c in s.chars() {
        match c {
            '(' => depth += 1,
            ')' => depth -= 1,
            ',' if depth == 0 => {
                parts.push(std::mem::take(&mut current));
                continue;
            }
            _ => {}
        }
        current.push(c);
    }
    parts.push(current);
    parts
        .into_iter()
        .map(|p| p.trim().to_string())
        .filter(|p| !p.is_empty())
        .collect()
}

fn parse_set(rest: &str, whole: &str) -> Result<Vec<String>, ApiError> {
    let rest = rest.trim();
    let inner = rest
        .strip_prefix('(')
        .and_then(|r| r.strip_suffix(')'))
        .ok_or_else(|| {
            ApiError::bad_request(format!(
                "unable to parse requirement: found '{whole}', expected: '('"
            ))
        })?;
    Ok(inner
        .split(',')
        .map(|v| v.trim().to_string())
        .filter(|v| !v.is_empty())
        .collect())
}

fn check_key(key: &str, whole: &str) -> Result<(), ApiError> {
    let ok = !key.is_empty()
        && key
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.' | '/'));
    if ok {
        Ok(())
    } else {
        Err(ApiError::bad_request(format!(
            "unable to parse requirement: invalid label key \"{key}\" in \"{whole}\""
        )))
    }
}

impl LabelSelector {
    /// Parse the `labelSelector` query parameter.
    pub fn parse(s: &str) -> Result<Self, ApiError> {
        let mut requirements = Vec::new();
        for part in split_top_level(s) {
            let req = Self::parse_requirement(&part)?;
            requirements.push(req);
        }
        Ok(Self { requirements })
    }

    fn parse_requirement(part: &str) -> Result<(String, LabelOp), ApiError> {
        if let Some(key) = part.strip_prefix('!') {
            let key = key.trim();
            check_key(key, part)?;
            return Ok((key.to_string(), LabelOp::NotExists));
        }
        for (token, is_in) in [(" notin ", false), (" in ", true)] {
            if let Some(idx) = part.find(token) {
                let key = part[..idx].trim();
                check_key(key, part)?;
                let set = parse_set(&part[idx + token.len()..], part)?;
                let op = if is_in {
                    LabelOp::In(set)
                } else {
                    LabelOp::NotIn(set)
                };
                return Ok((key.to_string(), op));
            }
        }
        for (token, kind) in [("!=", 0), ("==", 1), ("=", 1), (">", 2), ("<", 3)] {
            if let Some(idx) = part.find(token) {
                let key = part[..idx].trim();
                check_key(key, part)?;
                let value = part[idx + token.len()..].trim().to_string();
                let op = match kind {
                    0 => LabelOp::NotEquals(value),
                    1 => LabelOp::Equals(value),
                    _ => {
                        let n: i64 = value.parse().map_err(|_| {
                            ApiError::bad_request(format!(
                                "unable to parse requirement: for 'Gt', 'Lt' operators, the value must be an integer: {part}"
                            ))
                        })?;
                        if kind == 2 {
                            LabelOp::Greater(n)
                        } else {
                            LabelOp::Less(n)
                        }
                    }
                };
                return Ok((key.to_string(), op));
            }
        }
        check_key(part, part)?;
        Ok((part.to_string(), LabelOp::Exists))
    }

    /// Build from a `metav1.LabelSelector` JSON (`matchLabels` + `matchExpressions`), as PDBs
    /// and DaemonSets carry it.
    pub fn from_json(selector: &Value) -> Self {
        let mut requirements = Vec::new();
        if let Some(labels) = selector["matchLabels"].as_object() {
            for (k, v) in labels {
                requirements.push((
                    k.clone(),
                    LabelOp::Equals(v.as_str().unwrap_or_default().to_string()),
                ));
            }
        }
        for expr in selector["matchExpressions"]
            .as_array()
            .into_iter()
            .flatten()
        {
            let key = expr["key"].as_str().unwrap_or_default().to_string();
            let values: Vec<String> = expr["values"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|v| v.as_str().map(str::to_string))
                .collect();
            let op = match expr["operator"].as_str().unwrap_or_default() {
                "In" => LabelOp::In(values),
                "NotIn" => LabelOp::NotIn(values),
                "Exists" => LabelOp::Exists,
                _ => LabelOp::NotExists,
            };
            requirements.push((key, op));
        }
        Self { requirements }
    }

    /// Whether an object's `metadata.labels` satisfy the selector.
    pub fn matches(&self, labels: &Value) -> bool {
        self.requirements.iter().all(|(key, op)| {
            let value = labels.get(key).and_then(Value::as_str);
            match op {
                LabelOp::Exists => value.is_some(),
                LabelOp::NotExists => value.is_none(),
                LabelOp::Equals(v) => value == Some(v.as_str()),
                LabelOp::NotEquals(v) => value != Some(v.as_str()),
                LabelOp::In(set) => value.is_some_and(|x| set.iter().any(|s| s == x)),
                LabelOp::NotIn(set) => !value.is_some_and(|x| set.iter().any(|s| s == x)),
                LabelOp::Greater(n) => value
                    .and_then(|x| x.parse::<i64>().ok())
                    .is_some_and(|x| x > *n),
                LabelOp::Less(n) => value
                    .and_then(|x| x.parse::<i64>().ok())
                    .is_some_and(|x| x < *n),
            }
        })
    }
}

/// A parsed field selector (`spec.nodeName=n1,status.phase!=Succeeded`).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct FieldSelector {
    requirements: Vec<(String, bool, String)>,
}

impl FieldSelector {
    /// Parse the `fieldSelector` query parameter. Any dotted path is accepted (the real server
    /// supports only a few per resource type).
    pub fn parse(s: &str) -> Result<Self, ApiError> {
        let mut requirements = Vec::new();
        for part in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            let (field, equal, value) = if let Some((f, v)) = part.split_once("!=") {
                (f, false, v)
            } else if let Some((f, v)) = part.split_once("==") {
                (f, true, v)
            } else if let Some((f, v)) = part.split_once('=') {
                (f, true, v)
            } else {
                return Err(ApiError::bad_request(format!(
                    "invalid selector: '{s}'; can't understand '{part}'"
                )));
            };
            requirements.push((field.trim().to_string(), equal, value.trim().to_string()));
        }
        Ok(Self { requirements })
    }

    /// Whether the object satisfies the selector.
    pub fn matches(&self, object: &Value) -> bool {
        self.requirements.iter().all(|(field, equal, value)| {
            let actual = field_value(object, field);
            (actual == *value) == *equal
        })
    }
}

/// The string value of a selectable field, as the real server computes it (unset booleans are
/// `false`, unset strings empty).
fn field_value(object: &Value, field: &str) -> String {
    let mut current = object;
    for segment in field.split('.') {
        current = &current[segment];
    }
    match current {
        Value::String(s) => s.clone(),
        Value::Bool(b) => b.to_string(),
        Value::Number(n) => n.to_string(),
        Value::Null if matches!(field, "spec.unschedulable" | "spec.hostNetwork") => "false".into(),
        _ => String::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn label_operators_follow_the_real_grammar() {
        let labels = json!({"app": "a", "tier": "web", "n": "5"});
        let cases = [
            ("app=a", true),
            ("app==a", true),
            ("app!=a", false),
            ("missing!=a", true),
            ("tier in (web, db)", true),
            ("tier notin (web)", false),
            ("missing notin (web)", true),
            ("app", true),
            ("!app", false),
            ("!missing", true),
            ("n>4", true),
            ("n<4", false),
            ("app=a,tier in (db)", false),
            ("", true),
        ];
        for (sel, want) in cases {
            let parsed = LabelSelector::parse(sel).unwrap();
            assert_eq!(parsed.matches(&labels), want, "selector {sel:?}");
        }
    }

    #[test]
    fn field_selectors_compare_dotted_paths() {
        let pod = json!({"spec": {"nodeName": "n1"}, "status": {"phase": "Running"}});
        let matches = |s: &str| FieldSelector::parse(s).unwrap().matches(&pod);
        assert!(matches("spec.nodeName=n1,status.phase!=Succeeded"));
        assert!(!matches("spec.nodeName==n2"));
        assert!(
            matches("spec.unschedulable=false"),
            "unset booleans are false"
        );
        assert_eq!(FieldSelector::parse("spec.nodeName").unwrap_err().code, 400);
    }
}
