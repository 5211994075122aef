//! The controller's caches: watches on PlacementPolicies, Nodes, Namespaces, Pods,
//! DaemonSets, Deployments and StatefulSets feed in-memory stores, each object
//! stripped to what the controller reads, so the cache of a large cluster stays
//! small. Every store is fed leniently ([`crate::objects`]): one object berth
//! cannot read never blinds a watch.

use std::collections::HashMap;
use std::sync::Arc;

use futures::StreamExt;
use kube::api::Api;
use kube::runtime::reflector::{self, Store, reflector};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Client, Resource, ResourceExt};
use tokio::sync::Notify;

use crate::names::APPLIED_ANNOTATION;
use crate::objects::{
    DaemonSetObject, DeploymentObject, NamespaceMeta, NodeObject, PodObject, PolicyObject,
    StatefulSetObject, WorkloadObject,
};
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
    pub daemonsets: Store<DaemonSetObject>,
    /// For ordered start: lower ranks whose pods may not exist yet.
    pub deployments: Store<DeploymentObject>,
    pub statefulsets: Store<StatefulSetObject>,
}

/// Which loops a change wakes: the releases (held pods) and the nodes (labels,
/// taints, status).
pub struct Wakes {
    pub releases: Arc<Notify>,
    pub nodes: Arc<Notify>,
}

impl Stores {
    /// Starts every watch. Pods, nodes, policies and namespaces matter to both
    /// loops; DaemonSets only to the nodes (pool tolerations), Deployments and
    /// StatefulSets only to the releases (ordered start).
    pub fn start(client: &Client, wakes: &Wakes) -> Stores {
        let both = [&wakes.releases, &wakes.nodes];
        Stores {
            policies: watch(client, &both, keep_all, None),
            nodes: watch(client, &both, keep_all, Some(node_kept)),
            namespaces: watch(client, &both, keep_all, None),
            pods: watch(client, &both, strip_pod, None),
            daemonsets: watch(client, &[&wakes.nodes], strip_daemonset, None),
            deployments: watch(client, &[&wakes.releases], strip_workload, None),
            statefulsets: watch(client, &[&wakes.releases], strip_workload, None),
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
}

/// Starts a watch on every `K` in the cluster, feeding a store of them as `strip`
/// leaves them; every event wakes each loop in `wakes`, except an update that
/// leaves `kept` (what berth reads of the object) as it was.
fn watch<K>(
    client: &Client,
    wakes: &[&Arc<Notify>],
    strip: fn(&mut K),
    kept: Option<fn(&K) -> u64>,
) -> Store<K>
where
    K: Resource + Clone + std::fmt::Debug + serde::de::DeserializeOwned + Send + Sync + 'static,
    K::DynamicType: Default + Eq + std::hash::Hash + Clone,
{
    let (store, writer) = reflector::store();
    let api = Api::all(client.clone());
    let stream = reflector(
        writer,
        watcher(api, watcher::Config::default())
            .default_backoff()
            .modify(strip),
    );
    let wakes: Vec<Arc<Notify>> = wakes.iter().map(|w| Arc::clone(w)).collect();
    tokio::spawn(async move {
        let mut events = stream.boxed();
        let mut seen: HashMap<String, u64> = HashMap::new();
        while let Some(event) = events.next().await {
            match (&event, kept) {
                (Err(e), _) => tracing::warn!(error = %e, "watch failed; retrying"),
                (
                    Ok(watcher::Event::Apply(object) | watcher::Event::InitApply(object)),
                    Some(kept),
                ) => {
                    let hash = kept(object);
                    if seen.insert(object.name_any(), hash) == Some(hash) {
                        continue;
                    }
                }
                (Ok(watcher::Event::Delete(object)), Some(_)) => {
                    seen.remove(&object.name_any());
                }
                _ => {}
            }
            for wake in &wakes {
                wake.notify_one();
            }
        }
    });
    store
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
    }
    // A held pod's fit is predicted and its node affinity narrowed when it is
    // released; a released pod's affinity says which nodes it may still take
    // until it is bound.
    let spec = &mut pod.spec;
    if spec.scheduling_gates.is_empty() {
        if spec.node_name.is_some() {
            spec.affinity = None;
        }
        spec.node_selector = None;
        spec.tolerations = None;
        spec.topology_spread_constraints = None;
        spec.volumes = None;
        for container in spec.containers.iter_mut().chain(&mut spec.init_containers) {
            container.ports = None;
        }
    }
    // Ordered start waits for lower ranks to be Ready.
    pod.status.conditions.retain(|c| c.type_ == "Ready");
    for condition in &mut pod.status.conditions {
        condition.message = None;
    }
}

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

    #[test]
    fn a_heartbeat_wakes_nothing_a_label_or_taint_does() {
        let before = node_kept(&node("1", "a", json!([])));
        assert_eq!(before, node_kept(&node("2", "a", json!([]))), "heartbeat");
        assert_ne!(before, node_kept(&node("3", "b", json!([]))), "label");
        let tainted = json!([{"key": "k", "effect": "NoSchedule"}]);
        assert_ne!(before, node_kept(&node("4", "a", tainted)), "taint");
    }
}
