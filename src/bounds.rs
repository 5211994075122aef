//! The most berth reads of one pod. Every list a tenant writes that berth walks
//! (tolerations, scheduling gates, node-affinity terms and their requirements,
//! containers) has a bound, so that the work of a decision, of the admission
//! policies (which walk a pod's lists once per PlacementPolicy) and of the
//! controller's caches is bounded by a constant per pod, whatever a tenant sends.
//!
//! A pod over a bound is refused with the reason: by the webhook here, and with
//! berth down by the admission policy `berth-limits`, which checks the same bounds
//! ([`crate::admission::cel`]) before any other policy walks a list. The bounds
//! are generous: Kubernetes' own controllers write a handful of each.

/// A bound on one list of a pod.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Bound {
    /// The list, as a path in the pod (`spec.tolerations`).
    pub field: &'static str,
    /// The most items berth reads.
    pub most: usize,
}

/// Tolerations (DaemonSet pods carry about eight of Kubernetes' own).
pub const TOLERATIONS: Bound = Bound {
    field: "spec.tolerations",
    most: 128,
};
/// Scheduling gates.
pub const SCHEDULING_GATES: Bound = Bound {
    field: "spec.schedulingGates",
    most: 32,
};
/// Required node-affinity terms.
pub const REQUIRED_TERMS: Bound = Bound {
    field: "spec.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms",
    most: 32,
};
/// Preferred node-affinity terms.
pub const PREFERRED_TERMS: Bound = Bound {
    field: "spec.affinity.nodeAffinity.preferredDuringSchedulingIgnoredDuringExecution",
    most: 64,
};
/// Requirements in one node-selector term (its `matchExpressions`, and apart its
/// `matchFields`).
pub const TERM_REQUIREMENTS: Bound = Bound {
    field: "matchExpressions or matchFields of a node-selector term",
    most: 64,
};
/// Containers, and apart init containers.
pub const CONTAINERS: Bound = Bound {
    field: "spec.containers or spec.initContainers",
    most: 128,
};

/// The bytes of an image reference the controller keeps of a container. A
/// reference a registry takes is far shorter (a name of at most 255, a tag of at
/// most 128, a digest); a longer one names no image any node can pull, so the
/// controller keeps it as no image rather than hold what a tenant sized.
pub const IMAGE_BYTES: usize = 512;
/// The policy names of a `berth.io/applied` record the controller keeps: berth
/// writes one per policy that applies to the pod, and a record longer than this is
/// a tenant's, of which the first names are as good as all.
pub const RECORD_NAMES: usize = 64;

/// Labels: the controller keeps every pod's, to match selectors.
pub const LABELS: Bound = Bound {
    field: "metadata.labels",
    most: 64,
};
/// Owner references: who controls the pod decides what it is.
pub const OWNER_REFERENCES: Bound = Bound {
    field: "metadata.ownerReferences",
    most: 16,
};

/// The first bound `counts` exceeds, as the reason to refuse the pod.
pub fn over(counts: &[(Bound, usize)]) -> Option<String> {
    counts
        .iter()
        .find(|(bound, count)| *count > bound.most)
        .map(|(bound, count)| {
            format!(
                "{} has {count} items; berth reads at most {} (a bound on what one pod may make \
             berth and the apiserver do)",
                bound.field, bound.most
            )
        })
}
