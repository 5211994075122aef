//! Which nodes a pod may land on: the checks kube-scheduler makes that placement
//! can see without running it (nodeName, nodeSelector, required node affinity,
//! NoSchedule/NoExecute taints), with Kubernetes' own semantics
//! ([`super::selection`]). Used by `berth explain --nodes` and for the "no pool
//! node fits" warning; resources and inter-pod rules are left to the scheduler.

use std::borrow::Cow;
use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::core::v1::{NodeSelectorRequirement, NodeSelectorTerm, Toleration};

use super::canonical::requirement_key;
use super::error::Error;
use super::grants::Grants;
use super::selection::{
    is_empty_term, label_requirement_parses, required_matches, requirement_matches, taint_counts,
    term_parses, tolerates,
};
use super::warning::bounded;
use crate::names::{POOL_LABEL, POOL_TAINT};
use crate::objects::{NodeIndex, NodeInfo, PodObject};
use crate::policy::{CompiledPolicy, PolicySet};

/// Where a pod may go, as far as [`node_fits`] reads it: its node name, node
/// selector, required node-affinity terms and tolerations.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Placement {
    pub node_name: Option<String>,
    pub node_selector: BTreeMap<String, String>,
    /// Required nodeSelectorTerms (ORed); `None` means no requirement, and `Some`
    /// of no terms matches no node.
    pub required: Option<Vec<NodeSelectorTerm>>,
    pub tolerations: Vec<Toleration>,
}

impl Placement {
    /// The pod as it is.
    pub fn of(pod: &PodObject) -> Placement {
        Placement {
            node_name: pod.node_name().map(str::to_owned),
            node_selector: pod.node_selector().clone(),
            required: pod.required_affinity().map(<[_]>::to_vec),
            tolerations: pod.tolerations().to_vec(),
        }
    }

    /// A pod as the cache holds it; `None` when its placement was too large to
    /// keep ([`PodObject::too_large`]).
    pub fn of_object(pod: &PodObject) -> Option<Placement> {
        (!pod.too_large()).then(|| Placement::of(pod))
    }

    /// The pod as berth's patch for `grants` leaves it ([`super::patch`] builds
    /// that patch from the pod's view as sent; a property test holds the two to the
    /// same nodes). berth's own tolerations go and its grants come in; the required
    /// expressions are ANDed into every term that matches something (an expression
    /// already there in another spelling is not repeated), an empty term stays
    /// empty, a required affinity with no terms stays so (it matches no node), and
    /// a pod without one gets one term of the grants.
    pub fn after(pod: &PodObject, grants: &Grants) -> Placement {
        let wanted = &grants.required;
        let pin = grants.pin_fields();
        let required = match pod.required_affinity() {
            None => (!wanted.is_empty() || !pin.is_empty()).then(|| {
                vec![NodeSelectorTerm {
                    match_expressions: (!wanted.is_empty()).then(|| wanted.clone()),
                    match_fields: (!pin.is_empty()).then(|| pin.clone()),
                }]
            }),
            Some(own) => Some(
                own.iter()
                    .map(|term| with_required(term, wanted, &pin))
                    .collect(),
            ),
        };
        let tolerations = pod
            .tolerations()
            .iter()
            .filter(|t| t.key.as_deref() != Some(POOL_TAINT))
            .chain(&grants.tolerations)
            .cloned()
            .collect();
        Placement {
            node_name: pod
                .node_name()
                .filter(|_| grants.pinned_to.is_none())
                .map(str::to_owned),
            node_selector: pod.node_selector().clone(),
            required,
            tolerations,
        }
    }
}

/// `term` with `wanted` expressions and `pin` fields ANDed in. The pod's own
/// requirements stay, berth's own keys included: removing one would widen where
/// the pod may land.
fn with_required(
    term: &NodeSelectorTerm,
    wanted: &[NodeSelectorRequirement],
    pin: &[NodeSelectorRequirement],
) -> NodeSelectorTerm {
    if is_empty_term(term) {
        return term.clone();
    }
    let and = |own: &Option<Vec<NodeSelectorRequirement>>, more: &[NodeSelectorRequirement]| {
        let mut all: Vec<NodeSelectorRequirement> = own.iter().flatten().cloned().collect();
        let mut present: BTreeSet<_> = all.iter().map(requirement_key).collect();
        for requirement in more {
            if present.insert(requirement_key(requirement)) {
                all.push(requirement.clone());
            }
        }
        (own.is_some() || !all.is_empty()).then_some(all)
    };
    NodeSelectorTerm {
        match_expressions: and(&term.match_expressions, wanted),
        match_fields: and(&term.match_fields, pin),
    }
}

/// `node` as the controller keeps it: with the pool label and, for a dedicated
/// pool, the pool taint of the policy that owns it.
pub fn with_pool_state(name: &str, node: &NodeInfo, policies: &PolicySet) -> NodeInfo {
    with_pool_of(node, policies.pool_of_node(name, Some(&node.labels))).into_owned()
}

/// `node` with the pool label and taint of `owner`, the policy whose pool owns it:
/// the node itself when the controller has already put them there, as it has on
/// every pool node it keeps (a copy of a node's labels per review was a good
/// part of the pool-fit warning's cost).
fn with_pool_of<'n>(node: &'n NodeInfo, owner: Option<&CompiledPolicy>) -> Cow<'n, NodeInfo> {
    let Some(owner) = owner else {
        return Cow::Borrowed(node);
    };
    let taint = owner.pool_taint();
    let labelled = node.labels.get(POOL_LABEL) == Some(&owner.name);
    let mut pool_taints = node.taints.iter().filter(|t| t.key == POOL_TAINT);
    let tainted = match &taint {
        Some(taint) => pool_taints.next() == Some(taint) && pool_taints.next().is_none(),
        None => true,
    };
    if labelled && tainted {
        return Cow::Borrowed(node);
    }
    let mut node = node.clone();
    node.labels.insert(POOL_LABEL.into(), owner.name.clone());
    if let Some(taint) = taint {
        node.taints.retain(|t| t.key != POOL_TAINT);
        node.taints.push(taint);
    }
    Cow::Owned(node)
}

/// Whether a pod placed as `pod` may go to the node `name`; the error says why not.
pub fn node_fits(pod: &Placement, name: &str, node: &NodeInfo) -> Result<(), Error> {
    if let Some(wanted) = pod.node_name.as_deref()
        && wanted != name
    {
        return Err(Error::NamesNode(wanted.to_owned()));
    }
    for (key, value) in &pod.node_selector {
        if node.labels.get(key) != Some(value) {
            return Err(Error::NodeSelector {
                key: key.clone(),
                value: value.clone(),
            });
        }
    }
    let required = pod.required.as_deref();
    if !required_matches(required, name, &node.labels) {
        return Err(why_no_term_matches(required.unwrap_or_default(), node));
    }
    let names_its_node = pod.node_name.is_some();
    for taint in &node.taints {
        if taint_counts(taint, names_its_node)
            && !pod.tolerations.iter().any(|t| tolerates(t, taint))
        {
            return Err(Error::Untolerated {
                key: taint.key.clone(),
                value: taint.value.clone().unwrap_or_default(),
                effect: taint.effect.clone(),
            });
        }
    }
    Ok(())
}

/// Why no required term admits the node, from the first term: it has no terms,
/// it is empty, a requirement does not parse, or a requirement fails.
fn why_no_term_matches(terms: &[NodeSelectorTerm], node: &NodeInfo) -> Error {
    let Some(first) = terms.first() else {
        return Error::NoTerms;
    };
    if terms.iter().all(is_empty_term) {
        return Error::OnlyEmptyTerms;
    }
    let term = terms.iter().find(|t| !is_empty_term(t)).unwrap_or(first);
    if !term_parses(term) {
        let broken = term
            .match_expressions
            .iter()
            .flatten()
            .find(|r| !label_requirement_parses(r))
            .map(describe_requirement)
            .unwrap_or_else(|| "matchFields".into());
        return Error::TermDoesNotParse(broken);
    }
    let failing = term
        .match_expressions
        .iter()
        .flatten()
        .find(|r| !requirement_matches(r, node.labels.get(&r.key).map(String::as_str)))
        .map(describe_requirement)
        .unwrap_or_else(|| "matchFields".into());
    Error::TermFails(failing)
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
    policies: &PolicySet,
    pod: &PodObject,
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
            let pool = policies.get(name)?.spec.pool.as_ref()?;
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
            let owner = policies.pool_of_node(name, Some(&node.labels))?;
            pools
                .contains(&owner.name)
                .then(|| (name, with_pool_of(node, Some(owner))))
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
    use k8s_openapi::api::core::v1::Taint;

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
        let whole = Placement::of(&PodObject::read(&whole).unwrap());
        let placement = Placement::after(&PodObject::read(&raw).unwrap(), &grants);
        assert_eq!(placement, whole);
        assert_eq!(placement.tolerations.len(), 2, "forged one out, cdn in");
    }

    fn node(labels: &[(&str, &str)], taints: &[(&str, &str, &str)]) -> NodeInfo {
        NodeInfo {
            labels: labels
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            taints: taints
                .iter()
                .map(|(key, value, effect)| Taint {
                    key: key.to_string(),
                    value: Some(value.to_string()),
                    effect: effect.to_string(),
                    time_added: None,
                })
                .collect(),
        }
    }

    fn placement(pod: serde_json::Value) -> Placement {
        Placement::of(&PodObject::read(&pod).unwrap())
    }

    #[test]
    fn a_pod_that_names_its_node_is_judged_by_noexecute_taints_only() {
        let named = placement(serde_json::json!({"spec": {"nodeName": "n1"}}));
        let pool = node(&[], &[(POOL_TAINT, "cdn", "NoSchedule")]);
        assert_eq!(
            node_fits(&named, "n1", &pool),
            Ok(()),
            "the kubelet admits it"
        );
        let evicting = node(&[], &[(POOL_TAINT, "cdn", "NoExecute")]);
        assert!(node_fits(&named, "n1", &evicting).is_err());
        let scheduled = placement(serde_json::json!({"spec": {}}));
        assert!(
            node_fits(&scheduled, "n1", &pool).is_err(),
            "kube-scheduler keeps it off"
        );
    }

    #[test]
    fn a_required_affinity_with_no_terms_fits_no_node_and_keeps_none_after_grants() {
        for required in [
            serde_json::json!({"nodeSelectorTerms": []}),
            serde_json::json!({"nodeSelectorTerms": null}),
            serde_json::json!({}),
            serde_json::json!({"nodeSelectorTerms": [{}]}),
        ] {
            let raw = serde_json::json!({"spec": {"affinity": {"nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": required}}}});
            let pod = PodObject::read(&raw).unwrap();
            let mut grants = Grants::default();
            grants.require(super::super::grants::requirement(
                POOL_LABEL,
                "NotIn",
                &["cdn"],
            ));
            let after = Placement::after(&pod, &grants);
            let plain = node(&[("zone", "a")], &[]);
            let why = node_fits(&after, "n1", &plain).unwrap_err().to_string();
            assert!(why.contains("matches no node"), "{required}: {why}");
            let mut whole = raw.clone();
            json_patch::patch(&mut whole, &super::super::build_patch(&raw, &grants)).unwrap();
            assert_eq!(
                whole, raw,
                "{required}: berth adds nothing that would make it match"
            );
        }
        let none = placement(serde_json::json!({"spec": {"affinity": {"nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": null}}}}));
        assert_eq!(
            node_fits(&none, "n1", &node(&[], &[])),
            Ok(()),
            "null is no requirement"
        );
    }

    #[test]
    fn a_pool_node_as_the_controller_keeps_it_is_read_as_it_is_and_any_other_gets_the_pool_state() {
        let policy: crate::policy::PlacementPolicy = serde_json::from_value(serde_json::json!({
            "apiVersion": "berth.io/v1alpha1", "kind": "PlacementPolicy",
            "metadata": {"name": "cdn"},
            "spec": {"pool": {"nodeNames": ["n1"], "dedicated": true}}}))
        .unwrap();
        let owner = CompiledPolicy::compile(&policy).unwrap();
        let taint = owner.pool_taint().expect("a dedicated pool");
        let effect = taint.effect.as_str();
        let kept = node(
            &[(POOL_LABEL, "cdn"), ("zone", "a")],
            &[(POOL_TAINT, "cdn", effect)],
        );
        assert!(matches!(
            with_pool_of(&kept, Some(&owner)),
            Cow::Borrowed(_)
        ));
        assert!(
            matches!(with_pool_of(&kept, None), Cow::Borrowed(_)),
            "no pool"
        );
        for other in [
            node(&[("zone", "a")], &[]),
            node(&[(POOL_LABEL, "gpu")], &[(POOL_TAINT, "cdn", effect)]),
            node(&[(POOL_LABEL, "cdn")], &[(POOL_TAINT, "gpu", effect)]),
            node(&[(POOL_LABEL, "cdn")], &[(POOL_TAINT, "cdn", "NoExecute")]),
            node(
                &[(POOL_LABEL, "cdn")],
                &[(POOL_TAINT, "cdn", effect), (POOL_TAINT, "gpu", effect)],
            ),
        ] {
            let state = with_pool_of(&other, Some(&owner));
            assert!(matches!(state, Cow::Owned(_)), "{other:?}");
            assert_eq!(
                state.labels.get(POOL_LABEL).map(String::as_str),
                Some("cdn")
            );
            let pool_taints: Vec<_> = state
                .taints
                .iter()
                .filter(|t| t.key == POOL_TAINT)
                .collect();
            assert_eq!(pool_taints, [&taint], "{other:?}");
        }
    }
}
