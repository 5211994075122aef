//! The controller. The cluster room ([`crate::cluster`]) keeps the caches; two loops,
//! each woken by the changes that concern it and by a periodic resync, act on
//! them while this replica holds the Lease, and only once every cache holds a
//! full list:
//!
//! - the **releases** ([`super::releaser`]): held pods that may go now, for
//!   exclusion ([`crate::placement::exclusion`]) and groups ([`crate::placement::group_plan`]);
//! - the **nodes** ([`super::nodes`]): every node's berth labels and taints, the
//!   policies' status and finalizers, DaemonSet templates, and the sweep of unused
//!   objects;
//!
//! and one task writes what the nodes loop wants of each node
//! ([`super::node_writer`]). They run side by side, so that node writes (a new
//! pool over a thousand nodes takes seconds at the write rate) delay neither a
//! release nor a policy's status, and a burst of releases never delays a node.

use std::sync::Arc;
use std::time::Duration;

use kube::runtime::events::{Recorder, Reporter};
use tokio_util::sync::CancellationToken;

use super::context::{Context, ControllerOptions, Shared};
use super::events::Events;
use super::node_writer::{NodeQueue, NodeWriter};
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
        ready = cluster.synced() => if ready.is_err() {
            tracing::error!("a watch stopped before its first list; the controller does not run");
            return;
        },
    }
    tracing::info!("controller caches synced");
    let (leadership, lease_task) = manager.watch().await;
    let writes = Writes::new(metrics.clone(), leadership.clone(), options.write_rates);
    let node_writes = Arc::new(NodeQueue::default());
    let node_writer = NodeWriter {
        queue: node_writes.clone(),
        writes: writes.clone(),
        client: client.clone(),
        nodes: cluster.stores.nodes.clone(),
        metrics: metrics.clone(),
    };
    let retry_cluster = cluster.clone();
    // Stops with the nodes loop, whatever stopped it (leader election may stop
    // without a shutdown): no write is made once no loop looks after the Lease.
    let writer_stop = shutdown.child_token();
    let node_writer = tokio::spawn(node_writer.run(
        move |node| retry_cluster.wakes.node(node),
        writer_stop.clone(),
    ));
    let context = Context {
        client,
        metrics: metrics.clone(),
        events: Events::start(recorder),
        cluster,
        options,
        shared: Arc::new(Shared::default()),
        writes,
        node_writes,
    };
    let releases = tokio::spawn(super::releaser::run(
        context.clone(),
        leadership.clone(),
        shutdown.clone(),
    ));
    super::nodes::run(context, leadership, shutdown).await;
    writer_stop.cancel();
    // Both loops and the writer have dropped their receivers: the lease task
    // releases the Lease.
    let _ = releases.await;
    let _ = node_writer.await;
    metrics.leader.set(0);
    let _ = tokio::time::timeout(Duration::from_secs(5), lease_task).await;
}
