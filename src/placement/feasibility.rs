//! Which nodes a pod may land on: the checks kube-scheduler makes that placement
//! can see without running it (nodeName, nodeSelector, required node affinity,
//! NoSchedule/NoExecute taints). Used by `berth explain --nodes` and for the
//! "no pool node fits" warning; resources and inter-pod rules are left to the
//! scheduler.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{NodeSelectorRequirement, NodeSelectorTerm, Taint, Toleration};

use super::grants::Grants;
use super::pod::PodView;
use super::warning::bounded;
use super::{Input, NodeIndex, NodeInfo};
use crate::names::{POOL_LABEL, POOL_TAINT};
use crate::policy::PolicySet;

/// Where a pod may go, as far as [`node_fits`] reads it: its node name, node
/// selector, required node-affinity terms and tolerations.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Placement {
    pub node_name: Option<String>,
    pub node_selector: BTreeMap<String, String>,
    /// Required nodeSelectorTerms (ORed); none means no requirement.
    pub required: Vec<NodeSelectorTerm>,
    pub tolerations: Vec<Toleration>,
}

impl Placement {
    /// The pod as it is.
    pub fn of(pod: &PodView) -> Placement {
        Placement {
            node_name: pod.node_name().map(str::to_owned),
            node_selector: pod.node_selector().clone(),
            required: pod.required_terms().to_vec(),
            tolerations: pod.tolerations().to_vec(),
        }
    }

    /// The pod as berth's patch for `grants` leaves it ([`super::patch`] builds
    /// that patch on the raw JSON; a property test holds the two to the same
    /// nodes). berth's own tolerations and node expressions go, its grants come in:
    /// the required expressions are ANDed into every term, a term left with
    /// nothing is dropped (and with all of them the requirement), a term empty to
    /// begin with stays empty (it matches no node), and a pod without terms gets
    /// one of the grants.
    pub fn after(pod: &PodView, grants: &Grants) -> Placement {
        let wanted = &grants.required;
        let own = pod.required_terms();
        let required = if own.is_empty() {
            (!wanted.is_empty())
                .then(|| NodeSelectorTerm {
                    match_expressions: Some(wanted.clone()),
                    match_fields: None,
                })
                .into_iter()
                .collect()
        } else {
            own.iter()
                .map(|term| {
                    if matches_nothing(term) {
                        return term.clone();
                    }
                    // The pod's own expressions stay, berth's own keys included:
                    // removing one would widen where the pod may land.
                    let mut expressions: Vec<NodeSelectorRequirement> =
                        term.match_expressions.iter().flatten().cloned().collect();
                    for expression in wanted {
                        if !expressions.contains(expression) {
                            expressions.push(expression.clone());
                        }
                    }
                    NodeSelectorTerm {
                        match_expressions: Some(expressions),
                        match_fields: term.match_fields.clone().filter(|f| !f.is_empty()),
                    }
                })
                .collect()
        };
        let tolerations = pod
            .tolerations()
            .iter()
            .filter(|t| t.key.as_deref() != Some(POOL_TAINT))
            .chain(&grants.tolerations)
            .cloned()
            .collect();
        Placement {
            node_name: pod.node_name().map(str::to_owned),
            node_selector: pod.node_selector().clone(),
            required,
            tolerations,
        }
    }
}

/// A term with neither expressions nor fields: it matches no node.
fn matches_nothing(term: &NodeSelectorTerm) -> bool {
    term.match_expressions.as_ref().is_none_or(Vec::is_empty)
        && term.match_fields.as_ref().is_none_or(Vec::is_empty)
}

/// `node` as the controller keeps it: with the pool label and, for a dedicated
/// pool, the pool taint of the policy that owns it.
pub fn with_pool_state(name: &str, node: &NodeInfo, policies: &PolicySet) -> NodeInfo {
    let mut node = node.clone();
    if let Some(owner) = policies.pool_of_node(name, Some(&node.labels)) {
        node.labels.insert(POOL_LABEL.into(), owner.name.clone());
        if let Some(taint) = owner.pool_taint() {
            node.taints.retain(|t| t.key != POOL_TAINT);
            node.taints.push(taint);
        }
    }
    node
}

/// Whether a pod placed as `pod` may go to the node `name`; the error says why not.
pub fn node_fits(pod: &Placement, name: &str, node: &NodeInfo) -> Result<(), String> {
    if let Some(wanted) = pod.node_name.as_deref()
        && wanted != name
    {
        return Err(format!("the pod names node {wanted}"));
    }
    for (key, value) in &pod.node_selector {
        if node.labels.get(key) != Some(value) {
            return Err(format!("nodeSelector {key}={value} does not match"));
        }
    }
    let terms = &pod.required;
    if !terms.is_empty() && !terms.iter().any(|t| term_matches(t, name, node)) {
        let first = terms
            .iter()
            .flat_map(|t| t.match_expressions.iter().flatten());
        let failing = first
            .filter(|r| !requirement_matches(r, node.labels.get(&r.key).map(String::as_str)))
            .map(describe_requirement)
            .next()
            .unwrap_or_else(|| "matchFields".into());
        return Err(format!("required node affinity fails ({failing})"));
    }
    for taint in &node.taints {
        let blocking = taint.effect == "NoSchedule" || taint.effect == "NoExecute";
        if blocking && !pod.tolerations.iter().any(|t| tolerates(t, taint)) {
            let value = taint.value.as_deref().unwrap_or_default();
            return Err(format!(
                "taint {}={value}:{} is not tolerated",
                taint.key, taint.effect
            ));
        }
    }
    Ok(())
}

fn term_matches(term: &NodeSelectorTerm, name: &str, node: &NodeInfo) -> bool {
    let expressions = term.match_expressions.iter().flatten();
    let fields = term.match_fields.iter().flatten();
    !matches_nothing(term)
        && expressions
            .clone()
            .all(|r| requirement_matches(r, node.labels.get(&r.key).map(String::as_str)))
        && fields
            .clone()
            .all(|r| r.key == "metadata.name" && requirement_matches(r, Some(name)))
}

/// Kubernetes node-selector semantics for one requirement against a label value.
pub fn requirement_matches(requirement: &NodeSelectorRequirement, value: Option<&str>) -> bool {
    let values = requirement.values.as_deref().unwrap_or_default();
    let number = |v: &str| v.parse::<i64>().ok();
    match requirement.operator.as_str() {
        "In" => value.is_some_and(|v| values.iter().any(|x| x == v)),
        "NotIn" => value.is_none_or(|v| !values.iter().any(|x| x == v)),
        "Exists" => value.is_some(),
        "DoesNotExist" => value.is_none(),
        "Gt" | "Lt" => {
            let (Some(have), Some(bound)) = (
                value.and_then(number),
                values.first().and_then(|v| number(v)),
            ) else {
                return false;
            };
            if requirement.operator == "Gt" {
                have > bound
            } else {
                have < bound
            }
        }
        _ => false,
    }
}

/// Kubernetes toleration semantics: an empty key with `Exists` tolerates every
/// taint; an empty effect matches every effect.
pub fn tolerates(toleration: &Toleration, taint: &Taint) -> bool {
    let effect_ok = toleration
        .effect
        .as_deref()
        .is_none_or(|e| e.is_empty() || e == taint.effect);
    let key = toleration.key.as_deref().unwrap_or_default();
    let key_ok = key.is_empty() || key == taint.key;
    let value_ok = match toleration.operator.as_deref() {
        Some("Exists") => true,
        _ => {
            !key.is_empty()
                && toleration.value.as_deref().unwrap_or_default()
                    == taint.value.as_deref().unwrap_or_default()
        }
    };
    effect_ok && key_ok && value_ok
}

/// `key Operator [values]`, as a person reads it.
pub fn describe_requirement(r: &NodeSelectorRequirement) -> String {
    match r.values.as_deref() {
        Some(values) if !values.is_empty() => {
            format!("{} {} [{}]", r.key, r.operator, values.join(", "))
        }
        _ => format!("{} {}", r.key, r.operator),
    }
}

/// Warnings for pools whose nodes the pod's own constraints rule out.
pub fn pool_warnings(
    input: &Input,
    pod: &PodView,
    grants: &Grants,
    nodes: &NodeIndex,
) -> Vec<String> {
    let Some(pool_expression) = grants
        .required
        .iter()
        .find(|r| r.key == POOL_LABEL && r.operator == "In")
    else {
        return Vec::new();
    };
    let pools = pool_expression.values.as_deref().unwrap_or_default();
    // A pool of named nodes can own only those: look them up rather than scan
    // the cluster, so a pod of such a pool costs the same on 5,000 nodes as on 5.
    let named: Option<Vec<&String>> = pools
        .iter()
        .map(|name| {
            let pool = input.policies.get(name)?.spec.pool.as_ref()?;
            pool.node_selector
                .is_none()
                .then_some(pool.node_names.iter())
        })
        .collect::<Option<Vec<_>>>()
        .map(|names| names.into_iter().flatten().collect());
    let candidates: Box<dyn Iterator<Item = (&String, &NodeInfo)>> = match named {
        Some(names) => Box::new(
            names
                .into_iter()
                .filter_map(|n| nodes.get_key_value(n))
                .map(|(n, info)| (n, &**info)),
        ),
        None => Box::new(nodes.iter().map(|(n, info)| (n, &**info))),
    };
    let mut pool_nodes = candidates
        .filter_map(|(name, node)| {
            let owner = input.policies.pool_of_node(name, Some(&node.labels))?;
            pools
                .contains(&owner.name)
                .then(|| (name, with_pool_state(name, node, input.policies)))
        })
        .peekable();
    // With no pool node known there is nothing to fit.
    if pool_nodes.peek().is_none() {
        return Vec::new();
    }
    let placement = Placement::after(pod, grants);
    if pool_nodes.any(|(name, node)| node_fits(&placement, name, &node).is_ok()) {
        return Vec::new();
    }
    vec![bounded(format!(
        "no node of pool {} fits this pod's own constraints; it will stay Pending",
        pools.join(", ")
    ))]
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req(op: &str, values: &[&str]) -> NodeSelectorRequirement {
        super::super::grants::requirement("k", op, values)
    }

    #[test]
    fn the_placement_after_grants_is_that_of_the_whole_patched_pod() {
        let raw = serde_json::json!({"kind": "Pod",
            "metadata": {"labels": {"app": "a"}},
            "spec": {"nodeSelector": {"disk": "ssd"},
                "containers": [{"name": "c", "image": "nginx", "env": [{"name": "A", "value": "1"}]}],
                "tolerations": [{"key": POOL_TAINT, "operator": "Equal", "value": "forged"},
                                {"key": "other", "operator": "Exists"}],
                "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
                    "nodeSelectorTerms": [{"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a"]}]},
                                          {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["n1"]}]}]}}}}});
        let mut grants = Grants::default();
        grants.require(super::super::grants::requirement(
            POOL_LABEL,
            "In",
            &["cdn"],
        ));
        grants.tolerate(Toleration {
            key: Some(POOL_TAINT.into()),
            operator: Some("Equal".into()),
            value: Some("cdn".into()),
            effect: Some("NoSchedule".into()),
            toleration_seconds: None,
        });
        grants.gate("berth.io/avoid");
        grants.applied = vec!["cdn".into()];

        let mut whole = raw.clone();
        json_patch::patch(&mut whole, &super::super::build_patch(&raw, &grants)).unwrap();
        let whole = Placement::of(&PodView::read(&whole).unwrap());
        let placement = Placement::after(&PodView::read(&raw).unwrap(), &grants);
        assert_eq!(placement, whole);
        assert_eq!(placement.tolerations.len(), 2, "forged one out, cdn in");
    }

    #[test]
    fn requirements_follow_kubernetes_semantics() {
        assert!(requirement_matches(&req("In", &["a", "b"]), Some("b")));
        assert!(!requirement_matches(&req("In", &["a"]), None));
        assert!(requirement_matches(&req("NotIn", &["a"]), None));
        assert!(!requirement_matches(&req("NotIn", &["a"]), Some("a")));
        assert!(requirement_matches(&req("Exists", &[]), Some("")));
        assert!(requirement_matches(&req("DoesNotExist", &[]), None));
        assert!(requirement_matches(&req("Gt", &["3"]), Some("4")));
        assert!(!requirement_matches(&req("Lt", &["3"]), Some("x")));
    }

    #[test]
    fn tolerations_follow_kubernetes_semantics() {
        let taint = Taint {
            key: POOL_TAINT.into(),
            value: Some("cdn".into()),
            effect: "NoSchedule".into(),
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
        assert!(tolerates(&tol(None, "Exists", None, None), &taint));
        assert!(!tolerates(
            &tol(None, "Exists", None, Some("NoExecute")),
            &taint
        ));
        assert!(tolerates(
            &tol(Some(POOL_TAINT), "Equal", Some("cdn"), None),
            &taint
        ));
        assert!(!tolerates(
            &tol(Some(POOL_TAINT), "Equal", Some("gpu"), None),
            &taint
        ));
        assert!(tolerates(
            &tol(Some(POOL_TAINT), "Exists", None, Some("NoSchedule")),
            &taint
        ));
    }
}
