//! Pods as the cluster model keeps them: stripped to what berth reads, indexed by
//! the node they are bound to, with the pods berth holds indexed by the policies
//! they name.
//!
//! A pod event wakes only what it concerns: the nodes loop when something the
//! node's labels and taints depend on changed ([`for_nodes`]: not a container
//! restart or a Ready flip), the room on its node always (the releases read it
//! only while a pod is held), and the releases loop when a pod is held, or this
//! pod is not bound (a new pod, one the scheduler cannot place) or belongs to a
//! native PodGroup. A bound pod's status churn with nothing held wakes nothing.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::{Arc, Mutex};

use kube::runtime::reflector::{ObjectRef, Store};
use kube::runtime::watcher::Event;

use super::Wakes;
use super::seen::{Hashes, Seen};

use crate::bounds;
use crate::names::APPLIED_ANNOTATION;
use crate::objects::PodObject;
use crate::objects::pod::MIRROR_ANNOTATION;
use crate::placement::opt_in::applied_policies;

/// What a pod event changes: the index of bound pods, the node the pod is bound
/// to (and the one it left), and the held pods.
pub(super) fn changes(
    wakes: &Arc<Wakes>,
    index: &PodsByNode,
) -> impl FnMut(&Store<PodObject>, &Event<PodObject>) + Send + 'static {
    let (wakes, index) = (wakes.clone(), index.clone());
    let mut hashes = Hashes::new(for_nodes);
    move |_, event| {
        let seen = hashes.changed(event);
        let held_before = index.holds_any();
        let releases = match event {
            Event::Apply(pod) => {
                if let Some(node) = index.apply(pod) {
                    wakes.node(&node);
                }
                if let Some(node) = pod.node_name() {
                    match seen {
                        Seen::Nothing => wakes.room(node),
                        _ => wakes.node(node),
                    }
                }
                pod.node_name().is_none() || pod.pod_group_name().is_some()
            }
            Event::Delete(pod) => {
                if let Some(node) = index.delete(pod) {
                    wakes.node(&node);
                }
                pod.node_name().is_none() || pod.pod_group_name().is_some()
            }
            Event::Init => {
                index.relist();
                false
            }
            Event::InitApply(pod) => {
                index.relisted(pod);
                false
            }
            Event::InitDone => {
                index.relist_done();
                wakes.relisted();
                true
            }
        };
        if releases || held_before || index.holds_any() {
            wakes.releases.notify_one();
        }
    }
}

/// What the nodes loop reads of a pod, hashed: its labels, its record, its
/// owners, its node, whether it is being deleted and whether it has ended.
fn for_nodes(pod: &PodObject) -> Option<u64> {
    use std::hash::{DefaultHasher, Hash, Hasher};
    let mut hasher = DefaultHasher::new();
    let meta = &pod.metadata;
    meta.labels.hash(&mut hasher);
    // The record alone: the cache keeps no other annotation, and a pod's first
    // other annotation must not read as a change.
    meta.annotations
        .as_ref()
        .and_then(|a| a.get(APPLIED_ANNOTATION))
        .hash(&mut hasher);
    for owner in meta.owner_references.iter().flatten() {
        (
            &owner.api_version,
            &owner.kind,
            &owner.uid,
            owner.controller,
        )
            .hash(&mut hasher);
    }
    pod.node_name().hash(&mut hasher);
    pod.is_terminating().hash(&mut hasher);
    pod.is_terminated().hash(&mut hasher);
    Some(hasher.finish())
}

/// Bound pods by node: a pass over the nodes that changed finds their pods
/// without a look at every pod in the cluster.
#[derive(Clone, Default)]
pub struct PodsByNode(Arc<Mutex<PodIndex>>);

/// A pod's key in the index: its namespace and name, in one allocation that the
/// index's tables share (at 10,000 pods, a reflector key per table cost 0.9 KB a
/// pod).
#[derive(Clone, PartialEq, Eq, Hash)]
struct PodKey(Arc<str>);

impl PodKey {
    fn of(pod: &PodObject) -> PodKey {
        let meta = &pod.metadata;
        let namespace = meta.namespace.as_deref().unwrap_or_default();
        let name = meta.name.as_deref().unwrap_or_default();
        // A namespace name never holds a `/`.
        PodKey(format!("{namespace}/{name}").into())
    }

    fn object_ref(&self) -> ObjectRef<PodObject> {
        let (namespace, name) = self.0.split_once('/').unwrap_or_default();
        ObjectRef::new(name).within(namespace)
    }
}

/// A pod berth holds: its [`PodObject::key`] and the policies its record names, in
/// order (names shared with the by-policy index).
struct Held {
    key: Box<str>,
    policies: Box<[Arc<str>]>,
}

#[derive(Default)]
struct PodIndex {
    /// Node names are shared by the pods on the node.
    pods: HashMap<Arc<str>, HashSet<PodKey>>,
    node_of: HashMap<PodKey, Arc<str>>,
    /// The pods berth holds by a gate.
    held: HashMap<PodKey, Held>,
    /// The same pods by each policy they name.
    held_by_policy: HashMap<Arc<str>, HashSet<PodKey>>,
    /// The index being built from a new list, which replaces it once whole.
    relisting: Option<Box<PodIndex>>,
}

impl PodIndex {
    /// Puts `pod` on its node; returns the node it was on before, if another.
    fn put(&mut self, pod: &PodObject) -> Option<String> {
        let pod_key = PodKey::of(pod);
        self.unhold(&pod_key);
        if pod.held_by_berth() {
            self.hold(&pod_key, pod);
        }
        let now = pod.node_name();
        let before = match now {
            Some(node) => {
                let node = match self.pods.get_key_value(node) {
                    Some((shared, _)) => shared.clone(),
                    None => Arc::from(node),
                };
                self.pods
                    .entry(node.clone())
                    .or_default()
                    .insert(pod_key.clone());
                self.node_of.insert(pod_key.clone(), node)
            }
            None => self.node_of.remove(&pod_key),
        };
        let moved = before.filter(|b| Some(&**b) != now)?;
        self.take_off(&moved, &pod_key);
        Some(moved.to_string())
    }

    /// Indexes a held pod under each policy it names.
    fn hold(&mut self, key: &PodKey, pod: &PodObject) {
        let names: Box<[Arc<str>]> = applied_policies(pod.metadata.annotations.as_ref())
            .into_iter()
            .map(
                |name| match self.held_by_policy.get_key_value(name.as_str()) {
                    Some((shared, _)) => shared.clone(),
                    None => Arc::from(name),
                },
            )
            .collect();
        for name in &names {
            let pods = self.held_by_policy.entry(name.clone()).or_default();
            pods.insert(key.clone());
        }
        let held = Held {
            key: pod.key().into(),
            policies: names,
        };
        self.held.insert(key.clone(), held);
    }

    fn unhold(&mut self, key: &PodKey) {
        let Some(held) = self.held.remove(key) else {
            return;
        };
        for name in held.policies {
            if let Some(pods) = self.held_by_policy.get_mut(&name) {
                pods.remove(key);
                if pods.is_empty() {
                    self.held_by_policy.remove(&name);
                }
            }
        }
    }

    fn take_off(&mut self, node: &str, pod: &PodKey) {
        if let Some(pods) = self.pods.get_mut(node) {
            pods.remove(pod);
            if pods.is_empty() {
                self.pods.remove(node);
            }
        }
    }
}

impl PodsByNode {
    fn index(&self) -> std::sync::MutexGuard<'_, PodIndex> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A pod created or changed; the node it left, if it was on another.
    fn apply(&self, pod: &PodObject) -> Option<String> {
        self.index().put(pod)
    }

    /// A pod gone; the node it was on.
    fn delete(&self, pod: &PodObject) -> Option<String> {
        let mut index = self.index();
        let key = PodKey::of(pod);
        index.unhold(&key);
        let node = index.node_of.remove(&key)?;
        index.take_off(&node, &key);
        Some(node.to_string())
    }

    /// Whether berth holds any pod now.
    pub fn holds_any(&self) -> bool {
        !self.index().held.is_empty()
    }

    /// The held pods that name a policy `lacking` says is missing, by
    /// [`PodObject::key`], each with the policies it names that are, in its
    /// record's order. Costs the policies held pods name, not the pods.
    pub fn held_naming(&self, lacking: impl Fn(&str) -> bool) -> BTreeMap<String, Vec<String>> {
        let index = self.index();
        let pods: HashSet<&PodKey> = index
            .held_by_policy
            .iter()
            .filter(|(name, _)| lacking(name))
            .flat_map(|(_, pods)| pods)
            .collect();
        pods.into_iter()
            .filter_map(|key| index.held.get(key))
            .map(|held| {
                let names = held.policies.iter().filter(|n| lacking(n));
                (held.key.to_string(), names.map(|n| n.to_string()).collect())
            })
            .collect()
    }

    fn relist(&self) {
        self.index().relisting = Some(Box::default());
    }

    fn relisted(&self, pod: &PodObject) {
        if let Some(building) = self.index().relisting.as_mut() {
            building.put(pod);
        }
    }

    fn relist_done(&self) {
        let mut index = self.index();
        if let Some(built) = index.relisting.take() {
            *index = *built;
        }
    }

    /// The pods bound to `node`.
    pub fn pods_on(&self, node: &str) -> Vec<ObjectRef<PodObject>> {
        self.index()
            .pods
            .get(node)
            .map(|pods| pods.iter().map(PodKey::object_ref).collect())
            .unwrap_or_default()
    }
}

/// Keeps only what anchors, entitlement and exclusion need of a pod, so the cache
/// of every pod in a large cluster stays small.
pub(super) fn strip_pod(pod: &mut PodObject) {
    if let Some(annotations) = pod.metadata.annotations.as_mut() {
        annotations.retain(|k, _| k == APPLIED_ANNOTATION || k == MIRROR_ANNOTATION);
        if let Some(record) = annotations.get_mut(APPLIED_ANNOTATION) {
            *record = bounded_record(record);
        }
        // The missed scan leaves mirror pods alone (their kubelet owns them); the
        // mark's key is all it reads.
        if let Some(mark) = annotations.get_mut(MIRROR_ANNOTATION) {
            mark.clear();
        }
    }
    // A held pod's fit is predicted and its node affinity narrowed when it is
    // released; a released pod's affinity says which nodes it may still take
    // until it is bound.
    let spec = &mut pod.spec;
    if spec.scheduling_gates.is_empty() {
        // The missed scan checks a pod's record against berth's marks on it.
        spec.keep_berths_marks(spec.node_name().is_some());
    }
    // Ordered start waits for lower ranks to be Ready; exclusion stops waiting for
    // a released pod the scheduler cannot place, and says why (its message, cut).
    // A bound pod's PodScheduled says only that it was scheduled.
    let bound = pod.node_name().is_some();
    let mut conditions = std::mem::take(&mut pod.status.conditions).into_vec();
    conditions.retain(|c| match c.type_.as_str() {
        "Ready" => c.status == "True",
        "PodScheduled" => !bound && c.status == "False",
        _ => false,
    });
    for condition in &mut conditions {
        let scheduled = condition.type_ == "PodScheduled";
        if !scheduled {
            condition.last_transition_time = None;
        }
        condition.message = condition
            .message
            .take()
            .filter(|_| scheduled)
            .map(|m| m.chars().take(SCHEDULER_MESSAGE_CHARS).collect());
    }
    pod.status.conditions = conditions.into_boxed_slice();
}

/// A `berth.io/applied` record as the cache keeps it: its first
/// [`bounds::RECORD_NAMES`] names that could be a policy's (a record a tenant made
/// may be 256 KiB of names, read on every pass).
fn bounded_record(record: &str) -> String {
    let names = record
        .split(',')
        .map(str::trim)
        .filter(|name| !name.is_empty() && name.len() <= MAX_POLICY_NAME)
        .take(bounds::RECORD_NAMES);
    names.collect::<Vec<_>>().join(",")
}

/// How much of the scheduler's message on a pod it cannot place the cache keeps.
const SCHEDULER_MESSAGE_CHARS: usize = 200;

/// The longest name a PlacementPolicy (a cluster-scoped object) may have.
const MAX_POLICY_NAME: usize = 253;

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn pod(name: &str, node: Option<&str>) -> PodObject {
        serde_json::from_value(json!({
            "metadata": {"name": name, "namespace": "ns"},
            "spec": {"nodeName": node}}))
        .unwrap()
    }

    fn names(index: &PodsByNode, node: &str) -> Vec<String> {
        let mut names: Vec<String> = index.pods_on(node).into_iter().map(|r| r.name).collect();
        names.sort();
        names
    }

    #[test]
    fn the_cache_keeps_a_mirror_pods_mark_and_not_its_value() {
        let mut pod: PodObject = serde_json::from_value(json!({
            "metadata": {"name": "p", "annotations": {
                MIRROR_ANNOTATION: "x".repeat(100_000), APPLIED_ANNOTATION: "edge"}},
            "spec": {"nodeName": "n1"}}))
        .unwrap();
        strip_pod(&mut pod);
        assert!(
            pod.is_mirror(),
            "the missed scan must still see a mirror pod"
        );
        let annotations = pod.metadata.annotations.as_ref().unwrap();
        assert_eq!(annotations[MIRROR_ANNOTATION], "");
        assert_eq!(annotations[APPLIED_ANNOTATION], "edge");
    }

    #[test]
    fn the_cache_keeps_a_bounded_record_and_bounded_images_of_a_pod() {
        let names: Vec<String> = (0..100_000).map(|i| format!("p{i}")).collect();
        let long = "x".repeat(300);
        let record = format!("edge, ,{long},{}", names.join(","));
        let mut pod: PodObject = serde_json::from_value(json!({
            "metadata": {"name": "p", "annotations": {APPLIED_ANNOTATION: record, "other": "x"}},
            "spec": {"containers": [
                {"name": "a", "image": "nginx:1.27"},
                {"name": "b", "image": "cdn/".repeat(1000)}]}}))
        .unwrap();
        strip_pod(&mut pod);
        let kept = &pod.metadata.annotations.as_ref().unwrap()[APPLIED_ANNOTATION];
        let kept: Vec<&str> = kept.split(',').collect();
        assert_eq!(kept.len(), bounds::RECORD_NAMES);
        assert_eq!(
            kept[..3],
            ["edge", "p0", "p1"],
            "no empty or overlong names"
        );
        assert_eq!(pod.metadata.annotations.as_ref().unwrap().len(), 1);
        assert!(!pod.is_mirror());
        let images: Vec<Option<&str>> = pod
            .spec
            .containers
            .iter()
            .map(|c| c.image.as_deref())
            .collect();
        assert_eq!(
            images,
            [Some("nginx:1.27"), None],
            "4 KB of image is no image"
        );
    }

    #[test]
    fn the_index_follows_pods_onto_their_nodes_and_off_them() {
        let index = PodsByNode::default();
        assert_eq!(index.apply(&pod("a", None)), None, "unbound: on no node");
        assert_eq!(index.apply(&pod("a", Some("n1"))), None, "bound");
        assert_eq!(index.apply(&pod("b", Some("n1"))), None);
        assert_eq!(names(&index, "n1"), ["a", "b"]);
        // The same name again on another node (deleted and made again between two
        // events): it leaves the first.
        assert_eq!(index.apply(&pod("a", Some("n2"))), Some("n1".into()));
        assert_eq!(names(&index, "n1"), ["b"]);
        assert_eq!(index.delete(&pod("b", Some("n1"))), Some("n1".into()));
        assert!(names(&index, "n1").is_empty());
        assert_eq!(index.delete(&pod("never-bound", None)), None);
        assert_eq!(index.index().pods.len(), 1, "an emptied node is forgotten");
    }

    #[test]
    fn a_status_change_is_nothing_the_nodes_read_a_label_or_deletion_is() {
        let pod = |labels: serde_json::Value, status: serde_json::Value| -> PodObject {
            serde_json::from_value(json!({
                "metadata": {"name": "p", "namespace": "ns", "labels": labels},
                "spec": {"nodeName": "n1"}, "status": status}))
            .unwrap()
        };
        let running = for_nodes(&pod(json!({"app": "a"}), json!({"phase": "Running"})));
        let ready =
            json!({"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]});
        assert_eq!(
            running,
            for_nodes(&pod(json!({"app": "a"}), ready)),
            "Ready"
        );
        assert_ne!(
            running,
            for_nodes(&pod(json!({"app": "b"}), json!({"phase": "Running"})))
        );
        assert_ne!(
            running,
            for_nodes(&pod(json!({"app": "a"}), json!({"phase": "Succeeded"})))
        );
        let mut annotated = pod(json!({"app": "a"}), json!({"phase": "Running"}));
        annotated.metadata.annotations = Some(Default::default());
        assert_eq!(
            running,
            for_nodes(&annotated),
            "an annotation the cache dropped"
        );
        annotated.metadata.annotations = Some([(APPLIED_ANNOTATION.into(), "cdn".into())].into());
        assert_ne!(running, for_nodes(&annotated), "berth's record");
    }

    #[test]
    fn the_cache_keeps_a_bound_pods_readiness_and_an_unbound_pods_reason() {
        let conditions = json!([
            {"type": "Initialized", "status": "True"},
            {"type": "Ready", "status": "True", "reason": "r", "lastTransitionTime": "2026-01-01T00:00:00Z"},
            {"type": "PodScheduled", "status": "False", "reason": "Unschedulable",
             "message": "x".repeat(1000), "lastTransitionTime": "2026-01-01T00:00:00Z"}]);
        let mut unbound: PodObject = serde_json::from_value(json!({
            "metadata": {"name": "u", "namespace": "ns"},
            "status": {"conditions": conditions}}))
        .unwrap();
        strip_pod(&mut unbound);
        assert!(unbound.is_ready());
        let (_, message) = unbound.unschedulable().expect("the scheduler's verdict");
        assert_eq!(message.len(), SCHEDULER_MESSAGE_CHARS);
        let mut bound = unbound.clone();
        bound.spec.bind("n1");
        strip_pod(&mut bound);
        assert!(bound.is_ready());
        assert_eq!(bound.status.conditions.len(), 1, "only Ready");
        let mut not_ready: PodObject = serde_json::from_value(json!({
            "metadata": {"name": "n", "namespace": "ns"}, "spec": {"nodeName": "n1"},
            "status": {"conditions": [{"type": "Ready", "status": "False"}]}}))
        .unwrap();
        strip_pod(&mut not_ready);
        assert!(!not_ready.is_ready() && not_ready.status.conditions.is_empty());
    }

    #[test]
    fn the_index_counts_the_pods_berth_holds() {
        let index = PodsByNode::default();
        let gated: PodObject = serde_json::from_value(json!({
            "metadata": {"name": "g", "namespace": "ns"},
            "spec": {"schedulingGates": [{"name": "berth.io/avoid"}]}}))
        .unwrap();
        let other: PodObject = serde_json::from_value(json!({
            "metadata": {"name": "o", "namespace": "ns"},
            "spec": {"schedulingGates": [{"name": "example.com/wait"}]}}))
        .unwrap();
        index.apply(&other);
        assert!(!index.holds_any(), "another's gate");
        index.apply(&gated);
        assert!(index.holds_any());
        index.apply(&pod("g", Some("n1")));
        assert!(!index.holds_any(), "released and bound");
        index.apply(&gated);
        index.delete(&gated);
        assert!(!index.holds_any(), "deleted while held");
    }

    #[test]
    fn held_pods_are_found_by_the_policies_they_name_in_their_records_order() {
        let index = PodsByNode::default();
        let held = |name: &str, uid: &str, record: &str| -> PodObject {
            serde_json::from_value(json!({
                "metadata": {"name": name, "namespace": "ns", "uid": uid,
                    "annotations": {APPLIED_ANNOTATION: record}},
                "spec": {"schedulingGates": [{"name": "berth.io/avoid"}]}}))
            .unwrap()
        };
        index.apply(&held("a", "ua", "zeta,new,edge"));
        index.apply(&held("b", "ub", "edge"));
        index.apply(&held("c", "uc", "new"));
        let lacking = |known: &'static [&'static str]| move |name: &str| !known.contains(&name);
        assert_eq!(
            index.held_naming(lacking(&["edge"])),
            BTreeMap::from([
                ("ua".into(), vec!["zeta".into(), "new".into()]),
                ("uc".into(), vec!["new".into()]),
            ]),
            "by uid, with the names in the record's order"
        );
        // c released (bound), a's record changed: the index follows both.
        index.apply(&pod("c", Some("n1")));
        index.apply(&held("a", "ua", "edge"));
        assert!(index.held_naming(lacking(&["edge"])).is_empty());
        assert_eq!(index.index().held_by_policy.len(), 1, "only edge is named");
        index.delete(&held("b", "ub", "edge"));
        index.delete(&held("a", "ua", "edge"));
        assert!(index.index().held_by_policy.is_empty(), "nothing named");
    }

    #[test]
    fn a_new_list_replaces_the_index_once_whole() {
        let index = PodsByNode::default();
        index.apply(&pod("gone", Some("n1")));
        index.relist();
        index.relisted(&pod("kept", Some("n2")));
        assert_eq!(
            names(&index, "n1"),
            ["gone"],
            "the old index serves until then"
        );
        index.relist_done();
        assert!(names(&index, "n1").is_empty());
        assert_eq!(names(&index, "n2"), ["kept"]);
    }
}
