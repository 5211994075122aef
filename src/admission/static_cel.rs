//! berth's static placement as a MutatingAdmissionPolicy the apiserver runs
//! itself, so that pods are placed while every berth replica is down (SPEC
//! "Placement that holds with berth down"). `berth admission-policy --placement`
//! prints it; `manifests/placement-policy.yaml` is that output.
//!
//! `berth-placement` takes the one
//! [`StaticPlacement`](crate::placement::static_placement) object as its params and
//! gives a pod at CREATE what the webhook would: the pools' tolerations and
//! requirements ANDed into every term, the preferences, the scheduler and
//! `berth.io/applied`. It runs before the webhook, which then finds nothing to
//! change, and decides alone where the two views differ (a policy edited a moment
//! ago); with the webhook down, it is the placement.
//!
//! `failurePolicy: Fail`: a mutation the apiserver cannot apply refuses the pod
//! with the reason, rather than admit it without its placement in silence (with
//! `Ignore`, a failed mutation is skipped and nothing says so). What could fail
//! is bounded: the CEL is walked only for pods within berth's bounds and with at
//! most [`MOST_IMAGES`] images, its params are berth's own, and without them the
//! policy does nothing.
//!
//! It leaves to the webhook what it cannot decide the webhook's way: a pod of a
//! DaemonSet, one naming its node, a queue class or a berth gate, one whose images
//! the CEL below cannot normalise, one of a namespace whose berth annotations CEL
//! cannot read, one a webhook-only policy applies to or avoids, and one that brings
//! a pool toleration it is not entitled to (the webhook removes it with a warning
//! the user sees). Each is then
//! as it was before: the webhook decides it, or with berth down it is admitted
//! as sent (the ValidatingAdmissionPolicies still keep it off pools it is not
//! entitled to) and the missed scan finds it.
//!
//! The patch is one JSONPatch mutation, so that it applies whole or not at all,
//! written as the webhook's patch is ([`crate::placement::patch`]): items
//! compared by meaning, berth's own items removed unless still wanted, each list
//! item added on its own (never a list of `Object{}` initializers, which the
//! request handlers of 1.36.0 to 1.36.3 panic on), and every value built from
//! scalars (a map taken whole from params cannot be converted to JSON).

use serde_json::{Value, json};

use super::cel::{
    as_yaml, daemonset_pod, namespace_selector, not_from_nodes, selector_matches, variable,
    within_bounds,
};
use crate::names::{
    ANCHOR_LABEL_PREFIX, APPLIED_ANNOTATION, GATE_PREFIX, GROUP, IMAGES_ANNOTATION_PREFIX,
    MAX_POLICY_NAME, PLACED_LABEL_PREFIX, POLICIES_ANNOTATION, POOL_LABEL, POOL_TAINT,
    QUEUE_CLASS_PREFIX, SCHEDULER_ANNOTATION,
};
use crate::placement::static_placement::STATIC_PLACEMENT_NAME;
use crate::policy::image_cel::normalised_image_cel;

pub use crate::names::PLACEMENT_POLICY;
/// The most distinct images a pod may have for the apiserver to decide it: each
/// is matched against each policy's regex, and CEL's cost must stay within its
/// budget for any pod within berth's bounds. A pod with more is the webhook's.
pub const MOST_IMAGES: usize = 16;

/// A DNS-1123 subdomain, as RE2 (length checked apart).
const SUBDOMAIN: &str = "[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*";

const AFFINITY: &str = "/spec/affinity";
const NODE_AFFINITY: &str = "/spec/affinity/nodeAffinity";
const REQUIRED: &str = "/spec/affinity/nodeAffinity/requiredDuringSchedulingIgnoredDuringExecution";
const PREFERRED: &str =
    "/spec/affinity/nodeAffinity/preferredDuringSchedulingIgnoredDuringExecution";
/// CEL's names for the types of what the patch adds.
const REQUIREMENT_TYPE: &str = "Object.spec.affinity.nodeAffinity.\
     requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms.matchExpressions";
const TERM_TYPE: &str = "Object.spec.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms";
const PREFERRED_TYPE: &str =
    "Object.spec.affinity.nodeAffinity.preferredDuringSchedulingIgnoredDuringExecution";

/// `key` as a JSON Pointer token.
fn escaped(key: &str) -> String {
    key.replace('~', "~0").replace('/', "~1")
}

/// A JSONPatch operation, CEL.
fn op(op: &str, path: &str, value: Option<&str>) -> String {
    match value {
        Some(value) => format!("JSONPatch{{op: '{op}', path: {path}, value: {value}}}"),
        None => format!("JSONPatch{{op: '{op}', path: {path}}}"),
    }
}

/// A CEL string literal of a path.
fn path(p: &str) -> String {
    format!("'{p}'")
}

/// `o.field` or `default` when absent.
fn or(o: &str, field: &str, default: &str) -> String {
    format!("(has({o}.{field}) ? {o}.{field} : {default})")
}

/// Whether two node requirements mean the same (SPEC "Compared by meaning"):
/// key, operator, and values in any order. `b` is one of berth's, with `values`
/// always set (a list, maybe empty).
fn same_requirement(a: &str, b: &str) -> String {
    format!(
        "({a}.key == {b}.key && {a}.operator == {b}.operator && {}.sort() == {b}.values.sort())",
        or(a, "values", "[]")
    )
}

/// Whether two tolerations mean the same: absent key, value and effect as empty,
/// no operator as `Equal`, and the same seconds.
fn same_toleration(a: &str, b: &str) -> String {
    let text = |t: &str, f: &str| or(t, f, "''");
    let operator =
        |t: &str| format!("(has({t}.operator) && {t}.operator != '' ? {t}.operator : 'Equal')");
    let seconds = |t: &str| {
        format!("(has({t}.tolerationSeconds) ? 's' + string({t}.tolerationSeconds) : '')")
    };
    format!(
        "({} == {} && {} == {} && {} == {} && {} == {} && {} == {})",
        text(a, "key"),
        text(b, "key"),
        operator(a),
        operator(b),
        text(a, "value"),
        text(b, "value"),
        text(a, "effect"),
        text(b, "effect"),
        seconds(a),
        seconds(b)
    )
}

/// Whether the pod's preferred term `p` is berth's preference `w` (weight and one
/// requirement).
fn same_preference(p: &str, w: &str) -> String {
    format!(
        "({p}.weight == {w}.weight && has({p}.preference.matchExpressions) && \
         size({p}.preference.matchExpressions) == 1 && \
         (!has({p}.preference.matchFields) || size({p}.preference.matchFields) == 0) && {})",
        same_requirement(&format!("{p}.preference.matchExpressions[0]"), w)
    )
}

/// Whether a node key is one berth derives ([`crate::names::is_owned_node_key`]).
fn owned_node_key(k: &str) -> String {
    format!(
        "({k} == '{POOL_LABEL}' || {k}.startsWith('{ANCHOR_LABEL_PREFIX}') || \
         {k}.startsWith('{PLACED_LABEL_PREFIX}'))"
    )
}

/// Whether the term `t` is empty: it matches no node, and stays so.
fn empty_term(t: &str) -> String {
    format!(
        "((!has({t}.matchExpressions) || size({t}.matchExpressions) == 0) && \
         (!has({t}.matchFields) || size({t}.matchFields) == 0))"
    )
}

/// berth's requirement `w` (a map with `values` a list) as the pod's type: no
/// `values` when empty, as the apiserver stores it.
fn requirement_value(w: &str, type_name: &str) -> String {
    format!(
        "(size({w}.values) > 0 ? {type_name}{{key: {w}.key, operator: {w}.operator, values: {w}.values}} : \
         {type_name}{{key: {w}.key, operator: {w}.operator}})"
    )
}

/// A requirement from params as a map of scalars and a list of strings.
fn requirement_map(r: &str) -> String {
    format!(
        "{{'key': dyn({r}.key), 'operator': dyn({r}.operator), \
         'values': dyn(has({r}.values) ? {r}.values.map(v, string(v)) : [])}}"
    )
}

/// Of list `l`, the items not equal (`same`) to an earlier one.
fn distinct_by(l: &str, same: impl Fn(&str, &str) -> String) -> String {
    format!(
        "lists.range(size({l})).filter(i, !lists.range(i).exists(j, {})).map(i, {l}[i])",
        same(&format!("{l}[j]"), &format!("{l}[i]"))
    )
}

/// The variables both policies use: which policies apply to the pod, and whether
/// the apiserver can decide it the webhook's way.
fn decision_variables() -> Vec<Value> {
    let annotations = "variables.annotations";
    let image_key = |p: &str| format!("'{IMAGES_ANNOTATION_PREFIX}' + {p}.name");
    // The regex of a policy's images in this namespace: its override, or its own;
    // '' for every pod.
    let regex = |p: &str| {
        format!(
            "({key} in {annotations} ? params.spec.imageOverrides[{annotations}[{key}]] : {own})",
            key = image_key(p),
            own = or(p, "images", "''")
        )
    };
    let policy_list = format!("^\\\\s*({SUBDOMAIN}(\\\\s*,\\\\s*{SUBDOMAIN})*)?\\\\s*$");
    let scheduler = format!("^\\\\s*{SUBDOMAIN}\\\\s*$");
    vec![
        variable(
            "annotations",
            "namespaceObject != null && has(namespaceObject.metadata.annotations) ? \
             namespaceObject.metadata.annotations : {}"
                .into(),
        ),
        variable(
            "namespaceLabels",
            "namespaceObject != null && has(namespaceObject.metadata.labels) ? \
             namespaceObject.metadata.labels : {}"
                .into(),
        ),
        variable(
            "named",
            format!(
                "'{POLICIES_ANNOTATION}' in {annotations} ? \
                 {annotations}['{POLICIES_ANNOTATION}'].split(',').map(n, n.trim()) : []"
            ),
        ),
        // The namespace's berth annotations read as the webhook reads them
        // (`NamespaceConfig`), in a stricter form: whitespace is ASCII, and an
        // image override is one the controller compiled. Anything else is the
        // webhook's to judge.
        variable(
            "namespaceReadable",
            format!(
                "{annotations}.all(k, !k.startsWith('berth.io/') || \
                 (k == '{POLICIES_ANNOTATION}' ? ({annotations}[k].matches('{policy_list}') && \
                   variables.named.all(n, size(n) <= {MAX_POLICY_NAME})) : \
                  k == '{SCHEDULER_ANNOTATION}' ? ({annotations}[k].matches('{scheduler}') && \
                   size({annotations}[k].trim()) <= 253) : \
                  k.startsWith('{IMAGES_ANNOTATION_PREFIX}') ? \
                   (k.substring({prefix}).matches('^{SUBDOMAIN}$') && size(k) <= {longest} && \
                    {annotations}[k] in params.spec.imageOverrides && \
                    params.spec.imageOverrides[{annotations}[k]] != '') : false))",
                prefix = IMAGES_ANNOTATION_PREFIX.len(),
                longest = IMAGES_ANNOTATION_PREFIX.len() + MAX_POLICY_NAME,
            ),
        ),
        variable(
            "podLabels",
            "has(object.metadata.labels) ? object.metadata.labels : {}".into(),
        ),
        variable(
            "images",
            format!(
                "({} + {}).map(c, has(c.image) ? c.image : '').map(i, {}).distinct()",
                or("object.spec", "containers", "[]"),
                or("object.spec", "initContainers", "[]"),
                normalised_image_cel("i")
            ),
        ),
        variable(
            "decidable",
            format!(
                "variables.namespaceReadable && !{null_terms} && {bounds} && \
                 size(variables.images) <= {MOST_IMAGES} && \
                 !variables.images.exists(i, i == '') && \
                 !(has(object.spec.nodeName) && object.spec.nodeName != '') && \
                 !(has(object.spec.priorityClassName) && \
                   object.spec.priorityClassName.startsWith('{QUEUE_CLASS_PREFIX}')) && \
                 !(has(object.spec.schedulingGates) && \
                   object.spec.schedulingGates.exists(g, g.name.startsWith('{GATE_PREFIX}')))",
                // `nodeSelectorTerms: null` (which the apiserver refuses) is
                // there and null: the bounds could not size it.
                null_terms = "(has(object.spec.affinity) && has(object.spec.affinity.nodeAffinity) && \
                    has(object.spec.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution) && \
                    has(object.spec.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms) && \
                    object.spec.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms == null)",
                bounds = within_bounds("object"),
            ),
        ),
        variable(
            "optedIn",
            format!(
                "params.spec.policies.filter(p, p.name in variables.named || \
                 (has(p.namespaceSelector) && {}))",
                selector_matches("p.namespaceSelector", "variables.namespaceLabels")
            ),
        ),
        variable(
            "applied",
            format!(
                "variables.optedIn.filter(p, (has(p.coscheduled) && {cosched}) || \
                 ((!has(p.podSelector) || {pods}) && \
                  ({regex} == '' || variables.images.exists(i, i.matches({regex})))))",
                cosched = selector_matches("p.coscheduled", "variables.podLabels"),
                pods = selector_matches("p.podSelector", "variables.podLabels"),
                regex = regex("p"),
            ),
        ),
        variable("appliedNames", "variables.applied.map(p, p.name)".into()),
        variable(
            "webhookOnly",
            format!(
                "variables.applied.exists(p, has(p.webhookOnly)) || \
                 params.spec.policies.exists(p, has(p.avoids) && {})",
                selector_matches("p.avoids", "variables.podLabels")
            ),
        ),
    ]
}

/// Operations for one part of the patch, CEL: the mutation's expression lists
/// them (the type `JSONPatch` exists only there, not in variables).
struct OpList {
    expression: String,
}

/// `name` says what the operations are for, to the reader of this file.
fn op_list(_name: &'static str, expression: String) -> Part {
    Part::Ops(OpList { expression })
}

/// A variable, or a list of operations.
enum Part {
    Variable(Value),
    Ops(OpList),
}

fn var(name: &str, expression: String) -> Part {
    Part::Variable(variable(name, expression))
}

/// The variables of the patch (what berth wants, what the pod has) and the
/// operations for each part, in order.
fn patch_parts() -> Vec<Part> {
    let tolerations = "variables.tolerations";
    let wanted_tolerations = "variables.wantedTolerations";
    let terms = "variables.terms";
    let wanted_required = "variables.wantedRequired";
    let preferred = "variables.preferred";
    let wanted_preferred = "variables.wantedPreferred";
    let node_affinity = "object.spec.affinity.nodeAffinity";
    let applied_value = "variables.appliedNames.join(',')";
    let applied_key = escaped(APPLIED_ANNOTATION);
    vec![
        var("tolerations", or("object.spec", "tolerations", "[]")),
        var(
            "wantedTolerations",
            "variables.applied.filter(p, has(p.toleration)).map(p, p.toleration)".into(),
        ),
        // A pool toleration the pod brings and is not entitled to: the webhook
        // removes it with a warning the user sees, which only it can give, so the
        // pod is left to it.
        var(
            "forged",
            format!(
                "{tolerations}.exists(t, has(t.key) && t.key == '{POOL_TAINT}' && \
                 !{wanted_tolerations}.exists(w, {}))",
                same_toleration("t", "w")
            ),
        ),
        // Whether this policy places the pod, the webhook's way.
        var(
            "places",
            "variables.decidable && !variables.webhookOnly && !variables.forged".into(),
        ),
        // berth's tolerations the pod has and berth no longer wants (or has twice),
        // highest index first, and those it wants and lacks.
        op_list(
            "tolerationOps",
            format!(
                "(size({missing}) > 0 && !has(object.spec.tolerations) ? \
                   [{create}] : []) + \
                 lists.range(size({tolerations})).filter(i, \
                   has({tolerations}[i].key) && {tolerations}[i].key == '{POOL_TAINT}' && \
                   (!{wanted_tolerations}.exists(w, {same_iw}) || \
                    lists.range(i).exists(j, {same_ij}))).reverse().map(i, {remove}) + \
                 {missing}.map(w, {append})",
                missing = format!(
                    "{wanted_tolerations}.filter(w, !{tolerations}.exists(t, {}))",
                    same_toleration("t", "w")
                ),
                create = op("add", &path("/spec/tolerations"), Some("[]")),
                same_iw = same_toleration(&format!("{tolerations}[i]"), "w"),
                same_ij =
                    same_toleration(&format!("{tolerations}[j]"), &format!("{tolerations}[i]")),
                remove = op("remove", "'/spec/tolerations/' + string(i)", None),
                append = op(
                    "add",
                    &path("/spec/tolerations/-"),
                    Some(
                        "Object.spec.tolerations{key: w.key, operator: w.operator, value: w.value, effect: w.effect}"
                    )
                ),
            ),
        ),
        var(
            "hasRequired",
            format!(
                "has(object.spec.affinity) && has({node_affinity}) && \
                 has({node_affinity}.requiredDuringSchedulingIgnoredDuringExecution)"
            ),
        ),
        var(
            "terms",
            format!(
                "variables.hasRequired ? {} : []",
                or(
                    &format!("{node_affinity}.requiredDuringSchedulingIgnoredDuringExecution"),
                    "nodeSelectorTerms",
                    "[]"
                )
            ),
        ),
        var(
            "hasPreferred",
            format!(
                "has(object.spec.affinity) && has({node_affinity}) && \
                 has({node_affinity}.preferredDuringSchedulingIgnoredDuringExecution)"
            ),
        ),
        var(
            "preferred",
            format!(
                "variables.hasPreferred ? \
                 {node_affinity}.preferredDuringSchedulingIgnoredDuringExecution : []"
            ),
        ),
        var(
            "requiredPools",
            "variables.applied.filter(p, has(p.requiredPool) && p.requiredPool).map(p, p.name)"
                .into(),
        ),
        // The dedicated pools a wildcard toleration of the pod would reach.
        var(
            "excludedPools",
            format!(
                "params.spec.policies.filter(p, has(p.dedicatedEffect) && \
                 !(p.name in variables.appliedNames) && {tolerations}.exists(t, \
                 (!has(t.key) || t.key == '') && has(t.operator) && t.operator == 'Exists' && \
                 (!has(t.effect) || t.effect == '' || t.effect == p.dedicatedEffect))).map(p, p.name)"
            ),
        ),
        // Required pools as one `In` (a node carries one pool label), each policy's
        // own requirements, and the exclusion of dedicated pools a wildcard
        // toleration would reach.
        var(
            "requiredAll",
            format!(
                "(size(variables.requiredPools) > 0 ? [{{'key': dyn('{POOL_LABEL}'), 'operator': dyn('In'), \
                   'values': dyn(variables.requiredPools)}}] : []) + \
                 variables.applied.map(p, has(p.required) ? p.required.map(r, {req}) : []).flatten() + \
                 (size(variables.excludedPools) > 0 ? [{{'key': dyn('{POOL_LABEL}'), 'operator': dyn('NotIn'), \
                   'values': dyn(variables.excludedPools)}}] : [])",
                req = requirement_map("r"),
            ),
        ),
        // Each once (a variable is evaluated once, so the list is not built again
        // for each comparison).
        var(
            "wantedRequired",
            distinct_by("variables.requiredAll", same_requirement),
        ),
        var(
            "preferredAll",
            "variables.applied.map(p, has(p.preferred) ? p.preferred.map(w, \
             {'weight': dyn(int(w.weight)), 'key': dyn(w.key), 'operator': dyn(w.operator), \
               'values': dyn(has(w.values) ? w.values.map(v, string(v)) : [])}) : []).flatten()"
                .into(),
        ),
        var(
            "wantedPreferred",
            distinct_by("variables.preferredAll", |a, b| {
                format!("({a}.weight == {b}.weight && {})", same_requirement(a, b))
            }),
        ),
        var(
            "missingPreferred",
            format!(
                "{wanted_preferred}.filter(w, !{preferred}.exists(p, {}))",
                same_preference("p", "w")
            ),
        ),
        // berth's preferences the pod has and berth no longer wants (or has twice).
        var(
            "removedPreferred",
            format!(
                "lists.range(size({preferred})).filter(i, \
                   has({preferred}[i].preference.matchExpressions) && \
                   {preferred}[i].preference.matchExpressions.exists(e, {owned}) && \
                   (!{wanted_preferred}.exists(w, {same_iw}) || \
                    {wanted_preferred}.exists(w, {same_iw} && lists.range(i).exists(j, {same_jw}))))",
                owned = owned_node_key("e.key"),
                same_iw = same_preference(&format!("{preferred}[i]"), "w"),
                same_jw = same_preference(&format!("{preferred}[j]"), "w"),
            ),
        ),
        var(
            "newRequired",
            format!("!variables.hasRequired && size({wanted_required}) > 0"),
        ),
        var(
            "newPreferred",
            "!variables.hasPreferred && size(variables.missingPreferred) > 0".into(),
        ),
        // The objects the pod lacks, each added empty, then the lists in them.
        op_list(
            "affinityOps",
            format!(
                "((variables.newRequired || variables.newPreferred) && !has(object.spec.affinity) ? \
                   [{affinity}] : []) + \
                 ((variables.newRequired || variables.newPreferred) && \
                   !(has(object.spec.affinity) && has({node_affinity})) ? [{node}] : []) + \
                 (variables.newRequired ? [{required}, {terms_list}, {term}, {expressions}] + \
                   {wanted_required}.map(w, {append_new}) : []) + \
                 (variables.hasRequired && !{terms}.all(t, {empty}) ? \
                   {terms}.transformList(i, t, {empty} ? [] : \
                     (!has(t.matchExpressions) && size({lacking}) > 0 ? [{term_list}] : []) + \
                     {lacking}.map(w, {append_term})).flatten() : [])",
                affinity = op("add", &path(AFFINITY), Some("Object.spec.affinity{}")),
                node = op(
                    "add",
                    &path(NODE_AFFINITY),
                    Some("Object.spec.affinity.nodeAffinity{}")
                ),
                required = op(
                    "add",
                    &path(REQUIRED),
                    Some(
                        "Object.spec.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution{}"
                    )
                ),
                terms_list = op(
                    "add",
                    &path(&format!("{REQUIRED}/nodeSelectorTerms")),
                    Some("[]")
                ),
                term = op(
                    "add",
                    &path(&format!("{REQUIRED}/nodeSelectorTerms/-")),
                    Some(&format!("{TERM_TYPE}{{}}"))
                ),
                expressions = op(
                    "add",
                    &path(&format!("{REQUIRED}/nodeSelectorTerms/0/matchExpressions")),
                    Some("[]")
                ),
                append_new = op(
                    "add",
                    &path(&format!(
                        "{REQUIRED}/nodeSelectorTerms/0/matchExpressions/-"
                    )),
                    Some(&requirement_value("w", REQUIREMENT_TYPE))
                ),
                empty = empty_term("t"),
                lacking = format!(
                    "{wanted_required}.filter(w, !(has(t.matchExpressions) && t.matchExpressions.exists(e, {})))",
                    same_requirement("e", "w")
                ),
                term_list = op(
                    "add",
                    &format!("'{REQUIRED}/nodeSelectorTerms/' + string(i) + '/matchExpressions'"),
                    Some("[]")
                ),
                append_term = op(
                    "add",
                    &format!("'{REQUIRED}/nodeSelectorTerms/' + string(i) + '/matchExpressions/-'"),
                    Some(&requirement_value("w", REQUIREMENT_TYPE))
                ),
            ),
        ),
        op_list(
            "preferredOps",
            format!(
                "(variables.newPreferred ? [{create}] : []) + \
                 variables.removedPreferred.reverse().map(i, {remove}) + \
                 variables.missingPreferred.transformList(k, w, [{term}, {list}, {append}]).flatten()",
                create = op("add", &path(PREFERRED), Some("[]")),
                remove = op("remove", &format!("'{PREFERRED}/' + string(i)"), None),
                term = op(
                    "add",
                    &path(&format!("{PREFERRED}/-")),
                    Some(&format!(
                        "{PREFERRED_TYPE}{{weight: w.weight, preference: {PREFERRED_TYPE}.preference{{}}}}"
                    ))
                ),
                list = op(
                    "add",
                    &at_new_preference("/preference/matchExpressions"),
                    Some("[]")
                ),
                append = op(
                    "add",
                    &at_new_preference("/preference/matchExpressions/-"),
                    Some(&requirement_value(
                        "w",
                        &format!("{PREFERRED_TYPE}.preference.matchExpressions")
                    ))
                ),
            ),
        ),
        // The namespace's scheduler, else the first applied policy's by name; a
        // pod that names another scheduler than the default keeps it.
        var(
            "wantedScheduler",
            format!(
                "'{SCHEDULER_ANNOTATION}' in variables.annotations ? \
                 variables.annotations['{SCHEDULER_ANNOTATION}'].trim() : \
                 variables.applied.exists(p, has(p.schedulerName)) ? \
                 variables.applied.filter(p, has(p.schedulerName))[0].schedulerName : ''"
            ),
        ),
        op_list(
            "schedulerOps",
            format!(
                "variables.wantedScheduler != '' && \
                 (!has(object.spec.schedulerName) || object.spec.schedulerName == 'default-scheduler') && \
                 {current} != variables.wantedScheduler ? [{set}] : []",
                current = or("object.spec", "schedulerName", "''"),
                set = op(
                    "add",
                    &path("/spec/schedulerName"),
                    Some("variables.wantedScheduler")
                ),
            ),
        ),
        op_list(
            "appliedOps",
            format!(
                "size(variables.appliedNames) == 0 ? ({recorded} ? [{remove}] : []) : \
                 {recorded} && object.metadata.annotations['{APPLIED_ANNOTATION}'] == {applied_value} ? [] : \
                 has(object.metadata.annotations) ? [{set}] : [{create}]",
                recorded = format!(
                    "(has(object.metadata.annotations) && '{APPLIED_ANNOTATION}' in object.metadata.annotations)"
                ),
                remove = op(
                    "remove",
                    &path(&format!("/metadata/annotations/{applied_key}")),
                    None
                ),
                set = op(
                    "add",
                    &path(&format!("/metadata/annotations/{applied_key}")),
                    Some(applied_value)
                ),
                create = op(
                    "add",
                    &path("/metadata/annotations"),
                    Some(&format!("{{'{APPLIED_ANNOTATION}': {applied_value}}}"))
                ),
            ),
        ),
    ]
}

/// The path, CEL, of the `k`th preferred term the patch appends: after the pod's
/// terms less those it removes.
fn at_new_preference(tail: &str) -> String {
    format!(
        "'{PREFERRED}/' + string(size(variables.preferred) - size(variables.removedPreferred) + k) + '{tail}'"
    )
}

fn params() -> Value {
    json!({"apiVersion": format!("{GROUP}/v1alpha1"), "kind": "StaticPlacement"})
}

fn param_ref() -> Value {
    json!({"name": STATIC_PLACEMENT_NAME, "parameterNotFoundAction": "Allow"})
}

fn match_constraints(berth_user: &str) -> Value {
    json!({
        "resourceRules": [{"apiGroups": [""], "apiVersions": ["v1"],
            "operations": ["CREATE"], "resources": ["pods"]}],
        "namespaceSelector": namespace_selector(berth_user),
    })
}

/// DaemonSet pods are the webhook's (they get pool tolerations by their
/// DaemonSet, never affinity), as are the kubelets' mirror pods.
fn match_conditions() -> Value {
    json!([
        not_from_nodes(),
        {"name": "not-daemonset-pods", "expression": format!("!({})",
            daemonset_pod()["expression"].as_str().unwrap_or("true"))},
    ])
}

/// `berth-placement`.
fn placement(berth_user: &str) -> Value {
    let mut variables = decision_variables();
    let mut ops = Vec::new();
    for part in patch_parts() {
        match part {
            Part::Variable(v) => variables.push(v),
            Part::Ops(list) => ops.push(format!("({})", list.expression)),
        }
    }
    // Without its params (berth's controller has not written them yet) the
    // policy does nothing: parameterNotFoundAction Allow.
    json!({
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "MutatingAdmissionPolicy",
        "metadata": {"name": PLACEMENT_POLICY},
        "spec": {
            "paramKind": params(),
            "matchConstraints": match_constraints(berth_user),
            "matchConditions": match_conditions(),
            "failurePolicy": "Fail",
            "reinvocationPolicy": "Never",
            "variables": variables,
            "mutations": [{
                "patchType": "JSONPatch",
                "jsonPatch": {"expression": format!(
                    "variables.places ? {} : []",
                    ops.join(" + ")
                )},
            }],
        },
    })
}

fn mutating_binding() -> Value {
    json!({
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "MutatingAdmissionPolicyBinding",
        "metadata": {"name": PLACEMENT_POLICY},
        "spec": {"policyName": PLACEMENT_POLICY, "paramRef": param_ref()},
    })
}

/// The policy and its binding.
pub fn documents(berth_user: &str) -> Vec<Value> {
    vec![placement(berth_user), mutating_binding()]
}

/// The policies as multi-document YAML.
pub fn manifests(berth_user: &str) -> String {
    let header = "# Generated by `berth admission-policy --placement`; do not edit by hand (a test\n\
                  # checks it). berth's static placement applied by the apiserver itself, so\n\
                  # that pods are placed with berth down; needs admissionregistration.k8s.io/v1\n\
                  # MutatingAdmissionPolicy (Kubernetes 1.36 and later).\n";
    as_yaml(header, &documents(berth_user))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every value the patch adds is built from scalars, and no list literal holds
    /// an `Object{}` initializer (the 1.36.0–1.36.3 request handlers panic on
    /// one).
    #[test]
    fn no_list_of_object_initializers() {
        let yaml = manifests(crate::names::BERTH_SERVICE_ACCOUNT);
        let text = yaml.replace("\n", " ");
        // A `[` opens a list literal (or an index); what follows it up to the
        // matching `]` may not hold `Object.` or `{` of an initializer.
        let bytes = text.as_bytes();
        for (at, _) in text.match_indices('[') {
            let mut depth = 0;
            let mut end = at;
            for (i, b) in bytes.iter().enumerate().skip(at) {
                match b {
                    b'[' => depth += 1,
                    b']' => {
                        depth -= 1;
                        if depth == 0 {
                            end = i;
                            break;
                        }
                    }
                    _ => {}
                }
            }
            let inside = &text[at..=end];
            // A list of JSONPatch operations is the mutation's own answer, not a
            // value; only their `value:` parts matter.
            for value in inside.split("value: ").skip(1) {
                let value = value.split("})").next().unwrap_or(value);
                assert!(
                    !(value.trim_start().starts_with('[') && value.contains("Object.")),
                    "a list of Object{{}} initializers: {value}"
                );
            }
            assert!(
                !inside
                    .trim_start_matches('[')
                    .trim_start()
                    .starts_with("Object."),
                "a list of Object{{}} initializers: {inside}"
            );
        }
    }

    #[test]
    fn each_document_is_yaml_and_names_its_params() {
        let yaml = manifests(crate::names::BERTH_SERVICE_ACCOUNT);
        assert_eq!(yaml.matches("kind: StaticPlacement").count(), 1);
        for document in yaml.split("---\n") {
            let _: Value = serde_yaml_ng::from_str(document).expect("each document is YAML");
        }
        assert!(yaml.contains(POOL_LABEL) && yaml.contains(POOL_TAINT));
    }
}
