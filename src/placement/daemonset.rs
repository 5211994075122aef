//! DaemonSet pods (SPEC "The webhook"). A pod is a DaemonSet pod only when the
//! DaemonSet controller sends it and its controller ownerReference is an `apps/v1`
//! DaemonSet ([`PodView::is_daemonset_pod`]). Whatever its image, it gets the
//! toleration of each dedicated pool that takes its DaemonSet (`daemonSets:
//! Tolerate`, and `daemonSetNamespaces` selects its namespace), and never any node
//! affinity: the DaemonSet controller already pins each pod to one node, and a pool
//! term could only contradict that and leave the pod Pending for good.
//!
//! A DaemonSet whose pods tolerate every taint would still reach pools that do not
//! take it. Its *template* gets the pool exclusion, so the DaemonSet controller
//! makes no pod for those nodes; a pod it makes anyway (its template predates the
//! pool and the controller has not brought it in line yet) is refused.

use std::collections::BTreeSet;

use json_patch::Patch;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use serde_json::Value;

use super::entitlement::{
    in_pool, in_pool_words, is_owned_toleration, refused_pool, wildcard_exclusion,
};
use super::grants::{Grants, pool_toleration};
use super::matching::PassedOver;
use super::namespace::NamespaceInfo;
use super::pod::{PodView, daemonset_owner, is_wildcard_for};
use super::selection::{is_empty_term, tolerates};
use crate::names::POOL_LABEL;
use crate::objects::NodeIndex;
use crate::policy::crd::DaemonSets;
use crate::policy::{CompiledPolicy, NamespaceConfig, PolicySet};

/// Whether a pod in `namespace` with `owners` is a DaemonSet's, as the controller
/// can tell: its DaemonSet owner exists in that namespace (`daemonsets` holds the
/// namespace and uid of each DaemonSet that exists).
pub fn is_daemonset_pod_of(
    owners: &[OwnerReference],
    namespace: &str,
    daemonsets: &BTreeSet<(String, String)>,
) -> bool {
    daemonset_owner(owners)
        .is_some_and(|o| daemonsets.contains(&(namespace.to_owned(), o.uid.clone())))
}

/// What a DaemonSet pod gets, or why it is refused.
#[derive(Debug, Default)]
pub struct DaemonSetDecision {
    pub grants: Grants,
    /// The dedicated pools that do not take the pod's DaemonSet, and why.
    pub refused_by: Vec<PassedOver>,
    pub denial: Option<String>,
}

/// Whether the pool of `policy` takes DaemonSets of `namespace` (whose berth
/// annotations read as `config`).
fn takes(
    policy: &CompiledPolicy,
    namespace: &NamespaceInfo,
    config: Option<&NamespaceConfig>,
) -> bool {
    let opted_in = super::matching::opts_in(policy, namespace, config);
    policy.takes_daemonsets_from(&namespace.labels, opted_in)
}

/// Why the pool of `policy` does not take DaemonSets of `namespace`.
fn refusal(policy: &CompiledPolicy, namespace: &NamespaceInfo) -> String {
    match policy.dedicated_pool().map(|p| p.daemon_sets) {
        Some(DaemonSets::Exclude) => "daemonSets: Exclude".into(),
        _ if policy
            .spec
            .pool
            .as_ref()
            .is_some_and(|p| p.daemon_set_namespaces.is_none()) =>
        {
            format!(
                "it names no daemonSetNamespaces, so it takes kube-system's and those of the \
             namespaces that opt in, not {}'s",
                namespace.name
            )
        }
        _ => format!("daemonSetNamespaces does not select {}", namespace.name),
    }
}

/// The tolerations of the pools that take this DaemonSet pod, or a denial when its
/// pods tolerate every taint and this one is made for a node of a pool that does
/// not take it.
pub fn daemonset_grants(
    pod: &PodView,
    policies: &PolicySet,
    namespace: &NamespaceInfo,
    config: Option<&NamespaceConfig>,
    nodes: Option<&NodeIndex>,
) -> DaemonSetDecision {
    let mut decision = DaemonSetDecision::default();
    for policy in policies.iter().filter(|p| p.dedicated_pool().is_some()) {
        if takes(policy, namespace, config) {
            if let Some(toleration) = pool_toleration(policy) {
                decision.grants.tolerate(toleration);
                decision.grants.applied.push(policy.name.clone());
            }
        } else {
            decision.refused_by.push(PassedOver {
                policy: policy.name.clone(),
                why: refusal(policy, namespace),
            });
        }
    }
    decision.grants.applied.sort();
    // A pod that tolerates every taint, made for a node of a pool that does not
    // take it.
    let wildcard = |policy: &CompiledPolicy| {
        policy.dedicated_pool().is_some_and(|pool| {
            let effect = pool.effect.as_str();
            pod.tolerations().iter().any(|t| is_wildcard_for(t, effect))
        })
    };
    decision.denial = pod.daemonset_node().and_then(|node| {
        let refuses = |p: &CompiledPolicy| {
            wildcard(p) && !takes(p, namespace, config) && in_pool(p, node, policies, nodes)
        };
        let closed = refused_pool(node, policies, nodes, refuses)?;
        Some(format!(
            "DaemonSet pod for node {node}: the node {}, which does not take this DaemonSet \
             ({}), and the pod tolerates every taint",
            in_pool_words(closed, node, policies, nodes, "pool"),
            refusal(closed, namespace)
        ))
    });
    decision
}

/// A DaemonSet's pod template, read as a pod.
fn template_pod(daemonset: &Value) -> Option<PodView> {
    let template = daemonset.pointer("/spec/template")?;
    let pod = serde_json::json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": template.get("metadata").cloned().unwrap_or_else(|| serde_json::json!({})),
        "spec": template.get("spec").cloned().unwrap_or_else(|| serde_json::json!({})),
    });
    PodView::read(&pod).ok()
}

/// What a DaemonSet's template should carry: the tolerations of the pools that take
/// it and, when its pods tolerate every taint, the exclusion of the dedicated pools
/// that do not. Returns the grants and the names of both sets of pools.
fn template_grants(
    view: &PodView,
    policies: &PolicySet,
    namespace: &NamespaceInfo,
) -> (Grants, BTreeSet<String>, BTreeSet<String>) {
    let mut grants = Grants::default();
    let mut allowed = BTreeSet::new();
    let config = namespace.config().ok();
    for policy in policies.iter() {
        if takes(policy, namespace, config)
            && let Some(toleration) = pool_toleration(policy)
        {
            grants.tolerate(toleration);
            allowed.insert(policy.name.clone());
        }
    }
    let mut excluded = BTreeSet::new();
    if let Some(exclusion) = wildcard_exclusion(view, policies, &allowed) {
        excluded.extend(exclusion.values.clone().unwrap_or_default());
        grants.require(exclusion);
    }
    (grants, allowed, excluded)
}

/// The patch that brings a DaemonSet's pod template in line: the tolerations of
/// the pools that take it, forged pool tolerations gone, and, when its pods
/// tolerate every taint, the exclusion of the dedicated pools that do not take it.
///
/// The DaemonSet controller creates a pod for a node only if the *template*
/// tolerates the node's taints and its node affinity admits the node, so pools are
/// opened and closed to a DaemonSet here, not on its pods.
pub fn template_patch(daemonset: &Value, policies: &PolicySet, namespace: &NamespaceInfo) -> Patch {
    match template_pod(daemonset) {
        Some(view) => view_patch(&view, policies, namespace),
        None => Patch(Vec::new()),
    }
}

/// [`template_patch`] for the template's pod as admission reads it
/// ([`super::pod::ReadTemplate`]).
pub fn view_patch(view: &PodView, policies: &PolicySet, namespace: &NamespaceInfo) -> Patch {
    let (grants, _, _) = template_grants(view, policies, namespace);
    let mut patch = super::patch::build_patch(view, &grants);
    // A template's annotations are the user's: leave them alone.
    patch
        .0
        .retain(|op| !op.path().as_str().starts_with("/metadata"));
    super::patch::nest(patch, &["spec", "template"])
}

/// The template patch, when the controller should apply it to a DaemonSet that
/// exists already: when the pools in force that the template tolerates or excludes
/// are not the ones it should. Each template change rolls every pod of the
/// DaemonSet, so what concerns only pools that are gone (a stale toleration, a
/// stale name in an exclusion) is left for the DaemonSet's next update.
pub fn template_drift(
    daemonset: &Value,
    policies: &PolicySet,
    namespace: &NamespaceInfo,
) -> Option<Patch> {
    let view = template_pod(daemonset)?;
    let (_, allowed, excluded) = template_grants(&view, policies, namespace);
    let in_force = |name: &str| policies.get(name).is_some();
    // The pools in force whose taint one of berth's tolerations tolerates, read as
    // Kubernetes reads it (an Exists tolerates them all).
    let tolerated: BTreeSet<String> = policies
        .iter()
        .filter(|p| {
            p.pool_taint().is_some_and(|taint| {
                view.tolerations()
                    .iter()
                    .any(|t| is_owned_toleration(t) && tolerates(t, &taint))
            })
        })
        .map(|p| p.name.clone())
        .collect();
    let kept_off = excluded_pools(&view)
        .into_iter()
        .filter(|name| in_force(name))
        .collect::<BTreeSet<_>>();
    (tolerated != allowed || kept_off != excluded)
        .then(|| template_patch(daemonset, policies, namespace))
}

/// The pools every non-empty required term of the template excludes by name.
fn excluded_pools(view: &PodView) -> BTreeSet<String> {
    let mut terms = view
        .required_affinity()
        .unwrap_or_default()
        .iter()
        .filter(|t| !is_empty_term(t));
    let excluded = |term: &k8s_openapi::api::core::v1::NodeSelectorTerm| -> BTreeSet<String> {
        term.match_expressions
            .iter()
            .flatten()
            .filter(|e| e.key == POOL_LABEL && e.operator == "NotIn")
            .flat_map(|e| e.values.clone().unwrap_or_default())
            .collect()
    };
    let Some(first) = terms.next() else {
        return BTreeSet::new();
    };
    terms.fold(excluded(first), |all, term| {
        all.intersection(&excluded(term)).cloned().collect()
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::test_policies as policies;
    use serde_json::json;

    fn daemonset(spec: Value) -> Value {
        json!({"spec": {"template": {"spec": spec}}})
    }

    fn toleration(pool: &str) -> Value {
        json!({"key": "berth.io/pool", "operator": "Equal", "value": pool, "effect": "NoSchedule"})
    }

    fn exclusion(pools: &[&str]) -> Value {
        json!({"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
            {"matchExpressions": [{"key": POOL_LABEL, "operator": "NotIn", "values": pools}]}]}}})
    }

    #[test]
    fn a_daemonset_is_changed_only_for_pools_in_force() {
        let set = policies(&[
            ("cdn", json!({"pool": {"nodeNames": ["node2"]}})),
            (
                "edge",
                json!({"pool": {"nodeNames": ["node3"], "daemonSets": "Exclude"}}),
            ),
        ]);
        let ns = NamespaceInfo::new("kube-system");
        let drift = |spec: Value| template_drift(&daemonset(spec), &set, &ns).is_some();
        assert!(drift(json!({})), "cdn's toleration is missing");
        assert!(!drift(json!({"tolerations": [toleration("cdn")]})));
        assert!(
            !drift(json!({"tolerations": [toleration("cdn"), toleration("gone")]})),
            "a pool that is gone is no reason to roll the DaemonSet"
        );
        assert!(
            drift(json!({"tolerations": [toleration("cdn"), toleration("edge")]})),
            "edge does not take it"
        );
        let wildcard = json!({"operator": "Exists"});
        assert!(
            drift(json!({"tolerations": [wildcard]})),
            "edge's exclusion is missing"
        );
        assert!(!drift(
            json!({"tolerations": [toleration("cdn"), wildcard], "affinity": exclusion(&["edge", "gone"])})
        ));
        assert!(drift(
            json!({"tolerations": [toleration("cdn"), wildcard], "affinity": exclusion(&["cdn", "edge"])})
        ));
    }
}
