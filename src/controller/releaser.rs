//! The releases loop: on every change that concerns held pods, lets go those
//! that may go now (exclusion, ordered start, gangs), tells the others why they
//! wait, and hands the PodGroups gangs need in PodGroup mode to their writer
//! ([`super::podgroups`]). It runs beside the nodes loop, so that node writes
//! never delay a release. Releases and the evictions of pods that block them are
//! written by the pass itself: what it may release next depends on what its own
//! writes did (an exclusion release is recorded as soon as it lands, before the
//! watch shows it), which a queue where the latest wish wins would hide.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use kube::runtime::reflector::ObjectRef;

use super::context::{Context, Pass, Snapshot, leadership_changed};
use super::error::RETRY_FAILED;
use super::events::Reported;
use super::podgroups::PodGroups;
use super::release::{PolicyLookups, release_held_pods, report_routing_conflicts};
use super::wishes::until;
use super::writes::Kind;
use crate::cluster::{Changed, Stores};
use crate::names::GROUP_GATES;
use crate::objects::{PodObject, WorkloadObject};
use crate::placement::exclusion;
use crate::placement::groups::GangMode;
use crate::placement::matching::match_policies;
use crate::placement::rooms::{RoomCache, Rooms};

/// Changes within this window are handled in one release pass: shorter than the
/// nodes loop's, since a held pod waits for it, and a pass with nothing held is
/// only a look at each pod.
const RELEASES_BATCH: Duration = Duration::from_millis(25);

/// What this loop writes: a failure of one, and of nothing the nodes loop
/// writes, is retried by its next pass.
const RELEASES_WRITE: [Kind; 2] = [Kind::Release, Kind::Eviction];

/// The releases loop; see the module.
pub async fn run(
    context: Context,
    pod_groups: PodGroups,
    mut leadership: watch::Receiver<bool>,
    shutdown: CancellationToken,
) {
    let Context {
        client,
        options,
        shared,
        cluster,
        ..
    } = &context;
    let (stores, wakes) = (&cluster.stores, &cluster.wakes);
    let mut resync = tokio::time::interval(options.resync);
    let mut reported = Reported::default();
    let mut released = exclusion::Released::default();
    let mut lookups = PolicyLookups::default();
    let mut room_cache = RoomCache::default();
    let no_rooms = Rooms::new();
    let mut wake_at: Option<tokio::time::Instant> = None;
    loop {
        tokio::select! {
            () = shutdown.cancelled() => break,
            changed = leadership_changed(&mut leadership) => {
                if changed.is_none() {
                    break;
                }
                context.pod_group_writes.clear();
            }
            () = wakes.releases.notified() => tokio::time::sleep(RELEASES_BATCH).await,
            // A held gang reaches its timeoutSeconds (reported on time), or a
            // ranked pod has waited long enough for lower ranks to show.
            () = until(wake_at) => wake_at = None,
            _ = resync.tick() => pod_groups.forget(),
        }
        if !*leadership.borrow() {
            continue;
        }
        context.metrics.release_passes.inc();
        let failures = context.writes.failures(&RELEASES_WRITE);
        let pass = context.pass();
        // The policies are read after the pods, never before: a policy the webhook
        // applied to a pod in the cache must not look deleted because the snapshot
        // predates it (that would release every pod of it at once).
        let pods = stores.pods.state();
        let snapshot = Snapshot::take(cluster);
        // Read after the pods: every pod they hold is in the index (one let go since
        // is no longer gated, and a release tests its gate).
        let missing = stores.pods_by_node.held_naming(|name| !snapshot.has(name));
        let unseen = lookups.waits(client, &missing).await;
        // Where held pods would fit: kept up to date only while some pod is held
        // (until then, what changed gathers and is taken at once).
        let rooms = if !pods.iter().any(|p| p.held_by_berth()) {
            &no_rooms
        } else {
            update_rooms(&mut room_cache, wakes.take_for_rooms(), stores);
            room_cache.rooms()
        };
        release_held_pods(
            &pass,
            &snapshot,
            &pods,
            rooms,
            &unseen,
            &mut released,
            &mut reported,
        )
        .await;
        report_routing_conflicts(&pass, &snapshot, &pods, &mut reported);
        let (timed_out, wake_after) = release_groups(
            &pass,
            stores,
            &snapshot,
            &pods,
            rooms,
            &unseen,
            &mut reported,
        )
        .await;
        // A write that failed (a release, an eviction) is tried again
        // soon, whatever else wakes the loop.
        let retry = (context.writes.failures(&RELEASES_WRITE) > failures).then_some(RETRY_FAILED);
        wake_at = wake_after
            .into_iter()
            .chain(retry)
            .min()
            .map(|d| tokio::time::Instant::now() + d);
        if shared.set_timed_out(timed_out) {
            // The policies' status reports timed-out gangs.
            wakes.status();
        }
        if cluster.groups().gang_mode == GangMode::PodGroup {
            pod_groups.keep(&pass, &pods, &snapshot);
        }
        reported.end_pass();
    }
}

/// Brings the room on nodes up to date with what changed since the last look.
fn update_rooms(cache: &mut RoomCache, changed: Changed, stores: &Stores) {
    match changed {
        Changed::Everything => {
            let pods = stores.pods.state();
            cache.rebuild(&stores.nodes.state(), pods.iter().map(|p| p.as_ref()));
        }
        Changed::Nodes(names) => {
            for name in names {
                let node = stores.nodes.get(&ObjectRef::new(&name));
                let pods = stores.pods_on(&name);
                cache.refresh(&name, node.as_deref(), pods.iter().map(|p| p.as_ref()));
            }
        }
    }
}

/// Releases the pods held by `berth.io/rank` and `berth.io/gang` that may go (see
/// [`crate::placement::group_plan`]); returns the gangs held past their timeout, by policy,
/// and how soon time alone changes what may go.
#[tracing::instrument(name = "group release pass", skip_all)]
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
        let now = k8s_openapi::jiff::Timestamp::now();
        for gate in GROUP_GATES {
            pass.metrics.set_held(gate, std::iter::empty(), now);
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
    let plan = crate::placement::group_plan::plan(
        pods,
        &workloads,
        policies,
        &*snapshot.namespaces,
        rooms,
        &waiting_for_policy,
        k8s_openapi::jiff::Timestamp::now(),
    );
    super::release::release_group_pods(pass, &plan, reported).await;
    (plan.timed_out, plan.wake_after)
}

/// The Deployments or StatefulSets a `startOrder` policy ranks: their pod
/// template matches the policy in a namespace that opts into it, and carries a
/// rank.
fn ranked_workloads<K>(
    workloads: &[Arc<WorkloadObject<K>>],
    kind: &str,
    snapshot: &Snapshot,
) -> Vec<crate::placement::group_plan::RankedWorkload> {
    let policies = &snapshot.compiled.set;
    if !policies.iter().any(|p| p.spec.start_order.is_some()) {
        return Vec::new();
    }
    let mut ranked = Vec::new();
    for workload in workloads {
        let namespace = workload.metadata.namespace.clone().unwrap_or_default();
        let Some(info) = snapshot.namespaces.get(&namespace) else {
            continue;
        };
        let view = &workload.spec.template;
        let matches = match_policies(view, info, Some(info.config_or_none()), policies);
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
        ranked.push(crate::placement::group_plan::RankedWorkload {
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
