//! Nodes: a pass computes the desired berth labels and taints (a pure function of
//! the node, the policies and the pods bound there) of the nodes that changed, or
//! of every node when something they all depend on did, and hands the differences
//! to the node writer ([`super::node_writer`]); then it works out the policies'
//! status and which deleted ones may go, for the policy writer
//! ([`super::policy_writer`]), and, on passes over everything, the DaemonSet
//! templates that predate a pool, for the DaemonSet writer
//! ([`super::daemonsets`]), and the queue PriorityClasses to make, for the
//! PriorityClass writer ([`super::queues`]); at each resync the sweep hands the
//! objects berth no longer needs to the sweep writer ([`super::sweep`]). Each
//! writer writes on its own, so a pass waits for none of those writes.
//!
//! A pass makes two kinds of write itself, because what it does next depends on
//! how they end: a new policy's finalizer, which the policy's node work waits for
//! ([`super::policy_writer`]), and the missed scan's evictions, whose probe of each
//! owner must know that its one pod went before the others may
//! ([`super::missed`]). A pod bound or deleted costs its node, not the cluster;
//! and the policies' status is worked out again only for the policies that node
//! concerns, each from its own nodes' last desired state, kept from pass to pass
//! ([`super::status::Statuses`]).

use std::sync::Arc;
use std::time::Duration;

use kube::ResourceExt;
use kube::runtime::reflector::ObjectRef;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use super::context::{Context, Pass, Snapshot, leadership_changed};
use super::daemonsets::daemonset_patch;
use super::error::RETRY_FAILED;
use super::missed::Missed;
use super::queues::{self, QueueClasses};
use super::status::{Findings, Statuses};
use super::sweep::Sweeper;
use super::wishes::until;
use super::writer::in_sync;
use super::writes::Kind;
use crate::cluster::{Changed, Stores};
use crate::objects::NodeObject;
use crate::placement::desired::{BoundPod, DesiredNodes, desired_node_state};
use crate::placement::groups::GangMode;
use crate::policy::OptIn;

/// Changes within this window are handled in one nodes pass (or twice the last
/// pass, if that was longer).
const NODES_BATCH: Duration = Duration::from_millis(100);

/// What a pass writes itself and retries: a new policy's finalizer, by a pass over
/// everything [`RETRY_FAILED`] after it failed. (The missed scan retries its
/// evictions by its rescan, as soon; every other kind is a writer's, which hands a
/// failed write back.)
const RETRIED_BY_EVERYTHING: [Kind; 1] = [Kind::Finalizer];

/// The nodes loop: a pass on every change that concerns nodes, and at each resync
/// (which also looks up the gang mode again and sweeps unused objects).
/// `queue_classes` is shared with the PriorityClass writer.
pub async fn run(
    context: Context,
    queue_classes: QueueClasses,
    mut leadership: watch::Receiver<bool>,
    shutdown: CancellationToken,
) {
    let Context {
        client,
        metrics,
        options,
        shared,
        cluster,
        ..
    } = &context;
    let stores = &cluster.stores;
    let mut resync = tokio::time::interval(options.resync);
    let mut statuses = Statuses::default();
    let mut sweeper = Sweeper::default();
    let mut sweep = false;
    let mut pause = NODES_BATCH;
    let mut desired = DesiredNodes::new();
    let mut retry: Option<tokio::time::Instant> = None;
    // Pods the policies missed are looked for on full passes, and again soon
    // while evicting them.
    let mut missed = Missed::default();
    let mut rescan: Option<tokio::time::Instant> = None;
    let mut scan = false;
    let wakes = &cluster.wakes;
    loop {
        tokio::select! {
            () = shutdown.cancelled() => break,
            changed = leadership_changed(&mut leadership) => {
                let Some(leading) = changed else {
                    tracing::warn!("leader election stopped");
                    break;
                };
                metrics.leader.set(i64::from(leading));
                // What a sweep found unused before a gap in leadership is stale,
                // and so is what this replica last knew of each node.
                sweeper = Sweeper::default();
                queue_classes.forget();
                missed = Missed::default();
                context.node_writes.clear();
                context.policy_writes.clear();
                context.daemonset_writes.clear();
                context.class_writes.clear();
                context.sweep_writes.clear();
                wakes.everything();
                tracing::info!(leading, identity = %options.identity, "controller leadership changed");
            }
            () = wakes.nodes.notified() => tokio::time::sleep(pause).await,
            () = until(retry) => {
                retry = None;
                // A finalizer could not be added: looked at on passes over
                // everything.
                wakes.everything();
            }
            () = until(rescan) => {
                rescan = None;
                scan = true;
            }
            _ = resync.tick() => {
                sweep = true;
                queue_classes.forget();
                wakes.everything();
            }
        }
        if !*leadership.borrow() {
            continue;
        }
        let started = std::time::Instant::now();
        // What changed and the state it changed are taken in one look at the model:
        // a change published after this is in the next pass, one published before
        // is in this one and leaves no wake behind.
        let publishing = wakes.publishing();
        let changed = wakes.take();
        let status = wakes.take_status();
        if changed.is_nothing() && !status && !scan && !sweep {
            continue;
        }
        let snapshot = Snapshot::take(cluster);
        drop(publishing);
        let failures = context.writes.failures(&RETRIED_BY_EVERYTHING);
        let pass = context.pass();
        let wanted_classes = queues::wanted(&snapshot.compiled.set);
        if matches!(changed, Changed::Everything) {
            queue_classes.keep(pass.class_writes, &wanted_classes);
        }
        if std::mem::take(&mut scan) || matches!(changed, Changed::Everything) {
            let again = missed.scan(&pass, stores, &snapshot).await;
            rescan = again.map(|after| tokio::time::Instant::now() + after);
        }
        let groups = Findings {
            gang_mode: cluster.groups().gang_mode,
            timed_out: shared.timed_out(),
            missed: missed.by_policy.clone(),
        };
        if status {
            // A gang timed out, or a status write failed.
            statuses.all();
        }
        reconcile(
            &pass,
            stores,
            &snapshot,
            &groups,
            &mut statuses,
            changed,
            &mut desired,
        )
        .await;
        if context.writes.failures(&RETRIED_BY_EVERYTHING) > failures {
            retry = Some(tokio::time::Instant::now() + RETRY_FAILED);
        }
        if std::mem::take(&mut sweep) {
            let pod_groups = groups.gang_mode == GangMode::PodGroup;
            let opt_in = (
                &*snapshot.compiled.set,
                &*snapshot.namespaces as &(dyn OptIn + Sync),
            );
            sweeper
                .sweep(
                    pass.sweep_writes,
                    client,
                    &stores.pods.state(),
                    pod_groups,
                    &wanted_classes,
                    opt_in,
                )
                .await;
        }
        // Passes over a large cluster under heavy churn take a third of the time
        // at most, leaving the cores to the releases and the apiserver.
        pause = (started.elapsed() * 2).max(NODES_BATCH);
    }
}

/// One pass over the nodes that `changed`, the policies' status and finalizers,
/// and the DaemonSets that predate a pool; `desired` holds every node's desired
/// state from pass to pass. What differs from what it should be goes to its
/// writer.
#[tracing::instrument(name = "nodes pass", skip_all, fields(everything = changed == Changed::Everything))]
pub async fn reconcile(
    pass: &Pass<'_>,
    stores: &Stores,
    snapshot: &Snapshot,
    groups: &Findings,
    statuses: &mut Statuses,
    changed: Changed,
    desired: &mut DesiredNodes,
) {
    pass.metrics.reconciles.inc();
    let finalized = super::status::add_finalizers(pass, snapshot).await;
    let policies = &snapshot.compiled.set.only(&finalized);
    let daemonsets = &*snapshot.daemonsets;
    // DaemonSet templates depend only on the policies, the namespaces and the
    // DaemonSets, whose changes (and a resync) are changes of everything.
    let templates = changed == Changed::Everything;
    let nodes: Vec<Arc<NodeObject>> = match changed {
        Changed::Everything => {
            let nodes = stores.nodes.state();
            desired.clear();
            statuses.everything();
            nodes
        }
        Changed::Nodes(names) => names
            .into_iter()
            .filter_map(|name| {
                let node = stores.nodes.get(&ObjectRef::new(&name));
                if node.is_none() {
                    statuses.node(&name, desired.remove(&name).as_ref(), None);
                    pass.node_writes.settled(&name);
                }
                node
            })
            .collect(),
    };
    for node in &nodes {
        let name = node.name_any();
        let pods: Vec<BoundPod> = stores
            .pods_on(&name)
            .iter()
            .filter_map(|pod| BoundPod::from_pod(pod, daemonsets))
            .collect();
        let on_node: Vec<&BoundPod> = pods.iter().collect();
        let state = desired_node_state(
            &name,
            node.labels(),
            policies,
            &on_node,
            &*snapshot.namespaces,
        );
        // A node that carries what it should takes back any older wish not yet
        // taken, so that the writer does not start a write that no longer holds
        // (one already on its way lands; the watch shows it, and a pass then
        // corrects it).
        if in_sync(node, &state) {
            pass.node_writes.settled(&name);
        } else {
            pass.node_writes.want(name.clone(), state.clone());
        }
        statuses.node(&name, desired.get(&name), Some(&state));
        desired.insert(name, state);
    }

    statuses.update(pass, snapshot, desired, groups);
    super::status::release_deleted(pass, snapshot, stores);
    if templates {
        bring_daemonsets_in_line(pass, stores, snapshot);
    }
}

/// Hands the DaemonSets whose templates miss a pool's toleration or exclusion to
/// the DaemonSet writer.
fn bring_daemonsets_in_line(pass: &Pass<'_>, stores: &Stores, snapshot: &Snapshot) {
    let namespaces = stores.namespaces.state();
    for daemonset in stores.daemonsets.state() {
        let drifts = daemonset_patch(
            &daemonset,
            &namespaces,
            &snapshot.compiled.set,
            &pass.options.exempt,
        )
        .is_some();
        let key = ObjectRef::from_obj(&*daemonset);
        if drifts {
            pass.daemonset_writes.want(key, ());
        } else {
            pass.daemonset_writes.settled(&key);
        }
    }
}
