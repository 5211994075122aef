//! The webhook's half of groups (SPEC "Groups"): what a pod of a `gang`,
//! `startOrder` or `queue` policy gets at CREATE.
//!
//! - A gang member is held by `berth.io/gang` (gate mode), or, where the apiserver
//!   serves Kubernetes' own PodGroup API, joined to its PodGroup through
//!   `spec.schedulingGroup` so that kube-scheduler places the group all at once.
//!   Members that must also avoid each other stay in gate mode there: berth's avoid
//!   gate releases them one by one, which kube-scheduler's gang would wait on.
//! - A ranked pod is held by `berth.io/rank` until the lower ranks are Ready.
//! - A queued pod gets the PriorityClass `berth-queue-<value>` with its `priority`
//!   and `preemptionPolicy: Never`, all three together: the apiserver's Priority
//!   plugin re-checks them after berth's patch and refuses a mismatch.
//!
//! When two applied policies set the same one of these, the first by name wins, with
//! a warning: a pod has one group, one rank and one priority.

use super::grants::{Grants, QueuePriority};
use super::warning::bounded;
use crate::names::{AVOID_GATE, GANG_GATE, RANK_GATE, queue_class, queue_class_parts};
use crate::objects::PodObject;
use crate::policy::CompiledPolicy;
use crate::policy::groups::QosClass;

/// How the cluster enforces gangs.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum GangMode {
    /// berth holds members with `berth.io/gang` and releases a group together.
    #[default]
    Gate,
    /// kube-scheduler's own gang scheduling: `scheduling.k8s.io/v1beta1` PodGroups.
    PodGroup,
}

impl GangMode {
    pub fn as_str(self) -> &'static str {
        match self {
            GangMode::Gate => "Gate",
            GangMode::PodGroup => "PodGroup",
        }
    }
}

/// What the cluster tells a group decision.
#[derive(Debug, Clone, Copy, Default)]
pub struct GroupContext<'a> {
    pub gang_mode: GangMode,
    /// The cluster's global-default PriorityClass: the apiserver gives it to a pod
    /// that names none before berth sees the pod, so it is not the pod's own choice.
    pub default_class: Option<&'a str>,
}

/// Adds the gates, PodGroup and priority of the group policies among `applied`
/// (sorted by name) to `grants`; warnings for labels berth cannot use.
pub fn group_grants(
    pod: &PodObject,
    applied: &[&CompiledPolicy],
    context: GroupContext,
    grants: &mut Grants,
) -> Vec<String> {
    let mut warnings = Vec::new();
    let labels = pod.labels();
    // The apiserver refuses a gated pod with a node name: such a pod is held only
    // once berth has turned the name into a term (avoid).
    let may_hold = pod.node_name().is_none() || grants.pinned_to.is_some();

    let mut gangs = applied
        .iter()
        .filter_map(|p| Some((p, p.spec.gang.as_ref()?)));
    if let Some((policy, gang)) = gangs.next() {
        // kube-scheduler's gang waits at Permit for members berth's avoid gate
        // releases one at a time: such a group would never start. berth holds it.
        let mode = if grants.scheduling_gates.iter().any(|g| g == AVOID_GATE) {
            GangMode::Gate
        } else {
            context.gang_mode
        };
        match gang.member(labels) {
            Ok(Some(member)) => match mode {
                GangMode::PodGroup => match pod.pod_group_name() {
                    Some(own) => warnings.push(bounded(format!(
                        "gang {}: the pod names PodGroup {own} itself, which it keeps",
                        member.group
                    ))),
                    None => grants.pod_group = Some(member.pod_group_name(&policy.name)),
                },
                GangMode::Gate if may_hold => grants.gate(GANG_GATE),
                GangMode::Gate => warnings.push(bounded(format!(
                    "gang {}: a pod with spec.nodeName is not held with its group",
                    member.group
                ))),
            },
            Ok(None) => {}
            Err(e) => warnings.push(bounded(format!("policy {}: {e}; not held", policy.name))),
        }
    }
    warnings.extend(ignored("gang", gangs.map(|(p, _)| *p)));

    let mut orders = applied
        .iter()
        .filter_map(|p| Some((p, p.spec.start_order.as_ref()?)));
    if let Some((policy, order)) = orders.next() {
        match order.rank(labels) {
            Ok(Some(_)) if may_hold => grants.gate(RANK_GATE),
            Ok(_) => {}
            Err(e) => warnings.push(bounded(format!("policy {}: {e}; not held", policy.name))),
        }
    }
    warnings.extend(ignored("startOrder", orders.map(|(p, _)| *p)));

    let mut queues = applied
        .iter()
        .filter_map(|p| Some((p, p.spec.queue.as_ref()?)));
    if let Some((policy, queue)) = queues.next() {
        let own_class = pod
            .priority_class_name()
            .filter(|c| Some(*c) != context.default_class && queue_class_parts(c).is_none());
        match (queue.priority(labels), own_class) {
            (Ok(Some(_)), Some(class)) => warnings.push(bounded(format!(
                "policy {}: the pod names PriorityClass {class}, which it keeps; not queued",
                policy.name
            ))),
            (Ok(Some(priority)), None) => {
                if priority > queue.max_priority {
                    warnings.push(bounded(format!(
                        "policy {}: {}={priority} counts as its maxPriority {}",
                        policy.name, queue.priority_label, queue.max_priority
                    )));
                }
                // Members of a native gang must share one priority with their
                // PodGroup, so QoS cannot break ties among them (also for a pod
                // already in a group: berth's patch applied again changes nothing).
                let qos = if grants.pod_group.is_some() || pod.pod_group_name().is_some() {
                    QosClass::BestEffort
                } else {
                    pod.qos_class()
                };
                let value = queue.class_value(priority, qos);
                grants.priority = Some(QueuePriority {
                    class: queue_class(&policy.name, value),
                    value,
                });
            }
            (Ok(None), _) => {}
            (Err(e), _) => {
                warnings.push(bounded(format!("policy {}: {e}; not queued", policy.name)))
            }
        }
    }
    warnings.extend(ignored("queue", queues.map(|(p, _)| *p)));
    warnings
}

/// Warnings for policies whose group field loses to an earlier policy's.
fn ignored<'p>(
    field: &'p str,
    rest: impl Iterator<Item = &'p CompiledPolicy> + 'p,
) -> impl Iterator<Item = String> + 'p {
    rest.map(move |p| {
        bounded(format!(
            "policy {}: {field} ignored, another applied policy sets it",
            p.name
        ))
    })
}

/// The refusal for a pod that names a queue class of a policy its namespace does
/// not opt into (and that no queue policy of its own replaces): the classes order
/// a policy's queue above other pods, and are its to hand out. The admission
/// policy `berth-queues` refuses the same with berth down.
pub fn foreign_queue_class(
    pod: &PodObject,
    namespace: &super::namespace::NamespaceInfo,
    config: Option<&crate::policy::NamespaceConfig>,
    policies: &crate::policy::PolicySet,
) -> Option<String> {
    let class = pod.priority_class_name()?;
    let (name, _) = queue_class_parts(class)?;
    let policy = policies.get(name)?;
    (!super::matching::opts_in(policy, namespace, config)).then(|| {
        format!(
            "PriorityClass {class} orders policy {name}'s queue, which namespace {} does not opt into",
            namespace.name
        )
    })
}
