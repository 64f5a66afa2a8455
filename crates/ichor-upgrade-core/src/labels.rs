//! Kubernetes label selectors (`metav1.LabelSelector`): which objects a selector selects.
//! Storage objects select nodes with them, PodDisruptionBudgets select pods.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// A `metav1.LabelSelector`.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct LabelSelector {
    /// Every key must be present with exactly this value.
    #[serde(default)]
    pub match_labels: BTreeMap<String, String>,
    /// Every expression must hold.
    #[serde(default)]
    pub match_expressions: Vec<LabelSelectorRequirement>,
}

/// One `matchExpressions` entry.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LabelSelectorRequirement {
    /// The label key.
    pub key: String,
    /// `In`, `NotIn`, `Exists` or `DoesNotExist`.
    pub operator: String,
    /// The values, for `In` and `NotIn`.
    #[serde(default)]
    pub values: Vec<String>,
}

/// A selector that cannot be evaluated. Never treated as "selects nothing": a storage
/// object with a broken selector stops evacuation decisions with this error.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SelectorError {
    /// The operator is not one of the four Kubernetes knows.
    #[error("label selector key {key:?}: unknown operator {operator:?} (expected In, NotIn, Exists or DoesNotExist)")]
    UnknownOperator {
        /// The key.
        key: String,
        /// The operator as written.
        operator: String,
    },
    /// `In`/`NotIn` without values, or `Exists`/`DoesNotExist` with some.
    #[error("label selector key {key:?}: operator {operator} {problem}")]
    BadValues {
        /// The key.
        key: String,
        /// The operator.
        operator: String,
        /// What is wrong.
        problem: &'static str,
    },
}

impl LabelSelector {
    /// Whether the selector selects a node with these labels.
    ///
    /// # Errors
    /// A [`SelectorError`] for a requirement Kubernetes would reject.
    pub fn matches(&self, labels: &BTreeMap<String, String>) -> Result<bool, SelectorError> {
        let mut all = self.match_labels.iter().all(|(k, v)| labels.get(k) == Some(v));
        for req in &self.match_expressions {
            let value = labels.get(&req.key);
            let needs_values = |want: bool| -> Result<(), SelectorError> {
                if req.values.is_empty() == want {
                    let problem = if want { "needs at least one value" } else { "takes no values" };
                    return Err(SelectorError::BadValues {
                        key: req.key.clone(),
                        operator: req.operator.clone(),
                        problem,
                    });
                }
                Ok(())
            };
            let holds = match req.operator.as_str() {
                "In" => {
                    needs_values(true)?;
                    value.is_some_and(|v| req.values.contains(v))
                }
                "NotIn" => {
                    needs_values(true)?;
                    value.is_none_or(|v| !req.values.contains(v))
                }
                "Exists" => {
                    needs_values(false)?;
                    value.is_some()
                }
                "DoesNotExist" => {
                    needs_values(false)?;
                    value.is_none()
                }
                other => {
                    return Err(SelectorError::UnknownOperator { key: req.key.clone(), operator: other.to_owned() });
                }
            };
            all &= holds;
        }
        Ok(all)
    }
}
