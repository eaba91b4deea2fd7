//! Label selectors: the string form (`podSelectorLabel`, `kubectl -l`) and the structured
//! `metav1.LabelSelector` form, both evaluated by one [`Selector`].
//!
//! The string grammar is Kubernetes' (`k8s.io/apimachinery/pkg/labels.Parse`): comma-joined
//! requirements, each one of `key=value`, `key==value`, `key!=value`, `key`, `!key`,
//! `key in (a,b)`, `key notin (a,b)`, `key>N`, `key<N`. The empty string selects everything.
//!
//! What it must not do: depend on the TenstorrentDriverPolicy API or on a cluster client. Both
//! `ttdp-api` (policies' pod and node selectors) and `ttdp-drain` (which pods a drain waits for,
//! reusable without ttdp's CRD) parse selectors; this crate is what they share.
#![deny(missing_docs)]

use std::collections::BTreeMap;
use std::fmt;

use k8s_openapi::apimachinery::pkg::apis::meta::v1 as metav1;

/// How a [`Requirement`] compares a label's value.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Operator {
    /// The label is present with one of the values (`=`, `==`, `in`).
    In,
    /// The label is absent or has none of the values (`!=`, `notin`).
    NotIn,
    /// The label is present (`key`).
    Exists,
    /// The label is absent (`!key`).
    DoesNotExist,
    /// The label is an integer greater than the value (`key>N`).
    Gt,
    /// The label is an integer less than the value (`key<N`).
    Lt,
}

/// One requirement of a selector.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Requirement {
    /// The label key.
    pub key: String,
    /// The comparison.
    pub operator: Operator,
    /// The values compared against (empty for `Exists`/`DoesNotExist`).
    pub values: Vec<String>,
}

/// A set of requirements that must all hold (logical AND). Empty selects everything.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Selector {
    /// The requirements, in the order they were written.
    pub requirements: Vec<Requirement>,
}

/// Why a selector string or a `LabelSelector` is not valid.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SelectorError {
    /// The text does not follow the selector grammar.
    #[error("invalid label selector {input:?}: {problem}")]
    Syntax {
        /// The whole selector as given.
        input: String,
        /// What is wrong and where.
        problem: String,
    },
    /// A key is not a valid label key.
    #[error("invalid label key {key:?}: {problem}")]
    Key {
        /// The key.
        key: String,
        /// What is wrong with it.
        problem: &'static str,
    },
    /// A value is not a valid label value.
    #[error("invalid label value {value:?} for key {key:?}: {problem}")]
    Value {
        /// The key the value belongs to.
        key: String,
        /// The value.
        value: String,
        /// What is wrong with it.
        problem: &'static str,
    },
}

impl Requirement {
    /// Whether a set of labels satisfies this requirement (Kubernetes' semantics: `NotIn` and
    /// `!=` hold when the label is absent).
    pub fn matches(&self, labels: &BTreeMap<String, String>) -> bool {
        self.operator
            .holds(labels.get(&self.key).map(String::as_str), &self.values)
    }
}

impl Operator {
    /// Whether a label's value (`None`: the label is absent) satisfies this operator with these
    /// values (Kubernetes' semantics: `NotIn` holds when the label is absent; `Gt`/`Lt` compare
    /// integers and need exactly one value).
    pub fn holds(self, value: Option<&str>, values: &[String]) -> bool {
        match self {
            Operator::In => value.is_some_and(|v| values.iter().any(|w| w == v)),
            Operator::NotIn => value.is_none_or(|v| values.iter().all(|w| w != v)),
            Operator::Exists => value.is_some(),
            Operator::DoesNotExist => value.is_none(),
            Operator::Gt | Operator::Lt => {
                let (Some(v), [bound]) = (value, values) else {
                    return false;
                };
                match (v.parse::<i64>(), bound.parse::<i64>()) {
                    (Ok(v), Ok(b)) if self == Operator::Gt => v > b,
                    (Ok(v), Ok(b)) => v < b,
                    _ => false,
                }
            }
        }
    }
}

impl Selector {
    /// Parses the string form. The empty (or all-blank) string is the empty selector.
    pub fn parse(input: &str) -> Result<Self, SelectorError> {
        let syntax = |problem: String| SelectorError::Syntax {
            input: input.to_owned(),
            problem,
        };
        let mut requirements = Vec::new();
        for part in split_top_level(input).map_err(syntax)? {
            let part = part.trim();
            if part.is_empty() {
                if input.trim().is_empty() {
                    continue;
                }
                return Err(syntax("empty requirement (stray comma?)".into()));
            }
            requirements.push(parse_requirement(part).map_err(|e| match e {
                ParseProblem::Syntax(p) => syntax(p),
                ParseProblem::Invalid(e) => e,
            })?);
        }
        Ok(Self { requirements })
    }

    /// Converts a `metav1.LabelSelector` (matchLabels AND matchExpressions), validating keys,
    /// values and operators.
    pub fn from_label_selector(selector: &metav1::LabelSelector) -> Result<Self, SelectorError> {
        let mut requirements = Vec::new();
        for (key, value) in selector.match_labels.iter().flatten() {
            validate_key(key)?;
            validate_value(key, value)?;
            requirements.push(Requirement {
                key: key.clone(),
                operator: Operator::In,
                values: vec![value.clone()],
            });
        }
        for expr in selector.match_expressions.iter().flatten() {
            validate_key(&expr.key)?;
            let values = expr.values.clone().unwrap_or_default();
            let operator = match expr.operator.as_str() {
                "In" => Operator::In,
                "NotIn" => Operator::NotIn,
                "Exists" => Operator::Exists,
                "DoesNotExist" => Operator::DoesNotExist,
                other => {
                    return Err(SelectorError::Syntax {
                        input: format!("{} {}", expr.key, other),
                        problem: format!(
                            "unknown operator {other:?}: use In, NotIn, Exists or DoesNotExist"
                        ),
                    });
                }
            };
            let needs_values = matches!(operator, Operator::In | Operator::NotIn);
            if needs_values == values.is_empty() {
                return Err(SelectorError::Syntax {
                    input: expr.key.clone(),
                    problem: if needs_values {
                        format!("operator {} needs at least one value", expr.operator)
                    } else {
                        format!("operator {} takes no values", expr.operator)
                    },
                });
            }
            for v in &values {
                validate_value(&expr.key, v)?;
            }
            requirements.push(Requirement {
                key: expr.key.clone(),
                operator,
                values,
            });
        }
        Ok(Self { requirements })
    }

    /// Whether a set of labels satisfies every requirement.
    pub fn matches(&self, labels: &BTreeMap<String, String>) -> bool {
        self.requirements.iter().all(|r| r.matches(labels))
    }

    /// Whether this selector selects everything.
    pub fn is_empty(&self) -> bool {
        self.requirements.is_empty()
    }
}

impl fmt::Display for Selector {
    /// The canonical string form, parseable by [`Selector::parse`] and by the API server's
    /// `labelSelector` query parameter.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, r) in self.requirements.iter().enumerate() {
            if i > 0 {
                f.write_str(",")?;
            }
            let k = &r.key;
            match (r.operator, r.values.as_slice()) {
                (Operator::In, [v]) => write!(f, "{k}={v}")?,
                (Operator::NotIn, [v]) => write!(f, "{k}!={v}")?,
                (Operator::In, vs) => write!(f, "{k} in ({})", vs.join(","))?,
                (Operator::NotIn, vs) => write!(f, "{k} notin ({})", vs.join(","))?,
                (Operator::Exists, _) => write!(f, "{k}")?,
                (Operator::DoesNotExist, _) => write!(f, "!{k}")?,
                (Operator::Gt, vs) => write!(f, "{k}>{}", vs.join(""))?,
                (Operator::Lt, vs) => write!(f, "{k}<{}", vs.join(""))?,
            }
        }
        Ok(())
    }
}

enum ParseProblem {
    Syntax(String),
    Invalid(SelectorError),
}

impl From<SelectorError> for ParseProblem {
    fn from(e: SelectorError) -> Self {
        Self::Invalid(e)
    }
}

/// Splits on commas that are not inside parentheses.
fn split_top_level(input: &str) -> Result<Vec<&str>, String> {
    let mut parts = Vec::new();
    let (mut depth, mut start) = (0usize, 0usize);
    for (i, c) in input.char_indices() {
        match c {
            '(' if depth == 0 => depth = 1,
            '(' => return Err(format!("nested '(' at offset {i}")),
            ')' if depth == 1 => depth = 0,
            ')' => return Err(format!("unmatched ')' at offset {i}")),
            ',' if depth == 0 => {
                parts.push(&input[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    if depth != 0 {
        return Err("missing ')'".into());
    }
    parts.push(&input[start..]);
    Ok(parts)
}

fn parse_requirement(part: &str) -> Result<Requirement, ParseProblem> {
    let req = |key: &str, operator, values: Vec<String>| -> Result<Requirement, ParseProblem> {
        let key = key.trim();
        validate_key(key)?;
        for v in &values {
            validate_value(key, v)?;
        }
        Ok(Requirement {
            key: key.to_owned(),
            operator,
            values,
        })
    };
    if let Some(key) = part.strip_prefix('!') {
        return req(key, Operator::DoesNotExist, vec![]);
    }
    for (op, operator) in [
        ("!=", Operator::NotIn),
        ("==", Operator::In),
        ("=", Operator::In),
    ] {
        if let Some((key, value)) = part.split_once(op) {
            return req(key, operator, vec![value.trim().to_owned()]);
        }
    }
    for (op, operator) in [('>', Operator::Gt), ('<', Operator::Lt)] {
        if let Some((key, value)) = part.split_once(op) {
            let value = value.trim();
            if value.parse::<i64>().is_err() {
                return Err(ParseProblem::Syntax(format!(
                    "{part:?}: '{op}' needs an integer, got {value:?}"
                )));
            }
            return req(key, operator, vec![value.to_owned()]);
        }
    }
    if let Some(open) = part.find('(') {
        let head = part[..open].trim();
        let Some(list) = part[open + 1..].strip_suffix(')') else {
            return Err(ParseProblem::Syntax(format!("{part:?}: text after ')'")));
        };
        let (key, word) = head.rsplit_once(char::is_whitespace).ok_or_else(|| {
            ParseProblem::Syntax(format!(
                "{part:?}: expected 'KEY in (...)' or 'KEY notin (...)'"
            ))
        })?;
        let operator = match word {
            "in" => Operator::In,
            "notin" => Operator::NotIn,
            other => {
                return Err(ParseProblem::Syntax(format!(
                    "{part:?}: unknown operator {other:?}, expected 'in' or 'notin'"
                )));
            }
        };
        let values: Vec<String> = list.split(',').map(|v| v.trim().to_owned()).collect();
        return req(key, operator, values);
    }
    if part.contains(char::is_whitespace) {
        return Err(ParseProblem::Syntax(format!(
            "{part:?}: expected KEY, !KEY, KEY=VALUE, KEY!=VALUE, 'KEY in (A,B)' or 'KEY notin (A,B)'"
        )));
    }
    req(part, Operator::Exists, vec![])
}

/// Checks a label key: an optional DNS-subdomain prefix and `/`, then a name of at most 63
/// characters of alphanumerics, `-`, `_` and `.`, starting and ending with an alphanumeric.
pub fn validate_key(key: &str) -> Result<(), SelectorError> {
    let err = |problem| SelectorError::Key {
        key: key.to_owned(),
        problem,
    };
    let (prefix, name) = match key.split_once('/') {
        Some((p, n)) => (Some(p), n),
        None => (None, key),
    };
    if let Some(prefix) = prefix {
        if prefix.is_empty() || prefix.len() > 253 {
            return Err(err("the prefix before '/' must be 1 to 253 characters"));
        }
        let label_ok = |l: &str| {
            !l.is_empty()
                && l.len() <= 63
                && l.bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
                && !l.starts_with('-')
                && !l.ends_with('-')
        };
        if !prefix.split('.').all(label_ok) {
            return Err(err(
                "the prefix before '/' must be a DNS subdomain (lowercase alphanumerics, '-' and '.')",
            ));
        }
    }
    if name.is_empty() || name.len() > 63 {
        return Err(err("the name part must be 1 to 63 characters"));
    }
    if !is_label_token(name) {
        return Err(err(
            "the name part must be alphanumerics, '-', '_' or '.', starting and ending with an alphanumeric",
        ));
    }
    Ok(())
}

/// Checks a label value: empty, or at most 63 characters of alphanumerics, `-`, `_` and `.`,
/// starting and ending with an alphanumeric.
pub fn validate_value(key: &str, value: &str) -> Result<(), SelectorError> {
    let err = |problem| SelectorError::Value {
        key: key.to_owned(),
        value: value.to_owned(),
        problem,
    };
    if value.len() > 63 {
        return Err(err("must be at most 63 characters"));
    }
    if !value.is_empty() && !is_label_token(value) {
        return Err(err(
            "must be alphanumerics, '-', '_' or '.', starting and ending with an alphanumeric",
        ));
    }
    Ok(())
}

fn is_label_token(s: &str) -> bool {
    let b = s.as_bytes();
    b.first().is_some_and(u8::is_ascii_alphanumeric)
        && b.last().is_some_and(u8::is_ascii_alphanumeric)
        && b.iter()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, b'-' | b'_' | b'.'))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn parses_every_form() {
        let s = Selector::parse(
            "a=1, b==2,c!=3,d,!e, f in (x, y),g notin (z),tenstorrent.com/pool=prod,h>5,i<7",
        )
        .unwrap();
        let ops: Vec<Operator> = s.requirements.iter().map(|r| r.operator).collect();
        use Operator::*;
        assert_eq!(
            ops,
            [In, In, NotIn, Exists, DoesNotExist, In, NotIn, In, Gt, Lt]
        );
        assert_eq!(s.requirements[5].values, ["x", "y"]);
        assert_eq!(s.requirements[7].key, "tenstorrent.com/pool");
    }

    #[test]
    fn empty_selects_everything() {
        for input in ["", "   "] {
            let s = Selector::parse(input).unwrap();
            assert!(s.is_empty());
            assert!(s.matches(&labels(&[])));
        }
    }

    #[test]
    fn matching_follows_kubernetes() {
        let s = Selector::parse("app=web,tier!=db,!skip,zone in (a,b),gen>2").unwrap();
        assert!(s.matches(&labels(&[("app", "web"), ("zone", "a"), ("gen", "3")])));
        assert!(!s.matches(&labels(&[("app", "web"), ("zone", "c"), ("gen", "3")])));
        assert!(!s.matches(&labels(&[("app", "web"), ("zone", "a"), ("gen", "2")])));
        assert!(!s.matches(&labels(&[
            ("app", "web"),
            ("zone", "a"),
            ("skip", ""),
            ("gen", "3")
        ])));
        assert!(!s.matches(&labels(&[
            ("app", "web"),
            ("zone", "a"),
            ("tier", "db"),
            ("gen", "3")
        ])));
        // `notin` and `!=` hold when the label is absent.
        let s = Selector::parse("x notin (1)").unwrap();
        assert!(s.matches(&labels(&[])));
    }

    #[test]
    fn display_round_trips() {
        let text = "a=1,b!=2,c,!d,e in (x,y),f notin (z,w),g>1";
        let s = Selector::parse(text).unwrap();
        assert_eq!(s.to_string(), text);
        assert_eq!(Selector::parse(&s.to_string()).unwrap(), s);
    }

    #[test]
    fn bad_input_says_what_is_wrong() {
        let cases = [
            ("a in (b", "missing ')'"),
            ("a,,b", "empty requirement"),
            ("a foo (b)", "unknown operator \"foo\""),
            ("a b", "expected KEY"),
            ("a>x", "needs an integer"),
            ("-a=1", "invalid label key \"-a\""),
            ("a=b c", "invalid label value \"b c\""),
            ("Foo.com/a=1", "DNS subdomain"),
            (&format!("{}=1", "k".repeat(64)), "1 to 63 characters"),
        ];
        for (input, want) in cases {
            let err = Selector::parse(input).unwrap_err().to_string();
            assert!(err.contains(want), "{input:?}: {err}");
        }
    }

    #[test]
    fn from_label_selector_validates() {
        let mut sel = metav1::LabelSelector {
            match_labels: Some([("pool".to_string(), "prod".to_string())].into()),
            match_expressions: Some(vec![metav1::LabelSelectorRequirement {
                key: "zone".into(),
                operator: "In".into(),
                values: Some(vec!["a".into()]),
            }]),
        };
        let s = Selector::from_label_selector(&sel).unwrap();
        assert!(s.matches(&labels(&[("pool", "prod"), ("zone", "a")])));
        assert!(!s.matches(&labels(&[("pool", "prod")])));

        sel.match_expressions.as_mut().unwrap()[0].operator = "Within".into();
        let err = Selector::from_label_selector(&sel).unwrap_err().to_string();
        assert!(err.contains("unknown operator \"Within\""), "{err}");
        sel.match_expressions.as_mut().unwrap()[0].operator = "Exists".into();
        let err = Selector::from_label_selector(&sel).unwrap_err().to_string();
        assert!(err.contains("takes no values"), "{err}");
    }
}
