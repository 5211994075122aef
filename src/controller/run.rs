//! The controller. The cluster model ([`crate::cluster`]) keeps the caches; two loops,
//! each woken by the changes that concern it and by a periodic resync, act on
//! them while this replica holds the Lease, and only once every cache holds a
//! full list:
//!
//! - the **releases** ([`super::releaser`]): held pods that may go now, for
//!   exclusion ([`crate::placement::exclusion`]) and groups ([`crate::placement::group_plan`]);
//! - the **nodes** ([`super::nodes`]): every node's berth labels and taints, the
//!   policies' status and finalizers, DaemonSet templates, the queue
//!   PriorityClasses, the pods the policies missed, and the sweep of unused
//!   objects;
//!
//! and a writer task for each kind of write a loop hands over ([`super::wishes`]):
//! nodes ([`super::node_writer`]), policies' status and deleted policies'
//! finalizers ([`super::policy_writer`]), DaemonSet templates
//! ([`super::daemonsets`]), queue PriorityClasses ([`super::queues`]) and the
//! sweep's deletes ([`super::sweep`]) for the nodes loop, and the PodGroups
//! ([`super::podgroups`]) for the releases loop; and the StaticPlacement writer
//! ([`super::static_placement`]), a task that looks on its own at the policies
//! and the namespaces. They run side by side, so that
//! node writes (a new pool over a thousand nodes takes seconds at the write rate)
//! delay neither a release nor a policy's status, and a burst of releases never
//! delays a node.
//!
//! The loops still make three kinds of write themselves, each because what the
//! loop does next depends on how that write ended: a new policy's finalizer
//! ([`super::policy_writer`] says why), the missed scan's evictions
//! ([`super::missed`]), and releases with the evictions of the pods that block
//! them ([`super::releaser`]). Every write, a writer's or a loop's, goes through
//! the door ([`super::writes`]) and is counted there by kind.

use std::sync::Arc;
use std::time::Duration;

use kube::runtime::events::{Recorder, Reporter};
use tokio_util::sync::CancellationToken;

use super::context::{Context, ControllerOptions, Shared};
use super::daemonsets::DaemonSetWriter;
use super::events::Events;
use super::node_writer::NodeWriter;
use super::podgroups::{PodGroupWriter, PodGroups};
use super::policy_writer::PolicyWriter;
use super::queues::{ClassWriter, QueueClasses};
use super::sweep::SweepWriter;
use super::wishes;
use super::writes::Writes;
use crate::cluster::Cluster;
use crate::telemetry::Metrics;

/// Runs the controller until `shutdown`; writes only while holding the Lease,
/// and releases it on shutdown.
pub async fn run(
    cluster: Arc<Cluster>,
    metrics: Arc<Metrics>,
    options: ControllerOptions,
    shutdown: CancellationToken,
) {
    let client = cluster.client().clone();
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
    tokio::select! {
        () = shutdown.cancelled() => return,
        ready = cluster.synced() => if let Err(error) = ready {
            tracing::error!(%error, "the controller does not run");
            return;
        },
    }
    tracing::info!("controller caches synced");
    let (leadership, lease_task) = manager.watch().await;
    // The PodGroups the PodGroup writer made sure of, for the releases loop.
    let pod_groups = PodGroups::default();
    let writes = Writes::new(metrics.clone(), leadership.clone(), options.write_rates);
    let resync = options.resync;
    let context = Context {
        client: client.clone(),
        metrics: metrics.clone(),
        events: Events::start(recorder),
        cluster: cluster.clone(),
        options,
        shared: Arc::new(Shared::default()),
        writes: writes.clone(),
        node_writes: Arc::default(),
        policy_writes: Arc::default(),
        daemonset_writes: Arc::default(),
        class_writes: Arc::default(),
        sweep_writes: Arc::default(),
        pod_group_writes: Arc::default(),
    };
    // The writers stop with the nodes loop, whatever stopped it (leader election
    // may stop without a shutdown): no write is made once no loop looks after the
    // Lease. Each hands a failed write back to the loop that asked for it, when
    // the one retry policy says (`super::error`).
    let writers_stop = shutdown.child_token();
    let nodes = NodeWriter {
        writes: writes.clone(),
        client: client.clone(),
        nodes: cluster.stores.nodes.clone(),
        metrics: metrics.clone(),
    };
    let policies = PolicyWriter {
        writes: writes.clone(),
        client: client.clone(),
        policies: cluster.stores.policies.clone(),
    };
    let pod_group_writer = PodGroupWriter {
        writes: writes.clone(),
        client: client.clone(),
        events: context.events.clone(),
        known: pod_groups.clone(),
    };
    // The queue PriorityClasses the PriorityClass writer made sure of, for the
    // nodes loop.
    let queue_classes = QueueClasses::default();
    let classes = ClassWriter {
        writes: writes.clone(),
        client: client.clone(),
        known: queue_classes.clone(),
    };
    let sweeps = SweepWriter {
        writes: writes.clone(),
        client: client.clone(),
    };
    let placement = super::static_placement::run(
        cluster.clone(),
        writes.clone(),
        resync,
        leadership.clone(),
        writers_stop.clone(),
    );
    let daemonsets = DaemonSetWriter {
        writes,
        client,
        cluster: cluster.clone(),
        exempt: context.options.exempt.clone(),
        metrics: metrics.clone(),
    };
    let (on_node, on_policy) = (cluster.clone(), cluster.clone());
    let (on_daemonset, on_pod_group) = (cluster.clone(), cluster.clone());
    let (on_class, on_sweep) = (cluster.clone(), context.sweep_writes.clone());
    let writers = [
        tokio::spawn(wishes::run(
            nodes,
            context.node_writes.clone(),
            move |node: &String, _| on_node.wakes.node(node),
            writers_stop.clone(),
        )),
        tokio::spawn(wishes::run(
            policies,
            context.policy_writes.clone(),
            // Every pass looks at every policy: one over no node will do.
            move |_: &_, _| on_policy.wakes.status(),
            writers_stop.clone(),
        )),
        tokio::spawn(wishes::run(
            daemonsets,
            context.daemonset_writes.clone(),
            // DaemonSets are looked at on passes over everything.
            move |_: &_, ()| on_daemonset.wakes.everything(),
            writers_stop.clone(),
        )),
        tokio::spawn(wishes::run(
            classes,
            context.class_writes.clone(),
            // Classes are looked at on passes over everything.
            move |_: &_, _| on_class.wakes.everything(),
            writers_stop.clone(),
        )),
        tokio::spawn(wishes::run(
            sweeps,
            context.sweep_writes.clone(),
            // Deleted again, bound to the same uid: the sweep looks only at each
            // resync, and what it found unused twice stays so.
            move |unused: &_, uid| on_sweep.want(unused.clone(), uid),
            writers_stop.clone(),
        )),
        tokio::spawn(wishes::run(
            pod_group_writer,
            context.pod_group_writes.clone(),
            move |_: &_, _| on_pod_group.wakes.releases.notify_one(),
            writers_stop.clone(),
        )),
        tokio::spawn(placement),
    ];
    let releases = tokio::spawn(super::releaser::run(
        context.clone(),
        pod_groups,
        leadership.clone(),
        shutdown.clone(),
    ));
    super::nodes::run(context, queue_classes, leadership, shutdown).await;
    writers_stop.cancel();
    // Both loops and the writers have dropped their receivers: the lease task
    // releases the Lease.
    let _ = releases.await;
    for writer in writers {
        let _ = writer.await;
    }
    metrics.leader.set(0);
    let _ = tokio::time::timeout(Duration::from_secs(5), lease_task).await;
}
