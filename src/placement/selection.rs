//! How Kubernetes decides whether a pod may go to a node, as far as placement can
//! see it: `nodeSelector`, required node affinity, preferred node affinity and
//! taints. Each function follows the code kube-scheduler and the kubelet run
//! (`k8s.io/component-helpers` `nodeaffinity` and `v1.Toleration.ToleratesTaint`),
//! including what happens to input the apiserver would refuse, since the webhook
//! sees pods before validation: a requirement that does not parse makes its term
//! match no node, a term with nothing in it matches no node, and a required node
//! affinity with no terms matches no node. The differential test
//! (`tests/semantics.rs`) holds these functions to Kubernetes' own code.

use k8s_openapi::api::core::v1::{
    NodeSelectorRequirement, NodeSelectorTerm, PreferredSchedulingTerm, Taint, Toleration,
};

use crate::policy::compile::{Labels, requirement_problem};

/// The one node field a `matchFields` requirement can name.
const NODE_NAME_FIELD: &str = "metadata.name";

/// Whether the label requirement `r` parses as Kubernetes parses it
/// ([`requirement_problem`]).
pub fn label_requirement_parses(r: &NodeSelectorRequirement) -> bool {
    requirement_problem(r).is_none()
}

/// Whether a label requirement that parses matches a node whose label `r.key` has
/// `value` (`None`: the node has no such label).
fn label_requirement_holds(r: &NodeSelectorRequirement, value: Option<&str>) -> bool {
    let values = r.values.as_deref().unwrap_or_default();
    match r.operator.as_str() {
        "In" => value.is_some_and(|v| values.iter().any(|x| x == v)),
        "NotIn" => value.is_none_or(|v| !values.iter().any(|x| x == v)),
        "Exists" => value.is_some(),
        "DoesNotExist" => value.is_none(),
        "Gt" | "Lt" => {
            let (Some(have), Some(bound)) = (
                value.and_then(|v| v.parse::<i64>().ok()),
                values.first().and_then(|v| v.parse::<i64>().ok()),
            ) else {
                return false;
            };
            if r.operator == "Gt" {
                have > bound
            } else {
                have < bound
            }
        }
        _ => false,
    }
}

/// Kubernetes node-selector semantics for one label requirement against a node's
/// label value: a requirement that does not parse matches nothing.
pub fn requirement_matches(r: &NodeSelectorRequirement, value: Option<&str>) -> bool {
    label_requirement_parses(r) && label_requirement_holds(r, value)
}

/// Whether a `matchFields` requirement parses: `In` or `NotIn` with exactly one
/// value (the key is not checked when matching; validation refuses any but
/// `metadata.name`).
fn field_requirement_parses(r: &NodeSelectorRequirement) -> bool {
    matches!(r.operator.as_str(), "In" | "NotIn") && r.values.as_ref().is_some_and(|v| v.len() == 1)
}

/// A node's value of field `key`: its name for `metadata.name`, else empty (as a
/// `fields.Set` answers for a field it does not hold).
fn field_value<'a>(key: &str, node_name: &'a str) -> &'a str {
    if key == NODE_NAME_FIELD {
        node_name
    } else {
        ""
    }
}

fn field_requirement_holds(r: &NodeSelectorRequirement, node_name: &str) -> bool {
    let wanted = r.values.as_deref().unwrap_or_default()[0].as_str();
    let have = field_value(&r.key, node_name);
    if r.operator == "In" {
        have == wanted
    } else {
        have != wanted
    }
}

/// Whether a term has neither expressions nor fields: it matches no node.
pub fn is_empty_term(term: &NodeSelectorTerm) -> bool {
    term.match_expressions.as_ref().is_none_or(Vec::is_empty)
        && term.match_fields.as_ref().is_none_or(Vec::is_empty)
}

/// Whether every requirement of the term parses (an empty term parses, and
/// matches nothing).
pub fn term_parses(term: &NodeSelectorTerm) -> bool {
    term.match_expressions
        .iter()
        .flatten()
        .all(label_requirement_parses)
        && term
            .match_fields
            .iter()
            .flatten()
            .all(field_requirement_parses)
}

/// Whether one nodeSelectorTerm matches the node `name` with `labels`: all its
/// expressions and fields hold. An empty term, or one with a requirement that does
/// not parse, matches no node. A node without a name is not judged by fields (as
/// `fields.Set` of such a node is empty).
pub fn term_matches(term: &NodeSelectorTerm, name: &str, labels: &Labels) -> bool {
    !is_empty_term(term)
        && term_parses(term)
        && term
            .match_expressions
            .iter()
            .flatten()
            .all(|r| label_requirement_holds(r, labels.get(&r.key).map(String::as_str)))
        && (name.is_empty()
            || term
                .match_fields
                .iter()
                .flatten()
                .all(|r| field_requirement_holds(r, name)))
}

/// Whether a pod's required node affinity admits the node: `None` (no
/// requirement) admits every node; otherwise some term must match, so no terms
/// admit no node.
pub fn required_matches(
    required: Option<&[NodeSelectorTerm]>,
    name: &str,
    labels: &Labels,
) -> bool {
    required.is_none_or(|terms| terms.iter().any(|t| term_matches(t, name, labels)))
}

/// kube-scheduler's node-affinity score of a node: the sum of the weights of the
/// preferred terms that match it. `None` when a term does not parse: kube-scheduler
/// then cannot score the pod at all.
pub fn preferred_score(
    terms: &[PreferredSchedulingTerm],
    name: &str,
    labels: &Labels,
) -> Option<i64> {
    let counted = terms
        .iter()
        .filter(|t| t.weight != 0 && !is_empty_term(&t.preference));
    let mut score = 0;
    for term in counted {
        if !term_parses(&term.preference) {
            return None;
        }
        if term_matches(&term.preference, name, labels) {
            score += i64::from(term.weight);
        }
    }
    Some(score)
}

/// Kubernetes' reading of a decimal integer in a toleration or taint compared with
/// `Gt`/`Lt`: `0`, or an optional `-` and digits without a leading zero, that fits
/// in 64 bits.
fn decimal_integer(value: &str) -> Option<i64> {
    let digits = value.strip_prefix('-').unwrap_or(value);
    let canonical = !digits.is_empty()
        && digits.bytes().all(|b| b.is_ascii_digit())
        && (digits == "0" && digits.len() == value.len() || !digits.starts_with('0'));
    canonical.then(|| value.parse().ok()).flatten()
}

/// Whether `toleration` tolerates `taint`, as `v1.Toleration.ToleratesTaint` decides
/// with comparison operators on: an empty effect matches every effect and an empty
/// key every key; `Exists` matches every value, `Equal` (or no operator) the same
/// value, `Gt`/`Lt` a taint value greater or less than the toleration's, both read
/// as decimal integers. Any other operator tolerates nothing.
pub fn tolerates(toleration: &Toleration, taint: &Taint) -> bool {
    let effect = toleration.effect.as_deref().unwrap_or_default();
    if !effect.is_empty() && effect != taint.effect {
        return false;
    }
    let key = toleration.key.as_deref().unwrap_or_default();
    if !key.is_empty() && key != taint.key {
        return false;
    }
    let value = toleration.value.as_deref().unwrap_or_default();
    let taint_value = taint.value.as_deref().unwrap_or_default();
    match toleration.operator.as_deref().unwrap_or_default() {
        "" | "Equal" => value == taint_value,
        "Exists" => true,
        operator @ ("Gt" | "Lt") => match (decimal_integer(value), decimal_integer(taint_value)) {
            (Some(bound), Some(have)) if operator == "Gt" => have > bound,
            (Some(bound), Some(have)) => have < bound,
            _ => false,
        },
        _ => false,
    }
}

/// Whether a taint keeps off a pod that does not tolerate it. kube-scheduler
/// counts `NoSchedule` and `NoExecute`; a pod that names its node skips the
/// scheduler, and the kubelet admits it past everything but `NoExecute`.
pub fn taint_counts(taint: &Taint, names_its_node: bool) -> bool {
    taint.effect == "NoExecute" || (!names_its_node && taint.effect == "NoSchedule")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req(key: &str, op: &str, values: &[&str]) -> NodeSelectorRequirement {
        NodeSelectorRequirement {
            key: key.into(),
            operator: op.into(),
            values: Some(values.iter().map(|v| v.to_string()).collect()),
        }
    }

    fn labels(pairs: &[(&str, &str)]) -> Labels {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn requirements_follow_kubernetes_semantics() {
        assert!(requirement_matches(&req("k", "In", &["a", "b"]), Some("b")));
        assert!(!requirement_matches(&req("k", "In", &["a"]), None));
        assert!(requirement_matches(&req("k", "NotIn", &["a"]), None));
        assert!(!requirement_matches(&req("k", "NotIn", &["a"]), Some("a")));
        assert!(requirement_matches(&req("k", "Exists", &[]), Some("")));
        assert!(requirement_matches(&req("k", "DoesNotExist", &[]), None));
        assert!(requirement_matches(&req("k", "Gt", &["3"]), Some("4")));
        assert!(!requirement_matches(&req("k", "Lt", &["3"]), Some("x")));
    }

    #[test]
    fn a_requirement_that_does_not_parse_matches_no_node() {
        assert!(!requirement_matches(&req("k", "In", &[]), Some("a")));
        assert!(!requirement_matches(&req("k", "NotIn", &[]), None));
        assert!(!requirement_matches(&req("k", "Exists", &["a"]), Some("a")));
        assert!(!requirement_matches(
            &req("k", "Gt", &["1", "2"]),
            Some("5")
        ));
        assert!(!requirement_matches(&req("k", "Gt", &["x"]), Some("5")));
        assert!(!requirement_matches(
            &req("k", "In", &["not valid"]),
            None.or(Some("x"))
        ));
        assert!(!requirement_matches(
            &req("bad key!", "Exists", &[]),
            Some("x")
        ));
        assert!(!requirement_matches(
            &req("k", "Matches", &["a"]),
            Some("a")
        ));
    }

    #[test]
    fn empty_terms_and_empty_requirements_match_no_node() {
        let node = labels(&[("a", "1")]);
        assert!(required_matches(None, "n", &node), "no requirement");
        assert!(!required_matches(Some(&[]), "n", &node), "no terms");
        let empty = NodeSelectorTerm::default();
        assert!(
            !required_matches(Some(&[empty]), "n", &node),
            "an empty term"
        );
        let broken = NodeSelectorTerm {
            match_expressions: Some(vec![req("a", "Exists", &[]), req("b", "In", &[])]),
            match_fields: None,
        };
        assert!(
            !term_matches(&broken, "n", &node),
            "one bad requirement spoils the term"
        );
    }

    #[test]
    fn fields_name_the_node_and_need_one_value() {
        let term = |op: &str, values: &[&str]| NodeSelectorTerm {
            match_expressions: None,
            match_fields: Some(vec![req(NODE_NAME_FIELD, op, values)]),
        };
        let node = Labels::new();
        assert!(term_matches(&term("In", &["n1"]), "n1", &node));
        assert!(!term_matches(&term("In", &["n1"]), "n2", &node));
        assert!(term_matches(&term("NotIn", &["n1"]), "n2", &node));
        assert!(
            !term_matches(&term("In", &["n1", "n2"]), "n1", &node),
            "two values do not parse"
        );
        assert!(!term_matches(&term("Exists", &[]), "n1", &node));
    }

    #[test]
    fn tolerations_follow_kubernetes_semantics() {
        let taint = |key: &str, value: &str, effect: &str| Taint {
            key: key.into(),
            value: Some(value.into()),
            effect: effect.into(),
            time_added: None,
        };
        let tol =
            |key: Option<&str>, op: &str, value: Option<&str>, effect: Option<&str>| Toleration {
                key: key.map(Into::into),
                operator: Some(op.into()),
                value: value.map(Into::into),
                effect: effect.map(Into::into),
                toleration_seconds: None,
            };
        let pool = taint("berth.io/pool", "cdn", "NoSchedule");
        assert!(tolerates(&tol(None, "Exists", None, None), &pool));
        assert!(!tolerates(
            &tol(None, "Exists", None, Some("NoExecute")),
            &pool
        ));
        assert!(tolerates(
            &tol(Some("berth.io/pool"), "Equal", Some("cdn"), None),
            &pool
        ));
        assert!(!tolerates(
            &tol(Some("berth.io/pool"), "Equal", Some("gpu"), None),
            &pool
        ));
        assert!(tolerates(
            &tol(Some("berth.io/pool"), "", Some("cdn"), None),
            &pool
        ));
        assert!(tolerates(
            &tol(Some("berth.io/pool"), "Exists", None, Some("NoSchedule")),
            &pool
        ));
        let numeric = taint("sla", "950", "NoSchedule");
        assert!(tolerates(
            &tol(Some("sla"), "Gt", Some("900"), None),
            &numeric
        ));
        assert!(!tolerates(
            &tol(Some("sla"), "Gt", Some("950"), None),
            &numeric
        ));
        assert!(tolerates(
            &tol(Some("sla"), "Lt", Some("951"), None),
            &numeric
        ));
        assert!(
            !tolerates(&tol(Some("sla"), "Gt", Some("0900"), None), &numeric),
            "leading zero"
        );
        assert!(
            !tolerates(&tol(Some("berth.io/pool"), "Gt", Some("0"), None), &pool),
            "a name is no number"
        );
        assert!(!tolerates(
            &tol(Some("sla"), "Ge", Some("1"), None),
            &numeric
        ));
    }

    #[test]
    fn decimal_integers_are_read_as_kubernetes_reads_them() {
        assert_eq!(decimal_integer("0"), Some(0));
        assert_eq!(decimal_integer("-12"), Some(-12));
        for bad in [
            "",
            "-",
            "-0",
            "007",
            "+5",
            "1e3",
            " 1",
            "99999999999999999999",
        ] {
            assert_eq!(decimal_integer(bad), None, "{bad:?}");
        }
    }
}
