//! DaemonSet pods (SPEC "The webhook"). A pod is a DaemonSet pod only when the
//! DaemonSet controller sends it and its controller ownerReference is an `apps/v1`
//! DaemonSet ([`PodView::is_daemonset_pod`]). Whatever its image, it gets the
//! toleration of each dedicated pool that takes its DaemonSet (`daemonSets:
//! Tolerate`, and `daemonSetNamespaces` selects its namespace), and never any node
//! affinity: the DaemonSet controller already pins each pod to one node, and a pool
//! term could only contradict that and leave the pod Pending for good.
//!
//! A DaemonSet whose pods tolerate every taint would still reach pools that do not
//! take it. Its *template* gets the pool exclusion, so the DaemonSet controller
//! makes no pod for those nodes; a pod it makes anyway (its template predates the
//! pool and the controller has not brought it in line yet) is refused.

use json_patch::{Patch, PatchOperation};
use serde_json::Value;

use super::entitlement::wildcard_exclusion;
use super::grants::{Grants, pool_toleration};
use super::pod::{PodView, is_wildcard_for};
use super::{NamespaceInfo, NodeIndex};
use crate::policy::PolicySet;
use crate::policy::crd::DaemonSets;

/// What a DaemonSet pod gets, or why it is refused.
#[derive(Debug, Default)]
pub struct DaemonSetDecision {
    pub grants: Grants,
    pub denial: Option<String>,
}

/// Why the pool of `policy` does not take DaemonSets of `namespace`.
fn refusal(policy: &crate::policy::CompiledPolicy, namespace: &NamespaceInfo) -> String {
    match policy.dedicated_pool().map(|p| p.daemon_sets) {
        Some(DaemonSets::Exclude) => "daemonSets: Exclude".into(),
        _ => format!("daemonSetNamespaces does not select {}", namespace.name),
    }
}

/// The tolerations of the pools that take this DaemonSet pod, or a denial when its
/// pods tolerate every taint and this one is made for a node of a pool that does
/// not take it.
pub fn daemonset_grants(
    pod: &PodView,
    policies: &PolicySet,
    namespace: &NamespaceInfo,
    nodes: Option<&NodeIndex>,
) -> DaemonSetDecision {
    let mut decision = DaemonSetDecision::default();
    let target = pod.daemonset_node();
    for policy in policies.iter() {
        let Some(pool) = policy.dedicated_pool() else {
            continue;
        };
        if policy.takes_daemonsets_from(&namespace.labels) {
            if let Some(toleration) = pool_toleration(policy) {
                decision.grants.tolerate(toleration);
                decision.grants.applied.push(policy.name.clone());
            }
            continue;
        }
        let wildcard = pod
            .tolerations()
            .iter()
            .any(|t| is_wildcard_for(t, pool.effect.as_str()));
        let Some(node) = target.filter(|_| wildcard && decision.denial.is_none()) else {
            continue;
        };
        let labels = nodes.and_then(|n| n.get(node)).map(|n| &n.labels);
        if policies
            .pool_of_node(node, labels)
            .is_some_and(|owner| owner.name == policy.name)
        {
            decision.denial = Some(format!(
                "DaemonSet pod for node {node}: the node is in pool {}, which does not take this \
                 DaemonSet ({}), and the pod tolerates every taint",
                policy.name,
                refusal(policy, namespace)
            ));
        }
    }
    decision.grants.applied.sort();
    decision
}

/// A DaemonSet's pod template, as a pod, to decide on.
fn template_pod(daemonset: &Value) -> Option<Value> {
    let template = daemonset.pointer("/spec/template")?;
    Some(serde_json::json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": template.get("metadata").cloned().unwrap_or_else(|| serde_json::json!({})),
        "spec": template.get("spec").cloned().unwrap_or_else(|| serde_json::json!({})),
    }))
}

/// The patch that brings a DaemonSet's pod template in line: the tolerations of
/// the pools that take it, forged pool tolerations gone, and, when its pods
/// tolerate every taint, the exclusion of the dedicated pools that do not take it.
///
/// The DaemonSet controller creates a pod for a node only if the *template*
/// tolerates the node's taints and its node affinity admits the node, so pools are
/// opened and closed to a DaemonSet here, not on its pods.
pub fn template_patch(daemonset: &Value, policies: &PolicySet, namespace: &NamespaceInfo) -> Patch {
    let Some(pod) = template_pod(daemonset) else {
        return Patch(Vec::new());
    };
    let Ok(view) = PodView::read(&pod) else {
        return Patch(Vec::new());
    };
    let mut grants = Grants::default();
    let mut allowed = std::collections::BTreeSet::new();
    for policy in policies.iter() {
        if policy.takes_daemonsets_from(&namespace.labels)
            && let Some(toleration) = pool_toleration(policy)
        {
            grants.tolerate(toleration);
            allowed.insert(policy.name.clone());
        }
    }
    if let Some(exclusion) = wildcard_exclusion(&view, policies, &allowed) {
        grants.require(exclusion);
    }
    let mut patch = super::patch::build_patch(&pod, &grants);
    // A template's annotations are the user's: leave them alone.
    patch
        .0
        .retain(|op| !op.path().as_str().starts_with("/metadata"));
    super::patch::nest(patch, &["spec", "template"])
}

/// The template patch, when the controller should apply it to a DaemonSet that
/// exists already: when it adds a toleration or an exclusion, or removes one that
/// names a policy in force. Stale tolerations of pools that are gone are left for
/// the DaemonSet's next update: each template change rolls every pod of it.
pub fn template_drift(
    daemonset: &Value,
    policies: &PolicySet,
    namespace: &NamespaceInfo,
) -> Option<Patch> {
    let patch = template_patch(daemonset, policies, namespace);
    let matters = patch.0.iter().any(|op| match op {
        PatchOperation::Add(_) => true,
        PatchOperation::Remove(remove) => daemonset
            .pointer(remove.path.as_str())
            .is_some_and(|removed| names_a_policy(removed, policies)),
        _ => false,
    });
    matters.then_some(patch)
}

/// Whether any string in `value` is the name of a policy in force.
fn names_a_policy(value: &Value, policies: &PolicySet) -> bool {
    match value {
        Value::String(s) => policies.get(s).is_some(),
        Value::Array(items) => items.iter().any(|v| names_a_policy(v, policies)),
        Value::Object(map) => map.values().any(|v| names_a_policy(v, policies)),
        _ => false,
    }
}
