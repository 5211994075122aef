//! The placement engine: one pure decision from (pod JSON, namespace, policies,
//! optionally nodes) to grants, removals, warnings or a denial, and the JSON Patch
//! built from it. The webhook, `berth mutate` and `berth explain` are thin doors
//! onto [`decide`] and [`build_patch`].

pub mod avoid;
pub mod bounds;
pub mod canonical;
pub mod coscheduling;
pub mod daemonset;
pub mod desired;
pub mod entitlement;
pub mod exclusion;
pub mod explain;
pub mod feasibility;
pub mod grants;
pub mod group_plan;
pub mod groups;
pub mod interpod;
pub mod matching;
pub mod missed;
pub mod opt_in;
pub mod patch;
pub mod pod;
pub mod records;
pub mod rooms;
pub mod scheduler;
pub mod selection;
pub mod warning;

use std::borrow::Cow;
use std::collections::BTreeSet;
use std::sync::OnceLock;

use k8s_openapi::api::core::v1::{Namespace, Node, Taint, Toleration};
use serde_json::Value;

pub use grants::Grants;
pub use patch::build_patch;
use pod::PodView;
pub use pod::Requester;
use warning::bounded;

use crate::policy::compile::Labels;
use crate::policy::{AnnotationError, NamespaceConfig, PolicySet};

/// The namespace of the pod: its name, labels and annotations.
#[derive(Debug, Default)]
pub struct NamespaceInfo {
    pub name: String,
    pub labels: Labels,
    pub annotations: Labels,
    /// The berth annotations, read on first use and kept: the webhook's copy of a
    /// namespace lives until the namespace changes, so its image globs are compiled
    /// once per change rather than once per pod. Change the annotations before the
    /// first use, or on a clone.
    config: OnceLock<Result<NamespaceConfig, AnnotationError>>,
}

/// A copy reads its annotations again: it is made to be changed.
impl Clone for NamespaceInfo {
    fn clone(&self) -> Self {
        NamespaceInfo::with(&self.name, self.labels.clone(), self.annotations.clone())
    }
}

use crate::names::NAMESPACE_NAME_LABEL;

impl NamespaceInfo {
    /// A namespace with no annotations and only the name label the apiserver
    /// gives every namespace.
    pub fn new(name: &str) -> Self {
        let labels = Labels::from([(NAMESPACE_NAME_LABEL.to_owned(), name.to_owned())]);
        NamespaceInfo::with(name, labels, Labels::new())
    }

    /// A namespace with exactly these labels and annotations.
    pub fn with(name: &str, labels: Labels, annotations: Labels) -> Self {
        NamespaceInfo {
            name: name.to_owned(),
            labels,
            annotations,
            config: OnceLock::new(),
        }
    }

    pub fn from_namespace(namespace: &Namespace) -> Self {
        Self::from_meta(&namespace.metadata)
    }

    /// From a namespace's metadata, all berth reads of it. A namespace read from
    /// a file may lack the name label; the apiserver would have set it.
    pub fn from_meta(meta: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta) -> Self {
        let name = meta.name.clone().unwrap_or_default();
        let mut labels = meta.labels.clone().unwrap_or_default();
        labels
            .entry(NAMESPACE_NAME_LABEL.to_owned())
            .or_insert_with(|| name.clone());
        let annotations = meta.annotations.clone().unwrap_or_default();
        NamespaceInfo::with(&name, labels, annotations)
    }

    /// What its berth annotations say, or why they cannot be read.
    pub fn config(&self) -> Result<&NamespaceConfig, &AnnotationError> {
        self.config
            .get_or_init(|| NamespaceConfig::parse(&self.annotations))
            .as_ref()
    }

    /// Its berth annotations, or none when they cannot be read: what the
    /// controller trusts of a namespace whose annotations are broken.
    pub fn config_or_none(&self) -> &NamespaceConfig {
        static NONE: std::sync::LazyLock<NamespaceConfig> =
            std::sync::LazyLock::new(NamespaceConfig::default);
        self.config().unwrap_or(&NONE)
    }
}

/// What placement knows about a node.
#[derive(Debug, Clone, Default)]
pub struct NodeInfo {
    pub labels: Labels,
    pub taints: Vec<Taint>,
}

impl NodeInfo {
    pub fn from_node(node: &Node) -> Self {
        NodeInfo {
            labels: node.metadata.labels.clone().unwrap_or_default(),
            taints: node
                .spec
                .as_ref()
                .and_then(|s| s.taints.clone())
                .unwrap_or_default(),
        }
    }
}

/// Known nodes by name. A persistent map: the webhook's cache takes a label
/// change in O(log n) and hands each review a snapshot that costs a pointer, where
/// a copy of the whole map per change cost O(n) each time a burst labelled
/// thousands of nodes.
pub type NodeIndex = imbl::OrdMap<String, std::sync::Arc<NodeInfo>>;

/// Namespaces by name, as decisions read them. A persistent map, as
/// [`NodeIndex`] is: a change costs O(log n), a reader's snapshot a pointer.
pub type NamespaceIndex = imbl::OrdMap<String, std::sync::Arc<NamespaceInfo>>;

/// The index of these namespaces, each read as decisions read it
/// ([`NamespaceInfo::from_meta`]).
pub fn namespace_index<'a>(
    namespaces: impl IntoIterator<Item = &'a k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta>,
) -> NamespaceIndex {
    namespaces
        .into_iter()
        .map(|meta| {
            let info = NamespaceInfo::from_meta(meta);
            (info.name.clone(), std::sync::Arc::new(info))
        })
        .collect()
}

/// The namespaces as the controller asks of them: each namespace's berth
/// annotations are read once per change of the namespace (and kept in its
/// [`NamespaceInfo`]), not on every pass. Annotations that do not parse opt the
/// namespace into nothing by annotation; its labels may still be selected.
impl crate::policy::OptIn for NamespaceIndex {
    fn opts_in(&self, policy: &crate::policy::CompiledPolicy, namespace: &str) -> bool {
        self.get(namespace)
            .is_some_and(|ns| policy.namespace_opts_in(ns.config_or_none(), &ns.labels))
    }

    fn takes_daemonsets(&self, policy: &crate::policy::CompiledPolicy, namespace: &str) -> bool {
        self.get(namespace).is_some_and(|ns| {
            let opts_in = policy.namespace_opts_in(ns.config_or_none(), &ns.labels);
            policy.takes_daemonsets_from(&ns.labels, opts_in)
        })
    }

    fn named(&self, namespace: &str) -> &[String] {
        self.get(namespace)
            .map(|ns| ns.config_or_none().policies.as_slice())
            .unwrap_or_default()
    }
}

/// Everything one decision looks at. The pod is JSON (`berth explain`, tests) or
/// berth's view of it as read from an AdmissionReview ([`PodView`]).
#[derive(Debug)]
pub struct Input<'a, P: ?Sized = Value> {
    /// The pod as admitted.
    pub pod: &'a P,
    pub namespace: &'a NamespaceInfo,
    pub policies: &'a PolicySet,
    /// Known nodes, when there are any (the webhook's cache, `explain --nodes`).
    pub nodes: Option<&'a NodeIndex>,
    /// Who sends the pod: only the DaemonSet controller makes DaemonSet pods.
    pub requester: Requester,
    /// How the cluster enforces gangs, and its default PriorityClass.
    pub groups: groups::GroupContext<'a>,
}

impl<P: ?Sized> Clone for Input<'_, P> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<P: ?Sized> Copy for Input<'_, P> {}

/// A pod as berth decides on it: its [`PodView`], or why it cannot be read.
pub trait PodSource {
    fn view(&self) -> Result<Cow<'_, PodView>, String>;
}

impl PodSource for Value {
    fn view(&self) -> Result<Cow<'_, PodView>, String> {
        PodView::read(self).map(Cow::Owned)
    }
}

impl PodSource for PodView {
    fn view(&self) -> Result<Cow<'_, PodView>, String> {
        Ok(Cow::Borrowed(self))
    }
}

/// A pod as the webhook reads it: its view, or why it cannot be read.
impl PodSource for Result<PodView, String> {
    fn view(&self) -> Result<Cow<'_, PodView>, String> {
        self.as_ref().map(Cow::Borrowed).map_err(Clone::clone)
    }
}

/// A policy that applies to the pod, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Applied {
    pub policy: String,
    pub why: Vec<String>,
    /// Whether it applies through `coscheduled` (the pod goes with its group).
    pub with_group: bool,
}

/// A policy the namespace opts into that does not apply to this pod, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PassedOver {
    pub policy: String,
    pub why: String,
}

/// The outcome of one admission.
#[derive(Debug, Clone, Default)]
pub struct Decision {
    /// Policies that apply, with the reasons.
    pub applied: Vec<Applied>,
    /// Policies the namespace opts into that do not apply, with the reason.
    pub passed_over: Vec<PassedOver>,
    /// For a DaemonSet pod: the dedicated pools that do not take its DaemonSet,
    /// with the reason.
    pub refused_daemonset: Vec<PassedOver>,
    /// What the pod gains.
    pub grants: Grants,
    /// Pool tolerations the pod brought itself and loses.
    pub stripped: Vec<Toleration>,
    /// Messages for the user, each under 120 characters.
    pub warnings: Vec<String>,
    /// Set when the pod must be refused; the reason.
    pub denial: Option<String>,
    /// Set when the pod could not be read; it is then refused (berth fails closed on
    /// content it cannot read).
    pub unreadable: Option<String>,
    /// Set when the namespace's berth annotations could not be read; the pod then
    /// gets no grants from them.
    pub namespace_error: Option<String>,
}

/// Decides what happens to one pod. Never panics, whatever the JSON.
pub fn decide<P: PodSource + ?Sized>(input: &Input<'_, P>) -> Decision {
    let view = match input.pod.view() {
        Ok(pod) => pod,
        Err(reason) => {
            return Decision {
                denial: Some(format!("berth cannot read this pod: {reason}")),
                unreadable: Some(reason),
                ..Default::default()
            };
        }
    };
    let pod = view.as_ref();
    let mut decision = Decision::default();
    let config = match input.namespace.config() {
        Ok(config) => Some(config),
        Err(e) => {
            decision.warnings.push(bounded(format!(
                "namespace {}: {e}; no grants until fixed",
                input.namespace.name
            )));
            decision.namespace_error = Some(e.to_string());
            None
        }
    };

    let daemonset = pod.is_daemonset_pod(input.requester);
    let mut grants = if daemonset {
        let ds =
            daemonset::daemonset_grants(pod, input.policies, input.namespace, config, input.nodes);
        decision.denial = ds.denial;
        decision.refused_daemonset = ds.refused_by;
        decision.applied = ds
            .grants
            .applied
            .iter()
            .map(|name| Applied {
                policy: name.clone(),
                why: vec![format!(
                    "the pod belongs to a DaemonSet and pool {name} takes DaemonSets of namespace {}",
                    input.namespace.name
                )],
                with_group: false,
            })
            .collect();
        ds.grants
    } else {
        let matches = matching::match_policies(pod, input.namespace, config, input.policies);
        decision.warnings.extend(matches.warnings);
        decision.passed_over = matches.passed_over;
        let applied: Vec<_> = matches.applied.iter().map(|(p, _)| *p).collect();
        let mut grants = grants::grants_for(&applied);
        decision.applied = matches.applied.into_iter().map(|(_, a)| a).collect();
        let targeted = avoid::hold(pod, input.namespace, config, input.policies, &mut grants);
        decision.denial =
            avoid::node_name_denial(pod, input.nodes, &grants.applied, &targeted, input.policies);
        grants
    };

    let applied_policies: Vec<_> = decision
        .applied
        .iter()
        .filter_map(|a| input.policies.get(&a.policy))
        .filter(|_| !daemonset)
        .collect();
    let (scheduler, warnings) =
        scheduler::scheduler_name(pod.scheduler_name(), config, &applied_policies);
    grants.scheduler_name = scheduler;
    decision.warnings.extend(warnings);
    decision.warnings.extend(groups::group_grants(
        pod,
        &applied_policies,
        input.groups,
        &mut grants,
    ));
    if grants.priority.is_none() && !daemonset {
        let foreign = groups::foreign_queue_class(pod, input.namespace, config, input.policies);
        decision.denial = decision.denial.or(foreign);
    }

    // Entitled pools: every policy that applied (DaemonSet pods: the pools that
    // take their DaemonSet).
    let entitled: BTreeSet<String> = grants.applied.iter().cloned().collect();
    if !daemonset
        && let Some(exclusion) = entitlement::wildcard_exclusion(pod, input.policies, &entitled)
    {
        grants.require(exclusion);
    }
    let (stripped, warnings) = entitlement::forged_tolerations(pod, &grants.tolerations);
    decision.stripped = stripped;
    decision.warnings.extend(warnings);
    let pool_denial = entitlement::node_name_denial(pod, input.policies, input.nodes, &entitled);
    decision.denial = pool_denial.or(decision.denial);

    if let Some(nodes) = input.nodes {
        decision.warnings.extend(feasibility::pool_warnings(
            input.policies,
            pod,
            &grants,
            nodes,
        ));
    }
    decision.warnings.extend(coscheduling::conflict_warning(
        pod,
        &decision.applied,
        &grants,
    ));
    decision.grants = grants;
    decision
}

#[cfg(test)]
mod tests;
