//! Exact exclusion (SPEC "The controller"; seeds 001 and 002). Pods of `avoid`
//! policies arrive held by the scheduling gate `berth.io/avoid`. A pure function
//! decides which to release:
//!
//! - a held pod goes only when no pod it must avoid is *in flight* (released but
//!   not bound yet), so two pods that must avoid each other are never scheduled at
//!   the same time; pods that do not conflict are released together;
//! - before its gate is removed, the pod's own required node affinity is narrowed
//!   (Kubernetes allows that while a pod is gated) to keep off the nodes where the
//!   pods it must avoid are bound. The anchor labels alone would not do: the
//!   scheduler's node cache may not have seen the newest label when the next pod
//!   arrives, while a constraint in the pod itself cannot be missed.
//!
//! Everything is derived from the cluster as it is, so a restarted controller or a
//! new leader picks up where the last one stopped, and no pod is released twice.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use serde_json::Value;

use super::desired::{anchors, applied_policies, entitled_policies};
use crate::names::{AVOID_GATE, anchor_label, placed_label};
use crate::objects::PodObject;
use crate::placement::pod::is_empty_term;
use crate::policy::compile::Labels;
use crate::policy::{CompiledPolicy, OptIn, PolicySet};

/// The shape of one required nodeSelectorTerm, as far as narrowing cares.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Term {
    /// Neither expressions nor fields: it matches no node and stays so.
    Empty,
    /// Expressions, no `matchFields` yet.
    Expressions,
    /// It has `matchFields` already.
    Fields,
}

/// A pod as exclusion sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExclusionPod {
    pub namespace: String,
    pub name: String,
    pub uid: Option<String>,
    pub created: Option<Time>,
    pub labels: Labels,
    /// Policies the webhook applied (`berth.io/applied`), as the pod says.
    pub applied: Vec<String>,
    /// Index of the `berth.io/avoid` gate in `spec.schedulingGates`, if held.
    pub gate: Option<usize>,
    /// Held by another gate too (a gang, a rank, another controller's): the avoid
    /// gate goes last, so such a pod is neither released nor in flight.
    pub other_gates: bool,
    pub node: Option<String>,
    /// Being deleted, and still on its node.
    pub terminating: bool,
    /// The required nodeSelectorTerms, by shape.
    pub terms: Vec<Term>,
}

impl ExclusionPod {
    /// A pod as exclusion sees it; `None` for finished pods and for pods being
    /// deleted that hold no node. A pod still terminating on a node counts until it
    /// is gone, as native anti-affinity counts it.
    pub fn from_pod(pod: &PodObject) -> Option<ExclusionPod> {
        if pod.is_terminated() || (pod.is_terminating() && pod.spec.node_name.is_none()) {
            return None;
        }
        let meta = &pod.metadata;
        let terms = pod
            .spec
            .affinity
            .as_ref()
            .and_then(|a| {
                a.pointer("/nodeAffinity/requiredDuringSchedulingIgnoredDuringExecution/nodeSelectorTerms")
            })
            .and_then(Value::as_array)
            .map(|terms| terms.iter().map(term_shape).collect())
            .unwrap_or_default();
        Some(ExclusionPod {
            namespace: meta.namespace.clone().unwrap_or_default(),
            name: meta.name.clone().unwrap_or_default(),
            uid: meta.uid.clone(),
            created: meta.creation_timestamp.clone(),
            labels: meta.labels.clone().unwrap_or_default(),
            applied: applied_policies(meta.annotations.as_ref()),
            gate: pod.gate(AVOID_GATE),
            other_gates: pod
                .spec
                .scheduling_gates
                .iter()
                .any(|g| g.name != AVOID_GATE),
            node: pod.spec.node_name.clone(),
            terminating: pod.is_terminating(),
            terms,
        })
    }
}

impl ExclusionPod {
    /// The pod's uid, or its namespace and name.
    pub fn key(&self) -> String {
        self.uid
            .clone()
            .unwrap_or_else(|| format!("{}/{}", self.namespace, self.name))
    }
}

fn term_shape(term: &Value) -> Term {
    if is_empty_term(term) {
        Term::Empty
    } else if term
        .get("matchFields")
        .and_then(Value::as_array)
        .is_some_and(|f| !f.is_empty())
    {
        Term::Fields
    } else {
        Term::Expressions
    }
}

/// A held pod to release, and the nodes it must keep off.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Release<'a> {
    pub pod: &'a ExclusionPod,
    pub avoid_nodes: Vec<String>,
}

/// A held pod that stays held, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Waiting<'a> {
    pub pod: &'a ExclusionPod,
    pub reason: Hold<'a>,
}

/// Why a held pod stays held.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Hold<'a> {
    /// A pod it must avoid (through `policy`) is released but not bound yet.
    Behind {
        pod: &'a ExclusionPod,
        policy: String,
    },
    /// The webhook applied a policy the controller has not seen yet: its watch lags
    /// the webhook's. Releasing now would ignore what the policy avoids.
    PolicyNotSeen(String),
}

/// What to do with the held pods now.
#[derive(Debug, Default)]
pub struct Plan<'a> {
    pub release: Vec<Release<'a>>,
    pub waiting: Vec<Waiting<'a>>,
}

/// Why two pods must avoid each other.
struct Conflict<'p> {
    policy: &'p CompiledPolicy,
    /// The node label that keeps `a` off the node of `b`: the policy's anchor
    /// label when `a` is one of its pods, its placed label when `a` is a pod it
    /// avoids.
    keep_off: String,
}

/// A pod in a plan, with the avoid policies that apply to it (those its namespace
/// opts into), worked out once per plan.
struct Entry<'a, 'p> {
    pod: &'a ExclusionPod,
    avoids: Vec<&'p CompiledPolicy>,
}

impl<'a, 'p> Entry<'a, 'p> {
    fn new(pod: &'a ExclusionPod, policies: &'p PolicySet, opt_in: &dyn OptIn) -> Self {
        let avoids = entitled_policies(&pod.applied, &pod.namespace, policies, opt_in)
            .into_iter()
            .filter(|p| p.spec.avoid.is_some())
            .collect();
        Entry { pod, avoids }
    }
}

/// The policy through which `a` and `b` must avoid each other, if any: one of
/// them is a pod an avoid policy applies to (in a namespace that opts into it),
/// and the other is one that policy avoids.
fn conflict<'p>(a: &Entry<'_, 'p>, b: &Entry<'_, 'p>, opt_in: &dyn OptIn) -> Option<Conflict<'p>> {
    let one_way = |x: &Entry<'_, 'p>, y: &Entry| {
        x.avoids
            .iter()
            .copied()
            .find(|p| anchors(p, &y.pod.labels, &y.pod.namespace, opt_in))
    };
    if let Some(policy) = one_way(a, b) {
        return Some(Conflict {
            policy,
            keep_off: anchor_label(&policy.name),
        });
    }
    one_way(b, a).map(|policy| Conflict {
        policy,
        keep_off: placed_label(&policy.name),
    })
}

/// The labels the controller's cache shows on each node.
pub type NodeLabels = BTreeMap<String, Labels>;

/// What this controller has released. Pods stay in `uncached` until the cache
/// shows them released: the watch event trails the write, and a pod that still
/// looks held must count as in flight, or a pod that must avoid it could be
/// released beside it. `recent` remembers when, for [`Released::hurry`].
#[derive(Debug, Default)]
pub struct Released {
    uncached: BTreeSet<String>,
    recent: BTreeMap<String, Instant>,
}

impl Released {
    fn key(pod: &ExclusionPod) -> String {
        pod.key()
    }

    /// Notes that `pod`'s gate was removed at `now`.
    pub fn record(&mut self, pod: &ExclusionPod, now: Instant) {
        self.uncached.insert(Self::key(pod));
        self.recent.insert(Self::key(pod), now);
    }

    /// Whether a held pod waits behind a pod released less than `window` ago. That
    /// pod's binding is a moment away, and the next one should follow it without
    /// the controller's usual batching delay; a blocker released long ago (one that
    /// cannot be scheduled) does not make the controller hurry.
    pub fn hurry(&mut self, plan: &Plan, now: Instant, window: Duration) -> bool {
        self.recent
            .retain(|_, at| now.saturating_duration_since(*at) < window);
        plan.waiting.iter().any(|w| match &w.reason {
            Hold::Behind { pod, .. } => self.recent.contains_key(&Self::key(pod)),
            Hold::PolicyNotSeen(_) => false,
        })
    }

    /// Shows the pods released but still gated in the cache as released, and
    /// forgets those the cache has caught up with (or that are gone).
    pub fn overlay(&mut self, pods: &mut [ExclusionPod]) {
        let still_gated: BTreeSet<String> = pods
            .iter()
            .filter(|p| p.gate.is_some())
            .map(Self::key)
            .collect();
        self.uncached.retain(|key| still_gated.contains(key));
        for pod in pods.iter_mut() {
            if self.uncached.contains(&Self::key(pod)) {
                pod.gate = None;
            }
        }
    }
}

/// Released but not bound yet.
fn in_flight(pod: &ExclusionPod) -> bool {
    pod.gate.is_none() && pod.node.is_none() && !pod.other_gates
}

/// Whether the held `pod` must be narrowed off the node of `other`, bound there,
/// with which it conflicts. Always, unless `other` is terminating and its node
/// already carries the label that keeps `pod` off: that label stays until `other`
/// is gone and the scheduler has seen it, and a pod narrowed off the node would be
/// kept off it for good, where native anti-affinity lets it in once the old pod has
/// left. A pod bound and deleted a moment ago, before its node was labelled, is
/// still narrowed against.
fn narrow_off(other: &ExclusionPod, conflict: &Conflict, nodes: &NodeLabels) -> bool {
    let labelled = || {
        other
            .node
            .as_ref()
            .and_then(|n| nodes.get(n))
            .is_some_and(|labels| labels.contains_key(&conflict.keep_off))
    };
    !other.terminating || !labelled()
}

/// Which held pods to release now, oldest first, with the nodes each must keep
/// off, and why the others wait. `unseen` holds, by pod key, held pods the webhook
/// admitted with a policy that exists but is not in `policies` yet: each waits for
/// its policy. (A policy that is gone is simply absent: its pods no longer avoid
/// anything.)
/// `nodes` are the node labels the controller's cache holds.
pub fn plan<'a>(
    pods: &'a [ExclusionPod],
    policies: &PolicySet,
    opt_in: &dyn OptIn,
    unseen: &BTreeMap<String, String>,
    nodes: &NodeLabels,
) -> Plan<'a> {
    let entries: Vec<Entry> = pods
        .iter()
        .map(|p| Entry::new(p, policies, opt_in))
        .collect();
    let mut flying: Vec<&Entry> = entries
        .iter()
        .filter(|e| in_flight(e.pod) && !e.pod.terminating)
        .collect();
    let bound: Vec<&Entry> = entries.iter().filter(|e| e.pod.node.is_some()).collect();
    // A pod held by another gate as well waits for that gate first; that gate's
    // own Event says why.
    let mut held: Vec<&Entry> = entries
        .iter()
        .filter(|e| e.pod.gate.is_some() && !e.pod.other_gates)
        .collect();
    held.sort_by(|a, b| {
        let (a, b) = (a.pod, b.pod);
        (&a.created, &a.namespace, &a.name).cmp(&(&b.created, &b.namespace, &b.name))
    });
    let mut plan = Plan::default();
    for entry in held {
        let pod = entry.pod;
        if let Some(policy) = unseen.get(&pod.key()) {
            plan.waiting.push(Waiting {
                pod,
                reason: Hold::PolicyNotSeen(policy.clone()),
            });
            continue;
        }
        // Only a pod in a namespace that opts into the policy holds others back:
        // any tenant could otherwise label a pod that never schedules like a
        // target and stall every pod of the policy, in every namespace.
        let blocker = flying.iter().find_map(|other| {
            conflict(entry, other, opt_in)
                .filter(|c| opt_in.opts_in(c.policy, &other.pod.namespace))
                .map(|c| (other.pod, c.policy.name.clone()))
        });
        if let Some((behind, policy)) = blocker {
            plan.waiting.push(Waiting {
                pod,
                reason: Hold::Behind {
                    pod: behind,
                    policy,
                },
            });
            continue;
        }
        let mut avoid_nodes: Vec<String> = bound
            .iter()
            .filter(|other| {
                conflict(entry, other, opt_in).is_some_and(|c| narrow_off(other.pod, &c, nodes))
            })
            .filter_map(|other| other.pod.node.clone())
            .collect();
        avoid_nodes.sort();
        avoid_nodes.dedup();
        plan.release.push(Release { pod, avoid_nodes });
        flying.push(entry);
    }
    plan
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::controller::desired::tests::{Everyone, Only};
    use crate::policy::PlacementPolicy;
    use serde_json::json;

    fn policies(specs: &[(&str, serde_json::Value)]) -> PolicySet {
        let list: Vec<PlacementPolicy> = specs
            .iter()
            .map(|(name, spec)| {
                serde_json::from_value(
                    json!({"apiVersion": "berth.io/v1alpha1", "kind": "PlacementPolicy",
                    "metadata": {"name": name}, "spec": spec}),
                )
                .unwrap()
            })
            .collect();
        let (set, errors) = PolicySet::compile(&list);
        assert!(errors.is_empty(), "{errors:?}");
        set
    }

    fn pod(
        name: &str,
        role: &str,
        applied: &[&str],
        gate: bool,
        node: Option<&str>,
    ) -> ExclusionPod {
        ExclusionPod {
            namespace: "db".into(),
            name: name.into(),
            uid: None,
            created: None,
            labels: Labels::from([("role".to_string(), role.to_string())]),
            applied: applied.iter().map(|a| a.to_string()).collect(),
            gate: gate.then_some(0),
            node: node.map(Into::into),
            terminating: false,
            terms: vec![Term::Expressions],
            other_gates: false,
        }
    }

    fn masters() -> PolicySet {
        policies(&[(
            "masters",
            json!({"podSelector": {"matchLabels": {"role": "master"}}, "avoid": {"matchLabels": {"role": "master"}}}),
        )])
    }

    fn none() -> BTreeMap<String, String> {
        BTreeMap::new()
    }

    fn no_labels() -> NodeLabels {
        NodeLabels::new()
    }

    fn names<'a>(releases: &[Release<'a>]) -> Vec<&'a str> {
        releases.iter().map(|r| r.pod.name.as_str()).collect()
    }

    #[test]
    fn pods_created_together_are_released_one_at_a_time() {
        let pods = vec![
            pod("m1", "master", &["masters"], true, None),
            pod("m2", "master", &["masters"], true, None),
            pod("m3", "master", &["masters"], true, None),
        ];
        let plan = plan(&pods, &masters(), &Everyone, &none(), &no_labels());
        assert_eq!(names(&plan.release), ["m1"]);
        assert_eq!(plan.waiting.len(), 2);
        assert!(
            matches!(&plan.waiting[0].reason, Hold::Behind { pod, policy } if pod.name == "m1" && policy == "masters")
        );
    }

    #[test]
    fn the_avoid_gate_goes_last_and_a_pod_held_by_another_gate_is_not_in_flight() {
        let mut pods = vec![
            pod("m1", "master", &["masters"], true, None),
            pod("m2", "master", &["masters"], true, None),
        ];
        pods[0].other_gates = true;
        let first = plan(&pods, &masters(), &Everyone, &none(), &no_labels());
        assert_eq!(names(&first.release), ["m2"], "m1 waits for its other gate");
        // Released from avoid before its gang let go (an older berth): still
        // held, so m2 does not wait behind it.
        let mut pods = vec![
            pod("m1", "master", &["masters"], false, None),
            pod("m2", "master", &["masters"], true, None),
        ];
        pods[0].other_gates = true;
        let second = plan(&pods, &masters(), &Everyone, &none(), &no_labels());
        assert_eq!(names(&second.release), ["m2"]);
    }

    #[test]
    fn the_next_goes_once_the_previous_is_bound_and_keeps_off_its_node() {
        let mut pods = vec![
            pod("m1", "master", &["masters"], false, None),
            pod("m2", "master", &["masters"], true, None),
            pod("web", "web", &[], false, Some("n9")),
        ];
        assert!(
            plan(&pods, &masters(), &Everyone, &none(), &no_labels())
                .release
                .is_empty(),
            "m1 released but unbound"
        );
        pods[0].node = Some("n1".into());
        let plan = plan(&pods, &masters(), &Everyone, &none(), &no_labels());
        assert_eq!(names(&plan.release), ["m2"]);
        assert_eq!(
            plan.release[0].avoid_nodes,
            ["n1"],
            "only the nodes of pods it must avoid"
        );
    }

    #[test]
    fn pods_that_do_not_conflict_are_released_together() {
        let set = policies(&[
            (
                "masters",
                json!({"podSelector": {"matchLabels": {"role": "master"}}, "avoid": {"matchLabels": {"role": "master"}}}),
            ),
            (
                "data",
                json!({"podSelector": {"matchLabels": {"role": "data"}}, "avoid": {"matchLabels": {"role": "data"}}}),
            ),
        ]);
        let pods = vec![
            pod("m1", "master", &["masters"], true, None),
            pod("d1", "data", &["data"], true, None),
            pod("d2", "data", &["data"], true, None),
        ];
        assert_eq!(
            names(&plan(&pods, &set, &Everyone, &none(), &no_labels()).release),
            ["d1", "m1"]
        );
    }

    #[test]
    fn masters_and_replicas_that_avoid_each_other_are_not_released_together() {
        let set = policies(&[
            (
                "masters",
                json!({"podSelector": {"matchLabels": {"role": "master"}}, "avoid": {"matchLabels": {"role": "replica"}}}),
            ),
            (
                "replicas",
                json!({"podSelector": {"matchLabels": {"role": "replica"}}, "avoid": {"matchLabels": {"role": "master"}}}),
            ),
        ]);
        let pods = vec![
            pod("m1", "master", &["masters"], true, None),
            pod("r1", "replica", &["replicas"], true, None),
        ];
        let plan = plan(&pods, &set, &Everyone, &none(), &no_labels());
        assert_eq!(names(&plan.release), ["m1"]);
        assert_eq!(plan.waiting[0].pod.name, "r1");
    }

    #[test]
    fn a_held_pod_whose_policy_is_gone_is_released() {
        let pods = vec![
            pod("m1", "master", &["deleted"], true, None),
            pod("m2", "master", &["deleted"], true, None),
        ];
        assert_eq!(
            names(&plan(&pods, &masters(), &Everyone, &none(), &no_labels()).release),
            ["m1", "m2"]
        );
    }

    #[test]
    fn a_held_pod_waits_for_a_policy_the_controller_has_not_seen_yet() {
        let pods = vec![
            pod("m1", "master", &["masters"], true, None),
            pod("m2", "master", &["masters"], true, None),
        ];
        let unseen = pods
            .iter()
            .map(|p| (p.key(), "masters".to_string()))
            .collect();
        let plan = plan(
            &pods,
            &PolicySet::default(),
            &Everyone,
            &unseen,
            &no_labels(),
        );
        assert!(plan.release.is_empty(), "both would be released at once");
        assert_eq!(
            plan.waiting[1].reason,
            Hold::PolicyNotSeen("masters".into())
        );
    }

    #[test]
    fn a_release_the_cache_has_not_shown_yet_counts_as_in_flight() {
        let mut pods = vec![
            pod("m1", "master", &["masters"], true, None),
            pod("m2", "master", &["masters"], true, None),
        ];
        let mut released = Released::default();
        released.record(&pods[0], Instant::now());
        released.overlay(&mut pods);
        let plan = plan(&pods, &masters(), &Everyone, &none(), &no_labels());
        assert!(plan.release.is_empty(), "m1 is in flight, m2 must wait");
        // The cache catches up: m1's gate is gone there too, and it is forgotten.
        pods[0].gate = None;
        released.overlay(&mut pods);
        assert!(released.uncached.is_empty());
    }

    /// No namespace opts into anything (by annotation or labels).
    struct Nobody;
    impl OptIn for Nobody {
        fn opts_in(&self, _: &CompiledPolicy, _: &str) -> bool {
            false
        }
        fn takes_daemonsets(&self, _: &CompiledPolicy, _: &str) -> bool {
            false
        }
        fn named(&self, _: &str) -> &[String] {
            &[]
        }
    }

    #[test]
    fn anchor_namespaces_all_also_keeps_off_pods_berth_did_not_admit() {
        let spec = |scope: &str| {
            json!({"podSelector": {"matchLabels": {"role": "master"}},
                "avoid": {"matchLabels": {"role": "master"}}, "anchorNamespaces": scope})
        };
        // A master berth never saw (another namespace, no opt-in, no annotation).
        let mut foreign = pod("legacy", "master", &[], false, Some("n5"));
        foreign.namespace = "legacy".into();
        let pods = vec![foreign, pod("m1", "master", &["masters"], true, None)];
        let all = policies(&[("masters", spec("All"))]);
        let plan_all = plan(&pods, &all, &Only("db"), &none(), &no_labels());
        assert_eq!(plan_all.release[0].avoid_nodes, ["n5"]);
        let same = policies(&[("masters", spec("Same"))]);
        let plan_same = plan(&pods, &same, &Only("db"), &none(), &no_labels());
        assert!(plan_same.release[0].avoid_nodes.is_empty());
        // Nothing counts from a namespace that opts into nothing, not even the
        // pod's own annotation.
        assert!(
            plan(&pods, &all, &Nobody, &none(), &no_labels()).release[0]
                .avoid_nodes
                .is_empty()
        );
    }

    #[test]
    fn a_pod_from_a_namespace_that_did_not_opt_in_never_holds_others_back() {
        let spec = json!({"podSelector": {"matchLabels": {"role": "master"}},
            "avoid": {"matchLabels": {"role": "master"}}, "anchorNamespaces": "All"});
        // A tenant's pod that never schedules, labelled and annotated like a master.
        let mut forged = pod("stuck", "master", &["masters"], false, None);
        forged.namespace = "tenant".into();
        let pods = vec![forged, pod("m1", "master", &["masters"], true, None)];
        let set = policies(&[("masters", spec)]);
        let plan = plan(&pods, &set, &Only("db"), &none(), &no_labels());
        assert_eq!(names(&plan.release), ["m1"]);
    }

    #[test]
    fn avoid_is_symmetric_a_later_target_keeps_off_the_nodes_of_the_policys_pods() {
        let set = policies(&[(
            "masters",
            json!({"podSelector": {"matchLabels": {"role": "master"}}, "avoid": {"matchLabels": {"role": "replica"}}}),
        )]);
        let pods = vec![
            pod("m1", "master", &["masters"], false, Some("n1")),
            pod("r1", "replica", &[], true, None),
        ];
        let plan = plan(&pods, &set, &Everyone, &none(), &no_labels());
        assert_eq!(plan.release[0].avoid_nodes, ["n1"]);
    }

    #[test]
    fn a_pod_still_terminating_counts_by_narrowing_until_its_node_is_labelled() {
        let leaving: PodObject = serde_json::from_value(json!({
            "metadata": {"name": "m0", "namespace": "db", "labels": {"role": "master"},
                "annotations": {"berth.io/applied": "masters"}, "deletionTimestamp": "2026-01-01T00:00:00Z"},
            "spec": {"nodeName": "n3"}, "status": {"phase": "Running"}}))
        .unwrap();
        let leaving = ExclusionPod::from_pod(&leaving).expect("it still holds n3");
        assert!(leaving.terminating);
        let pods = vec![leaving, pod("m1", "master", &["masters"], true, None)];
        let set = masters();
        // Bound and deleted before n3 was labelled: narrowing is all there is.
        let unlabelled = plan(&pods, &set, &Everyone, &none(), &no_labels());
        assert_eq!(unlabelled.release[0].avoid_nodes, ["n3"]);
        // n3 carries the anchor label: it keeps m1 off while m0 is there, and lets it
        // in once m0 is gone, where narrowing would keep it off for good.
        let labelled = NodeLabels::from([(
            "n3".to_string(),
            Labels::from([(anchor_label("masters"), "true".to_string())]),
        )]);
        let plan = plan(&pods, &set, &Everyone, &none(), &labelled);
        assert!(plan.release[0].avoid_nodes.is_empty());
    }

    #[test]
    fn the_controller_hurries_only_behind_a_pod_it_released_a_moment_ago() {
        let pods = vec![
            pod("m1", "master", &["masters"], false, None),
            pod("m2", "master", &["masters"], true, None),
        ];
        let set = masters();
        let plan = plan(&pods, &set, &Everyone, &none(), &no_labels());
        let window = Duration::from_secs(5);
        let start = Instant::now();
        let mut released = Released::default();
        assert!(
            !released.hurry(&plan, start, window),
            "m1 was not released by this controller"
        );
        released.record(&pods[0], start);
        assert!(released.hurry(&plan, start + Duration::from_secs(1), window));
        assert!(
            !released.hurry(&plan, start + Duration::from_secs(6), window),
            "m1 has been unschedulable for a while: no hurry"
        );
    }
}
