//! Entitlement (SPEC "The webhook"): a pod that is not entitled to a dedicated pool
//! never ends up there.
//!
//! - A `berth.io/pool` toleration the pod brings itself is removed (berth owns the
//!   key and derives it again), with a warning.
//! - A wildcard toleration would tolerate every pool taint, so the pod gets a
//!   required `NotIn` expression over the dedicated pools it is not entitled to.
//! - `spec.nodeName` bypasses the scheduler and taints, so naming a dedicated node
//!   the pod is not entitled to is denied.

use std::collections::BTreeSet;

use k8s_openapi::api::core::v1::{NodeSelectorRequirement, Toleration};

use super::NodeIndex;
use super::grants::requirement;
use super::pod::{PodView, is_wildcard_for};
use super::warning::bounded;
use crate::names::{POOL_LABEL, POOL_TAINT};
use crate::policy::PolicySet;

/// Whether berth owns a toleration: its key is the pool taint key.
pub fn is_owned_toleration(toleration: &Toleration) -> bool {
    toleration.key.as_deref() == Some(POOL_TAINT)
}

/// The pool tolerations the pod brings that berth does not grant, with a warning
/// for each.
pub fn forged_tolerations(pod: &PodView, granted: &[Toleration]) -> (Vec<Toleration>, Vec<String>) {
    let forged: Vec<Toleration> = pod
        .tolerations()
        .iter()
        .filter(|t| is_owned_toleration(t) && !granted.contains(t))
        .cloned()
        .collect();
    let warnings = forged
        .iter()
        .map(|t| {
            let value = t.value.as_deref().unwrap_or("*");
            bounded(format!(
                "removed toleration {POOL_TAINT}={value}: the pod is not entitled to that pool"
            ))
        })
        .collect();
    (forged, warnings)
}

/// The `NotIn` requirement that keeps a pod with a wildcard toleration off the
/// dedicated pools in `policies` it is not `entitled` to.
pub fn wildcard_exclusion(
    pod: &PodView,
    policies: &PolicySet,
    entitled: &BTreeSet<String>,
) -> Option<NodeSelectorRequirement> {
    let mut excluded: Vec<&str> = policies
        .iter()
        .filter(|p| !entitled.contains(p.name.as_str()))
        .filter(|p| {
            p.dedicated_pool().is_some_and(|pool| {
                let effect = pool.effect.as_str();
                pod.tolerations().iter().any(|t| is_wildcard_for(t, effect))
            })
        })
        .map(|p| p.name.as_str())
        .collect();
    if excluded.is_empty() {
        return None;
    }
    excluded.sort_unstable();
    Some(requirement(POOL_LABEL, "NotIn", &excluded))
}

/// A denial when `spec.nodeName` names a node of a dedicated pool the pod is not
/// entitled to. Pool membership comes from `pool.nodeNames`, and from
/// `pool.nodeSelector` when the node's labels are known.
pub fn node_name_denial(
    pod: &PodView,
    policies: &PolicySet,
    nodes: Option<&NodeIndex>,
    entitled: &BTreeSet<String>,
) -> Option<String> {
    let node = pod.node_name()?;
    let labels = nodes.and_then(|n| n.get(node)).map(|n| &n.labels);
    let owner = policies.pool_of_node(node, labels)?;
    owner.dedicated_pool()?;
    (!entitled.contains(owner.name.as_str())).then(|| {
        format!(
            "spec.nodeName {node} is in dedicated pool {}, which this pod is not entitled to",
            owner.name
        )
    })
}
