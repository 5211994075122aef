//! Which Node labels a node can set on itself: the labels a pool's `nodeSelector`
//! may not take on trust (SPEC "Names", `spec.pool.trustSelfSetLabels`).
//!
//! A kubelet (`system:node:<name>` in `system:nodes`) may patch its own Node. The
//! NodeRestriction admission plugin refuses it a change to a label (adding,
//! changing or removing one) only in two cases: the key's prefix is
//! `node-restriction.kubernetes.io` or one of its subdomains, or the prefix is
//! `kubernetes.io`, `k8s.io` or one of their subdomains and the key is not one of
//! the kubelet's own labels. Every other key (`role`, `nvidia.com/gpu.product`,
//! `kubernetes.io/hostname`, `node.kubernetes.io/instance-type`) is the node's to
//! set. Mirrored from Kubernetes 1.37: `getForbiddenLabels` in
//! plugin/pkg/admission/noderestriction and `IsKubeletLabel` in
//! k8s.io/kubelet/pkg/apis.

/// The keys a kubelet may set although they are in `kubernetes.io`
/// (`k8s.io/kubelet/pkg/apis.KubeletLabels`).
const KUBELET_LABELS: [&str; 11] = [
    "kubernetes.io/hostname",
    "topology.kubernetes.io/zone",
    "topology.kubernetes.io/region",
    "failure-domain.beta.kubernetes.io/zone",
    "failure-domain.beta.kubernetes.io/region",
    "beta.kubernetes.io/instance-type",
    "node.kubernetes.io/instance-type",
    "kubernetes.io/os",
    "kubernetes.io/arch",
    "beta.kubernetes.io/os",
    "beta.kubernetes.io/arch",
];

/// Prefixes whose keys (with their subdomains') a kubelet may set
/// (`KubeletLabelNamespaces`).
const KUBELET_LABEL_NAMESPACES: [&str; 2] = ["kubelet.kubernetes.io", "node.kubernetes.io"];

/// The prefix NodeRestriction closes to kubelets whatever the key.
const NODE_RESTRICTION_NAMESPACE: &str = "node-restriction.kubernetes.io";

/// Whether a node can set, change or remove the label `key` on its own Node with
/// NodeRestriction enabled.
pub fn node_can_set_label(key: &str) -> bool {
    let prefix = key.split_once('/').map_or("", |(prefix, _)| prefix);
    if within(prefix, NODE_RESTRICTION_NAMESPACE) {
        return false;
    }
    let kubernetes = within(prefix, "kubernetes.io") || within(prefix, "k8s.io");
    !kubernetes || is_kubelet_label(key, prefix)
}

/// `IsKubeletLabel`: one of the kubelet's own keys, or a key in one of its
/// namespaces.
fn is_kubelet_label(key: &str, prefix: &str) -> bool {
    KUBELET_LABELS.contains(&key)
        || KUBELET_LABEL_NAMESPACES
            .iter()
            .any(|namespace| within(prefix, namespace))
}

/// Whether the key prefix `prefix` is `domain` or a subdomain of it.
fn within(prefix: &str, domain: &str) -> bool {
    prefix
        .strip_suffix(domain)
        .is_some_and(|rest| rest.is_empty() || rest.ends_with('.'))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_node_sets_keys_outside_kubernetes_and_the_kubelets_own() {
        for key in [
            "role",
            "gpu",
            "nvidia.com/gpu.product",
            "example.com/nvme",
            "feature.node.kubernetes.io/cpu-model.vendor_id",
            "kubernetes.io/hostname",
            "kubernetes.io/os",
            "beta.kubernetes.io/arch",
            "topology.kubernetes.io/zone",
            "failure-domain.beta.kubernetes.io/region",
            "node.kubernetes.io/instance-type",
            "node.kubernetes.io/anything",
            "kubelet.kubernetes.io/anything",
            "team.kubelet.kubernetes.io/x",
            // Not a subdomain of kubernetes.io: only the suffix after a dot counts.
            "notkubernetes.io/x",
            "k8s.io.example.com/x",
        ] {
            assert!(node_can_set_label(key), "{key}");
        }
    }

    #[test]
    fn a_node_cannot_set_node_restriction_or_other_kubernetes_keys() {
        for key in [
            "node-restriction.kubernetes.io/gpu",
            "node-restriction.kubernetes.io/berth.pool",
            "team.node-restriction.kubernetes.io/x",
            "node-role.kubernetes.io/worker",
            "kubernetes.io/role",
            "topology.kubernetes.io/rack",
            "k8s.io/x",
            "example.k8s.io/x",
            "cloud.google.com.kubernetes.io/x",
        ] {
            assert!(!node_can_set_label(key), "{key}");
        }
    }
}
