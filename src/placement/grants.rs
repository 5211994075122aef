//! What the policies that apply to a pod give it: the pool toleration, required or
//! preferred pool affinity, extra node affinity, and co-location/avoid affinity on
//! anchor labels. Pure data; [`super::patch`] turns it into JSON Patch.

use k8s_openapi::api::core::v1::{
    NodeSelectorRequirement, NodeSelectorTerm, PreferredSchedulingTerm, Toleration,
};

use super::canonical::{normalized, preferred_key, requirement_key, toleration_key};
use crate::names::{AVOID_GATE, POOL_LABEL, POOL_TAINT, anchor_label};
use crate::policy::CompiledPolicy;
use crate::policy::crd::Placement;

/// Everything berth adds to a pod. Node requirements in `required` are ANDed into
/// every nodeSelectorTerm of the pod; `preferred` terms are appended.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Grants {
    pub tolerations: Vec<Toleration>,
    pub required: Vec<NodeSelectorRequirement>,
    pub preferred: Vec<PreferredSchedulingTerm>,
    pub scheduler_name: Option<String>,
    /// Scheduling gates berth holds the pod with (`berth.io/avoid`).
    pub scheduling_gates: Vec<String>,
    /// Names of the applied policies, sorted: the `berth.io/applied` annotation.
    pub applied: Vec<String>,
    /// The Kubernetes PodGroup the pod joins (`spec.schedulingGroup.podGroupName`).
    pub pod_group: Option<String>,
    /// Queue order: the pod's PriorityClass and priority.
    pub priority: Option<QueuePriority>,
    /// The node the pod names itself (`spec.nodeName`), when berth holds it: a pod
    /// with a node name skips the scheduler and may not carry a scheduling gate, so
    /// the name becomes a required `metadata.name In [node]` in every term, and the
    /// pod is held, checked and placed there like any other.
    pub pinned_to: Option<String>,
}

/// A `berth-queue-<value>` PriorityClass and its value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QueuePriority {
    pub class: String,
    pub value: i32,
}

impl Grants {
    /// The field requirements berth ANDs into every term, beside `required`: the
    /// pin ([`Grants::pinned_to`]) as `metadata.name In [node]`, when there is one.
    pub fn pin_fields(&self) -> Vec<NodeSelectorRequirement> {
        let pin = self.pinned_to.as_deref();
        pin.map(|node| requirement("metadata.name", "In", &[node]))
            .into_iter()
            .collect()
    }

    /// Adds a required expression unless one that means the same is already there.
    pub fn require(&mut self, requirement: NodeSelectorRequirement) {
        let key = requirement_key(&requirement);
        if !self.required.iter().any(|r| requirement_key(r) == key) {
            self.required.push(normalized(&requirement));
        }
    }

    /// Holds the pod with the scheduling gate `name`, once.
    pub fn gate(&mut self, name: &str) {
        if !self.scheduling_gates.iter().any(|g| g == name) {
            self.scheduling_gates.push(name.into());
        }
    }

    pub fn tolerate(&mut self, toleration: Toleration) {
        let key = toleration_key(&toleration);
        if !self.tolerations.iter().any(|t| toleration_key(t) == key) {
            self.tolerations.push(toleration);
        }
    }

    /// Prefers nodes matching `requirement` with `weight`, once: two policies that
    /// prefer the same thing with the same weight count it once.
    fn prefer(&mut self, weight: i32, requirement: NodeSelectorRequirement) {
        let term = PreferredSchedulingTerm {
            weight,
            preference: NodeSelectorTerm {
                match_expressions: Some(vec![normalized(&requirement)]),
                match_fields: None,
            },
        };
        let key = preferred_key(&term);
        if !self.preferred.iter().any(|p| preferred_key(p) == key) {
            self.preferred.push(term);
        }
    }
}

/// The toleration of `policy`'s dedicated pool taint.
pub fn pool_toleration(policy: &CompiledPolicy) -> Option<Toleration> {
    let pool = policy.dedicated_pool()?;
    Some(Toleration {
        key: Some(POOL_TAINT.into()),
        operator: Some("Equal".into()),
        value: Some(policy.name.clone()),
        effect: Some(pool.effect.as_str().into()),
        toleration_seconds: None,
    })
}

/// A node requirement `key operator values`.
pub fn requirement(key: &str, operator: &str, values: &[&str]) -> NodeSelectorRequirement {
    NodeSelectorRequirement {
        key: key.into(),
        operator: operator.into(),
        values: (!values.is_empty()).then(|| values.iter().map(|v| v.to_string()).collect()),
    }
}

/// The grants of the policies that apply to an ordinary (non-DaemonSet) pod.
///
/// Required pools become one `In` expression over all of them: a node carries one
/// pool label, so separate expressions would leave no node at all.
pub fn grants_for(applied: &[&CompiledPolicy]) -> Grants {
    let mut grants = Grants::default();
    let mut required_pools: Vec<&str> = Vec::new();
    for policy in applied {
        let spec = &policy.spec;
        if let Some(toleration) = pool_toleration(policy) {
            grants.tolerate(toleration);
        }
        if let Some(pool) = &spec.pool {
            match pool.placement {
                Placement::Required => required_pools.push(&policy.name),
                Placement::Preferred => {
                    grants.prefer(pool.weight, requirement(POOL_LABEL, "In", &[&policy.name]))
                }
            }
        }
        if let Some(affinity) = &spec.node_affinity {
            for r in &affinity.required {
                grants.require(r.clone());
            }
            for p in &affinity.preferred {
                grants.prefer(p.weight, p.preference.clone());
            }
        }
        if spec.colocate_with.is_some() {
            grants.require(requirement(&anchor_label(&policy.name), "In", &["true"]));
        }
        if spec.avoid.is_some() {
            grants.require(requirement(
                &anchor_label(&policy.name),
                "DoesNotExist",
                &[],
            ));
            // Node labels alone race: pods created together would all be scheduled
            // before any node is labelled. The gate lets the controller release
            // them so that no two that must avoid each other are in flight at once.
            grants.gate(AVOID_GATE);
        }
        grants.applied.push(policy.name.clone());
    }
    if !required_pools.is_empty() {
        required_pools.sort_unstable();
        grants
            .required
            .insert(0, requirement(POOL_LABEL, "In", &required_pools));
    }
    grants.applied.sort();
    grants
}
