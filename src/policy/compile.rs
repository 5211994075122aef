//! Policies compiled for decisions: globs and selectors parsed once, and every
//! rule the CRD schema cannot express checked with a message that names the field.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{NodeSelectorRequirement, Taint};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, Time};
use kube::ResourceExt;
use kube::core::{Selector, SelectorExt};

use super::crd::{PlacementPolicy, PlacementPolicySpec, Pool};
use super::image::ImagePatterns;
use crate::names::{
    MAX_POLICY_NAME, POOL_TAINT, is_dns_subdomain, is_owned_node_key, is_valid_policy_name,
};

/// Labels of a Kubernetes object.
pub type Labels = BTreeMap<String, String>;

/// A policy that cannot be used, and why.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("policy {policy}: {problem}")]
pub struct PolicyError {
    pub policy: String,
    pub problem: String,
}

/// One policy, ready to match pods and nodes.
#[derive(Debug, Clone)]
pub struct CompiledPolicy {
    pub name: String,
    pub created: Option<Time>,
    pub spec: PlacementPolicySpec,
    pub images: ImagePatterns,
    namespace_selector: Option<Selector>,
    pod_selector: Option<Selector>,
    pool_selector: Option<Selector>,
    /// `colocateWith` or `avoid`: the pods whose nodes carry this policy's anchor label.
    anchor_selector: Option<Selector>,
}

impl CompiledPolicy {
    pub fn compile(policy: &PlacementPolicy) -> Result<CompiledPolicy, PolicyError> {
        let name = policy.name_any();
        let error = |problem: String| PolicyError {
            policy: name.clone(),
            problem,
        };
        if !is_valid_policy_name(&name) {
            return Err(error(format!(
                "the name must be a DNS-1123 subdomain of at most {MAX_POLICY_NAME} characters"
            )));
        }
        let spec = &policy.spec;
        if spec.pool.is_none()
            && spec.node_affinity.is_none()
            && spec.colocate_with.is_none()
            && spec.avoid.is_none()
            && spec.scheduler_name.is_none()
        {
            return Err(error(
                "grants nothing: set pool, nodeAffinity, colocateWith, avoid or schedulerName"
                    .into(),
            ));
        }
        let images = ImagePatterns::new(&spec.images).map_err(|e| error(format!("images: {e}")))?;
        let selector = |field: &str, s: &Option<LabelSelector>| {
            s.clone()
                .map(Selector::try_from)
                .transpose()
                .map_err(|e| error(format!("{field}: {e}")))
        };
        let namespace_selector = selector("namespaceSelector", &spec.namespace_selector)?;
        let pod_selector = selector("podSelector", &spec.pod_selector)?;
        if spec.colocate_with.is_some() && spec.avoid.is_some() {
            return Err(error(
                "colocateWith and avoid share the policy's anchor label: use two policies".into(),
            ));
        }
        let anchor_selector = match (&spec.colocate_with, &spec.avoid) {
            (Some(_), _) => selector("colocateWith", &spec.colocate_with)?,
            (None, _) => selector("avoid", &spec.avoid)?,
        };
        let pool_selector = match &spec.pool {
            Some(pool) => {
                check_pool(pool).map_err(error)?;
                selector("pool.nodeSelector", &pool.node_selector)?
            }
            None => None,
        };
        if let Some(affinity) = &spec.node_affinity {
            let preferred = affinity.preferred.iter().map(|p| &p.preference);
            for (i, requirement) in affinity.required.iter().enumerate() {
                check_requirement(requirement)
                    .map_err(|p| error(format!("nodeAffinity.required[{i}]: {p}")))?;
            }
            for (i, requirement) in preferred.enumerate() {
                check_requirement(requirement)
                    .map_err(|p| error(format!("nodeAffinity.preferred[{i}]: {p}")))?;
            }
            for (i, p) in affinity.preferred.iter().enumerate() {
                if !(1..=100).contains(&p.weight) {
                    return Err(error(format!(
                        "nodeAffinity.preferred[{i}].weight must be 1..100"
                    )));
                }
            }
        }
        if let Some(scheduler) = &spec.scheduler_name
            && !is_dns_subdomain(scheduler)
        {
            return Err(error(format!(
                "schedulerName {scheduler:?} is not a DNS-1123 subdomain"
            )));
        }
        Ok(CompiledPolicy {
            name,
            created: policy.metadata.creation_timestamp.clone(),
            spec: spec.clone(),
            images,
            namespace_selector,
            pod_selector,
            pool_selector,
            anchor_selector,
        })
    }

    /// Whether a namespace's labels match `namespaceSelector` (absent: no).
    pub fn selects_namespace(&self, labels: &Labels) -> bool {
        self.namespace_selector
            .as_ref()
            .is_some_and(|s| s.matches(labels))
    }

    /// Whether a pod's labels match `podSelector` (absent: every pod).
    pub fn selects_pod(&self, labels: &Labels) -> bool {
        self.pod_selector.as_ref().is_none_or(|s| s.matches(labels))
    }

    /// Whether a pod with these labels is one this policy's anchor label follows
    /// (it matches `colocateWith` or `avoid`).
    pub fn is_anchor_pod(&self, labels: &Labels) -> bool {
        self.anchor_selector
            .as_ref()
            .is_some_and(|s| s.matches(labels))
    }

    /// Whether the namespace opts into this policy: its `berth.io/policies`
    /// annotation names it, or its labels match `namespaceSelector`.
    pub fn namespace_opts_in(&self, config: &super::NamespaceConfig, labels: &Labels) -> bool {
        config.policies.contains(&self.name) || self.selects_namespace(labels)
    }

    /// The taint on this policy's pool nodes, when the pool is dedicated:
    /// `berth.io/pool=<policy>:<effect>`.
    pub fn pool_taint(&self) -> Option<Taint> {
        let pool = self.dedicated_pool()?;
        Some(Taint {
            key: POOL_TAINT.into(),
            value: Some(self.name.clone()),
            effect: pool.effect.as_str().into(),
            time_added: None,
        })
    }

    /// The pool, if the policy has one and it is dedicated (tainted).
    pub fn dedicated_pool(&self) -> Option<&Pool> {
        self.spec.pool.as_ref().filter(|p| p.dedicated)
    }

    /// Whether the node is claimed by this policy's pool. Without the node's labels
    /// only `nodeNames` can be checked.
    pub fn claims_node(&self, node: &str, labels: Option<&Labels>) -> bool {
        let Some(pool) = &self.spec.pool else {
            return false;
        };
        pool.node_names.iter().any(|n| n == node)
            || matches!((&self.pool_selector, labels), (Some(s), Some(l)) if s.matches(l))
    }

    /// Older policies win a node claimed by two pools; the name breaks ties.
    fn seniority(&self) -> (Option<&Time>, &str) {
        (self.created.as_ref(), &self.name)
    }
}

fn check_pool(pool: &Pool) -> Result<(), String> {
    if pool.node_names.is_empty() && pool.node_selector.is_none() {
        return Err("pool selects no nodes: set pool.nodeNames or pool.nodeSelector".into());
    }
    if !(1..=100).contains(&pool.weight) {
        return Err(format!("pool.weight must be 1..100, not {}", pool.weight));
    }
    Ok(())
}

fn check_requirement(requirement: &NodeSelectorRequirement) -> Result<(), String> {
    let key = &requirement.key;
    if is_owned_node_key(key) {
        return Err(format!(
            "{key} is berth's own label; use pool or colocateWith/avoid"
        ));
    }
    let values = requirement.values.as_deref().unwrap_or_default();
    match requirement.operator.as_str() {
        "In" | "NotIn" if values.is_empty() => Err(format!("{key}: In and NotIn need values")),
        "Exists" | "DoesNotExist" if !values.is_empty() => {
            Err(format!("{key}: Exists and DoesNotExist take no values"))
        }
        "Gt" | "Lt" if values.len() != 1 || values[0].parse::<i64>().is_err() => {
            Err(format!("{key}: Gt and Lt take one whole number"))
        }
        "In" | "NotIn" | "Exists" | "DoesNotExist" | "Gt" | "Lt" => Ok(()),
        other => Err(format!("{key}: unknown operator {other:?}")),
    }
}

/// Every usable policy, by name.
#[derive(Debug, Clone, Default)]
pub struct PolicySet {
    policies: BTreeMap<String, CompiledPolicy>,
}

impl PolicySet {
    /// Compiles `policies`; the ones that cannot be used are left out and returned
    /// as errors, so one bad policy never disables the others.
    pub fn compile<'a>(
        policies: impl IntoIterator<Item = &'a PlacementPolicy>,
    ) -> (PolicySet, Vec<PolicyError>) {
        let mut set = PolicySet::default();
        let mut errors = Vec::new();
        for policy in policies {
            match CompiledPolicy::compile(policy) {
                Ok(compiled) => {
                    set.policies.insert(compiled.name.clone(), compiled);
                }
                Err(e) => errors.push(e),
            }
        }
        (set, errors)
    }

    pub fn get(&self, name: &str) -> Option<&CompiledPolicy> {
        self.policies.get(name)
    }

    /// All policies, ordered by name.
    pub fn iter(&self) -> impl Iterator<Item = &CompiledPolicy> {
        self.policies.values()
    }

    pub fn len(&self) -> usize {
        self.policies.len()
    }

    pub fn is_empty(&self) -> bool {
        self.policies.is_empty()
    }

    /// Every policy whose pool claims `node`, the owner (the oldest) first.
    ///
    /// Pool selectors see the node's labels without berth's own, so that a pool
    /// label berth wrote can never pull a node into a pool.
    pub fn pool_claims(&self, node: &str, labels: Option<&Labels>) -> Vec<&CompiledPolicy> {
        let foreign = labels.map(|l| {
            l.iter()
                .filter(|(k, _)| !is_owned_node_key(k))
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect::<Labels>()
        });
        let mut claims: Vec<&CompiledPolicy> = self
            .iter()
            .filter(|p| p.claims_node(node, foreign.as_ref()))
            .collect();
        claims.sort_by(|a, b| a.seniority().cmp(&b.seniority()));
        claims
    }

    /// The policy whose pool owns `node`: of all pools that claim it, the oldest.
    pub fn pool_of_node(&self, node: &str, labels: Option<&Labels>) -> Option<&CompiledPolicy> {
        self.pool_claims(node, labels).into_iter().next()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::crd::{ExtraNodeAffinity, PlacementPolicySpec};

    pub(crate) fn policy(name: &str, spec: PlacementPolicySpec) -> PlacementPolicy {
        PlacementPolicy::new(name, spec)
    }

    fn pool_on(nodes: &[&str]) -> PlacementPolicySpec {
        PlacementPolicySpec {
            pool: Some(Pool {
                node_names: nodes.iter().map(|n| n.to_string()).collect(),
                ..Pool::default()
            }),
            ..Default::default()
        }
    }

    fn problem(p: &PlacementPolicy) -> String {
        CompiledPolicy::compile(p).unwrap_err().problem
    }

    #[test]
    fn a_policy_must_grant_something() {
        let p = policy("empty", PlacementPolicySpec::default());
        assert!(problem(&p).starts_with("grants nothing"));
    }

    #[test]
    fn bad_fields_are_named() {
        let mut spec = pool_on(&["node2"]);
        spec.images = vec!["[cdn".into()];
        assert!(problem(&policy("cdn", spec)).starts_with("images: bad image glob"));

        let mut spec = pool_on(&[]);
        assert!(problem(&policy("cdn", spec.clone())).starts_with("pool selects no nodes"));
        spec.pool.as_mut().unwrap().node_names = vec!["n".into()];
        spec.pool.as_mut().unwrap().weight = 0;
        assert!(problem(&policy("cdn", spec)).contains("pool.weight must be 1..100"));

        let spec = PlacementPolicySpec {
            node_affinity: Some(ExtraNodeAffinity {
                required: vec![NodeSelectorRequirement {
                    key: "node-restriction.kubernetes.io/berth.pool".into(),
                    operator: "In".into(),
                    values: Some(vec!["x".into()]),
                }],
                ..Default::default()
            }),
            ..Default::default()
        };
        assert!(problem(&policy("gpu", spec)).contains("berth's own label"));
        assert!(problem(&policy(&"x".repeat(51), pool_on(&["n"]))).contains("at most 50"));
    }

    #[test]
    fn the_older_pool_wins_a_node_claimed_twice() {
        let mut older = policy("zeta", pool_on(&["node2"]));
        older.metadata.creation_timestamp = Some(Time("2026-01-01T00:00:00Z".parse().unwrap()));
        let mut newer = policy("alpha", pool_on(&["node2"]));
        newer.metadata.creation_timestamp = Some(Time("2026-06-01T00:00:00Z".parse().unwrap()));
        let (set, errors) = PolicySet::compile([&older, &newer]);
        assert!(errors.is_empty());
        assert_eq!(set.pool_of_node("node2", None).unwrap().name, "zeta");
        assert!(set.pool_of_node("node1", None).is_none());
    }

    #[test]
    fn one_bad_policy_does_not_disable_the_others() {
        let good = policy("good", pool_on(&["n1"]));
        let bad = policy("bad", PlacementPolicySpec::default());
        let (set, errors) = PolicySet::compile([&good, &bad]);
        assert_eq!(set.len(), 1);
        assert_eq!(errors.len(), 1);
        assert_eq!(errors[0].policy, "bad");
    }
}
