//! Which namespaces opt into which policies: the security boundary (SPEC "The
//! webhook"). A namespace opts in by naming a policy in `berth.io/policies` or by
//! matching its `namespaceSelector`; only cluster administrators write namespaces,
//! so a tenant cannot opt itself in. Everything the controller trusts about a pod
//! (its `berth.io/applied`, whether it holds others back) is weighed against this.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

use super::NamespaceConfig;
use super::compile::{CompiledPolicy, Labels};

/// What the controller asks of namespaces.
pub trait OptIn {
    /// Whether `namespace` opts into `policy`.
    fn opts_in(&self, policy: &CompiledPolicy, namespace: &str) -> bool;
    /// Whether `policy`'s dedicated pool takes DaemonSets of `namespace`.
    fn takes_daemonsets(&self, policy: &CompiledPolicy, namespace: &str) -> bool;
    /// The policies `namespace` names in its `berth.io/policies` annotation.
    fn named(&self, namespace: &str) -> &[String];
}

/// Namespace opt-in from Namespace metadata.
#[derive(Debug, Default)]
pub struct NamespaceOptIn(BTreeMap<String, (NamespaceConfig, Labels)>);

impl NamespaceOptIn {
    /// A namespace whose berth annotations do not parse opts into nothing by
    /// annotation (its labels may still be selected).
    pub fn new<'a>(namespaces: impl IntoIterator<Item = &'a ObjectMeta>) -> Self {
        NamespaceOptIn(
            namespaces
                .into_iter()
                .map(|meta| {
                    let annotations = meta.annotations.clone().unwrap_or_default();
                    let config = NamespaceConfig::parse(&annotations).unwrap_or_default();
                    let labels = meta.labels.clone().unwrap_or_default();
                    (meta.name.clone().unwrap_or_default(), (config, labels))
                })
                .collect(),
        )
    }
}

impl NamespaceOptIn {
    /// A namespace's berth configuration and labels, if the cache holds it.
    pub fn get(&self, namespace: &str) -> Option<&(NamespaceConfig, Labels)> {
        self.0.get(namespace)
    }
}

impl OptIn for NamespaceOptIn {
    fn opts_in(&self, policy: &CompiledPolicy, namespace: &str) -> bool {
        self.0
            .get(namespace)
            .is_some_and(|(config, labels)| policy.namespace_opts_in(config, labels))
    }

    fn takes_daemonsets(&self, policy: &CompiledPolicy, namespace: &str) -> bool {
        self.0.get(namespace).is_some_and(|(config, labels)| {
            policy.takes_daemonsets_from(labels, policy.namespace_opts_in(config, labels))
        })
    }

    fn named(&self, namespace: &str) -> &[String] {
        self.0
            .get(namespace)
            .map(|(config, _)| config.policies.as_slice())
            .unwrap_or_default()
    }
}
