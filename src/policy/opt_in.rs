//! Which namespaces opt into which policies: the security boundary (SPEC "The
//! webhook"). A namespace opts in by naming a policy in `berth.io/policies` or by
//! matching its `namespaceSelector`; only cluster administrators write namespaces,
//! so a tenant cannot opt itself in. Everything the controller trusts about a pod
//! (its `berth.io/applied`, whether it holds others back) is weighed against this.

use super::compile::CompiledPolicy;

/// What the controller asks of namespaces. The namespaces the cluster model
/// keeps (`placement::NamespaceIndex`, each read once per change) answer it.
pub trait OptIn {
    /// Whether `namespace` opts into `policy`.
    fn opts_in(&self, policy: &CompiledPolicy, namespace: &str) -> bool;
    /// Whether `policy`'s dedicated pool takes DaemonSets of `namespace`.
    fn takes_daemonsets(&self, policy: &CompiledPolicy, namespace: &str) -> bool;
    /// The policies `namespace` names in its `berth.io/policies` annotation.
    fn named(&self, namespace: &str) -> &[String];
}
