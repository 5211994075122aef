//! The berth labels and taints a node should carry: a pure function of the node,
//! the policies and the pods bound to it (SPEC "The controller"). The writer diffs
//! this against the node and writes only the difference.
//!
//! Nothing a tenant writes is taken on trust: a pod's `berth.io/applied` counts only
//! for policies its namespace opts into, and a pod counts as a DaemonSet pod only
//! when its controller is a DaemonSet that exists in its namespace.

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::core::v1::Taint;

use crate::names::{POOL_LABEL, anchor_label, placed_label};
use crate::objects::PodObject;
use crate::placement::daemonset::is_daemonset_pod_of;
use crate::placement::opt_in::{anchors, applied_policies};
use crate::policy::compile::Labels;
use crate::policy::{CompiledPolicy, OptIn, PolicySet};

/// A pod bound to a node, reduced to what the controller needs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BoundPod {
    pub namespace: String,
    pub name: String,
    pub uid: String,
    pub node: String,
    pub labels: Labels,
    /// Policies the webhook applied (`berth.io/applied`), as the pod says: weigh
    /// against the namespace's opt-in before trusting ([`crate::placement::opt_in::entitled_policies`]).
    pub applied: Vec<String>,
    /// Whether its controller is a DaemonSet that exists in its namespace.
    pub daemonset: bool,
    /// Being deleted: it still counts for `avoid`, as native anti-affinity counts it,
    /// but no longer anchors `colocateWith`.
    pub terminating: bool,
}

impl BoundPod {
    /// The pod, if it holds a node: bound and not finished. `daemonsets` holds the
    /// uids of the DaemonSets that exist, by namespace.
    pub fn from_pod(pod: &PodObject, daemonsets: &BTreeSet<(String, String)>) -> Option<Self> {
        let node = pod.node_name().map(str::to_owned)?;
        if pod.is_terminated() {
            return None;
        }
        let meta = &pod.metadata;
        let namespace = meta.namespace.clone().unwrap_or_default();
        let owners = meta.owner_references.as_deref().unwrap_or_default();
        let daemonset = is_daemonset_pod_of(owners, &namespace, daemonsets);
        Some(BoundPod {
            name: meta.name.clone().unwrap_or_default(),
            uid: meta.uid.clone().unwrap_or_default(),
            node,
            labels: meta.labels.clone().unwrap_or_default(),
            applied: applied_policies(meta.annotations.as_ref()),
            daemonset,
            terminating: pod.is_terminating(),
            namespace,
        })
    }
}

/// berth's labels and taints for one node; nothing else of the node.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct DesiredNode {
    pub labels: BTreeMap<String, String>,
    pub taints: Vec<Taint>,
    /// Policies whose pool claims the node but lose it to an older one.
    pub losing_claims: Vec<String>,
    /// Policies whose pool selector matches the node only through labels the node
    /// can set on itself, which do not take it in.
    pub refused_claims: Vec<String>,
    /// Pods on a dedicated pool node that are not entitled to it: (namespace,
    /// name, uid).
    pub unentitled: Vec<(String, String, String)>,
    /// Pairs of pods on the node that an `avoid` policy keeps apart: berth's
    /// exclusion was got around (a pod created while berth was down, say).
    pub clashes: Vec<Clash>,
}

/// Desired states by node name: the controller keeps the last one of every node
/// and counts the policies' status from them.
pub type DesiredNodes = std::collections::HashMap<String, DesiredNode>;

/// Two pods on one node that an `avoid` policy keeps apart: one of the policy's
/// own (`subject`) and one it avoids (`target`), each as namespace/name.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Clash {
    pub policy: String,
    pub node: String,
    pub subject: String,
    pub target: String,
}

/// What the node `name` should carry.
///
/// - The pool label and, for a dedicated pool, the pool taint of the oldest policy
///   whose pool claims the node; younger claims are reported, not fought over, and
///   so are selectors the node matches only by labels it can set on itself.
/// - The anchor label of every `colocateWith`/`avoid` policy that a bound pod on the
///   node matches ([`anchors`]).
/// - The placed label of every `avoid` policy with an entitled pod on the node, so
///   that the pods it avoids keep off (symmetry).
pub fn desired_node_state(
    name: &str,
    labels: &Labels,
    policies: &PolicySet,
    pods: &[&BoundPod],
    opt_in: &dyn OptIn,
) -> DesiredNode {
    let mut desired = DesiredNode::default();
    let standing = policies.pool_standing(name, Some(labels));
    desired.refused_claims = standing.refused.iter().map(|p| p.name.clone()).collect();
    if let Some((owner, losers)) = standing.claims.split_first() {
        desired.labels.insert(POOL_LABEL.into(), owner.name.clone());
        desired.taints.extend(owner.pool_taint());
        desired.losing_claims = losers.iter().map(|p| p.name.clone()).collect();
        if owner.dedicated_pool().is_some() {
            desired.unentitled = pods
                .iter()
                .filter(|pod| !pod.terminating && !is_entitled(pod, owner, opt_in))
                .map(|pod| (pod.namespace.clone(), pod.name.clone(), pod.uid.clone()))
                .collect();
        }
    }
    for policy in policies.iter() {
        let counts = |pod: &&&BoundPod| !pod.terminating || policy.spec.avoid.is_some();
        let anchored = pods
            .iter()
            .filter(counts)
            .any(|pod| anchors(policy, &pod.labels, &pod.namespace, opt_in));
        if anchored {
            desired
                .labels
                .insert(anchor_label(&policy.name), "true".into());
        }
        let subjects: Vec<&&BoundPod> = pods
            .iter()
            .filter(|pod| {
                policy.spec.avoid.is_some()
                    && pod.applied.contains(&policy.name)
                    && opt_in.opts_in(policy, &pod.namespace)
            })
            .collect();
        if !subjects.is_empty() {
            desired
                .labels
                .insert(placed_label(&policy.name), "true".into());
        }
        for subject in &subjects {
            let targets = pods.iter().filter(|pod| {
                pod.uid != subject.uid && anchors(policy, &pod.labels, &pod.namespace, opt_in)
            });
            for target in targets {
                desired.clashes.push(Clash {
                    policy: policy.name.clone(),
                    node: name.to_owned(),
                    subject: format!("{}/{}", subject.namespace, subject.name),
                    target: format!("{}/{}", target.namespace, target.name),
                });
            }
        }
    }
    desired
}

/// A pod may sit on `owner`'s dedicated node when the webhook applied the policy
/// to it in a namespace that opts in, or it is a DaemonSet pod whose namespace the
/// pool takes DaemonSets from.
fn is_entitled(pod: &BoundPod, owner: &CompiledPolicy, opt_in: &dyn OptIn) -> bool {
    (pod.applied.contains(&owner.name) && opt_in.opts_in(owner, &pod.namespace))
        || (pod.daemonset && opt_in.takes_daemonsets(owner, &pod.namespace))
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::placement::opt_in::tests::{Everyone, Only};
    use crate::policy::PlacementPolicy;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
    use serde_json::json;

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
            uid: format!("uid-{ns}"),
            node: "node2".into(),
            labels: labels
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            applied: applied.iter().map(|a| a.to_string()).collect(),
            daemonset: false,
            terminating: false,
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
                json!({"pool": {"nodeSelector": {"matchLabels": {"node-restriction.kubernetes.io/net": "good"}}}}),
            ),
            policy(
                "old",
                OLD,
                json!({"pool": {"nodeNames": ["node2"], "effect": "NoExecute"}}),
            ),
        ]);
        let labels = Labels::from([(
            "node-restriction.kubernetes.io/net".to_string(),
            "good".to_string(),
        )]);
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
    fn a_node_that_labels_itself_into_a_pool_gets_nothing_and_is_reported() {
        let policies = set(&[
            policy(
                "gpu",
                OLD,
                json!({"pool": {"nodeSelector": {"matchLabels": {"role": "gpu"}}}}),
            ),
            policy(
                "trusting",
                NEW,
                json!({"pool": {"trustSelfSetLabels": true,
                    "nodeSelector": {"matchLabels": {"role": "gpu"}}}}),
            ),
        ]);
        let by_itself = Labels::from([("role".to_string(), "gpu".to_string())]);
        let desired = desired_node_state("node5", &by_itself, &policies, &[], &Everyone);
        // The older pool refuses it; the one that trusts such labels takes it.
        assert_eq!(desired.refused_claims, ["gpu"]);
        assert_eq!(desired.labels[POOL_LABEL], "trusting");
        assert!(desired.losing_claims.is_empty());

        // A node the older pool already has keeps it.
        let mut member = by_itself.clone();
        member.insert(POOL_LABEL.into(), "gpu".into());
        let desired = desired_node_state("node5", &member, &policies, &[], &Everyone);
        assert_eq!(desired.labels[POOL_LABEL], "gpu");
        assert_eq!(desired.taints[0].value.as_deref(), Some("gpu"));
        assert!(desired.refused_claims.is_empty());
        assert_eq!(desired.losing_claims, ["trusting"]);
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
        // Same: an A pod in a namespace that does not opt in is no anchor, whatever
        // its own annotation says.
        let forged = pod("elsewhere", &[("app", "a")], &["b-beside-a"]);
        let desired = desired_node_state(
            "node2",
            &Labels::new(),
            &policies,
            &[&a, &forged],
            &Only("elsewhere-not"),
        );
        assert!(desired.labels.is_empty());
    }

    #[test]
    fn a_terminating_pod_still_counts_for_avoid_but_not_for_colocation() {
        let policies = set(&[
            policy(
                "beside",
                OLD,
                json!({"colocateWith": {"matchLabels": {"app": "a"}}}),
            ),
            policy(
                "apart",
                OLD,
                json!({"podSelector": {"matchLabels": {"app": "a"}}, "avoid": {"matchLabels": {"app": "a"}}}),
            ),
        ]);
        let mut leaving = pod("team", &[("app", "a")], &["apart"]);
        leaving.terminating = true;
        let desired =
            desired_node_state("node2", &Labels::new(), &policies, &[&leaving], &Everyone);
        assert!(desired.labels.contains_key(&anchor_label("apart")));
        assert!(desired.labels.contains_key(&placed_label("apart")));
        assert!(!desired.labels.contains_key(&anchor_label("beside")));
    }

    #[test]
    fn nodes_of_an_avoid_policys_pods_get_its_placed_label_from_entitled_pods_only() {
        let policies = set(&[policy(
            "masters",
            OLD,
            json!({"avoid": {"matchLabels": {"role": "replica"}}}),
        )]);
        let master = pod("db", &[("role", "master")], &["masters"]);
        let desired =
            desired_node_state("node2", &Labels::new(), &policies, &[&master], &Only("db"));
        assert_eq!(
            desired.labels.keys().collect::<Vec<_>>(),
            [&placed_label("masters")]
        );
        let forged = pod("tenant", &[("role", "master")], &["masters"]);
        let desired =
            desired_node_state("node2", &Labels::new(), &policies, &[&forged], &Only("db"));
        assert!(
            desired.labels.is_empty(),
            "a forged berth.io/applied counts for nothing"
        );
    }

    #[test]
    fn two_pods_an_avoid_policy_keeps_apart_on_one_node_are_a_clash() {
        let policies = set(&[policy(
            "masters",
            OLD,
            json!({"podSelector": {"matchLabels": {"role": "master"}},
                "avoid": {"matchLabels": {"role": "master"}}}),
        )]);
        let mut one = pod("db", &[("role", "master")], &["masters"]);
        one.name = "one".into();
        one.uid = "u1".into();
        let alone = desired_node_state("node2", &Labels::new(), &policies, &[&one], &Only("db"));
        assert!(alone.clashes.is_empty(), "a pod never clashes with itself");
        let mut two = one.clone();
        two.name = "two".into();
        two.uid = "u2".into();
        let both = desired_node_state(
            "node2",
            &Labels::new(),
            &policies,
            &[&one, &two],
            &Only("db"),
        );
        let pairs: Vec<(&str, &str)> = both
            .clashes
            .iter()
            .map(|c| (c.subject.as_str(), c.target.as_str()))
            .collect();
        assert_eq!(pairs, [("db/one", "db/two"), ("db/two", "db/one")]);
        assert!(
            both.clashes
                .iter()
                .all(|c| c.policy == "masters" && c.node == "node2")
        );
    }

    #[test]
    fn pods_on_a_dedicated_node_without_entitlement_are_reported() {
        let policies = set(&[policy(
            "cdn",
            OLD,
            json!({"pool": {"nodeNames": ["node2"]}}),
        )]);
        let entitled = pod("default", &[], &["cdn"]);
        let mut forged = pod("tenant", &[], &["cdn"]);
        forged.name = "forged".into();
        let mut agent = pod("default", &[], &[]);
        agent.daemonset = true;
        let desired = desired_node_state(
            "node2",
            &Labels::new(),
            &policies,
            &[&entitled, &forged, &agent],
            &Only("default"),
        );
        assert_eq!(
            desired.unentitled,
            [(
                "tenant".to_string(),
                "forged".to_string(),
                "uid-tenant".to_string()
            )]
        );
    }
}
