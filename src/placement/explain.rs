//! `berth explain`: the decision in plain words, for a person who has never read
//! the SPEC: which policies matched and why, what changes, and, given nodes, where
//! the pod may land.

use std::fmt::Write;

use k8s_openapi::api::core::v1::{NodeSelectorRequirement, Toleration};

use std::collections::BTreeMap;

use super::feasibility::{Placement, describe_requirement, node_fits, with_pool_state};
use super::interpod::{Neighbours, Required};
use super::namespace::NamespaceInfo;
use super::patch::{added, required_matches_no_node};
use super::{Decision, Input};
use crate::names::{
    ANCHOR_LABEL_PREFIX, APPLIED_ANNOTATION, GANG_GATE, IMAGES_ANNOTATION_PREFIX,
    PLACED_LABEL_PREFIX, PLACEMENT_POLICY, POOL_LABEL, RANK_GATE,
};
use crate::objects::PodObject;
use crate::placement::static_placement::{StaticPlacementSpec, StaticPolicy};
use crate::policy::compile::Labels;
use crate::policy::{CompiledPolicy, PolicySet};

/// Explains `decision` for the pod in `input`.
/// With `neighbours` (the pods bound now, `explain pod` on a live cluster), the
/// node list also weighs the pod's own required pod (anti-)affinity.
pub fn explain(
    input: &Input,
    pod_name: &str,
    decision: &Decision,
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
            if let Some(policy) = input.policies.get(&applied.policy) {
                let _ = writeln!(out, "    {}", in_apiserver(policy, input.namespace));
            }
        }
    }
    if !decision.passed_over.is_empty() {
        let _ = writeln!(out, "\nPolicies the namespace opts into that do not apply:");
        for passed in &decision.passed_over {
            let _ = writeln!(out, "  {}: {}", passed.policy, passed.why);
        }
    }

    if !decision.refused_daemonset.is_empty() {
        let _ = writeln!(
            out,
            "\nPools that do not take DaemonSets of namespace {ns}:"
        );
        for refused in &decision.refused_daemonset {
            let _ = writeln!(out, "  {}: {}", refused.policy, refused.why);
        }
    }

    let _ = writeln!(out, "\nWhat berth does to the pod:");
    for line in changes(input, decision) {
        let _ = writeln!(out, "  {line}");
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
    nodes: &crate::objects::NodeIndex,
    neighbours: Option<&Neighbours>,
) {
    let Ok(pod) = PodObject::read(input.pod) else {
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
        // A pod berth refuses is never created: it lands on no node, whatever fits.
        _ if decision.denial.is_some() => writeln!(
            out,
            "The pod is denied: it is not created, so it lands on no node."
        ),
        [] => writeln!(out, "The pod fits no given node; it would stay Pending."),
        names => writeln!(out, "The pod may land on: {}.", names.join(", ")),
    };
}

/// Whether the apiserver's `berth-placement` also applies `policy` to pods of
/// `namespace` with berth down, as the controller compiles it for the apiserver
/// ([`StaticPolicy::compile`]), or why only the webhook does: the policy needs
/// what only the webhook sees, or the namespace overrides images with globs CEL
/// cannot express (then the apiserver leaves all its pods to the webhook).
fn in_apiserver(policy: &CompiledPolicy, namespace: &NamespaceInfo) -> String {
    // An override compiles to "" when CEL cannot match its globs.
    let unmatched = namespace.annotations.iter().find(|(key, value)| {
        key.starts_with(IMAGES_ANNOTATION_PREFIX)
            && StaticPlacementSpec::compile(&PolicySet::default(), [value.as_str()]).image_overrides
                [value.as_str()]
            .is_empty()
    });
    match (StaticPolicy::compile(policy).webhook_only, unmatched) {
        (Some(reason), _) => format!("webhook only: {reason}"),
        (None, Some((key, _))) => format!(
            "webhook only: the apiserver cannot match the globs of the namespace's {key}, so \
             it leaves the namespace's pods to the webhook"
        ),
        (None, None) => format!("also applied by the apiserver ({PLACEMENT_POLICY})"),
    }
}

/// How a line of [`changes`] stands towards the patch.
#[derive(PartialEq)]
enum Mark {
    /// The patch adds it.
    Adds,
    /// The pod has it already.
    Has,
    /// A required expression the patch does not add: the pod's required node
    /// affinity matches no node, and berth leaves it so.
    Nowhere,
    /// The pod loses it.
    Loses,
}

/// What berth does to the pod, a line each: `+` what the patch adds, `=` what
/// it does not (as [`added`] tells them apart), `-` what the pod loses.
fn changes(input: &Input, decision: &Decision) -> Vec<String> {
    let grants = &decision.grants;
    let new = added(input.pod, grants);
    let has = |adds: bool| if adds { Mark::Adds } else { Mark::Has };
    let mut lines: Vec<(Mark, String)> = Vec::new();
    for t in &grants.tolerations {
        let what = format!(
            "tolerates {}, so it may run on that pool's tainted nodes",
            toleration(t)
        );
        lines.push((has(new.tolerations.contains(t)), what));
    }
    let nowhere = PodObject::read(input.pod).is_ok_and(|p| required_matches_no_node(&p));
    for r in &grants.required {
        let what = required_in_words(r);
        lines.push(match (new.required.contains(r), nowhere) {
            (true, _) => (
                Mark::Adds,
                format!("{what} (added to every node-affinity term)"),
            ),
            (false, true) => (Mark::Nowhere, what),
            (false, false) => (Mark::Has, what),
        });
    }
    for p in &grants.preferred {
        for r in p.preference.match_expressions.iter().flatten() {
            let what = format!(
                "prefers nodes with {} (weight {})",
                describe_requirement(r),
                p.weight
            );
            lines.push((has(new.preferred.contains(p)), what));
        }
    }
    for gate in &grants.scheduling_gates {
        let what = format!(
            "is held by the scheduling gate {}",
            gate_in_words(gate, input, decision)
        );
        lines.push((has(new.scheduling_gates.contains(gate)), what));
    }
    if let Some(group) = &grants.pod_group {
        let what = format!(
            "joins the PodGroup {group}: kube-scheduler places its members all at once or none"
        );
        lines.push((has(new.pod_group.is_some()), what));
    }
    if let Some(priority) = &grants.priority {
        let what = format!(
            "is queued with PriorityClass {} (priority {}, preemptionPolicy Never): the \
             scheduler takes higher values first and never preempts for it",
            priority.class, priority.value
        );
        lines.push((has(new.priority.is_some()), what));
    }
    if let Some(name) = &grants.scheduler_name {
        lines.push((
            has(new.scheduler_name.is_some()),
            format!("is scheduled by {name}"),
        ));
    }
    if !grants.applied.is_empty() {
        let what = format!(
            "is annotated {APPLIED_ANNOTATION}={}",
            grants.applied.join(",")
        );
        lines.push((has(!new.applied.is_empty()), what));
    }
    for t in &decision.stripped {
        let what = format!(
            "loses {}: the pod is not entitled to that pool",
            toleration(t)
        );
        lines.push((Mark::Loses, what));
    }
    if lines.is_empty() {
        return vec!["nothing".into()];
    }
    // A pod that has all of it already (as the apiserver stores a pod berth
    // admitted) is told so once, not on every line.
    if lines.iter().all(|(mark, _)| *mark == Mark::Has) {
        let mut said: Vec<String> = lines
            .into_iter()
            .map(|(_, what)| format!("= {what}"))
            .collect();
        said.push("(the pod already has all of this: berth adds nothing)".into());
        return said;
    }
    lines
        .into_iter()
        .map(|(mark, what)| match mark {
            Mark::Adds => format!("+ {what}"),
            Mark::Has => format!("= {what}; the pod has it already"),
            Mark::Nowhere => {
                format!("= {what}; not added: the pod's required node affinity matches no node")
            }
            Mark::Loses => format!("- {what}"),
        })
        .collect()
}

/// Why berth holds the pod with `gate`, and until when, in words.
fn gate_in_words(gate: &str, input: &Input, decision: &Decision) -> String {
    let labels = PodObject::read(input.pod)
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::test_policies;

    #[test]
    fn a_namespace_override_the_apiserver_cannot_match_leaves_its_pods_to_the_webhook() {
        let set = test_policies(&[("plain", serde_json::json!({"pool": {"nodeNames": ["n1"]}}))]);
        let plain = set.get("plain").unwrap();
        let namespace = |annotations: &[(&str, &str)]| {
            let annotations = annotations
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect();
            NamespaceInfo::with("shop", Labels::new(), annotations)
        };
        assert_eq!(
            in_apiserver(plain, &namespace(&[("berth.io/policies", "plain")])),
            "also applied by the apiserver (berth-placement)"
        );
        // A value that lists no glob compiles to no regex, whatever CEL can match.
        assert_eq!(
            in_apiserver(plain, &namespace(&[("berth.io/images.other", " , ")])),
            "webhook only: the apiserver cannot match the globs of the namespace's \
             berth.io/images.other, so it leaves the namespace's pods to the webhook"
        );
    }
}
