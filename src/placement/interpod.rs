//! A pod's own required inter-pod affinity and anti-affinity, judged as
//! kube-scheduler's InterPodAffinity filter judges it, against the pods bound to
//! nodes now: for `berth explain pod`, which must not say a pod may land on a node
//! that its own terms rule out (Tekton's task pods must sit beside their affinity
//! assistant). Only the incoming pod's terms are read; other pods' anti-affinity
//! toward it is left to the scheduler.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::PodAffinityTerm;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use kube::core::{Selector, SelectorExt};
use serde_json::Value;

use super::error::Error;
use crate::policy::compile::Labels;

/// A pod bound to a node, as the terms see it.
#[derive(Debug, Clone, Copy)]
pub struct Bound<'a> {
    pub namespace: &'a str,
    pub labels: &'a Labels,
    pub node: &'a str,
}

/// The pods bound to nodes, and each namespace's labels (for `namespaceSelector`).
#[derive(Debug, Default)]
pub struct Neighbours<'a> {
    pub pods: Vec<Bound<'a>>,
    pub namespace_labels: BTreeMap<&'a str, &'a Labels>,
}

/// One required term, read.
#[derive(Debug)]
struct Term {
    /// `None`: a null `labelSelector`, which matches no pod.
    selector: Option<Selector>,
    namespaces: Vec<String>,
    /// `Some` of a selector; `{}` selects every namespace.
    namespace_selector: Option<Selector>,
    topology_key: String,
    /// The selector in words, for the reason.
    words: String,
}

/// The pod's required pod affinity and anti-affinity terms.
#[derive(Debug, Default)]
pub struct Required {
    affinity: Vec<Term>,
    anti_affinity: Vec<Term>,
    namespace: String,
    labels: Labels,
}

impl Required {
    /// Reads the required terms of the raw `pod` in `namespace`; a term that cannot
    /// be read is left out (the scheduler would refuse such a pod at creation).
    pub fn of(pod: &Value, namespace: &str) -> Required {
        let terms = |kind: &str| -> Vec<Term> {
            let raw =
                &pod["spec"]["affinity"][kind]["requiredDuringSchedulingIgnoredDuringExecution"];
            serde_json::from_value::<Vec<PodAffinityTerm>>(raw.clone())
                .unwrap_or_default()
                .into_iter()
                .filter_map(Term::of)
                .collect()
        };
        let labels = serde_json::from_value(pod["metadata"]["labels"].clone()).unwrap_or_default();
        Required {
            affinity: terms("podAffinity"),
            anti_affinity: terms("podAntiAffinity"),
            namespace: namespace.to_owned(),
            labels,
        }
    }

    pub fn is_empty(&self) -> bool {
        self.affinity.is_empty() && self.anti_affinity.is_empty()
    }

    /// The pod's terms against the pods bound now: which pods each term counts is
    /// worked out once here, so judging every node costs a look at those pods,
    /// not at every pod in the cluster again.
    pub fn against<'j>(
        &'j self,
        neighbours: &'j Neighbours<'j>,
        nodes: &'j BTreeMap<&'j str, &'j Labels>,
    ) -> Judge<'j> {
        let selects = |t: &Term, p: &Bound| t.selects(p.namespace, p.labels, self, neighbours);
        // As the scheduler counts them: the pods that match every affinity term,
        // on nodes that carry a term's key.
        let affinity_pods: Vec<&Bound> = neighbours
            .pods
            .iter()
            .filter(|p| self.affinity.iter().all(|t| selects(t, p)))
            .filter(|p| {
                nodes.get(p.node).is_some_and(|l| {
                    self.affinity
                        .iter()
                        .any(|t| l.contains_key(&t.topology_key))
                })
            })
            .collect();
        // The first pod of a group: no pod matches its terms anywhere, and it
        // matches them all itself.
        let first_of_group = affinity_pods.is_empty()
            && self
                .affinity
                .iter()
                .all(|t| t.selects(&self.namespace, &self.labels, self, neighbours));
        let anti_pods = self
            .anti_affinity
            .iter()
            .map(|t| neighbours.pods.iter().filter(|p| selects(t, p)).collect())
            .collect();
        Judge {
            required: self,
            nodes,
            affinity_pods,
            first_of_group,
            anti_pods,
        }
    }
}

/// A pod's required terms with the pods each counts ([`Required::against`]).
pub struct Judge<'j> {
    required: &'j Required,
    nodes: &'j BTreeMap<&'j str, &'j Labels>,
    affinity_pods: Vec<&'j Bound<'j>>,
    first_of_group: bool,
    /// For each anti-affinity term, the pods it selects.
    anti_pods: Vec<Vec<&'j Bound<'j>>>,
}

impl Judge<'_> {
    /// Whether the pod's own terms allow a node with `node_labels`; the error says
    /// which term rules it out.
    pub fn allows(&self, node_labels: &Labels) -> Result<(), Error> {
        let same_domain = |term: &Term, other: &Bound| {
            let Some(here) = node_labels.get(&term.topology_key) else {
                return false;
            };
            self.nodes
                .get(other.node)
                .and_then(|l| l.get(&term.topology_key))
                .is_some_and(|there| there == here)
        };
        let affinity = &self.required.affinity;
        // Every term's topology key must be on the node.
        if let Some(term) = affinity
            .iter()
            .find(|t| !node_labels.contains_key(&t.topology_key))
        {
            return Err(Error::AffinityLabelMissing(term.topology_key.clone()));
        }
        let missing = affinity
            .iter()
            .find(|term| !self.affinity_pods.iter().any(|p| same_domain(term, p)));
        if let Some(term) = missing.filter(|_| !self.first_of_group) {
            return Err(Error::AffinityUnmet {
                pods: term.words.clone(),
                topology_key: term.topology_key.clone(),
            });
        }
        for (term, pods) in self.required.anti_affinity.iter().zip(&self.anti_pods) {
            if let Some(p) = pods.iter().find(|p| same_domain(term, p)) {
                return Err(Error::AntiAffinity {
                    pods: term.words.clone(),
                    topology_key: term.topology_key.clone(),
                    namespace: p.namespace.to_string(),
                    node: p.node.to_string(),
                });
            }
        }
        Ok(())
    }
}

impl Term {
    fn of(term: PodAffinityTerm) -> Option<Term> {
        let words = term
            .label_selector
            .as_ref()
            .map(selector_words)
            .unwrap_or_else(|| "no pod (a null labelSelector)".into());
        let selector = match term.label_selector {
            Some(s) => Some(Selector::try_from(s).ok()?),
            None => None,
        };
        let namespace_selector = match term.namespace_selector {
            Some(s) => Some(Selector::try_from(s).ok()?),
            None => None,
        };
        Some(Term {
            selector,
            namespaces: term.namespaces.unwrap_or_default(),
            namespace_selector,
            topology_key: term.topology_key,
            words,
        })
    }

    /// Whether the term selects a pod in `namespace` with `labels`: its namespaces
    /// (by default, the incoming pod's own), then its label selector.
    fn selects(&self, namespace: &str, labels: &Labels, pod: &Required, n: &Neighbours) -> bool {
        let in_namespace = match (&self.namespace_selector, self.namespaces.is_empty()) {
            (None, true) => namespace == pod.namespace,
            (selector, _) => {
                self.namespaces.iter().any(|ns| ns == namespace)
                    || selector.as_ref().is_some_and(|s| {
                        n.namespace_labels
                            .get(namespace)
                            .is_some_and(|l| s.matches(l))
                    })
            }
        };
        in_namespace && self.selector.as_ref().is_some_and(|s| s.matches(labels))
    }
}

/// A label selector in words: `k=v, k In [a, b]`.
fn selector_words(selector: &LabelSelector) -> String {
    let labels = selector
        .match_labels
        .iter()
        .flatten()
        .map(|(k, v)| format!("{k}={v}"));
    let expressions =
        selector
            .match_expressions
            .iter()
            .flatten()
            .map(|e| match e.values.as_deref() {
                Some(values) if !values.is_empty() => {
                    format!("{} {} [{}]", e.key, e.operator, values.join(", "))
                }
                _ => format!("{} {}", e.key, e.operator),
            });
    let words: Vec<String> = labels.chain(expressions).collect();
    if words.is_empty() {
        "any pod".into()
    } else {
        words.join(", ")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn labels(pairs: &[(&str, &str)]) -> Labels {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    fn task_pod(affinity: Value) -> Required {
        Required::of(
            &json!({"metadata": {"labels": {"app": "task"}}, "spec": {"affinity": affinity}}),
            "ci",
        )
    }

    #[test]
    fn a_pod_that_must_sit_beside_another_is_allowed_only_on_its_node() {
        let beside = task_pod(
            json!({"podAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
            {"topologyKey": "kubernetes.io/hostname",
                "labelSelector": {"matchLabels": {"app.kubernetes.io/component": "affinity-assistant"}}}]}}),
        );
        let node = |n: &str| labels(&[("kubernetes.io/hostname", n)]);
        let (n1, n2) = (node("node1"), node("node2"));
        let nodes = BTreeMap::from([("node1", &n1), ("node2", &n2)]);
        let assistant = labels(&[("app.kubernetes.io/component", "affinity-assistant")]);
        let mut neighbours = Neighbours::default();
        neighbours.pods.push(Bound {
            namespace: "ci",
            labels: &assistant,
            node: "node1",
        });
        assert!(beside.against(&neighbours, &nodes).allows(&n1).is_ok());
        let why = beside
            .against(&neighbours, &nodes)
            .allows(&n2)
            .unwrap_err()
            .to_string();
        assert_eq!(
            why,
            "its own pod affinity needs a pod matching \
             app.kubernetes.io/component=affinity-assistant in the same kubernetes.io/hostname, \
             and none is there"
        );
        // In another namespace the assistant is not the term's (namespaces default
        // to the pod's own): no pod matches, and the pod does not match its own
        // term, so no node will do.
        neighbours.pods[0].namespace = "other";
        assert!(beside.against(&neighbours, &nodes).allows(&n1).is_err());
        // With no assistant anywhere, a pod that matches its own term goes first.
        let own = task_pod(
            json!({"podAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
            {"topologyKey": "kubernetes.io/hostname", "labelSelector": {"matchLabels": {"app": "task"}}}]}}),
        );
        let nobody = Neighbours::default();
        assert!(own.against(&nobody, &nodes).allows(&n2).is_ok());
        // But only on a node that carries the term's key.
        let bare = labels(&[]);
        let why = own
            .against(&nobody, &nodes)
            .allows(&bare)
            .unwrap_err()
            .to_string();
        assert_eq!(
            why,
            "its own pod affinity needs a kubernetes.io/hostname label, and the node has none"
        );
    }

    #[test]
    fn only_pods_that_match_every_affinity_term_count() {
        // Two terms: one pod matching the first and another the second, on one
        // node, do not satisfy it; the scheduler counts pods that match both.
        let both = task_pod(
            json!({"podAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
            {"topologyKey": "kubernetes.io/hostname", "labelSelector": {"matchLabels": {"a": "1"}}},
            {"topologyKey": "kubernetes.io/hostname", "labelSelector": {"matchLabels": {"b": "1"}}}]}}),
        );
        let n1 = labels(&[("kubernetes.io/hostname", "n1")]);
        let nodes = BTreeMap::from([("n1", &n1)]);
        let (a, b, ab) = (
            labels(&[("a", "1")]),
            labels(&[("b", "1")]),
            labels(&[("a", "1"), ("b", "1")]),
        );
        let on_n1 = |labels| Bound {
            namespace: "ci",
            labels,
            node: "n1",
        };
        let apart = Neighbours {
            pods: vec![on_n1(&a), on_n1(&b)],
            ..Neighbours::default()
        };
        assert!(both.against(&apart, &nodes).allows(&n1).is_err());
        let together = Neighbours {
            pods: vec![on_n1(&ab)],
            ..Neighbours::default()
        };
        assert!(both.against(&together, &nodes).allows(&n1).is_ok());
    }

    #[test]
    fn anti_affinity_rules_out_the_nodes_of_matching_pods_in_its_namespaces() {
        let apart = task_pod(
            json!({"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
            {"topologyKey": "zone", "namespaceSelector": {},
                "labelSelector": {"matchExpressions": [{"key": "app", "operator": "In", "values": ["task"]}]}}]}}),
        );
        let (a1, a2, b1) = (
            labels(&[("zone", "a")]),
            labels(&[("zone", "a")]),
            labels(&[("zone", "b")]),
        );
        let nodes = BTreeMap::from([("a1", &a1), ("a2", &a2), ("b1", &b1)]);
        let other = labels(&[("app", "task")]);
        let team = labels(&[]);
        let neighbours = Neighbours {
            pods: vec![Bound {
                namespace: "elsewhere",
                labels: &other,
                node: "a1",
            }],
            namespace_labels: BTreeMap::from([("elsewhere", &team)]),
        };
        let why = apart
            .against(&neighbours, &nodes)
            .allows(&a2)
            .unwrap_err()
            .to_string();
        assert!(
            why.contains("keeps it out of the zone of a pod matching app In [task]"),
            "{why}"
        );
        assert!(apart.against(&neighbours, &nodes).allows(&b1).is_ok());
        assert!(Required::of(&json!({}), "ci").is_empty());
    }
}
