//! The cluster as this process knows it: one model that owns every watch. `berth
//! serve` runs the webhook and the controller side by side, and both read this
//! one model, so they can never disagree about the policy in force.
//!
//! - one reflector per kind, each object stripped to what berth reads
//!   ([`crate::objects`] reads it leniently: one object berth cannot read never
//!   blinds a watch);
//! - predicates ([`seen`]): an event that changes nothing berth reads (a policy's
//!   status, berth's own write; a kubelet's heartbeat; a DaemonSet's rollout
//!   counters) wakes nothing;
//! - one policy compiler, whose policies in force (a policy that stops compiling
//!   at its last good version) the webhook, the controller and `explain` read;
//! - node labels for the webhook, bound pods by node for the controller
//!   ([`pods`]);
//! - the gang mode, discovered once a minute, and the PriorityClasses
//!   ([`groups`]).
//!
//! The controller's kinds (pods, DaemonSets, Deployments, StatefulSets) are
//! watched only in a process that runs the controller.

pub mod error;
pub mod groups;
pub mod pods;
pub mod seen;
pub mod wakes;

use std::collections::BTreeSet;
use std::sync::{Arc, RwLock};
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::scheduling::v1::PriorityClass;
use kube::api::Api;
use kube::runtime::WatchStreamExt;
use kube::runtime::reflector::{self, ObjectRef, Store, reflector};
use kube::runtime::watcher::{self, Event};
use kube::{Client, Resource, ResourceExt};
use tokio::sync::watch as published;

use crate::objects::NodeIndex;
use crate::objects::{
    DaemonSetObject, DeploymentObject, NamespaceMeta, NodeObject, PodObject, PolicyObject,
    StatefulSetObject, WorkloadObject,
};
use crate::placement::namespace::{NamespaceIndex, NamespaceInfo, namespace_index};
use crate::policy::compile::{Compiled, PolicyCompiler};
use crate::telemetry::Metrics;
pub use error::Error;
pub use groups::GroupState;
pub use pods::PodsByNode;
use seen::{Hashes, Seen};
pub use wakes::{Changed, Wakes};

/// The longest a namespace lookup may take: a review waits for it.
const NAMESPACE_LOOKUP: Duration = Duration::from_secs(1);

/// How often the gang mode is looked up again: a feature turned on in the
/// apiserver is picked up without a restart.
const GANG_MODE_EVERY: Duration = Duration::from_secs(60);

/// The namespace and uid of every DaemonSet, ordered by namespace: what tells a
/// DaemonSet's pod from a pod that names one in a forged ownerReference.
pub type DaemonSets = BTreeSet<(String, String)>;

/// One reflector store per kind.
#[derive(Clone)]
pub struct Stores {
    pub policies: Store<PolicyObject>,
    pub nodes: Store<NodeObject>,
    pub namespaces: Store<NamespaceMeta>,
    pub priority_classes: Store<PriorityClass>,
    /// Every pod, stripped: bound ones for anchors and entitlement, unbound ones for
    /// exclusion. One watch, so a pod moves from unbound to bound in one event and
    /// is never, between two watches, in neither. The controller's.
    pub pods: Store<PodObject>,
    /// The bound pods of each node, beside `pods`.
    pub pods_by_node: PodsByNode,
    /// The controller's: pool tolerations and exclusion in their templates.
    pub daemonsets: Store<DaemonSetObject>,
    /// The controller's, for ordered start: lower ranks whose pods may not exist yet.
    pub deployments: Store<DeploymentObject>,
    pub statefulsets: Store<StatefulSetObject>,
}

impl Stores {
    /// Waits until every store holds a full list; an error when a watch stopped
    /// before its first. A pass on a half-filled cache would do harm: without the
    /// pods it would take every anchor label off, without the policies release
    /// every held pod at once.
    pub async fn synced(&self) -> Result<(), Error> {
        tokio::try_join!(
            self.policies.wait_until_ready(),
            self.nodes.wait_until_ready(),
            self.namespaces.wait_until_ready(),
            self.priority_classes.wait_until_ready(),
            self.pods.wait_until_ready(),
            self.daemonsets.wait_until_ready(),
            self.deployments.wait_until_ready(),
            self.statefulsets.wait_until_ready(),
        )?;
        Ok(())
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

/// What the model works out from the stores and publishes.
struct Published {
    in_force: RwLock<Arc<Compiled>>,
    /// Node labels, for the webhook's decisions.
    node_labels: RwLock<Arc<NodeIndex>>,
    /// Each namespace as the webhook decides in it, its annotations read once per
    /// change of them rather than once per pod.
    namespaces: RwLock<Arc<NamespaceIndex>>,
    groups: RwLock<Arc<GroupState>>,
    daemonsets: RwLock<Arc<DaemonSets>>,
    /// Whether each was listed whole (the policies compiled) or looked up once.
    policies_synced: published::Sender<bool>,
    nodes_synced: published::Sender<bool>,
    namespaces_synced: published::Sender<bool>,
    gang_mode_known: published::Sender<bool>,
}

impl Default for Published {
    fn default() -> Self {
        Published {
            in_force: RwLock::default(),
            node_labels: RwLock::new(Arc::new(NodeIndex::new())),
            namespaces: RwLock::default(),
            groups: RwLock::default(),
            daemonsets: RwLock::default(),
            policies_synced: published::Sender::new(false),
            nodes_synced: published::Sender::new(false),
            namespaces_synced: published::Sender::new(false),
            gang_mode_known: published::Sender::new(false),
        }
    }
}

fn read<T: ?Sized>(lock: &RwLock<Arc<T>>) -> Arc<T> {
    match lock.read() {
        Ok(value) => value.clone(),
        Err(poisoned) => poisoned.into_inner().clone(),
    }
}

fn write<T: ?Sized>(lock: &RwLock<Arc<T>>, value: Arc<T>) {
    match lock.write() {
        Ok(mut slot) => *slot = value,
        Err(poisoned) => *poisoned.into_inner() = value,
    }
}

impl Published {
    fn update_groups(&self, change: impl FnOnce(&mut GroupState)) {
        let mut next = (*read(&self.groups)).clone();
        change(&mut next);
        write(&self.groups, Arc::new(next));
    }
}

/// The cluster model; see the module.
pub struct Cluster {
    client: Client,
    pub stores: Stores,
    /// Which of the controller's loops a change wakes.
    pub wakes: Arc<Wakes>,
    published: Arc<Published>,
}

impl Cluster {
    /// Starts every watch this process needs (the controller's kinds only when
    /// `controller`); they back off and relist on errors.
    pub fn start(client: Client, metrics: Arc<Metrics>, controller: bool) -> Arc<Cluster> {
        let wakes = Arc::new(Wakes::default());
        let published = Arc::new(Published::default());
        let pods_by_node = PodsByNode::default();
        let stores = Stores {
            policies: watch(&client, keep, policy_changes(&wakes, &published, metrics)),
            nodes: watch(&client, strip_node, node_changes(&wakes, &published)),
            namespaces: watch(&client, keep, namespace_changes(&wakes, &published)),
            priority_classes: watch(&client, keep, class_changes(&published)),
            pods: controller_watch(controller, &client, pods::strip_pod, {
                pods::changes(&wakes, &pods_by_node)
            }),
            pods_by_node,
            daemonsets: controller_watch(controller, &client, strip_daemonset, {
                daemonset_changes(&wakes, &published)
            }),
            deployments: controller_watch(controller, &client, strip_workload, {
                releases_only(&wakes)
            }),
            statefulsets: controller_watch(controller, &client, strip_workload, {
                releases_only(&wakes)
            }),
        };
        tokio::spawn(follow_gang_mode(client.clone(), published.clone()));
        Arc::new(Cluster {
            client,
            stores,
            wakes,
            published,
        })
    }

    /// The DaemonSets now, by namespace and uid.
    pub fn daemonsets(&self) -> Arc<DaemonSets> {
        read(&self.published.daemonsets)
    }

    pub fn client(&self) -> &Client {
        &self.client
    }

    /// The policies in force now.
    pub fn in_force(&self) -> Arc<Compiled> {
        read(&self.published.in_force)
    }

    /// Known nodes and their labels now.
    pub fn node_labels(&self) -> Arc<NodeIndex> {
        read(&self.published.node_labels)
    }

    /// Each namespace as decisions read it now.
    pub fn namespaces(&self) -> Arc<NamespaceIndex> {
        read(&self.published.namespaces)
    }

    /// What group decisions need: the gang mode and the PriorityClasses.
    pub fn groups(&self) -> Arc<GroupState> {
        read(&self.published.groups)
    }

    /// Whether what the webhook reads has been listed whole, and the gang mode
    /// looked up.
    pub fn webhook_synced(&self) -> bool {
        let published = &self.published;
        [
            &published.policies_synced,
            &published.nodes_synced,
            &published.namespaces_synced,
            &published.gang_mode_known,
        ]
        .iter()
        .all(|synced| *synced.borrow())
    }

    /// Waits until every store holds a full list and the gang mode is known; an
    /// error when a watch stopped before its first list.
    pub async fn synced(&self) -> Result<(), Error> {
        self.stores.synced().await?;
        // The policies in force are published just after their store is whole.
        for synced in [
            &self.published.policies_synced,
            &self.published.gang_mode_known,
        ] {
            // The senders live as long as this room.
            let _ = synced.subscribe().wait_for(|synced| *synced).await;
        }
        Ok(())
    }

    /// The namespace from the cache, or by one GET when the cache does not hold it
    /// yet (one created a moment ago); `None` when neither finds it.
    pub async fn namespace(&self, name: &str) -> Option<Arc<NamespaceInfo>> {
        if let Some(info) = self.namespaces().get(name) {
            return Some(info.clone());
        }
        match self.get_namespace(name).await {
            Ok(found) => found.map(|ns| Arc::new(NamespaceInfo::from_meta(&ns.metadata))),
            Err(error) => {
                tracing::warn!(namespace = name, %error, "namespace lookup failed");
                None
            }
        }
    }

    /// Namespace `name` by one GET, within [`NAMESPACE_LOOKUP`].
    async fn get_namespace(&self, name: &str) -> Result<Option<NamespaceMeta>, Error> {
        let api = Api::<NamespaceMeta>::all(self.client.clone());
        tokio::time::timeout(NAMESPACE_LOOKUP, api.get_opt(name))
            .await
            .map_err(|_| Error::Timeout(NAMESPACE_LOOKUP))?
            .map_err(Error::from)
    }
}

/// Starts a watch on every `K` in the cluster, feeding a store of them as `strip`
/// leaves them, and tells `changed` of every event once the store holds it.
fn watch<K>(
    client: &Client,
    strip: fn(&mut K),
    mut changed: impl FnMut(&Store<K>, &Event<K>) + Send + 'static,
) -> Store<K>
where
    K: Resource + Clone + std::fmt::Debug + serde::de::DeserializeOwned + Send + Sync + 'static,
    K::DynamicType: Default + Eq + std::hash::Hash + Clone,
{
    let (store, writer) = reflector::store();
    let api = Api::all(client.clone());
    let stream = reflector(
        writer,
        watcher::watcher(api, crate::objects::watch_config())
            .default_backoff()
            .modify(strip),
    );
    let reader = store.clone();
    tokio::spawn(async move {
        let mut events = stream.boxed();
        while let Some(event) = events.next().await {
            match event {
                Ok(event) => changed(&reader, &event),
                Err(e) => {
                    tracing::warn!(error = %e, kind = %K::kind(&Default::default()), "watch failed; retrying")
                }
            }
        }
    });
    store
}

/// A watch of one of the controller's kinds, or, in a process without the
/// controller, a store that is whole and empty (nothing reads it there).
fn controller_watch<K>(
    controller: bool,
    client: &Client,
    strip: fn(&mut K),
    changed: impl FnMut(&Store<K>, &Event<K>) + Send + 'static,
) -> Store<K>
where
    K: Resource + Clone + std::fmt::Debug + serde::de::DeserializeOwned + Send + Sync + 'static,
    K::DynamicType: Default + Eq + std::hash::Hash + Clone,
{
    if controller {
        return watch(client, strip, changed);
    }
    let (store, mut writer) = reflector::store();
    writer.apply_watcher_event(&Event::Init);
    writer.apply_watcher_event(&Event::InitDone);
    store
}

/// A policy event: compiles the policies in force again, once per change of what
/// berth reads (never for a status write), and wakes both loops.
fn policy_changes(
    wakes: &Arc<Wakes>,
    published: &Arc<Published>,
    metrics: Arc<Metrics>,
) -> impl FnMut(&Store<PolicyObject>, &Event<PolicyObject>) + Send + 'static {
    let (wakes, published) = (wakes.clone(), published.clone());
    let mut hashes = Hashes::new(seen::policy::<PolicyObject>);
    let mut compiler = PolicyCompiler::default();
    move |store, event| {
        if hashes.changed(event) == Seen::Nothing {
            return;
        }
        let compiled = compiler.compile(store.state().iter().map(|p| p.source()));
        for invalid in compiled.errors.values() {
            metrics.error("invalid_policy");
            let error = &invalid.error;
            tracing::warn!(%error, last_good_kept = invalid.kept, "policy does not compile");
        }
        metrics.policy_compiles.inc();
        let _publishing = wakes.publishing();
        write(&published.in_force, Arc::new(compiled));
        published.policies_synced.send_replace(true);
        wakes.all();
    }
}

/// A namespace event that changes its labels or annotations: the namespace, for
/// the webhook, and both loops woken.
fn namespace_changes(
    wakes: &Arc<Wakes>,
    published: &Arc<Published>,
) -> impl FnMut(&Store<NamespaceMeta>, &Event<NamespaceMeta>) + Send + 'static {
    let (wakes, published) = (wakes.clone(), published.clone());
    let mut hashes = Hashes::new(seen::namespace::<NamespaceMeta>);
    let info = |ns: &NamespaceMeta| Arc::new(NamespaceInfo::from_meta(&ns.metadata));
    move |store, event| {
        let _publishing = wakes.publishing();
        match hashes.changed(event) {
            Seen::Nothing => return,
            Seen::Object(name) => {
                let current = read(&published.namespaces);
                let next = match store.get(&ObjectRef::new(&name)) {
                    Some(ns) => current.update(name, info(&ns)),
                    None => current.without(&name),
                };
                write(&published.namespaces, Arc::new(next));
            }
            Seen::Relisted => {
                let index = namespace_index(store.state().iter().map(|ns| &ns.metadata));
                write(&published.namespaces, Arc::new(index));
                published.namespaces_synced.send_replace(true);
            }
        }
        wakes.all();
    }
}

/// A node event that changes what berth reads of it: the node, for both loops,
/// and its labels, for the webhook.
fn node_changes(
    wakes: &Arc<Wakes>,
    published: &Arc<Published>,
) -> impl FnMut(&Store<NodeObject>, &Event<NodeObject>) + Send + 'static {
    let (wakes, published) = (wakes.clone(), published.clone());
    let mut hashes = Hashes::new(seen::node);
    move |store, event| {
        // The store's copy of a node shares `indexed` with the index, whatever
        // changed (a heartbeat too): else the index would keep an older copy of the
        // labels alive beside it.
        let current = read(&published.node_labels);
        let next = match event {
            Event::Apply(node) => {
                let name = node.name_any();
                let shared = current.get(&name).map(|i| Arc::ptr_eq(i, &node.indexed));
                (shared != Some(true)).then(|| current.update(name, node.indexed.clone()))
            }
            Event::Delete(node) => Some(current.without(&node.name_any())),
            Event::Init | Event::InitApply(_) | Event::InitDone => None,
        };
        if let Some(next) = next {
            write(&published.node_labels, Arc::new(next));
        }
        match hashes.changed(event) {
            Seen::Nothing => return,
            Seen::Object(name) => wakes.node(&name),
            Seen::Relisted => {
                wakes.relisted();
                let index = store
                    .state()
                    .iter()
                    .map(|node| (node.name_any(), node.indexed.clone()))
                    .collect();
                write(&published.node_labels, Arc::new(index));
                published.nodes_synced.send_replace(true);
            }
        }
        wakes.releases.notify_one();
    }
}

/// PriorityClasses: the global default and berth's queue classes, for the webhook.
fn class_changes(
    published: &Arc<Published>,
) -> impl FnMut(&Store<PriorityClass>, &Event<PriorityClass>) + Send + 'static {
    let published = published.clone();
    move |store, event| {
        if !matches!(event, Event::Init | Event::InitApply(_)) {
            published.update_groups(|groups| groups.set_classes(&store.state()));
        }
    }
}

/// A DaemonSet whose template changed (or that came or went): every node's
/// desired state may have.
fn daemonset_changes(
    wakes: &Arc<Wakes>,
    published: &Arc<Published>,
) -> impl FnMut(&Store<DaemonSetObject>, &Event<DaemonSetObject>) + Send + 'static {
    let (wakes, published) = (wakes.clone(), published.clone());
    let mut hashes = Hashes::new(seen::daemonset::<DaemonSetObject>);
    move |store, event| {
        if hashes.changed(event) != Seen::Nothing {
            // A DaemonSet made, deleted or listed again (a template change
            // leaves the set as it is, and costs a look at few objects).
            let daemonsets = store
                .state()
                .iter()
                .filter_map(|d| Some((d.namespace()?, d.uid()?)))
                .collect();
            let _publishing = wakes.publishing();
            write(&published.daemonsets, Arc::new(daemonsets));
            wakes.everything();
        }
    }
}

/// What an event of a kind only the releases read changes (ordered start's
/// Deployments and StatefulSets, whose readiness counts).
fn releases_only<K>(wakes: &Arc<Wakes>) -> impl FnMut(&Store<K>, &Event<K>) + Send + 'static
where
    K: Resource,
    K::DynamicType: Eq + std::hash::Hash,
{
    let wakes = wakes.clone();
    move |_, _| wakes.releases.notify_one()
}

/// Looks up the gang mode now and every [`GANG_MODE_EVERY`].
async fn follow_gang_mode(client: Client, published: Arc<Published>) {
    let mut every = tokio::time::interval(GANG_MODE_EVERY);
    loop {
        every.tick().await;
        let previous = read(&published.groups).gang_mode;
        let mode = groups::discover_gang_mode(&client, previous).await;
        if mode != previous {
            tracing::info!(mode = mode.as_str(), "gang mode");
            published.update_groups(|groups| groups.gang_mode = mode);
        }
        published.gang_mode_known.send_replace(true);
    }
}

/// A DaemonSet's annotations are not needed (its type reads only what the
/// template patch needs of the rest).
fn strip_daemonset(daemonset: &mut DaemonSetObject) {
    daemonset.metadata.annotations = None;
}

/// A node's annotations are not needed (kubelets and CSI drivers keep kilobytes
/// there on real nodes).
fn strip_node(node: &mut NodeObject) {
    node.metadata.annotations = None;
}

/// A workload's annotations are not needed.
fn strip_workload<K>(workload: &mut WorkloadObject<K>) {
    workload.metadata.annotations = None;
}

fn keep<K>(_: &mut K) {}

#[cfg(test)]
mod tests {
    use super::*;

    /// A store of `K` and what feeds it an event as the reflector does, then hands
    /// the event to `changed`.
    fn fed<K>(mut changed: impl FnMut(&Store<K>, &Event<K>)) -> (Store<K>, impl FnMut(Event<K>))
    where
        K: Resource + Clone + 'static,
        K::DynamicType: Default + Eq + std::hash::Hash + Clone,
    {
        let (store, mut writer) = reflector::store::<K>();
        let reader = store.clone();
        let apply = move |event: Event<K>| {
            writer.apply_watcher_event(&event);
            changed(&reader, &event);
        };
        (store, apply)
    }

    fn node(name: &str, zone: &str, taint: &str) -> NodeObject {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": name, "labels": {"zone": zone}},
            "spec": {"taints": [{"key": taint, "effect": "NoSchedule"}]}}))
        .unwrap()
    }

    /// The DaemonSets' namespaces and uids follow creations, deletions and relists,
    /// and a template change wakes the nodes loop for every node.
    #[test]
    fn the_daemonset_index_follows_the_store() {
        let (wakes, published) = (Arc::new(Wakes::default()), Arc::new(Published::default()));
        let (_, mut apply) = fed(daemonset_changes(&wakes, &published));
        let daemonset = |name: &str, generation: i64| -> DaemonSetObject {
            serde_json::from_value(serde_json::json!({"metadata": {"name": name,
                "namespace": "logs", "uid": format!("u-{name}"), "generation": generation}}))
            .unwrap()
        };
        let uids =
            || -> Vec<(String, String)> { read(&published.daemonsets).iter().cloned().collect() };
        let key = |name: &str| ("logs".to_string(), format!("u-{name}"));
        apply(Event::Init);
        apply(Event::InitApply(daemonset("agent", 1)));
        apply(Event::InitDone);
        assert_eq!(uids(), [key("agent")]);
        wakes.take();
        apply(Event::Apply(daemonset("shipper", 1)));
        assert_eq!(uids(), [key("agent"), key("shipper")]);
        assert_eq!(wakes.take(), Changed::Everything);
        apply(Event::Apply(daemonset("agent", 2)));
        assert_eq!(wakes.take(), Changed::Everything, "a template change");
        apply(Event::Delete(daemonset("agent", 2)));
        assert_eq!(uids(), [key("shipper")]);
    }

    /// The webhook's namespaces follow creations, annotation changes, deletions
    /// and relists; a change of what berth does not read keeps the namespace as it
    /// is, its annotations read once.
    #[test]
    fn the_namespace_index_follows_the_store() {
        let (wakes, published) = (Arc::new(Wakes::default()), Arc::new(Published::default()));
        let (_, mut apply) = fed(namespace_changes(&wakes, &published));
        let namespace = |name: &str, policies: &str, version: &str| -> NamespaceMeta {
            serde_json::from_value(serde_json::json!({"metadata": {"name": name,
                "resourceVersion": version, "annotations": {crate::names::POLICIES_ANNOTATION: policies}}}))
            .unwrap()
        };
        let policies = |name: &str| -> Option<Vec<String>> {
            let info = read(&published.namespaces).get(name)?.clone();
            Some(info.config().ok()?.policies.clone())
        };
        apply(Event::Init);
        apply(Event::InitApply(namespace("shop", "cdn", "1")));
        apply(Event::InitDone);
        assert_eq!(policies("shop"), Some(vec!["cdn".to_string()]));
        assert!(*published.namespaces_synced.subscribe().borrow());
        let before = read(&published.namespaces)["shop"].clone();
        apply(Event::Apply(namespace("shop", "cdn", "2")));
        assert!(
            Arc::ptr_eq(&before, &read(&published.namespaces)["shop"]),
            "nothing berth reads changed"
        );
        apply(Event::Apply(namespace("shop", "cdn, gpu", "3")));
        assert_eq!(policies("shop"), Some(vec!["cdn".into(), "gpu".into()]));
        apply(Event::Apply(namespace("lab", "gpu", "4")));
        assert_eq!(policies("lab"), Some(vec!["gpu".to_string()]));
        apply(Event::Delete(namespace("shop", "cdn, gpu", "5")));
        assert_eq!(policies("shop"), None);
        // A relist that no longer holds lab (deleted while the watch was down).
        apply(Event::Init);
        apply(Event::InitApply(namespace("shop", "edge", "6")));
        apply(Event::InitDone);
        assert_eq!(policies("shop"), Some(vec!["edge".to_string()]));
        assert_eq!(policies("lab"), None);
    }

    /// The webhook's index and the store hold one copy of each node's labels,
    /// through a relist, a label change and a change of something else.
    #[test]
    fn the_node_index_shares_the_stores_labels() {
        let (wakes, published) = (Arc::new(Wakes::default()), Arc::new(Published::default()));
        let (store, mut apply) = fed(node_changes(&wakes, &published));
        apply(Event::Init);
        apply(Event::InitApply(node("n1", "a", "t1")));
        apply(Event::InitApply(node("n2", "a", "t1")));
        apply(Event::InitDone);
        apply(Event::Apply(node("n1", "b", "t1")));
        apply(Event::Apply(node("n2", "a", "t2")));
        // A heartbeat: nothing berth reads changed, but the store has a new copy.
        apply(Event::Apply(node("n2", "a", "t2")));
        let index = read(&published.node_labels);
        for name in ["n1", "n2"] {
            let stored = store.get(&ObjectRef::new(name)).unwrap();
            assert!(Arc::ptr_eq(&stored.indexed, &index[name]), "{name}");
        }
        assert_eq!(index["n1"].labels["zone"], "b");
        apply(Event::Delete(node("n1", "b", "t1")));
        assert!(!read(&published.node_labels).contains_key("n1"));
    }
}
