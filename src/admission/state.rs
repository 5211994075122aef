//! What the webhook knows of the cluster: Namespaces, PlacementPolicies and Node
//! labels, from watch caches (reflectors), never from an API call per request. A
//! namespace missing from the cache gets one direct GET; if that fails too, the
//! pod gets the safe answer (no grant).

use std::collections::{BTreeMap, BTreeSet};
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use futures::StreamExt;
use kube::api::Api;
use kube::runtime::WatchStreamExt;
use kube::runtime::reflector::{self, ObjectRef, Store, reflector};
use kube::runtime::watcher::{Event, watcher};
use kube::{Client, ResourceExt};

use k8s_openapi::api::scheduling::v1::PriorityClass;
use kube::api::PostParams;

use crate::names::{FIELD_MANAGER, QUEUE_CLASS_PREFIX, owned_metadata};
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
    /// Creates the PriorityClass `class` of queue value `value` for a pod in
    /// `namespace` (it exists already: fine).
    fn create_queue_class<'a>(
        &'a self,
        namespace: &'a str,
        class: &'a str,
        value: i32,
    ) -> BoxFuture<'a, Result<(), String>>;
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

/// How long after a new queue PriorityClass reaches berth's watch the apiserver's
/// own informer is given to see it too.
const CLASS_SETTLE: Duration = Duration::from_millis(100);
/// The longest a request waits for a new queue class, all of it included.
const CLASS_DEADLINE: Duration = Duration::from_millis(1500);
/// How many new queue classes one namespace may have made per [`CLASS_WINDOW`]:
/// its tenants write the labels, and the classes are cluster-wide and capped.
const CLASSES_PER_NAMESPACE: usize = 20;
const CLASS_WINDOW: Duration = Duration::from_secs(600);

/// The new queue classes made for each namespace in the last [`CLASS_WINDOW`].
#[derive(Debug, Default)]
struct QueueClassBudget {
    made: std::collections::HashMap<String, std::collections::VecDeque<std::time::Instant>>,
}

impl QueueClassBudget {
    /// Takes one from `namespace`'s budget at `now`; false when it has none left.
    fn take(&mut self, namespace: &str, now: std::time::Instant) -> bool {
        // Forget what has left the window, everywhere, so the map stays small.
        self.made.retain(|_, times| {
            while times
                .front()
                .is_some_and(|t| now.duration_since(*t) >= CLASS_WINDOW)
            {
                times.pop_front();
            }
            !times.is_empty()
        });
        let times = self.made.entry(namespace.to_owned()).or_default();
        if times.len() >= CLASSES_PER_NAMESPACE {
            return false;
        }
        times.push_back(now);
        true
    }
}

/// The PriorityClass berth keeps for queue value `value`: it orders the queue and
/// never preempts.
pub fn queue_class_object(class: &str, value: i32) -> PriorityClass {
    PriorityClass {
        metadata: owned_metadata(class),
        value: Some(value),
        preemption_policy: Some("Never".into()),
        global_default: Some(false),
        description: Some(
            "berth queue order: 3 x the pod's queue priority label + its QoS rank; never preempts"
                .into(),
        ),
    }
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
    fn create_queue_class<'a>(
        &'a self,
        _namespace: &'a str,
        class: &'a str,
        _value: i32,
    ) -> BoxFuture<'a, Result<(), String>> {
        Box::pin(async move { Err(format!("no cluster to create PriorityClass {class} in")) })
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
    /// When each namespace last had queue classes made for it.
    classes_made: Mutex<QueueClassBudget>,
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
            classes_made: Mutex::new(QueueClassBudget::default()),
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

    fn create_queue_class<'a>(
        &'a self,
        namespace: &'a str,
        class: &'a str,
        value: i32,
    ) -> BoxFuture<'a, Result<(), String>> {
        Box::pin(async move {
            // One deadline for all of it, well inside the webhook's 3 s timeout:
            // past that the apiserver would admit the pod with no patch at all.
            let deadline = tokio::time::Instant::now() + CLASS_DEADLINE;
            let allowed = match self.classes_made.lock() {
                Ok(mut budget) => budget.take(namespace, std::time::Instant::now()),
                Err(poisoned) => poisoned
                    .into_inner()
                    .take(namespace, std::time::Instant::now()),
            };
            if !allowed {
                return Err(format!(
                    "namespace {namespace} had {CLASSES_PER_NAMESPACE} new queue PriorityClasses \
                     made in the last {} minutes; no {class} now",
                    CLASS_WINDOW.as_secs() / 60
                ));
            }
            let api = Api::<PriorityClass>::all(self.client.clone());
            let params = PostParams {
                field_manager: Some(FIELD_MANAGER.into()),
                ..PostParams::default()
            };
            let object = queue_class_object(class, value);
            let create = api.create(&params, &object);
            match tokio::time::timeout_at(deadline, create).await {
                Ok(Ok(_)) => {}
                Ok(Err(kube::Error::Api(status))) if status.code == 409 => {}
                Ok(Err(e)) => return Err(format!("cannot create PriorityClass {class}: {e}")),
                Err(_) => return Err(format!("creating PriorityClass {class} timed out")),
            }
            // The apiserver's Priority plugin looks the class up in its own
            // informer, not in etcd: a pod naming a class it has not seen yet is
            // refused. Wait until the class reaches our watch, fed like that
            // informer from the apiserver's watch cache, and a moment more.
            let seen = async {
                while !read(&self.groups).queue_classes.contains(class) {
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
            };
            if tokio::time::timeout_at(deadline - CLASS_SETTLE, seen)
                .await
                .is_err()
            {
                tracing::warn!(%class, "the new PriorityClass has not reached berth's watch; going on");
            }
            tokio::time::sleep(CLASS_SETTLE).await;
            self.update_groups(|groups| {
                groups.queue_classes.insert(class.to_owned());
            });
            Ok(())
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_namespace_has_a_budget_of_new_queue_classes_per_window() {
        let mut budget = QueueClassBudget::default();
        let start = std::time::Instant::now();
        for _ in 0..CLASSES_PER_NAMESPACE {
            assert!(budget.take("tenant", start));
        }
        assert!(!budget.take("tenant", start), "spent");
        assert!(budget.take("other", start), "another namespace has its own");
        assert!(
            budget.take("tenant", start + CLASS_WINDOW),
            "the window has passed"
        );
    }
}
