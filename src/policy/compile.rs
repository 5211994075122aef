//! Policies compiled for decisions: globs and selectors parsed once, and every
//! rule the CRD schema cannot express checked with a message that names the field.

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::core::v1::{NodeSelectorRequirement, Taint};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, Time};
use kube::ResourceExt;
use kube::core::{Selector, SelectorExt};

use super::crd::{PlacementPolicy, PlacementPolicySpec, Pool};
use super::image::ImagePatterns;
use super::node_labels::node_can_set_label;
use crate::names::{
    MAX_POLICY_NAME, NAMESPACE_NAME_LABEL, POOL_LABEL, POOL_TAINT, SYSTEM_DAEMONSET_NAMESPACES,
    is_dns_subdomain, is_label_key, is_label_value, is_owned_node_key, is_valid_policy_name,
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
    coscheduled: Option<Selector>,
    pool_selector: Option<Selector>,
    /// The keys `pool.nodeSelector` reads that a node can set on itself, sorted.
    self_set_keys: Vec<String>,
    /// `pool.daemonSetNamespaces`: whose DaemonSets may run on the pool.
    daemonset_namespaces: Option<Selector>,
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
            && spec.gang.is_none()
            && spec.start_order.is_none()
            && spec.queue.is_none()
        {
            return Err(error(
                "grants nothing: set pool, nodeAffinity, colocateWith, avoid, schedulerName, \
                 gang, startOrder or queue"
                    .into(),
            ));
        }
        check_groups(spec).map_err(error)?;
        let images = ImagePatterns::new(&spec.images).map_err(|e| error(format!("images: {e}")))?;
        let selector = |field: &str, s: &Option<LabelSelector>| {
            s.clone()
                .map(Selector::try_from)
                .transpose()
                .map_err(|e| error(format!("{field}: {e}")))
        };
        let namespace_selector = selector("namespaceSelector", &spec.namespace_selector)?;
        let pod_selector = selector("podSelector", &spec.pod_selector)?;
        let coscheduled = selector("coscheduled", &spec.coscheduled)?;
        if coscheduled.as_ref().is_some_and(Selector::selects_all) {
            return Err(error(
                "coscheduled: {} would route every pod of the namespaces that opt in; leave \
                 images empty for that"
                    .into(),
            ));
        }
        if spec.colocate_with.is_some() && spec.avoid.is_some() {
            return Err(error(
                "colocateWith and avoid share the policy's anchor label: use two policies".into(),
            ));
        }
        let anchor_selector = match (&spec.colocate_with, &spec.avoid) {
            (Some(_), _) => selector("colocateWith", &spec.colocate_with)?,
            (None, _) => selector("avoid", &spec.avoid)?,
        };
        let (pool_selector, daemonset_namespaces) = match &spec.pool {
            Some(pool) => {
                check_pool(pool).map_err(error)?;
                (
                    selector("pool.nodeSelector", &pool.node_selector)?,
                    selector("pool.daemonSetNamespaces", &pool.daemon_set_namespaces)?,
                )
            }
            None => (None, None),
        };
        let self_set_keys = spec
            .pool
            .as_ref()
            .and_then(|p| p.node_selector.as_ref())
            .map(self_set_keys)
            .unwrap_or_default();
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
            coscheduled,
            pool_selector,
            self_set_keys,
            daemonset_namespaces,
            anchor_selector,
        })
    }

    /// Whether DaemonSets of a namespace with these labels may run on this policy's
    /// dedicated pool: `daemonSets: Tolerate`, and `daemonSetNamespaces` matches.
    /// Absent, it takes the system's DaemonSets ([`SYSTEM_DAEMONSET_NAMESPACES`]) and
    /// those of the namespaces that opt into the policy (`opted_in`), never any
    /// other namespace's: leaving the field out keeps the pool closed to a tenant.
    pub fn takes_daemonsets_from(&self, namespace_labels: &Labels, opted_in: bool) -> bool {
        let tolerate = self
            .dedicated_pool()
            .is_some_and(|pool| pool.daemon_sets == super::crd::DaemonSets::Tolerate);
        tolerate
            && match &self.daemonset_namespaces {
                Some(selector) => selector.matches(namespace_labels),
                None => {
                    opted_in
                        || namespace_labels
                            .get(NAMESPACE_NAME_LABEL)
                            .is_some_and(|n| SYSTEM_DAEMONSET_NAMESPACES.contains(&n.as_str()))
                }
            }
    }

    /// Whether a namespace's labels match `namespaceSelector` (absent: no).
    pub fn selects_namespace(&self, labels: &Labels) -> bool {
        self.namespace_selector
            .as_ref()
            .is_some_and(|s| s.matches(labels))
    }

    /// Whether a pod's labels match `coscheduled`: it is routed with its group,
    /// whatever its images (absent: no pod).
    pub fn routes_with_group(&self, labels: &Labels) -> bool {
        self.coscheduled.as_ref().is_some_and(|s| s.matches(labels))
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

    /// Whether the node is claimed by this policy's pool, by its labels (berth's
    /// own among them) as the node carries them. Without them only `nodeNames`
    /// can be checked.
    pub fn claims_node(&self, node: &str, labels: Option<&Labels>) -> bool {
        self.claim(node, labels.map(NodeLabels::of).as_ref()) == Claim::Yes
    }

    /// The keys of `pool.nodeSelector` that a node can set on itself, sorted.
    pub fn self_set_keys(&self) -> &[String] {
        &self.self_set_keys
    }

    /// Whether `pool.nodeSelector` may take in a node that is not in the pool
    /// yet: it reads no label a node can set on itself, or the policy says
    /// `pool.trustSelfSetLabels`.
    pub fn selector_takes_new_nodes(&self) -> bool {
        self.self_set_keys.is_empty()
            || self
                .spec
                .pool
                .as_ref()
                .is_some_and(|p| p.trust_self_set_labels)
    }

    /// How this policy's pool stands to a node. A selector that reads labels the
    /// node can set on itself, unless the policy trusts them, keeps a node that is
    /// in this pool now (it carries the pool label, which the node cannot set)
    /// and takes no other: a node that labels itself to match is refused, so a
    /// compromised node cannot make itself a member.
    fn claim(&self, node: &str, labels: Option<&NodeLabels<'_>>) -> Claim {
        let Some(pool) = &self.spec.pool else {
            return Claim::No;
        };
        if pool.node_names.iter().any(|n| n == node) {
            return Claim::Yes;
        }
        let (Some(selector), Some(labels)) = (&self.pool_selector, labels) else {
            return Claim::No;
        };
        if !selector.matches(&labels.foreign) {
            Claim::No
        } else if self.selector_takes_new_nodes() || labels.pool == Some(self.name.as_str()) {
            Claim::Yes
        } else {
            Claim::SelfSet
        }
    }

    /// Older policies win a node claimed by two pools; the name breaks ties.
    fn seniority(&self) -> (Option<&Time>, &str) {
        (self.created.as_ref(), &self.name)
    }
}

/// How a pool stands to one node.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Claim {
    /// The node is in the pool, by name or by selector.
    Yes,
    /// The selector matches only through labels the node can set on itself, and
    /// the node is not in the pool yet: it is refused.
    SelfSet,
    No,
}

/// A node's labels as pool selectors read them: without berth's own, so that a
/// label berth wrote never pulls a node into a pool, and the pool berth has the
/// node in now (its pool label), which keeps it in a pool whose selector does not
/// take new nodes.
struct NodeLabels<'a> {
    foreign: std::borrow::Cow<'a, Labels>,
    pool: Option<&'a str>,
}

impl<'a> NodeLabels<'a> {
    fn of(labels: &'a Labels) -> Self {
        let owned = labels.keys().any(|k| is_owned_node_key(k));
        let foreign = if owned {
            std::borrow::Cow::Owned(
                labels
                    .iter()
                    .filter(|(k, _)| !is_owned_node_key(k))
                    .map(|(k, v)| (k.clone(), v.clone()))
                    .collect(),
            )
        } else {
            std::borrow::Cow::Borrowed(labels)
        };
        NodeLabels {
            foreign,
            pool: labels.get(POOL_LABEL).map(String::as_str),
        }
    }
}

/// The keys a pool's node selector reads that a node can set on itself, sorted.
fn self_set_keys(selector: &LabelSelector) -> Vec<String> {
    let labels = selector.match_labels.iter().flat_map(|m| m.keys());
    let expressions = selector.match_expressions.iter().flatten().map(|e| &e.key);
    let keys: BTreeSet<&String> = labels
        .chain(expressions)
        .filter(|k| node_can_set_label(k))
        .collect();
    keys.into_iter().cloned().collect()
}

/// A PlacementPolicy as a watch delivers it: its identity, and the policy, or why
/// this berth cannot read its spec (a field it does not know, a wrong type).
#[derive(Debug, Clone)]
pub struct PolicySource {
    pub name: String,
    pub uid: Option<String>,
    pub deleting: bool,
    pub policy: Result<PlacementPolicy, String>,
    /// The policy at its last good spec as the controller recorded it
    /// (`status.lastGoodSpec`), for when `policy` does not compile.
    pub last_good: Option<PlacementPolicy>,
}

impl From<&PlacementPolicy> for PolicySource {
    fn from(policy: &PlacementPolicy) -> Self {
        PolicySource {
            name: policy.name_any(),
            uid: policy.metadata.uid.clone(),
            deleting: policy.metadata.deletion_timestamp.is_some(),
            policy: Ok(policy.clone()),
            last_good: None,
        }
    }
}

/// The policies in force, and the ones that do not compile now.
#[derive(Debug, Clone, Default)]
pub struct Compiled {
    /// Shared, so every review reads it without a copy.
    pub set: std::sync::Arc<PolicySet>,
    /// Policies that do not compile, by name; those with a last good version
    /// keep it in force (`kept`).
    pub errors: BTreeMap<String, Invalid>,
}

/// A policy whose current spec cannot be used.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Invalid {
    pub error: PolicyError,
    /// Whether its last good version stays in force.
    pub kept: bool,
}

/// Compiles policies as the watches deliver them, remembering the last good version
/// of each (by uid), or, in a berth that has not seen one compile, taking the one
/// the controller recorded in the policy's status.
///
/// A policy that stops compiling (a bad glob applied while `/validate` was down, a
/// field this berth does not know) keeps its last good version in force, so its
/// nodes keep their labels and taints and its held pods stay held: it is never
/// treated as deleted. A policy being deleted is left out at once.
#[derive(Debug, Default)]
pub struct PolicyCompiler {
    last_good: BTreeMap<String, CompiledPolicy>,
}

impl PolicyCompiler {
    pub fn compile(&mut self, sources: impl IntoIterator<Item = PolicySource>) -> Compiled {
        let mut set = PolicySet::default();
        let mut errors = BTreeMap::new();
        let mut seen = BTreeMap::new();
        for source in sources {
            let key = source.uid.clone().unwrap_or_else(|| source.name.clone());
            if source.deleting {
                continue;
            }
            let recorded = source.last_good.clone();
            let result = source
                .policy
                .map_err(|problem| PolicyError {
                    policy: source.name.clone(),
                    problem: format!("the spec cannot be read: {problem}"),
                })
                .and_then(|p| CompiledPolicy::compile(&p));
            match result {
                Ok(policy) => {
                    seen.insert(key, policy.clone());
                    set.policies.insert(policy.name.clone(), policy);
                }
                Err(error) => {
                    let last = self
                        .last_good
                        .get(&key)
                        .cloned()
                        .or_else(|| recorded.and_then(|p| CompiledPolicy::compile(&p).ok()));
                    errors.insert(
                        source.name.clone(),
                        Invalid {
                            error,
                            kept: last.is_some(),
                        },
                    );
                    if let Some(last) = last {
                        set.policies.insert(last.name.clone(), last.clone());
                        seen.insert(key, last);
                    }
                }
            }
        }
        // Policies that are gone (or being deleted) are forgotten.
        self.last_good = seen;
        Compiled {
            set: std::sync::Arc::new(set),
            errors,
        }
    }
}

/// The longest gang timeout: a year, far from where seconds arithmetic overflows.
const MAX_GANG_TIMEOUT: i64 = 31_536_000;

/// The group labels must be label keys, and a pod's labels can only say one thing
/// each: one label cannot be both the group and its size, say.
fn check_groups(spec: &PlacementPolicySpec) -> Result<(), String> {
    let mut keys: Vec<(&str, &str)> = Vec::new();
    if let Some(gang) = &spec.gang {
        keys.push(("gang.groupLabel", &gang.group_label));
        keys.push(("gang.minAvailableLabel", &gang.min_available_label));
        if !(1..=MAX_GANG_TIMEOUT).contains(&gang.timeout_seconds) {
            return Err(format!(
                "gang.timeoutSeconds must be from 1 to {MAX_GANG_TIMEOUT} (a year)"
            ));
        }
    }
    if let Some(order) = &spec.start_order {
        keys.push(("startOrder.rankLabel", &order.rank_label));
    }
    if let Some(queue) = &spec.queue {
        keys.push(("queue.priorityLabel", &queue.priority_label));
    }
    for (i, (field, key)) in keys.iter().enumerate() {
        if !is_label_key(key) {
            return Err(format!("{field} {key:?} is not a label key"));
        }
        if let Some((other, _)) = keys[..i].iter().find(|(_, k)| k == key) {
            return Err(format!("{field} and {other} name the same label {key:?}"));
        }
    }
    Ok(())
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
    requirement_problem(requirement).map_or(Ok(()), Err)
}

/// Why a node requirement does not parse as Kubernetes parses it
/// (`labels.NewRequirement`: a label key, label values, values for `In` and
/// `NotIn`, none for `Exists` and `DoesNotExist`, one whole number for `Gt` and
/// `Lt`); `None` when it does. A pod with such a requirement in a term is refused
/// by the apiserver, and the term matches no node.
pub fn requirement_problem(requirement: &NodeSelectorRequirement) -> Option<String> {
    let key = &requirement.key;
    if !is_label_key(key) {
        return Some(format!("{key:?} is not a label key"));
    }
    let values = requirement.values.as_deref().unwrap_or_default();
    if let Some(bad) = values.iter().find(|v| !is_label_value(v)) {
        return Some(format!("{key}: {bad:?} is not a label value"));
    }
    match requirement.operator.as_str() {
        "In" | "NotIn" if values.is_empty() => Some(format!("{key}: In and NotIn need values")),
        "Exists" | "DoesNotExist" if !values.is_empty() => {
            Some(format!("{key}: Exists and DoesNotExist take no values"))
        }
        "Gt" | "Lt" if values.len() != 1 || values[0].parse::<i64>().is_err() => {
            Some(format!("{key}: Gt and Lt take one whole number"))
        }
        "In" | "NotIn" | "Exists" | "DoesNotExist" | "Gt" | "Lt" => None,
        other => Some(format!("{key}: unknown operator {other:?}")),
    }
}

/// How the pools stand to one node ([`PolicySet::pool_standing`]).
#[derive(Debug, Default)]
pub struct PoolStanding<'a> {
    /// The policies whose pool claims the node, the owner (the oldest) first.
    pub claims: Vec<&'a CompiledPolicy>,
    /// The policies whose pool selector matches the node only through labels the
    /// node can set on itself, and that do not take it in, by name.
    pub refused: Vec<&'a CompiledPolicy>,
}

/// Every usable policy, by name.
#[derive(Debug, Clone, Default)]
pub struct PolicySet {
    policies: BTreeMap<String, CompiledPolicy>,
}

impl PolicySet {
    /// Compiles `policies`; the ones that cannot be used are left out and returned
    /// as errors, so one bad policy never disables the others. A policy being
    /// deleted is left out too: it stops granting at once, while its finalizer
    /// cleans its nodes.
    pub fn compile<'a>(
        policies: impl IntoIterator<Item = &'a PlacementPolicy>,
    ) -> (PolicySet, Vec<PolicyError>) {
        let mut set = PolicySet::default();
        let mut errors = Vec::new();
        for policy in policies {
            if policy.metadata.deletion_timestamp.is_some() {
                continue;
            }
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

    /// The policies of this set named in `names`.
    pub fn only(&self, names: &BTreeSet<String>) -> PolicySet {
        PolicySet {
            policies: self
                .policies
                .iter()
                .filter(|(name, _)| names.contains(*name))
                .map(|(name, p)| (name.clone(), p.clone()))
                .collect(),
        }
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
    /// `labels` are the node's labels as it carries them, berth's among them
    /// ([`CompiledPolicy::claims_node`]).
    pub fn pool_claims(&self, node: &str, labels: Option<&Labels>) -> Vec<&CompiledPolicy> {
        self.pool_standing(node, labels).claims
    }

    /// How the pools stand to `node`: the policies whose pool claims it (the
    /// owner first), and those whose selector matches it only through labels the
    /// node can set on itself and that refuse it.
    pub fn pool_standing(&self, node: &str, labels: Option<&Labels>) -> PoolStanding<'_> {
        // Only a pool selector reads the labels: without one, none are copied.
        let selects = self
            .iter()
            .any(|p| p.spec.pool.is_some() && p.pool_selector.is_some());
        let seen = labels.filter(|_| selects).map(NodeLabels::of);
        let mut standing = PoolStanding::default();
        for policy in self.iter() {
            match policy.claim(node, seen.as_ref()) {
                Claim::Yes => standing.claims.push(policy),
                Claim::SelfSet => standing.refused.push(policy),
                Claim::No => {}
            }
        }
        standing
            .claims
            .sort_by(|a, b| a.seniority().cmp(&b.seniority()));
        standing
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

        for timeout in [0, MAX_GANG_TIMEOUT + 1, i64::MAX] {
            let spec = PlacementPolicySpec {
                gang: Some(crate::policy::crd::Gang {
                    timeout_seconds: timeout,
                    ..Default::default()
                }),
                ..Default::default()
            };
            let why = problem(&policy("train", spec));
            assert!(why.contains("gang.timeoutSeconds must be from 1"), "{why}");
        }
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

    fn source(policy: &PlacementPolicy) -> PolicySource {
        let mut source = PolicySource::from(policy);
        source.uid = Some(format!("uid-{}", source.name));
        source
    }

    #[test]
    fn a_policy_that_stops_compiling_keeps_its_last_good_version() {
        let mut compiler = PolicyCompiler::default();
        let good = policy("cdn", pool_on(&["node2"]));
        let compiled = compiler.compile([source(&good)]);
        assert!(compiled.set.get("cdn").is_some() && compiled.errors.is_empty());

        let mut bad = good.clone();
        bad.spec.images = vec!["[cdn".into()];
        let compiled = compiler.compile([source(&bad)]);
        let kept = compiled
            .set
            .get("cdn")
            .expect("the last good version stays");
        assert_eq!(kept.spec.pool.as_ref().unwrap().node_names, ["node2"]);
        assert!(kept.spec.images.is_empty());
        assert!(compiled.errors["cdn"].kept);
        assert!(
            compiled.errors["cdn"]
                .error
                .problem
                .contains("bad image glob")
        );

        // A spec this berth cannot read at all is treated the same way.
        let mut unreadable = source(&good);
        unreadable.policy = Err("unknown field `future`".into());
        let compiled = compiler.compile([unreadable.clone()]);
        assert!(compiled.set.get("cdn").is_some());
        assert!(
            compiled.errors["cdn"]
                .error
                .problem
                .contains("unknown field")
        );

        // A berth that starts afresh takes the version recorded in the status.
        let mut fresh = PolicyCompiler::default();
        assert!(fresh.compile([unreadable.clone()]).set.is_empty());
        unreadable.last_good = Some(good.clone());
        let compiled = fresh.compile([unreadable]);
        assert_eq!(compiled.set.get("cdn").unwrap().spec, good.spec);
        assert!(compiled.errors["cdn"].kept);
    }

    #[test]
    fn a_policy_that_never_compiled_or_is_being_deleted_is_not_in_force() {
        let mut compiler = PolicyCompiler::default();
        let mut bad = policy("cdn", pool_on(&["node2"]));
        bad.spec.images = vec!["[cdn".into()];
        let compiled = compiler.compile([source(&bad)]);
        assert!(compiled.set.is_empty());
        assert!(!compiled.errors["cdn"].kept);

        let good = policy("cdn", pool_on(&["node2"]));
        compiler.compile([source(&good)]);
        let mut deleting = source(&good);
        deleting.deleting = true;
        assert!(compiler.compile([deleting]).set.is_empty());
        // Forgotten once deleted: a new policy of that name does not inherit it.
        assert!(compiler.compile([source(&bad)]).set.is_empty());
    }

    fn labels(pairs: &[(&str, &str)]) -> Labels {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn the_keys_a_pool_selector_reads_that_a_node_sets_itself_are_found() {
        let set = crate::policy::test_policies(&[(
            "gpu",
            serde_json::json!({"pool": {"nodeSelector": {
                "matchLabels": {"role": "gpu", "node-restriction.kubernetes.io/gpu": "true"},
                "matchExpressions": [
                    {"key": "nvidia.com/gpu.product", "operator": "In", "values": ["A100"]},
                    {"key": "kubernetes.io/hostname", "operator": "NotIn", "values": ["n9"]},
                    {"key": "node-role.kubernetes.io/control-plane", "operator": "DoesNotExist"},
                    {"key": "role", "operator": "Exists"}]}}}),
        )]);
        let gpu = set.get("gpu").unwrap();
        assert_eq!(
            gpu.self_set_keys(),
            ["kubernetes.io/hostname", "nvidia.com/gpu.product", "role"]
        );
        assert!(!gpu.selector_takes_new_nodes());
    }

    #[test]
    fn a_node_that_labels_itself_to_match_is_refused_and_a_member_stays_while_it_matches() {
        let set = crate::policy::test_policies(&[(
            "gpu",
            serde_json::json!({"pool": {"nodeSelector": {"matchLabels": {"role": "gpu"}}}}),
        )]);
        let standing = |pairs: &[(&str, &str)]| {
            let standing = set.pool_standing("n1", Some(&labels(pairs)));
            let names = |list: &[&CompiledPolicy]| -> Vec<String> {
                list.iter().map(|p| p.name.clone()).collect()
            };
            (names(&standing.claims), names(&standing.refused))
        };
        let none: Vec<String> = Vec::new();
        let gpu = vec!["gpu".to_string()];
        // A node that set `role` itself is refused, and so is one in another pool.
        assert_eq!(standing(&[("role", "gpu")]), (none.clone(), gpu.clone()));
        assert_eq!(
            standing(&[("role", "gpu"), (POOL_LABEL, "other")]),
            (none.clone(), gpu.clone())
        );
        // A node the pool has (its label, which a node cannot set) stays while it
        // matches, and leaves when it no longer does.
        assert_eq!(
            standing(&[("role", "gpu"), (POOL_LABEL, "gpu")]),
            (gpu.clone(), none.clone())
        );
        assert_eq!(
            standing(&[(POOL_LABEL, "gpu")]),
            (none.clone(), none.clone())
        );
        assert!(
            set.get("gpu")
                .unwrap()
                .claims_node("n1", Some(&labels(&[("role", "gpu"), (POOL_LABEL, "gpu")])))
        );
        assert!(
            !set.get("gpu")
                .unwrap()
                .claims_node("n1", Some(&labels(&[("role", "gpu")])))
        );
    }

    #[test]
    fn a_selector_that_matches_by_a_missing_label_opens_nothing_to_a_node_that_removes_it() {
        // A node can remove a label it can set as well as add one.
        let set = crate::policy::test_policies(&[(
            "quiet",
            serde_json::json!({"pool": {"nodeSelector": {"matchExpressions": [
                {"key": "noisy", "operator": "DoesNotExist"}]}}}),
        )]);
        assert!(set.pool_claims("n1", Some(&Labels::new())).is_empty());
        assert_eq!(
            set.pool_standing("n1", Some(&Labels::new())).refused.len(),
            1
        );
    }

    #[test]
    fn a_pool_takes_new_nodes_by_labels_a_node_cannot_set_or_when_it_trusts_them() {
        let set = crate::policy::test_policies(&[
            (
                "restricted",
                serde_json::json!({"pool": {"nodeSelector": {"matchLabels": {
                    "node-restriction.kubernetes.io/pool": "restricted"}}}}),
            ),
            (
                "trusting",
                serde_json::json!({"pool": {"trustSelfSetLabels": true,
                    "nodeSelector": {"matchLabels": {"role": "trusting"}}}}),
            ),
        ]);
        let restricted = set.get("restricted").unwrap();
        assert!(restricted.self_set_keys().is_empty());
        assert!(restricted.selector_takes_new_nodes());
        let by_admin = labels(&[("node-restriction.kubernetes.io/pool", "restricted")]);
        assert_eq!(
            set.pool_of_node("n1", Some(&by_admin)).unwrap().name,
            "restricted"
        );

        let trusting = set.get("trusting").unwrap();
        assert_eq!(trusting.self_set_keys(), ["role"]);
        assert!(trusting.selector_takes_new_nodes());
        let by_itself = labels(&[("role", "trusting")]);
        assert_eq!(
            set.pool_of_node("n1", Some(&by_itself)).unwrap().name,
            "trusting"
        );
        assert!(set.pool_standing("n1", Some(&by_itself)).refused.is_empty());
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
