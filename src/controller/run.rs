//! The controller. Watches feed in-memory caches ([`super::caches`]); two loops,
//! each woken by the changes that concern it and by a periodic resync, act on
//! them while this replica holds the Lease, and only once every cache holds a
//! full list:
//!
//! - the **releases** ([`super::releaser`]): held pods that may go now, for
//!   exclusion ([`crate::placement::exclusion`]) and groups ([`super::groups`]);
//! - the **nodes** ([`super::nodes`]): every node's berth labels and taints, the
//!   policies' status and finalizers, DaemonSet templates, and the sweep of unused
//!   objects.
//!
//! They run side by side, so that node writes (a new pool over a thousand nodes
//! takes seconds at the write rate) never delay a release, and a burst of releases
//! never delays a node.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use kube::Client;
use kube::runtime::events::{Recorder, Reporter};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use super::caches::{Stores, Wakes};
use super::events::Events;
use crate::placement::groups::GangMode;
use crate::telemetry::Metrics;

/// Changes within this window are handled in one pass.
pub const DEBOUNCE: Duration = Duration::from_millis(100);

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
    /// How long a released pod of an `avoid` policy that the scheduler cannot place
    /// may hold the others back before it is requeued; `None`: for ever.
    pub requeue_unschedulable: Option<Duration>,
    /// Namespaces whose pods the webhook never sees (the webhook configurations'
    /// namespaceSelector leaves them out), berth's own among them: the missed scan
    /// passes over them.
    pub exempt_namespaces: std::collections::BTreeSet<String>,
}

/// What both loops work with.
#[derive(Clone)]
pub struct Context {
    pub client: Client,
    pub metrics: Arc<Metrics>,
    pub events: Events,
    pub stores: Stores,
    pub wakes: Arc<Wakes>,
    pub options: ControllerOptions,
    pub shared: Arc<Shared>,
}

impl Context {
    pub fn pass(&self) -> Pass<'_> {
        Pass {
            client: &self.client,
            metrics: &self.metrics,
            events: &self.events,
            options: &self.options,
        }
    }
}

/// What one loop learns that the other needs.
#[derive(Debug, Default)]
pub struct Shared {
    /// Gangs held past their timeout, by policy (the releases find them, the
    /// policies' status reports them).
    timed_out: Mutex<BTreeMap<String, Vec<String>>>,
    /// How the cluster enforces gangs (looked up at each resync).
    gang_mode: Mutex<GangMode>,
}

/// The value behind `mutex`; a loop that panicked holding it left a whole value.
fn locked<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|e| e.into_inner())
}

impl Shared {
    pub fn gang_mode(&self) -> GangMode {
        *locked(&self.gang_mode)
    }

    pub fn set_gang_mode(&self, mode: GangMode) {
        *locked(&self.gang_mode) = mode;
    }

    pub fn timed_out(&self) -> BTreeMap<String, Vec<String>> {
        locked(&self.timed_out).clone()
    }

    /// Replaces the timed-out gangs; true when they changed.
    pub fn set_timed_out(&self, timed_out: BTreeMap<String, Vec<String>>) -> bool {
        let mut current = locked(&self.timed_out);
        let changed = *current != timed_out;
        *current = timed_out;
        changed
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
    let wakes = Arc::new(Wakes::default());
    let stores = Stores::start(&client, &wakes);
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
        ready = stores.synced() => if ready.is_err() {
            tracing::error!("a watch stopped before its first list; the controller does not run");
            return;
        },
    }
    tracing::info!("controller caches synced");
    let (leadership, lease_task) = manager.watch().await;
    let gang_mode = super::podgroups::discover_gang_mode(&client, Default::default()).await;
    let shared = Arc::new(Shared::default());
    shared.set_gang_mode(gang_mode);
    let context = Context {
        client,
        metrics: metrics.clone(),
        events: Events::start(recorder),
        stores,
        wakes,
        options,
        shared,
    };
    let releases = tokio::spawn(super::releaser::run(
        context.clone(),
        leadership.clone(),
        shutdown.clone(),
    ));
    super::nodes::run(context, leadership, shutdown).await;
    // Both loops have dropped their receivers: the lease task releases the Lease.
    let _ = releases.await;
    metrics.leader.set(0);
    let _ = tokio::time::timeout(Duration::from_secs(5), lease_task).await;
}

/// Sleeps until `deadline`; without one, forever.
pub async fn until(deadline: Option<tokio::time::Instant>) {
    match deadline {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

/// Waits for the next change of leadership; `None` once election has stopped.
pub async fn leadership_changed(leadership: &mut watch::Receiver<bool>) -> Option<bool> {
    leadership.changed().await.ok()?;
    Some(*leadership.borrow_and_update())
}

/// What one pass works with.
pub struct Pass<'a> {
    pub client: &'a Client,
    pub metrics: &'a Metrics,
    pub events: &'a Events,
    pub options: &'a ControllerOptions,
}
