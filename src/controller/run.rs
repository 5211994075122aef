//! The controller loop. Watches on PlacementPolicies, Nodes, Namespaces and Pods
//! feed in-memory stores; any change (and a periodic resync) wakes one pass that
//! releases the held pods that may go (see [`super::exclusion`]), then computes
//! every node's desired state and writes the differences. Only the replica holding
//! the Lease writes, and only once every store holds a full list.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use futures::{StreamExt, stream};
use k8s_openapi::api::core::v1::{Namespace, Node, Pod};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use kube::runtime::reflector::{self, Store, reflector};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Client, Resource, ResourceExt};
use serde_json::{Value, json};
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use super::desired::{
    BoundPod, DesiredNode, NamespaceOptIn, applied_policies, desired_node_state, is_live,
};
use super::exclusion::{self, ExclusionPod};
use super::writer::{Written, in_sync, write_node};
use crate::names::{APPLIED_ANNOTATION, AVOID_GATE};
use crate::policy::crd::PlacementPolicyStatus;
use crate::policy::{PlacementPolicy, PolicySet};
use crate::telemetry::{KindLabels, Metrics, PolicyLabels};

/// The finalizer that lets berth clean a deleted policy's labels and taints.
pub const FINALIZER: &str = "berth.io/cleanup";
/// Node writes in flight at once.
const WRITE_CONCURRENCY: usize = 4;
/// Changes within this window are handled in one pass.
const DEBOUNCE: Duration = Duration::from_millis(100);
/// The window instead, while held pods wait behind a pod released a moment ago:
/// pods that must avoid each other are placed one after the other, and each
/// would otherwise wait a full window for the binding of the one before it.
const HURRIED_DEBOUNCE: Duration = Duration::from_millis(10);
/// How long after its release a pod's binding counts as a moment away.
const HURRY_WINDOW: Duration = Duration::from_secs(5);

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

struct Stores {
    policies: Store<PlacementPolicy>,
    nodes: Store<Node>,
    namespaces: Store<Namespace>,
    /// Every pod, stripped: bound ones for anchors and entitlement, unbound ones for
    /// exclusion. One watch, so a pod moves from unbound to bound in one event and
    /// is never, between two watches, in neither.
    pods: Store<Pod>,
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
fn strip_pod(pod: &mut Pod) {
    pod.metadata.managed_fields = None;
    let annotations = pod.metadata.annotations.take().unwrap_or_default();
    let applied: BTreeMap<String, String> = annotations
        .into_iter()
        .filter(|(k, _)| k == APPLIED_ANNOTATION)
        .collect();
    pod.metadata.annotations = (!applied.is_empty()).then_some(applied);
    if let Some(spec) = pod.spec.as_mut() {
        let gated = spec
            .scheduling_gates
            .as_ref()
            .is_some_and(|g| !g.is_empty());
        *spec = k8s_openapi::api::core::v1::PodSpec {
            node_name: spec.node_name.take(),
            // A held pod's node affinity is narrowed when it is released.
            affinity: if gated { spec.affinity.take() } else { None },
            scheduling_gates: spec.scheduling_gates.take(),
            ..Default::default()
        };
    }
    if let Some(status) = pod.status.as_mut() {
        *status = k8s_openapi::api::core::v1::PodStatus {
            phase: status.phase.take(),
            ..Default::default()
        };
    }
}

fn strip_managed_fields<K: Resource>(object: &mut K) {
    object.meta_mut().managed_fields = None;
}

/// At most `n` node writes a second, spread evenly.
struct RateLimit(tokio::sync::Mutex<tokio::time::Interval>);

impl RateLimit {
    fn new(per_second: u32) -> Self {
        let period = Duration::from_secs(1) / per_second.max(1);
        let mut interval = tokio::time::interval(period);
        interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        RateLimit(tokio::sync::Mutex::new(interval))
    }

    async fn acquire(&self) {
        self.0.lock().await.tick().await;
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
        policies: watch(&client, &wake, strip_managed_fields),
        nodes: watch(&client, &wake, strip_managed_fields),
        namespaces: watch(&client, &wake, strip_managed_fields),
        pods: watch(&client, &wake, strip_pod),
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
    let mut reported: BTreeSet<String> = BTreeSet::new();
    let mut released = exclusion::Released::default();
    let mut debounce = DEBOUNCE;
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
                tracing::info!(leading, identity = %options.identity, "controller leadership changed");
            }
            () = wake.notified() => tokio::time::sleep(debounce).await,
            _ = resync.tick() => {}
        }
        if !*leadership.borrow() {
            continue;
        }
        let pass = Pass {
            client: &client,
            stores: &stores,
            metrics: &metrics,
            recorder: &recorder,
        };
        // Releases first: they do not depend on the node labels (a released pod
        // carries its own constraints), and every pod of an exclusion group waits
        // for the one before it, so its pass should not wait for node writes.
        let hurry = release_held_pods(&pass, &mut reported, &mut released).await;
        debounce = if hurry { HURRIED_DEBOUNCE } else { DEBOUNCE };
        if let Err(e) = reconcile(&pass, &limit, &mut reported).await {
            tracing::warn!(error = %e, "reconcile pass failed; retrying on the next change");
        }
    }
    // Dropping the receiver makes the lease task release the Lease.
    drop(leadership);
    metrics.leader.set(0);
    let _ = tokio::time::timeout(Duration::from_secs(5), lease_task).await;
}

/// Policies and namespaces as the caches hold them at one instant.
struct Snapshot {
    /// Every cached policy, deleted ones included (the finalizer needs them).
    all: Vec<Arc<PlacementPolicy>>,
    /// The usable live policies: deleted ones count as gone.
    policies: PolicySet,
    namespaces: NamespaceOptIn,
}

impl Snapshot {
    fn take(stores: &Stores) -> Snapshot {
        let all = stores.policies.state();
        let live = all
            .iter()
            .map(|p| p.as_ref())
            .filter(|p| p.meta().deletion_timestamp.is_none());
        let (policies, errors) = PolicySet::compile(live);
        for error in &errors {
            tracing::debug!(%error, "policy ignored");
        }
        let namespaces =
            NamespaceOptIn::new(stores.namespaces.state().iter().map(|ns| ns.as_ref()));
        Snapshot {
            all,
            policies,
            namespaces,
        }
    }

    fn has(&self, policy: &str) -> bool {
        self.all.iter().any(|p| p.name_any() == policy)
    }
}

/// What one pass works with.
struct Pass<'a> {
    client: &'a Client,
    stores: &'a Stores,
    metrics: &'a Metrics,
    recorder: &'a Recorder,
}

async fn reconcile(
    pass: &Pass<'_>,
    limit: &Arc<RateLimit>,
    reported: &mut BTreeSet<String>,
) -> kube::Result<()> {
    let Pass {
        client,
        stores,
        metrics,
        recorder,
    } = *pass;
    metrics.reconciles.inc();
    let Snapshot {
        all: all_policies,
        policies,
        namespaces,
    } = Snapshot::take(stores);
    let api: Api<PlacementPolicy> = Api::all(client.clone());
    // Live policies get the finalizer before they have any effect on nodes.
    for policy in all_policies
        .iter()
        .filter(|p| p.meta().deletion_timestamp.is_none())
    {
        if !policy.finalizers().iter().any(|f| f == FINALIZER) {
            let mut finalizers = policy.finalizers().to_vec();
            finalizers.push(FINALIZER.into());
            let patch = json!({"metadata": {"finalizers": finalizers, "resourceVersion": policy.resource_version()}});
            api.patch(
                &policy.name_any(),
                &PatchParams::default(),
                &Patch::Merge(&patch),
            )
            .await?;
        }
    }
    // Deleted policies count as gone: their labels and taints are removed.
    let live: Vec<&PlacementPolicy> = all_policies
        .iter()
        .map(|p| p.as_ref())
        .filter(|p| p.meta().deletion_timestamp.is_none())
        .collect();
    let pods: Vec<BoundPod> = stores
        .pods
        .state()
        .iter()
        .filter_map(|pod| bound_pod(pod))
        .collect();
    let mut by_node: BTreeMap<&str, Vec<&BoundPod>> = BTreeMap::new();
    for pod in &pods {
        by_node.entry(pod.node.as_str()).or_default().push(pod);
    }

    let nodes = stores.nodes.state();
    let plans: Vec<(Arc<Node>, DesiredNode)> = nodes
        .iter()
        .map(|node| {
            let name = node.name_any();
            let on_node = by_node
                .get(name.as_str())
                .map(Vec::as_slice)
                .unwrap_or_default();
            let desired = desired_node_state(&name, node.labels(), &policies, on_node, &namespaces);
            (node.clone(), desired)
        })
        .collect();

    // Owned work items: the write futures then borrow nothing from this pass.
    let work: Vec<(Arc<Node>, DesiredNode)> = plans
        .iter()
        .filter(|(node, desired)| !in_sync(node, desired))
        .cloned()
        .collect();
    let results: Vec<kube::Result<Written>> = stream::iter(work)
        .map(|(node, desired)| {
            let client = client.clone();
            let limit = limit.clone();
            async move {
                limit.acquire().await;
                write_node(&client, &node, &desired).await
            }
        })
        .buffer_unordered(WRITE_CONCURRENCY)
        .collect()
        .await;
    for written in results.iter().flatten() {
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
    let all_written = results.iter().all(Result::is_ok);
    for e in results.into_iter().filter_map(Result::err) {
        tracing::warn!(error = %e, "node write failed");
    }

    for policy in live {
        update_status(&api, policy, &plans, metrics, recorder, reported).await?;
    }
    // Once every node is clean, deleted policies may go.
    if all_written {
        for policy in all_policies
            .iter()
            .filter(|p| p.meta().deletion_timestamp.is_some())
        {
            let finalizers: Vec<&String> = policy
                .finalizers()
                .iter()
                .filter(|f| *f != FINALIZER)
                .collect();
            if finalizers.len() != policy.finalizers().len() {
                let patch = json!({"metadata": {"finalizers": finalizers, "resourceVersion": policy.resource_version()}});
                api.patch(
                    &policy.name_any(),
                    &PatchParams::default(),
                    &Patch::Merge(&patch),
                )
                .await?;
            }
        }
    }
    Ok(())
}

/// The JSON Patch that releases a held pod: the gate must still be where we saw it
/// (so a stale cache cannot remove another gate), every required term is narrowed
/// to keep off `avoid_nodes`, and the gate goes, in one update.
fn release_patch(release: &exclusion::Release, gate: usize) -> Value {
    let mut ops = vec![
        json!({"op": "test", "path": format!("/spec/schedulingGates/{gate}/name"), "value": AVOID_GATE}),
    ];
    if !release.avoid_nodes.is_empty() {
        // A node field selector takes one value, so one NotIn per node, ANDed.
        let keep_off: Vec<Value> = release
            .avoid_nodes
            .iter()
            .map(|node| json!({"key": "metadata.name", "operator": "NotIn", "values": [node]}))
            .collect();
        let terms = "/spec/affinity/nodeAffinity/requiredDuringSchedulingIgnoredDuringExecution/nodeSelectorTerms";
        for (i, has_fields) in release.pod.terms.iter().enumerate() {
            if *has_fields {
                for entry in &keep_off {
                    ops.push(json!({"op": "add", "path": format!("{terms}/{i}/matchFields/-"), "value": entry}));
                }
            } else {
                ops.push(json!({"op": "add", "path": format!("{terms}/{i}/matchFields"), "value": keep_off}));
            }
        }
    }
    ops.push(json!({"op": "remove", "path": format!("/spec/schedulingGates/{gate}")}));
    Value::Array(ops)
}

/// Policies held pods were admitted with that `snapshot` does not hold. The
/// webhook's and the controller's watches lag independently, so a pod may name a
/// policy created a moment ago; one GET tells that apart from a deleted policy.
async fn unseen_policies(
    client: &Client,
    snapshot: &Snapshot,
    pods: &[ExclusionPod],
) -> BTreeSet<String> {
    let missing: BTreeSet<&String> = pods
        .iter()
        .filter(|p| p.gate.is_some())
        .flat_map(|p| &p.applied)
        .filter(|name| !snapshot.has(name))
        .collect();
    let api: Api<PlacementPolicy> = Api::all(client.clone());
    let mut unseen = BTreeSet::new();
    for name in missing {
        match api.get_opt(name).await {
            Ok(None) => {}
            Ok(Some(_)) => {
                unseen.insert(name.clone());
            }
            Err(e) => {
                // Unknown either way: keep the pod held, the next pass asks again.
                tracing::warn!(policy = %name, error = %e, "cannot look up policy");
                unseen.insert(name.clone());
            }
        }
    }
    unseen
}

/// Releases the held pods that may go now (see [`super::exclusion`]) and tells the
/// others, with an Event, which pod they wait for. True when the next pass should
/// come quickly: a held pod waits behind a pod released a moment ago.
async fn release_held_pods(
    pass: &Pass<'_>,
    reported: &mut BTreeSet<String>,
    released: &mut exclusion::Released,
) -> bool {
    let Pass {
        client,
        stores,
        metrics,
        recorder,
    } = *pass;
    let mut all: Vec<ExclusionPod> = stores
        .pods
        .state()
        .iter()
        .filter_map(|p| ExclusionPod::from_pod(p))
        .collect();
    released.overlay(&mut all);
    // The policies are read after the pods, never before: a policy the webhook
    // applied to a pod in the cache must not look deleted because the snapshot
    // predates it (that would release every pod of it at once).
    let snapshot = Snapshot::take(stores);
    let unseen = unseen_policies(client, &snapshot, &all).await;
    let plan = exclusion::plan(&all, &snapshot.policies, &snapshot.namespaces, &unseen);
    metrics
        .gated_pods
        .set((all.iter().filter(|p| p.gate.is_some()).count() - plan.release.len()) as i64);
    for release in &plan.release {
        let pod = release.pod;
        let Some(gate) = pod.gate else { continue };
        if pod.terms.is_empty() && !release.avoid_nodes.is_empty() {
            // berth gives every avoid pod a required term; without one there is
            // nothing to narrow, and the anchor labels must do.
            tracing::warn!(pod = %pod.name, "held pod has no required node affinity to narrow");
        }
        let api: Api<Pod> = Api::namespaced(client.clone(), &pod.namespace);
        let patch: json_patch::Patch = match serde_json::from_value(release_patch(release, gate)) {
            Ok(patch) => patch,
            Err(_) => continue,
        };
        match api
            .patch(
                &pod.name,
                &PatchParams::default(),
                &Patch::<()>::Json(patch),
            )
            .await
        {
            Ok(_) => {
                released.record(pod, std::time::Instant::now());
                let held_for = pod
                    .created
                    .as_ref()
                    .map(|t| {
                        (k8s_openapi::jiff::Timestamp::now() - t.0).get_milliseconds() as f64
                            / 1000.0
                    })
                    .unwrap_or_default();
                metrics.gated_seconds.observe(held_for.max(0.0));
                tracing::info!(pod = %pod.name, namespace = %pod.namespace, keep_off = ?release.avoid_nodes, "released from {AVOID_GATE}");
            }
            Err(e) => {
                tracing::warn!(pod = %pod.name, error = %e, "release failed; retrying on the next pass")
            }
        }
    }
    for waiting in &plan.waiting {
        // A policy not seen yet is a moment's lag, not worth an Event.
        let exclusion::Hold::Behind {
            pod: behind,
            policy,
        } = &waiting.reason
        else {
            continue;
        };
        // One event per held pod and policy: repeated events are folded into a
        // series by the recorder, so the note must not name a blocker that changes.
        let key = format!(
            "held/{}/{}/{policy}",
            waiting.pod.namespace, waiting.pod.name
        );
        if !reported.insert(key) {
            continue;
        }
        let reference = k8s_openapi::api::core::v1::ObjectReference {
            api_version: Some("v1".into()),
            kind: Some("Pod".into()),
            namespace: Some(waiting.pod.namespace.clone()),
            name: Some(waiting.pod.name.clone()),
            uid: waiting.pod.uid.clone(),
            ..Default::default()
        };
        let event = Event {
            type_: EventType::Normal,
            reason: "HeldForExclusion".into(),
            note: Some(format!(
                "held by {AVOID_GATE}: a pod it must avoid (policy {policy}, first {}/{}) is still being placed; \
                 it is released once that pod is bound",
                behind.namespace, behind.name
            )),
            action: "Hold".into(),
            secondary: None,
        };
        if let Err(e) = recorder.publish(&event, &reference).await {
            tracing::warn!(error = %e, "cannot publish event");
        }
    }
    released.hurry(&plan, std::time::Instant::now(), HURRY_WINDOW)
}

fn bound_pod(pod: &Pod) -> Option<BoundPod> {
    let node = pod.spec.as_ref()?.node_name.clone()?;
    if !is_live(pod) {
        return None;
    }
    Some(BoundPod {
        namespace: pod.namespace().unwrap_or_default(),
        name: pod.name_any(),
        node,
        labels: pod.labels().clone(),
        applied: applied_policies(pod),
        daemonset: pod
            .owner_references()
            .iter()
            .any(|o| o.kind == "DaemonSet" && o.controller == Some(true)),
    })
}

fn condition(
    type_: &str,
    status: bool,
    reason: &str,
    message: String,
    previous: &[Condition],
) -> Condition {
    let status = if status { "True" } else { "False" };
    // The transition time moves only when the status does.
    let last_transition_time = previous
        .iter()
        .find(|c| c.type_ == type_ && c.status == status)
        .map(|c| c.last_transition_time.clone())
        .unwrap_or_else(|| Time(k8s_openapi::jiff::Timestamp::now()));
    Condition {
        type_: type_.into(),
        status: status.into(),
        reason: reason.into(),
        message,
        last_transition_time,
        observed_generation: None,
    }
}

/// Writes a policy's status when it changed; Events for new conflicts and pods
/// without entitlement.
async fn update_status(
    api: &Api<PlacementPolicy>,
    policy: &PlacementPolicy,
    plans: &[(Arc<Node>, DesiredNode)],
    metrics: &Metrics,
    recorder: &Recorder,
    reported: &mut BTreeSet<String>,
) -> kube::Result<()> {
    let name = policy.name_any();
    let owned: Vec<&DesiredNode> = plans
        .iter()
        .map(|(_, d)| d)
        .filter(|d| d.labels.get(crate::names::POOL_LABEL) == Some(&name))
        .collect();
    let lost: Vec<String> = plans
        .iter()
        .filter(|(_, d)| d.losing_claims.contains(&name))
        .map(|(n, _)| n.name_any())
        .collect();
    let unentitled: Vec<&(String, String)> =
        owned.iter().flat_map(|d| d.unentitled.iter()).collect();
    metrics
        .unentitled_pods
        .get_or_create(&PolicyLabels {
            policy: name.clone(),
        })
        .set(unentitled.len() as i64);

    let previous = policy
        .status
        .as_ref()
        .map(|s| s.conditions.as_slice())
        .unwrap_or_default();
    let conflict_message = if lost.is_empty() {
        "no node of this pool is claimed by an older policy".to_string()
    } else {
        format!("nodes claimed by an older policy: {}", lost.join(", "))
    };
    let unentitled_message = if unentitled.is_empty() {
        "every pod on this pool's nodes is entitled".to_string()
    } else {
        let names: Vec<String> = unentitled
            .iter()
            .map(|(ns, p)| format!("{ns}/{p}"))
            .collect();
        format!(
            "pods without entitlement on pool nodes: {}",
            names.join(", ")
        )
    };
    let status = PlacementPolicyStatus {
        nodes: Some(owned.len() as i32),
        conditions: vec![
            condition(
                "Ready",
                true,
                "Reconciled",
                "the controller keeps this policy's nodes".into(),
                previous,
            ),
            condition(
                "Conflict",
                !lost.is_empty(),
                "PoolConflict",
                conflict_message,
                previous,
            ),
            condition(
                "UnentitledPods",
                !unentitled.is_empty(),
                "UnentitledPods",
                unentitled_message,
                previous,
            ),
        ],
    };
    if policy.status.as_ref() != Some(&status) {
        let patch = json!({"status": status});
        api.patch_status(&name, &PatchParams::default(), &Patch::Merge(&patch))
            .await?;
    }

    let reference = policy.object_ref(&());
    let mut events = Vec::new();
    for node in &lost {
        events.push((
            format!("conflict/{name}/{node}"),
            "PoolConflict",
            format!("node {node} belongs to an older policy's pool"),
        ));
    }
    for (ns, pod) in unentitled {
        events.push((
            format!("unentitled/{name}/{ns}/{pod}"),
            "UnentitledPod",
            format!("pod {ns}/{pod} runs on pool {name} without entitlement"),
        ));
    }
    for (key, reason, note) in events {
        if reported.insert(key) {
            let event = Event {
                type_: EventType::Warning,
                reason: reason.into(),
                note: Some(note),
                action: "Reconcile".into(),
                secondary: None,
            };
            if let Err(e) = recorder.publish(&event, &reference).await {
                tracing::warn!(error = %e, "cannot publish event");
            }
        }
    }
    Ok(())
}
