//! Groups (SPEC "Groups"; seeds 002 and 003): which pods held by `berth.io/rank`
//! and `berth.io/gang` may go now, and why the others wait. A pure function of the
//! cluster as the caches hold it, so a restarted controller or a new leader picks
//! up where the last one stopped: a group half-counted is simply counted again.
//!
//! - **Ordered start.** A pod of rank k goes once every pod of a lower rank, in its
//!   namespace and policy, is Ready, and every Deployment and StatefulSet of a
//!   lower rank there has its desired replicas Ready (so a lower rank whose pods do
//!   not exist yet still holds it back).
//! - **Gang** (gate mode). A group is the pods of one policy, namespace, group
//!   label value and template revision. Its held members go together once
//!   `minAvailable` members exist, none is still held by its rank, and the fit
//!   check finds a node for every held member at once: resources left after the
//!   pods bound there, its node selector, affinity and tolerations, and no two
//!   members that must avoid each other on one node. Otherwise they all stay held.
//!
//! Only policies the pod's namespace opts into count, as everywhere in the
//! controller: a tenant cannot hold back pods of another namespace.

use std::collections::BTreeMap;

use k8s_openapi::jiff::Timestamp;

use crate::names::{GANG_GATE, RANK_GATE};
use crate::objects::PodObject;
use crate::placement::error::Error;
use crate::placement::feasibility::{Placement, node_fits};
use crate::placement::opt_in::{anchors, pod_entitlements};
use crate::placement::rooms::Rooms;
use crate::policy::compile::Labels;
use crate::policy::groups::GangMember;
use crate::policy::{CompiledPolicy, OptIn, PolicySet};

/// A Deployment or StatefulSet whose pod template a `startOrder` policy ranks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RankedWorkload {
    pub namespace: String,
    /// `Deployment/web`.
    pub name: String,
    pub policy: String,
    pub rank: i32,
    pub desired: i32,
    pub ready: i32,
    /// Its controller has seen its latest spec and every replica runs it.
    pub rolled_out: bool,
}

impl RankedWorkload {
    fn complete(&self) -> bool {
        self.rolled_out && self.ready >= self.desired
    }
}

/// A pod held by a group gate.
#[derive(Debug, Clone, Copy)]
pub struct HeldPod<'a> {
    pub pod: &'a PodObject,
    pub gate: &'static str,
}

/// What to do with the pods held by group gates now.
#[derive(Debug, Default)]
pub struct GroupPlan<'a> {
    pub release: Vec<HeldPod<'a>>,
    /// Held pods that stay held, with what they wait for (one sentence) and a key
    /// for it that changes only when what it waits for does.
    pub waiting: Vec<(HeldPod<'a>, Wait)>,
    /// Gangs held past their policy's `timeoutSeconds`, by policy.
    pub timed_out: BTreeMap<String, Vec<String>>,
    /// How soon time alone changes the plan: the first held gang that has not
    /// timed out yet does, or a rank's pod has settled ([`RANK_SETTLE_SECONDS`]).
    pub wake_after: Option<std::time::Duration>,
}

impl GroupPlan<'_> {
    /// Asks for a pass in `due`, unless one comes sooner.
    fn wake_at(&mut self, due: std::time::Duration) {
        self.wake_after = Some(self.wake_after.map_or(due, |d| d.min(due)));
    }
}

/// How old a ranked pod with no lower rank in sight must be before it goes.
/// Workloads applied together (a whole stack in one `kubectl apply`, highest rank
/// first) reach the caches moments apart, and a higher rank's pods may be seen
/// before a lower rank's Deployment: without the wait it would start first.
/// Creation times are whole seconds, so 3 means at least 2 s.
const RANK_SETTLE_SECONDS: i64 = 3;

/// Why a held pod waits.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Wait {
    pub reason: &'static str,
    pub note: String,
    /// What it waits for, stable while that does not change (for Event keys).
    pub cause: String,
}

/// The group policies that apply to a pod: those it was admitted with that its
/// namespace opts into, first by name for each field.
struct Applied<'p> {
    order: Option<&'p CompiledPolicy>,
    gang: Option<&'p CompiledPolicy>,
}

fn applied<'p>(pod: &PodObject, policies: &'p PolicySet, opt_in: &dyn OptIn) -> Applied<'p> {
    let entitled = pod_entitlements(pod, policies, opt_in);
    Applied {
        order: entitled
            .iter()
            .copied()
            .find(|p| p.spec.start_order.is_some()),
        gang: entitled.iter().copied().find(|p| p.spec.gang.is_some()),
    }
}

fn labels(pod: &PodObject) -> &Labels {
    static EMPTY: Labels = Labels::new();
    pod.metadata.labels.as_ref().unwrap_or(&EMPTY)
}

fn namespace(pod: &PodObject) -> &str {
    pod.metadata.namespace.as_deref().unwrap_or_default()
}

fn name(pod: &PodObject) -> &str {
    pod.metadata.name.as_deref().unwrap_or_default()
}

/// A pod that still takes part: not finished and not being deleted.
fn live(pod: &PodObject) -> bool {
    !pod.is_terminated() && !pod.is_terminating()
}

/// Plans the release of pods held by `berth.io/rank` and `berth.io/gang`.
/// `waiting_for_policy` holds the keys ([`PodObject::key`]) of pods that name a policy the
/// cache has not seen yet: they wait. `now` dates gang timeouts.
pub fn plan<'a>(
    pods: &'a [std::sync::Arc<PodObject>],
    workloads: &[RankedWorkload],
    policies: &PolicySet,
    opt_in: &dyn OptIn,
    rooms: &Rooms,
    waiting_for_policy: &dyn Fn(&PodObject) -> bool,
    now: Timestamp,
) -> GroupPlan<'a> {
    let mut plan = GroupPlan::default();
    let pods: Vec<(&PodObject, Applied)> = pods
        .iter()
        .filter(|p| live(p))
        .map(|p| (p.as_ref(), applied(p, policies, opt_in)))
        .collect();
    plan_ranks(&pods, workloads, waiting_for_policy, now, &mut plan);
    plan_gangs(
        &pods,
        policies,
        opt_in,
        rooms,
        waiting_for_policy,
        now,
        &mut plan,
    );
    plan
}

fn plan_ranks<'a>(
    pods: &[(&'a PodObject, Applied)],
    workloads: &[RankedWorkload],
    waiting_for_policy: &dyn Fn(&PodObject) -> bool,
    now: Timestamp,
    plan: &mut GroupPlan<'a>,
) {
    let rank_of = |pod: &PodObject, policy: &CompiledPolicy| {
        policy
            .spec
            .start_order
            .as_ref()
            .and_then(|o| o.rank(labels(pod)).ok().flatten())
    };
    for (pod, applied) in pods.iter().filter(|(p, _)| p.gate(RANK_GATE).is_some()) {
        let held = HeldPod {
            pod,
            gate: RANK_GATE,
        };
        if waiting_for_policy(pod) {
            continue;
        }
        // Without a policy that ranks it (deleted, or never applied) nothing
        // holds it.
        let Some((policy, rank)) = applied.order.and_then(|p| Some((p, rank_of(pod, p)?))) else {
            plan.release.push(held);
            continue;
        };
        let ns = namespace(pod);
        let lower_pod = pods.iter().find(|(other, other_applied)| {
            namespace(other) == ns
                && other_applied.order.is_some_and(|p| p.name == policy.name)
                && rank_of(other, policy).is_some_and(|r| r < rank)
                && !other.is_ready()
        });
        let lower_workload = workloads.iter().find(|w| {
            w.namespace == ns && w.policy == policy.name && w.rank < rank && !w.complete()
        });
        let wait = match (lower_workload, lower_pod) {
            (Some(w), _) => Some(Wait {
                reason: "WaitingForLowerRank",
                note: format!(
                    "held by {RANK_GATE}: rank {rank} starts after rank {} is Ready; {} has {}/{} replicas Ready",
                    w.rank, w.name, w.ready, w.desired
                ),
                cause: format!("{}/{}", w.name, w.rank),
            }),
            (None, Some((other, _))) => Some(Wait {
                reason: "WaitingForLowerRank",
                note: format!(
                    "held by {RANK_GATE}: rank {rank} starts after lower ranks are Ready; pod {} is not Ready",
                    name(other)
                ),
                cause: format!("pod/{}", name(other)),
            }),
            (None, None) => settling(pod, now).map(|due| {
                plan.wake_at(due);
                Wait {
                    reason: "WaitingForLowerRank",
                    note: format!(
                        "held by {RANK_GATE}: rank {rank} waits {RANK_SETTLE_SECONDS} s from its creation \
                         for lower ranks created with it"
                    ),
                    cause: "settling".into(),
                }
            }),
        };
        match wait {
            Some(wait) => plan.waiting.push((held, wait)),
            None => plan.release.push(held),
        }
    }
}

/// How long `pod` has yet to wait for lower ranks created with it; `None` once it
/// is [`RANK_SETTLE_SECONDS`] old (or has no creation time).
fn settling(pod: &PodObject, now: Timestamp) -> Option<std::time::Duration> {
    let created = pod.metadata.creation_timestamp.as_ref()?.0;
    let settled = created
        .as_millisecond()
        .saturating_add(RANK_SETTLE_SECONDS * 1000);
    let left = settled.saturating_sub(now.as_millisecond());
    (left > 0).then(|| std::time::Duration::from_millis(left as u64))
}

/// One gang: its policy and its members (held or not).
struct Gang<'a, 'p> {
    policy: &'p CompiledPolicy,
    member: GangMember,
    members: Vec<&'a PodObject>,
}

fn plan_gangs<'a>(
    pods: &[(&'a PodObject, Applied)],
    policies: &PolicySet,
    opt_in: &dyn OptIn,
    rooms: &Rooms,
    waiting_for_policy: &dyn Fn(&PodObject) -> bool,
    now: Timestamp,
    plan: &mut GroupPlan<'a>,
) {
    let mut gangs: BTreeMap<(String, String, String, Option<String>), Gang> = BTreeMap::new();
    for (pod, applied) in pods {
        let member = applied.gang.and_then(|policy| {
            let gang = policy.spec.gang.as_ref()?;
            Some((policy, gang.member(labels(pod)).ok().flatten()?))
        });
        let Some((policy, member)) = member else {
            if pod.gate(GANG_GATE).is_some() && !waiting_for_policy(pod) {
                // Nothing makes it a member (any more): nothing holds it.
                plan.release.push(HeldPod {
                    pod,
                    gate: GANG_GATE,
                });
            }
            continue;
        };
        let key = (
            namespace(pod).to_owned(),
            policy.name.clone(),
            member.group.clone(),
            member.revision.clone(),
        );
        let gang = gangs.entry(key).or_insert_with(|| Gang {
            policy,
            member: member.clone(),
            members: Vec::new(),
        });
        gang.member.min_available = gang.member.min_available.max(member.min_available);
        gang.members.push(pod);
    }
    for gang in gangs.values() {
        let held: Vec<&PodObject> = gang
            .members
            .iter()
            .copied()
            .filter(|p| p.gate(GANG_GATE).is_some())
            .collect();
        if held.is_empty() || held.iter().any(|p| waiting_for_policy(p)) {
            continue;
        }
        let group = &gang.member.group;
        let want = gang.member.min_available as usize;
        let wait = if gang.members.len() < want {
            Some(Wait {
                reason: "WaitingForGang",
                note: format!(
                    "held by {GANG_GATE}: gang {group} has {} of its {want} members; none is placed before all exist",
                    gang.members.len()
                ),
                cause: format!("count/{}", gang.members.len()),
            })
        } else if held.iter().any(|p| p.gate(RANK_GATE).is_some()) {
            Some(Wait {
                reason: "WaitingForGang",
                note: format!(
                    "held by {GANG_GATE}: members of gang {group} still wait for their rank"
                ),
                cause: "rank".into(),
            })
        } else {
            fit(&held, gang.policy, policies, opt_in, rooms)
                .err()
                .map(|why| Wait {
                    reason: "GangDoesNotFit",
                    note: format!(
                        "held by {GANG_GATE}: gang {group} ({} held) does not fit: {why}",
                        held.len()
                    ),
                    cause: format!("fit/{why}"),
                })
        };
        let Some(wait) = wait else {
            plan.release.extend(held.iter().map(|pod| HeldPod {
                pod,
                gate: GANG_GATE,
            }));
            continue;
        };
        let timeout = gang
            .policy
            .spec
            .gang
            .as_ref()
            .map_or(0, |g| g.timeout_seconds);
        let oldest = held
            .iter()
            .filter_map(|p| p.metadata.creation_timestamp.as_ref())
            .map(|t| t.0)
            .min();
        let timed_out =
            oldest.is_some_and(|t| now.as_second().saturating_sub(t.as_second()) > timeout);
        // A gang not yet timed out wants a pass the second it does.
        if let Some(t) = oldest.filter(|_| !timed_out) {
            let due = t
                .as_second()
                .saturating_add(timeout)
                .saturating_add(1)
                .saturating_sub(now.as_second());
            let due = std::time::Duration::from_secs(due.max(0) as u64);
            plan.wake_at(due);
        }
        let wait = if timed_out {
            plan.timed_out
                .entry(gang.policy.name.clone())
                .or_default()
                .push(format!("{}/{group}", namespace(held[0])));
            Wait {
                reason: "GangTimeout",
                note: format!(
                    "{} (over timeoutSeconds {timeout}; members stay held)",
                    wait.note
                ),
                cause: format!("timeout/{}", wait.cause),
            }
        } else {
            wait
        };
        for pod in held {
            plan.waiting.push((
                HeldPod {
                    pod,
                    gate: GANG_GATE,
                },
                wait.clone(),
            ));
        }
    }
}

/// Finds a node for every held member at once; the error names the first member
/// that finds none, and why.
fn fit(
    held: &[&PodObject],
    policy: &CompiledPolicy,
    policies: &PolicySet,
    opt_in: &dyn OptIn,
    rooms: &Rooms,
) -> Result<(), Error> {
    let mut rooms = rooms.clone();
    // Where each member was put, for members that must avoid each other.
    let mut placed: Vec<(String, &PodObject)> = Vec::new();
    // The largest first: first fit then wastes least.
    let mut order: Vec<(&PodObject, BTreeMap<String, f64>)> =
        held.iter().map(|p| (*p, p.requests())).collect();
    order.sort_by(|a, b| {
        let size = |r: &BTreeMap<String, f64>| (r.get("cpu").copied(), r.get("memory").copied());
        size(&b.1)
            .partial_cmp(&size(&a.1))
            .unwrap_or(std::cmp::Ordering::Equal)
    });
    for (pod, requests) in order {
        let Some(view) = Placement::of_object(pod) else {
            return Err(Error::TooLarge(name(pod).into()));
        };
        // Why not, from the nodes the pod may use at all when there are some: that
        // a node it may not use has no room says nothing.
        let mut short: Option<(String, Box<Error>)> = None;
        let mut mismatch: Option<(String, Box<Error>)> = None;
        let node = rooms.iter().find_map(|(node, room)| {
            if let Err(why) = node_fits(&view, node, &room.info) {
                mismatch.get_or_insert((node.clone(), Box::new(why)));
                return None;
            }
            if let Err(why) = room.has_room(&requests) {
                short.get_or_insert((node.clone(), Box::new(why)));
                return None;
            }
            let clash = placed
                .iter()
                .find(|(n, other)| n == node && must_avoid(pod, other, policies, opt_in));
            if let Some((_, other)) = clash {
                short.get_or_insert((node.clone(), Box::new(Error::MustAvoid(name(other).into()))));
                return None;
            }
            Some(node.clone())
        });
        let Some(node) = node else {
            return Err(Error::NoNode {
                pod: name(pod).into(),
                policy: policy.name.clone(),
                first: short.or(mismatch),
            });
        };
        if let Some(room) = rooms.get_mut(&node) {
            room.take(&requests);
        }
        placed.push((node, pod));
    }
    Ok(())
}

/// Whether two pods must not share a node: an avoid policy that applies to one
/// (its namespace opting in) anchors the other (its labels match, and its
/// namespace counts under the policy's `anchorNamespaces`), as exclusion and the
/// node labels judge it.
fn must_avoid(a: &PodObject, b: &PodObject, policies: &PolicySet, opt_in: &dyn OptIn) -> bool {
    let one_way = |x: &PodObject, y: &PodObject| {
        let namespace = y.metadata.namespace.as_deref().unwrap_or_default();
        pod_entitlements(x, policies, opt_in)
            .iter()
            .any(|p| p.spec.avoid.is_some() && anchors(p, labels(y), namespace, opt_in))
    };
    one_way(a, b) || one_way(b, a)
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use serde_json::{Value, json};

    use super::*;
    use crate::objects::{NodeIndex, NodeInfo};
    use crate::placement::opt_in::tests::{Everyone, Only};
    use crate::policy::test_policies as policies;

    fn pod(name: &str, labels: Value, gates: &[&str], extra: Value) -> Arc<PodObject> {
        let gates: Vec<Value> = gates.iter().map(|g| json!({"name": g})).collect();
        let mut pod = json!({
            "metadata": {"name": name, "namespace": "apps", "uid": name, "labels": labels,
                "creationTimestamp": "2026-11-23T10:00:00Z",
                "annotations": {"berth.io/applied": "release"}},
            "spec": {"schedulingGates": gates,
                "containers": [{"name": "c", "resources": {"requests": {"cpu": "2"}}}]},
        });
        json_patch::merge(&mut pod, &extra);
        Arc::new(serde_json::from_value(pod).unwrap())
    }

    /// A pod of rank `rank` held by the rank gate.
    fn held_rank(name: &str, rank: &str) -> Arc<PodObject> {
        pod(
            name,
            json!({"berth.io/rank": rank}),
            &[RANK_GATE],
            json!({}),
        )
    }

    fn ready() -> Value {
        json!({"status": {"conditions": [{"type": "Ready", "status": "True"}]}})
    }

    fn bound(node: &str) -> Value {
        json!({"spec": {"nodeName": node}})
    }

    fn rooms(nodes: &[(&str, &str)]) -> Rooms {
        let index: NodeIndex = nodes
            .iter()
            .map(|(n, _)| (n.to_string(), NodeInfo::default()))
            .collect();
        let allocatable = nodes
            .iter()
            .map(|(n, cpu)| {
                let amounts = BTreeMap::from([
                    ("cpu".to_string(), crate::quantity::parse(cpu).unwrap()),
                    ("pods".to_string(), 110.0),
                ]);
                (n.to_string(), amounts)
            })
            .collect();
        crate::placement::rooms::rooms(&index, &allocatable, std::iter::empty())
    }

    fn released<'a>(plan: &'a GroupPlan) -> Vec<(&'a str, &'static str)> {
        let mut names: Vec<_> = plan.release.iter().map(|h| (name(h.pod), h.gate)).collect();
        names.sort();
        names
    }

    fn at(time: &str) -> Timestamp {
        time.parse().unwrap()
    }

    fn never(_: &PodObject) -> bool {
        false
    }

    fn ranked() -> PolicySet {
        policies(&[("release", json!({"startOrder": {}}))])
    }

    #[test]
    fn a_rank_goes_once_every_lower_rank_is_ready() {
        let pods = vec![
            pod("db", json!({"berth.io/rank": "0"}), &[], bound("n1")),
            held_rank("api", "1"),
            held_rank("web", "2"),
        ];
        let now = at("2026-11-23T10:01:00Z");
        let plan = plan(&pods, &[], &ranked(), &Everyone, &Rooms::new(), &never, now);
        assert!(plan.release.is_empty());
        let (_, wait) = &plan.waiting[0];
        assert!(wait.note.contains("pod db is not Ready"), "{}", wait.note);

        let pods = vec![
            pod("db", json!({"berth.io/rank": "0"}), &[], ready()),
            held_rank("api", "1"),
            held_rank("web", "2"),
        ];
        let plan = super::plan(&pods, &[], &ranked(), &Everyone, &Rooms::new(), &never, now);
        assert_eq!(released(&plan), [("api", RANK_GATE)], "web waits for api");
    }

    #[test]
    fn a_rank_with_nothing_lower_in_sight_waits_for_ranks_created_with_it() {
        let pods = vec![held_rank("web", "2")];
        // Created at 10:00:00: at 10:00:01.5 a lower rank applied with it may not
        // have reached the caches yet.
        let plan = plan(
            &pods,
            &[],
            &ranked(),
            &Everyone,
            &Rooms::new(),
            &never,
            at("2026-11-23T10:00:01.5Z"),
        );
        assert!(plan.release.is_empty());
        assert_eq!(plan.waiting[0].1.cause, "settling");
        assert_eq!(
            plan.wake_after,
            Some(std::time::Duration::from_millis(1500))
        );
        let plan = super::plan(
            &pods,
            &[],
            &ranked(),
            &Everyone,
            &Rooms::new(),
            &never,
            at("2026-11-23T10:00:03Z"),
        );
        assert_eq!(released(&plan), [("web", RANK_GATE)]);
        assert_eq!(plan.wake_after, None);
    }

    #[test]
    fn a_lower_ranked_workload_without_pods_yet_holds_higher_ranks() {
        let pods = vec![held_rank("api", "1")];
        let db = RankedWorkload {
            namespace: "apps".into(),
            name: "Deployment/db".into(),
            policy: "release".into(),
            rank: 0,
            desired: 2,
            ready: 1,
            rolled_out: true,
        };
        let now = at("2026-11-23T10:01:00Z");
        let plan = plan(
            &pods,
            std::slice::from_ref(&db),
            &ranked(),
            &Everyone,
            &Rooms::new(),
            &never,
            now,
        );
        assert!(plan.release.is_empty());
        assert!(
            plan.waiting[0]
                .1
                .note
                .contains("Deployment/db has 1/2 replicas Ready"),
            "{}",
            plan.waiting[0].1.note
        );
        let done = RankedWorkload { ready: 2, ..db };
        let plan = super::plan(
            &pods,
            &[done],
            &ranked(),
            &Everyone,
            &Rooms::new(),
            &never,
            now,
        );
        assert_eq!(released(&plan), [("api", RANK_GATE)]);
    }

    #[test]
    fn ranks_count_only_in_namespaces_that_opt_in() {
        let pods = vec![
            pod("db", json!({"berth.io/rank": "0"}), &[], json!({})),
            held_rank("api", "1"),
        ];
        let now = at("2026-11-23T10:01:00Z");
        let nobody = Only("elsewhere");
        let plan = plan(&pods, &[], &ranked(), &nobody, &Rooms::new(), &never, now);
        assert_eq!(
            released(&plan),
            [("api", RANK_GATE)],
            "without the opt-in nothing ranks it, so nothing holds it"
        );
    }

    fn gang() -> PolicySet {
        policies(&[("release", json!({"gang": {"timeoutSeconds": 120}}))])
    }

    fn member(name: &str, size: &str) -> Arc<PodObject> {
        pod(
            name,
            json!({"podGroup": "train", "minAvailable": size}),
            &[GANG_GATE],
            json!({}),
        )
    }

    #[test]
    fn a_gang_goes_together_once_complete_and_fitting() {
        let now = at("2026-11-23T10:01:00Z");
        let room = rooms(&[("n1", "4"), ("n2", "2")]);
        let two = vec![member("a", "3"), member("b", "3")];
        let plan = plan(&two, &[], &gang(), &Everyone, &room, &never, now);
        assert!(plan.release.is_empty());
        assert!(plan.waiting[0].1.note.contains("has 2 of its 3 members"));

        let three = vec![member("a", "3"), member("b", "3"), member("c", "3")];
        let plan = super::plan(&three, &[], &gang(), &Everyone, &room, &never, now);
        assert_eq!(
            released(&plan),
            [("a", GANG_GATE), ("b", GANG_GATE), ("c", GANG_GATE)]
        );
    }

    #[test]
    fn a_gang_that_does_not_fit_stays_held_and_times_out() {
        let room = rooms(&[("n1", "4")]);
        let three = vec![member("a", "3"), member("b", "3"), member("c", "3")];
        let early = at("2026-11-23T10:01:00Z");
        let plan = plan(&three, &[], &gang(), &Everyone, &room, &never, early);
        assert!(plan.release.is_empty(), "room for two of three: none goes");
        let note = &plan.waiting[0].1.note;
        assert!(
            note.contains("does not fit") && note.contains("cpu"),
            "{note}"
        );
        assert!(plan.timed_out.is_empty());
        // Created at 10:00:00 with timeoutSeconds 120: the controller looks again
        // the second the gang is over it.
        assert_eq!(plan.wake_after, Some(std::time::Duration::from_secs(61)));

        let late = at("2026-11-23T10:02:01Z");
        let plan = super::plan(&three, &[], &gang(), &Everyone, &room, &never, late);
        assert!(plan.release.is_empty(), "still held after the timeout");
        assert_eq!(plan.wake_after, None, "timed out already");
        assert_eq!(plan.timed_out["release"], ["apps/train"]);
        assert_eq!(plan.waiting[0].1.reason, "GangTimeout");

        let bigger = rooms(&[("n1", "4"), ("n2", "2")]);
        let plan = super::plan(&three, &[], &gang(), &Everyone, &bigger, &never, late);
        assert_eq!(plan.release.len(), 3, "a node more: all go");
    }

    #[test]
    fn a_pod_avoided_across_namespaces_counts_only_as_anchor_namespaces_says() {
        let avoid = |anchor_namespaces: &str| {
            policies(&[(
                "release",
                json!({"avoid": {"matchLabels": {"app": "db"}},
                       "anchorNamespaces": anchor_namespaces}),
            )])
        };
        let subject = pod("a", json!({}), &[], json!({}));
        let db = |namespace: &str| {
            pod(
                "db",
                json!({"app": "db"}),
                &[],
                json!({"metadata": {"namespace": namespace}}),
            )
        };
        let apps = Only("apps");
        let same = avoid("Same");
        assert!(must_avoid(&subject, &db("apps"), &same, &apps));
        assert!(
            !must_avoid(&subject, &db("other"), &same, &apps),
            "Same: a pod whose namespace does not opt in is not avoided"
        );
        assert!(must_avoid(&db("other"), &subject, &avoid("All"), &apps));
    }

    #[test]
    fn bound_pods_take_room_and_members_that_avoid_each_other_need_a_node_each() {
        let set = policies(&[(
            "release",
            json!({"gang": {}, "avoid": {"matchLabels": {"podGroup": "train"}}}),
        )]);
        let now = at("2026-11-23T10:01:00Z");
        let room = rooms(&[("n1", "8")]);
        let two = vec![member("a", "2"), member("b", "2")];
        let plan = plan(&two, &[], &set, &Everyone, &room, &never, now);
        assert!(
            plan.release.is_empty(),
            "8 cpus, but one node for two that avoid each other"
        );
        assert!(
            plan.waiting[0].1.note.contains("must avoid"),
            "{}",
            plan.waiting[0].1.note
        );

        let busy = pod("other", json!({}), &[], bound("n2"));
        let nodes = rooms(&[("n1", "8"), ("n2", "3")]);
        let pods = [busy.clone()];
        let index: NodeIndex = nodes
            .keys()
            .map(|n| (n.clone(), NodeInfo::default()))
            .collect();
        let allocatable = nodes
            .iter()
            .map(|(n, r)| (n.clone(), r.free.clone()))
            .collect();
        let taken =
            crate::placement::rooms::rooms(&index, &allocatable, pods.iter().map(|p| p.as_ref()));
        assert_eq!(
            taken["n2"].free["cpu"], 1.0,
            "the bound pod's 2 cpus are taken"
        );
        let plan = super::plan(&two, &[], &set, &Everyone, &taken, &never, now);
        assert!(
            plan.release.is_empty(),
            "n2 has 1 cpu left, each member wants 2"
        );
    }

    #[test]
    fn a_member_still_ranked_or_naming_an_unseen_policy_holds_its_gang() {
        let set = policies(&[("release", json!({"gang": {}, "startOrder": {}}))]);
        let now = at("2026-11-23T10:01:00Z");
        let room = rooms(&[("n1", "8")]);
        let mut both = member("a", "1");
        Arc::make_mut(&mut both).spec.scheduling_gates.insert(
            0,
            serde_json::from_value(json!({"name": RANK_GATE})).unwrap(),
        );
        let pods = vec![both];
        let plan = plan(&pods, &[], &set, &Everyone, &room, &never, now);
        assert_eq!(
            released(&plan),
            [("a", RANK_GATE)],
            "unranked (no rank label): its rank gate goes; the gang waits for it"
        );
        let unseen = |_: &PodObject| true;
        let pods = vec![member("b", "1")];
        let plan = super::plan(&pods, &[], &set, &Everyone, &room, &unseen, now);
        assert!(plan.release.is_empty() && plan.waiting.is_empty());
    }
}
