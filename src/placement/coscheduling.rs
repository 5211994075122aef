//! Pods a controller ties together with required pod affinity (Tekton's task pods
//! and their affinity assistant, a sidecar StatefulSet): berth routes each pod by
//! its own images and labels, but a pod that must sit beside others can only go
//! where they are. A group is routed as one by a policy's `coscheduled` selector,
//! which every member matches by its labels; a pod routed to a pool by its image
//! alone, with a required pod affinity, is told at admission that the pods it must
//! sit beside may run elsewhere (contract, "Co-scheduled pods").

use super::Grants;
use super::matching::Applied;
use super::warning::bounded;
use crate::names::POOL_LABEL;
use crate::objects::PodObject;

/// The warning for a pod that berth routes to a pool by its image while its own
/// required pod affinity ties it to other pods: unless they run on the pool too,
/// the scheduler finds no node for it.
pub fn conflict_warning(pod: &PodObject, applied: &[Applied], grants: &Grants) -> Option<String> {
    if !pod.requires_pod_affinity() {
        return None;
    }
    let pools = grants
        .required
        .iter()
        .find(|r| r.key == POOL_LABEL && r.operator == "In")?
        .values
        .as_deref()
        .unwrap_or_default();
    let alone: Vec<&str> = applied
        .iter()
        .filter(|a| !a.with_group && pools.contains(&a.policy))
        .map(|a| a.policy.as_str())
        .collect();
    (!alone.is_empty()).then(|| {
        bounded(format!(
            "pool {}: the pod must sit beside pods that may run elsewhere; route its group \
             with coscheduled",
            alone.join(", ")
        ))
    })
}
