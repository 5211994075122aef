//! The controller loop. Watches on PlacementPolicies, Nodes, Namespaces, Pods and
//! DaemonSets feed in-memory stores; any change (and a periodic resync) wakes one
//! pass that releases the held pods that may go (see [`super::release`]), then
//! computes every node's desired state and writes the differences, the policies'
//! status, and DaemonSet templates that predate a pool. Only the replica holding
//! the Lease writes, and only once every store holds a full list.
//!
//! Every store is fed leniently ([`crate::objects`]): one object berth cannot read
//! never blinds a watch.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use futures::{StreamExt, stream};
use kube::api::Api;
use kube::runtime::events::{Recorder, Reporter};
use kube::runtime::reflector::{self, Store, reflector};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Client, Resource, ResourceExt};
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use super::daemonsets::{daemonset_patch, write_daemonset};
use super::desired::applied_policies;
use super::desired::{BoundPod, DesiredNode, desired_node_state};
use super::events::Reported;
use super::exclusion;
use super::rooms::{Rooms, node_rooms};
use super::writer::{Written, in_sync, write_node};
use crate::names::{APPLIED_ANNOTATION, GROUP_GATES, is_berth_gate};
use crate::objects::{
    DaemonSetObject, DeploymentObject, NamespaceMeta, NodeObject, PodObject, PolicyObject,
    StatefulSetObject, WorkloadObject,
};
use crate::placement::NamespaceInfo;
use crate::placement::groups::GangMode;
use crate::placement::matching::match_policies;
use crate::placement::pod::PodView;
use crate::policy::NamespaceOptIn;
use crate::policy::compile::{Compiled, PolicyCompiler};
use crate::telemetry::GateLabels;
use crate::telemetry::{KindLabels, Metrics};

/// Node writes in flight at once.
const WRITE_CONCURRENCY: usize = 4;
/// Changes within this window are handled in one pass.
const DEBOUNCE: Duration = Duration::from_millis(100);
/// The window instead, while held pods wait behind a pod released a moment ago:
/// pods that must avoid each other are placed one after the other, and each
/// would otherwise wait a full window for the binding of the one before it.
const HURRIED_DEBOUNCE: Duration = Duration::from_millis(10);
/// How long after its release a pod's binding counts as a moment away.
pub const HURRY_WINDOW: Duration = Duration::from_secs(5);

/// How the controller runs.
#[derive(Debug, Clone)]
pub struct ControllerOptions {
    /// Namespace of the Lease `berth-controller`.
    pub lease_namespace: String,
    /// This replica's name in the Lease.
    pub identity: String,
    /// A full pass at least this often, even without changes.
    pub resync: Duration,
    /// Node writes per second at most, so a large change cannot flood the apiserver.
    pub writes_per_second: u32,
}

pub struct Stores {
    policies: Store<PolicyObject>,
    nodes: Store<NodeObject>,
    namespaces: Store<NamespaceMeta>,
    /// Every pod, stripped: bound ones for anchors and entitlement, unbound ones for
    /// exclusion. One watch, so a pod moves from unbound to bound in one event and
    /// is never, between two watches, in neither.
    pods: Store<PodObject>,
    daemonsets: Store<DaemonSetObject>,
    /// For ordered start: lower ranks whose pods may not exist yet.
    deployments: Store<DeploymentObject>,
    statefulsets: Store<StatefulSetObject>,
}

/// Starts a watch on every `K` in the cluster, feeding a store of them as `strip`
/// leaves them; every event wakes the loop.
fn watch<K>(client: &Client, wake: &Arc<Notify>, strip: fn(&mut K)) -> Store<K>
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
    let wake = wake.clone();
    tokio::spawn(async move {
        let mut events = stream.boxed();
        while let Some(event) = events.next().await {
            if let Err(e) = event {
                tracing::warn!(error = %e, "watch failed; retrying");
            }
            wake.notify_one();
        }
    });
    store
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

/// A token bucket for node and DaemonSet writes: `per_second` on average, with
/// bursts of up to two seconds' worth, so that a new pool over a thousand nodes is
/// written in seconds while a steady trickle stays at the rate.
struct RateLimit {
    per_second: f64,
    burst: f64,
    bucket: tokio::sync::Mutex<(f64, tokio::time::Instant)>,
}

impl RateLimit {
    fn new(per_second: u32) -> Self {
        let per_second = f64::from(per_second.max(1));
        let burst = 2.0 * per_second;
        RateLimit {
            per_second,
            burst,
            bucket: tokio::sync::Mutex::new((burst, tokio::time::Instant::now())),
        }
    }

    /// Takes one token, waiting for it if the bucket is empty. Waiters queue on
    /// the lock, so they are served in turn.
    async fn acquire(&self) {
        let mut bucket = self.bucket.lock().await;
        let now = tokio::time::Instant::now();
        let (tokens, last) = *bucket;
        let mut tokens =
            (tokens + now.duration_since(last).as_secs_f64() * self.per_second).min(self.burst);
        let mut at = now;
        if tokens < 1.0 {
            let wait = Duration::from_secs_f64((1.0 - tokens) / self.per_second);
            tokio::time::sleep(wait).await;
            at = now + wait;
            tokens = 1.0;
        }
        *bucket = (tokens - 1.0, at);
    }
}

/// Runs the controller until `shutdown`; writes only while holding the Lease,
/// and releases it on shutdown.
pub async fn run(
    client: Client,
    metrics: Arc<Metrics>,
    options: ControllerOptions,
    shutdown: CancellationToken,
) {
    let wake = Arc::new(Notify::new());
    let stores = Stores {
        policies: watch(&client, &wake, keep_all),
        nodes: watch(&client, &wake, keep_all),
        namespaces: watch(&client, &wake, keep_all),
        pods: watch(&client, &wake, strip_pod),
        daemonsets: watch(&client, &wake, strip_daemonset),
        deployments: watch(&client, &wake, strip_workload),
        statefulsets: watch(&client, &wake, strip_workload),
    };
    let recorder = Recorder::new(
        client.clone(),
        Reporter {
            controller: "berth".into(),
            instance: Some(options.identity.clone()),
        },
    );

    let manager = match kube_lease_manager::LeaseManagerBuilder::new(
        client.clone(),
        "berth-controller",
    )
    .with_namespace(&options.lease_namespace)
    .with_identity(&options.identity)
    .with_duration(15)
    .with_grace(5)
    .build()
    .await
    {
        Ok(manager) => manager,
        Err(e) => {
            tracing::error!(error = %e, "cannot set up leader election; the controller does not run");
            return;
        }
    };
    // A pass on a half-filled cache would do harm: without the pods it would take
    // every anchor label off, without the policies release every held pod at once.
    let synced = async {
        tokio::try_join!(
            stores.policies.wait_until_ready(),
            stores.nodes.wait_until_ready(),
            stores.namespaces.wait_until_ready(),
            stores.pods.wait_until_ready(),
            stores.daemonsets.wait_until_ready(),
            stores.deployments.wait_until_ready(),
            stores.statefulsets.wait_until_ready(),
        )
    };
    tokio::select! {
        () = shutdown.cancelled() => return,
        ready = synced => if ready.is_err() {
            tracing::error!("a watch stopped before its first list; the controller does not run");
            return;
        },
    }
    tracing::info!("controller caches synced");
    let (mut leadership, lease_task) = manager.watch().await;
    let mut resync = tokio::time::interval(options.resync);
    let limit = Arc::new(RateLimit::new(options.writes_per_second));
    let mut reported = Reported::default();
    let mut released = exclusion::Released::default();
    let mut lookups = super::release::PolicyLookups::default();
    let mut compiler = PolicyCompiler::default();
    let mut pod_groups = super::podgroups::PodGroups::default();
    let mut sweeper = super::sweep::Sweeper::default();
    let mut sweep = false;
    let mut gang_mode = super::podgroups::discover_gang_mode(&client, Default::default()).await;
    let mut debounce = DEBOUNCE;
    let mut gang_timeout: Option<tokio::time::Instant> = None;
    loop {
        tokio::select! {
            () = shutdown.cancelled() => break,
            changed = leadership.changed() => {
                if changed.is_err() {
                    tracing::warn!("leader election stopped");
                    break;
                }
                let leading = *leadership.borrow_and_update();
                metrics.leader.set(i64::from(leading));
                // What a sweep found unused before a gap in leadership is stale.
                sweeper = super::sweep::Sweeper::default();
                tracing::info!(leading, identity = %options.identity, "controller leadership changed");
            }
            () = wake.notified() => tokio::time::sleep(debounce).await,
            // A held gang reaches its timeoutSeconds: report it on time.
            () = until(gang_timeout) => gang_timeout = None,
            _ = resync.tick() => {
                gang_mode = super::podgroups::discover_gang_mode(&client, gang_mode).await;
                pod_groups.forget();
                sweep = true;
            }
        }
        if !*leadership.borrow() {
            continue;
        }
        let pass = Pass {
            client: &client,
            metrics: &metrics,
            recorder: &recorder,
        };
        // Releases first: they do not depend on the node labels (a released pod
        // carries its own constraints), and every pod of an exclusion group waits
        // for the one before it, so its pass should not wait for node writes.
        // The policies are read after the pods, never before: a policy the webhook
        // applied to a pod in the cache must not look deleted because the snapshot
        // predates it (that would release every pod of it at once).
        let pods = stores.pods.state();
        let snapshot = Snapshot::take(&stores, &mut compiler);
        let held: Vec<(String, Vec<String>)> = pods
            .iter()
            .filter(|p| {
                p.spec
                    .scheduling_gates
                    .iter()
                    .any(|g| is_berth_gate(&g.name))
            })
            .map(|p| (p.key(), applied_policies(p.metadata.annotations.as_ref())))
            .collect();
        let unseen = lookups.waits(&client, &snapshot, &held).await;
        // Where held pods would fit: built only while some pod is held.
        let rooms = if held.is_empty() {
            Rooms::new()
        } else {
            node_rooms(&stores.nodes.state(), pods.iter().map(|p| p.as_ref()))
        };
        let hurry = super::release::release_held_pods(
            &pass,
            &snapshot,
            &pods,
            &rooms,
            &unseen,
            &mut released,
            &mut reported,
        )
        .await;
        debounce = if hurry { HURRIED_DEBOUNCE } else { DEBOUNCE };
        let (groups, next_timeout) = release_groups(
            &pass,
            &stores,
            &snapshot,
            &pods,
            &rooms,
            &unseen,
            &mut reported,
        )
        .await;
        gang_timeout = next_timeout.map(|d| tokio::time::Instant::now() + d);
        let groups = super::status::GroupStatus {
            gang_mode,
            timed_out: groups,
        };
        if gang_mode == GangMode::PodGroup {
            pod_groups.keep(&pass, &pods, &snapshot).await;
        }
        reconcile(&pass, &stores, &snapshot, &limit, &groups, &mut reported).await;
        if std::mem::take(&mut sweep) {
            let pod_groups = gang_mode == GangMode::PodGroup;
            sweeper.sweep(&client, &pods, pod_groups).await;
        }
        // Every cause of an Event was looked at in this pass, whatever failed.
        reported.end_pass();
    }
    // Dropping the receiver makes the lease task release the Lease.
    drop(leadership);
    metrics.leader.set(0);
    let _ = tokio::time::timeout(Duration::from_secs(5), lease_task).await;
}

/// Sleeps until `deadline`; without one, forever.
async fn until(deadline: Option<tokio::time::Instant>) {
    match deadline {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

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
    fn take(stores: &Stores, compiler: &mut PolicyCompiler) -> Snapshot {
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

/// What one pass works with.
pub struct Pass<'a> {
    pub client: &'a Client,
    pub metrics: &'a Metrics,
    pub recorder: &'a Recorder,
}

/// One pass over every node, the policies' status and finalizers, and the
/// DaemonSets that predate a pool. A write that fails is logged and tried again on
/// the next pass, without holding back the others.
async fn reconcile(
    pass: &Pass<'_>,
    stores: &Stores,
    snapshot: &Snapshot,
    limit: &Arc<RateLimit>,
    groups: &super::status::GroupStatus,
    reported: &mut Reported,
) {
    let Pass {
        client, metrics, ..
    } = *pass;
    metrics.reconciles.inc();
    let finalized = super::status::add_finalizers(pass, snapshot).await;
    let policies = &snapshot.compiled.set.only(&finalized);
    let daemonsets: BTreeSet<(String, String)> = stores
        .daemonsets
        .state()
        .iter()
        .filter_map(|d| Some((d.namespace()?, d.uid()?)))
        .collect();
    let pods: Vec<BoundPod> = stores
        .pods
        .state()
        .iter()
        .filter_map(|pod| BoundPod::from_pod(pod, &daemonsets))
        .collect();
    let mut by_node: BTreeMap<&str, Vec<&BoundPod>> = BTreeMap::new();
    for pod in &pods {
        by_node.entry(pod.node.as_str()).or_default().push(pod);
    }

    let nodes = stores.nodes.state();
    let plans: Vec<(Arc<NodeObject>, DesiredNode)> = nodes
        .iter()
        .map(|node| {
            let name = node.name_any();
            let on_node = by_node
                .get(name.as_str())
                .map(Vec::as_slice)
                .unwrap_or_default();
            let desired = desired_node_state(
                &name,
                node.labels(),
                policies,
                on_node,
                &snapshot.namespaces,
            );
            (node.clone(), desired)
        })
        .collect();

    // Owned work items: the write futures then borrow nothing from this pass.
    let work: Vec<(Arc<NodeObject>, DesiredNode)> = plans
        .iter()
        .filter(|(node, desired)| !in_sync(node, desired))
        .cloned()
        .collect();
    let results: Vec<(String, kube::Result<Written>)> = stream::iter(work)
        .map(|(node, desired)| {
            let client = client.clone();
            let limit = limit.clone();
            async move {
                limit.acquire().await;
                (node.name_any(), write_node(&client, &node, &desired).await)
            }
        })
        .buffer_unordered(WRITE_CONCURRENCY)
        .collect()
        .await;
    let mut failed = BTreeSet::new();
    for (node, result) in results {
        match result {
            Ok(written) => {
                for (kind, did) in [("labels", written.labels), ("taints", written.taints)] {
                    if did {
                        metrics
                            .node_writes
                            .get_or_create(&KindLabels { kind: kind.into() })
                            .inc();
                    }
                }
                metrics.write_conflicts.inc_by(written.conflicts as u64);
            }
            Err(e) => {
                tracing::warn!(%node, error = %e, "node write failed");
                failed.insert(node);
            }
        }
    }

    super::status::update_statuses(pass, snapshot, &plans, groups, reported).await;
    super::status::release_deleted(pass, snapshot, &nodes, &failed).await;
    bring_daemonsets_in_line(pass, stores, snapshot, limit).await;
}

/// Releases the pods held by `berth.io/rank` and `berth.io/gang` that may go (see
/// [`super::groups`]); returns the gangs held past their timeout, by policy.
async fn release_groups(
    pass: &Pass<'_>,
    stores: &Stores,
    snapshot: &Snapshot,
    pods: &[Arc<PodObject>],
    rooms: &Rooms,
    unseen: &BTreeMap<String, String>,
    reported: &mut Reported,
) -> (BTreeMap<String, Vec<String>>, Option<Duration>) {
    let held = |p: &Arc<PodObject>| GROUP_GATES.iter().any(|g| p.gate(g).is_some());
    if !pods.iter().any(held) {
        for gate in GROUP_GATES {
            pass.metrics
                .gated_pods
                .get_or_create(&GateLabels::new(gate))
                .set(0);
        }
        return (BTreeMap::new(), None);
    }
    let policies = &snapshot.compiled.set;
    let mut workloads = ranked_workloads(&stores.deployments.state(), "Deployment", snapshot);
    workloads.extend(ranked_workloads(
        &stores.statefulsets.state(),
        "StatefulSet",
        snapshot,
    ));
    let waiting_for_policy = |pod: &PodObject| unseen.contains_key(&pod.key());
    let plan = super::groups::plan(
        pods,
        &workloads,
        policies,
        &snapshot.namespaces,
        rooms,
        &waiting_for_policy,
        k8s_openapi::jiff::Timestamp::now(),
    );
    super::release::release_group_pods(pass, &plan, reported).await;
    (plan.timed_out, plan.next_timeout)
}

/// The Deployments or StatefulSets a `startOrder` policy ranks: their pod
/// template matches the policy in a namespace that opts into it, and carries a
/// rank.
fn ranked_workloads<K>(
    workloads: &[Arc<WorkloadObject<K>>],
    kind: &str,
    snapshot: &Snapshot,
) -> Vec<super::groups::RankedWorkload> {
    let policies = &snapshot.compiled.set;
    if !policies.iter().any(|p| p.spec.start_order.is_some()) {
        return Vec::new();
    }
    let mut ranked = Vec::new();
    for workload in workloads {
        let namespace = workload.metadata.namespace.clone().unwrap_or_default();
        let Some((config, labels)) = snapshot.namespaces.get(&namespace) else {
            continue;
        };
        let Ok(view) = PodView::read(&workload.template_pod()) else {
            continue;
        };
        let info = NamespaceInfo {
            name: namespace.clone(),
            labels: labels.clone(),
            annotations: Default::default(),
        };
        let matches = match_policies(&view, &info, Some(config), policies);
        let order = matches
            .applied
            .iter()
            .find_map(|(p, _)| Some((*p, p.spec.start_order.as_ref()?)));
        let Some((policy, order)) = order else {
            continue;
        };
        let Ok(Some(rank)) = order.rank(view.labels()) else {
            continue;
        };
        ranked.push(super::groups::RankedWorkload {
            namespace,
            name: format!(
                "{kind}/{}",
                workload.metadata.name.as_deref().unwrap_or_default()
            ),
            policy: policy.name.clone(),
            rank,
            desired: workload.desired(),
            ready: workload.ready(),
            rolled_out: workload.rolled_out(),
        });
    }
    ranked
}

/// Patches the templates of DaemonSets that miss a pool's toleration or exclusion.
async fn bring_daemonsets_in_line(
    pass: &Pass<'_>,
    stores: &Stores,
    snapshot: &Snapshot,
    limit: &RateLimit,
) {
    let namespaces = stores.namespaces.state();
    for daemonset in stores.daemonsets.state() {
        let Some(patch) = daemonset_patch(&daemonset, &namespaces, &snapshot.compiled.set) else {
            continue;
        };
        limit.acquire().await;
        match write_daemonset(pass.client, &daemonset, patch).await {
            Ok(()) => {
                pass.metrics.daemonset_updates.inc();
            }
            Err(e) => {
                tracing::warn!(daemonset = %daemonset.name_any(), error = %e, "DaemonSet update failed; retrying on the next pass")
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn writes_go_in_a_burst_then_at_the_rate() {
        let limit = RateLimit::new(10);
        let start = tokio::time::Instant::now();
        for _ in 0..20 {
            limit.acquire().await;
        }
        assert_eq!(
            start.elapsed(),
            Duration::ZERO,
            "a burst of two seconds' worth"
        );
        for _ in 0..10 {
            limit.acquire().await;
        }
        let elapsed = start.elapsed().as_secs_f64();
        assert!((elapsed - 1.0).abs() < 1e-3, "then 10 a second: {elapsed}");
    }
}
