//! Which nodes a pod may land on: the checks kube-scheduler makes that placement
//! can see without running it (nodeName, nodeSelector, required node affinity,
//! NoSchedule/NoExecute taints). Used by `berth explain --nodes` and for the
//! "no pool node fits" warning; resources and inter-pod rules are left to the
//! scheduler.

use k8s_openapi::api::core::v1::{NodeSelectorRequirement, NodeSelectorTerm, Taint, Toleration};
use serde_json::{Map, Value};

use super::grants::Grants;
use super::pod::PodView;
use super::warning::bounded;
use super::{Input, NodeIndex, NodeInfo, build_patch};
use crate::names::{POOL_LABEL, POOL_TAINT};
use crate::policy::PolicySet;

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

/// Whether `pod` may be placed on the node `name`; the error says why not.
pub fn node_fits(pod: &PodView, name: &str, node: &NodeInfo) -> Result<(), String> {
    if let Some(wanted) = pod.node_name()
        && wanted != name
    {
        return Err(format!("the pod names node {wanted}"));
    }
    for (key, value) in pod.node_selector() {
        if node.labels.get(key) != Some(value) {
            return Err(format!("nodeSelector {key}={value} does not match"));
        }
    }
    let terms = pod.required_terms();
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
        if blocking && !pod.tolerations().iter().any(|t| tolerates(t, taint)) {
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
    let has_any = term
        .match_expressions
        .as_ref()
        .is_some_and(|e| !e.is_empty())
        || term.match_fields.as_ref().is_some_and(|f| !f.is_empty());
    has_any
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

/// The fields of a pod spec that [`node_fits`] reads.
const PLACEMENT_FIELDS: [&str; 4] = ["nodeName", "nodeSelector", "affinity", "tolerations"];

/// The pod as it will be after berth's patch, as far as [`node_fits`] reads it.
///
/// Only the spec fields the fit check reads are copied and patched, not the whole
/// pod (containers, env, volumes: most of its bytes). The patch is built against
/// that copy, and its operations on those fields look at nothing else, so they
/// come out as they would on the whole pod.
pub fn patched_pod(raw: &Value, grants: &Grants) -> Option<PodView> {
    let spec = raw.get("spec").and_then(Value::as_object);
    let placement: Map<String, Value> = PLACEMENT_FIELDS
        .iter()
        .filter_map(|&field| Some((field.to_owned(), spec?.get(field)?.clone())))
        .collect();
    let mut pod = Value::Object(Map::from_iter([("spec".into(), Value::Object(placement))]));
    let patch = build_patch(&pod, grants);
    json_patch::patch(&mut pod, &patch).ok()?;
    PodView::read(&pod).ok()
}

/// Warnings for pools whose nodes the pod's own constraints rule out.
pub fn pool_warnings(input: &Input, grants: &Grants, nodes: &NodeIndex) -> Vec<String> {
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
        Some(names) => Box::new(names.into_iter().filter_map(|n| nodes.get_key_value(n))),
        None => Box::new(nodes.iter()),
    };
    let mut pool_nodes = candidates
        .filter_map(|(name, node)| {
            let owner = input.policies.pool_of_node(name, Some(&node.labels))?;
            pools
                .contains(&owner.name)
                .then(|| (name, with_pool_state(name, node, input.policies)))
        })
        .peekable();
    // With no pool node known there is nothing to fit, and no patched pod to make.
    if pool_nodes.peek().is_none() {
        return Vec::new();
    }
    let Some(pod) = patched_pod(input.pod, grants) else {
        return Vec::new();
    };
    if pool_nodes.any(|(name, node)| node_fits(&pod, name, &node).is_ok()) {
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
    fn the_patched_placement_fields_are_those_of_the_whole_patched_pod() {
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
        json_patch::patch(&mut whole, &build_patch(&raw, &grants)).unwrap();
        let whole = PodView::read(&whole).unwrap();
        let placement = patched_pod(&raw, &grants).expect("patched");
        assert_eq!(placement.required_terms(), whole.required_terms());
        assert_eq!(placement.tolerations(), whole.tolerations());
        assert_eq!(placement.node_selector(), whole.node_selector());
        assert_eq!(placement.node_name(), whole.node_name());
        assert_eq!(placement.tolerations().len(), 2, "forged one out, cdn in");
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
