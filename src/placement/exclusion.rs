//! Exact exclusion (SPEC "The controller"; seeds 001 and 002). Pods of `avoid`
//! policies arrive held by the scheduling gate `berth.io/avoid`. A pure function
//! decides which to release, and how: before its gate is removed, the pod's own
//! required node affinity is narrowed (Kubernetes allows that while a pod is gated),
//! because the anchor labels alone would not do: the scheduler's node cache may not
//! have seen the newest label when the next pod arrives, while a constraint in the
//! pod itself cannot be missed.
//!
//! - **On a set of nodes.** Pods that must avoid each other are released at the same
//!   time, each confined to its own set of nodes (`kubernetes.io/hostname In
//!   [...]`), disjoint from the sets of the others still in flight (released, not
//!   bound yet) and free of the nodes where pods it must avoid are bound. A pod gets
//!   a set only where its fit is predicted ([`super::rooms`]): resources left, its
//!   selectors and tolerations; so it is never confined to nodes that cannot take
//!   it.
//! - **Alone.** A pod whose fit cannot be predicted (host ports, volumes, its own
//!   inter-pod rules), or for which no set with room is found, goes only when no pod
//!   it must avoid is in flight, narrowed off the nodes of those bound (one
//!   `metadata.name NotIn` per node), and the scheduler may take any other node.
//!   Until it is bound, the pods it must avoid wait.
//!
//! Pods that do not conflict are released together either way. Everything is
//! derived from the cluster as it is (an in-flight pod's set is read back from its
//! affinity), so a restarted controller or a new leader picks up where the last one
//! stopped, and no pod is released twice.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::sync::Arc;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

use super::opt_in::{anchors, applied_policies, entitled_policies};
use super::rooms::{Fit, Rooms};
use crate::names::{AVOID_GATE, anchor_label, placed_label};
use crate::objects::PodObject;
use crate::placement::selection::is_empty_term;
use crate::policy::compile::Labels;
use crate::policy::{CompiledPolicy, OptIn, PolicySet};
use k8s_openapi::api::core::v1::NodeSelectorTerm;

/// The node label a set of nodes is written with: it holds the node's name on
/// almost every node, and a node without it is never part of a set.
pub const HOSTNAME_LABEL: &str = "kubernetes.io/hostname";

/// A set holds at least this many nodes when it can (two, so that one prediction
/// that misses does not leave the pod without a node, while 2,000 pods on 5,000
/// nodes still go at once), and at most this many. The pods of a burst arrive over
/// several passes, and the first passes cannot know how many follow: a set larger
/// than a pod needs only keeps the later pods waiting for binds (with 32, a burst
/// of 200 on 1,000 nodes claimed every node within its first 40 pods).
const FEWEST_NODES: usize = 2;
const MOST_NODES: usize = 4;

/// How many nodes one pod's search for a set looks at, at most: in a full cluster a
/// pod then costs a bounded search and goes alone instead.
const SEARCH_NODES: usize = 2048;

/// The shape of one required nodeSelectorTerm, as far as narrowing cares.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Term {
    /// Neither expressions nor fields: it matches no node and stays so.
    pub matches_nothing: bool,
    /// It has a `matchExpressions` list to add to.
    pub expressions: bool,
    /// It has a `matchFields` list to add to.
    pub fields: bool,
}

impl Term {
    fn of(term: &NodeSelectorTerm) -> Term {
        Term {
            matches_nothing: is_empty_term(term),
            expressions: term.match_expressions.is_some(),
            fields: term.match_fields.is_some(),
        }
    }
}

/// A pod as exclusion sees it.
#[derive(Debug, Clone)]
pub struct ExclusionPod {
    pub namespace: String,
    pub name: String,
    pub uid: Option<String>,
    pub created: Option<Time>,
    pub labels: Labels,
    /// Policies the webhook applied (`berth.io/applied`), as the pod says.
    pub applied: Vec<String>,
    /// Index of the `berth.io/avoid` gate in `spec.schedulingGates`, if held.
    pub gate: Option<usize>,
    /// Held by another gate too (a gang, a rank, another controller's): the avoid
    /// gate goes last, so such a pod is neither released nor in flight.
    pub other_gates: bool,
    pub node: Option<String>,
    /// Being deleted, and still on its node.
    pub terminating: bool,
    /// The required nodeSelectorTerms, by shape.
    pub terms: Vec<Term>,
    /// Whether its node affinity could be read (within the controller's bound on a
    /// pod's fields): one that cannot is never released, since its narrowing could
    /// not be written.
    pub readable: bool,
    /// Released and not bound: the hostnames its required node affinity confines it
    /// to, `None` when it may take any node.
    pub hosts: Option<BTreeSet<String>>,
    /// Held: what predicting where it fits needs, if the pod can be read.
    pub fit: Option<Fit>,
    /// Released and not bound: since when (as the leading controller first saw it
    /// so, [`Released::note_unplaceable`]), and the scheduler's message if it
    /// reported the pod Unschedulable (a pod for a scheduler nobody runs gets none).
    pub unplaced: Option<(Time, Option<String>)>,
    /// Released, not bound for longer than the controller's bound, and not one its
    /// controller makes again: it no longer holds the pods it must avoid
    /// ([`set_aside`]).
    pub set_aside: bool,
    /// Whether its controller makes it again when it is deleted.
    pub remade: bool,
    pub resource_version: Option<String>,
}

impl ExclusionPod {
    /// A pod as exclusion sees it; `None` for finished pods and for pods being
    /// deleted that hold no node. A pod still terminating on a node counts until it
    /// is gone, as native anti-affinity counts it.
    pub fn from_pod(pod: &PodObject) -> Option<ExclusionPod> {
        if pod.is_terminated() || (pod.is_terminating() && pod.node_name().is_none()) {
            return None;
        }
        let meta = &pod.metadata;
        let required = pod.required_affinity();
        let terms: Vec<Term> = required.into_iter().flatten().map(Term::of).collect();
        let gate = pod.gate(AVOID_GATE);
        let unbound = pod.node_name().is_none();
        Some(ExclusionPod {
            namespace: meta.namespace.clone().unwrap_or_default(),
            name: meta.name.clone().unwrap_or_default(),
            uid: meta.uid.clone(),
            created: meta.creation_timestamp.clone(),
            labels: meta.labels.clone().unwrap_or_default(),
            applied: applied_policies(meta.annotations.as_ref()),
            gate,
            other_gates: pod
                .spec
                .scheduling_gates
                .iter()
                .any(|g| g.name != AVOID_GATE),
            node: pod.node_name().map(str::to_owned),
            terminating: pod.is_terminating(),
            terms,
            readable: !pod.too_large(),
            hosts: (gate.is_none() && unbound)
                .then(|| required.and_then(confined_hosts))
                .flatten(),
            fit: gate.and_then(|_| Fit::of(pod)),
            // Dated by note_unplaceable.
            unplaced: (gate.is_none() && unbound).then(|| {
                let message = pod.unschedulable().map(|(_, message)| message.to_owned());
                (Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH), message)
            }),
            set_aside: false,
            remade: pod.is_remade_by_its_controller(),
            resource_version: meta.resource_version.clone(),
        })
    }

    /// The pod's uid, or its namespace and name.
    pub fn key(&self) -> String {
        self.uid
            .clone()
            .unwrap_or_else(|| format!("{}/{}", self.namespace, self.name))
    }

    /// Whether a `kubernetes.io/hostname In` expression added to its terms would
    /// confine it: it has a term that matches some node.
    fn can_confine(&self) -> bool {
        self.terms.iter().any(|t| !t.matches_nothing)
    }
}

/// The pods a plan must see to release the pods held now, as exclusion sees them:
/// every pod held by the gate, every unbound one (a released pod in flight holds
/// a set of nodes that sizes everyone's, and is dated while no scheduler places
/// it), and the bound pods of the `avoid` policies that concern a held pod (those
/// it names, and those whose selector matches it), as their own pods or as pods
/// they avoid. A bound pod no such policy concerns holds no held pod back
/// ([`conflict`] goes through one of those policies), so it is not read: a pass
/// with one pod held costs the pods of its policies, not every pod's affinity.
pub fn pods_to_plan(
    pods: &[Arc<PodObject>],
    policies: &PolicySet,
    opt_in: &dyn OptIn,
) -> Vec<ExclusionPod> {
    static NONE: Labels = Labels::new();
    fn labels(pod: &PodObject) -> &Labels {
        pod.metadata.labels.as_ref().unwrap_or(&NONE)
    }
    let namespace = |pod: &PodObject| pod.metadata.namespace.clone().unwrap_or_default();
    let avoiding: Vec<&CompiledPolicy> =
        policies.iter().filter(|p| p.spec.avoid.is_some()).collect();
    let held = |pod: &PodObject| pod.gate(AVOID_GATE).is_some();
    // The policies that concern a held pod: a superset of those that may (a pod
    // is entitled only to policies its record names).
    let mut concerned: Vec<&CompiledPolicy> = Vec::new();
    for pod in pods.iter().filter(|p| held(p)) {
        let named = applied_policies(pod.metadata.annotations.as_ref());
        let (labels, namespace) = (labels(pod), namespace(pod));
        for policy in &avoiding {
            let concerns =
                named.contains(&policy.name) || anchors(policy, labels, &namespace, opt_in);
            if concerns && !concerned.iter().any(|p| p.name == policy.name) {
                concerned.push(policy);
            }
        }
    }
    let read = |pod: &PodObject| {
        if held(pod) || pod.node_name().is_none() {
            return true;
        }
        let named = applied_policies(pod.metadata.annotations.as_ref());
        let namespace = namespace(pod);
        concerned.iter().any(|policy| {
            named.contains(&policy.name) || anchors(policy, labels(pod), &namespace, opt_in)
        })
    };
    pods.iter()
        .filter(|p| read(p))
        .filter_map(|p| ExclusionPod::from_pod(p))
        .collect()
}

/// The hostnames required nodeSelectorTerms confine a pod to: the union over its
/// terms (they are ORed) of each term's `kubernetes.io/hostname In` values
/// (intersected, they are ANDed). `None` when some term does not confine it.
fn confined_hosts(terms: &[NodeSelectorTerm]) -> Option<BTreeSet<String>> {
    let mut hosts = BTreeSet::new();
    for term in terms.iter().filter(|t| !is_empty_term(t)) {
        let mut confined: Option<BTreeSet<String>> = None;
        let hostname_in = term
            .match_expressions
            .iter()
            .flatten()
            .filter(|e| e.key == HOSTNAME_LABEL && e.operator == "In");
        for expression in hostname_in {
            let values: BTreeSet<String> = expression.values.iter().flatten().cloned().collect();
            confined = Some(match confined {
                Some(before) => before.intersection(&values).cloned().collect(),
                None => values,
            });
        }
        hosts.extend(confined?);
    }
    Some(hosts)
}

/// A held pod to release: confined to `hosts` when given a set, otherwise kept off
/// `avoid_nodes`.
#[derive(Debug, Clone)]
pub struct Release<'a> {
    pub pod: &'a ExclusionPod,
    pub avoid_nodes: Vec<String>,
    pub hosts: Option<Vec<String>>,
}

/// A held pod that stays held, and why.
#[derive(Debug, Clone)]
pub struct Waiting<'a> {
    pub pod: &'a ExclusionPod,
    pub reason: Hold<'a>,
}

/// Why a held pod stays held.
#[derive(Debug, Clone)]
pub enum Hold<'a> {
    /// A pod it must avoid (through `policy`) is released but not bound yet, and
    /// no set of nodes could be found beside it.
    Behind {
        pod: &'a ExclusionPod,
        policy: String,
    },
    /// The webhook applied a policy the controller has not seen yet: its watch lags
    /// the webhook's. Releasing now would ignore what the policy avoids.
    PolicyNotSeen(String),
    /// Every node where it fits runs a pod it must avoid (through `policy`), as
    /// when a rolling update adds a pod before it removes one.
    NoNodeFree { policy: String },
    /// Its node affinity is too large for the controller to read, so its narrowing
    /// could not be written: it is never released.
    Unreadable,
}

/// Why a pod held as [`Hold::NoNodeFree`] waits, and what releases it.
pub fn no_node_free(policy: &str) -> String {
    format!(
        "every node where it fits runs a pod it must avoid (policy {policy}); it is released \
         once one of them leaves its node or a node where it fits joins"
    )
}

/// Why a pod held as [`Hold::Unreadable`] stays held.
pub fn unreadable() -> String {
    format!(
        "its node affinity, node selector or tolerations take over {} KiB, more than berth \
         reads of a pod, so the narrowing that keeps it apart cannot be written; it stays held",
        crate::objects::pod::PLACEMENT_FIELD_BYTES / 1024
    )
}

/// What to do with the held pods now.
#[derive(Debug, Default)]
pub struct Plan<'a> {
    pub release: Vec<Release<'a>>,
    pub waiting: Vec<Waiting<'a>>,
}

/// A pod in a plan with its part in exclusion, worked out once per plan: the
/// avoid policies that apply to it (those its namespace opts into), and those that
/// avoid it, each with whether its namespace opts into that policy.
struct Entry<'a, 'p> {
    pod: &'a ExclusionPod,
    avoids: Vec<&'p CompiledPolicy>,
    avoided_by: Vec<(&'p CompiledPolicy, bool)>,
}

impl<'a, 'p> Entry<'a, 'p> {
    /// `None` for a pod exclusion has nothing to do with.
    fn new(
        pod: &'a ExclusionPod,
        avoid_policies: &[&'p CompiledPolicy],
        policies: &'p PolicySet,
        opt_in: &dyn OptIn,
    ) -> Option<Self> {
        let avoids: Vec<&CompiledPolicy> =
            entitled_policies(&pod.applied, &pod.namespace, policies, opt_in)
                .into_iter()
                .filter(|p| p.spec.avoid.is_some())
                .collect();
        let avoided_by: Vec<(&CompiledPolicy, bool)> = avoid_policies
            .iter()
            .filter(|p| anchors(p, &pod.labels, &pod.namespace, opt_in))
            .map(|p| (*p, opt_in.opts_in(p, &pod.namespace)))
            .collect();
        (pod.gate.is_some() || !avoids.is_empty() || !avoided_by.is_empty()).then_some(Entry {
            pod,
            avoids,
            avoided_by,
        })
    }
}

/// Whether `a` and `b` must avoid each other (an avoid policy that applies to one
/// of them avoids the other), and if so the node label that keeps `a` off the node
/// of `b`: the policy's anchor label when `a` is one of its pods, its placed label
/// when `a` is a pod it avoids.
fn conflict(a: &Entry, b: &Entry) -> Option<String> {
    conflict_marks(a, b).next()
}

/// Every node label a bound `b` puts on its node that keeps `a` off it: the anchor
/// label of each avoid policy of `a` that avoids `b`, then the placed label of each
/// avoid policy of `b` that avoids `a` (a policy whose pods avoid each other puts
/// both).
fn conflict_marks<'e>(a: &'e Entry, b: &'e Entry) -> impl Iterator<Item = String> + 'e {
    let through = |x: &'e Entry, y: &'e Entry| {
        x.avoids
            .iter()
            .filter(move |p| y.avoided_by.iter().any(|(q, _)| q.name == p.name))
            .map(|p| p.name.as_str())
    };
    through(a, b)
        .map(anchor_label)
        .chain(through(b, a).map(placed_label))
}

/// The policy through which the in-flight `other` holds the held `pod` back. Only
/// a pod in a namespace that opts into the policy does: any tenant could otherwise
/// label a pod that never schedules like a target and stall every pod of the
/// policy, in every namespace.
fn holds_back<'p>(pod: &Entry<'_, 'p>, other: &Entry<'_, 'p>) -> Option<&'p CompiledPolicy> {
    let avoided = pod.avoids.iter().copied().find(|p| {
        other
            .avoided_by
            .iter()
            .any(|(q, opted)| *opted && q.name == p.name)
    });
    avoided.or_else(|| {
        other
            .avoids
            .iter()
            .copied()
            .find(|p| pod.avoided_by.iter().any(|(q, _)| q.name == p.name))
    })
}

/// What this controller has released. Pods stay in `uncached` (with the set each
/// was confined to) until the cache shows them released: the watch event trails
/// the write, and a pod that still looks held must count as in flight, or a pod
/// that must avoid it could be released beside it.
#[derive(Debug, Default)]
pub struct Released {
    uncached: BTreeMap<String, Option<BTreeSet<String>>>,
    /// When this controller first saw each released pod unbound.
    unplaceable: BTreeMap<String, Time>,
}

impl Released {
    /// Notes that `pod`'s gate was removed, confining it to `hosts`.
    pub fn record(&mut self, pod: &ExclusionPod, hosts: Option<&[String]>) {
        let hosts = hosts.map(|h| h.iter().cloned().collect());
        self.uncached.insert(pod.key(), hosts);
    }

    /// Dates each released, unbound pod from when this controller first saw it
    /// so, whatever its conditions: a pod for a scheduler nobody runs is never
    /// reported Unschedulable, and a gated pod's PodScheduled is already False
    /// (SchedulingGated) with a time the scheduler keeps. Nothing a tenant writes
    /// on the pod moves the date. (A new leader starts the wait over.)
    pub fn note_unplaceable(&mut self, pods: &mut [ExclusionPod], now: Time) {
        let unplaceable: BTreeSet<String> = pods
            .iter()
            .filter(|p| p.unplaced.is_some())
            .map(ExclusionPod::key)
            .collect();
        self.unplaceable.retain(|key, _| unplaceable.contains(key));
        for pod in pods.iter_mut() {
            let key = pod.key();
            if let Some((since, _)) = pod.unplaced.as_mut() {
                *since = self
                    .unplaceable
                    .entry(key)
                    .or_insert_with(|| now.clone())
                    .clone();
            }
        }
    }

    /// Shows the pods released but still gated in the cache as released, and
    /// forgets those the cache has caught up with (or that are gone).
    pub fn overlay(&mut self, pods: &mut [ExclusionPod]) {
        let still_gated: BTreeSet<String> = pods
            .iter()
            .filter(|p| p.gate.is_some())
            .map(ExclusionPod::key)
            .collect();
        self.uncached.retain(|key, _| still_gated.contains(key));
        for pod in pods.iter_mut() {
            if let Some(hosts) = self.uncached.get(&pod.key()) {
                pod.gate = None;
                pod.hosts = hosts.clone();
            }
        }
    }
}

/// Released but not bound yet, and not set aside.
fn in_flight(pod: &ExclusionPod) -> bool {
    pod.gate.is_none() && pod.node.is_none() && !pod.other_gates && !pod.set_aside
}

/// Sets aside each released pod that no scheduler has bound `after` its release
/// (as `now` dates it) and that its controller would not make again: it stops
/// holding the pods it must avoid, which are released as if it were not there.
/// The scheduler still keeps it off their nodes once they carry berth's labels
/// (its own required affinity excludes them); only if it were bound in the moment
/// between one of them binding and its node's label could two share a node, which
/// the controller would report (`ExclusionBroken`). One its controller makes
/// again is evicted instead (controller::release). Returns how many were set aside.
pub fn set_aside(pods: &mut [ExclusionPod], after: std::time::Duration, now: Time) -> usize {
    let mut count = 0;
    for pod in pods.iter_mut().filter(|p| !p.remade) {
        let waited = pod
            .unplaced
            .as_ref()
            .map(|(since, _)| now.0.duration_since(since.0).as_secs_f64());
        if waited.is_some_and(|w| w >= after.as_secs_f64()) {
            pod.set_aside = true;
            count += 1;
        }
    }
    count
}

/// Whether the held `pod` must be narrowed off the node of `other`, bound there,
/// with which it conflicts. Always, unless `other` is terminating and its node
/// already carries the label that keeps `pod` off: that label stays until `other`
/// is gone and the scheduler has seen it, and a pod narrowed off the node would be
/// kept off it for good, where native anti-affinity lets it in once the old pod has
/// left. A pod bound and deleted a moment ago, before its node was labelled, is
/// still narrowed against.
fn narrow_off(other: &ExclusionPod, keep_off: &str, rooms: &Rooms) -> bool {
    let labelled = || {
        other
            .node
            .as_ref()
            .and_then(|n| rooms.get(n))
            .is_some_and(|room| room.info.labels.contains_key(keep_off))
    };
    !other.terminating || !labelled()
}

/// The nodes sets are made of, and who holds which.
struct Sets<'r, 'e, 'a, 'p> {
    rooms: &'r Rooms,
    /// Nodes with a hostname label, by name, with their room.
    nodes: Vec<(&'r str, &'r str, &'r super::rooms::NodeRoom)>,
    /// Where the next search starts, so that consecutive sets spread over the nodes.
    cursor: usize,
    /// How many nodes a set aims for.
    size: usize,
    /// The pods in flight.
    flying: Vec<&'e Entry<'a, 'p>>,
    /// Which in-flight pods (indices into `flying`) each hostname is in the set of.
    claims: HashMap<String, Vec<usize>>,
    /// In-flight pods that may take any node.
    unbounded: Vec<usize>,
    /// In-flight pods by the policies that avoid them (in a namespace that opts in)
    /// and by their own avoid policies: who holds back a held pod is found by its
    /// policies, not by a look at every pod in flight.
    avoided_by: HashMap<&'p str, Vec<usize>>,
    avoiding: HashMap<&'p str, Vec<usize>>,
    /// The pods bound to each node.
    bound: HashMap<&'a str, Vec<&'e Entry<'a, 'p>>>,
    /// The policies of held pods whose search this pass looked at every node and
    /// found none: a pod with the same policies does not search again until the
    /// next pass.
    exhausted: HashSet<Vec<&'p str>>,
}

impl<'r, 'e, 'a, 'p> Sets<'r, 'e, 'a, 'p> {
    fn fly(&mut self, entry: &'e Entry<'a, 'p>, hosts: Option<&BTreeSet<String>>) {
        let index = self.flying.len();
        match hosts {
            Some(hosts) => {
                for host in hosts {
                    self.claims.entry(host.clone()).or_default().push(index);
                }
            }
            None => self.unbounded.push(index),
        }
        for (policy, opted) in &entry.avoided_by {
            if *opted {
                self.avoided_by.entry(&policy.name).or_default().push(index);
            }
        }
        for policy in &entry.avoids {
            self.avoiding.entry(&policy.name).or_default().push(index);
        }
        self.flying.push(entry);
    }

    /// The first pod in flight that holds `entry` back, and through which policy.
    fn first_blocker(&self, entry: &Entry<'a, 'p>) -> Option<(usize, &'p CompiledPolicy)> {
        let avoided = entry.avoids.iter().filter_map(|p| {
            let first = *self.avoided_by.get(p.name.as_str())?.first()?;
            Some((first, *p))
        });
        let avoiding = entry.avoided_by.iter().filter_map(|(p, _)| {
            let first = *self.avoiding.get(p.name.as_str())?.first()?;
            Some((first, *p))
        });
        avoided.chain(avoiding).min_by_key(|(i, _)| *i)
    }

    /// An in-flight pod that may take any node and holds `entry` back.
    fn unbounded_blocker(&self, entry: &Entry<'a, 'p>) -> Option<(usize, &'p CompiledPolicy)> {
        self.unbounded
            .iter()
            .find_map(|i| Some((*i, holds_back(entry, self.flying[*i])?)))
    }

    /// Whether a pod it must avoid is bound to `node` and keeps `entry` off it (see
    /// [`narrow_off`]).
    fn keeps_off(&self, entry: &Entry<'a, 'p>, node: &str) -> bool {
        self.bound.get(node).is_some_and(|on_node| {
            on_node.iter().any(|other| {
                conflict(entry, other)
                    .is_some_and(|label| narrow_off(other.pod, &label, self.rooms))
            })
        })
    }

    /// Whether every node where `entry` would fit holds a bound pod it must avoid,
    /// and there is such a node. Released then, it would be narrowed off all of
    /// them, and a released pod's affinity never widens again: it would stay
    /// Pending after one of them frees its node, and hold back every pod behind it.
    /// On a taken node the pod is judged apart from the labels that mark the
    /// conflict (the anchor or placed label berth keeps there): with them it fits
    /// none of those nodes, by design, until the pod it avoids leaves.
    fn all_taken(&self, entry: &Entry<'a, 'p>, fit: &Fit) -> bool {
        let mut taken_where_it_fits = false;
        for (name, room) in self.rooms.iter() {
            let marks: Vec<String> = self
                .bound
                .get(name.as_str())
                .into_iter()
                .flatten()
                .flat_map(|other| conflict_marks(entry, other))
                .collect();
            if marks.is_empty() {
                if fit.fits(name, room).is_ok() {
                    return false;
                }
                continue;
            }
            if !taken_where_it_fits {
                let mut apart = room.clone();
                Arc::make_mut(&mut apart.info)
                    .labels
                    .retain(|key, _| !marks.contains(key));
                taken_where_it_fits = fit.fits(name, &apart).is_ok();
            }
        }
        taken_where_it_fits
    }

    /// A set of nodes for the held `entry` where it fits, none of them claimed by a
    /// pod in flight that holds it back or holding a pod it must avoid; empty when
    /// the search finds none.
    fn find(&mut self, entry: &Entry<'a, 'p>, fit: &Fit) -> Vec<String> {
        let signature: Vec<&'p str> = entry
            .avoids
            .iter()
            .map(|p| p.name.as_str())
            .chain(entry.avoided_by.iter().map(|(p, _)| p.name.as_str()))
            .collect();
        if self.exhausted.contains(&signature) {
            return Vec::new();
        }
        let mut hosts = Vec::new();
        let count = self.nodes.len();
        let mut looked = 0;
        while looked < count.min(SEARCH_NODES) && hosts.len() < self.size {
            let (name, host, room) = self.nodes[(self.cursor + looked) % count];
            looked += 1;
            let claimed = self.claims.get(host).is_some_and(|c| {
                c.iter()
                    .any(|i| holds_back(entry, self.flying[*i]).is_some())
            });
            if !claimed && !self.keeps_off(entry, name) && fit.fits(name, room).is_ok() {
                hosts.push(host.to_owned());
            }
        }
        self.cursor = (self.cursor + looked) % count.max(1);
        if hosts.is_empty() {
            self.exhausted.insert(signature);
        }
        hosts.sort();
        hosts.dedup();
        hosts
    }
}

/// A node index in `0..count` that `key` points at, the same every time.
fn start_of(key: &str, count: usize) -> usize {
    use std::hash::{DefaultHasher, Hash, Hasher};
    // `DefaultHasher::new` has fixed keys: the same start on every pass.
    let mut hasher = DefaultHasher::new();
    key.hash(&mut hasher);
    (hasher.finish() % count.max(1) as u64) as usize
}

/// Which held pods to release now, oldest first, each with its set of nodes or
/// the nodes it must keep off, and why the others wait. `unseen` holds, by pod key,
/// held pods the webhook admitted with a policy that exists but is not in
/// `policies` yet: each waits for its policy. (A policy that is gone is simply
/// absent: its pods no longer avoid anything.) `rooms` are the nodes as the
/// controller's cache holds them, with the room left on each.
pub fn plan<'a>(
    pods: &'a [ExclusionPod],
    policies: &PolicySet,
    opt_in: &dyn OptIn,
    unseen: &BTreeMap<String, String>,
    rooms: &Rooms,
) -> Plan<'a> {
    let avoid_policies: Vec<&CompiledPolicy> =
        policies.iter().filter(|p| p.spec.avoid.is_some()).collect();
    let entries: Vec<Entry> = pods
        .iter()
        .filter_map(|p| Entry::new(p, &avoid_policies, policies, opt_in))
        .collect();
    // A pod held by another gate as well waits for that gate first; that gate's
    // own Event says why.
    let mut held: Vec<&Entry> = entries
        .iter()
        .filter(|e| e.pod.gate.is_some() && !e.pod.other_gates)
        .collect();
    held.sort_by(|a, b| {
        let (a, b) = (a.pod, b.pod);
        (&a.created, &a.namespace, &a.name).cmp(&(&b.created, &b.namespace, &b.name))
    });
    // A set names nodes by their hostname label, which a kubelet may set on its
    // own Node: a node that copies another's would be let into that one's sets,
    // and take a pod onto itself beside one it must avoid. So a hostname that two
    // nodes carry names neither in a set.
    let mut carriers: HashMap<&str, usize> = HashMap::new();
    for room in rooms.values() {
        if let Some(host) = room.info.labels.get(HOSTNAME_LABEL) {
            *carriers.entry(host.as_str()).or_default() += 1;
        }
    }
    let nodes: Vec<_> = rooms
        .iter()
        .filter_map(|(name, room)| {
            let host = room.info.labels.get(HOSTNAME_LABEL)?;
            (carriers[host.as_str()] == 1).then_some((name.as_str(), host.as_str(), room))
        })
        .collect();
    // Each pass starts where its oldest held pod points, not at the first node by
    // name: passes for unrelated policies would otherwise all crowd the same nodes.
    let cursor = held
        .first()
        .map(|e| start_of(&e.pod.key(), nodes.len()))
        .unwrap_or_default();
    let mut sets = Sets {
        rooms,
        nodes,
        cursor,
        size: FEWEST_NODES,
        flying: Vec::new(),
        claims: HashMap::new(),
        unbounded: Vec::new(),
        avoided_by: HashMap::new(),
        avoiding: HashMap::new(),
        bound: HashMap::new(),
        exhausted: HashSet::new(),
    };
    for entry in &entries {
        if let Some(node) = &entry.pod.node {
            sets.bound.entry(node.as_str()).or_default().push(entry);
        } else if in_flight(entry.pod) && !entry.pod.terminating {
            sets.fly(entry, entry.pod.hosts.as_ref());
        }
    }
    // The held pods share the nodes no pod in flight holds in its set: sized over
    // every node instead, the first held pods of a pass could take all the free
    // nodes between them and leave the rest waiting for binds.
    let free = sets
        .nodes
        .iter()
        .filter(|(_, host, _)| !sets.claims.contains_key(*host))
        .count();
    sets.size = (free / held.len().max(1)).clamp(FEWEST_NODES, MOST_NODES);
    let mut plan = Plan::default();
    for entry in held {
        let pod = entry.pod;
        if let Some(policy) = unseen.get(&pod.key()) {
            plan.waiting.push(Waiting {
                pod,
                reason: Hold::PolicyNotSeen(policy.clone()),
            });
            continue;
        }
        if !pod.readable {
            plan.waiting.push(Waiting {
                pod,
                reason: Hold::Unreadable,
            });
            continue;
        }
        let behind = |i: usize, policy: &CompiledPolicy, sets: &Sets<'_, '_, 'a, '_>| Waiting {
            pod,
            reason: Hold::Behind {
                pod: sets.flying[i].pod,
                policy: policy.name.clone(),
            },
        };
        // One that may take any node leaves no set free of it.
        if let Some((i, policy)) = sets.unbounded_blocker(entry) {
            plan.waiting.push(behind(i, policy, &sets));
            continue;
        }
        let fit = pod
            .fit
            .as_ref()
            .filter(|f| f.predictable && pod.can_confine());
        let hosts = match fit {
            Some(fit) => sets.find(entry, fit),
            None => Vec::new(),
        };
        if !hosts.is_empty() {
            sets.fly(entry, Some(&hosts.iter().cloned().collect()));
            plan.release.push(Release {
                pod,
                avoid_nodes: Vec::new(),
                hosts: Some(hosts),
            });
            continue;
        }
        if let Some((i, policy)) = sets.first_blocker(entry) {
            plan.waiting.push(behind(i, policy, &sets));
            continue;
        }
        if fit.is_some_and(|fit| sets.all_taken(entry, fit)) {
            let policy = entry
                .avoids
                .first()
                .or(entry.avoided_by.first().map(|(p, _)| p))
                .map(|p| p.name.clone())
                .unwrap_or_default();
            plan.waiting.push(Waiting {
                pod,
                reason: Hold::NoNodeFree { policy },
            });
            continue;
        }
        let mut avoid_nodes: Vec<String> = sets
            .bound
            .keys()
            .filter(|node| sets.keeps_off(entry, node))
            .map(|node| node.to_string())
            .collect();
        avoid_nodes.sort();
        sets.fly(entry, None);
        plan.release.push(Release {
            pod,
            avoid_nodes,
            hosts: None,
        });
    }
    plan
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::placement::opt_in::tests::{Everyone, Only};
    use crate::policy::test_policies as policies;
    use serde_json::json;

    fn pod(
        name: &str,
        role: &str,
        applied: &[&str],
        gate: bool,
        node: Option<&str>,
    ) -> ExclusionPod {
        ExclusionPod {
            namespace: "db".into(),
            name: name.into(),
            uid: None,
            created: None,
            labels: Labels::from([("role".to_string(), role.to_string())]),
            applied: applied.iter().map(|a| a.to_string()).collect(),
            gate: gate.then_some(0),
            node: node.map(Into::into),
            terminating: false,
            terms: vec![Term {
                matches_nothing: false,
                expressions: true,
                fields: false,
            }],
            readable: true,
            other_gates: false,
            hosts: None,
            fit: None,
            unplaced: None,
            set_aside: false,
            remade: true,
            resource_version: None,
        }
    }

    fn masters() -> PolicySet {
        policies(&[(
            "masters",
            json!({"podSelector": {"matchLabels": {"role": "master"}}, "avoid": {"matchLabels": {"role": "master"}}}),
        )])
    }

    fn none() -> BTreeMap<String, String> {
        BTreeMap::new()
    }

    fn no_labels() -> Rooms {
        Rooms::new()
    }

    fn names<'a>(releases: &[Release<'a>]) -> Vec<&'a str> {
        releases.iter().map(|r| r.pod.name.as_str()).collect()
    }

    #[test]
    fn a_plan_reads_only_the_pods_of_the_policies_that_concern_a_held_pod() {
        let set = policies(&[
            (
                "masters",
                json!({"podSelector": {"matchLabels": {"role": "master"}}, "avoid": {"matchLabels": {"role": "replica"}}}),
            ),
            (
                "spares",
                json!({"podSelector": {"matchLabels": {"role": "spare"}}, "avoid": {"matchLabels": {"role": "master"}}}),
            ),
            (
                "caches",
                json!({"podSelector": {"matchLabels": {"role": "cache"}}, "avoid": {"matchLabels": {"role": "cache"}}}),
            ),
        ]);
        let object = |name: &str, role: &str, applied: &str, gated: bool, node: Option<&str>| {
            let gates = if gated {
                json!([{"name": AVOID_GATE}])
            } else {
                json!([])
            };
            let pod: PodObject = serde_json::from_value(json!({
                "metadata": {"name": name, "namespace": "db", "labels": {"role": role},
                    "annotations": {"berth.io/applied": applied}},
                "spec": {"nodeName": node, "schedulingGates": gates}}))
            .unwrap();
            Arc::new(pod)
        };
        let pods = [
            object("m1", "master", "masters", true, None),
            // What a held master avoids, its own, and a policy that avoids it.
            object("r1", "replica", "", false, Some("n1")),
            object("m0", "master", "masters", false, Some("n2")),
            object("s1", "spare", "spares", false, Some("n3")),
            // Another policy's pods, and a pod no policy concerns, bound.
            object("c1", "cache", "caches", false, Some("n4")),
            object("web", "web", "", false, Some("n5")),
            // Unbound: in flight, or waiting for the scheduler.
            object("c2", "cache", "caches", false, None),
        ];
        let read = |pods: &[Arc<PodObject>]| -> Vec<String> {
            pods_to_plan(pods, &set, &Everyone)
                .into_iter()
                .map(|p| p.name)
                .collect()
        };
        assert_eq!(read(&pods), ["m1", "r1", "m0", "s1", "c2"]);
        // The same plan as over every pod.
        let every: Vec<ExclusionPod> = pods
            .iter()
            .filter_map(|p| ExclusionPod::from_pod(p))
            .collect();
        let some = pods_to_plan(&pods, &set, &Everyone);
        let names = |plan: Plan| -> (Vec<String>, usize) {
            let released = plan.release.iter().map(|r| r.pod.name.clone()).collect();
            (released, plan.waiting.len())
        };
        assert_eq!(
            names(plan(&some, &set, &Everyone, &none(), &no_labels())),
            names(plan(&every, &set, &Everyone, &none(), &no_labels()))
        );
        // Nothing held: only the unbound pods.
        assert_eq!(read(&pods[1..]), ["c2"]);
    }

    #[test]
    fn pods_created_together_are_released_one_at_a_time() {
        let pods = vec![
            pod("m1", "master", &["masters"], true, None),
            pod("m2", "master", &["masters"], true, None),
            pod("m3", "master", &["masters"], true, None),
        ];
        let plan = plan(&pods, &masters(), &Everyone, &none(), &no_labels());
        assert_eq!(names(&plan.release), ["m1"]);
        assert_eq!(plan.waiting.len(), 2);
        assert!(
            matches!(&plan.waiting[0].reason, Hold::Behind { pod, policy } if pod.name == "m1" && policy == "masters")
        );
    }

    #[test]
    fn the_avoid_gate_goes_last_and_a_pod_held_by_another_gate_is_not_in_flight() {
        let mut pods = vec![
            pod("m1", "master", &["masters"], true, None),
            pod("m2", "master", &["masters"], true, None),
        ];
        pods[0].other_gates = true;
        let first = plan(&pods, &masters(), &Everyone, &none(), &no_labels());
        assert_eq!(names(&first.release), ["m2"], "m1 waits for its other gate");
        // Released from avoid before its gang let go (an older berth): still
        // held, so m2 does not wait behind it.
        let mut pods = vec![
            pod("m1", "master", &["masters"], false, None),
            pod("m2", "master", &["masters"], true, None),
        ];
        pods[0].other_gates = true;
        let second = plan(&pods, &masters(), &Everyone, &none(), &no_labels());
        assert_eq!(names(&second.release), ["m2"]);
    }

    #[test]
    fn the_next_goes_once_the_previous_is_bound_and_keeps_off_its_node() {
        let mut pods = vec![
            pod("m1", "master", &["masters"], false, None),
            pod("m2", "master", &["masters"], true, None),
            pod("web", "web", &[], false, Some("n9")),
        ];
        assert!(
            plan(&pods, &masters(), &Everyone, &none(), &no_labels())
                .release
                .is_empty(),
            "m1 released but unbound"
        );
        pods[0].node = Some("n1".into());
        let plan = plan(&pods, &masters(), &Everyone, &none(), &no_labels());
        assert_eq!(names(&plan.release), ["m2"]);
        assert_eq!(
            plan.release[0].avoid_nodes,
            ["n1"],
            "only the nodes of pods it must avoid"
        );
    }

    #[test]
    fn pods_that_do_not_conflict_are_released_together() {
        let set = policies(&[
            (
                "masters",
                json!({"podSelector": {"matchLabels": {"role": "master"}}, "avoid": {"matchLabels": {"role": "master"}}}),
            ),
            (
                "data",
                json!({"podSelector": {"matchLabels": {"role": "data"}}, "avoid": {"matchLabels": {"role": "data"}}}),
            ),
        ]);
        let pods = vec![
            pod("m1", "master", &["masters"], true, None),
            pod("d1", "data", &["data"], true, None),
            pod("d2", "data", &["data"], true, None),
        ];
        assert_eq!(
            names(&plan(&pods, &set, &Everyone, &none(), &no_labels()).release),
            ["d1", "m1"]
        );
    }

    #[test]
    fn masters_and_replicas_that_avoid_each_other_are_not_released_together() {
        let set = policies(&[
            (
                "masters",
                json!({"podSelector": {"matchLabels": {"role": "master"}}, "avoid": {"matchLabels": {"role": "replica"}}}),
            ),
            (
                "replicas",
                json!({"podSelector": {"matchLabels": {"role": "replica"}}, "avoid": {"matchLabels": {"role": "master"}}}),
            ),
        ]);
        let pods = vec![
            pod("m1", "master", &["masters"], true, None),
            pod("r1", "replica", &["replicas"], true, None),
        ];
        let plan = plan(&pods, &set, &Everyone, &none(), &no_labels());
        assert_eq!(names(&plan.release), ["m1"]);
        assert_eq!(plan.waiting[0].pod.name, "r1");
    }

    #[test]
    fn a_held_pod_whose_policy_is_gone_is_released() {
        let pods = vec![
            pod("m1", "master", &["deleted"], true, None),
            pod("m2", "master", &["deleted"], true, None),
        ];
        assert_eq!(
            names(&plan(&pods, &masters(), &Everyone, &none(), &no_labels()).release),
            ["m1", "m2"]
        );
    }

    #[test]
    fn a_held_pod_waits_for_a_policy_the_controller_has_not_seen_yet() {
        let pods = vec![
            pod("m1", "master", &["masters"], true, None),
            pod("m2", "master", &["masters"], true, None),
        ];
        let unseen = pods
            .iter()
            .map(|p| (p.key(), "masters".to_string()))
            .collect();
        let plan = plan(
            &pods,
            &PolicySet::default(),
            &Everyone,
            &unseen,
            &no_labels(),
        );
        assert!(plan.release.is_empty(), "both would be released at once");
        assert!(matches!(&plan.waiting[1].reason, Hold::PolicyNotSeen(p) if p == "masters"));
    }

    #[test]
    fn a_release_the_cache_has_not_shown_yet_counts_as_in_flight() {
        let mut pods = vec![
            pod("m1", "master", &["masters"], true, None),
            pod("m2", "master", &["masters"], true, None),
        ];
        let mut released = Released::default();
        released.record(&pods[0], None);
        released.overlay(&mut pods);
        let plan = plan(&pods, &masters(), &Everyone, &none(), &no_labels());
        assert!(plan.release.is_empty(), "m1 is in flight, m2 must wait");
        // The cache catches up: m1's gate is gone there too, and it is forgotten.
        pods[0].gate = None;
        released.overlay(&mut pods);
        assert!(released.uncached.is_empty());
    }

    /// No namespace opts into anything (by annotation or labels).
    struct Nobody;
    impl OptIn for Nobody {
        fn opts_in(&self, _: &CompiledPolicy, _: &str) -> bool {
            false
        }
        fn takes_daemonsets(&self, _: &CompiledPolicy, _: &str) -> bool {
            false
        }
        fn named(&self, _: &str) -> &[String] {
            &[]
        }
    }

    #[test]
    fn anchor_namespaces_all_also_keeps_off_pods_berth_did_not_admit() {
        let spec = |scope: &str| {
            json!({"podSelector": {"matchLabels": {"role": "master"}},
                "avoid": {"matchLabels": {"role": "master"}}, "anchorNamespaces": scope})
        };
        // A master berth never saw (another namespace, no opt-in, no annotation).
        let mut foreign = pod("legacy", "master", &[], false, Some("n5"));
        foreign.namespace = "legacy".into();
        let pods = vec![foreign, pod("m1", "master", &["masters"], true, None)];
        let all = policies(&[("masters", spec("All"))]);
        let plan_all = plan(&pods, &all, &Only("db"), &none(), &no_labels());
        assert_eq!(plan_all.release[0].avoid_nodes, ["n5"]);
        let same = policies(&[("masters", spec("Same"))]);
        let plan_same = plan(&pods, &same, &Only("db"), &none(), &no_labels());
        assert!(plan_same.release[0].avoid_nodes.is_empty());
        // Nothing counts from a namespace that opts into nothing, not even the
        // pod's own annotation.
        assert!(
            plan(&pods, &all, &Nobody, &none(), &no_labels()).release[0]
                .avoid_nodes
                .is_empty()
        );
    }

    #[test]
    fn a_pod_from_a_namespace_that_did_not_opt_in_never_holds_others_back() {
        let spec = json!({"podSelector": {"matchLabels": {"role": "master"}},
            "avoid": {"matchLabels": {"role": "master"}}, "anchorNamespaces": "All"});
        // A tenant's pod that never schedules, labelled and annotated like a master.
        let mut forged = pod("stuck", "master", &["masters"], false, None);
        forged.namespace = "tenant".into();
        let pods = vec![forged, pod("m1", "master", &["masters"], true, None)];
        let set = policies(&[("masters", spec)]);
        let plan = plan(&pods, &set, &Only("db"), &none(), &no_labels());
        assert_eq!(names(&plan.release), ["m1"]);
    }

    #[test]
    fn avoid_is_symmetric_a_later_target_keeps_off_the_nodes_of_the_policys_pods() {
        let set = policies(&[(
            "masters",
            json!({"podSelector": {"matchLabels": {"role": "master"}}, "avoid": {"matchLabels": {"role": "replica"}}}),
        )]);
        let pods = vec![
            pod("m1", "master", &["masters"], false, Some("n1")),
            pod("r1", "replica", &[], true, None),
        ];
        let plan = plan(&pods, &set, &Everyone, &none(), &no_labels());
        assert_eq!(plan.release[0].avoid_nodes, ["n1"]);
    }

    #[test]
    fn a_pod_still_terminating_counts_by_narrowing_until_its_node_is_labelled() {
        let leaving: PodObject = serde_json::from_value(json!({
            "metadata": {"name": "m0", "namespace": "db", "labels": {"role": "master"},
                "annotations": {"berth.io/applied": "masters"}, "deletionTimestamp": "2026-01-01T00:00:00Z"},
            "spec": {"nodeName": "n3"}, "status": {"phase": "Running"}}))
        .unwrap();
        let leaving = ExclusionPod::from_pod(&leaving).expect("it still holds n3");
        assert!(leaving.terminating);
        let pods = vec![leaving, pod("m1", "master", &["masters"], true, None)];
        let set = masters();
        // Bound and deleted before n3 was labelled: narrowing is all there is.
        let unlabelled = plan(&pods, &set, &Everyone, &none(), &no_labels());
        assert_eq!(unlabelled.release[0].avoid_nodes, ["n3"]);
        // n3 carries the anchor label: it keeps m1 off while m0 is there, and lets it
        // in once m0 is gone, where narrowing would keep it off for good.
        let mut labelled = Rooms::new();
        let n3 = labelled.entry("n3".to_string()).or_default();
        std::sync::Arc::make_mut(&mut n3.info)
            .labels
            .insert(anchor_label("masters"), "true".to_string());
        let plan = plan(&pods, &set, &Everyone, &none(), &labelled);
        assert!(plan.release[0].avoid_nodes.is_empty());
    }

    /// A master held as the webhook leaves it: gated, with a required term, asking
    /// for one cpu; `extra` is merged into its spec.
    fn held_master(name: &str, extra: serde_json::Value) -> ExclusionPod {
        let mut spec = json!({
            "schedulingGates": [{"name": AVOID_GATE}],
            "containers": [{"name": "c", "resources": {"requests": {"cpu": "1"}}}],
            "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution":
                {"nodeSelectorTerms": [{"matchExpressions": [
                    {"key": anchor_label("masters"), "operator": "DoesNotExist"},
                    {"key": placed_label("masters"), "operator": "DoesNotExist"}]}]}}},
        });
        for (k, v) in extra.as_object().unwrap() {
            spec[k] = v.clone();
        }
        let pod: PodObject = serde_json::from_value(json!({
            "metadata": {"name": name, "namespace": "db", "uid": name,
                "labels": {"role": "master"}, "annotations": {"berth.io/applied": "masters"}},
            "spec": spec}))
        .unwrap();
        ExclusionPod::from_pod(&pod).unwrap()
    }

    /// Nodes n00.. with a hostname label (h00..) and `cpu` free each.
    fn nodes(count: usize, cpu: f64) -> Rooms {
        (0..count)
            .map(|i| {
                let mut room = super::super::rooms::NodeRoom::default();
                std::sync::Arc::make_mut(&mut room.info)
                    .labels
                    .insert(HOSTNAME_LABEL.into(), format!("h{i:02}"));
                room.free = BTreeMap::from([("cpu".into(), cpu), ("pods".into(), 110.0)]);
                (format!("n{i:02}"), room)
            })
            .collect()
    }

    fn hosts<'a>(release: &'a Release) -> BTreeSet<&'a str> {
        release.hosts.iter().flatten().map(String::as_str).collect()
    }

    #[test]
    fn pods_that_avoid_each_other_go_at_once_each_on_its_own_nodes() {
        let pods: Vec<ExclusionPod> = ["m1", "m2", "m3"]
            .iter()
            .map(|n| held_master(n, json!({})))
            .collect();
        let plan = plan(&pods, &masters(), &Everyone, &none(), &nodes(12, 4.0));
        assert_eq!(names(&plan.release), ["m1", "m2", "m3"]);
        let sets: Vec<BTreeSet<&str>> = plan.release.iter().map(hosts).collect();
        for (i, set) in sets.iter().enumerate() {
            assert_eq!(set.len(), 4, "12 nodes shared by 3: {set:?}");
            for other in &sets[i + 1..] {
                assert!(set.is_disjoint(other), "{set:?} and {other:?}");
            }
        }
        assert!(plan.release.iter().all(|r| r.avoid_nodes.is_empty()));
    }

    #[test]
    fn a_set_holds_only_nodes_where_the_pod_fits_and_no_pod_it_avoids_is_bound() {
        let mut rooms = nodes(6, 4.0);
        // n00: no room; n01: tainted; n02: a master is bound there; n03: no
        // hostname label. n04 and n05 are left.
        rooms.get_mut("n00").unwrap().free.insert("cpu".into(), 0.5);
        std::sync::Arc::make_mut(&mut rooms.get_mut("n01").unwrap().info).taints = vec![
            serde_json::from_value(
                json!({"key": "dedicated", "value": "gpu", "effect": "NoSchedule"}),
            )
            .unwrap(),
        ];
        std::sync::Arc::make_mut(&mut rooms.get_mut("n03").unwrap().info)
            .labels
            .clear();
        let pods = vec![
            pod("m0", "master", &["masters"], false, Some("n02")),
            held_master("m1", json!({})),
        ];
        let plan = plan(&pods, &masters(), &Everyone, &none(), &rooms);
        assert_eq!(hosts(&plan.release[0]), BTreeSet::from(["h04", "h05"]));
    }

    #[test]
    fn a_hostname_two_nodes_carry_names_neither_in_a_set() {
        // n05 copies n02's hostname (a kubelet may set it on its own Node); a master
        // is bound to n02. A set naming h02 would let m1 onto n02 beside m0.
        let mut rooms = nodes(6, 4.0);
        std::sync::Arc::make_mut(&mut rooms.get_mut("n05").unwrap().info)
            .labels
            .insert(HOSTNAME_LABEL.into(), "h02".into());
        for bound in ["n02", "n05"] {
            let pods = vec![
                pod("m0", "master", &["masters"], false, Some(bound)),
                held_master("m1", json!({})),
            ];
            let plan = plan(&pods, &masters(), &Everyone, &none(), &rooms);
            let set = hosts(&plan.release[0]);
            assert!(
                !set.contains("h02"),
                "m0 on {bound}, m1 released onto {set:?}"
            );
            assert_eq!(set, BTreeSet::from(["h00", "h01", "h03", "h04"]));
        }
    }

    /// A master released onto `hosts` (read back from its affinity), not bound yet.
    fn in_flight_master(name: &str, hosts: &[&str]) -> ExclusionPod {
        let released: PodObject = serde_json::from_value(json!({
            "metadata": {"name": name, "namespace": "db", "uid": name,
                "labels": {"role": "master"}, "annotations": {"berth.io/applied": "masters"}},
            "spec": {"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution":
                {"nodeSelectorTerms": [{"matchExpressions": [
                    {"key": anchor_label("masters"), "operator": "DoesNotExist"},
                    {"key": HOSTNAME_LABEL, "operator": "In", "values": hosts}]}]}}}}}))
        .unwrap();
        ExclusionPod::from_pod(&released).unwrap()
    }

    #[test]
    fn a_pod_in_flight_keeps_its_set_and_the_next_takes_other_nodes() {
        let m1 = in_flight_master("m1", &["h00", "h01", "h02", "h03"]);
        assert_eq!(m1.hosts.as_ref().map(BTreeSet::len), Some(4));
        let pods = vec![m1, held_master("m2", json!({}))];
        let plan = plan(&pods, &masters(), &Everyone, &none(), &nodes(8, 4.0));
        assert_eq!(names(&plan.release), ["m2"]);
        assert_eq!(
            hosts(&plan.release[0]),
            BTreeSet::from(["h04", "h05", "h06", "h07"])
        );
        // Once no node is left beside m1, m2 waits behind it.
        let plan = super::plan(&pods, &masters(), &Everyone, &none(), &nodes(4, 4.0));
        assert!(plan.release.is_empty());
        assert!(matches!(&plan.waiting[0].reason, Hold::Behind { pod, .. } if pod.name == "m1"));
    }

    #[test]
    fn held_pods_share_the_nodes_no_set_in_flight_holds() {
        // Twelve of sixteen nodes are in the sets of six pods in flight: the two
        // held pods split the four left, rather than the first taking them all.
        let mut pods: Vec<ExclusionPod> = (0..6)
            .map(|i| {
                let set = [format!("h{:02}", 2 * i), format!("h{:02}", 2 * i + 1)];
                in_flight_master(&format!("f{i}"), &[&set[0], &set[1]])
            })
            .collect();
        pods.extend(["m1", "m2"].map(|n| held_master(n, json!({}))));
        let plan = plan(&pods, &masters(), &Everyone, &none(), &nodes(16, 4.0));
        assert_eq!(names(&plan.release), ["m1", "m2"]);
        let (a, b) = (hosts(&plan.release[0]), hosts(&plan.release[1]));
        assert_eq!((a.len(), b.len()), (2, 2), "{a:?} {b:?}");
        assert!(a.is_disjoint(&b), "{a:?} {b:?}");
        let free = BTreeSet::from(["h12", "h13", "h14", "h15"]);
        assert!(a.is_subset(&free) && b.is_subset(&free), "{a:?} {b:?}");
    }

    #[test]
    fn with_a_pod_it_avoids_on_every_node_it_waits_instead_of_being_narrowed_off_all() {
        // A rolling update's surge at full capacity: a master on each node.
        let mut pods: Vec<ExclusionPod> = (0..3)
            .map(|i| {
                pod(
                    &format!("m{i}"),
                    "master",
                    &["masters"],
                    false,
                    Some(&format!("n{i:02}")),
                )
            })
            .collect();
        pods.push(held_master("surge", json!({})));
        pods.push(held_master("surge2", json!({})));
        // As the controller keeps them: the masters' nodes carry the anchor and
        // placed labels (which the surge pod's own term keeps it off), and one more
        // node is a dedicated pool it does not tolerate.
        let mut rooms = nodes(4, 4.0);
        for node in ["n00", "n01", "n02"] {
            let labels = &mut Arc::make_mut(&mut rooms.get_mut(node).unwrap().info).labels;
            labels.insert(anchor_label("masters"), "true".to_string());
            labels.insert(placed_label("masters"), "true".to_string());
        }
        Arc::make_mut(&mut rooms.get_mut("n03").unwrap().info).taints = vec![
            serde_json::from_value(json!({"key": "berth.io/pool", "value": "cdn",
                "effect": "NoSchedule"}))
            .unwrap(),
        ];
        for rooms in [nodes(3, 4.0), rooms.clone()] {
            let plan = plan(&pods, &masters(), &Everyone, &none(), &rooms);
            assert!(plan.release.is_empty(), "{:?}", names(&plan.release));
            for waiting in &plan.waiting {
                assert!(
                    matches!(&waiting.reason, Hold::NoNodeFree { policy } if policy == "masters"),
                    "{:?}",
                    waiting.reason
                );
            }
            assert_eq!(plan.waiting.len(), 2);
        }
        // One of them has left its node, and the controller took its labels off:
        // the surge pod goes there.
        pods.remove(0);
        let labels = &mut Arc::make_mut(&mut rooms.get_mut("n00").unwrap().info).labels;
        labels.remove(&anchor_label("masters"));
        labels.remove(&placed_label("masters"));
        let plan = super::plan(&pods, &masters(), &Everyone, &none(), &rooms);
        assert_eq!(names(&plan.release), ["surge"]);
        assert_eq!(hosts(&plan.release[0]), BTreeSet::from(["h00"]));
    }

    #[test]
    fn a_pod_that_fits_no_node_for_other_reasons_is_not_held_for_exclusion() {
        // A master on the one node, which is also too small for the held one: a
        // freed node would not take it either, so berth lets the scheduler say why.
        let pods = vec![
            pod("m0", "master", &["masters"], false, Some("n00")),
            held_master(
                "big",
                json!({"containers": [{"name": "c",
                "resources": {"requests": {"cpu": "8"}}}]}),
            ),
        ];
        let plan = plan(&pods, &masters(), &Everyone, &none(), &nodes(1, 4.0));
        assert_eq!(names(&plan.release), ["big"]);
        assert_eq!(plan.release[0].avoid_nodes, ["n00"]);
    }

    #[test]
    fn a_pod_whose_fit_cannot_be_predicted_goes_alone() {
        let pods = vec![
            held_master(
                "m1",
                json!({"containers": [{"name": "c", "ports": [{"hostPort": 80}]}]}),
            ),
            held_master("m2", json!({})),
        ];
        let plan = plan(&pods, &masters(), &Everyone, &none(), &nodes(8, 4.0));
        assert_eq!(names(&plan.release), ["m1"]);
        assert_eq!(
            plan.release[0].hosts, None,
            "any node, as the scheduler finds"
        );
        assert!(
            matches!(&plan.waiting[0].reason, Hold::Behind { pod, .. } if pod.name == "m1"),
            "m1 may take any node, so m2 has no set free of it"
        );
    }

    #[test]
    fn with_no_room_predicted_the_first_goes_alone_and_the_scheduler_decides() {
        let pods = vec![held_master("m1", json!({})), held_master("m2", json!({}))];
        let plan = plan(&pods, &masters(), &Everyone, &none(), &nodes(3, 0.5));
        assert_eq!(names(&plan.release), ["m1"]);
        assert_eq!(plan.release[0].hosts, None);
        assert_eq!(plan.waiting.len(), 1);
    }

    #[test]
    fn a_set_is_read_back_as_the_union_of_terms_each_confined() {
        let read = |terms: serde_json::Value| {
            confined_hosts(&serde_json::from_value::<Vec<NodeSelectorTerm>>(terms).unwrap())
        };
        let host_in =
            |values: &[&str]| json!({"key": HOSTNAME_LABEL, "operator": "In", "values": values});
        assert_eq!(
            read(json!([
                {"matchExpressions": [host_in(&["a", "b"]), host_in(&["b", "c"])]},
                {"matchExpressions": [host_in(&["d"])]},
                {}
            ])),
            Some(BTreeSet::from(["b".to_string(), "d".to_string()])),
            "ANDed within a term, ORed across, an empty term adds nothing"
        );
        assert_eq!(
            read(json!([{"matchExpressions": [host_in(&["a"])]},
                {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["z"]}]}])),
            None,
            "the second term lets it go anywhere in zone z"
        );
    }

    #[test]
    fn a_release_the_cache_has_not_shown_yet_keeps_its_set() {
        let mut pods = vec![held_master("m1", json!({})), held_master("m2", json!({}))];
        let mut released = Released::default();
        let set = ["h00".to_string(), "h01".to_string()];
        released.record(&pods[0], Some(&set));
        released.overlay(&mut pods);
        assert_eq!(pods[0].gate, None);
        let plan = plan(&pods, &masters(), &Everyone, &none(), &nodes(6, 4.0));
        assert_eq!(names(&plan.release), ["m2"]);
        assert!(hosts(&plan.release[0]).is_disjoint(&BTreeSet::from(["h00", "h01"])));
    }
}
