//! What the webhook knows of the cluster: Namespaces, PlacementPolicies and Node
//! labels, from watch caches (reflectors), never from an API call per request. A
//! namespace missing from the cache gets one direct GET; if that fails too, the
//! pod gets the safe answer (no grant).

use std::collections::BTreeMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use futures::StreamExt;
use kube::api::Api;
use kube::runtime::WatchStreamExt;
use kube::runtime::reflector::{self, ObjectRef, Store, reflector};
use kube::runtime::watcher::{self, Event, watcher};
use kube::{Client, ResourceExt};

use crate::objects::{NamespaceMeta, NodeMeta, PolicyObject};
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
}

/// A view that never changes, for tests and offline use.
#[derive(Debug, Default)]
pub struct FixedView {
    pub policies: Arc<PolicySet>,
    pub nodes: Arc<NodeIndex>,
    pub namespaces: BTreeMap<String, NamespaceInfo>,
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
}

/// The cluster as three watch caches, each read leniently (see [`crate::objects`]):
/// one object berth cannot read never blinds a cache.
pub struct WatchedCluster {
    client: Client,
    namespaces: Store<NamespaceMeta>,
    policies: RwLock<Arc<PolicySet>>,
    nodes: RwLock<Arc<NodeIndex>>,
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
            namespaces_synced: AtomicBool::new(false),
            policies_synced: AtomicBool::new(false),
            nodes_synced: AtomicBool::new(false),
        });

        let stream = reflector(
            namespace_writer,
            watcher(
                Api::<NamespaceMeta>::all(client.clone()),
                watcher::Config::default(),
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
        cluster
    }

    /// Keeps the compiled policy set current; an unusable policy is logged and
    /// counted, and the others keep working. A policy that stops compiling keeps its
    /// last good version; one being deleted stops granting at once.
    async fn watch_policies(self: Arc<Self>, metrics: Arc<Metrics>) {
        let (store, writer) = reflector::store::<PolicyObject>();
        let api = Api::<PolicyObject>::all(self.client.clone());
        let mut compiler = PolicyCompiler::default();
        let mut events = reflector(writer, watcher(api, watcher::Config::default()))
            .default_backoff()
            .boxed();
        while let Some(event) = events.next().await {
            match event {
                Ok(Event::Init | Event::InitApply(_)) => continue,
                Ok(_) => {}
                Err(e) => {
                    tracing::warn!(error = %e, "policy watch failed; retrying");
                    continue;
                }
            }
            let state = store.state();
            let compiled = compiler.compile(state.iter().map(|p| p.source()));
            for invalid in compiled.errors.values() {
                metrics.error("invalid_policy");
                let error = &invalid.error;
                tracing::warn!(%error, last_good_kept = invalid.kept, "policy does not compile");
            }
            write(&self.policies, Arc::new(compiled.set));
            self.policies_synced.store(true, Ordering::Release);
        }
    }

    /// Keeps node labels current from a metadata-only watch: node status updates
    /// (heartbeats) do not reach us, and the index is rebuilt only when labels
    /// change.
    async fn watch_nodes(self: Arc<Self>) {
        let api = Api::<NodeMeta>::all(self.client.clone());
        let mut events = watcher(api, watcher::Config::default())
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
                        index.insert(meta.name_any(), labels(&meta));
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
                        next.insert(name, labels(&meta));
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
    }
}
