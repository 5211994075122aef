//! Entitlement (SPEC "The webhook"): a pod that is not entitled to a dedicated pool
//! never ends up there.
//!
//! - A `berth.io/pool` toleration the pod brings itself is removed (berth owns the
//!   key and derives it again), with a warning.
//! - A wildcard toleration would tolerate every pool taint, so the pod gets a
//!   required `NotIn` expression over the dedicated pools it is not entitled to.
//! - `spec.nodeName` bypasses the scheduler and taints, so naming a dedicated node
//!   the pod is not entitled to is denied.

use std::collections::BTreeSet;

use k8s_openapi::api::core::v1::{NodeSelectorRequirement, Toleration};

use super::grants::requirement;
use super::pod::is_wildcard_for;
use super::warning::bounded;
use crate::names::{POOL_LABEL, POOL_TAINT};
use crate::objects::{NodeIndex, PodObject};
use crate::policy::{CompiledPolicy, PolicySet};

/// Whether berth owns a toleration: its key is the pool taint key.
pub fn is_owned_toleration(toleration: &Toleration) -> bool {
    toleration.key.as_deref() == Some(POOL_TAINT)
}

/// The pool tolerations the pod brings that berth does not grant, with a warning
/// for each.
pub fn forged_tolerations(
    pod: &PodObject,
    granted: &[Toleration],
) -> (Vec<Toleration>, Vec<String>) {
    let forged: Vec<Toleration> = pod
        .tolerations()
        .iter()
        .filter(|t| is_owned_toleration(t) && !granted.contains(t))
        .cloned()
        .collect();
    let warnings = forged
        .iter()
        .map(|t| {
            let value = t.value.as_deref().unwrap_or("*");
            bounded(format!(
                "removed toleration {POOL_TAINT}={value}: the pod is not entitled to that pool"
            ))
        })
        .collect();
    (forged, warnings)
}

/// The `NotIn` requirement that keeps a pod with a wildcard toleration off the
/// dedicated pools in `policies` it is not `entitled` to.
pub fn wildcard_exclusion(
    pod: &PodObject,
    policies: &PolicySet,
    entitled: &BTreeSet<String>,
) -> Option<NodeSelectorRequirement> {
    let mut excluded: Vec<&str> = policies
        .iter()
        .filter(|p| !entitled.contains(p.name.as_str()))
        .filter(|p| {
            p.dedicated_pool().is_some_and(|pool| {
                let effect = pool.effect.as_str();
                pod.tolerations().iter().any(|t| is_wildcard_for(t, effect))
            })
        })
        .map(|p| p.name.as_str())
        .collect();
    if excluded.is_empty() {
        return None;
    }
    excluded.sort_unstable();
    Some(requirement(POOL_LABEL, "NotIn", &excluded))
}

/// A denial when `spec.nodeName` names a node of a dedicated pool the pod is not
/// entitled to ([`in_pool`]): the pool that holds the node when it refuses the
/// pod, else a pool that names the node too.
pub fn node_name_denial(
    pod: &PodObject,
    policies: &PolicySet,
    nodes: Option<&NodeIndex>,
    entitled: &BTreeSet<String>,
) -> Option<String> {
    let node = pod.node_name()?;
    let refuses = |p: &CompiledPolicy| {
        p.dedicated_pool().is_some()
            && !entitled.contains(p.name.as_str())
            && in_pool(p, node, policies, nodes)
    };
    let closed = refused_pool(node, policies, nodes, refuses)?;
    let named_only = holder(node, policies, nodes).is_some_and(|h| h.name != closed.name);
    Some(format!(
        "spec.nodeName {node} {}, which this pod is not entitled to{}",
        in_pool_words(closed, node, policies, nodes, "dedicated pool"),
        if named_only {
            "; while both claim the node, it stays closed to what either refuses"
        } else {
            ""
        }
    ))
}

/// Of the pools that `refuse` a pod on `node`, the one to name: the pool that
/// holds the node when it is one of them (its label and taint are on the node),
/// else the first by name, which only names the node in `nodeNames`.
pub fn refused_pool<'p>(
    node: &str,
    policies: &'p PolicySet,
    nodes: Option<&NodeIndex>,
    refuses: impl Fn(&CompiledPolicy) -> bool,
) -> Option<&'p CompiledPolicy> {
    holder(node, policies, nodes)
        .filter(|p| refuses(p))
        .or_else(|| policies.iter().find(|p| refuses(p)))
}

/// The pool that holds `node`: of all pools that claim it, the oldest
/// ([`PolicySet::pool_of_node`]).
fn holder<'p>(
    node: &str,
    policies: &'p PolicySet,
    nodes: Option<&NodeIndex>,
) -> Option<&'p CompiledPolicy> {
    let labels = nodes.and_then(|n| n.get(node)).map(|n| &n.labels);
    policies.pool_of_node(node, labels)
}

/// How `node` belongs to `policy`'s pool ([`in_pool`]), in words that follow the
/// node: "is in <pool> X" when X holds it, "is held by pool H but also named by
/// <pool> X" when an older pool H holds the node X names too.
pub fn in_pool_words(
    policy: &CompiledPolicy,
    node: &str,
    policies: &PolicySet,
    nodes: Option<&NodeIndex>,
    pool: &str,
) -> String {
    match holder(node, policies, nodes).filter(|h| h.name != policy.name) {
        Some(h) => format!(
            "is held by pool {} but also named by {pool} {}",
            h.name, policy.name
        ),
        None => format!("is in {pool} {}", policy.name),
    }
}

/// Whether `node` is one of `policy`'s pool nodes for entitlement: the pool names
/// it in `nodeNames`, or owns it (its selector claims the node and no older pool
/// does). A node two pools name stays closed to what either refuses until the
/// conflict is resolved, while only the older pool's label and taint are on it:
/// the admission policies, which see `nodeNames` and the controller's
/// `status.nodeNames`, judge so too, and the two must agree.
pub fn in_pool(
    policy: &CompiledPolicy,
    node: &str,
    policies: &PolicySet,
    nodes: Option<&NodeIndex>,
) -> bool {
    let named = policy
        .spec
        .pool
        .as_ref()
        .is_some_and(|p| p.node_names.iter().any(|n| n == node));
    named || holder(node, policies, nodes).is_some_and(|owner| owner.name == policy.name)
}

/// A way a pod, as it stands, could reach a dedicated pool it is not entitled to:
/// the rule the admission policy `berth-pools` enforces in the apiserver with berth
/// up or down ([`crate::admission::cel`]), and `/validate` where that policy is not
/// installed. A differential test holds the CEL to this function.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Breach {
    /// A toleration of berth's pool key that could tolerate this pool's taint:
    /// `Exists`, this pool's name, or a comparison (`Gt`, `Lt`), which berth
    /// never grants and which a pool with a numeric name would satisfy.
    Toleration,
    /// `spec.nodeName` is one of the pool's nodes.
    NodeName,
    /// A wildcard toleration for the pool's effect, with nothing that keeps the pod
    /// off the pool's nodes.
    Wildcard,
}

/// Where a pod stands towards one pool.
#[derive(Debug, Clone, Copy)]
pub struct Standing<'a> {
    /// The pod may use the pool. The webhook and `/validate` know the policies
    /// that apply to the pod (its namespace opts in and its images and labels
    /// match) and, for a DaemonSet pod, whether the pool takes its namespace's
    /// DaemonSets; the admission policy, which cannot see images, takes the
    /// namespace's opt-in, the boundary that matters.
    pub entitled: bool,
    /// The pool's nodes, as its policy lists them and the controller reports them.
    pub pool_nodes: &'a BTreeSet<String>,
}

/// Whether a toleration could tolerate the taint of pool `pool`, whatever its
/// effect (see [`Breach::Toleration`]).
fn could_tolerate_pool(toleration: &Toleration, pool: &str) -> bool {
    is_owned_toleration(toleration)
        && match toleration.operator.as_deref() {
            Some("Exists" | "Gt" | "Lt") => true,
            _ => toleration.value.as_deref() == Some(pool),
        }
}

/// Whether the pod cannot land on one of `pool_nodes` (labelled with pool
/// `pool`): it names another node, or every required term keeps it off: it is
/// empty, excludes the pool by label (`NotIn` naming it, or `In` not naming it),
/// or names only other nodes by `metadata.name In`.
fn kept_off(pod: &PodObject, pool: &str, pool_nodes: &BTreeSet<String>) -> bool {
    if pod
        .node_name()
        .is_some_and(|node| !pool_nodes.contains(node))
    {
        return true;
    }
    let Some(terms) = pod.required_affinity().filter(|t| !t.is_empty()) else {
        return false;
    };
    terms.iter().all(|term| {
        let by_label = term.match_expressions.iter().flatten().any(|e| {
            let values = e.values.as_deref().unwrap_or_default();
            let names = values.iter().any(|v| v == pool);
            e.key == POOL_LABEL
                && !values.is_empty()
                && ((e.operator == "NotIn" && names) || (e.operator == "In" && !names))
        });
        let by_name = term.match_fields.iter().flatten().any(|f| {
            let values = f.values.as_deref().unwrap_or_default();
            f.key == "metadata.name"
                && f.operator == "In"
                && !values.is_empty()
                && values.iter().all(|n| !pool_nodes.contains(n))
        });
        super::selection::is_empty_term(term) || by_label || by_name
    })
}

/// How `pod` could reach the dedicated pool of `policy` without entitlement; empty
/// when it cannot, or when it is entitled.
pub fn pool_breaches(pod: &PodObject, policy: &CompiledPolicy, standing: Standing) -> Vec<Breach> {
    let Some(pool) = policy.dedicated_pool() else {
        return Vec::new();
    };
    if standing.entitled {
        return Vec::new();
    }
    let mut breaches = Vec::new();
    if pod
        .tolerations()
        .iter()
        .any(|t| could_tolerate_pool(t, &policy.name))
    {
        breaches.push(Breach::Toleration);
    }
    if pod
        .node_name()
        .is_some_and(|n| standing.pool_nodes.contains(n))
    {
        breaches.push(Breach::NodeName);
    }
    let wildcard = pod
        .tolerations()
        .iter()
        .any(|t| is_wildcard_for(t, pool.effect.as_str()));
    if wildcard && !kept_off(pod, &policy.name, standing.pool_nodes) {
        breaches.push(Breach::Wildcard);
    }
    breaches
}

/// The nodes of `policy`'s pool for entitlement ([`in_pool`]): those it names,
/// and those among `nodes` it owns (the controller reports these as
/// `status.nodeNames`, which the admission policies read with `nodeNames`).
pub fn pool_nodes(
    policy: &CompiledPolicy,
    policies: &PolicySet,
    nodes: Option<&NodeIndex>,
) -> BTreeSet<String> {
    let mut pool: BTreeSet<String> = policy
        .spec
        .pool
        .iter()
        .flat_map(|p| p.node_names.iter().cloned())
        .collect();
    let owned = nodes
        .into_iter()
        .flatten()
        .filter(|(name, _)| in_pool(policy, name, policies, nodes));
    pool.extend(owned.map(|(name, _)| name.clone()));
    pool
}

/// Every breach of a dedicated pool by `pod` in namespace `namespace`
/// ([`pool_breaches`]), in words; `entitled` names the pools it may use.
pub fn breaches_in_words(
    pod: &PodObject,
    namespace: &str,
    entitled: &BTreeSet<String>,
    policies: &PolicySet,
    nodes: Option<&NodeIndex>,
) -> Vec<String> {
    let mut words = Vec::new();
    for policy in policies.iter().filter(|p| p.dedicated_pool().is_some()) {
        let pool_nodes = pool_nodes(policy, policies, nodes);
        let standing = Standing {
            entitled: entitled.contains(&policy.name),
            pool_nodes: &pool_nodes,
        };
        let pool = &policy.name;
        words.extend(
            pool_breaches(pod, policy, standing)
                .into_iter()
                .map(|breach| match breach {
                    Breach::Toleration => format!(
                        "the pod tolerates {POOL_TAINT}={pool} but is not entitled to pool {pool}"
                    ),
                    Breach::NodeName => format!(
                        "spec.nodeName {} is in dedicated pool {pool}, which this pod in namespace \
                 {namespace} is not entitled to",
                        pod.node_name().unwrap_or_default()
                    ),
                    Breach::Wildcard => format!(
                        "the pod tolerates every taint but does not keep off dedicated pool {pool}"
                    ),
                }),
        );
    }
    words
}
