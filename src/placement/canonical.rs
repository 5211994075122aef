//! When two node requirements, terms, preferences or tolerations are the same to
//! Kubernetes, whatever their spelling. berth compares what a pod has with what it
//! grants by these keys, never by the JSON text: the apiserver stores a pod in its
//! own spelling (`values: []` is dropped, an empty operator stays empty), and a
//! user may list values in any order, so a literal comparison would add berth's
//! grants again on every admission of a stored pod (SPEC "Merge, never clobber":
//! admitting berth's own output yields an empty patch).
//!
//! Two items with the same key mean the same thing. The converse does not always
//! hold (`In [a, a]` and `In [a]` differ here): a difference only costs an
//! expression added twice, never a wrong placement.

use k8s_openapi::api::core::v1::{
    NodeSelectorRequirement, NodeSelectorTerm, PreferredSchedulingTerm, Toleration,
};

/// A node requirement: key, operator and its values in order (absent and empty
/// values are the same).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct RequirementKey {
    key: String,
    operator: String,
    values: Vec<String>,
}

pub fn requirement_key(r: &NodeSelectorRequirement) -> RequirementKey {
    let mut values = r.values.clone().unwrap_or_default();
    values.sort_unstable();
    RequirementKey {
        key: r.key.clone(),
        operator: r.operator.clone(),
        values,
    }
}

/// A nodeSelectorTerm: its expressions and its fields, each in order (they are
/// ANDed, so their order means nothing).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct TermKey {
    expressions: Vec<RequirementKey>,
    fields: Vec<RequirementKey>,
}

pub fn term_key(term: &NodeSelectorTerm) -> TermKey {
    let keys = |list: &Option<Vec<NodeSelectorRequirement>>| {
        let mut keys: Vec<RequirementKey> = list.iter().flatten().map(requirement_key).collect();
        keys.sort_unstable();
        keys
    };
    TermKey {
        expressions: keys(&term.match_expressions),
        fields: keys(&term.match_fields),
    }
}

/// A preferred term: its weight and its preference.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct PreferredKey {
    weight: i32,
    preference: TermKey,
}

pub fn preferred_key(term: &PreferredSchedulingTerm) -> PreferredKey {
    PreferredKey {
        weight: term.weight,
        preference: term_key(&term.preference),
    }
}

/// A toleration, with an absent key, value or effect the same as an empty one and
/// no operator the same as `Equal` (as `ToleratesTaint` reads them).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct TolerationKey {
    key: String,
    operator: String,
    value: String,
    effect: String,
    seconds: Option<i64>,
}

pub fn toleration_key(t: &Toleration) -> TolerationKey {
    let text = |s: &Option<String>| s.clone().unwrap_or_default();
    let operator = match t.operator.as_deref() {
        None | Some("") => "Equal".to_owned(),
        Some(op) => op.to_owned(),
    };
    TolerationKey {
        key: text(&t.key),
        operator,
        value: text(&t.value),
        effect: text(&t.effect),
        seconds: t.toleration_seconds,
    }
}

/// `r` as berth writes it: no `values` when there are none, as the apiserver
/// stores it.
pub fn normalized(r: &NodeSelectorRequirement) -> NodeSelectorRequirement {
    NodeSelectorRequirement {
        values: r.values.clone().filter(|v| !v.is_empty()),
        ..r.clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::Value;
    use serde_json::json;

    fn requirement(value: Value) -> NodeSelectorRequirement {
        serde_json::from_value(value).unwrap()
    }

    #[test]
    fn empty_values_and_value_order_do_not_matter() {
        let stored = requirement(json!({"key": "k", "operator": "Exists"}));
        let written = requirement(json!({"key": "k", "operator": "Exists", "values": []}));
        assert_eq!(requirement_key(&stored), requirement_key(&written));
        let ab = requirement(json!({"key": "k", "operator": "In", "values": ["a", "b"]}));
        let ba = requirement(json!({"key": "k", "operator": "In", "values": ["b", "a"]}));
        assert_eq!(requirement_key(&ab), requirement_key(&ba));
        let a = requirement(json!({"key": "k", "operator": "In", "values": ["a"]}));
        assert_ne!(requirement_key(&ab), requirement_key(&a));
    }

    #[test]
    fn preferences_compare_by_weight_and_meaning() {
        let term = |weight: i32, values: Value| -> PreferredSchedulingTerm {
            serde_json::from_value(
                json!({"weight": weight, "preference": {"matchExpressions": [
                {"key": "zone", "operator": "In", "values": values},
                {"key": "ssd", "operator": "Exists"}]}}),
            )
            .unwrap()
        };
        assert_eq!(
            preferred_key(&term(50, json!(["a", "b"]))),
            preferred_key(&term(50, json!(["b", "a"])))
        );
        assert_ne!(
            preferred_key(&term(50, json!(["a"]))),
            preferred_key(&term(60, json!(["a"])))
        );
    }

    #[test]
    fn tolerations_compare_as_kubernetes_reads_them() {
        let toleration = |value: Value| -> Toleration { serde_json::from_value(value).unwrap() };
        let plain = toleration(json!({"key": "k", "value": "v"}));
        let equal =
            toleration(json!({"key": "k", "operator": "Equal", "value": "v", "effect": ""}));
        assert_eq!(toleration_key(&plain), toleration_key(&equal));
        let exists = toleration(json!({"key": "k", "operator": "Exists"}));
        assert_ne!(toleration_key(&plain), toleration_key(&exists));
    }
}
