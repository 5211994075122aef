//! What the contract promises for a pod in a world, computed from the contract's
//! words and nothing of berth's code: which policies apply, which pools the pod is
//! entitled to, which nodes each pool owns, and the pods whose placements
//! Kubernetes' code then judges (the original with the entitled tolerations, the
//! policies' required node affinity alone, the preferences the pod should end
//! with).

use std::collections::{BTreeMap, BTreeSet};

use berth::names;
use serde_json::{Value, json};

use super::world::{POOL_LABEL, POOL_TAINT, World};

/// One policy as the contract reads it.
#[derive(Debug, Clone)]
pub struct Policy {
    pub name: String,
    pub spec: Value,
}

impl Policy {
    fn pool(&self) -> Option<&Value> {
        self.spec.get("pool")
    }
    pub fn dedicated(&self) -> bool {
        self.pool()
            .is_some_and(|p| p.get("dedicated").and_then(Value::as_bool).unwrap_or(true))
    }
    pub fn effect(&self) -> &str {
        self.pool()
            .and_then(|p| p.get("effect"))
            .and_then(Value::as_str)
            .unwrap_or("NoSchedule")
    }
    fn required_pool(&self) -> bool {
        self.pool().is_some_and(|p| {
            p.get("placement")
                .and_then(Value::as_str)
                .unwrap_or("Required")
                == "Required"
        })
    }
    fn claims(&self, node: &str, labels: &Value) -> bool {
        let Some(pool) = self.pool() else {
            return false;
        };
        let named = pool
            .get("nodeNames")
            .and_then(Value::as_array)
            .is_some_and(|n| n.iter().any(|n| n == node));
        let Some(selector) = pool
            .pointer("/nodeSelector/matchLabels")
            .and_then(Value::as_object)
        else {
            return named;
        };
        let matches = selector.iter().all(|(k, v)| labels.get(k) == Some(v));
        // A selector that reads a label a node can set on itself takes in only
        // the nodes the pool has (its label), unless the policy trusts them.
        let takes_new =
            pool["trustSelfSetLabels"] == true || selector.keys().all(|k| !node_can_set(k));
        let member = labels.get(POOL_LABEL).and_then(Value::as_str) == Some(self.name.as_str());
        named || (matches && (takes_new || member))
    }
    /// Whether this pool takes DaemonSets of `namespace`: those `daemonSetNamespaces`
    /// selects, or without it kube-system's and those of namespaces that opt in.
    fn takes_daemonsets(&self, namespace: &Value) -> bool {
        let pool = self.pool();
        let labels = &namespace["metadata"]["labels"];
        let tolerate = pool
            .and_then(|p| p.get("daemonSets"))
            .and_then(Value::as_str)
            .unwrap_or("Tolerate")
            == "Tolerate";
        let selected = match pool.and_then(|p| p.pointer("/daemonSetNamespaces/matchLabels")) {
            Some(m) => m
                .as_object()
                .is_some_and(|m| m.iter().all(|(k, v)| labels.get(k) == Some(v))),
            None => self.opted_in(namespace) || namespace["metadata"]["name"] == "kube-system",
        };
        self.dedicated() && tolerate && selected
    }
    /// Whether a namespace opts in: its annotation names the policy, or its labels
    /// match `namespaceSelector`.
    pub fn opted_in(&self, namespace: &Value) -> bool {
        let named = namespace["metadata"]["annotations"][names::POLICIES_ANNOTATION]
            .as_str()
            .is_some_and(|a| a.split(',').any(|n| n.trim() == self.name));
        let labels = &namespace["metadata"]["labels"];
        let selected = self
            .spec
            .pointer("/namespaceSelector/matchLabels")
            .and_then(Value::as_object)
            .is_some_and(|m| m.iter().all(|(k, v)| labels.get(k) == Some(v)));
        named || selected
    }
    fn selects_pod(&self, pod: &Value) -> bool {
        let labels = &pod["metadata"]["labels"];
        self.spec
            .pointer("/podSelector/matchLabels")
            .and_then(Value::as_object)
            .is_none_or(|m| m.iter().all(|(k, v)| labels.get(k) == Some(v)))
    }
    fn required_expressions(&self) -> Vec<Value> {
        self.spec
            .pointer("/nodeAffinity/required")
            .and_then(Value::as_array)
            .cloned()
            .unwrap_or_default()
    }
    /// The preferred terms this policy gives: its pool's, when Preferred, and its
    /// `nodeAffinity.preferred`.
    fn preferences(&self) -> Vec<Value> {
        let mut out = Vec::new();
        if let Some(pool) = self.pool().filter(|_| !self.required_pool()) {
            let weight = pool.get("weight").and_then(Value::as_i64).unwrap_or(50);
            out.push(
                json!({"weight": weight, "preference": {"matchExpressions": [
                {"key": POOL_LABEL, "operator": "In", "values": [self.name]}]}}),
            );
        }
        for p in self
            .spec
            .pointer("/nodeAffinity/preferred")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
        {
            out.push(json!({"weight": p["weight"], "preference": {"matchExpressions": [p["preference"]]}}));
        }
        out
    }
}

/// The world with berth's pools in place, as the controller keeps them.
pub struct Pools {
    pub policies: Vec<Policy>,
    /// Each node's owner: the oldest policy whose pool claims it.
    pub owner: Vec<Option<String>>,
    /// The nodes with the pool label and, for a dedicated pool, its taint.
    pub nodes: Vec<Value>,
}

impl Pools {
    pub fn of(world: &World) -> Pools {
        let policies: Vec<Policy> = world
            .policies
            .iter()
            .map(|p| Policy {
                name: p["metadata"]["name"].as_str().unwrap().to_owned(),
                spec: p["spec"].clone(),
            })
            .collect();
        let mut owner = Vec::new();
        let mut nodes = Vec::new();
        for node in &world.nodes {
            let name = node["metadata"]["name"].as_str().unwrap();
            // Policies are generated oldest first.
            let claim = policies
                .iter()
                .find(|p| p.claims(name, &node["metadata"]["labels"]));
            let mut node = node.clone();
            if let Some(p) = claim {
                node["metadata"]["labels"][POOL_LABEL] = json!(p.name);
                if p.dedicated() {
                    node["spec"]["taints"]
                        .as_array_mut()
                        .unwrap()
                        .push(json!({"key": POOL_TAINT, "value": p.name, "effect": p.effect()}));
                }
            }
            owner.push(claim.map(|p| p.name.clone()));
            nodes.push(node);
        }
        Pools {
            policies,
            owner,
            nodes,
        }
    }

    /// The nodes (by index) that `policy` owns.
    pub fn nodes_of(&self, policy: &str) -> BTreeSet<usize> {
        (0..self.owner.len())
            .filter(|&i| self.owner[i].as_deref() == Some(policy))
            .collect()
    }

    /// The nodes without their taints, to judge node affinity alone.
    pub fn untainted(&self) -> Vec<Value> {
        self.nodes
            .iter()
            .map(|n| {
                let mut n = n.clone();
                n["spec"]["taints"] = json!([]);
                n
            })
            .collect()
    }
}

/// What the contract expects for one pod.
pub struct Expected {
    /// The policies that apply (a DaemonSet pod: the pools that take it), sorted.
    pub applied: Vec<String>,
    /// The original pod with its own pool tolerations gone and those of its
    /// entitled dedicated pools added.
    pub tolerating: Value,
    /// A pod with only the applied policies' required node affinity, if any.
    pub required: Option<Value>,
    /// Nodes of the Required pools that apply, if any apply.
    pub pool_nodes: Option<BTreeSet<usize>>,
    /// Nodes of dedicated pools the pod is not entitled to.
    pub closed: BTreeSet<usize>,
    /// The pod names a node that a dedicated pool it is not entitled to names in
    /// `nodeNames` (its own `spec.nodeName`, or a DaemonSet pod's node when it
    /// tolerates every taint of that pool's effect): refused, even where an older
    /// pool owns the node, as long as the two pools' conflict lasts.
    pub names_a_closed_node: bool,
    /// Nodes of the dedicated pools the pod is entitled to.
    pub entitled_nodes: BTreeSet<usize>,
    /// The tolerations berth should add: those of the entitled dedicated pools.
    pub pool_tolerations: Vec<Value>,
    /// The preferred terms the pod should end with: its own (less those on berth's
    /// keys) and each policy preference it lacks, once.
    pub preferred: Vec<Value>,
    /// The applied policies' required expressions, which every term that matches
    /// something must carry.
    pub required_expressions: Vec<Value>,
}

/// Whether a node can set the label `key` on itself, in the contract's words
/// ("Pools a node cannot join by itself"): every key but those under
/// `node-restriction.kubernetes.io`, and those under `kubernetes.io` and `k8s.io`
/// other than the kubelet's own.
fn node_can_set(key: &str) -> bool {
    let prefix = key.split_once('/').map_or("", |(p, _)| p);
    let under = |domain: &str| prefix == domain || prefix.ends_with(&format!(".{domain}"));
    let kubelets = [
        "kubernetes.io/hostname",
        "kubernetes.io/os",
        "kubernetes.io/arch",
        "topology.kubernetes.io/zone",
        "topology.kubernetes.io/region",
        "node.kubernetes.io/instance-type",
        "beta.kubernetes.io/instance-type",
        "beta.kubernetes.io/os",
        "beta.kubernetes.io/arch",
        "failure-domain.beta.kubernetes.io/zone",
        "failure-domain.beta.kubernetes.io/region",
    ];
    if under("node-restriction.kubernetes.io") {
        return false;
    }
    !(under("kubernetes.io") || under("k8s.io"))
        || kubelets.contains(&key)
        || under("kubelet.kubernetes.io")
        || under("node.kubernetes.io")
}

fn is_owned_key(key: &str) -> bool {
    key == POOL_LABEL || key.starts_with("node-restriction.kubernetes.io/berth.")
}

/// A requirement in a canonical spelling: values sorted, absent and empty alike.
pub fn canonical_requirement(r: &Value) -> Value {
    let mut values: Vec<String> = r
        .get("values")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(|v| v.as_str().map(str::to_owned))
        .collect();
    values.sort();
    json!({"key": r["key"], "operator": r["operator"], "values": values})
}

/// A preferred term in a canonical spelling.
pub fn canonical_preferred(p: &Value) -> Value {
    let mut expressions: Vec<Value> = p
        .pointer("/preference/matchExpressions")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .map(canonical_requirement)
        .collect();
    expressions.sort_by_key(|e| e.to_string());
    let mut fields: Vec<Value> = p
        .pointer("/preference/matchFields")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .map(canonical_requirement)
        .collect();
    fields.sort_by_key(|e| e.to_string());
    json!({"weight": p["weight"], "expressions": expressions, "fields": fields})
}

pub fn expect(pods: &Pools, namespace: &Value, pod: &Value, daemonset: bool) -> Expected {
    let applied: Vec<&Policy> = pods
        .policies
        .iter()
        .filter(|p| {
            if daemonset {
                p.takes_daemonsets(namespace)
            } else {
                p.opted_in(namespace) && p.selects_pod(pod)
            }
        })
        .collect();
    let entitled: Vec<&Policy> = applied.iter().copied().filter(|p| p.dedicated()).collect();
    let pool_tolerations: Vec<Value> = entitled
        .iter()
        .map(|p| json!({"key": POOL_TAINT, "operator": "Equal", "value": p.name, "effect": p.effect()}))
        .collect();
    let mut tolerating = pod.clone();
    let mut tolerations: Vec<Value> = pod["spec"]["tolerations"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|t| t.get("key").and_then(Value::as_str) != Some(POOL_TAINT))
        .cloned()
        .collect();
    tolerations.extend(pool_tolerations.iter().cloned());
    tolerating["spec"]["tolerations"] = json!(tolerations);

    let routed: Vec<&Policy> = if daemonset {
        Vec::new()
    } else {
        applied.clone()
    };
    let required_expressions: Vec<Value> = routed
        .iter()
        .flat_map(|p| p.required_expressions())
        .collect();
    let required = (!required_expressions.is_empty()).then(|| {
        json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "r", "namespace": "default"},
            "spec": {"containers": [{"name": "c", "image": "nginx"}],
                "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
                    "nodeSelectorTerms": [{"matchExpressions": required_expressions}]}}}}})
    });
    let required_pools: Vec<&&Policy> = routed
        .iter()
        .filter(|p| p.pool().is_some() && p.required_pool())
        .collect();
    let pool_nodes = (!required_pools.is_empty()).then(|| {
        required_pools
            .iter()
            .flat_map(|p| pods.nodes_of(&p.name))
            .collect()
    });
    let entitled_names: BTreeSet<&str> = entitled.iter().map(|p| p.name.as_str()).collect();
    let closed = pods
        .policies
        .iter()
        .filter(|p| p.dedicated() && !entitled_names.contains(p.name.as_str()))
        .flat_map(|p| pods.nodes_of(&p.name))
        .collect();
    let entitled_nodes = entitled
        .iter()
        .flat_map(|p| pods.nodes_of(&p.name))
        .collect();
    let named_node = pod["spec"]["nodeName"].as_str().map(str::to_owned);
    let pinned_node = pod
        .pointer("/spec/affinity/nodeAffinity/requiredDuringSchedulingIgnoredDuringExecution/nodeSelectorTerms/0/matchFields/0/values/0")
        .and_then(Value::as_str)
        .filter(|_| daemonset)
        .map(str::to_owned);
    let wildcard = |effect: &str| {
        pod["spec"]["tolerations"]
            .as_array()
            .into_iter()
            .flatten()
            .any(|t| {
                t.get("key")
                    .and_then(Value::as_str)
                    .unwrap_or("")
                    .is_empty()
                    && t.get("operator").and_then(Value::as_str) == Some("Exists")
                    && t.get("effect")
                        .and_then(Value::as_str)
                        .is_none_or(|e| e.is_empty() || e == effect)
            })
    };
    let names_a_closed_node = pods
        .policies
        .iter()
        .filter(|p| p.dedicated() && !entitled_names.contains(p.name.as_str()))
        .any(|p| {
            let names = |node: &Option<String>| {
                node.as_ref().is_some_and(|n| {
                    p.pool()
                        .and_then(|pool| pool.get("nodeNames"))
                        .and_then(Value::as_array)
                        .is_some_and(|names| names.iter().any(|x| x == n.as_str()))
                })
            };
            names(&named_node) || (names(&pinned_node) && wildcard(p.effect()))
        });

    // Preferences: the pod's own, less those on berth's keys, then each policy
    // preference it does not already have, once.
    let own: Vec<Value> = pod
        .pointer("/spec/affinity/nodeAffinity/preferredDuringSchedulingIgnoredDuringExecution")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter(|p| {
            !p.pointer("/preference/matchExpressions")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
                .any(|e| {
                    e.get("key")
                        .and_then(Value::as_str)
                        .is_some_and(is_owned_key)
                })
        })
        .cloned()
        .collect();
    let mut seen: BTreeSet<String> = own
        .iter()
        .map(|p| canonical_preferred(p).to_string())
        .collect();
    let mut preferred = own;
    for p in routed.iter().flat_map(|p| p.preferences()) {
        if seen.insert(canonical_preferred(&p).to_string()) {
            preferred.push(p);
        }
    }
    let mut applied: Vec<String> = applied.iter().map(|p| p.name.clone()).collect();
    applied.sort();
    Expected {
        applied,
        tolerating,
        required,
        pool_nodes,
        closed,
        names_a_closed_node,
        entitled_nodes,
        pool_tolerations,
        preferred,
        required_expressions,
    }
}

/// A pod with only `preferred` as its node affinity, to score.
pub fn scoring_pod(preferred: &[Value]) -> Value {
    json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "s", "namespace": "default"},
        "spec": {"containers": [{"name": "c", "image": "nginx"}],
            "affinity": {"nodeAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": preferred}}}})
}

/// Counts of checks and of violations, by property.
#[derive(Debug, Default)]
pub struct Tally {
    pub checked: BTreeMap<&'static str, u64>,
    pub violated: BTreeMap<&'static str, u64>,
    /// The first few violations in full, to reproduce.
    pub examples: Vec<String>,
}

impl Tally {
    pub fn check(&mut self, property: &'static str, holds: bool, detail: impl FnOnce() -> String) {
        *self.checked.entry(property).or_default() += 1;
        if !holds {
            *self.violated.entry(property).or_default() += 1;
            if self.examples.len() < 8 {
                self.examples.push(format!("{property}: {}", detail()));
            }
        }
    }

    pub fn report(&self, title: &str) -> String {
        let mut out = format!("{title}\n");
        for (property, checked) in &self.checked {
            let violated = self.violated.get(property).copied().unwrap_or(0);
            out.push_str(&format!(
                "  {property:<58} {checked:>9} checked {violated:>6} violated\n"
            ));
        }
        out
    }

    pub fn violations(&self) -> u64 {
        self.violated.values().sum()
    }
}
