//! Why a pod may not go to a node, or a gang finds no nodes: placement's one
//! error. Its messages are what `berth explain` prints after "no," and what the
//! `GangDoesNotFit` Event says, so each names the rule and the value that rules
//! the node out.
//!
//! (Reading a pod has its own error, [`super::pod`]'s, and a policy's compile
//! errors are [`crate::policy::compile`]'s.)

/// Why not.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum Error {
    /// `spec.nodeName` names another node.
    #[error("the pod names node {0}")]
    NamesNode(String),
    /// A `nodeSelector` entry the node's labels lack.
    #[error("nodeSelector {key}={value} does not match")]
    NodeSelector { key: String, value: String },
    /// Required node affinity with no terms matches no node.
    #[error("required node affinity has no terms, so it matches no node")]
    NoTerms,
    /// Required node affinity whose terms are all empty matches no node.
    #[error("required node affinity has only empty terms, so it matches no node")]
    OnlyEmptyTerms,
    /// The first non-empty term has a requirement that does not parse.
    #[error("required node affinity does not parse ({0}), so it matches no node")]
    TermDoesNotParse(String),
    /// The first non-empty term's requirement that the node fails.
    #[error("required node affinity fails ({0})")]
    TermFails(String),
    /// A taint the pod does not tolerate.
    #[error("taint {key}={value}:{effect} is not tolerated")]
    Untolerated {
        key: String,
        value: String,
        effect: String,
    },
    /// The node runs as many pods as it may.
    #[error("no pod slots left")]
    NoPodSlots,
    /// Less of a resource is left than the pod requests.
    #[error("{resource}: {free} left, {requested} requested")]
    Short {
        resource: String,
        free: f64,
        requested: f64,
    },
    /// The pod's own pod affinity keys on a label the node lacks.
    #[error("its own pod affinity needs a {0} label, and the node has none")]
    AffinityLabelMissing(String),
    /// No pod the pod's own pod affinity needs runs in the node's domain.
    #[error(
        "its own pod affinity needs a pod matching {pods} in the same {topology_key}, and none \
         is there"
    )]
    AffinityUnmet { pods: String, topology_key: String },
    /// A pod the pod's own anti-affinity keeps away from runs in the node's domain.
    #[error(
        "its own pod anti-affinity keeps it out of the {topology_key} of a pod matching {pods} \
         (in {namespace}, on {node})"
    )]
    AntiAffinity {
        pods: String,
        topology_key: String,
        namespace: String,
        node: String,
    },
    /// Another member of the same gang, placed on the node first, must be avoided.
    #[error("it must avoid {0}")]
    MustAvoid(String),
    /// A gang member berth cannot read within its bounds.
    #[error("pod {0} is too large for berth to read")]
    TooLarge(String),
    /// A gang member no node takes; `first` is the first node that does not, and why.
    #[error("no node for {pod} (policy {policy}; first {})", first_miss(.first))]
    NoNode {
        pod: String,
        policy: String,
        first: Option<(String, Box<Error>)>,
    },
}

fn first_miss(first: &Option<(String, Box<Error>)>) -> String {
    match first {
        Some((node, why)) => format!("{node}: {why}"),
        None => "there are no nodes".into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_gang_that_finds_no_node_names_the_first_node_and_why() {
        let short = Error::Short {
            resource: "cpu".into(),
            free: 0.5,
            requested: 1.5,
        };
        let none = Error::NoNode {
            pod: "ns/a".into(),
            policy: "gang".into(),
            first: Some(("n1".into(), Box::new(short))),
        };
        assert_eq!(
            none.to_string(),
            "no node for ns/a (policy gang; first n1: cpu: 0.5 left, 1.5 requested)"
        );
        let nowhere = Error::NoNode {
            pod: "ns/a".into(),
            policy: "gang".into(),
            first: None,
        };
        assert_eq!(
            nowhere.to_string(),
            "no node for ns/a (policy gang; first there are no nodes)"
        );
    }
}
