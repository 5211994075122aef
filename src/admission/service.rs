//! The webhook's decisions, synchronous and without I/O: the handlers look up the
//! namespace and take a snapshot of the caches, then call [`mutate`] or
//! [`validate`].

use std::collections::BTreeSet;

use super::review::{AdmissionRequest, AdmissionResponse, Object, Policy};
use super::state::GroupState;
use crate::names::is_owned_node_key;
use crate::objects::{NodeIndex, PodObject};
use crate::placement::canonical::{RequirementKey, requirement_key};
use crate::placement::entitlement::breaches_in_words;
use crate::placement::groups::GroupContext;
use crate::placement::namespace::NamespaceInfo;
use crate::placement::patch::write_patch;
use crate::placement::records::{forbidden_changes, unheld_record};
use crate::placement::warning::bounded;
use crate::placement::{Decision, Input, Requester, decide};
use crate::policy::compile::Labels;
use crate::policy::{CompiledPolicy, NamespaceConfig, PolicySet};

/// What one admission sees of the cluster (the controller's pass sees
/// [`crate::controller::context::Snapshot`]).
#[derive(Debug, Clone, Copy)]
pub struct ReviewState<'a> {
    pub policies: &'a PolicySet,
    pub namespace: &'a NamespaceInfo,
    pub nodes: Option<&'a NodeIndex>,
    /// berth's own identity: only it may release its gates.
    pub berth_user: &'a str,
    /// The gang mode and the PriorityClasses.
    pub groups: &'a GroupState,
}

/// How an admission ended, for metrics and logs.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Verdict {
    /// `unchanged`, `patched`, `denied` or `unreadable`.
    pub outcome: &'static str,
    /// Policies that applied.
    pub applied: Vec<String>,
    /// Whether the namespace's berth annotations could not be read.
    pub broken_annotation: bool,
}

impl Verdict {
    fn new(outcome: &'static str) -> Self {
        Verdict {
            outcome,
            applied: Vec::new(),
            broken_annotation: false,
        }
    }
}

/// A pod as the webhook reads it: its view, or why it cannot be read.
type Pod = Result<PodObject, String>;

fn run(object: &Pod, request: &AdmissionRequest, snapshot: &ReviewState) -> Decision {
    decide(&Input {
        pod: object,
        namespace: snapshot.namespace,
        policies: snapshot.policies,
        nodes: snapshot.nodes,
        requester: Requester::from_username(&request.user_info.username),
        groups: GroupContext {
            gang_mode: snapshot.groups.gang_mode,
            default_class: snapshot.groups.default_class.as_deref(),
        },
    })
}

/// The kinds berth decides on; an object of them it cannot read is refused.
fn is_decided(request: &AdmissionRequest) -> bool {
    request.is_pod()
        || request.is_kind("apps", "DaemonSet")
        || request.is_kind("", "Namespace")
        || request.is_kind(crate::names::GROUP, "PlacementPolicy")
}

/// The denial for an object berth cannot read: what it cannot read, it cannot check.
fn refuse_unreadable(request: &AdmissionRequest) -> Option<(AdmissionResponse, Verdict)> {
    let why = request
        .unreadable
        .as_deref()
        .filter(|_| is_decided(request))?;
    let reason = format!("berth cannot read this {}: {why}", request.kind.kind);
    Some((
        AdmissionResponse::deny(request, &bounded(reason)),
        Verdict::new("unreadable"),
    ))
}

/// `POST /mutate`: Pods at CREATE get berth's patch, DaemonSets the pool
/// tolerations (and exclusions) in their pod template; anything else is allowed
/// unchanged.
pub fn mutate(request: &AdmissionRequest, snapshot: &ReviewState) -> (AdmissionResponse, Verdict) {
    if let Some(refusal) = refuse_unreadable(request) {
        return refusal;
    }
    if let Some(Object::DaemonSet(daemonset)) = &request.object {
        let patch = daemonset
            .as_deref()
            .map_or(json_patch::Patch(Vec::new()), |daemonset| {
                crate::placement::daemonset::template_patch(
                    daemonset.template(),
                    snapshot.policies,
                    snapshot.namespace,
                )
            });
        let outcome = if patch.0.is_empty() {
            "unchanged"
        } else {
            "patched"
        };
        return (
            AdmissionResponse::allow(request).with_patch(&patch),
            Verdict::new(outcome),
        );
    }
    let (true, "CREATE", Some(object)) = (
        request.is_pod(),
        request.operation.as_str(),
        request.object.as_ref().and_then(Object::pod),
    ) else {
        return (AdmissionResponse::allow(request), Verdict::new("unchanged"));
    };
    let mut decision = run(object, request, snapshot);
    // The apiserver refuses a pod naming a PriorityClass that does not exist. The
    // controller makes the classes the policies allow; the webhook writes nothing
    // on behalf of a review (anyone who reaches its port could send one).
    if let Some(missing) = decision
        .grants
        .priority
        .take_if(|p| !snapshot.groups.queue_classes.contains(&p.class))
    {
        decision.warnings.push(bounded(format!(
            "PriorityClass {} does not exist yet (berth's controller makes it); the pod is not \
             queued",
            missing.class
        )));
    }
    let verdict = |outcome| Verdict {
        outcome,
        applied: decision.grants.applied.clone(),
        broken_annotation: decision.namespace_error.is_some(),
    };
    if let Some(reason) = &decision.denial {
        let verdict = verdict(if decision.unreadable.is_some() {
            "unreadable"
        } else {
            "denied"
        });
        let response = AdmissionResponse::deny(request, reason).with_warnings(decision.warnings);
        return (response, verdict);
    }
    let written = match object {
        Ok(pod) => write_patch(pod, &decision.grants).finish(),
        // A pod berth could not read was refused above.
        Err(_) => Ok(None),
    };
    let patch = match written {
        Ok(patch) => patch,
        Err(error) => {
            // Unreachable for berth's own types; refused rather than admitted
            // without what the policies require.
            let reason = format!("berth could not write its patch: {error}");
            let response = AdmissionResponse::deny(request, &reason);
            return (response, verdict("denied"));
        }
    };
    let Some(patch) = patch else {
        let response = AdmissionResponse::allow(request).with_warnings(decision.warnings);
        return (response, verdict("unchanged"));
    };
    let response = AdmissionResponse::allow(request)
        .with_patch_text(&patch)
        .with_warnings(decision.warnings);
    (response, verdict("patched"))
}

/// `POST /validate`: Pods (CREATE, UPDATE), Namespaces (berth annotations) and
/// PlacementPolicies (what the schema cannot check).
pub fn validate(
    request: &AdmissionRequest,
    snapshot: &ReviewState,
) -> (AdmissionResponse, Verdict) {
    if let Some(refusal) = refuse_unreadable(request) {
        return refusal;
    }
    let Some(object) = request.object.as_ref() else {
        return (AdmissionResponse::allow(request), Verdict::new("unchanged"));
    };
    let operation = request.operation.as_str();
    if !matches!(operation, "CREATE" | "UPDATE") {
        return (AdmissionResponse::allow(request), Verdict::new("unchanged"));
    }
    let problems = match object {
        Object::Pod(pod) if request.is_pod() => pod_problems(request, pod, snapshot),
        Object::Namespace(annotations) => namespace_problems(annotations, snapshot.policies),
        Object::Policy(policy) => policy_problems(policy, snapshot),
        _ => Problems::default(),
    };
    match problems.denial {
        Some(reason) => (
            AdmissionResponse::deny(request, &reason).with_warnings(problems.warnings),
            Verdict::new("denied"),
        ),
        None => (
            AdmissionResponse::allow(request).with_warnings(problems.warnings),
            Verdict::new("unchanged"),
        ),
    }
}

#[derive(Debug, Default)]
struct Problems {
    denial: Option<String>,
    warnings: Vec<String>,
}

/// What breaks entitlement in a pod as it stands (after mutation): a way onto a
/// dedicated pool it is not entitled to (the rule the admission policy
/// `berth-pools` enforces), else the webhook's own denial (a node name where a pod
/// it must avoid runs).
fn entitlement_violations(
    object: &Pod,
    request: &AdmissionRequest,
    snapshot: &ReviewState,
) -> Vec<String> {
    let decision = run(object, request, snapshot);
    let Ok(pod) = object else {
        return decision.denial.into_iter().collect();
    };
    let entitled = decision.grants.applied.iter().cloned().collect();
    let breaches = breaches_in_words(
        pod,
        &snapshot.namespace.name,
        &entitled,
        snapshot.policies,
        snapshot.nodes,
    );
    if !breaches.is_empty() {
        return breaches;
    }
    decision.denial.into_iter().collect()
}

/// berth's own required node expressions on a pod, by meaning (the order of
/// their values, and an empty list the apiserver drops, mean nothing).
fn owned_expressions(pod: &PodObject) -> BTreeSet<RequirementKey> {
    pod.required_affinity()
        .into_iter()
        .flatten()
        .flat_map(|term| term.match_expressions.iter().flatten())
        .filter(|e| is_owned_node_key(&e.key))
        .map(requirement_key)
        .collect()
}

/// Pods: at CREATE, nothing may break entitlement, and a record of an `avoid`
/// policy comes with its gate. At UPDATE (tolerations can be
/// added to a running pod, a gated pod's affinity can change) nothing may break it
/// that did not already, berth's own node expressions may not be dropped, and only
/// berth changes its record, its gates and who controls the pod.
fn pod_problems(request: &AdmissionRequest, object: &Pod, snapshot: &ReviewState) -> Problems {
    let mut violations = entitlement_violations(object, request, snapshot);
    if request.operation == "CREATE"
        && let Ok(pod) = object
    {
        let requester = Requester::from_username(&request.user_info.username);
        violations.extend(unheld_record(pod, requester, snapshot.policies));
    }
    if request.operation == "UPDATE"
        && let Some(old) = request.old_object.as_ref().and_then(Object::pod)
    {
        let before = entitlement_violations(old, request, snapshot);
        violations.retain(|v| !before.contains(v));
        if let (Ok(old), Ok(new)) = (old, object) {
            if !owned_expressions(old).is_subset(&owned_expressions(new)) {
                violations.push("berth's node affinity on a pod may not be removed".into());
            }
            violations.extend(forbidden_changes(
                old,
                new,
                &request.user_info.username,
                snapshot.berth_user,
            ));
        }
    }
    Problems {
        denial: (!violations.is_empty()).then(|| violations.join("; ")),
        warnings: Vec::new(),
    }
}

/// Namespaces: berth annotations must parse; naming an unknown policy is a warning.
fn namespace_problems(annotations: &Labels, policies: &PolicySet) -> Problems {
    match NamespaceConfig::parse(annotations) {
        Err(e) => Problems {
            denial: Some(e.to_string()),
            warnings: Vec::new(),
        },
        Ok(config) => Problems {
            denial: None,
            warnings: config
                .policies
                .iter()
                .filter(|p| policies.get(p).is_none())
                .map(|p| bounded(format!("no PlacementPolicy named {p:?} exists (yet)")))
                .collect(),
        },
    }
}

/// PlacementPolicies: what the schema cannot check (globs, selectors, operators),
/// and warnings for pools that claim nodes another pool already has.
fn policy_problems(object: &Policy, snapshot: &ReviewState) -> Problems {
    // The controller's probe of the webhook path (controller::webhook_path): its
    // answer is this refusal, and a probe is never stored.
    if object.probe {
        return Problems {
            denial: Some(crate::names::WEBHOOK_PROBE_ANSWER.to_owned()),
            warnings: Vec::new(),
        };
    }
    let policy = match &object.policy {
        Ok(policy) => policy,
        Err(e) => {
            return Problems {
                denial: Some(e.clone()),
                warnings: Vec::new(),
            };
        }
    };
    let compiled = match CompiledPolicy::compile(policy) {
        Ok(compiled) => compiled,
        Err(e) => {
            return Problems {
                denial: Some(e.to_string()),
                warnings: Vec::new(),
            };
        }
    };
    let mut warnings = Vec::new();
    if policy
        .spec
        .namespace_selector
        .as_ref()
        .is_some_and(|s| s.match_labels.is_none() && s.match_expressions.is_none())
    {
        warnings.push("namespaceSelector {} selects every namespace".to_string());
    }
    warnings.extend(self_set_warning(&compiled));
    warnings.extend(pool_conflicts(&compiled, snapshot));
    Problems {
        denial: None,
        warnings,
    }
}

/// A pool selector that reads labels a node can set on itself: without
/// `trustSelfSetLabels` it takes no node that is not in the pool yet; with it, a
/// node can join by labelling itself. Either is said, never refused: a policy
/// already in force keeps its nodes.
fn self_set_warning(policy: &CompiledPolicy) -> Option<String> {
    let keys = policy.self_set_keys();
    if keys.is_empty() {
        return None;
    }
    let keys = keys.join(", ");
    // The keys last: a long list is what the bound cuts.
    Some(bounded(if policy.selector_takes_new_nodes() {
        format!("pool.trustSelfSetLabels: a node can join this pool by setting on itself {keys}")
    } else {
        format!(
            "pool.nodeSelector: no new node joins by labels nodes set themselves \
             (pool.trustSelfSetLabels): {keys}"
        )
    }))
}

/// Nodes this policy's pool claims that another pool claims too.
fn pool_conflicts(policy: &CompiledPolicy, snapshot: &ReviewState) -> Vec<String> {
    let Some(pool) = &policy.spec.pool else {
        return Vec::new();
    };
    let mut nodes: BTreeSet<&str> = pool.node_names.iter().map(String::as_str).collect();
    if let Some(index) = snapshot.nodes {
        nodes.extend(
            index
                .iter()
                .filter(|(name, node)| policy.claims_node(name, Some(&node.labels)))
                .map(|(name, _)| name.as_str()),
        );
    }
    nodes
        .into_iter()
        .filter_map(|node| {
            let labels = snapshot.nodes.and_then(|n| n.get(node)).map(|n| &n.labels);
            let other = snapshot
                .policies
                .iter()
                .find(|p| p.name != policy.name && p.claims_node(node, labels))?;
            Some(bounded(format!(
                "node {node} is also in pool {}; the older policy keeps it",
                other.name
            )))
        })
        .collect()
}
