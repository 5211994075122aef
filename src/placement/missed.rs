//! Pods a policy missed: pods the policy applies to, by the webhook's own matching
//! rule, whose `berth.io/applied` does not name it. The webhook fails open
//! (`failurePolicy: Ignore`), so every pod created while no berth replica could
//! answer is admitted as written; so are pods older than the policy or than their
//! namespace's opt-in. Failure policy cannot bring them in line; the controller
//! reports them and, with `onMissed: Evict`, has their owners recreate them.

use serde_json::{Value, json};

use super::NamespaceInfo;
use super::matching::match_policies;
use super::opt_in::applied_policies;
use super::pod::PodView;
use crate::objects::PodObject;
use crate::policy::{CompiledPolicy, NamespaceConfig, PolicySet};

/// The owner kinds that recreate an evicted pod on their own, unchanged: the pods
/// of Deployments (through ReplicaSets) and StatefulSets. A Job may count an
/// eviction as a failure, and a bare pod is gone for good, so those are only
/// reported.
const RECREATING_OWNERS: [&str; 2] = ["ReplicaSet", "StatefulSet"];

/// Whether `pod` is one the webhook decides on and that still runs or waits:
/// not finished or being deleted, not a DaemonSet's (those get tolerations only,
/// by their sender, which the controller cannot see), not a static pod's mirror.
pub fn is_candidate(pod: &PodObject) -> bool {
    let meta = &pod.metadata;
    let mirror = meta
        .annotations
        .as_ref()
        .is_some_and(|a| a.contains_key("kubernetes.io/config.mirror"));
    !pod.is_terminated()
        && !pod.is_terminating()
        && !mirror
        && controller_owner(pod).is_none_or(|(kind, _)| kind != "DaemonSet")
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

/// What matching reads of a pod: its labels and images.
fn matching_view(pod: &PodObject) -> Option<PodView> {
    let images: Vec<Value> = pod
        .images()
        .map(|image| json!({"name": "c", "image": image}))
        .collect();
    PodView::read(&json!({
        "kind": "Pod",
        "metadata": {"labels": pod.metadata.labels},
        "spec": {"containers": images}
    }))
    .ok()
}

/// The policies that apply to `pod` in `namespace` (whose berth annotations read
/// as `config`) but that its `berth.io/applied` does not name.
pub fn missed_by<'p>(
    pod: &PodObject,
    namespace: &NamespaceInfo,
    config: &NamespaceConfig,
    policies: &'p PolicySet,
) -> Vec<&'p CompiledPolicy> {
    let Some(view) = matching_view(pod) else {
        return Vec::new();
    };
    let applied = applied_policies(pod.metadata.annotations.as_ref());
    match_policies(&view, namespace, Some(config), policies)
        .applied
        .into_iter()
        .map(|(policy, _)| policy)
        .filter(|policy| !applied.contains(&policy.name))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::PlacementPolicy;

    fn policies() -> PolicySet {
        let cdn: PlacementPolicy = serde_json::from_value(json!({
            "apiVersion": "berth.io/v1alpha1", "kind": "PlacementPolicy",
            "metadata": {"name": "cdn"},
            "spec": {"images": ["*cdn*"], "pool": {"nodeNames": ["node2"]}, "onMissed": "Evict"}}))
        .unwrap();
        PolicySet::compile([&cdn]).0
    }

    fn pod(image: &str, applied: Option<&str>, owner: Option<&str>) -> PodObject {
        let owners = owner.map(|kind| {
            json!([{"apiVersion": "apps/v1", "kind": kind, "name": "o", "uid": "u1", "controller": true}])
        });
        serde_json::from_value(json!({
            "metadata": {"name": "p", "namespace": "shop",
                "annotations": applied.map(|a| json!({"berth.io/applied": a})),
                "ownerReferences": owners},
            "spec": {"containers": [{"image": image}]}}))
        .unwrap()
    }

    fn opted_in() -> (NamespaceInfo, NamespaceConfig) {
        let mut namespace = NamespaceInfo::new("shop");
        namespace
            .annotations
            .insert("berth.io/policies".into(), "cdn".into());
        let config = NamespaceConfig::parse(&namespace.annotations).unwrap();
        (namespace, config)
    }

    #[test]
    fn a_pod_the_policy_applies_to_without_its_decision_is_missed() {
        let (namespace, config) = opted_in();
        let set = policies();
        let names = |pod: &PodObject| -> Vec<String> {
            missed_by(pod, &namespace, &config, &set)
                .iter()
                .map(|p| p.name.clone())
                .collect()
        };
        assert_eq!(names(&pod("example/cdn:1", None, None)), ["cdn"]);
        assert!(names(&pod("example/cdn:1", Some("cdn"), None)).is_empty());
        assert!(
            names(&pod("nginx:1", None, None)).is_empty(),
            "not its image"
        );
        let elsewhere = NamespaceInfo::new("other");
        let plain = NamespaceConfig::parse(&elsewhere.annotations).unwrap();
        assert!(
            missed_by(&pod("example/cdn:1", None, None), &elsewhere, &plain, &set).is_empty(),
            "a namespace that does not opt in misses nothing"
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
        assert!(!is_candidate(&pod("cdn", None, Some("DaemonSet"))));
        assert!(is_candidate(&pod("cdn", None, Some("ReplicaSet"))));
    }
}
