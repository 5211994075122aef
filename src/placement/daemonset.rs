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

/// The patch that gives a DaemonSet's pod template the tolerations its pods get.
///
/// The DaemonSet controller creates a pod for a node only if the *template*
/// tolerates the node's taints, so tolerating pool taints on the pods alone would
/// never get a DaemonSet onto a dedicated node: the template needs them too.
pub fn template_patch(daemonset: &serde_json::Value, policies: &PolicySet) -> json_patch::Patch {
    let Some(template) = daemonset.pointer("/spec/template") else {
        return json_patch::Patch(Vec::new());
    };
    let pod = serde_json::json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": template.get("metadata").cloned().unwrap_or_else(|| serde_json::json!({})),
        "spec": template.get("spec").cloned().unwrap_or_else(|| serde_json::json!({})),
    });
    let Ok(view) = PodView::read(&pod) else {
        return json_patch::Patch(Vec::new());
    };
    let (grants, _) = daemonset_grants(&view, policies);
    // Only tolerations: templates carry no `berth.io/applied`.
    let tolerations = Grants {
        tolerations: grants.tolerations,
        ..Grants::default()
    };
    let mut patch = super::patch::build_patch(&pod, &tolerations);
    // A template's annotations are the user's: leave them alone.
    patch
        .0
        .retain(|op| !op.path().as_str().starts_with("/metadata"));
    super::patch::nest(patch, &["spec", "template"])
}
