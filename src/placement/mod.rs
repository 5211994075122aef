//! The placement engine: one pure decision from (pod JSON, namespace, policies,
//! optionally nodes) to grants, removals, warnings or a denial, and the JSON Patch
//! built from it. The webhook, `berth mutate` and `berth explain` are thin doors
//! onto [`decide`] and [`build_patch`].

pub mod avoid;
pub mod canonical;
pub mod coscheduling;
pub mod daemonset;
pub mod desired;
pub mod entitlement;
pub mod error;
pub mod exclusion;
pub mod explain;
pub mod feasibility;
pub mod grants;
pub mod group_plan;
pub mod groups;
pub mod interpod;
pub mod matching;
pub mod missed;
pub mod namespace;
pub mod opt_in;
pub mod patch;
pub mod pod;
pub mod records;
pub mod rooms;
pub mod scheduler;
pub mod selection;
pub mod static_placement;
pub mod warning;

use std::collections::BTreeSet;

use k8s_openapi::api::core::v1::Toleration;
use serde_json::Value;

pub use grants::Grants;
use matching::{Applied, PassedOver};
use namespace::NamespaceInfo;
pub use patch::build_patch;
use pod::PodSource;
pub use pod::Requester;
use warning::bounded;

use crate::objects::NodeIndex;
use crate::policy::PolicySet;

/// Everything one decision looks at. The pod is JSON (`berth explain`, tests) or
/// berth's view of it as read from an AdmissionReview ([`PodObject`](pod::PodObject)).
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
