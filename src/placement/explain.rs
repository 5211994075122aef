//! `berth explain`: the decision in plain words, for a person who has never read
//! the SPEC: which policies matched and why, what changes, and, given nodes, where
//! the pod may land.

use std::fmt::Write;

use k8s_openapi::api::core::v1::{NodeSelectorRequirement, Toleration};

use std::collections::BTreeMap;

use super::feasibility::{Placement, describe_requirement, node_fits, with_pool_state};
use super::interpod::{Neighbours, Required};
use super::pod::PodView;
use super::{Decision, Input};
use crate::names::{
    ANCHOR_LABEL_PREFIX, APPLIED_ANNOTATION, GANG_GATE, PLACED_LABEL_PREFIX, POOL_LABEL, RANK_GATE,
};
use crate::policy::compile::Labels;

/// Explains `decision` for the pod in `input`; `patch_len` is the number of patch
/// operations, to say whether anything changes.
/// With `neighbours` (the pods bound now, `explain pod` on a live cluster), the
/// node list also weighs the pod's own required pod (anti-)affinity.
pub fn explain(
    input: &Input,
    pod_name: &str,
    decision: &Decision,
    patch_len: usize,
    neighbours: Option<&Neighbours>,
) -> String {
    let mut out = String::new();
    let ns = &input.namespace.name;
    let _ = writeln!(out, "Pod {pod_name} in namespace {ns}");
    if let Some(reason) = &decision.unreadable {
        let _ = writeln!(
            out,
            "  berth cannot read this pod ({reason}) and refuses it: what it cannot read, it cannot check."
        );
        return out;
    }

    if decision.applied.is_empty() {
        let _ = writeln!(out, "\nNo policy applies to this pod.");
    } else {
        let _ = writeln!(out, "\nPolicies that apply:");
        for applied in &decision.applied {
            let _ = writeln!(out, "  {}, because:", applied.policy);
            for why in &applied.why {
                let _ = writeln!(out, "    - {why}");
            }
        }
    }
    if !decision.passed_over.is_empty() {
        let _ = writeln!(out, "\nPolicies the namespace opts into that do not apply:");
        for passed in &decision.passed_over {
            let _ = writeln!(out, "  {}: {}", passed.policy, passed.why);
        }
    }

    let _ = writeln!(out, "\nWhat berth does to the pod:");
    let grants = &decision.grants;
    let mut changes: Vec<String> = Vec::new();
    let mut say = |line: String| changes.push(line);
    for t in &grants.tolerations {
        say(format!(
            "+ tolerates {}, so it may run on that pool's tainted nodes",
            toleration(t)
        ));
    }
    for r in &grants.required {
        say(format!(
            "+ {} (added to every node-affinity term)",
            required_in_words(r)
        ));
    }
    for p in &grants.preferred {
        for r in p.preference.match_expressions.iter().flatten() {
            say(format!(
                "+ prefers nodes with {} (weight {})",
                describe_requirement(r),
                p.weight
            ));
        }
    }
    for gate in &grants.scheduling_gates {
        say(format!(
            "+ is held by the scheduling gate {}",
            gate_in_words(gate, input, decision)
        ));
    }
    if let Some(group) = &grants.pod_group {
        say(format!(
            "+ joins the PodGroup {group}: kube-scheduler places its members all at once or none"
        ));
    }
    if let Some(priority) = &grants.priority {
        say(format!(
            "+ is queued with PriorityClass {} (priority {}, preemptionPolicy Never): the \
             scheduler takes higher values first and never preempts for it",
            priority.class, priority.value
        ));
    }
    if let Some(name) = &grants.scheduler_name {
        say(format!("+ is scheduled by {name}"));
    }
    if !grants.applied.is_empty() {
        say(format!(
            "+ is annotated {APPLIED_ANNOTATION}={}",
            grants.applied.join(",")
        ));
    }
    for t in &decision.stripped {
        say(format!(
            "- loses {}: the pod is not entitled to that pool",
            toleration(t)
        ));
    }
    if changes.is_empty() {
        changes.push("nothing".into());
    }
    for line in changes {
        let _ = writeln!(out, "  {line}");
    }
    if patch_len == 0 && decision.denial.is_none() {
        let _ = writeln!(
            out,
            "  (the pod already has all of this: the patch is empty)"
        );
    }

    if !decision.warnings.is_empty() {
        let _ = writeln!(out, "\nWarnings:");
        for w in &decision.warnings {
            let _ = writeln!(out, "  {w}");
        }
    }
    if let Some(denial) = &decision.denial {
        let _ = writeln!(out, "\nDenied: {denial}.");
    }
    if let Some(nodes) = input.nodes {
        explain_nodes(&mut out, input, decision, nodes, neighbours);
    }
    out
}

fn explain_nodes(
    out: &mut String,
    input: &Input,
    decision: &Decision,
    nodes: &super::NodeIndex,
    neighbours: Option<&Neighbours>,
) {
    let Ok(pod) = PodView::read(input.pod) else {
        return;
    };
    let pod = Placement::after(&pod, &decision.grants);
    let required = Required::of(input.pod, &input.namespace.name);
    let node_labels: BTreeMap<&str, &Labels> = nodes
        .iter()
        .map(|(name, node)| (name.as_str(), &node.labels))
        .collect();
    let own = neighbours
        .filter(|_| !required.is_empty())
        .map(|n| required.against(n, &node_labels));
    let _ = writeln!(
        out,
        "\nNodes (with berth's pool labels and taints applied{}):",
        if own.is_some() {
            ", and the pods bound now for its own pod affinity"
        } else {
            ""
        }
    );
    let mut fitting = Vec::new();
    let mut ruled_out_by_own_terms = 0;
    for (name, node) in nodes {
        let with_pool = with_pool_state(name, node, input.policies);
        let fits = node_fits(&pod, name, &with_pool).and_then(|()| match &own {
            Some(judge) => judge
                .allows(&node.labels)
                .inspect_err(|_| ruled_out_by_own_terms += 1),
            None => Ok(()),
        });
        match fits {
            Ok(()) => {
                fitting.push(name.as_str());
                let _ = writeln!(out, "  {name}: yes");
            }
            Err(why) => {
                let _ = writeln!(out, "  {name}: no, {why}");
            }
        }
    }
    let _ = match fitting.as_slice() {
        [] if ruled_out_by_own_terms > 0 => writeln!(
            out,
            "The pod fits no given node: on the {ruled_out_by_own_terms} its node affinity and \
             tolerations allow, its own pod (anti-)affinity leaves none; it would stay Pending."
        ),
        [] => writeln!(out, "The pod fits no given node; it would stay Pending."),
        names => writeln!(out, "The pod may land on: {}.", names.join(", ")),
    };
}

/// Why berth holds the pod with `gate`, and until when, in words.
fn gate_in_words(gate: &str, input: &Input, decision: &Decision) -> String {
    let labels = PodView::read(input.pod)
        .map(|p| p.labels().clone())
        .unwrap_or_default();
    // The policies that applied, first by name, as the webhook chose them.
    let policies = || {
        decision
            .applied
            .iter()
            .filter_map(|a| input.policies.get(&a.policy))
    };
    match gate {
        GANG_GATE => {
            let member =
                policies().find_map(|p| p.spec.gang.as_ref()?.member(&labels).ok().flatten());
            match member {
                Some(m) => format!(
                    "{gate} until {} members of gang {} exist and berth's fit check finds room \
                     for all of them; then all go at once",
                    m.min_available, m.group
                ),
                None => format!("{gate} until its gang is complete and fits"),
            }
        }
        RANK_GATE => {
            let rank =
                policies().find_map(|p| p.spec.start_order.as_ref()?.rank(&labels).ok().flatten());
            match rank {
                Some(k) => format!(
                    "{gate} until every pod of a rank below {k} in its namespace and policy is \
                     Ready and their Deployments and StatefulSets have their replicas"
                ),
                None => format!("{gate} until the lower ranks are Ready"),
            }
        }
        _ => format!(
            "{gate} until berth's controller releases it, so that no two pods that must avoid \
             each other are scheduled at the same time"
        ),
    }
}

/// What a required node expression means for the pod, in words.
fn required_in_words(r: &NodeSelectorRequirement) -> String {
    let values = r.values.as_deref().unwrap_or_default().join(", ");
    if let Some(policy) = r.key.strip_prefix(PLACED_LABEL_PREFIX) {
        return format!(
            "must avoid nodes where a pod of policy {policy} runs, since {policy} avoids this pod"
        );
    }
    let anchor = r.key.strip_prefix(ANCHOR_LABEL_PREFIX);
    match (r.key.as_str(), r.operator.as_str(), anchor) {
        (POOL_LABEL, "In", _) => format!("must run on a node of pool {values}"),
        (POOL_LABEL, "NotIn", _) => format!(
            "must stay off dedicated pool {values}: it tolerates every taint, so the pool taint alone would not keep it off"
        ),
        (_, "In", Some(policy)) => {
            format!("must run on a node where a pod named by {policy}'s colocateWith runs")
        }
        (_, "DoesNotExist", Some(policy)) => {
            format!("must avoid nodes where a pod named by {policy}'s avoid runs")
        }
        _ => format!("requires nodes with {}", describe_requirement(r)),
    }
}

fn toleration(t: &Toleration) -> String {
    format!(
        "{}={}:{}",
        t.key.as_deref().unwrap_or("*"),
        t.value.as_deref().unwrap_or("*"),
        t.effect.as_deref().unwrap_or("*")
    )
}
