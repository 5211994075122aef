//! Pods a policy missed: pods the policy applies to, by the webhook's own matching
//! rule, whose `berth.io/applied` does not name it. The webhook fails open
//! (`failurePolicy: Ignore`), so every pod created while no berth replica could
//! answer is admitted as written; so are pods older than the policy or than their
//! namespace's opt-in. Failure policy cannot bring them in line; the controller
//! reports them and, with `onMissed: Evict`, has their owners recreate them.

use std::collections::BTreeSet;

use k8s_openapi::api::core::v1::{NodeSelectorRequirement, Taint};

use super::canonical::requirement_key;
use super::daemonset::is_daemonset_pod_of;
use super::feasibility::Placement;
use super::grants::grants_for;
use super::matching::match_policies;
use super::namespace::NamespaceInfo;
use super::opt_in::applied_policies;
use super::selection::tolerates;
use crate::names::{POOL_LABEL, is_owned_node_key};
use crate::objects::PodObject;
use crate::policy::{CompiledPolicy, PolicySet};

/// The owner kinds that recreate an evicted pod on their own, unchanged: the pods
/// of Deployments (through ReplicaSets) and StatefulSets. A Job may count an
/// eviction as a failure, and a bare pod is gone for good, so those are only
/// reported.
const RECREATING_OWNERS: [&str; 2] = ["ReplicaSet", "StatefulSet"];

/// Whether `pod` is one the webhook decides on and that still runs or waits:
/// not finished or being deleted, not a DaemonSet's (those get tolerations only,
/// by their sender, which the controller cannot see; told by the one DaemonSet
/// test, [`is_daemonset_pod_of`], so a made-up owner hides nothing), not a static
/// pod's mirror. `daemonsets` holds the namespace and uid of each DaemonSet.
pub fn is_candidate(pod: &PodObject, daemonsets: &BTreeSet<(String, String)>) -> bool {
    let meta = &pod.metadata;
    let owners = meta.owner_references.as_deref().unwrap_or_default();
    let namespace = meta.namespace.as_deref().unwrap_or_default();
    !pod.is_terminated()
        && !pod.is_terminating()
        && !pod.is_mirror()
        && !is_daemonset_pod_of(owners, namespace, daemonsets)
}

/// The kind and uid of the pod's controller ownerReference.
pub fn controller_owner(pod: &PodObject) -> Option<(&str, &str)> {
    pod.metadata
        .owner_references
        .iter()
        .flatten()
        .find(|o| o.controller == Some(true))
        .map(|o| (o.kind.as_str(), o.uid.as_str()))
}

/// The uid of the owner that would recreate `pod` if it were evicted.
pub fn recreating_owner(pod: &PodObject) -> Option<&str> {
    controller_owner(pod)
        .filter(|(kind, _)| RECREATING_OWNERS.contains(kind))
        .map(|(_, uid)| uid)
}

/// Whether `pod` carries berth's marks of `policy`, which berth gives every pod it
/// applies to: the toleration of its dedicated pool, and each required node
/// expression on berth's own keys (the pool's `In`, co-location's and avoidance's
/// anchors), in every required term or as a `nodeSelector`. A record without
/// them is not believed: the pod came past berth (while it was down) with a record
/// written by whoever created it. The policy's own node affinity and preferences
/// are not checked: the controller keeps only berth's marks of a pod that is
/// placed ([`PodSpec::keep_berths_marks`](crate::objects::PodSpec::keep_berths_marks)).
/// A pod whose placement is too large to keep carries nothing.
fn carries(pod: &PodObject, policy: &CompiledPolicy) -> bool {
    let Some(placement) = Placement::of_object(pod) else {
        return false;
    };
    let grants = grants_for(&[policy]);
    let tolerated = grants
        .tolerations
        .iter()
        .filter_map(|t| {
            Some(Taint {
                key: t.key.clone()?,
                value: t.value.clone(),
                effect: t.effect.clone()?,
                time_added: None,
            })
        })
        .all(|taint| placement.tolerations.iter().any(|t| tolerates(t, &taint)));
    let selected = |r: &NodeSelectorRequirement| match r.values.as_deref() {
        Some([value]) if r.operator == "In" => placement.node_selector.get(&r.key) == Some(value),
        _ => false,
    };
    let in_every_term = |r: &NodeSelectorRequirement| {
        let key = requirement_key(r);
        let pool = (r.key == POOL_LABEL && r.operator == "In").then_some(&policy.name);
        placement.required.as_ref().is_some_and(|terms| {
            terms.iter().all(|term| {
                term.match_expressions.iter().flatten().any(|e| match pool {
                    // Several required pools share one `In` expression.
                    Some(name) => {
                        e.key == POOL_LABEL
                            && e.operator == "In"
                            && e.values.iter().flatten().any(|v| v == name)
                    }
                    None => requirement_key(e) == key,
                })
            })
        })
    };
    tolerated
        && grants
            .required
            .iter()
            .filter(|r| is_owned_node_key(&r.key))
            .all(|r| selected(r) || in_every_term(r))
}

/// The policies that apply to `pod` in `namespace` (whose berth annotations read
/// as `config`) but whose decision it lacks: its `berth.io/applied` does not name
/// them, or it does but the pod does not carry what they give ([`carries`]).
pub fn missed_by<'p>(
    pod: &PodObject,
    namespace: &NamespaceInfo,
    policies: &'p PolicySet,
) -> Vec<&'p CompiledPolicy> {
    // A namespace whose annotations cannot be read gets no grants from the
    // webhook either: its pods are not missed, and evicting them would loop.
    let Ok(config) = namespace.config() else {
        return Vec::new();
    };
    let applied = applied_policies(pod.metadata.annotations.as_ref());
    match_policies(pod, namespace, Some(config), policies)
        .applied
        .into_iter()
        .map(|(policy, _)| policy)
        .filter(|policy| !applied.contains(&policy.name) || !carries(pod, policy))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::PlacementPolicy;
    use serde_json::{Value, json};

    fn policies() -> PolicySet {
        let cdn: PlacementPolicy = serde_json::from_value(json!({
            "apiVersion": "berth.io/v1alpha1", "kind": "PlacementPolicy",
            "metadata": {"name": "cdn"},
            "spec": {"images": ["*cdn*"], "pool": {"nodeNames": ["node2"]}, "onMissed": "Evict"}}))
        .unwrap();
        PolicySet::compile([&cdn]).0
    }

    fn pod(image: &str, applied: Option<&str>, owner: Option<&str>) -> PodObject {
        with_spec(image, applied, owner, json!({}))
    }

    /// A pod with `spec` besides its one container.
    fn with_spec(
        image: &str,
        applied: Option<&str>,
        owner: Option<&str>,
        spec: Value,
    ) -> PodObject {
        let owners = owner.map(|kind| {
            json!([{"apiVersion": "apps/v1", "kind": kind, "name": "o", "uid": "u1", "controller": true}])
        });
        let mut spec = spec;
        spec["containers"] = json!([{"image": image}]);
        serde_json::from_value(json!({
            "metadata": {"name": "p", "namespace": "shop",
                "annotations": applied.map(|a| json!({"berth.io/applied": a})),
                "ownerReferences": owners},
            "spec": spec}))
        .unwrap()
    }

    /// What berth gives a pod for the cdn pool (policies(): dedicated): its
    /// toleration, and the pool label `In [pools]` in the one required term.
    fn routed(pools: &[&str]) -> Value {
        json!({"tolerations": [{"key": "berth.io/pool", "operator": "Equal", "value": "cdn",
                "effect": "NoSchedule"}],
            "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [{"matchExpressions": [
                    {"key": POOL_LABEL, "operator": "In", "values": pools}]}]}}}})
    }

    fn opted_in() -> NamespaceInfo {
        let mut namespace = NamespaceInfo::new("shop");
        namespace
            .annotations
            .insert("berth.io/policies".into(), "cdn".into());
        namespace
    }

    #[test]
    fn a_pod_the_policy_applies_to_without_its_decision_is_missed() {
        let namespace = opted_in();
        let set = policies();
        let names = |pod: &PodObject| -> Vec<String> {
            missed_by(pod, &namespace, &set)
                .iter()
                .map(|p| p.name.clone())
                .collect()
        };
        assert_eq!(names(&pod("example/cdn:1", None, None)), ["cdn"]);
        let recorded = |spec: Value| names(&with_spec("example/cdn:1", Some("cdn"), None, spec));
        assert!(
            recorded(routed(&["cdn", "gpu"])).is_empty(),
            "berth's decision, the pool shared with another"
        );
        let mut by_selector = routed(&[]);
        by_selector["affinity"] = json!(null);
        by_selector["nodeSelector"] = json!({POOL_LABEL: "cdn"});
        assert!(
            recorded(by_selector).is_empty(),
            "a nodeSelector carries the pool too"
        );
        assert_eq!(
            names(&pod("example/cdn:1", Some("cdn"), None)),
            ["cdn"],
            "a record the pod wrote itself, without the decision, is not believed"
        );
        assert_eq!(recorded(routed(&["gpu"])), ["cdn"], "another pool");
        let mut untolerated = routed(&["cdn"]);
        untolerated["tolerations"] = json!([]);
        assert_eq!(
            recorded(untolerated),
            ["cdn"],
            "without the pool's toleration"
        );
        assert!(
            names(&pod("nginx:1", None, None)).is_empty(),
            "not its image"
        );
        let elsewhere = NamespaceInfo::new("other");
        assert!(
            missed_by(&pod("example/cdn:1", None, None), &elsewhere, &set).is_empty(),
            "a namespace that does not opt in misses nothing"
        );
        let mut broken = opted_in();
        broken
            .annotations
            .insert("berth.io/images.Bad_Name".into(), "*cdn*".into());
        assert!(
            missed_by(&pod("example/cdn:1", None, None), &broken, &set).is_empty(),
            "a namespace whose annotations cannot be read gets no grants, so misses nothing"
        );
    }

    #[test]
    fn only_pods_a_replicaset_or_statefulset_recreates_are_evictable() {
        assert_eq!(
            recreating_owner(&pod("cdn", None, Some("ReplicaSet"))),
            Some("u1")
        );
        assert_eq!(
            recreating_owner(&pod("cdn", None, Some("StatefulSet"))),
            Some("u1")
        );
        assert_eq!(recreating_owner(&pod("cdn", None, Some("Job"))), None);
        assert_eq!(
            recreating_owner(&pod("cdn", None, None)),
            None,
            "a bare pod"
        );
        let agents = BTreeSet::from([("shop".to_string(), "u1".to_string())]);
        assert!(!is_candidate(&pod("cdn", None, Some("DaemonSet")), &agents));
        assert!(
            is_candidate(&pod("cdn", None, Some("DaemonSet")), &BTreeSet::new()),
            "a DaemonSet owner that does not exist hides nothing"
        );
        assert!(is_candidate(&pod("cdn", None, Some("ReplicaSet")), &agents));
    }

    #[test]
    fn a_pod_as_berth_admitted_it_carries_its_decision() {
        let namespace = opted_in();
        let set = policies();
        let mut raw = json!({"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "p", "namespace": "shop"},
            "spec": {"containers": [{"name": "c", "image": "example/cdn:1"}],
                "tolerations": [{"key": "node.kubernetes.io/not-ready", "operator": "Exists",
                    "effect": "NoExecute", "tolerationSeconds": 300}]}});
        let decision = crate::placement::decide(&crate::placement::Input {
            pod: &raw,
            namespace: &namespace,
            policies: &set,
            nodes: None,
            requester: crate::placement::Requester::Other,
            groups: Default::default(),
        });
        let patch = crate::placement::build_patch(&raw, &decision.grants);
        json_patch::patch(&mut raw, &patch).unwrap();
        let mut admitted: PodObject = serde_json::from_value(raw.clone()).unwrap();
        assert!(missed_by(&admitted, &namespace, &set).is_empty(), "{raw:#}");
        // As the controller keeps it once it runs.
        admitted.spec.bind("node2");
        admitted.spec.keep_berths_marks(true);
        assert!(missed_by(&admitted, &namespace, &set).is_empty());
    }
}
