//! Which policies a pod counts under, as the controller and `berth explain` read
//! it from the pod and its namespace. Nothing a tenant writes is taken on trust: a
//! pod's `berth.io/applied` counts only for policies its namespace opts into.

use crate::names::APPLIED_ANNOTATION;
use crate::policy::compile::Labels;
use crate::policy::crd::AnchorNamespaces;
use crate::policy::{CompiledPolicy, OptIn, PolicySet};

/// The policies named in a pod's `berth.io/applied`, as written.
pub fn applied_policies(annotations: Option<&Labels>) -> Vec<String> {
    applied_names(
        annotations
            .and_then(|a| a.get(APPLIED_ANNOTATION))
            .map(String::as_str),
    )
}

/// The policy names in the value of a `berth.io/applied` annotation.
pub fn applied_names(applied: Option<&str>) -> Vec<String> {
    applied
        .map(|a| a.split(',').map(|p| p.trim().to_owned()).collect())
        .unwrap_or_default()
}

/// The policies of `applied` that count for a pod in `namespace`: those the
/// namespace opts into. A tenant can annotate its own pod with anything.
pub fn entitled_policies<'p>(
    applied: &[String],
    namespace: &str,
    policies: &'p PolicySet,
    opt_in: &dyn OptIn,
) -> Vec<&'p CompiledPolicy> {
    applied
        .iter()
        .filter_map(|name| policies.get(name))
        .filter(|p| opt_in.opts_in(p, namespace))
        .collect()
}

/// The policies a pod counts under: those its `berth.io/applied` names that its
/// namespace opts into.
pub fn pod_entitlements<'p>(
    pod: &crate::objects::PodObject,
    policies: &'p PolicySet,
    opt_in: &dyn OptIn,
) -> Vec<&'p CompiledPolicy> {
    let meta = &pod.metadata;
    let applied = applied_policies(meta.annotations.as_ref());
    entitled_policies(
        &applied,
        meta.namespace.as_deref().unwrap_or_default(),
        policies,
        opt_in,
    )
}

/// Whether a pod with these labels in `namespace` is one `policy`'s anchor label
/// follows: it matches `colocateWith` or `avoid`, and its namespace counts:
/// any for `anchorNamespaces: All`, one that opts into the policy for `Same`.
pub fn anchors(
    policy: &CompiledPolicy,
    labels: &Labels,
    namespace: &str,
    opt_in: &dyn OptIn,
) -> bool {
    policy.is_anchor_pod(labels)
        && match policy.spec.anchor_namespaces {
            AnchorNamespaces::All => true,
            AnchorNamespaces::Same => opt_in.opts_in(policy, namespace),
        }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// Every namespace opts into every policy, and pools take every DaemonSet.
    pub(crate) struct Everyone;
    impl OptIn for Everyone {
        fn opts_in(&self, _: &CompiledPolicy, _: &str) -> bool {
            true
        }
        fn takes_daemonsets(&self, policy: &CompiledPolicy, _: &str) -> bool {
            policy.takes_daemonsets_from(&Labels::new(), true)
        }
        fn named(&self, _: &str) -> &[String] {
            &[]
        }
    }
    /// Only one namespace opts in.
    pub(crate) struct Only(pub &'static str);
    impl OptIn for Only {
        fn opts_in(&self, _: &CompiledPolicy, namespace: &str) -> bool {
            namespace == self.0
        }
        fn takes_daemonsets(&self, policy: &CompiledPolicy, namespace: &str) -> bool {
            namespace == self.0 && policy.takes_daemonsets_from(&Labels::new(), true)
        }
        fn named(&self, _: &str) -> &[String] {
            &[]
        }
    }
}
