//! Releasing pods held by `berth.io/avoid` (see [`crate::placement::exclusion`] for which and
//! when): one test-guarded JSON Patch per pod that narrows its node affinity and
//! removes the gate.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, DeleteParams, EvictParams, ListParams, Patch, PatchParams, Preconditions};
use kube::runtime::events::EventType;
use serde_json::{Value, json};

use super::context::Pass;
use super::context::Snapshot;
use super::error::Error;
use super::events::{event, pod_reference, reference_of};
use super::writes::Kind;
use crate::placement::exclusion::{self, ExclusionPod, Hold};
use crate::placement::patch as ops;
use crate::placement::rooms::Rooms;
use futures::StreamExt;

use crate::names::{AVOID_GATE, FIELD_MANAGER, GANG_GATE, RANK_GATE};
use crate::objects::{MetaOnly, PodObject};
use crate::policy::{OptIn, PlacementPolicy, PolicySet};
use crate::telemetry::GateLabels;

/// The JSON Patch that releases a held pod: the gate must still be where we saw it
/// (so a stale cache cannot remove another gate, and no pod is released twice),
/// every required term that matches some node is narrowed (confined to the pod's
/// set of nodes, or kept off `avoid_nodes`), and the gate goes, in one update.
pub fn release_patch(release: &exclusion::Release, gate: usize) -> json_patch::Patch {
    let gate = gate.to_string();
    let mut ops = vec![ops::test(
        &["spec", "schedulingGates", &gate, "name"],
        json!(AVOID_GATE),
    )];
    const TERMS: [&str; 5] = [
        "spec",
        "affinity",
        "nodeAffinity",
        "requiredDuringSchedulingIgnoredDuringExecution",
        "nodeSelectorTerms",
    ];
    // What each term gains: a list key, whether a term already has that list, and
    // the entries.
    type Has = fn(&exclusion::Term) -> bool;
    let narrowing: Option<(&str, Has, Vec<Value>)> = match &release.hosts {
        Some(hosts) => Some((
            "matchExpressions",
            |t| t.expressions,
            vec![json!({"key": exclusion::HOSTNAME_LABEL, "operator": "In", "values": hosts})],
        )),
        // A node field selector takes one value, so one NotIn per node, ANDed.
        None if !release.avoid_nodes.is_empty() => Some((
            "matchFields",
            |t| t.fields,
            release
                .avoid_nodes
                .iter()
                .map(|node| json!({"key": "metadata.name", "operator": "NotIn", "values": [node]}))
                .collect(),
        )),
        None => None,
    };
    if let Some((list, has, entries)) = narrowing {
        for (i, term) in release.pod.terms.iter().enumerate() {
            // A term that matches no node would match some once it had an entry.
            if term.matches_nothing {
                continue;
            }
            let i = i.to_string();
            let list_path = [&TERMS[..], &[&i, list]].concat();
            if has(term) {
                let item = [&list_path[..], &["-"]].concat();
                for entry in &entries {
                    ops.push(ops::add(&item, entry.clone()));
                }
            } else {
                ops.push(ops::add(&list_path, json!(entries)));
            }
        }
    }
    ops.push(ops::remove(&["spec", "schedulingGates", &gate]));
    json_patch::Patch(ops)
}

/// Seconds since `created`, for the held-time histogram.
pub fn held_seconds(created: Option<&k8s_openapi::apimachinery::pkg::apis::meta::v1::Time>) -> f64 {
    let now = k8s_openapi::jiff::Timestamp::now().as_millisecond();
    created
        .map(|t| (now - t.0.as_millisecond()) as f64 / 1000.0)
        .unwrap_or_default()
        .max(0.0)
}

/// How often the controller lists policies at most, to tell a policy its cache has
/// not seen yet from one that is gone.
const LIST_EVERY: Duration = Duration::from_secs(1);

/// Held pods that name policies the controller's cache does not hold. The webhook's
/// and the controller's watches lag independently, so a pod may name a policy
/// created a moment ago; releasing it as if the policy were gone would ignore what
/// the policy avoids. A pod names only policies that existed when it was admitted,
/// so one missing from a list taken after the controller first saw the pod is gone.
/// One list of names answers for every pod, at most every `LIST_EVERY`, however
/// many names pods carry: a tenant's pod naming thousands costs nothing more.
#[derive(Debug, Default)]
pub struct PolicyLookups {
    /// When the controller first saw each held pod naming a policy it lacks.
    first_seen: BTreeMap<String, Instant>,
    /// The last list of policy names, and when it came back.
    listed: Option<(Instant, BTreeSet<String>)>,
}

impl PolicyLookups {
    /// The held pods that must wait for a policy the cache has not seen, by pod key,
    /// with the policy. `missing` is every held pod that names policies the cache
    /// lacks, by pod key, with those policies in the order its record names them.
    pub async fn waits(
        &mut self,
        client: &kube::Client,
        missing: &BTreeMap<String, Vec<String>>,
    ) -> BTreeMap<String, String> {
        let now = Instant::now();
        self.first_seen.retain(|key, _| missing.contains_key(key));
        for key in missing.keys() {
            self.first_seen.entry(key.clone()).or_insert(now);
        }
        let listed_since = |at: &Instant| missing.keys().all(|key| self.first_seen[key] < *at);
        let fresh_enough = self.listed.as_ref().is_some_and(|(at, _)| listed_since(at));
        let may_list = self
            .listed
            .as_ref()
            .is_none_or(|(at, _)| now.duration_since(*at) >= LIST_EVERY);
        if !missing.is_empty() && !fresh_enough && may_list {
            let api: Api<MetaOnly<PlacementPolicy>> = Api::all(client.clone());
            match api.list(&ListParams::default()).await {
                Ok(list) => {
                    let names = list
                        .items
                        .iter()
                        .filter_map(|p| p.metadata.name.clone())
                        .collect();
                    self.listed = Some((Instant::now(), names));
                }
                // Unknown either way: the pods wait, a later pass asks again.
                Err(e) => tracing::warn!(error = %e, "cannot list policies"),
            }
        }
        let mut waits = BTreeMap::new();
        for (key, names) in missing {
            let first = self.first_seen[key];
            let names: Vec<&String> = names.iter().collect();
            if let Some(name) = waiting_for(&names, first, self.listed.as_ref()) {
                waits.insert(key.clone(), name.clone());
            }
        }
        waits
    }
}

/// Which of `names` (policies a held pod names, missing from the cache) the pod
/// waits for, given when the controller first saw it and the last list of policies.
/// A list taken since settles it: a name listed exists and is waited for, one not
/// listed is gone. With no list since, the pod waits for the first.
fn waiting_for<'n>(
    names: &[&'n String],
    first_seen: Instant,
    listed: Option<&(Instant, BTreeSet<String>)>,
) -> Option<&'n String> {
    match listed {
        Some((at, listed)) if *at > first_seen => {
            names.iter().copied().find(|n| listed.contains(*n))
        }
        _ => names.first().copied(),
    }
}

/// Releases the held pods that may go now and tells the others, with an Event,
/// which pod they wait for.
#[tracing::instrument(name = "release pass", skip_all, fields(pods = pods.len()))]
pub async fn release_held_pods(
    pass: &Pass<'_>,
    snapshot: &Snapshot,
    pods: &[std::sync::Arc<PodObject>],
    rooms: &Rooms,
    unseen: &BTreeMap<String, String>,
    released: &mut exclusion::Released,
    reported: &mut super::events::Reported,
) {
    let now = k8s_openapi::jiff::Timestamp::now();
    // Nothing held: nothing to plan (a pass is then as cheap as a look at each pod).
    if !pods.iter().any(|p| p.gate(AVOID_GATE).is_some()) {
        released.overlay(&mut []);
        pass.metrics.set_held(AVOID_GATE, std::iter::empty(), now);
        return;
    }
    let policies = &snapshot.compiled.set;
    let mut all = exclusion::pods_to_plan(pods, policies, &*snapshot.namespaces);
    released.overlay(&mut all);
    released.note_unplaceable(
        &mut all,
        k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(now),
    );
    if let Some(after) = pass.options.requeue_unschedulable {
        exclusion::set_aside(
            &mut all,
            after,
            k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(now),
        );
        report_set_aside(pass, &all, reported);
    }
    let plan = exclusion::plan(&all, policies, &*snapshot.namespaces, unseen, rooms);
    // Held now: gated and not released in this pass. (In a block: a set of
    // pointers is not Send, and must be gone before the next await.)
    {
        let releasing: std::collections::HashSet<*const ExclusionPod> = plan
            .release
            .iter()
            .map(|r| std::ptr::from_ref(r.pod))
            .collect();
        let still_held = all
            .iter()
            .filter(|p| p.gate.is_some() && !releasing.contains(&std::ptr::from_ref(*p)));
        pass.metrics
            .set_held(AVOID_GATE, still_held.map(|p| p.created.as_ref()), now);
    }
    let patches = plan.release.iter().filter_map(|release| {
        let pod = release.pod;
        if pod.terms.is_empty() && !release.avoid_nodes.is_empty() {
            // berth gives every pod it holds a required term; without one there is
            // nothing to narrow, and the labels must do.
            tracing::warn!(pod = %pod.name, "held pod has no required node affinity to narrow");
        }
        let patch = release_patch(release, pod.gate?);
        Some((release, pod.namespace.clone(), pod.name.clone(), patch))
    });
    for (release, result) in send_patches(pass, patches.collect()).await {
        let pod = release.pod;
        match result {
            Ok(()) => {
                released.record(pod, release.hosts.as_deref());
                pass.metrics
                    .gated_seconds
                    .get_or_create(&GateLabels::new(AVOID_GATE))
                    .observe(held_seconds(pod.created.as_ref()));
                tracing::info!(pod = %pod.name, namespace = %pod.namespace, keep_off = ?release.avoid_nodes, hosts = ?release.hosts, "released from {AVOID_GATE}");
            }
            Err(e) => {
                tracing::warn!(pod = %pod.name, error = %e, "release failed; {}", e.retry())
            }
        }
    }
    for waiting in &plan.waiting {
        // One event per held pod, policy and cause. The recorder folds Events with
        // the same reason and action on a pod into one series and keeps its first
        // note, so each cause has its own action, and the note must not name a
        // blocker that changes.
        let pod = waiting.pod;
        let (policy, action, note) = match &waiting.reason {
            Hold::Behind {
                pod: behind,
                policy,
            } => (
                policy,
                // Its own series once the scheduler cannot place the pod ahead.
                if behind
                    .unplaced
                    .as_ref()
                    .is_some_and(|(_, why)| why.is_some())
                {
                    "HoldBehindUnplaceable"
                } else {
                    "Hold"
                },
                behind_note(pod, behind, policy),
            ),
            Hold::NoNodeFree { policy } => (
                policy,
                "HoldUntilNodeFree",
                format!("held by {AVOID_GATE}: {}", exclusion::no_node_free(policy)),
            ),
            Hold::Unreadable => (
                &String::new(),
                "HoldUnreadable",
                format!("held by {AVOID_GATE}: {}", exclusion::unreadable()),
            ),
            // A policy not seen yet is a moment's lag, not worth an Event.
            Hold::PolicyNotSeen(_) => continue,
        };
        let key = format!(
            "held/{}/{policy}/{action}",
            pod.uid.as_deref().unwrap_or(&pod.name)
        );
        let reference = pod_reference(&pod.namespace, &pod.name, pod.uid.as_deref());
        let event = event(EventType::Normal, "HeldForExclusion", action, note);
        reported.publish(pass.events, key, event, &reference);
    }
    if let Some(after) = pass.options.requeue_unschedulable {
        requeue_blockers(pass, snapshot, &plan, (after, now), reported).await;
    }
}

/// The pods [`requeue_blockers`] evicts: each that a held pod waits behind (one
/// whose namespace opts into the policy that holds it: a pod held only through
/// `anchorNamespaces: All` gets nobody evicted), remade by its controller,
/// reported Unschedulable for `after` or longer; with how long and the
/// scheduler's message.
fn to_requeue<'a>(
    plan: &exclusion::Plan<'a>,
    policies: &PolicySet,
    opt_in: &dyn OptIn,
    (after, now): (Duration, k8s_openapi::jiff::Timestamp),
) -> Vec<(&'a ExclusionPod, f64, &'a str)> {
    let mut blockers: Vec<&ExclusionPod> = plan
        .waiting
        .iter()
        .filter_map(|w| match &w.reason {
            Hold::Behind { pod, policy } => {
                let policy = policies.get(policy)?;
                opt_in.opts_in(policy, &w.pod.namespace).then_some(*pod)
            }
            _ => None,
        })
        .filter(|pod| pod.remade)
        .collect();
    blockers.sort_by_key(|p| (&p.namespace, &p.name));
    blockers.dedup_by_key(|p| (&p.namespace, &p.name));
    blockers
        .into_iter()
        .filter_map(|pod| {
            let (since, why) = pod.unplaced.as_ref()?;
            let waited = now.duration_since(since.0).as_secs_f64();
            let why = why.as_deref().unwrap_or(NOT_BOUND);
            (waited >= after.as_secs_f64()).then_some((pod, waited, why))
        })
        .collect()
}

/// Why a released pod is not bound when the scheduler has not said: no
/// scheduler has reported on it (one named by `schedulerName` that nobody runs).
const NOT_BOUND: &str = "no scheduler has bound it or reported why";

/// Tells each pod set aside ([`exclusion::set_aside`]) so, with a Warning Event:
/// the pods it must avoid no longer wait behind it.
fn report_set_aside(
    pass: &Pass<'_>,
    pods: &[ExclusionPod],
    reported: &mut super::events::Reported,
) {
    for pod in pods.iter().filter(|p| p.set_aside) {
        let why = pod
            .unplaced
            .as_ref()
            .and_then(|(_, why)| why.as_deref())
            .unwrap_or(NOT_BOUND);
        let note = format!(
            "set aside: released by {AVOID_GATE} and still not bound ({why}); it no longer holds              the pods it must avoid, which keep off its nodes by berth's labels"
        );
        let reference = pod_reference(&pod.namespace, &pod.name, pod.uid.as_deref());
        let key = format!("set-aside/{}", pod.key());
        let event = event(EventType::Warning, "SetAsideUnplaceable", "SetAside", note);
        reported.publish(pass.events, key, event, &reference);
    }
}

/// Sends to the back of the queue each pod that holds others back while the
/// scheduler cannot place it: released, reported Unschedulable for longer than
/// `after`, and owned by a controller, it is evicted (only if unchanged since the
/// cache saw it) so that its controller makes it again, held behind the pods that
/// waited. Its set is free once it is gone, so no pair shares a node. A pod
/// without a controller would be lost, so it keeps its place.
async fn requeue_blockers(
    pass: &Pass<'_>,
    snapshot: &Snapshot,
    plan: &exclusion::Plan<'_>,
    wait: (Duration, k8s_openapi::jiff::Timestamp),
    reported: &mut super::events::Reported,
) {
    let policies = &snapshot.compiled.set;
    for (pod, waited, why) in to_requeue(plan, policies, &*snapshot.namespaces, wait) {
        let api: Api<Pod> = Api::namespaced(pass.client.clone(), &pod.namespace);
        let unchanged = EvictParams {
            delete_options: Some(DeleteParams {
                preconditions: Some(Preconditions {
                    uid: pod.uid.clone(),
                    resource_version: pod.resource_version.clone(),
                }),
                ..DeleteParams::default()
            }),
            ..EvictParams::default()
        };
        match pass
            .writes
            .make(Kind::Eviction, api.evict(&pod.name, &unchanged))
            .await
        {
            Ok(_) => {
                tracing::info!(pod = %pod.name, namespace = %pod.namespace, "requeued a pod the scheduler cannot place");
                let note = format!(
                    "evicted: released {waited:.0}s ago, the scheduler cannot place it ({why}), and \
                     pods of its policy waited behind it; its controller makes it again, held \
                     behind them"
                );
                let reference = pod_reference(&pod.namespace, &pod.name, pod.uid.as_deref());
                let key = format!("requeued/{}", pod.key());
                let event = event(EventType::Warning, "RequeuedUnschedulable", "Evict", note);
                reported.publish(pass.events, key, event, &reference);
            }
            // Bound, changed or gone since the cache saw it (nothing holds back
            // then), or not for now: the pass after the retry looks again.
            Err(e) => {
                tracing::debug!(pod = %pod.name, error = %e, "not requeued; {}", e.retry());
            }
        }
    }
}

/// Tells, with a Warning Event, each pod berth routed to a Required pool that the
/// scheduler cannot place while its own required pod affinity ties it to other
/// pods: where the webhook could not know whether those pods run on the pool
/// (they came later, or their group was routed apart), this says so at once
/// rather than leave a silent Pending pod (contract, "Co-scheduled pods").
pub fn report_routing_conflicts(
    pass: &Pass<'_>,
    snapshot: &Snapshot,
    pods: &[std::sync::Arc<PodObject>],
    reported: &mut super::events::Reported,
) {
    for pod in pods {
        let beside = pod.requires_pod_affinity();
        if !beside || pod.node_name().is_some() || !pod.spec.scheduling_gates.is_empty() {
            continue;
        }
        // Only when the scheduler says the pod affinity is what no node satisfies
        // (a group waiting for room is not told to route differently).
        let Some((_, why)) = pod
            .unschedulable()
            .filter(|(_, why)| why.contains("pod affinity"))
        else {
            continue;
        };
        let entitled = crate::placement::opt_in::pod_entitlements(
            pod,
            &snapshot.compiled.set,
            &*snapshot.namespaces,
        );
        let pools: Vec<&str> = entitled
            .iter()
            .filter(|p| {
                p.dedicated_pool()
                    .is_some_and(|pool| pool.placement == crate::policy::crd::Placement::Required)
            })
            .map(|p| p.name.as_str())
            .collect();
        if pools.is_empty() {
            continue;
        }
        let note = format!(
            "berth routes it to pool {} and its own required pod affinity ties it to other \
             pods; the scheduler finds no node for both ({why}): route the group with the \
             policy's coscheduled",
            pools.join(", ")
        );
        let reference = reference_of(pod);
        let key = format!("beside/{}", pod.key());
        let event = event(EventType::Warning, "RoutedApartFromGroup", "Route", note);
        reported.publish(pass.events, key, event, &reference);
    }
}

/// How many release patches are on their way at once.
const PATCHES_IN_FLIGHT: usize = 32;

/// Sends JSON Patches to pods (each item: what it is for, namespace, name, patch),
/// several at once, and returns each item with its result.
async fn send_patches<T: Send>(
    pass: &Pass<'_>,
    items: Vec<(T, String, String, json_patch::Patch)>,
) -> Vec<(T, Result<(), Error>)> {
    let params = PatchParams {
        field_manager: Some(FIELD_MANAGER.into()),
        ..PatchParams::default()
    };
    let mut requests = Vec::with_capacity(items.len());
    for (item, namespace, name, patch) in items {
        let api: Api<PodObject> = Api::namespaced(pass.client.clone(), &namespace);
        let params = params.clone();
        let writes = pass.writes;
        requests.push(async move {
            let result = writes
                .make(
                    Kind::Release,
                    api.patch(&name, &params, &Patch::<()>::Json(patch)),
                )
                .await
                .map(drop);
            (item, result)
        });
    }
    futures::stream::iter(requests)
        .buffer_unordered(PATCHES_IN_FLIGHT)
        .collect()
        .await
}

/// The JSON Patch that removes the group gate `name` at `index`: the gate must
/// still be where the cache saw it, so a stale cache cannot remove another gate.
fn gate_patch(name: &str, index: usize) -> json_patch::Patch {
    let index = index.to_string();
    json_patch::Patch(vec![
        ops::test(&["spec", "schedulingGates", &index, "name"], json!(name)),
        ops::remove(&["spec", "schedulingGates", &index]),
    ])
}

/// Releases the pods the group plan lets go, gangs all together, and tells the
/// others what they wait for with an Event (one per pod and cause).
pub async fn release_group_pods(
    pass: &Pass<'_>,
    plan: &crate::placement::group_plan::GroupPlan<'_>,
    reported: &mut super::events::Reported,
) {
    let now = k8s_openapi::jiff::Timestamp::now();
    for gate in [RANK_GATE, GANG_GATE] {
        let waiting = plan.waiting.iter().filter(|(h, _)| h.gate == gate);
        let created = waiting.map(|(h, _)| h.pod.metadata.creation_timestamp.as_ref());
        pass.metrics.set_held(gate, created, now);
    }
    // A gang's members go in one burst, so the group is released within one pass.
    let patches = plan.release.iter().filter_map(|held| {
        let meta = &held.pod.metadata;
        let patch = gate_patch(held.gate, held.pod.gate(held.gate)?);
        Some((held, meta.namespace.clone()?, meta.name.clone()?, patch))
    });
    for (held, result) in send_patches(pass, patches.collect()).await {
        let name = held.pod.metadata.name.as_deref().unwrap_or_default();
        match result {
            Ok(()) => {
                pass.metrics
                    .gated_seconds
                    .get_or_create(&GateLabels::new(held.gate))
                    .observe(held_seconds(held.pod.metadata.creation_timestamp.as_ref()));
                tracing::info!(pod = %name, gate = held.gate, "released");
            }
            Err(e) => {
                tracing::warn!(pod = %name, gate = held.gate, error = %e, "release failed; {}", e.retry())
            }
        }
    }
    for (held, wait) in &plan.waiting {
        let meta = &held.pod.metadata;
        let uid = meta.uid.clone().unwrap_or_default();
        let key = format!("group/{uid}/{}/{}", wait.reason, wait.cause);
        let reference = reference_of(held.pod);
        let type_ = if wait.reason == "GangTimeout" {
            EventType::Warning
        } else {
            EventType::Normal
        };
        let event = event(type_, wait.reason, "Hold", wait.note.clone());
        reported.publish(pass.events, key, event, &reference);
    }
}

/// What a pod held behind `behind` is told. The Event is in the held pod's
/// namespace, which its tenant reads: a pod of another namespace (which opts
/// into the same policy, or any with `anchorNamespaces: All`) is not named, nor
/// is the scheduler's message about it, which would tell one tenant another's
/// pod names, resources and nodes. `berth explain pod`, with the reader's own
/// rights, names it.
fn behind_note(held: &ExclusionPod, behind: &ExclusionPod, policy: &str) -> String {
    let same = held.namespace == behind.namespace;
    let who = if same {
        format!("first {}/{}", behind.namespace, behind.name)
    } else {
        "first a pod of another namespace".to_owned()
    };
    let why = match behind.unplaced.as_ref().and_then(|(_, why)| why.as_ref()) {
        Some(why) if same => format!(" (the scheduler cannot place it: {why})"),
        Some(_) => " (the scheduler cannot place it)".to_owned(),
        None => String::new(),
    };
    format!(
        "held by {AVOID_GATE}: a pod it must avoid (policy {policy}, {who}) is still \
         being placed; it is released once that pod is bound{why}"
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::objects::PodObject;
    use crate::placement::opt_in::tests::{Everyone, Only};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

    /// A master of the `masters` policy: held, or released onto node h1 and
    /// reported Unschedulable since `since`, controlled by an `owner` of that kind
    /// (none for "").
    fn master(name: &str, held: bool, since: Option<&str>, owner: &str) -> ExclusionPod {
        let version = if owner == "ReplicaSet" {
            "apps/v1"
        } else {
            "example/v1"
        };
        let owner = if owner.is_empty() {
            json!([])
        } else {
            json!([{"apiVersion": version, "kind": owner, "name": "m", "uid": "s", "controller": true}])
        };
        let status = since.map_or(json!({}), |since| {
            json!({"conditions": [
            {"type": "PodScheduled", "status": "False", "reason": "Unschedulable",
                "message": "0/3 nodes are available", "lastTransitionTime": since}]})
        });
        let gates = if held {
            json!([{"name": AVOID_GATE}])
        } else {
            json!([])
        };
        let pod: PodObject = serde_json::from_value(json!({
            "metadata": {"name": name, "namespace": "db", "uid": name, "resourceVersion": "7",
                "labels": {"role": "master"}, "annotations": {"berth.io/applied": "masters"},
                "ownerReferences": owner},
            "spec": {"schedulingGates": gates, "affinity": {"nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
                    {"matchExpressions": [{"key": "kubernetes.io/hostname", "operator": "In",
                        "values": ["h1"]}]}]}}}},
            "status": status}))
        .unwrap();
        ExclusionPod::from_pod(&pod).unwrap()
    }

    #[test]
    fn a_blocker_the_scheduler_cannot_place_is_requeued_after_the_wait_if_its_controller_remakes_it()
     {
        let policies = crate::policy::test_policies(&[(
            "masters",
            json!({"podSelector": {"matchLabels": {"role": "master"}},
                "avoid": {"matchLabels": {"role": "master"}}}),
        )]);
        let at = |t: &str| Time(t.parse().unwrap());
        let now = at("2026-11-25T12:10:00Z");
        let requeued = |pods: &[ExclusionPod], after: u64, opt_in: &dyn OptIn| -> Vec<String> {
            let plan = exclusion::plan(pods, &policies, opt_in, &BTreeMap::new(), &Rooms::new());
            to_requeue(
                &plan,
                &policies,
                opt_in,
                (Duration::from_secs(after), now.0),
            )
            .into_iter()
            .map(|(p, waited, why)| format!("{} {waited:.0} {why}", p.name))
            .collect()
        };
        // The condition says since 12:00 (the gate's SchedulingGated kept its
        // time); the controller first saw it Unschedulable at 12:05.
        let mut released = exclusion::Released::default();
        let mut pods = [
            master("m0", false, Some("2026-11-25T12:00:00Z"), "ReplicaSet"),
            master("m1", true, None, "ReplicaSet"),
        ];
        released.note_unplaceable(&mut pods, at("2026-11-25T12:05:00Z"));
        released.note_unplaceable(&mut pods, at("2026-11-25T12:09:00Z"));
        assert_eq!(
            requeued(&pods, 120, &Everyone),
            ["m0 300 0/3 nodes are available"]
        );
        assert!(requeued(&pods, 600, &Everyone).is_empty(), "not yet");
        assert!(
            requeued(&pods[..1], 120, &Everyone).is_empty(),
            "no one waits behind it"
        );
        assert!(
            requeued(&pods, 120, &Only("elsewhere")).is_empty(),
            "only a waiter whose namespace opts into the policy counts"
        );
        for owner in ["Job", "TaskRun", ""] {
            let mut pods = [
                master("m0", false, Some("2026-11-25T12:00:00Z"), owner),
                master("m1", true, None, owner),
            ];
            released.note_unplaceable(&mut pods, at("2026-11-25T12:05:00Z"));
            assert!(
                requeued(&pods, 120, &Everyone).is_empty(),
                "{owner}: not remade"
            );
        }
        // Never reported Unschedulable (its scheduler may not exist): the wait
        // counts from its release all the same.
        let mut placing = [
            master("m0", false, None, "ReplicaSet"),
            master("m1", true, None, "ReplicaSet"),
        ];
        let mut released = exclusion::Released::default();
        released.note_unplaceable(&mut placing, at("2026-11-25T12:09:00Z"));
        assert!(requeued(&placing, 120, &Everyone).is_empty(), "not yet");
        assert_eq!(
            requeued(&placing, 30, &Everyone),
            [format!("m0 60 {NOT_BOUND}")]
        );
    }

    #[test]
    fn a_blocker_no_controller_makes_again_is_set_aside_after_the_wait() {
        let policies = crate::policy::test_policies(&[(
            "masters",
            json!({"podSelector": {"matchLabels": {"role": "master"}},
                "avoid": {"matchLabels": {"role": "master"}}}),
        )]);
        let at = |t: &str| Time(t.parse().unwrap());
        let released_at = at("2026-11-25T12:00:00Z");
        for (owner, after, set_aside) in [
            ("", 120, true),
            ("Job", 120, true),
            ("", 900, false),
            ("ReplicaSet", 120, false),
        ] {
            let mut pods = [
                master("m0", false, None, owner),
                master("m1", true, None, owner),
            ];
            let mut released = exclusion::Released::default();
            released.note_unplaceable(&mut pods, released_at.clone());
            exclusion::set_aside(
                &mut pods,
                Duration::from_secs(after),
                at("2026-11-25T12:05:00Z"),
            );
            assert_eq!(pods[0].set_aside, set_aside, "{owner:?} after {after}s");
            let plan =
                exclusion::plan(&pods, &policies, &Everyone, &BTreeMap::new(), &Rooms::new());
            let waits = plan.waiting.iter().any(|w| w.pod.name == "m1");
            assert_eq!(waits, !set_aside, "{owner:?}: m1 waits behind m0");
        }
    }

    fn held(terms: Value) -> ExclusionPod {
        let pod: PodObject = serde_json::from_value(json!({
            "metadata": {"name": "m1", "namespace": "db"},
            "spec": {"schedulingGates": [{"name": "other"}, {"name": AVOID_GATE}],
                "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution":
                    {"nodeSelectorTerms": terms}}}}}))
        .unwrap();
        ExclusionPod::from_pod(&pod).unwrap()
    }

    /// The pod's required terms once `patch` is applied to it.
    fn applied(pod: &ExclusionPod, terms: Value, patch: json_patch::Patch) -> Value {
        let mut doc = json!({"spec": {"schedulingGates": [{"name": "other"}, {"name": AVOID_GATE}],
            "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution":
                {"nodeSelectorTerms": terms}}}}});
        json_patch::patch(&mut doc, &patch).unwrap();
        assert_eq!(
            doc["spec"]["schedulingGates"],
            json!([{"name": "other"}]),
            "{pod:?}"
        );
        doc["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
            ["nodeSelectorTerms"]
            .clone()
    }

    #[test]
    fn a_release_confines_every_term_that_matches_some_node_to_its_set() {
        let terms = json!([
            {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a"]}]},
            {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["n1"]}]},
            {}
        ]);
        let pod = held(terms.clone());
        let release = exclusion::Release {
            pod: &pod,
            avoid_nodes: Vec::new(),
            hosts: Some(vec!["h1".into(), "h2".into()]),
        };
        let host_in =
            json!({"key": "kubernetes.io/hostname", "operator": "In", "values": ["h1", "h2"]});
        assert_eq!(
            applied(&pod, terms, release_patch(&release, 1)),
            json!([
                {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a"]}, host_in]},
                {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["n1"]}],
                    "matchExpressions": [host_in]},
                {}
            ]),
            "the empty term matches no node and stays so"
        );
    }

    #[test]
    fn a_release_alone_keeps_every_term_off_the_nodes_it_must_avoid() {
        let terms = json!([
            {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a"]}]},
            {"matchFields": [{"key": "metadata.name", "operator": "NotIn", "values": ["n0"]}]}
        ]);
        let pod = held(terms.clone());
        let release = exclusion::Release {
            pod: &pod,
            avoid_nodes: vec!["n1".into(), "n2".into()],
            hosts: None,
        };
        let not_in = |n: &str| json!({"key": "metadata.name", "operator": "NotIn", "values": [n]});
        assert_eq!(
            applied(&pod, terms, release_patch(&release, 1)),
            json!([
                {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a"]}],
                    "matchFields": [not_in("n1"), not_in("n2")]},
                {"matchFields": [not_in("n0"), not_in("n1"), not_in("n2")]}
            ])
        );
    }

    #[test]
    fn a_name_is_gone_only_when_a_list_taken_after_the_pod_lacks_it() {
        let (fresh, forged) = ("fresh".to_string(), "p17".to_string());
        let names = [&fresh, &forged];
        let seen = Instant::now();
        let later = seen + Duration::from_millis(5);
        let listed = BTreeSet::from(["fresh".to_string()]);
        // No list yet, or only one from before the pod: it waits.
        assert_eq!(waiting_for(&names, seen, None), Some(&fresh));
        let earlier = (seen - Duration::from_secs(2), BTreeSet::new());
        assert_eq!(waiting_for(&names, seen, Some(&earlier)), Some(&fresh));
        // Listed since: fresh exists (the cache lags), p17 is gone.
        assert_eq!(
            waiting_for(&names, seen, Some(&(later, listed))),
            Some(&fresh)
        );
        let none = (later, BTreeSet::new());
        assert_eq!(
            waiting_for(&names, seen, Some(&none)),
            None,
            "all gone: released"
        );
    }

    #[test]
    fn a_held_pod_is_told_who_it_waits_behind_only_in_its_own_namespace() {
        let blocker = master("m0", false, Some("2026-11-25T12:00:00Z"), "ReplicaSet");
        let mut held = master("m1", true, None, "ReplicaSet");
        let note = behind_note(&held, &blocker, "masters");
        assert!(
            note.contains("first db/m0") && note.contains("0/3 nodes are available"),
            "{note}"
        );
        held.namespace = "tenant".into();
        let note = behind_note(&held, &blocker, "masters");
        assert!(
            !note.contains("db/") && !note.contains("m0") && !note.contains("0/3"),
            "another tenant's pod named: {note}"
        );
        assert!(
            note.contains("a pod of another namespace") && note.contains("cannot place it"),
            "{note}"
        );
    }
}
