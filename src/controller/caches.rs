//! The controller's caches: watches on PlacementPolicies, Nodes, Namespaces, Pods,
//! DaemonSets, Deployments and StatefulSets feed in-memory stores, each object
//! stripped to what the controller reads, so the cache of a large cluster stays
//! small. Every store is fed leniently ([`crate::objects`]): one object berth
//! cannot read never blinds a watch.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};

use futures::StreamExt;
use kube::api::Api;
use kube::runtime::reflector::{self, ObjectRef, Store, reflector};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Client, Resource, ResourceExt};
use tokio::sync::Notify;

use crate::names::APPLIED_ANNOTATION;
use crate::objects::{
    DaemonSetObject, DeploymentObject, NamespaceMeta, NodeObject, PodObject, PolicyObject,
    StatefulSetObject, WorkloadObject,
};
use crate::placement::bounds;
use crate::policy::NamespaceOptIn;
use crate::policy::compile::{Compiled, PolicyCompiler};

/// The controller's caches: one reflector store per kind, fed by its own watch.
#[derive(Clone)]
pub struct Stores {
    pub policies: Store<PolicyObject>,
    pub nodes: Store<NodeObject>,
    pub namespaces: Store<NamespaceMeta>,
    /// Every pod, stripped: bound ones for anchors and entitlement, unbound ones for
    /// exclusion. One watch, so a pod moves from unbound to bound in one event and
    /// is never, between two watches, in neither.
    pub pods: Store<PodObject>,
    /// The bound pods of each node, beside `pods`.
    pub pods_by_node: PodsByNode,
    pub daemonsets: Store<DaemonSetObject>,
    /// For ordered start: lower ranks whose pods may not exist yet.
    pub deployments: Store<DeploymentObject>,
    pub statefulsets: Store<StatefulSetObject>,
}

/// What changed since a loop last looked: some nodes (the node itself, or a pod
/// bound to it), or everything.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Changed {
    Everything,
    Nodes(HashSet<String>),
}

/// Changes gathered for one reader until it takes them; at first, everything.
struct Changes(Mutex<Changed>);

impl Default for Changes {
    fn default() -> Self {
        Changes(Mutex::new(Changed::Everything))
    }
}

impl Changes {
    fn lock(&self) -> std::sync::MutexGuard<'_, Changed> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn node(&self, name: &str) {
        if let Changed::Nodes(nodes) = &mut *self.lock() {
            nodes.insert(name.to_owned());
        }
    }

    fn everything(&self) {
        *self.lock() = Changed::Everything;
    }

    fn take(&self) -> Changed {
        std::mem::replace(&mut *self.lock(), Changed::Nodes(HashSet::new()))
    }
}

/// Which loops a change wakes, and which nodes it touched: the releases (held
/// pods) and the nodes (labels, taints, status). Both work only on what changed,
/// so a pod event costs one node, not the cluster: the nodes loop recomputes the
/// nodes it touched (or all of them, after a policy, namespace or DaemonSet
/// change, a relist, a resync or a new leader), the releases loop the room left
/// on them (or all of it, after a relist of nodes or pods).
#[derive(Default)]
pub struct Wakes {
    pub releases: Notify,
    pub nodes: Notify,
    for_nodes: Changes,
    for_rooms: Changes,
}

impl Wakes {
    /// The node `name` changed, or a pod bound to it did: wakes the nodes loop.
    pub fn node(&self, name: &str) {
        self.for_nodes.node(name);
        self.for_rooms.node(name);
        self.nodes.notify_one();
    }

    /// Something every node's desired state depends on changed: wakes the nodes
    /// loop. The room on nodes depends only on the nodes and their pods.
    pub fn everything(&self) {
        self.for_nodes.everything();
        self.nodes.notify_one();
    }

    /// A watch on nodes or pods listed again: anything may have changed.
    fn relisted(&self) {
        self.for_rooms.everything();
        self.everything();
    }

    /// What changed for the nodes loop since it last took it.
    pub fn take(&self) -> Changed {
        self.for_nodes.take()
    }

    /// What changed for the room on nodes since the releases loop last took it.
    pub fn take_for_rooms(&self) -> Changed {
        self.for_rooms.take()
    }
}

impl Stores {
    /// Starts every watch. Pods, nodes, policies and namespaces matter to both
    /// loops; DaemonSets only to the nodes (pool tolerations), Deployments and
    /// StatefulSets only to the releases (ordered start).
    pub fn start(client: &Client, wakes: &Arc<Wakes>) -> Stores {
        let pods_by_node = PodsByNode::default();
        Stores {
            policies: watch(client, keep_all, global(wakes.clone(), true)),
            nodes: watch(client, keep_all, node_changes(wakes.clone())),
            namespaces: watch(client, keep_all, global(wakes.clone(), true)),
            pods: watch(
                client,
                strip_pod,
                pod_changes(wakes.clone(), pods_by_node.clone()),
            ),
            pods_by_node,
            daemonsets: watch(client, strip_daemonset, global(wakes.clone(), false)),
            deployments: watch(client, strip_workload, releases_only(wakes.clone())),
            statefulsets: watch(client, strip_workload, releases_only(wakes.clone())),
        }
    }

    /// Waits until every store holds a full list; an error when a watch stopped
    /// before its first. A pass on a half-filled cache would do harm: without the
    /// pods it would take every anchor label off, without the policies release
    /// every held pod at once.
    pub async fn synced(&self) -> Result<(), kube::runtime::reflector::store::WriterDropped> {
        tokio::try_join!(
            self.policies.wait_until_ready(),
            self.nodes.wait_until_ready(),
            self.namespaces.wait_until_ready(),
            self.pods.wait_until_ready(),
            self.daemonsets.wait_until_ready(),
            self.deployments.wait_until_ready(),
            self.statefulsets.wait_until_ready(),
        )
        .map(drop)
    }

    /// The pods bound to `node` (and not yet gone from the cache).
    pub fn pods_on(&self, node: &str) -> Vec<Arc<PodObject>> {
        self.pods_by_node
            .pods_on(node)
            .iter()
            .filter_map(|pod| self.pods.get(pod))
            .collect()
    }
}

/// Starts a watch on every `K` in the cluster, feeding a store of them as `strip`
/// leaves them, and tells `changed` of every event once the store holds it.
fn watch<K>(
    client: &Client,
    strip: fn(&mut K),
    mut changed: impl FnMut(&watcher::Event<K>) + Send + 'static,
) -> Store<K>
where
    K: Resource + Clone + std::fmt::Debug + serde::de::DeserializeOwned + Send + Sync + 'static,
    K::DynamicType: Default + Eq + std::hash::Hash + Clone,
{
    let (store, writer) = reflector::store();
    let api = Api::all(client.clone());
    let stream = reflector(
        writer,
        watcher(api, crate::objects::watch_config())
            .default_backoff()
            .modify(strip),
    );
    tokio::spawn(async move {
        let mut events = stream.boxed();
        while let Some(event) = events.next().await {
            match event {
                Ok(event) => changed(&event),
                Err(e) => tracing::warn!(error = %e, "watch failed; retrying"),
            }
        }
    });
    store
}

/// What an event of a kind every node depends on changes (policies, namespaces,
/// DaemonSets): everything, and the held pods too when `releases`. The first list
/// counts once, when it is whole.
fn global<K>(wakes: Arc<Wakes>, releases: bool) -> impl FnMut(&watcher::Event<K>) + Send {
    move |event| {
        if matches!(event, watcher::Event::Init | watcher::Event::InitApply(_)) {
            return;
        }
        wakes.everything();
        if releases {
            wakes.releases.notify_one();
        }
    }
}

/// What an event of a kind only the releases read changes (ordered start's
/// Deployments and StatefulSets).
fn releases_only<K>(wakes: Arc<Wakes>) -> impl FnMut(&watcher::Event<K>) + Send {
    move |_| wakes.releases.notify_one()
}

/// What a node event changes: the node, unless what berth reads of it is as it
/// was (a kubelet's heartbeat, every node every minute, changes none of it).
fn node_changes(wakes: Arc<Wakes>) -> impl FnMut(&watcher::Event<NodeObject>) + Send {
    let mut seen: HashMap<String, u64> = HashMap::new();
    move |event| match event {
        watcher::Event::Apply(node) | watcher::Event::InitApply(node) => {
            let hash = node_kept(node);
            if seen.insert(node.name_any(), hash) != Some(hash) {
                wakes.node(&node.name_any());
                wakes.releases.notify_one();
            }
        }
        watcher::Event::Delete(node) => {
            seen.remove(&node.name_any());
            wakes.node(&node.name_any());
            wakes.releases.notify_one();
        }
        watcher::Event::Init => {}
        // A node deleted while the watch was down is not in the new list.
        watcher::Event::InitDone => {
            wakes.relisted();
            wakes.releases.notify_one();
        }
    }
}

/// What a pod event changes: the index of bound pods, the node the pod is bound
/// to, and the held pods.
fn pod_changes(
    wakes: Arc<Wakes>,
    index: PodsByNode,
) -> impl FnMut(&watcher::Event<PodObject>) + Send {
    move |event| {
        match event {
            watcher::Event::Apply(pod) => {
                if let Some(node) = index.apply(pod) {
                    wakes.node(&node);
                }
                if let Some(node) = &pod.spec.node_name {
                    wakes.node(node);
                }
            }
            watcher::Event::Delete(pod) => {
                if let Some(node) = index.delete(pod) {
                    wakes.node(&node);
                }
            }
            watcher::Event::Init => index.relist(),
            watcher::Event::InitApply(pod) => index.relisted(pod),
            watcher::Event::InitDone => {
                index.relist_done();
                wakes.relisted();
            }
        }
        wakes.releases.notify_one();
    }
}

/// Bound pods by node: a pass over the nodes that changed finds their pods
/// without a look at every pod in the cluster.
#[derive(Clone, Default)]
pub struct PodsByNode(Arc<Mutex<PodIndex>>);

#[derive(Default)]
struct PodIndex {
    pods: HashMap<String, HashSet<ObjectRef<PodObject>>>,
    node_of: HashMap<ObjectRef<PodObject>, String>,
    /// The index being built from a new list, which replaces it once whole.
    relisting: Option<Box<PodIndex>>,
}

/// A pod's key in the index: its namespace and name, nothing more to hold.
fn key(pod: &PodObject) -> ObjectRef<PodObject> {
    let meta = &pod.metadata;
    let name = meta.name.as_deref().unwrap_or_default();
    ObjectRef::new(name).within(meta.namespace.as_deref().unwrap_or_default())
}

impl PodIndex {
    /// Puts `pod` on its node; returns the node it was on before, if another.
    fn put(&mut self, pod: &PodObject) -> Option<String> {
        let pod_key = key(pod);
        let before = match &pod.spec.node_name {
            Some(node) => {
                let pods = self.pods.entry(node.clone()).or_default();
                pods.insert(pod_key.clone());
                self.node_of.insert(pod_key.clone(), node.clone())
            }
            None => self.node_of.remove(&pod_key),
        };
        let moved = before.filter(|b| Some(b) != pod.spec.node_name.as_ref())?;
        self.take_off(&moved, &pod_key);
        Some(moved)
    }

    fn take_off(&mut self, node: &str, pod: &ObjectRef<PodObject>) {
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
        let key = key(pod);
        let node = index.node_of.remove(&key)?;
        index.take_off(&node, &key);
        Some(node)
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
            .map(|pods| pods.iter().cloned().collect())
            .unwrap_or_default()
    }
}

/// What berth reads of a node, hashed: its labels, taints, allocatable and whether
/// it is being deleted. A kubelet's heartbeat (every node, every minute) changes
/// none of it and wakes nothing.
fn node_kept(node: &NodeObject) -> u64 {
    use std::hash::{DefaultHasher, Hash, Hasher};
    let mut hasher = DefaultHasher::new();
    node.metadata.labels.hash(&mut hasher);
    node.metadata.deletion_timestamp.is_some().hash(&mut hasher);
    for taint in &node.spec.taints {
        taint.to_string().hash(&mut hasher);
    }
    for (resource, amount) in &node.status.allocatable {
        (resource, amount.to_string()).hash(&mut hasher);
    }
    hasher.finish()
}

/// Keeps only what anchors, entitlement and exclusion need of a pod, so the cache
/// of every pod in a large cluster stays small.
fn strip_pod(pod: &mut PodObject) {
    if let Some(annotations) = pod.metadata.annotations.as_mut() {
        annotations.retain(|k, _| k == APPLIED_ANNOTATION);
        if let Some(record) = annotations.get_mut(APPLIED_ANNOTATION) {
            *record = bounded_record(record);
        }
    }
    // A held pod's fit is predicted and its node affinity narrowed when it is
    // released; a released pod's affinity says which nodes it may still take
    // until it is bound.
    let spec = &mut pod.spec;
    if spec.scheduling_gates.is_empty() {
        // The missed scan checks a pod's record against berth's marks on it.
        spec.keep_berths_marks(spec.node_name.is_some());
    }
    // Ordered start waits for lower ranks to be Ready; exclusion stops waiting for
    // a released pod the scheduler cannot place, and says why (its message, cut).
    pod.status
        .conditions
        .retain(|c| c.type_ == "Ready" || c.type_ == "PodScheduled");
    for condition in &mut pod.status.conditions {
        condition.message = condition
            .message
            .take()
            .filter(|_| condition.type_ == "PodScheduled")
            .map(|m| m.chars().take(SCHEDULER_MESSAGE_CHARS).collect());
    }
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

/// A DaemonSet's annotations are not needed (its type reads only what the
/// template patch needs of the rest).
fn strip_daemonset(daemonset: &mut DaemonSetObject) {
    daemonset.metadata.annotations = None;
}

/// A workload's annotations are not needed.
fn strip_workload<K>(workload: &mut WorkloadObject<K>) {
    workload.metadata.annotations = None;
}

fn keep_all<K>(_: &mut K) {}

/// Policies and namespaces as the caches hold them at one instant.
pub struct Snapshot {
    /// Every cached policy object, deleted ones included (the finalizer needs them).
    pub objects: Vec<Arc<PolicyObject>>,
    /// The policies in force: deleted ones left out, ones that stopped compiling
    /// at their last good version.
    pub compiled: Compiled,
    pub namespaces: NamespaceOptIn,
}

impl Snapshot {
    pub fn take(stores: &Stores, compiler: &mut PolicyCompiler) -> Snapshot {
        let objects = stores.policies.state();
        let compiled = compiler.compile(objects.iter().map(|p| p.source()));
        for invalid in compiled.errors.values() {
            tracing::debug!(error = %invalid.error, kept = invalid.kept, "policy does not compile");
        }
        let namespaces = stores.namespaces.state();
        let namespaces = NamespaceOptIn::new(namespaces.iter().map(|ns| &ns.metadata));
        Snapshot {
            objects,
            compiled,
            namespaces,
        }
    }

    /// Whether the cache holds a policy named `policy`.
    pub fn has(&self, policy: &str) -> bool {
        self.objects.iter().any(|p| p.name_any() == policy)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn node(version: &str, zone: &str, taints: serde_json::Value) -> NodeObject {
        serde_json::from_value(json!({
            "metadata": {"name": "n1", "resourceVersion": version, "labels": {"zone": zone}},
            "spec": {"taints": taints},
            "status": {"allocatable": {"cpu": "4"}, "conditions": [{"type": "Ready"}]}}))
        .unwrap()
    }

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

    #[test]
    fn wakes_gather_the_nodes_that_changed_until_everything_did() {
        let wakes = Wakes::default();
        assert_eq!(wakes.take(), Changed::Everything, "the first pass sees all");
        wakes.node("n1");
        wakes.node("n2");
        wakes.node("n1");
        assert_eq!(
            wakes.take(),
            Changed::Nodes(HashSet::from(["n1".into(), "n2".into()]))
        );
        assert_eq!(wakes.take(), Changed::Nodes(HashSet::new()));
        wakes.node("n1");
        wakes.everything();
        wakes.node("n3");
        assert_eq!(wakes.take(), Changed::Everything);
    }

    #[test]
    fn rooms_change_with_nodes_and_relists_not_with_policies() {
        let wakes = Wakes::default();
        assert_eq!(wakes.take_for_rooms(), Changed::Everything, "at first");
        wakes.everything();
        wakes.node("n1");
        assert_eq!(
            wakes.take_for_rooms(),
            Changed::Nodes(HashSet::from(["n1".into()]))
        );
        assert_eq!(wakes.take(), Changed::Everything, "each reader its own");
        wakes.relisted();
        assert_eq!(wakes.take_for_rooms(), Changed::Everything);
        assert_eq!(wakes.take(), Changed::Everything);
    }

    #[test]
    fn a_heartbeat_wakes_nothing_a_label_or_taint_does() {
        let before = node_kept(&node("1", "a", json!([])));
        assert_eq!(before, node_kept(&node("2", "a", json!([]))), "heartbeat");
        assert_ne!(before, node_kept(&node("3", "b", json!([]))), "label");
        let tainted = json!([{"key": "k", "effect": "NoSchedule"}]);
        assert_ne!(before, node_kept(&node("4", "a", tainted)), "taint");
    }
}
