//! What the webhook knows of the cluster: Namespaces, PlacementPolicies and Node
//! labels, from watch caches (reflectors), never from an API call per request. A
//! namespace missing from the cache gets one direct GET; if that fails too, the
//! pod gets the safe answer (no grant).

use std::collections::{BTreeMap, BTreeSet};
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use futures::StreamExt;
use kube::api::Api;
use kube::runtime::WatchStreamExt;
use kube::runtime::reflector::{self, ObjectRef, Store, reflector};
use kube::runtime::watcher::{Event, watcher};
use kube::{Client, ResourceExt};

use k8s_openapi::api::scheduling::v1::PriorityClass;

use crate::names::QUEUE_CLASS_PREFIX;
use crate::objects::{NamespaceMeta, NodeMeta, PolicyObject};
use crate::placement::groups::GangMode;
use crate::placement::{NamespaceInfo, NodeIndex, NodeInfo};
use crate::policy::PolicySet;
use crate::policy::compile::PolicyCompiler;
use crate::telemetry::Metrics;

/// A boxed future, for the one async method of [`ClusterView`].
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// The webhook's view of the cluster. [`WatchedCluster`] is the real one; tests
/// use a fixed one.
pub trait ClusterView: Send + Sync {
    /// The compiled policies now.
    fn policies(&self) -> Arc<PolicySet>;
    /// Known nodes and their labels now.
    fn nodes(&self) -> Arc<NodeIndex>;
    /// The namespace, or `None` if it cannot be found.
    fn namespace<'a>(&'a self, name: &'a str) -> BoxFuture<'a, Option<NamespaceInfo>>;
    /// Whether every cache has finished its first list.
    fn synced(&self) -> bool;
    /// What group decisions need: the gang mode and the PriorityClasses.
    fn groups(&self) -> Arc<GroupState>;
}

/// What the webhook knows for group decisions.
#[derive(Debug, Clone, Default)]
pub struct GroupState {
    pub gang_mode: GangMode,
    /// The global-default PriorityClass, if the cluster has one.
    pub default_class: Option<String>,
    /// The `berth-queue-` PriorityClasses that exist.
    pub queue_classes: BTreeSet<String>,
}

/// A view that never changes, for tests and offline use.
#[derive(Debug, Default)]
pub struct FixedView {
    pub policies: Arc<PolicySet>,
    pub nodes: Arc<NodeIndex>,
    pub namespaces: BTreeMap<String, NamespaceInfo>,
    pub groups: Arc<GroupState>,
}

impl ClusterView for FixedView {
    fn policies(&self) -> Arc<PolicySet> {
        self.policies.clone()
    }
    fn nodes(&self) -> Arc<NodeIndex> {
        self.nodes.clone()
    }
    fn namespace<'a>(&'a self, name: &'a str) -> BoxFuture<'a, Option<NamespaceInfo>> {
        Box::pin(async move { self.namespaces.get(name).cloned() })
    }
    fn synced(&self) -> bool {
        true
    }
    fn groups(&self) -> Arc<GroupState> {
        self.groups.clone()
    }
}

/// The cluster as three watch caches, each read leniently (see [`crate::objects`]):
/// one object berth cannot read never blinds a cache.
pub struct WatchedCluster {
    client: Client,
    namespaces: Store<NamespaceMeta>,
    policies: RwLock<Arc<PolicySet>>,
    nodes: RwLock<Arc<NodeIndex>>,
    groups: RwLock<Arc<GroupState>>,
    gang_mode_known: AtomicBool,
    namespaces_synced: AtomicBool,
    policies_synced: AtomicBool,
    nodes_synced: AtomicBool,
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

impl WatchedCluster {
    /// Starts the watches in the background; they back off and relist on errors.
    pub fn start(client: Client, metrics: Arc<Metrics>) -> Arc<WatchedCluster> {
        let (namespaces, namespace_writer) = reflector::store();
        let cluster = Arc::new(WatchedCluster {
            client: client.clone(),
            namespaces,
            policies: RwLock::new(Arc::new(PolicySet::default())),
            nodes: RwLock::new(Arc::new(NodeIndex::new())),
            groups: RwLock::new(Arc::new(GroupState::default())),
            gang_mode_known: AtomicBool::new(false),
            namespaces_synced: AtomicBool::new(false),
            policies_synced: AtomicBool::new(false),
            nodes_synced: AtomicBool::new(false),
        });

        let stream = reflector(
            namespace_writer,
            watcher(
                Api::<NamespaceMeta>::all(client.clone()),
                crate::objects::watch_config(),
            ),
        );
        let this = cluster.clone();
        tokio::spawn(async move {
            let mut events = stream.default_backoff().boxed();
            while let Some(event) = events.next().await {
                match event {
                    Ok(Event::InitDone) => this.namespaces_synced.store(true, Ordering::Release),
                    Ok(_) => {}
                    Err(e) => tracing::warn!(error = %e, "namespace watch failed; retrying"),
                }
            }
        });

        let this = cluster.clone();
        tokio::spawn(async move { this.watch_policies(metrics).await });
        let this = cluster.clone();
        tokio::spawn(async move { this.watch_nodes().await });
        let this = cluster.clone();
        tokio::spawn(async move { this.watch_priority_classes().await });
        let this = cluster.clone();
        tokio::spawn(async move { this.discover_gang_mode().await });
        cluster
    }

    /// Changes the group state under its lock.
    fn update_groups(&self, change: impl FnOnce(&mut GroupState)) {
        let mut next = (*read(&self.groups)).clone();
        change(&mut next);
        write(&self.groups, Arc::new(next));
    }

    /// Keeps the global-default PriorityClass and berth's queue classes current.
    async fn watch_priority_classes(self: Arc<Self>) {
        follow::<PriorityClass>(&self.client, "PriorityClass", |classes| {
            let default_class = classes
                .iter()
                .find(|c| c.global_default == Some(true))
                .map(|c| c.name_any());
            let queue_classes = classes
                .iter()
                .map(|c| c.name_any())
                .filter(|n| n.starts_with(QUEUE_CLASS_PREFIX))
                .collect();
            self.update_groups(|groups| {
                groups.default_class = default_class;
                groups.queue_classes = queue_classes;
            });
        })
        .await;
    }

    /// Finds the gang mode now and every minute: a feature turned on in the
    /// apiserver is picked up without a restart.
    async fn discover_gang_mode(self: Arc<Self>) {
        let mut every = tokio::time::interval(Duration::from_secs(60));
        loop {
            every.tick().await;
            let previous = read(&self.groups).gang_mode;
            let mode =
                crate::controller::podgroups::discover_gang_mode(&self.client, previous).await;
            if mode != previous {
                tracing::info!(mode = mode.as_str(), "gang mode");
                self.update_groups(|groups| groups.gang_mode = mode);
            }
            self.gang_mode_known.store(true, Ordering::Release);
        }
    }

    /// Keeps the compiled policy set current; an unusable policy is logged and
    /// counted, and the others keep working. A policy that stops compiling keeps its
    /// last good version; one being deleted stops granting at once.
    async fn watch_policies(self: Arc<Self>, metrics: Arc<Metrics>) {
        let mut compiler = PolicyCompiler::default();
        follow::<PolicyObject>(&self.client, "policy", |state| {
            let compiled = compiler.compile(state.iter().map(|p| p.source()));
            for invalid in compiled.errors.values() {
                metrics.error("invalid_policy");
                let error = &invalid.error;
                tracing::warn!(%error, last_good_kept = invalid.kept, "policy does not compile");
            }
            write(&self.policies, Arc::new(compiled.set));
            self.policies_synced.store(true, Ordering::Release);
        })
        .await;
    }

    /// Keeps node labels current from a metadata-only watch: node status updates
    /// (heartbeats) do not reach us, and the index is rebuilt only when labels
    /// change.
    async fn watch_nodes(self: Arc<Self>) {
        let api = Api::<NodeMeta>::all(self.client.clone());
        let mut events = watcher(api, crate::objects::watch_config())
            .default_backoff()
            .boxed();
        let mut building: Option<NodeIndex> = None;
        while let Some(event) = events.next().await {
            let event = match event {
                Ok(event) => event,
                Err(e) => {
                    tracing::warn!(error = %e, "node watch failed; retrying");
                    continue;
                }
            };
            let labels = |m: &NodeMeta| NodeInfo {
                labels: m.labels().clone(),
                taints: Vec::new(),
            };
            match event {
                Event::Init => building = Some(NodeIndex::new()),
                Event::InitApply(meta) => {
                    if let Some(index) = building.as_mut() {
                        index.insert(meta.name_any(), Arc::new(labels(&meta)));
                    }
                }
                Event::InitDone => {
                    write(&self.nodes, Arc::new(building.take().unwrap_or_default()));
                    self.nodes_synced.store(true, Ordering::Release);
                }
                Event::Apply(meta) => {
                    let current = read(&self.nodes);
                    let name = meta.name_any();
                    if current.get(&name).map(|n| &n.labels) != Some(meta.labels()) {
                        let mut next = (*current).clone();
                        next.insert(name, Arc::new(labels(&meta)));
                        write(&self.nodes, Arc::new(next));
                    }
                }
                Event::Delete(meta) => {
                    let mut next = (*read(&self.nodes)).clone();
                    next.remove(&meta.name_any());
                    write(&self.nodes, Arc::new(next));
                }
            }
        }
    }
}

/// Watches every `K` into a store and calls `changed` with its contents after each
/// change, once the first list is whole; the watch backs off and relists on errors.
async fn follow<K>(client: &Client, what: &str, mut changed: impl FnMut(Vec<Arc<K>>))
where
    K: kube::Resource
        + Clone
        + std::fmt::Debug
        + serde::de::DeserializeOwned
        + Send
        + Sync
        + 'static,
    K::DynamicType: Default + Eq + std::hash::Hash + Clone,
{
    let (store, writer) = reflector::store::<K>();
    let api = Api::<K>::all(client.clone());
    let mut events = reflector(writer, watcher(api, crate::objects::watch_config()))
        .default_backoff()
        .boxed();
    while let Some(event) = events.next().await {
        match event {
            Ok(Event::Init | Event::InitApply(_)) => continue,
            Ok(_) => {}
            Err(e) => {
                tracing::warn!(error = %e, "{what} watch failed; retrying");
                continue;
            }
        }
        changed(store.state());
    }
}

impl ClusterView for WatchedCluster {
    fn policies(&self) -> Arc<PolicySet> {
        read(&self.policies)
    }

    fn nodes(&self) -> Arc<NodeIndex> {
        read(&self.nodes)
    }

    fn namespace<'a>(&'a self, name: &'a str) -> BoxFuture<'a, Option<NamespaceInfo>> {
        Box::pin(async move {
            if let Some(ns) = self.namespaces.get(&ObjectRef::new(name)) {
                return Some(NamespaceInfo::from_meta(&ns.metadata));
            }
            // A namespace created a moment ago may not be in the cache yet.
            let api = Api::<NamespaceMeta>::all(self.client.clone());
            match tokio::time::timeout(Duration::from_secs(1), api.get_opt(name)).await {
                Ok(Ok(Some(ns))) => Some(NamespaceInfo::from_meta(&ns.metadata)),
                Ok(Ok(None)) => None,
                Ok(Err(e)) => {
                    tracing::warn!(namespace = name, error = %e, "namespace lookup failed");
                    None
                }
                Err(_) => {
                    tracing::warn!(namespace = name, "namespace lookup timed out");
                    None
                }
            }
        })
    }

    fn synced(&self) -> bool {
        self.namespaces_synced.load(Ordering::Acquire)
            && self.policies_synced.load(Ordering::Acquire)
            && self.nodes_synced.load(Ordering::Acquire)
            && self.gang_mode_known.load(Ordering::Acquire)
    }

    fn groups(&self) -> Arc<GroupState> {
        read(&self.groups)
    }
}
