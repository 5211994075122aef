//! The structural rules of entitlement as ValidatingAdmissionPolicies: CEL that the
//! apiserver runs in-process with `failurePolicy: Fail`, so they hold with berth
//! down (SPEC "Enforcement that holds while berth is down").
//!
//! Seven policies, generated here so their names, identities and bounds come from
//! the same constants the webhook and controller use (`berth admission-policy`
//! prints them; `manifests/admission-policy.yaml` is that output):
//!
//! - `berth-limits`, with no params: a pod's lists stay within
//!   [`crate::bounds`]. The other policies walk those lists, the pool
//!   policy once per PlacementPolicy, so each first checks the bounds in the same
//!   expression that would walk them (CEL's `&&` stops at the first false) and
//!   leaves a pod over them to this one.
//! - `berth-pools`, one evaluation per PlacementPolicy (its `paramKind`): a pod in a
//!   namespace that does not opt into a dedicated pool gets no toleration of it, no
//!   `spec.nodeName` on its nodes, and no wildcard toleration unless every required
//!   term keeps it off the pool. DaemonSet pods of the namespaces the pool takes are
//!   exempt. On UPDATE only what the update adds is refused.
//! - `berth-bindings`: a Binding of a pod to a dedicated node is refused unless the
//!   pod's namespace opts into the pool. kube-scheduler's own bindings are skipped by
//!   a matchCondition, so the scheduler's hot path does not pay for this.
//! - `berth-queues`, per PlacementPolicy: a pod names a policy's queue class
//!   (`berth-queue-<policy>-<value>`) only from a namespace that opts into it.
//! - `berth-holds`, per PlacementPolicy: at CREATE, a `berth.io/applied` that names
//!   an `avoid` policy comes with the gate `berth.io/avoid`.
//! - `berth-podgroups`: only berth (and Kubernetes' controllers) writes PodGroups
//!   named `berth-*`, its gangs'.
//! - `berth-records`: on UPDATE of a pod or its status, nobody but berth changes
//!   `berth.io/applied` or removes a `berth.io/` scheduling gate, and nobody but
//!   Kubernetes' own controllers changes a pod's controller ownerReference.
//!
//! What CEL cannot see, it does not judge: image globs (routing, not a boundary)
//! and Node labels (pool membership comes from `spec.pool.nodeNames` and the
//! controller's `status.nodeNames`). A missing PlacementPolicy never refuses a pod
//! (`parameterNotFoundAction: Allow`).

use serde_json::{Value, json};

use crate::bounds::{
    Bound, CONTAINERS, LABELS, OWNER_REFERENCES, PREFERRED_TERMS, REQUIRED_TERMS, SCHEDULING_GATES,
    TERM_REQUIREMENTS, TOLERATIONS,
};
use crate::names::{
    APPLIED_ANNOTATION, AVOID_GATE, DAEMONSET_CONTROLLER_USERS, GATE_PREFIX, GROUP,
    POD_GROUP_PREFIX, POLICIES_ANNOTATION, POOL_LABEL, POOL_TAINT, QUEUE_CLASS_PREFIX,
    SYSTEM_DAEMONSET_NAMESPACES,
};
use crate::policy::exempt::{BERTH_NAMESPACE, Exempt, SYSTEM_NAMESPACES};

/// A CEL list of string literals.
pub(super) fn list(items: &[&str]) -> String {
    let quoted: Vec<String> = items.iter().map(|i| format!("'{i}'")).collect();
    format!("[{}]", quoted.join(", "))
}

/// Whether the LabelSelector `s` matches the string map `labels` (both CEL).
pub(super) fn selector_matches(s: &str, labels: &str) -> String {
    format!(
        "((!has({s}.matchLabels) || {s}.matchLabels.all(k, k in {labels} && {labels}[k] == {s}.matchLabels[k])) && \
         (!has({s}.matchExpressions) || {s}.matchExpressions.all(e, \
           e.operator == 'In' ? (e.key in {labels} && has(e.values) && {labels}[e.key] in e.values) : \
           e.operator == 'NotIn' ? (!(e.key in {labels}) || !has(e.values) || !({labels}[e.key] in e.values)) : \
           e.operator == 'Exists' ? e.key in {labels} : \
           e.operator == 'DoesNotExist' ? !(e.key in {labels}) : false)))"
    )
}

pub(super) fn variable(name: &str, expression: String) -> Value {
    json!({"name": name, "expression": expression})
}

/// The variables both pool policies use: the param policy's pool, and whether the
/// request's namespace opts into it.
fn pool_variables() -> Vec<Value> {
    let labels = "namespaceObject.metadata.labels";
    vec![
        variable(
            "dedicated",
            "has(params.spec.pool) && (!has(params.spec.pool.dedicated) || params.spec.pool.dedicated)".into(),
        ),
        variable(
            "poolNodes",
            "(has(params.spec.pool) && has(params.spec.pool.nodeNames) ? params.spec.pool.nodeNames : []) + \
             (has(params.status) && has(params.status.nodeNames) ? params.status.nodeNames : [])"
                .into(),
        ),
        variable(
            "named",
            format!(
                "namespaceObject != null && has(namespaceObject.metadata.annotations) && \
                 '{POLICIES_ANNOTATION}' in namespaceObject.metadata.annotations ? \
                 namespaceObject.metadata.annotations['{POLICIES_ANNOTATION}'].split(',').map(n, n.trim()) : []"
            ),
        ),
        variable(
            "optedIn",
            format!(
                "params.metadata.name in variables.named || (has(params.spec.namespaceSelector) && \
                 namespaceObject != null && has({labels}) && {})",
                selector_matches("params.spec.namespaceSelector", labels)
            ),
        ),
    ]
}

/// `parent.field`, a list that may be absent, has at most `bound.most` items.
fn at_most(parent: &str, field: &str, bound: Bound) -> String {
    format!(
        "(!has({parent}.{field}) || size({parent}.{field}) <= {})",
        bound.most
    )
}

/// Each item `t` of `list` has at most [`TERM_REQUIREMENTS`] expressions and fields
/// in its selector (`t` itself, or `t{of}`).
fn each_term_within(list: &str, of: &str) -> String {
    let term = format!("t{of}");
    format!(
        "{list}.all(t, {} && {})",
        at_most(&term, "matchExpressions", TERM_REQUIREMENTS),
        at_most(&term, "matchFields", TERM_REQUIREMENTS)
    )
}

/// The paths of a pod's node affinity: (`nodeAffinity`, its required selector,
/// its preferred terms).
fn node_affinity_paths(o: &str) -> (String, String, String) {
    let node_affinity = format!("{o}.spec.affinity.nodeAffinity");
    let required = format!("{node_affinity}.requiredDuringSchedulingIgnoredDuringExecution");
    let preferred = format!("{node_affinity}.preferredDuringSchedulingIgnoredDuringExecution");
    (node_affinity, required, preferred)
}

/// Whether the pod `o` is within [`crate::bounds`]: every list the
/// policies walk, checked before they walk it (CEL's `&&` stops at the first
/// false, so a pod over a bound costs a few size checks).
pub(super) fn within_bounds(o: &str) -> String {
    let (node_affinity, required, preferred) = node_affinity_paths(o);
    let terms = format!("{required}.nodeSelectorTerms");
    let spec = format!("{o}.spec");
    format!(
        "({} && {} && {} && {} && {} && (!has({spec}.affinity) || !has({node_affinity}) || \
         ((!has({required}) || ({} && {})) && ({} && (!has({preferred}) || {})))))",
        at_most(
            &format!("{o}.metadata"),
            "ownerReferences",
            OWNER_REFERENCES
        ),
        at_most(&spec, "tolerations", TOLERATIONS),
        at_most(&spec, "schedulingGates", SCHEDULING_GATES),
        at_most(&spec, "containers", CONTAINERS),
        at_most(&spec, "initContainers", CONTAINERS),
        at_most(&required, "nodeSelectorTerms", REQUIRED_TERMS),
        each_term_within(&terms, ""),
        at_most(
            &node_affinity,
            "preferredDuringSchedulingIgnoredDuringExecution",
            PREFERRED_TERMS
        ),
        each_term_within(&preferred, ".preference"),
    )
}

/// `berth-limits`: a pod's lists within [`crate::bounds`], with no
/// params, so that its cost never grows with the number of policies.
fn limits(berth_user: &str) -> Value {
    let (node_affinity, required, preferred) = node_affinity_paths("object");
    let terms = format!("{required}.nodeSelectorTerms");
    let affinity = format!("has(object.spec.affinity) && has({node_affinity})");
    let rule = |expression: String, bound: Bound| {
        let message = format!(
            "{} may have at most {} items: berth bounds what one pod may make berth and \
             the apiserver do",
            bound.field, bound.most
        );
        json!({"expression": expression, "message": message, "reason": "Forbidden"})
    };
    // Lists over their own bound are refused by their own rule and not walked here.
    let requirements = format!(
        "!({affinity}) || ((!has({required}) || !has({terms}) || size({terms}) > {} || {}) && \
         (!has({preferred}) || size({preferred}) > {} || {}))",
        REQUIRED_TERMS.most,
        each_term_within(&terms, ""),
        PREFERRED_TERMS.most,
        each_term_within(&preferred, ".preference"),
    );
    policy(
        "berth-limits",
        json!({
            "failurePolicy": "Fail",
            "matchConstraints": {
                "resourceRules": [{"apiGroups": [""], "apiVersions": ["v1"],
                    "operations": ["CREATE", "UPDATE"], "resources": ["pods"]}],
                "namespaceSelector": namespace_selector(berth_user),
            },
            "matchConditions": [not_from_nodes()],
            "validations": [
                rule(at_most("object.metadata", "labels", LABELS), LABELS),
                rule(at_most("object.metadata", "ownerReferences", OWNER_REFERENCES), OWNER_REFERENCES),
                rule(at_most("object.spec", "tolerations", TOLERATIONS), TOLERATIONS),
                rule(at_most("object.spec", "schedulingGates", SCHEDULING_GATES), SCHEDULING_GATES),
                rule(
                    format!("{} && {}", at_most("object.spec", "containers", CONTAINERS),
                        at_most("object.spec", "initContainers", CONTAINERS)),
                    CONTAINERS,
                ),
                rule(
                    format!("!({affinity}) || !has({required}) || {}",
                        at_most(&required, "nodeSelectorTerms", REQUIRED_TERMS)),
                    REQUIRED_TERMS,
                ),
                rule(
                    format!("!({affinity}) || {}",
                        at_most(&node_affinity, "preferredDuringSchedulingIgnoredDuringExecution", PREFERRED_TERMS)),
                    PREFERRED_TERMS,
                ),
                rule(requirements, TERM_REQUIREMENTS),
            ],
        }),
    )
}

/// `object` (or `oldObject`) has a toleration of berth's pool key that could
/// tolerate the param pool's taint: `Exists`, the pool's name, or a comparison
/// (`Gt`, `Lt`), which berth never grants and which a numeric pool name would
/// satisfy ([`crate::placement::entitlement::Breach::Toleration`]).
fn pool_toleration(o: &str) -> String {
    format!(
        "(has({o}.spec.tolerations) && {o}.spec.tolerations.exists(t, has(t.key) && t.key == '{POOL_TAINT}' && \
         ((has(t.operator) && t.operator in ['Exists', 'Gt', 'Lt']) || (has(t.value) && t.value == params.metadata.name))))"
    )
}

/// `o` tolerates every taint of the param pool's effect.
fn wildcard(o: &str) -> String {
    format!(
        "(has({o}.spec.tolerations) && {o}.spec.tolerations.exists(t, (!has(t.key) || t.key == '') && \
         has(t.operator) && t.operator == 'Exists' && (!has(t.effect) || t.effect == '' || \
         t.effect == (has(params.spec.pool.effect) ? params.spec.pool.effect : 'NoSchedule'))))"
    )
}

/// `o` cannot land on the param pool: it names another node, or every required
/// term keeps off the pool (an empty term matches nothing; a term names only other
/// nodes; or it excludes the pool's label).
fn kept_off(o: &str) -> String {
    let required =
        format!("{o}.spec.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution");
    format!(
        "((has({o}.spec.nodeName) && !({o}.spec.nodeName in variables.poolNodes)) || \
         (has({o}.spec.affinity) && has({o}.spec.affinity.nodeAffinity) && has({required}) && \
          size({required}.nodeSelectorTerms) > 0 && {required}.nodeSelectorTerms.all(t, \
           ((!has(t.matchExpressions) || size(t.matchExpressions) == 0) && (!has(t.matchFields) || size(t.matchFields) == 0)) || \
           (has(t.matchExpressions) && t.matchExpressions.exists(e, e.key == '{POOL_LABEL}' && has(e.values) && \
             ((e.operator == 'NotIn' && params.metadata.name in e.values) || (e.operator == 'In' && !(params.metadata.name in e.values))))) || \
           (has(t.matchFields) && t.matchFields.exists(f, f.key == 'metadata.name' && f.operator == 'In' && \
             has(f.values) && f.values.all(v, !(v in variables.poolNodes)))))))"
    )
}

/// A binding's `spec.paramRef` for every PlacementPolicy; none means no rule.
fn every_policy() -> Value {
    json!({"selector": {}, "parameterNotFoundAction": "Allow"})
}

/// Namespaces the shipped admission configurations leave alone: the system's and
/// berth's own (from its ServiceAccount's username).
pub(super) fn namespace_selector(berth_user: &str) -> Value {
    let own = berth_user
        .strip_prefix("system:serviceaccount:")
        .and_then(|rest| rest.split(':').next())
        .unwrap_or(BERTH_NAMESPACE);
    Exempt::new(SYSTEM_NAMESPACES, own).pod_selector()
}

/// Skips requests from nodes (the kubelets' mirror pods), told by identity: the
/// username `system:node:<name>` in the group `system:nodes`, as the Node
/// authorizer knows them, not by the group alone. `manifests/webhooks.yaml` uses
/// the same expression (a test keeps them equal).
pub const NOT_FROM_NODES: &str = "!(request.userInfo.username.startsWith('system:node:') && 'system:nodes' in request.userInfo.groups)";

/// The request comes from one of kube-controller-manager's controllers
/// ([`crate::placement::records::is_kube_controller`]).
const KUBE_CONTROLLER: &str = "request.userInfo.username.startsWith('system:serviceaccount:kube-system:') || \
                               request.userInfo.username == 'system:kube-controller-manager'";

pub(super) fn not_from_nodes() -> Value {
    json!({"name": "not-from-nodes", "expression": NOT_FROM_NODES})
}

fn policy(name: &str, spec: Value) -> Value {
    json!({"apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingAdmissionPolicy",
        "metadata": {"name": name}, "spec": spec})
}

fn binding(name: &str, param_ref: Option<Value>) -> Value {
    let mut spec = json!({"policyName": name, "validationActions": ["Deny"]});
    if let Some(param_ref) = param_ref {
        spec["paramRef"] = param_ref;
    }
    json!({"apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingAdmissionPolicyBinding",
        "metadata": {"name": name}, "spec": spec})
}

fn params() -> Value {
    json!({"apiVersion": format!("{GROUP}/v1alpha1"), "kind": "PlacementPolicy"})
}

/// The variable `daemonSetPod`: the DaemonSet controller sends the pod and its
/// controller ownerReference is an `apps/v1` DaemonSet
/// ([`crate::placement::pod::PodObject::is_daemonset_pod`]).
pub(super) fn daemonset_pod() -> Value {
    variable(
        "daemonSetPod",
        format!(
            "request.userInfo.username in {} && has(object.metadata.ownerReferences) && \
             object.metadata.ownerReferences.exists(o, has(o.controller) && o.controller && \
             o.kind == 'DaemonSet' && o.apiVersion == 'apps/v1')",
            list(&DAEMONSET_CONTROLLER_USERS)
        ),
    )
}

/// `berth-pools`.
fn pools(berth_user: &str) -> Value {
    let mut variables = pool_variables();
    variables.extend([
        daemonset_pod(),
        variable(
            "takesDaemonSet",
            // Without daemonSetNamespaces: the system's DaemonSets and those of the
            // namespaces that opt in (CompiledPolicy::takes_daemonsets_from).
            format!(
                "has(params.spec.pool) && (!has(params.spec.pool.daemonSets) || params.spec.pool.daemonSets == 'Tolerate') && \
                 (has(params.spec.pool.daemonSetNamespaces) ? (namespaceObject != null && \
                  has(namespaceObject.metadata.labels) && {}) : \
                  (variables.optedIn || request.namespace in {}))",
                selector_matches("params.spec.pool.daemonSetNamespaces", "namespaceObject.metadata.labels"),
                list(&SYSTEM_DAEMONSET_NAMESPACES)
            ),
        ),
        variable(
            "bound",
            "variables.dedicated && !(variables.optedIn || (variables.daemonSetPod && variables.takesDaemonSet))".into(),
        ),
        variable("create", "request.operation == 'CREATE'".into()),
    ]);
    let pool = "' + params.metadata.name + '";
    let namespace = "' + request.namespace + '";
    policy(
        "berth-pools",
        json!({
            "failurePolicy": "Fail",
            "paramKind": params(),
            "matchConstraints": {
                "resourceRules": [{"apiGroups": [""], "apiVersions": ["v1"],
                    "operations": ["CREATE", "UPDATE"], "resources": ["pods"]}],
                "namespaceSelector": namespace_selector(berth_user),
            },
            // Most pods carry neither a pool or wildcard toleration nor a node name:
            // they skip the rules at the cost of one short expression.
            // A pod over berth's bounds is berth-limits' to refuse: this policy, run
            // once per PlacementPolicy, never walks its lists.
            "matchConditions": [not_from_nodes(), {"name": "could-reach-a-pool", "expression": format!(
                "{} && (request.operation != 'UPDATE' || {}) && (has(object.spec.nodeName) || \
                 (has(object.spec.tolerations) && object.spec.tolerations.exists(t, \
                 !has(t.key) || t.key == '' || t.key == '{POOL_TAINT}')))",
                within_bounds("object"), within_bounds("oldObject"))}],
            "variables": variables,
            "validations": [
                {
                    "expression": format!(
                        "!variables.bound || !{} || (!variables.create && {})",
                        pool_toleration("object"), pool_toleration("oldObject")
                    ),
                    "messageExpression": format!(
                        "'the pod tolerates {POOL_TAINT}={pool}, but namespace {namespace} does not opt into that pool'"
                    ),
                    "reason": "Forbidden",
                },
                {
                    "expression": "!variables.bound || !variables.create || !has(object.spec.nodeName) || \
                                   !(object.spec.nodeName in variables.poolNodes)",
                    "messageExpression": format!(
                        "'spec.nodeName ' + object.spec.nodeName + ' is in dedicated pool {pool}, which namespace {namespace} does not opt into'"
                    ),
                    "reason": "Forbidden",
                },
                {
                    "expression": format!(
                        "!variables.bound || !{w} || {k} || (!variables.create && {wo} && !{ko})",
                        w = wildcard("object"),
                        k = kept_off("object"),
                        wo = wildcard("oldObject"),
                        ko = kept_off("oldObject"),
                    ),
                    "messageExpression": format!(
                        "'the pod tolerates every taint but does not keep off dedicated pool {pool} \
                         (a required {POOL_LABEL} NotIn term, which berth adds while it runs)'"
                    ),
                    "reason": "Forbidden",
                },
            ],
        }),
    )
}

/// `berth-queues`: a pod may name a queue class of a policy only from a namespace
/// that opts into that policy (checked once per PlacementPolicy, its `paramKind`):
/// the classes order queues above other pods, and are the policies' to hand out.
fn queues(berth_user: &str) -> Value {
    let class = "object.spec.priorityClassName";
    let own = format!("'{QUEUE_CLASS_PREFIX}' + params.metadata.name + '-'");
    policy(
        "berth-queues",
        json!({
            "failurePolicy": "Fail",
            "paramKind": params(),
            "matchConstraints": {
                "resourceRules": [{"apiGroups": [""], "apiVersions": ["v1"],
                    "operations": ["CREATE"], "resources": ["pods"]}],
                "namespaceSelector": namespace_selector(berth_user),
            },
            "matchConditions": [not_from_nodes(), {"name": "names-a-queue-class", "expression": format!(
                "has({class}) && {class}.startsWith('{QUEUE_CLASS_PREFIX}')")}],
            "variables": pool_variables(),
            "validations": [{
                "expression": format!(
                    "!{class}.startsWith({own}) || !{class}.substring(size({own})).matches('^(0|[1-9][0-9]*)$') || \
                     variables.optedIn"
                ),
                "messageExpression": format!(
                    "'PriorityClass ' + {class} + ' orders policy ' + params.metadata.name + \
                     '\\'s queue, which namespace ' + request.namespace + ' does not opt into'"
                ),
                "reason": "Forbidden",
            }],
        }),
    )
}

/// `berth-holds`: at CREATE, a pod whose `berth.io/applied` names an `avoid`
/// policy (checked once per PlacementPolicy, its `paramKind`) carries the gate
/// `berth.io/avoid`, as berth always gives it
/// ([`crate::placement::records::unheld_record`]). DaemonSet pods are never held.
fn holds(berth_user: &str) -> Value {
    let annotations = "object.metadata.annotations";
    let gates = "object.spec.schedulingGates";
    policy(
        "berth-holds",
        json!({
            "failurePolicy": "Fail",
            "paramKind": params(),
            "matchConstraints": {
                "resourceRules": [{"apiGroups": [""], "apiVersions": ["v1"],
                    "operations": ["CREATE"], "resources": ["pods"]}],
                "namespaceSelector": namespace_selector(berth_user),
            },
            // Only pods with a record are looked at; a pod over berth's bounds is
            // berth-limits' to refuse, and its gates are not walked here.
            "matchConditions": [not_from_nodes(), {"name": "has-a-record", "expression": format!(
                "has({annotations}) && '{APPLIED_ANNOTATION}' in {annotations} && {}",
                within_bounds("object"))}],
            "variables": [daemonset_pod()],
            "validations": [{
                "expression": format!(
                    "!has(params.spec.avoid) || variables.daemonSetPod || \
                     !(params.metadata.name in {annotations}['{APPLIED_ANNOTATION}'].split(',').map(n, n.trim())) || \
                     (has({gates}) && {gates}.exists(g, g.name == '{AVOID_GATE}'))"
                ),
                "messageExpression": format!(
                    "'{APPLIED_ANNOTATION} names policy ' + params.metadata.name + ', which holds its pods \
                     with the scheduling gate {AVOID_GATE}; the pod does not carry it (only berth writes the record)'"
                ),
                "reason": "Forbidden",
            }],
        }),
    )
}

/// `berth-podgroups`: PodGroups named `berth-*` are berth's (its gangs'), written
/// by nobody else but Kubernetes' own controllers (which add and remove their
/// protection finalizer and delete what a namespace leaves behind). A tenant could
/// otherwise make its gang's PodGroup first, or lower its `minCount`, and the gang
/// would no longer be all or nothing.
fn podgroups(berth_user: &str) -> Value {
    let name = "(request.operation == 'CREATE' ? object : oldObject).metadata.name";
    policy(
        "berth-podgroups",
        json!({
            "failurePolicy": "Fail",
            "matchConstraints": {
                "resourceRules": [{"apiGroups": ["scheduling.k8s.io"], "apiVersions": ["*"],
                    "operations": ["CREATE", "UPDATE", "DELETE"], "resources": ["podgroups"]}],
                "namespaceSelector": namespace_selector(berth_user),
            },
            "matchConditions": [
                {"name": "not-berth-or-kubernetes", "expression": format!(
                    "request.userInfo.username != '{berth_user}' && !({KUBE_CONTROLLER})")},
            ],
            "validations": [{
                "expression": format!("!{name}.startsWith('{POD_GROUP_PREFIX}')"),
                "messageExpression": format!(
                    "'PodGroup ' + {name} + ' is berth\\'s: names beginning {POD_GROUP_PREFIX} are its gangs\\' \
                     PodGroups, which only berth writes'"
                ),
                "reason": "Forbidden",
            }],
        }),
    )
}

/// `berth-bindings`.
fn bindings(berth_user: &str) -> Value {
    policy(
        "berth-bindings",
        json!({
            "failurePolicy": "Fail",
            "paramKind": params(),
            "matchConstraints": {
                // `pods/binding` and the older `bindings` resource bind alike.
                "resourceRules": [{"apiGroups": [""], "apiVersions": ["v1"],
                    "operations": ["CREATE"], "resources": ["pods/binding", "bindings"]}],
                "namespaceSelector": namespace_selector(berth_user),
            },
            // kube-scheduler binds every pod: it never pays for this policy.
            "matchConditions": [{"name": "not-the-scheduler",
                "expression": "request.userInfo.username != 'system:kube-scheduler'"}],
            "variables": pool_variables(),
            "validations": [{
                "expression": "!variables.dedicated || variables.optedIn || !(object.target.name in variables.poolNodes)",
                "messageExpression": "'binding to ' + object.target.name + ' refused: it is in dedicated pool ' + \
                    params.metadata.name + ', which namespace ' + request.namespace + ' does not opt into'",
                "reason": "Forbidden",
            }],
        }),
    )
}

/// `berth-records`: what only berth (or Kubernetes' controllers) changes on a pod.
fn records(berth_user: &str) -> Value {
    let applied = |o: &str| {
        format!(
            "(has({o}.metadata.annotations) && '{APPLIED_ANNOTATION}' in {o}.metadata.annotations ? \
             {o}.metadata.annotations['{APPLIED_ANNOTATION}'] : '')"
        )
    };
    let controllers = |o: &str| {
        format!(
            "(has({o}.metadata.ownerReferences) ? {o}.metadata.ownerReferences.filter(r, has(r.controller) && r.controller)\
             .map(r, r.apiVersion + '/' + r.kind + '/' + r.name + '/' + r.uid) : [])"
        )
    };
    policy(
        "berth-records",
        json!({
            "failurePolicy": "Fail",
            "matchConstraints": {
                // The status subresource writes metadata too.
                "resourceRules": [{"apiGroups": [""], "apiVersions": ["v1"],
                    "operations": ["UPDATE"], "resources": ["pods", "pods/status"]}],
                "namespaceSelector": namespace_selector(berth_user),
            },
            "matchConditions": [
                not_from_nodes(),
                {"name": "not-berth", "expression": format!("request.userInfo.username != '{berth_user}'")},
                // A pod over berth's bounds is berth-limits' to refuse; its gates are
                // then not compared pair by pair.
                {"name": "within-bounds", "expression": format!("{} && {}",
                    within_bounds("object"), within_bounds("oldObject"))},
            ],
            "validations": [
                {
                    "expression": format!("{} == {}", applied("object"), applied("oldObject")),
                    "message": format!("{APPLIED_ANNOTATION} is berth's record of what it applied; only berth sets it"),
                    "reason": "Forbidden",
                },
                {
                    "expression": format!(
                        "!has(oldObject.spec.schedulingGates) || oldObject.spec.schedulingGates.all(g, \
                         !g.name.startsWith('{GATE_PREFIX}') || (has(object.spec.schedulingGates) && \
                         object.spec.schedulingGates.exists(n, n.name == g.name)))"
                    ),
                    "message": format!("scheduling gates {GATE_PREFIX}* are berth's; only berth removes them"),
                    "reason": "Forbidden",
                },
                {
                    "expression": format!(
                        "{KUBE_CONTROLLER} || {} == {}",
                        controllers("object"), controllers("oldObject")
                    ),
                    "message": "a pod's controller ownerReference is set by its controller, not changed afterwards",
                    "reason": "Forbidden",
                },
            ],
        }),
    )
}

/// The ValidatingAdmissionPolicies and their bindings, as multi-document YAML.
/// `berth_user` is berth's identity (its ServiceAccount's username).
pub fn manifests(berth_user: &str) -> String {
    let header = "# Generated by `berth admission-policy`; do not edit by hand (a test checks it).\n\
                  # berth's structural rules as ValidatingAdmissionPolicies: CEL run in the\n\
                  # apiserver with failurePolicy Fail, so they hold while berth is down.\n";
    let documents = [
        limits(berth_user),
        binding("berth-limits", None),
        pools(berth_user),
        binding("berth-pools", Some(every_policy())),
        bindings(berth_user),
        binding("berth-bindings", Some(every_policy())),
        queues(berth_user),
        binding("berth-queues", Some(every_policy())),
        holds(berth_user),
        binding("berth-holds", Some(every_policy())),
        podgroups(berth_user),
        binding("berth-podgroups", None),
        records(berth_user),
        binding("berth-records", None),
    ];
    as_yaml(header, &documents)
}

/// `documents` as multi-document YAML after `header`, as the generated manifests
/// are written.
pub(super) fn as_yaml(header: &str, documents: &[Value]) -> String {
    let yaml: Vec<String> = documents
        .iter()
        .map(|d| serde_yaml_ng::to_string(d).unwrap_or_default())
        .collect();
    format!("{header}{}", yaml.join("---\n"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_rules_name_berths_identities_and_keys() {
        let yaml = manifests("system:serviceaccount:berth-system:berth");
        assert!(yaml.contains("system:serviceaccount:kube-system:daemon-set-controller"));
        assert!(
            yaml.contains(
                "request.userInfo.username != 'system:serviceaccount:berth-system:berth'"
            )
        );
        assert!(yaml.contains(POOL_LABEL) && yaml.contains(POOL_TAINT));
        assert_eq!(
            yaml.matches("kind: ValidatingAdmissionPolicyBinding")
                .count(),
            7
        );
        let elsewhere = manifests("system:serviceaccount:platform:placer");
        assert!(elsewhere.contains("- platform") && !elsewhere.contains("- berth-system"));
        for document in yaml.split("---\n") {
            let _: Value = serde_yaml_ng::from_str(document).expect("each document is YAML");
        }
    }
}
