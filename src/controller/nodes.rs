//! Nodes: one pass computes every node's desired berth labels and taints (a pure
//! function of the node, the policies and the pods bound there), writes the
//! differences through the rate limit, then the policies' status, finalizers, and
//! DaemonSet templates that predate a pool.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use futures::{StreamExt, stream};
use kube::ResourceExt;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use super::caches::{Snapshot, Stores};
use super::daemonsets::{daemonset_patch, write_daemonset};
use super::desired::{BoundPod, DesiredNode, desired_node_state};
use super::events::Reported;
use super::limit::RateLimit;
use super::podgroups::discover_gang_mode;
use super::run::{Context, DEBOUNCE, Pass, leadership_changed};
use super::status::GroupStatus;
use super::sweep::Sweeper;
use super::writer::{Written, in_sync, write_node};
use crate::objects::NodeObject;
use crate::placement::groups::GangMode;
use crate::policy::compile::PolicyCompiler;
use crate::telemetry::KindLabels;

/// Node writes in flight at once.
const WRITE_CONCURRENCY: usize = 4;

/// The nodes loop: a pass on every change that concerns nodes, and at each resync
/// (which also looks up the gang mode again and sweeps unused objects).
pub async fn run(
    context: Context,
    mut leadership: watch::Receiver<bool>,
    shutdown: CancellationToken,
) {
    let Context {
        client,
        metrics,
        stores,
        options,
        shared,
        ..
    } = &context;
    let mut resync = tokio::time::interval(options.resync);
    let limit = Arc::new(RateLimit::new(options.writes_per_second));
    let mut reported = Reported::default();
    let mut compiler = PolicyCompiler::default();
    let mut sweeper = Sweeper::default();
    let mut sweep = false;
    let mut pause = DEBOUNCE;
    loop {
        tokio::select! {
            () = shutdown.cancelled() => break,
            changed = leadership_changed(&mut leadership) => {
                let Some(leading) = changed else {
                    tracing::warn!("leader election stopped");
                    break;
                };
                metrics.leader.set(i64::from(leading));
                // What a sweep found unused before a gap in leadership is stale.
                sweeper = Sweeper::default();
                tracing::info!(leading, identity = %options.identity, "controller leadership changed");
            }
            () = context.wakes.nodes.notified() => tokio::time::sleep(pause).await,
            _ = resync.tick() => {
                let mode = discover_gang_mode(client, shared.gang_mode()).await;
                shared.set_gang_mode(mode);
                sweep = true;
            }
        }
        if !*leadership.borrow() {
            continue;
        }
        let started = std::time::Instant::now();
        let pass = context.pass();
        let snapshot = Snapshot::take(stores, &mut compiler);
        let groups = GroupStatus {
            gang_mode: shared.gang_mode(),
            timed_out: shared.timed_out(),
        };
        reconcile(&pass, stores, &snapshot, &limit, &groups, &mut reported).await;
        if std::mem::take(&mut sweep) {
            let pod_groups = groups.gang_mode == GangMode::PodGroup;
            sweeper
                .sweep(client, &stores.pods.state(), pod_groups)
                .await;
        }
        // Every cause of an Event was looked at in this pass, whatever failed.
        reported.end_pass();
        // Passes over a large cluster under heavy churn take a third of the time
        // at most, leaving the cores to the releases and the apiserver.
        pause = (started.elapsed() * 2).max(DEBOUNCE);
    }
}

/// One pass over every node, the policies' status and finalizers, and the
/// DaemonSets that predate a pool. A write that fails is logged and tried again on
/// the next pass, without holding back the others.
pub async fn reconcile(
    pass: &Pass<'_>,
    stores: &Stores,
    snapshot: &Snapshot,
    limit: &Arc<RateLimit>,
    groups: &GroupStatus,
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
