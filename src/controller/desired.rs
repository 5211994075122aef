//! The berth labels and taints a node should carry: a pure function of the node,
//! the policies and the pods bound to it (SPEC "The controller"). The writer diffs
//! this against the node and writes only the difference.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Namespace, Pod, Taint};
use kube::{Resource, ResourceExt};

use crate::names::{APPLIED_ANNOTATION, POOL_LABEL, anchor_label};
use crate::policy::compile::Labels;
use crate::policy::crd::{AnchorNamespaces, DaemonSets};
use crate::policy::{CompiledPolicy, NamespaceConfig, PolicySet};

/// A pod bound to a node, reduced to what the controller needs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BoundPod {
    pub namespace: String,
    pub name: String,
    pub node: String,
    pub labels: Labels,
    /// Policies the webhook applied (`berth.io/applied`).
    pub applied: Vec<String>,
    /// Whether a DaemonSet controls it.
    pub daemonset: bool,
}

/// berth's labels and taints for one node; nothing else of the node.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct DesiredNode {
    pub labels: BTreeMap<String, String>,
    pub taints: Vec<Taint>,
    /// Policies whose pool claims the node but lose it to an older one.
    pub losing_claims: Vec<String>,
    /// Pods on a dedicated pool node that are not entitled to it.
    pub unentitled: Vec<(String, String)>,
}

/// Whether namespace `namespace` opts into `policy` (for `anchorNamespaces: Same`).
pub trait OptIn {
    fn opts_in(&self, policy: &CompiledPolicy, namespace: &str) -> bool;
}

/// Namespace opt-in for `anchorNamespaces: Same`, from Namespace objects.
pub struct NamespaceOptIn(BTreeMap<String, (NamespaceConfig, Labels)>);

impl NamespaceOptIn {
    /// A namespace whose berth annotations do not parse opts into nothing by
    /// annotation (its labels may still be selected).
    pub fn new<'a>(namespaces: impl IntoIterator<Item = &'a Namespace>) -> Self {
        NamespaceOptIn(
            namespaces
                .into_iter()
                .map(|ns| {
                    let config = NamespaceConfig::parse(ns.annotations()).unwrap_or_default();
                    (ns.name_any(), (config, ns.labels().clone()))
                })
                .collect(),
        )
    }
}

impl OptIn for NamespaceOptIn {
    fn opts_in(&self, policy: &CompiledPolicy, namespace: &str) -> bool {
        self.0
            .get(namespace)
            .is_some_and(|(config, labels)| policy.namespace_opts_in(config, labels))
    }
}

/// Neither terminated nor being deleted.
pub fn is_live(pod: &Pod) -> bool {
    let phase = pod.status.as_ref().and_then(|s| s.phase.as_deref());
    !matches!(phase, Some("Succeeded" | "Failed")) && pod.meta().deletion_timestamp.is_none()
}

/// The policies the webhook applied to `pod` (`berth.io/applied`).
pub fn applied_policies(pod: &Pod) -> Vec<String> {
    pod.annotations()
        .get(APPLIED_ANNOTATION)
        .map(|a| a.split(',').map(str::to_owned).collect())
        .unwrap_or_default()
}

/// What the node `name` should carry.
///
/// - The pool label and, for a dedicated pool, the pool taint of the oldest policy
///   whose pool claims the node; younger claims are reported, not fought over.
/// - The anchor label of every `colocateWith`/`avoid` policy that a bound pod on the
///   node matches: in any namespace for `anchorNamespaces: All`, in a namespace
///   that opts into the policy for `Same`.
pub fn desired_node_state(
    name: &str,
    labels: &Labels,
    policies: &PolicySet,
    pods: &[&BoundPod],
    opt_in: &dyn OptIn,
) -> DesiredNode {
    let mut desired = DesiredNode::default();
    let claims = policies.pool_claims(name, Some(labels));
    if let Some((owner, losers)) = claims.split_first() {
        desired.labels.insert(POOL_LABEL.into(), owner.name.clone());
        desired.taints.extend(owner.pool_taint());
        desired.losing_claims = losers.iter().map(|p| p.name.clone()).collect();
        if owner.dedicated_pool().is_some() {
            desired.unentitled = pods
                .iter()
                .filter(|pod| !is_entitled(pod, owner))
                .map(|pod| (pod.namespace.clone(), pod.name.clone()))
                .collect();
        }
    }
    for policy in policies.iter() {
        let anchored = pods
            .iter()
            .any(|pod| anchors(policy, &pod.labels, &pod.namespace, &pod.applied, opt_in));
        if anchored {
            desired
                .labels
                .insert(anchor_label(&policy.name), "true".into());
        }
    }
    desired
}

/// Whether a pod (labels, namespace, applied policies) is one `policy`'s anchor
/// label follows. For `anchorNamespaces: Same` its namespace must opt into the
/// policy; a pod the webhook admitted with the policy is proof of that, which
/// matters when the namespace cache has not caught up with a fresh annotation.
pub fn anchors(
    policy: &CompiledPolicy,
    labels: &Labels,
    namespace: &str,
    applied: &[String],
    opt_in: &dyn OptIn,
) -> bool {
    policy.is_anchor_pod(labels)
        && match policy.spec.anchor_namespaces {
            AnchorNamespaces::All => true,
            AnchorNamespaces::Same => {
                applied.contains(&policy.name) || opt_in.opts_in(policy, namespace)
            }
        }
}

/// A pod may sit on `owner`'s dedicated node when the webhook applied the policy
/// to it, or it is a DaemonSet pod and the pool lets DaemonSets run.
fn is_entitled(pod: &BoundPod, owner: &CompiledPolicy) -> bool {
    pod.applied.contains(&owner.name)
        || (pod.daemonset
            && owner
                .dedicated_pool()
                .is_some_and(|pool| pool.daemon_sets == DaemonSets::Tolerate))
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::policy::PlacementPolicy;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
    use serde_json::json;

    /// Every namespace opts into every policy.
    pub(crate) struct Everyone;
    impl OptIn for Everyone {
        fn opts_in(&self, _: &CompiledPolicy, _: &str) -> bool {
            true
        }
    }
    struct Only(&'static str);
    impl OptIn for Only {
        fn opts_in(&self, _: &CompiledPolicy, namespace: &str) -> bool {
            namespace == self.0
        }
    }

    fn policy(name: &str, created: &str, spec: serde_json::Value) -> PlacementPolicy {
        let mut p: PlacementPolicy = serde_json::from_value(json!({
            "apiVersion": "berth.io/v1alpha1", "kind": "PlacementPolicy",
            "metadata": {"name": name}, "spec": spec}))
        .unwrap();
        p.metadata.creation_timestamp = Some(Time(created.parse().unwrap()));
        p
    }

    fn set(policies: &[PlacementPolicy]) -> PolicySet {
        let (set, errors) = PolicySet::compile(policies);
        assert!(errors.is_empty(), "{errors:?}");
        set
    }

    fn pod(ns: &str, labels: &[(&str, &str)], applied: &[&str]) -> BoundPod {
        BoundPod {
            namespace: ns.into(),
            name: "p".into(),
            node: "node2".into(),
            labels: labels
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            applied: applied.iter().map(|a| a.to_string()).collect(),
            daemonset: false,
        }
    }

    const OLD: &str = "2026-01-01T00:00:00Z";
    const NEW: &str = "2026-06-01T00:00:00Z";

    #[test]
    fn a_dedicated_pool_node_gets_the_pool_label_and_taint() {
        let policies = set(&[policy(
            "cdn",
            OLD,
            json!({"pool": {"nodeNames": ["node2"]}}),
        )]);
        let desired = desired_node_state("node2", &Labels::new(), &policies, &[], &Everyone);
        assert_eq!(
            desired.labels,
            BTreeMap::from([(POOL_LABEL.to_string(), "cdn".to_string())])
        );
        assert_eq!(desired.taints.len(), 1);
        assert_eq!(desired.taints[0].key, "berth.io/pool");
        assert_eq!(desired.taints[0].value.as_deref(), Some("cdn"));
        assert_eq!(desired.taints[0].effect, "NoSchedule");
        assert_eq!(
            desired_node_state("node1", &Labels::new(), &policies, &[], &Everyone),
            DesiredNode::default()
        );
    }

    #[test]
    fn a_node_claimed_by_two_pools_goes_to_the_older_policy_and_the_other_is_reported() {
        let policies = set(&[
            policy(
                "young",
                NEW,
                json!({"pool": {"nodeSelector": {"matchLabels": {"net": "good"}}}}),
            ),
            policy(
                "old",
                OLD,
                json!({"pool": {"nodeNames": ["node2"], "effect": "NoExecute"}}),
            ),
        ]);
        let labels = Labels::from([("net".to_string(), "good".to_string())]);
        let desired = desired_node_state("node2", &labels, &policies, &[], &Everyone);
        assert_eq!(desired.labels[POOL_LABEL], "old");
        assert_eq!(desired.taints[0].effect, "NoExecute");
        assert_eq!(desired.losing_claims, ["young"]);
    }

    #[test]
    fn berths_own_pool_label_never_pulls_a_node_into_a_pool() {
        let policies = set(&[policy(
            "p",
            OLD,
            json!({"pool": {"nodeSelector": {"matchExpressions": [
            {"key": POOL_LABEL, "operator": "Exists"}]}}}),
        )]);
        let labels = Labels::from([(POOL_LABEL.to_string(), "p".to_string())]);
        assert_eq!(
            desired_node_state("n", &labels, &policies, &[], &Everyone),
            DesiredNode::default()
        );
    }

    #[test]
    fn anchor_labels_follow_matching_bound_pods_in_opted_in_namespaces() {
        let policies = set(&[
            policy(
                "b-beside-a",
                OLD,
                json!({"colocateWith": {"matchLabels": {"app": "a"}}}),
            ),
            policy(
                "redis",
                OLD,
                json!({"avoid": {"matchLabels": {"app": "redis-master"}}, "anchorNamespaces": "All"}),
            ),
        ]);
        let a = pod("team", &[("app", "a")], &[]);
        let master = pod("other", &[("app", "redis-master")], &[]);
        let desired = desired_node_state(
            "node2",
            &Labels::new(),
            &policies,
            &[&a, &master],
            &Only("team"),
        );
        assert_eq!(
            desired
                .labels
                .get(&anchor_label("b-beside-a"))
                .map(String::as_str),
            Some("true")
        );
        assert_eq!(
            desired
                .labels
                .get(&anchor_label("redis"))
                .map(String::as_str),
            Some("true")
        );
        // Same: an A pod in a namespace that does not opt in is no anchor.
        let desired = desired_node_state(
            "node2",
            &Labels::new(),
            &policies,
            &[&a],
            &Only("elsewhere"),
        );
        assert!(desired.labels.is_empty());
    }

    #[test]
    fn pods_on_a_dedicated_node_without_entitlement_are_reported() {
        let policies = set(&[policy(
            "cdn",
            OLD,
            json!({"pool": {"nodeNames": ["node2"]}}),
        )]);
        let entitled = pod("default", &[], &["cdn"]);
        let mut stray = pod("default", &[], &[]);
        stray.name = "stray".into();
        let mut agent = pod("kube-system", &[], &[]);
        agent.daemonset = true;
        let desired = desired_node_state(
            "node2",
            &Labels::new(),
            &policies,
            &[&entitled, &stray, &agent],
            &Everyone,
        );
        assert_eq!(
            desired.unentitled,
            [("default".to_string(), "stray".to_string())]
        );
    }
}
