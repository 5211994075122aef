//! DaemonSet pods (SPEC "The webhook"): in every namespace and whatever their
//! image, they get the toleration of each dedicated pool whose `daemonSets` is
//! `Tolerate`, and never any node affinity: the DaemonSet controller already pins
//! each pod to one node, and a pool or exclusion term could only contradict that
//! and leave the pod Pending for good.

use super::grants::{Grants, pool_toleration};
use super::pod::{PodView, is_wildcard_for};
use super::warning::bounded;
use crate::policy::PolicySet;
use crate::policy::crd::DaemonSets;

/// Tolerations for a DaemonSet pod, and warnings where a pool cannot keep it off.
pub fn daemonset_grants(pod: &PodView, policies: &PolicySet) -> (Grants, Vec<String>) {
    let mut grants = Grants::default();
    let mut warnings = Vec::new();
    for policy in policies.iter() {
        let Some(pool) = policy.dedicated_pool() else {
            continue;
        };
        match pool.daemon_sets {
            DaemonSets::Tolerate => {
                if let Some(toleration) = pool_toleration(policy) {
                    grants.tolerate(toleration);
                    grants.applied.push(policy.name.clone());
                }
            }
            DaemonSets::Exclude => {
                let effect = pool.effect.as_str();
                if pod.tolerations().iter().any(|t| is_wildcard_for(t, effect)) {
                    warnings.push(bounded(format!(
                        "DaemonSet pod tolerates every taint: pool {} (daemonSets: Exclude) cannot keep it off",
                        policy.name
                    )));
                }
            }
        }
    }
    grants.applied.sort();
    (grants, warnings)
}
