//! What the controller wants of policies: the finalizer that lets it clean a
//! deleted policy's nodes, and `status` (nodes, conditions), handed to the policy
//! writer ([`super::policy_writer`]); and Events for new problems.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::runtime::events::EventType;
use kube::{Resource, ResourceExt};

use super::context::Pass;
use super::context::Snapshot;
use super::events::{Reported, event};
use super::policy_writer;
use super::wishes::{Part, PolicyWish};
use crate::cluster::Stores;
use crate::names::{PLACEMENT_POLICY, POOL_LABEL, POOL_TAINT, policy_of_node_label};
use crate::objects::{NodeObject, PolicyObject};
use crate::placement::desired::{DesiredNode, DesiredNodes};
use crate::placement::static_placement::StaticPolicy;
use crate::policy::CompiledPolicy;
use crate::policy::crd::PlacementPolicyStatus;

/// Live policies get the finalizer before they have any effect on nodes. Returns
/// the policies that have it: one whose finalizer could not be added (it changed a
/// moment ago: a 409, or the apiserver failed) is left out of this pass's node
/// work, and the nodes loop tries again as the one retry policy says
/// ([`super::error`]).
pub async fn add_finalizers(pass: &Pass<'_>, snapshot: &Snapshot) -> BTreeSet<String> {
    let mut finalized = BTreeSet::new();
    for policy in snapshot
        .objects
        .iter()
        .filter(|p| p.meta().deletion_timestamp.is_none())
    {
        if !policy_writer::finalized(policy)
            && let Err(e) = policy_writer::add_finalizer(pass.writes, pass.client, policy).await
        {
            tracing::warn!(policy = %policy.name_any(), error = %e, "cannot add the finalizer; {}", e.retry());
            continue;
        }
        finalized.insert(policy.name_any());
    }
    finalized
}

/// Whether labels and taints (as key and value) carry anything of `policy`: its
/// pool label, an anchor or placed label, or its taint.
fn carries<'a>(
    mut labels: impl Iterator<Item = (&'a str, &'a str)>,
    mut taints: impl Iterator<Item = (Option<&'a str>, Option<&'a str>)>,
    policy: &str,
) -> bool {
    labels.any(|(k, v)| policy_of_node_label(k, v) == Some(policy))
        || taints.any(|(key, value)| key == Some(POOL_TAINT) && value == Some(policy))
}

/// Whether `node`, as the cache holds it, carries anything of `policy`.
fn node_carries(node: &NodeObject, policy: &str) -> bool {
    let labels = node.labels().iter().map(|(k, v)| (k.as_str(), v.as_str()));
    let taints = node
        .spec
        .taints
        .iter()
        .map(|t| (text(t, "key"), text(t, "value")));
    carries(labels, taints, policy)
}

/// A taint's field `name`, when it is a string.
fn text<'a>(taint: &'a serde_json::Value, name: &str) -> Option<&'a str> {
    taint.get(name)?.as_str()
}

/// Whether a node write on its way would leave anything of `policy` on its node.
fn write_carries(desired: &DesiredNode, policy: &str) -> bool {
    let labels = desired.labels.iter().map(|(k, v)| (k.as_str(), v.as_str()));
    let taints = desired
        .taints
        .iter()
        .map(|t| (Some(t.key.as_str()), t.value.as_deref()));
    carries(labels, taints, policy)
}

/// Lets a deleted policy go once its nodes are clean: no node carries anything of
/// it as the cache holds them, and no node write on its way (taken by the node
/// writer before the deletion's pass) would put something of it back. The node
/// writer clears the nodes after the deletion's pass; the node watch sees each
/// write and wakes a pass over that node, which looks again. A node whose write
/// fails keeps the policy until it is written. Nodes of other policies do not hold
/// it back.
pub fn release_deleted(pass: &Pass<'_>, snapshot: &Snapshot, stores: &Stores) {
    let deleting: Vec<&Arc<PolicyObject>> = snapshot
        .objects
        .iter()
        .filter(|p| p.meta().deletion_timestamp.is_some() && policy_writer::finalized(p))
        .collect();
    if deleting.is_empty() {
        return;
    }
    let nodes = stores.nodes.state();
    for policy in deleting {
        let name = policy.name_any();
        let dirty = nodes.iter().any(|n| node_carries(n, &name))
            || pass.node_writes.writing_any(|d| write_carries(d, &name));
        let key = (name, Part::Finalizer);
        if dirty {
            pass.policy_writes.settled(&key);
        } else {
            pass.policy_writes.want(key, PolicyWish::RemoveFinalizer);
        }
    }
}

fn condition(
    type_: &str,
    status: bool,
    reason: &str,
    message: String,
    previous: &[Condition],
) -> Condition {
    let status = if status { "True" } else { "False" };
    // The transition time moves only when the status does.
    let last_transition_time = previous
        .iter()
        .find(|c| c.type_ == type_ && c.status == status)
        .map(|c| c.last_transition_time.clone())
        .unwrap_or_else(|| Time(k8s_openapi::jiff::Timestamp::now()));
    Condition {
        type_: type_.into(),
        status: status.into(),
        reason: reason.into(),
        message,
        last_transition_time,
        observed_generation: None,
    }
}

/// `Ready`: whether the controller keeps the policy as written.
fn ready(snapshot: &Snapshot, name: &str, previous: &[Condition]) -> Condition {
    match snapshot.compiled.errors.get(name) {
        None => condition(
            "Ready",
            true,
            "Reconciled",
            "the controller keeps this policy's nodes".into(),
            previous,
        ),
        Some(invalid) => {
            let consequence = if invalid.kept {
                "the last good version stays in force"
            } else {
                "the policy is not in force"
            };
            condition(
                "Ready",
                false,
                "InvalidSpec",
                format!("{}; {consequence}", invalid.error.problem),
                previous,
            )
        }
    }
}

/// `InApiserver`: whether the admission policy `berth-placement` applies `policy`
/// with berth down, as the StaticPlacement writer compiles it
/// ([`StaticPolicy::compile`]); when it cannot, why, so that an operator knows
/// which policies hold only while berth answers.
fn in_apiserver(policy: &CompiledPolicy, previous: &[Condition]) -> Condition {
    match StaticPolicy::compile(policy).webhook_only {
        None => condition(
            "InApiserver",
            true,
            "Compiled",
            format!(
                "compiled for {PLACEMENT_POLICY}: where it is installed, the apiserver applies \
                 this policy with berth down"
            ),
            previous,
        ),
        Some(reason) => condition("InApiserver", false, "WebhookOnly", reason, previous),
    }
}

/// The `MissedPods` condition: the pods that lack the policy's decision, the
/// first few by name.
fn missed_condition(missed: Option<&Vec<String>>, previous: &[Condition]) -> Condition {
    const NAMED: usize = 10;
    let missed = missed.map(Vec::as_slice).unwrap_or_default();
    let message = match missed.len() {
        0 => "every pod this policy applies to has its decision".to_string(),
        n => {
            let more = if n > NAMED {
                format!(" and {} more", n - NAMED)
            } else {
                String::new()
            };
            format!(
                "{n} pods lack this policy's decision: {}{more}",
                missed[..n.min(NAMED)].join(", ")
            )
        }
    };
    condition(
        "MissedPods",
        !missed.is_empty(),
        "MissedPods",
        message,
        previous,
    )
}

/// The `SelfSetLabels` condition of a policy whose pool has a `nodeSelector`:
/// whether the selector reads labels a node can set on itself and, when the
/// policy does not trust them, the nodes that match only by them and are
/// refused (`refused`, sorted), the first few by name.
fn self_set_condition(
    policy: &CompiledPolicy,
    refused: &[String],
    previous: &[Condition],
) -> Option<Condition> {
    const NAMED: usize = 10;
    policy.spec.pool.as_ref()?.node_selector.as_ref()?;
    let keys = policy.self_set_keys().join(", ");
    let (status, reason, message) = if keys.is_empty() {
        (
            false,
            "NodeRestricted",
            "pool.nodeSelector reads only labels a node cannot set on itself".to_string(),
        )
    } else if policy.selector_takes_new_nodes() {
        (
            true,
            "Trusted",
            format!(
                "pool.trustSelfSetLabels: a node can join this pool by setting {keys} on itself"
            ),
        )
    } else {
        let refused_text = match refused.len() {
            0 => "no other node matches".to_string(),
            n => {
                let more = if n > NAMED {
                    format!(" and {} more", n - NAMED)
                } else {
                    String::new()
                };
                format!("refused: {}{more}", refused[..n.min(NAMED)].join(", "))
            }
        };
        (
            true,
            "NotTrusted",
            format!(
                "pool.nodeSelector reads labels a node can set on itself ({keys}): nodes in \
                 the pool stay while they match, no other joins (see pool.trustSelfSetLabels); \
                 {refused_text}"
            ),
        )
    };
    Some(condition(
        "SelfSetLabels",
        status,
        reason,
        message,
        previous,
    ))
}

/// What the group planning and the scan for missed pods tell the policies'
/// status.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct Findings {
    pub gang_mode: crate::placement::groups::GangMode,
    /// Gangs held past their timeout, by policy (`namespace/group`).
    pub timed_out: BTreeMap<String, Vec<String>>,
    /// Pods that lack the policy's decision (`namespace/name`), by policy.
    pub missed: BTreeMap<String, Vec<String>>,
}

/// The policies' status, worked out again only for the policies that something
/// changed for: the policy itself (a pass over everything), one of its nodes or
/// the pods on them, or what the group planning and the missed scan found of it.
/// A policy's status is counted from the nodes that concern it alone (an index
/// kept from pass to pass), so one node's change costs the policies it concerns,
/// each its own nodes, not every policy times every node.
#[derive(Debug, Default)]
pub struct Statuses {
    /// The nodes whose desired state concerns each policy ([`concerns`]).
    nodes_of: HashMap<String, BTreeSet<String>>,
    /// Every policy's status is due (at first, and after a pass over everything).
    all_due: bool,
    /// The policies whose status is due at the next update.
    due: BTreeSet<String>,
    /// What the last update was told by the group planning and the missed scan.
    findings: Findings,
    /// Each policy's Events, remembered while their causes last.
    reported: HashMap<String, Reported>,
    /// The gauges' values, by policy (a clash count only for `avoid` policies).
    unentitled: BTreeMap<String, i64>,
    clashes: BTreeMap<String, i64>,
}

/// The policies whose status `desired` counts in: its pool, the claims it loses
/// or refuses, and the `avoid` policies whose pods clash on it.
fn concerns(desired: &DesiredNode) -> BTreeSet<&str> {
    let pool = desired.labels.get(POOL_LABEL).map(String::as_str);
    let claims = desired.losing_claims.iter().chain(&desired.refused_claims);
    let clashes = desired.clashes.iter().map(|c| &c.policy);
    pool.into_iter()
        .chain(claims.chain(clashes).map(String::as_str))
        .collect()
}

impl Statuses {
    /// Everything changed: every node's desired state is worked out again, and
    /// every policy's status.
    pub fn everything(&mut self) {
        self.nodes_of.clear();
        self.all_due = true;
    }

    /// Every policy's status is due (something it reports changed for all, or a
    /// status write failed), the nodes kept.
    pub fn all(&mut self) {
        self.all_due = true;
    }

    /// Node `name`'s desired state went from `before` to `after` (`None`: none,
    /// the node is gone or new): the status of each policy either concerns is due,
    /// unless the two are the same.
    pub fn node(&mut self, name: &str, before: Option<&DesiredNode>, after: Option<&DesiredNode>) {
        // A pod event that changed nothing the node should carry or report.
        if before == after {
            return;
        }
        let before = before.map(concerns).unwrap_or_default();
        let after = after.map(concerns).unwrap_or_default();
        for policy in before.difference(&after) {
            if let Some(nodes) = self.nodes_of.get_mut(*policy) {
                nodes.remove(name);
                if nodes.is_empty() {
                    self.nodes_of.remove(*policy);
                }
            }
        }
        for policy in &after {
            let nodes = self.nodes_of.entry((*policy).to_owned()).or_default();
            nodes.insert(name.to_owned());
        }
        if !self.all_due {
            self.due
                .extend(before.union(&after).map(|p| (*p).to_owned()));
        }
    }

    /// The live policies whose status is due now, given what the group planning
    /// and the missed scan found; taken once.
    fn take_due<'s>(
        &mut self,
        snapshot: &'s Snapshot,
        findings: &Findings,
    ) -> Vec<&'s PolicyObject> {
        if findings.gang_mode != self.findings.gang_mode {
            self.all_due = true;
        }
        if !self.all_due {
            let (old, new) = (&self.findings, findings);
            for (before, now) in [(&old.timed_out, &new.timed_out), (&old.missed, &new.missed)] {
                let names = before.keys().chain(now.keys());
                let changed = names.filter(|p| before.get(*p) != now.get(*p));
                self.due.extend(changed.cloned());
            }
        }
        if self.findings != *findings {
            self.findings = findings.clone();
        }
        let live = snapshot
            .objects
            .iter()
            .filter(|p| p.meta().deletion_timestamp.is_none());
        let due: Vec<&PolicyObject> = if std::mem::take(&mut self.all_due) {
            let live: Vec<&PolicyObject> = live.map(AsRef::as_ref).collect();
            // Policies gone (or deleted) are forgotten.
            let names: BTreeSet<String> = live.iter().map(|p| p.name_any()).collect();
            self.reported.retain(|p, _| names.contains(p));
            self.unentitled.retain(|p, _| names.contains(p));
            self.clashes.retain(|p, _| names.contains(p));
            live
        } else {
            live.filter(|p| self.due.contains(&p.name_any()))
                .map(AsRef::as_ref)
                .collect()
        };
        self.due.clear();
        due
    }

    /// Hands the status of each policy due to the policy writer when it changed;
    /// Events for new conflicts and pods without entitlement. Returns how many
    /// policies' status it worked out.
    pub fn update(
        &mut self,
        pass: &Pass<'_>,
        snapshot: &Snapshot,
        desired: &DesiredNodes,
        findings: &Findings,
    ) -> usize {
        let due = self.take_due(snapshot, findings);
        for policy in &due {
            self.update_one(pass, snapshot, desired, policy);
        }
        if !due.is_empty() {
            pass.metrics.unentitled_pods.set_all(&self.unentitled);
            pass.metrics.exclusion_clashes.set_all(&self.clashes);
        }
        due.len()
    }

    /// Works out `policy`'s status from the nodes that concern it.
    fn update_one(
        &mut self,
        pass: &Pass<'_>,
        snapshot: &Snapshot,
        desired: &DesiredNodes,
        policy: &PolicyObject,
    ) {
        let groups = &self.findings;
        let name = policy.name_any();
        let nodes: Vec<(&String, &DesiredNode)> = self
            .nodes_of
            .get(&name)
            .into_iter()
            .flatten()
            .filter_map(|node| desired.get_key_value(node))
            .collect();
        let pooled = |d: &DesiredNode| d.labels.get(POOL_LABEL) == Some(&name);
        let named = |test: &dyn Fn(&DesiredNode) -> bool| -> Vec<String> {
            let mut names: Vec<String> = nodes
                .iter()
                .filter(|(_, d)| test(d))
                .map(|(n, _)| (*n).clone())
                .collect();
            names.sort();
            names
        };
        let node_names = named(&pooled);
        let lost = named(&|d| d.losing_claims.contains(&name));
        let refused = named(&|d| d.refused_claims.contains(&name));
        let mut unentitled: Vec<&(String, String, String)> = nodes
            .iter()
            .filter(|(_, d)| pooled(d))
            .flat_map(|(_, d)| d.unentitled.iter())
            .collect();
        unentitled.sort();
        self.unentitled
            .insert(name.clone(), unentitled.len() as i64);
        // Each pair once, whichever of the two is the policy's own.
        let clashing: BTreeSet<(String, String, String)> = nodes
            .iter()
            .flat_map(|(_, d)| &d.clashes)
            .filter(|clash| clash.policy == name)
            .map(|clash| {
                let (a, b) = if clash.subject <= clash.target {
                    (&clash.subject, &clash.target)
                } else {
                    (&clash.target, &clash.subject)
                };
                (clash.node.clone(), a.clone(), b.clone())
            })
            .collect();
        let apart = snapshot
            .compiled
            .set
            .get(&name)
            .is_some_and(|p| p.spec.avoid.is_some());
        if apart {
            self.clashes.insert(name.clone(), clashing.len() as i64);
        } else {
            self.clashes.remove(&name);
        }
        let reported = self.reported.entry(name.clone()).or_default();

        let current = policy_writer::current_status(policy);
        let previous = current
            .as_ref()
            .map(|s| s.conditions.as_slice())
            .unwrap_or_default();
        let conflict_message = if lost.is_empty() {
            "no node of this pool is claimed by an older policy".to_string()
        } else {
            format!("nodes claimed by an older policy: {}", lost.join(", "))
        };
        let unentitled_message = if unentitled.is_empty() {
            "every pod on this pool's nodes is entitled".to_string()
        } else {
            let names: Vec<String> = unentitled
                .iter()
                .map(|(ns, p, _)| format!("{ns}/{p}"))
                .collect();
            format!(
                "pods without entitlement on pool nodes: {}",
                names.join(", ")
            )
        };
        // The spec in force, recorded while it compiles, kept while it does not.
        let last_good_spec = match snapshot.compiled.errors.get(&name) {
            None => snapshot.compiled.set.get(&name).map(|p| p.spec.clone()),
            Some(_) => current.as_ref().and_then(|s| s.last_good_spec.clone()),
        };
        let compiled = snapshot.compiled.set.get(&name);
        let gang = compiled.is_some_and(|p| p.spec.gang.is_some());
        let mut conditions = vec![
            ready(snapshot, &name, previous),
            condition(
                "Conflict",
                !lost.is_empty(),
                "PoolConflict",
                conflict_message,
                previous,
            ),
            condition(
                "UnentitledPods",
                !unentitled.is_empty(),
                "UnentitledPods",
                unentitled_message,
                previous,
            ),
            missed_condition(groups.missed.get(&name), previous),
        ];
        conditions.extend(compiled.map(|p| in_apiserver(p, previous)));
        conditions.extend(compiled.and_then(|p| self_set_condition(p, &refused, previous)));
        if apart {
            let message = if clashing.is_empty() {
                "no two pods this policy keeps apart share a node".to_string()
            } else {
                let pairs: Vec<String> = clashing
                    .iter()
                    .take(10)
                    .map(|(node, a, b)| format!("{a} and {b} on {node}"))
                    .collect();
                format!(
                    "{} pairs it keeps apart share a node: {}",
                    clashing.len(),
                    pairs.join("; ")
                )
            };
            conditions.push(condition(
                "ExclusionBroken",
                !clashing.is_empty(),
                "PodsShareANode",
                message,
                previous,
            ));
        }
        if gang {
            let late = groups
                .timed_out
                .get(&name)
                .map(Vec::as_slice)
                .unwrap_or_default();
            let message = if late.is_empty() {
                "every held gang is within timeoutSeconds".to_string()
            } else {
                format!("gangs held past timeoutSeconds: {}", late.join(", "))
            };
            conditions.push(condition(
                "GangTimeout",
                !late.is_empty(),
                "GangTimeout",
                message,
                previous,
            ));
        }
        let status = PlacementPolicyStatus {
            nodes: Some(node_names.len() as i32),
            node_names,
            last_good_spec,
            gang_mode: gang.then(|| groups.gang_mode.as_str().to_owned()),
            conditions,
        };
        let key = (name.clone(), Part::Status);
        if current.as_ref() == Some(&status) {
            pass.policy_writes.settled(&key);
        } else {
            pass.policy_writes
                .want(key, PolicyWish::Status(Box::new(status)));
        }

        let reference = policy.object_ref(&());
        let uid = policy.uid().unwrap_or_default();
        let mut events = Vec::new();
        if let Some(invalid) = snapshot.compiled.errors.get(&name) {
            events.push((
                format!(
                    "invalid/{uid}/{}",
                    policy.resource_version().unwrap_or_default()
                ),
                EventType::Warning,
                "InvalidSpec",
                invalid.error.problem.clone(),
            ));
        }
        for node in &refused {
            events.push((
                format!("selfset/{uid}/{node}"),
                EventType::Warning,
                "SelfSetLabels",
                format!(
                    "node {node} matches this pool's nodeSelector only by labels it can set on \
                 itself; it is not taken in"
                ),
            ));
        }
        for node in &lost {
            events.push((
                format!("conflict/{uid}/{node}"),
                EventType::Warning,
                "PoolConflict",
                format!("node {node} belongs to an older policy's pool"),
            ));
        }
        for (ns, pod, pod_uid) in unentitled {
            events.push((
                format!("unentitled/{uid}/{pod_uid}"),
                EventType::Warning,
                "UnentitledPod",
                format!("pod {ns}/{pod} runs on pool {name} without entitlement"),
            ));
        }
        for (node, a, b) in &clashing {
            events.push((
                format!("clash/{uid}/{node}/{a}/{b}"),
                EventType::Warning,
                "ExclusionBroken",
                format!(
                    "pods {a} and {b} share node {node}, which policy {name} keeps apart \
                 (one got there past berth); move one"
                ),
            ));
        }
        for (key, type_, reason, note) in events {
            let event = event(type_, reason, "Reconcile", note);
            reported.publish(pass.events, key, event, &reference);
        }
        reported.end_pass();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::names::ANCHOR_LABEL_PREFIX;

    fn pooled(pool: &str) -> DesiredNode {
        DesiredNode {
            labels: [(POOL_LABEL.to_string(), pool.to_string())].into(),
            ..DesiredNode::default()
        }
    }

    #[test]
    fn a_changed_node_makes_due_only_the_status_of_the_policies_it_concerns() {
        let policy = |name: &str| -> Arc<PolicyObject> {
            Arc::new(
                serde_json::from_value(json!({"apiVersion": "berth.io/v1alpha1",
                    "kind": "PlacementPolicy", "metadata": {"name": name},
                    "spec": {"pool": {"nodeNames": ["n1"]}}}))
                .unwrap(),
            )
        };
        let snapshot = Snapshot {
            objects: ["a", "b", "c", "d"].map(policy).to_vec(),
            compiled: Arc::default(),
            namespaces: Arc::default(),
            daemonsets: Arc::default(),
        };
        let findings = Findings::default();
        let mut statuses = Statuses::default();
        let due = |statuses: &mut Statuses, findings: &Findings| -> Vec<String> {
            let due = statuses.take_due(&snapshot, findings);
            due.iter().map(|p| p.name_any()).collect()
        };
        // A pass over everything: every policy, whatever the nodes.
        statuses.everything();
        let mut n3 = pooled("c");
        n3.losing_claims = vec!["b".into()];
        statuses.node("n1", None, Some(&pooled("a")));
        statuses.node("n2", None, Some(&pooled("b")));
        statuses.node("n3", None, Some(&n3));
        assert_eq!(due(&mut statuses, &findings), ["a", "b", "c", "d"]);
        assert!(due(&mut statuses, &findings).is_empty(), "taken once");

        // A pod on n1 changed what n1 reports: a's status, no other.
        let mut unentitled = pooled("a");
        unentitled.unentitled = vec![("ns".into(), "p".into(), "u".into())];
        statuses.node("n1", Some(&pooled("a")), Some(&unentitled));
        assert_eq!(due(&mut statuses, &findings), ["a"]);
        // A pod event that changed nothing of the node: nothing.
        statuses.node("n1", Some(&unentitled), Some(&unentitled));
        assert!(due(&mut statuses, &findings).is_empty());
        // n3 gone: the pool it was in and the claim it lost.
        statuses.node("n3", Some(&n3), None);
        assert_eq!(due(&mut statuses, &findings), ["b", "c"]);
        assert_eq!(
            statuses.nodes_of["b"],
            BTreeSet::from(["n2".to_string()]),
            "b's status is counted from n2 alone now"
        );
        assert!(!statuses.nodes_of.contains_key("c"), "c concerns no node");
        // A node that concerns no policy, and one that moves from a to d.
        statuses.node("n4", None, Some(&DesiredNode::default()));
        assert!(due(&mut statuses, &findings).is_empty());
        statuses.node("n1", Some(&unentitled), Some(&pooled("d")));
        assert_eq!(due(&mut statuses, &findings), ["a", "d"]);

        // The missed scan found something of b: b's status.
        let missed = Findings {
            missed: [("b".to_string(), vec!["ns/p".to_string()])].into(),
            ..Findings::default()
        };
        assert_eq!(due(&mut statuses, &missed), ["b"]);
        assert!(due(&mut statuses, &missed).is_empty(), "found once");
        assert_eq!(due(&mut statuses, &findings), ["b"], "and gone");
    }

    use k8s_openapi::api::core::v1::Taint;
    use serde_json::json;

    #[test]
    fn the_self_set_labels_condition_says_whether_a_node_can_join_by_labelling_itself() {
        let set = crate::policy::test_policies(&[
            ("named", json!({"pool": {"nodeNames": ["n1"]}})),
            (
                "restricted",
                json!({"pool": {"nodeSelector": {"matchLabels": {
                    "node-restriction.kubernetes.io/gpu": "true"}}}}),
            ),
            (
                "distrusting",
                json!({"pool": {"nodeSelector": {"matchLabels": {"role": "gpu"}}}}),
            ),
            (
                "trusting",
                json!({"pool": {"trustSelfSetLabels": true,
                    "nodeSelector": {"matchLabels": {"role": "gpu"}}}}),
            ),
        ]);
        let of = |name: &str, refused: &[&str]| {
            let refused: Vec<String> = refused.iter().map(|n| n.to_string()).collect();
            self_set_condition(set.get(name).unwrap(), &refused, &[])
        };
        assert!(of("named", &[]).is_none(), "only a pool by selector has it");
        let restricted = of("restricted", &[]).unwrap();
        assert_eq!(
            (restricted.status.as_str(), restricted.reason.as_str()),
            ("False", "NodeRestricted")
        );
        let trusting = of("trusting", &[]).unwrap();
        assert_eq!(
            (trusting.status.as_str(), trusting.reason.as_str()),
            ("True", "Trusted")
        );
        assert!(
            trusting.message.ends_with("setting role on itself"),
            "{}",
            trusting.message
        );
        let distrusting = of("distrusting", &["n4", "n5"]).unwrap();
        assert_eq!(
            (distrusting.status.as_str(), distrusting.reason.as_str()),
            ("True", "NotTrusted")
        );
        assert!(
            distrusting.message.contains("(role)")
                && distrusting.message.ends_with("refused: n4, n5"),
            "{}",
            distrusting.message
        );
    }

    #[test]
    fn a_node_or_a_write_on_its_way_carries_a_policy_by_label_or_taint() {
        let node: NodeObject = serde_json::from_value(json!({
            "metadata": {"name": "n", "labels": {format!("{ANCHOR_LABEL_PREFIX}apart"): "true"}},
            "spec": {"taints": [{"key": POOL_TAINT, "value": "edge", "effect": "NoSchedule"}]}
        }))
        .unwrap();
        assert!(node_carries(&node, "apart"), "its anchor label");
        assert!(node_carries(&node, "edge"), "its pool taint");
        assert!(!node_carries(&node, "other"));

        let write = DesiredNode {
            labels: [(POOL_LABEL.to_string(), "cdn".to_string())].into(),
            taints: vec![Taint {
                key: POOL_TAINT.into(),
                value: Some("gpu".into()),
                effect: "NoSchedule".into(),
                time_added: None,
            }],
            ..DesiredNode::default()
        };
        assert!(write_carries(&write, "cdn"), "its pool label");
        assert!(write_carries(&write, "gpu"), "its pool taint");
        assert!(!write_carries(&write, "edge"));
    }
}
