//! What the controller's loops work with: the options, the cluster model, the
//! metrics and Events, and what one loop learns that the other needs. Every loop
//! and writer imports it; it imports no loop and no writer, only what they share
//! below it: the wishes they pass ([`super::wishes`]), the one way to write ([`super::writes`])
//! and Events.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use kube::{Client, ResourceExt};
use tokio::sync::watch;

use super::events::Events;
use super::wishes::{
    ClassWrites, DaemonSetWrites, NodeQueue, PodGroupWrites, PolicyWrites, SweepWrites, locked,
};
use super::writes::Writes;
use crate::cluster::{Cluster, DaemonSets};
use crate::objects::PolicyObject;
use crate::placement::namespace::NamespaceIndex;
use crate::policy::compile::Compiled;
use crate::telemetry::Metrics;

/// How the controller runs.
#[derive(Debug, Clone)]
pub struct ControllerOptions {
    /// Namespace of the Lease `berth-controller`.
    pub lease_namespace: String,
    /// This replica's name in the Lease.
    pub identity: String,
    /// A full pass at least this often, even without changes.
    pub resync: Duration,
    /// Writes per second at most, by kind, so a large change cannot flood the
    /// apiserver.
    pub write_rates: super::writes::Rates,
    /// How long a released pod of an `avoid` policy that the scheduler cannot place
    /// may hold the others back before it is requeued; `None`: for ever.
    pub requeue_unschedulable: Option<Duration>,
    /// Namespaces whose pods the webhook never sees (the webhook configurations'
    /// namespaceSelector leaves them out), berth's own among them: the missed scan
    /// passes over them.
    pub exempt: crate::policy::exempt::Exempt,
}

/// What both loops work with.
#[derive(Clone)]
pub struct Context {
    pub client: Client,
    pub metrics: Arc<Metrics>,
    pub events: Events,
    /// The process's one model of the cluster (shared with the webhook).
    pub cluster: Arc<Cluster>,
    pub options: ControllerOptions,
    pub shared: Arc<Shared>,
    /// The one way every write goes (rate, Lease, timeout, count).
    pub writes: Writes,
    /// What the nodes pass wants written, for the writer of each kind.
    pub node_writes: Arc<NodeQueue>,
    pub policy_writes: Arc<PolicyWrites>,
    pub daemonset_writes: Arc<DaemonSetWrites>,
    pub class_writes: Arc<ClassWrites>,
    pub sweep_writes: Arc<SweepWrites>,
    /// What the releases pass wants of gangs' PodGroups.
    pub pod_group_writes: Arc<PodGroupWrites>,
}

impl Context {
    pub fn pass(&self) -> Pass<'_> {
        Pass {
            client: &self.client,
            metrics: &self.metrics,
            events: &self.events,
            options: &self.options,
            writes: &self.writes,
            node_writes: &self.node_writes,
            policy_writes: &self.policy_writes,
            daemonset_writes: &self.daemonset_writes,
            class_writes: &self.class_writes,
            sweep_writes: &self.sweep_writes,
            pod_group_writes: &self.pod_group_writes,
        }
    }
}

/// What one loop learns that the other needs.
#[derive(Debug, Default)]
pub struct Shared {
    /// Gangs held past their timeout, by policy (the releases find them, the
    /// policies' status reports them).
    timed_out: Mutex<BTreeMap<String, Vec<String>>>,
}

impl Shared {
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
    pub writes: &'a Writes,
    pub node_writes: &'a NodeQueue,
    pub policy_writes: &'a PolicyWrites,
    pub daemonset_writes: &'a DaemonSetWrites,
    pub class_writes: &'a ClassWrites,
    pub sweep_writes: &'a SweepWrites,
    pub pod_group_writes: &'a PodGroupWrites,
}

/// Policies and namespaces as the cluster model holds them at one instant.
pub struct Snapshot {
    /// Every cached policy object, deleted ones included (the finalizer needs them).
    pub objects: Vec<Arc<PolicyObject>>,
    /// The policies in force: deleted ones left out, ones that stopped compiling
    /// at their last good version.
    pub compiled: Arc<Compiled>,
    /// Each namespace as the webhook decides in it, its annotations read once per
    /// change of the namespace: what the controller asks of opt-in too.
    pub namespaces: Arc<NamespaceIndex>,
    pub daemonsets: Arc<DaemonSets>,
}

impl Snapshot {
    pub fn take(cluster: &Cluster) -> Snapshot {
        let objects = cluster.stores.policies.state();
        let compiled = cluster.in_force();
        Snapshot {
            objects,
            compiled,
            namespaces: cluster.namespaces(),
            daemonsets: cluster.daemonsets(),
        }
    }

    /// Whether the cache holds a policy named `policy`.
    pub fn has(&self, policy: &str) -> bool {
        self.objects.iter().any(|p| p.name_any() == policy)
    }
}
