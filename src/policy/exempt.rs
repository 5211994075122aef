//! The namespaces berth never looks at, as one rule. The webhook configurations'
//! namespaceSelector leaves them out, so berth never admits a pod of theirs; the
//! admission policies leave them out too, the missed scan passes over their pods
//! (a cluster-wide policy must never report or evict kube-system's CoreDNS), and
//! the controller leaves their DaemonSets alone. Every one of those reads this
//! type, and `berth webhooks` / `berth admission-policy` generate the shipped
//! selectors from it.
//!
//! DaemonSets are the one difference: the system's DaemonSet namespaces
//! ([`SYSTEM_DAEMONSET_NAMESPACES`]: kube-proxy, the CNI) are left out for pods but
//! not for DaemonSets, whose templates must get the pools' tolerations.

use std::collections::BTreeSet;

use serde_json::{Value, json};

use crate::names::{NAMESPACE_NAME_LABEL, SYSTEM_DAEMONSET_NAMESPACES};

/// The system's namespaces berth leaves out by default: kube-system's pods are the
/// cluster's own, and kube-node-lease holds only the nodes' Leases.
pub const SYSTEM_NAMESPACES: [&str; 2] = ["kube-system", "kube-node-lease"];

/// The namespace `manifests/` installs berth into.
pub const BERTH_NAMESPACE: &str = "berth-system";

/// The namespaces berth never looks at; see the module.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Exempt {
    namespaces: BTreeSet<String>,
}

impl Exempt {
    /// `namespaces` (blank names dropped) and berth's own.
    pub fn new<S: AsRef<str>>(namespaces: impl IntoIterator<Item = S>, own: &str) -> Exempt {
        let namespaces = namespaces
            .into_iter()
            .map(|n| n.as_ref().trim().to_owned())
            .chain([own.to_owned()])
            .filter(|n| !n.is_empty())
            .collect();
        Exempt { namespaces }
    }

    /// What `manifests/` ships: the system's namespaces and `berth-system`.
    pub fn shipped() -> Exempt {
        Exempt::new(SYSTEM_NAMESPACES, BERTH_NAMESPACE)
    }

    /// Whether berth never sees the pods (and the namespace object) of `namespace`.
    pub fn pods_of(&self, namespace: &str) -> bool {
        self.namespaces.contains(namespace)
    }

    /// Whether berth leaves the DaemonSets of `namespace` alone.
    pub fn daemonsets_of(&self, namespace: &str) -> bool {
        self.pods_of(namespace) && !SYSTEM_DAEMONSET_NAMESPACES.contains(&namespace)
    }

    /// A namespaceSelector that leaves out the namespaces whose pods berth never
    /// sees (the system's first, berth's own last).
    pub fn pod_selector(&self) -> Value {
        selector(self.ordered().filter(|n| self.pods_of(n)))
    }

    /// A namespaceSelector that leaves out the namespaces whose DaemonSets berth
    /// leaves alone.
    pub fn daemonset_selector(&self) -> Value {
        selector(self.ordered().filter(|n| self.daemonsets_of(n)))
    }

    /// The names in the order the shipped files list them: the system's first.
    fn ordered(&self) -> impl Iterator<Item = &str> {
        let system = SYSTEM_NAMESPACES
            .into_iter()
            .filter(|n| self.namespaces.contains(*n));
        let rest = self
            .namespaces
            .iter()
            .map(String::as_str)
            .filter(|n| !SYSTEM_NAMESPACES.contains(n));
        system.chain(rest)
    }
}

fn selector<'a>(namespaces: impl Iterator<Item = &'a str>) -> Value {
    let values: Vec<&str> = namespaces.collect();
    json!({"matchExpressions": [{"key": NAMESPACE_NAME_LABEL, "operator": "NotIn",
        "values": values}]})
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pods_of_the_system_and_berth_are_left_out_daemonsets_of_kube_system_are_not() {
        let exempt = Exempt::new(["kube-system", " ", "kube-node-lease"], "berth");
        for ns in ["kube-system", "kube-node-lease", "berth"] {
            assert!(exempt.pods_of(ns), "{ns}");
        }
        assert!(!exempt.pods_of("apps"));
        assert!(!exempt.pods_of(""), "a blank name is no namespace");
        assert!(
            !exempt.daemonsets_of("kube-system"),
            "kube-proxy needs the pools' tolerations"
        );
        assert!(exempt.daemonsets_of("kube-node-lease"));
        assert!(exempt.daemonsets_of("berth"));
        assert_eq!(
            exempt.pod_selector()["matchExpressions"][0]["values"],
            json!(["kube-system", "kube-node-lease", "berth"])
        );
        assert_eq!(
            exempt.daemonset_selector()["matchExpressions"][0]["values"],
            json!(["kube-node-lease", "berth"])
        );
    }
}
