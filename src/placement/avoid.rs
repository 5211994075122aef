//! The webhook's half of exact exclusion (SPEC "The controller"): which pods are
//! held with the gate `berth.io/avoid`, and what keeps them apart when the
//! controller releases them.
//!
//! - A pod an `avoid` policy applies to (a *subject*) keeps off nodes where the
//!   pods it avoids run: `berth.runs.<policy> DoesNotExist`.
//! - `avoid` is symmetric, as required anti-affinity is in kube-scheduler: a pod the
//!   policy avoids (a *target*), created later, keeps off nodes where the policy's
//!   subjects run: `berth.placed.<policy> DoesNotExist`.
//! - Subjects, and targets in namespaces that opt into the policy, are held by the
//!   gate so the controller can release them one conflict at a time. Targets in
//!   other namespaces (possible with `anchorNamespaces: All`) are not held: berth
//!   never stalls pods of a namespace that did not opt in; the label keeps them
//!   apart, as far as the scheduler's node cache is current.
//! - A pod with `spec.nodeName` bypasses the scheduler, and the apiserver refuses
//!   a gated pod with a node name: berth turns the name into a required
//!   `metadata.name In [node]` and holds the pod like any other, so that two pods
//!   created together naming one node cannot both land there. Naming a node where
//!   a pod it must avoid runs already (as the node's labels say) is refused.

use std::collections::BTreeSet;

use super::grants::{Grants, requirement};
use super::matching;
use super::namespace::NamespaceInfo;
use crate::names::{AVOID_GATE, anchor_label, placed_label};
use crate::objects::NodeIndex;
use crate::objects::PodObject;
use crate::policy::crd::AnchorNamespaces;
use crate::policy::{NamespaceConfig, PolicySet};

/// The avoid policies that hold `pod` as a target, and whether its namespace opts
/// into each (then it is gated too).
fn targets<'p>(
    pod: &PodObject,
    namespace: &NamespaceInfo,
    config: Option<&NamespaceConfig>,
    policies: &'p PolicySet,
) -> Vec<(&'p str, bool)> {
    policies
        .iter()
        .filter(|p| p.spec.avoid.is_some() && p.is_anchor_pod(pod.labels()))
        .filter_map(|p| {
            let opted_in = matching::opts_in(p, namespace, config);
            let counts = opted_in || p.spec.anchor_namespaces == AnchorNamespaces::All;
            counts.then_some((p.name.as_str(), opted_in))
        })
        .collect()
}

/// Adds what keeps `pod` apart from the pods it must avoid as a target of other
/// avoid policies, and pins a held pod that names its node to it. Returns the
/// avoid policies the pod is a target of.
pub fn hold(
    pod: &PodObject,
    namespace: &NamespaceInfo,
    config: Option<&NamespaceConfig>,
    policies: &PolicySet,
    grants: &mut Grants,
) -> BTreeSet<String> {
    let mut targeted = BTreeSet::new();
    for (policy, opted_in) in targets(pod, namespace, config, policies) {
        grants.require(requirement(&placed_label(policy), "DoesNotExist", &[]));
        if opted_in {
            grants.gate(AVOID_GATE);
        }
        targeted.insert(policy.to_owned());
    }
    if let Some(node) = pod
        .node_name()
        .filter(|_| grants.scheduling_gates.iter().any(|g| g == AVOID_GATE))
    {
        // The apiserver refuses a pod with both a node name and a gate.
        grants.pinned_to = Some(node.to_owned());
    }
    targeted
}

/// A denial when `spec.nodeName` names a node where a pod this one must avoid
/// runs: the node carries the anchor label of an avoid policy the pod is a subject
/// of, or the placed label of one it is a target of.
pub fn node_name_denial(
    pod: &PodObject,
    nodes: Option<&NodeIndex>,
    subject_of: &[String],
    target_of: &BTreeSet<String>,
    policies: &PolicySet,
) -> Option<String> {
    let node = pod.node_name()?;
    let labels = &nodes?.get(node)?.labels;
    let subject = subject_of
        .iter()
        .filter(|p| policies.get(p).is_some_and(|p| p.spec.avoid.is_some()))
        .find(|p| labels.contains_key(&anchor_label(p)));
    let target = target_of
        .iter()
        .find(|p| labels.contains_key(&placed_label(p)));
    subject.or(target).map(|policy| {
        format!(
            "spec.nodeName {node} already runs a pod that policy {policy} keeps this pod apart from"
        )
    })
}
