//! The pods each policy missed ([`crate::placement::missed`]), looked for on the
//! nodes loop's full passes and reported: the policy's `MissedPods` condition, a
//! Warning Event on each pod, the gauge `berth_missed_pods`.
//!
//! With `onMissed: Evict`, the pods a ReplicaSet or StatefulSet recreates are
//! evicted (the Eviction API: PodDisruptionBudgets hold) so that their
//! replacements come through the webhook. An eviction is only worth it if the
//! webhook now answers for that owner's pods, and berth cannot ask the apiserver
//! that without creating pods. So each owner is probed: one pod is evicted, and
//! only once its replacement is back *with* the policy's decision do the others go,
//! a few per scan. A replacement that comes back without it (the webhook still
//! cannot be reached) stops that owner for a while instead of evicting its pods in
//! a loop.
//!
//! Nothing is evicted until the apiserver is seen to reach the webhook
//! ([`super::webhook_path`]), probed again at every scan that would evict: a
//! replacement admitted while it cannot is missed again for no fault of its
//! owner's, and would put the owner off for minutes (after every replica
//! restarts, the leader may act before the Service has a ready endpoint). And a
//! new leader takes up what the cluster shows of the last one's probes rather than
//! probing again: an owner with a pod on its way out is waiting for a
//! replacement, and one with a pod that came back with the decision lately is
//! known to be seen by the webhook.
//!
//! The scan makes its evictions itself, not through a writer task: a probe is
//! one pod that *went* (an eviction refused by a PodDisruptionBudget is no probe,
//! and the scan tries the owner's next pod), and the owner's state, the
//! replacement told apart from the pods it had then, and the budget of
//! [`EVICTIONS_PER_SCAN`] all hang on that answer. Handed to a queue where the
//! latest wish wins, a refused probe would look like one under way and put its
//! owner off for [`PROBE_TIMEOUT`] and then [`BACKOFF`]. They go through the door
//! ([`super::writes`]) and are counted as `eviction`.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, EvictParams};
use kube::runtime::events::EventType;

use super::context::{Pass, Snapshot};
use super::error::{Error, Retry};
use super::events::{Reported, event, reference_of};
use super::webhook_path;
use super::writes::Kind;
use crate::cluster::Stores;
use crate::objects::PodObject;
use crate::placement::missed::{is_candidate, missed_by, recreating_owner};
use crate::policy::crd::OnMissed;
use crate::telemetry::PolicyLabels;

/// Evictions per scan, at most, across every owner.
const EVICTIONS_PER_SCAN: usize = 10;
/// How often to look again while evictions are under way.
const RESCAN: Duration = Duration::from_secs(2);
/// How often to look again while the apiserver does not reach the webhook (each
/// look probes it once).
const UNREACHABLE_RESCAN: Duration = Duration::from_secs(5);
/// How long a probe waits for its replacement.
const PROBE_TIMEOUT: Duration = Duration::from_secs(120);
/// How long an owner whose replacement was missed again is left alone.
const BACKOFF: Duration = Duration::from_secs(300);

/// Where evicting one owner's missed pods stands.
enum Owner {
    /// One pod was evicted; the pods (uids) the owner had then tell its
    /// replacement apart.
    Probing {
        known: HashSet<String>,
        since: Instant,
    },
    /// A replacement came back with the policy's decision: the others may go.
    Working,
    /// A replacement came back without it: the webhook still misses this owner's
    /// pods.
    Backoff { until: Instant },
}

/// What the scans found, and the evictions under way.
#[derive(Default)]
pub struct Missed {
    /// The missed pods (`namespace/name`) by policy, as the last scan found them.
    pub by_policy: BTreeMap<String, Vec<String>>,
    owners: HashMap<String, Owner>,
    /// The Events of the scans: scans are not every pass, so they keep their own
    /// memory of what was reported.
    reported: Reported,
}

/// One missed pod, and whether a policy that missed it asks for eviction.
struct Found<'a> {
    pod: &'a PodObject,
    evict: Option<String>,
}

impl Missed {
    /// Looks at every pod: reports what each policy in force in `snapshot` missed
    /// and evicts what may be evicted. Returns when to look again, while evictions
    /// are under way.
    pub async fn scan(
        &mut self,
        pass: &Pass<'_>,
        stores: &Stores,
        snapshot: &Snapshot,
    ) -> Option<Duration> {
        let policies = &*snapshot.compiled.set;
        // The pods of namespaces the webhook never sees (kube-system's, berth's
        // own) are not missed: a cluster-wide policy must not report or evict them.
        let exempt = &pass.options.exempt;
        let pods = stores.pods.state();
        let mut by_policy: BTreeMap<String, Vec<String>> = policies
            .iter()
            .map(|p| (p.name.clone(), Vec::new()))
            .collect();
        let mut found = Vec::new();
        for pod in pods
            .iter()
            .map(AsRef::as_ref)
            .filter(|p| is_candidate(p, &snapshot.daemonsets))
        {
            let Some(namespace) = pod
                .metadata
                .namespace
                .as_ref()
                .filter(|ns| !exempt.pods_of(ns))
                .and_then(|ns| snapshot.namespaces.get(ns))
            else {
                continue;
            };
            let missed = missed_by(pod, namespace, policies);
            if missed.is_empty() {
                continue;
            }
            let name = format!(
                "{}/{}",
                namespace.name,
                pod.metadata.name.as_deref().unwrap_or_default()
            );
            for policy in &missed {
                by_policy
                    .entry(policy.name.clone())
                    .or_default()
                    .push(name.clone());
                let note = format!(
                    "admitted without the decision of policy {} (berth's webhook was unreachable, \
                     or the pod is older than the policy or its namespace's opt-in); onMissed: {:?}",
                    policy.name, policy.spec.on_missed
                );
                let key = format!("missed/{}/{}", pod.key(), policy.name);
                let event = event(EventType::Warning, "MissedByWebhook", "Report", note);
                self.reported
                    .publish(pass.events, key, event, &reference_of(pod));
            }
            let evict = missed
                .iter()
                .find(|p| p.spec.on_missed == OnMissed::Evict)
                .map(|p| p.name.clone());
            found.push(Found { pod, evict });
        }
        let counts = by_policy
            .iter()
            .map(|(p, pods)| (p.clone(), pods.len() as i64))
            .collect();
        pass.metrics.missed_pods.set_all(&counts);
        for pods in by_policy.values_mut() {
            pods.sort();
        }
        self.by_policy = by_policy;
        let again = self.evict(pass, &pods, found).await;
        self.reported.end_pass();
        again
    }

    /// Moves each owner's evictions on by one step.
    async fn evict(
        &mut self,
        pass: &Pass<'_>,
        pods: &[std::sync::Arc<PodObject>],
        found: Vec<Found<'_>>,
    ) -> Option<Duration> {
        let mut by_owner: BTreeMap<&str, Vec<(&PodObject, String)>> = BTreeMap::new();
        for Found { pod, evict } in found {
            if let (Some(policy), Some(owner)) = (evict, recreating_owner(pod)) {
                by_owner.entry(owner).or_default().push((pod, policy));
            }
        }
        // Owners with nothing left to evict are done.
        self.owners
            .retain(|owner, _| by_owner.contains_key(owner.as_str()));
        // Every pod of those owners, missed or not: a probe's replacement is told
        // apart from the pods its owner had when the probe went.
        let mut owned: HashMap<&str, Vec<&PodObject>> = HashMap::new();
        for pod in pods.iter().map(AsRef::as_ref) {
            if let Some(owner) = recreating_owner(pod).filter(|o| by_owner.contains_key(o)) {
                owned.entry(owner).or_default().push(pod);
            }
        }
        let now = Instant::now();
        let wanting = by_owner.keys().any(|owner| match self.owners.get(*owner) {
            Some(Owner::Backoff { until }) => now >= *until,
            _ => true,
        });
        if !wanting {
            return None;
        }
        let reachable = webhook_path::answers(pass.client).await;
        pass.metrics.webhook_reachable.set(i64::from(reachable));
        if !reachable {
            // Reported, not evicted: look again soon, so the evictions start
            // within seconds of the webhook's return.
            return Some(UNREACHABLE_RESCAN);
        }
        let missed_keys: HashSet<String> = by_owner
            .values()
            .flatten()
            .map(|(pod, _)| pod.key())
            .collect();
        let mut budget = EVICTIONS_PER_SCAN;
        let mut again = false;
        let mut retry: Option<Duration> = None;
        for (owner, mut missed) in by_owner {
            if !self.owners.contains_key(owner)
                && let Some(state) = left_by_last_leader(&owned[owner], &missed_keys)
            {
                self.owners.insert(owner.to_owned(), state);
            }
            // The oldest first: the pods that have run without the decision longest.
            missed.sort_by_key(|(p, _)| p.metadata.creation_timestamp.clone());
            let now = Instant::now();
            let take = match self.owners.get(owner) {
                None => 1,
                Some(Owner::Working) => budget,
                Some(Owner::Backoff { until }) if now < *until => 0,
                Some(Owner::Backoff { .. }) => 1,
                Some(Owner::Probing { known, since }) => {
                    let replacements: Vec<&PodObject> = owned[owner]
                        .iter()
                        .copied()
                        .filter(|p| !known.contains(&p.key()))
                        .collect();
                    let missed_again = replacements
                        .iter()
                        .any(|r| missed.iter().any(|(m, _)| m.key() == r.key()));
                    again = true;
                    if missed_again || since.elapsed() > PROBE_TIMEOUT {
                        tracing::warn!(%owner, "a missed pod's replacement was missed again; leaving its owner alone for {BACKOFF:?}");
                        self.owners.insert(
                            owner.to_owned(),
                            Owner::Backoff {
                                until: now + BACKOFF,
                            },
                        );
                        continue;
                    }
                    if replacements.is_empty() {
                        continue;
                    }
                    self.owners.insert(owner.to_owned(), Owner::Working);
                    budget
                }
            };
            let take = take.min(budget);
            if take == 0 {
                continue;
            }
            let probing = !matches!(self.owners.get(owner), Some(Owner::Working));
            let known: HashSet<String> = owned[owner].iter().map(|p| p.key()).collect();
            for (pod, policy) in missed.into_iter().take(take) {
                budget -= 1;
                match evict_one(pass, pod, &policy, &mut self.reported).await {
                    Ok(true) => again = true,
                    Ok(false) => continue,
                    // Looked at again when the one retry policy says.
                    Err(e) => {
                        if let Retry::After(delay) = e.retry() {
                            retry = Some(retry.map_or(delay, |r| r.min(delay)));
                        }
                        continue;
                    }
                }
                if probing {
                    self.owners.insert(
                        owner.to_owned(),
                        Owner::Probing {
                            known: known.clone(),
                            since: Instant::now(),
                        },
                    );
                    break;
                }
            }
        }
        again.then_some(RESCAN).into_iter().chain(retry).min()
    }
}

/// What the cluster shows of an earlier leader's work on an owner whose pods are
/// `owned` (`missed` holds the keys of the missed ones): a pod on its way out
/// means a probe (or a rollout) is waiting for its replacement; a pod that came
/// back with the decision within the probe's wait means the webhook sees this
/// owner. `None`: nothing under way, probe anew.
fn left_by_last_leader(owned: &[&PodObject], missed: &HashSet<String>) -> Option<Owner> {
    if owned.iter().any(|p| p.is_terminating()) {
        let known = owned
            .iter()
            .filter(|p| !p.is_terminating())
            .map(|p| p.key())
            .collect();
        return Some(Owner::Probing {
            known,
            since: Instant::now(),
        });
    }
    let now = k8s_openapi::jiff::Timestamp::now();
    let lately = |pod: &PodObject| {
        pod.metadata
            .creation_timestamp
            .as_ref()
            .and_then(|t| now.duration_since(t.0).try_into().ok())
            .is_some_and(|age: Duration| age <= PROBE_TIMEOUT)
    };
    owned
        .iter()
        .any(|p| !missed.contains(&p.key()) && lately(p))
        .then_some(Owner::Working)
}

/// Evicts `pod`, missed by `policy`: true once it went, false for a pod without
/// a name (none to evict).
async fn evict_one(
    pass: &Pass<'_>,
    pod: &PodObject,
    policy: &str,
    reported: &mut Reported,
) -> Result<bool, Error> {
    let (Some(namespace), Some(name)) = (&pod.metadata.namespace, &pod.metadata.name) else {
        return Ok(false);
    };
    let api: Api<Pod> = Api::namespaced(pass.client.clone(), namespace);
    match pass
        .writes
        .make(Kind::Eviction, api.evict(name, &EvictParams::default()))
        .await
    {
        Ok(_) => {
            tracing::info!(pod = %name, %namespace, %policy, "evicted a missed pod; its owner recreates it through the webhook");
            pass.metrics
                .missed_evictions
                .get_or_create(&PolicyLabels {
                    policy: policy.to_owned(),
                })
                .inc();
            let note = format!(
                "evicted: it lacks the decision of policy {policy} (onMissed: Evict); its owner \
                 recreates it through berth's webhook"
            );
            let event = event(EventType::Normal, "EvictedMissed", "Evict", note);
            reported.publish(
                pass.events,
                format!("evicted/{}", pod.key()),
                event,
                &reference_of(pod),
            );
            Ok(true)
        }
        // A PodDisruptionBudget that allows no disruption now: no news.
        Err(e) if e.status() == Some(429) => Err(e),
        Err(e) => {
            tracing::warn!(pod = %name, %namespace, error = %e, "cannot evict a missed pod; {}", e.retry());
            Err(e)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn pod(name: &str, age_seconds: i64, terminating: bool) -> PodObject {
        let now = k8s_openapi::jiff::Timestamp::now();
        let created = now - k8s_openapi::jiff::SignedDuration::from_secs(age_seconds);
        let mut metadata = json!({"name": name, "namespace": "ns", "uid": name,
            "creationTimestamp": created.to_string()});
        if terminating {
            metadata["deletionTimestamp"] = json!(now.to_string());
        }
        serde_json::from_value(json!({"metadata": metadata, "spec": {}})).unwrap()
    }

    #[test]
    fn a_new_leader_waits_for_the_replacement_of_a_pod_on_its_way_out() {
        let (a, b, gone) = (
            pod("a", 600, false),
            pod("b", 600, false),
            pod("c", 600, true),
        );
        let missed = HashSet::from([a.key(), b.key()]);
        match left_by_last_leader(&[&a, &b, &gone], &missed) {
            Some(Owner::Probing { known, .. }) => {
                assert_eq!(known, HashSet::from([a.key(), b.key()]));
            }
            _ => panic!("a pod on its way out is a probe under way"),
        }
    }

    #[test]
    fn a_new_leader_takes_a_replacement_with_the_decision_as_the_probes_answer() {
        let (a, fresh) = (pod("a", 600, false), pod("fresh", 10, false));
        let missed = HashSet::from([a.key()]);
        assert!(matches!(
            left_by_last_leader(&[&a, &fresh], &missed),
            Some(Owner::Working)
        ));
        // Old pods with the decision tell nothing of the webhook now; a fresh pod
        // that was missed is no answer either.
        let old = pod("old", 600, false);
        assert!(left_by_last_leader(&[&a, &old], &missed).is_none());
        let missed = HashSet::from([a.key(), fresh.key()]);
        assert!(left_by_last_leader(&[&a, &fresh], &missed).is_none());
    }
}
