//! Which storage objects select a node: Kubernetes label-selector semantics.
//!
//! A selector with no requirements selects every node, as in Kubernetes. No storage object
//! selecting a node means there is nothing to evacuate on it.

use std::collections::BTreeMap;

pub use ichor_upgrade_core::labels::{LabelSelector, LabelSelectorRequirement, SelectorError};
use serde::{Deserialize, Serialize};

/// A storage object (`TalosStorage`) as far as selection needs it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct StorageObject {
    /// The object's name.
    pub name: String,
    /// Which nodes it covers.
    pub node_selector: LabelSelector,
    /// How long an evacuation of a node it selects may take before the operation pauses
    /// (`spec.evacuationTimeoutSeconds`); `None`: the engine's default.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub evacuation_timeout: Option<std::time::Duration>,
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
        StorageObject { name: name.into(), node_selector: selector, evacuation_timeout: None }
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
