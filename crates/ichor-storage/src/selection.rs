//! Which storage objects select a node: Kubernetes label-selector semantics.
//!
//! A selector with no requirements selects every node, as in Kubernetes. No storage object
//! selecting a node means there is nothing to evacuate on it.

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

/// A storage object (`TalosStorage`) as far as selection needs it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct StorageObject {
    /// The object's name.
    pub name: String,
    /// Which nodes it covers.
    pub node_selector: LabelSelector,
}

/// The names of the storage objects that select a node with these labels, in the given
/// order. Empty means nothing to evacuate.
///
/// # Errors
/// The first storage object whose selector cannot be evaluated, with its name.
pub fn selecting<'a>(
    storages: &'a [StorageObject],
    node_labels: &BTreeMap<String, String>,
) -> Result<Vec<&'a str>, (String, SelectorError)> {
    let mut names = Vec::new();
    for storage in storages {
        match storage.node_selector.matches(node_labels) {
            Ok(true) => names.push(storage.name.as_str()),
            Ok(false) => {}
            Err(e) => return Err((storage.name.clone(), e)),
        }
    }
    Ok(names)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect()
    }

    fn expr(key: &str, operator: &str, values: &[&str]) -> LabelSelectorRequirement {
        LabelSelectorRequirement {
            key: key.into(),
            operator: operator.into(),
            values: values.iter().map(|v| (*v).to_owned()).collect(),
        }
    }

    fn storage(name: &str, selector: LabelSelector) -> StorageObject {
        StorageObject { name: name.into(), node_selector: selector }
    }

    #[test]
    fn match_labels_need_every_pair() {
        let sel =
            LabelSelector { match_labels: labels(&[("storage", "longhorn"), ("zone", "a")]), ..Default::default() };
        assert!(sel.matches(&labels(&[("storage", "longhorn"), ("zone", "a"), ("x", "y")])).unwrap());
        assert!(!sel.matches(&labels(&[("storage", "longhorn")])).unwrap());
        assert!(!sel.matches(&labels(&[("storage", "ceph"), ("zone", "a")])).unwrap());
    }

    #[test]
    fn expressions_follow_kubernetes_semantics() {
        let node = labels(&[("tier", "storage")]);
        let check = |e: LabelSelectorRequirement| {
            LabelSelector { match_expressions: vec![e], ..Default::default() }.matches(&node)
        };
        assert!(check(expr("tier", "In", &["storage", "db"])).unwrap());
        assert!(!check(expr("tier", "NotIn", &["storage"])).unwrap());
        assert!(check(expr("other", "NotIn", &["x"])).unwrap(), "NotIn holds when the key is absent");
        assert!(check(expr("tier", "Exists", &[])).unwrap());
        assert!(check(expr("other", "DoesNotExist", &[])).unwrap());
        assert!(!check(expr("tier", "DoesNotExist", &[])).unwrap());
    }

    #[test]
    fn an_empty_selector_selects_every_node() {
        assert!(LabelSelector::default().matches(&labels(&[])).unwrap());
    }

    #[test]
    fn malformed_requirements_are_errors_not_no_match() {
        let bad = |e: LabelSelectorRequirement| {
            LabelSelector { match_expressions: vec![e], ..Default::default() }.matches(&labels(&[]))
        };
        assert!(matches!(bad(expr("k", "Gt", &["1"])), Err(SelectorError::UnknownOperator { .. })));
        assert!(matches!(bad(expr("k", "In", &[])), Err(SelectorError::BadValues { .. })));
        assert!(matches!(bad(expr("k", "Exists", &["v"])), Err(SelectorError::BadValues { .. })));
    }

    #[test]
    fn selecting_lists_the_storage_objects_that_select_the_node() {
        let longhorn = storage(
            "longhorn",
            LabelSelector { match_labels: labels(&[("node-role.kubernetes.io/worker", "")]), ..Default::default() },
        );
        let ceph = storage(
            "ceph",
            LabelSelector { match_expressions: vec![expr("ceph", "Exists", &[])], ..Default::default() },
        );
        let storages = [longhorn, ceph];
        assert_eq!(selecting(&storages, &labels(&[("node-role.kubernetes.io/worker", "")])).unwrap(), vec!["longhorn"]);
        assert!(selecting(&storages, &labels(&[("node-role.kubernetes.io/control-plane", "")])).unwrap().is_empty());
        let broken = [storage(
            "broken",
            LabelSelector { match_expressions: vec![expr("k", "Nope", &[])], ..Default::default() },
        )];
        assert_eq!(selecting(&broken, &labels(&[])).unwrap_err().0, "broken");
    }
}
