//! Table-style tests of the decision and the patch, one rule per test.

use serde_json::{Value, json};

use super::namespace::NamespaceIndex;
use super::*;
use crate::objects::NodeInfo;
use crate::objects::PodObject;
use crate::policy::{NamespaceConfig, PlacementPolicy};

fn mk_policy(name: &str, spec: Value) -> PlacementPolicy {
    serde_json::from_value(json!({
        "apiVersion": "berth.io/v1alpha1", "kind": "PlacementPolicy",
        "metadata": {"name": name}, "spec": spec
    }))
    .expect("test policy")
}

fn mk_set(policies: &[PlacementPolicy]) -> PolicySet {
    let (set, errors) = PolicySet::compile(policies);
    assert!(errors.is_empty(), "{errors:?}");
    set
}

fn cdn() -> PlacementPolicy {
    mk_policy(
        "cdn",
        json!({"images": ["*cdn*"], "pool": {"nodeNames": ["node2"]}}),
    )
}

fn mk_pod(image: &str) -> Value {
    json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "p", "namespace": "default"},
        "spec": {"containers": [{"name": "app", "image": image}]}
    })
}

fn opted_in(policies: &str) -> NamespaceInfo {
    let mut ns = NamespaceInfo::new("default");
    ns.annotations
        .insert("berth.io/policies".into(), policies.into());
    ns
}

struct Outcome {
    decision: Decision,
    patch: json_patch::Patch,
    pod: Value,
}

fn admit_with(
    pod: &Value,
    ns: &NamespaceInfo,
    set: &PolicySet,
    nodes: Option<&NodeIndex>,
) -> Outcome {
    admit_from(pod, ns, set, nodes, Requester::Other)
}

fn admit_from(
    pod: &Value,
    ns: &NamespaceInfo,
    set: &PolicySet,
    nodes: Option<&NodeIndex>,
    requester: Requester,
) -> Outcome {
    let input = Input {
        pod,
        namespace: ns,
        policies: set,
        nodes,
        requester,
        groups: Default::default(),
    };
    let decision = decide(&input);
    for w in &decision.warnings {
        assert!(w.chars().count() < 120, "warning too long: {w}");
    }
    let patch = build_patch(pod, &decision.grants);
    if let Ok(view) = PodObject::read(pod) {
        // The webhook's text of the patch holds the same operations.
        let text = super::patch::write_patch(&view, &decision.grants);
        let text = text
            .finish()
            .expect("written")
            .unwrap_or_else(|| b"[]".to_vec());
        let written: json_patch::Patch = serde_json::from_slice(&text).expect("a JSON Patch");
        assert_eq!(written, patch);
    }
    let mut patched = pod.clone();
    json_patch::patch(&mut patched, &patch).expect("patch applies to the pod it was built for");
    Outcome {
        decision,
        patch,
        pod: patched,
    }
}

fn admit(pod: &Value, ns: &NamespaceInfo, set: &PolicySet) -> Outcome {
    admit_with(pod, ns, set, None)
}

fn required_terms(pod: &Value) -> Value {
    pod.pointer("/spec/affinity/nodeAffinity/requiredDuringSchedulingIgnoredDuringExecution/nodeSelectorTerms")
        .cloned()
        .unwrap_or(Value::Null)
}

fn pool_in(pools: &[&str]) -> Value {
    json!({"key": "node-restriction.kubernetes.io/berth.pool", "operator": "In", "values": pools})
}

fn pool_not_in(pools: &[&str]) -> Value {
    json!({"key": "node-restriction.kubernetes.io/berth.pool", "operator": "NotIn", "values": pools})
}

fn pool_toleration(pool: &str) -> Value {
    json!({"key": "berth.io/pool", "operator": "Equal", "value": pool, "effect": "NoSchedule"})
}

/// A missing object is added whole, with what goes in it: one operation, not an
/// empty object per level, also where the pod has the object as `null`.
#[test]
fn a_missing_object_is_added_with_its_contents_in_one_operation() {
    let set = mk_set(&[cdn()]);
    let required = json!({"requiredDuringSchedulingIgnoredDuringExecution":
        {"nodeSelectorTerms": [{"matchExpressions": [pool_in(&["cdn"])]}]}});
    let mut with_null = mk_pod("example/cdn-uploader:1.0");
    with_null["spec"]["affinity"] = json!({"nodeAffinity": null});
    with_null["metadata"]["annotations"] = Value::Null;
    let cases = [
        (
            mk_pod("example/cdn-uploader:1.0"),
            "/spec/affinity",
            json!({"nodeAffinity": required}),
        ),
        (with_null, "/spec/affinity/nodeAffinity", required.clone()),
    ];
    for (pod, at, affinity) in cases {
        let out = admit(&pod, &opted_in("cdn"), &set);
        let expected: json_patch::Patch = serde_json::from_value(json!([
            {"op": "add", "path": "/spec/tolerations", "value": [pool_toleration("cdn")]},
            {"op": "add", "path": at, "value": affinity},
            {"op": "add", "path": "/metadata/annotations", "value": {"berth.io/applied": "cdn"}},
        ]))
        .unwrap();
        assert_eq!(out.patch, expected, "{pod}");
    }
}

#[test]
fn cdn_pod_in_an_opted_in_namespace_gets_the_pool_toleration_and_required_affinity() {
    let set = mk_set(&[cdn()]);
    let out = admit(&mk_pod("example/cdn-uploader:1.0"), &opted_in("cdn"), &set);
    assert_eq!(out.decision.applied.len(), 1);
    assert!(out.decision.applied[0].why[1].contains("matches *cdn*"));
    assert_eq!(
        out.pod["spec"]["tolerations"],
        json!([pool_toleration("cdn")])
    );
    assert_eq!(
        required_terms(&out.pod),
        json!([{"matchExpressions": [pool_in(&["cdn"])]}])
    );
    assert_eq!(
        out.pod["metadata"]["annotations"]["berth.io/applied"],
        "cdn"
    );
}

#[test]
fn pods_whose_images_do_not_match_or_namespaces_that_did_not_opt_in_get_nothing() {
    let set = mk_set(&[cdn()]);
    let out = admit(&mk_pod("nginx"), &opted_in("cdn"), &set);
    assert!(out.patch.0.is_empty());
    assert!(
        out.decision.passed_over[0]
            .why
            .starts_with("no image matches *cdn*")
    );
    let out = admit(&mk_pod("cdn-uploader"), &NamespaceInfo::new("other"), &set);
    assert!(out.patch.0.is_empty());
}

/// The seed's CI shape under Tekton: every pod of the PipelineRun carries its
/// Pipeline's label, the task pods must sit beside the affinity assistant.
fn tekton_pod(image: &str, pipeline: Option<&str>, beside_assistant: bool) -> Value {
    let mut pod = mk_pod(image);
    if let Some(pipeline) = pipeline {
        pod["metadata"]["labels"] = json!({"tekton.dev/pipeline": pipeline});
    }
    if beside_assistant {
        pod["spec"]["affinity"] = json!({"podAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
            {"topologyKey": "kubernetes.io/hostname", "labelSelector": {"matchLabels": {
                "app.kubernetes.io/component": "affinity-assistant"}}}]}});
    }
    pod
}

#[test]
fn a_coscheduled_group_goes_to_the_pool_as_one_whatever_each_members_image() {
    let mut spec = serde_json::to_value(&cdn().spec).unwrap();
    spec["coscheduled"] = json!({"matchLabels": {"tekton.dev/pipeline": "publish"}});
    let set = mk_set(&[mk_policy("cdn", spec)]);
    let ns = opted_in("cdn");
    // The assistant (a nop image) and the build task (golang) of the pipeline go
    // with its upload: the whole group to the pool, and no warning.
    for pod in [
        tekton_pod("ghcr.io/tektoncd/nop", Some("publish"), false),
        tekton_pod("golang:1.26", Some("publish"), true),
        tekton_pod("example/cdn-uploader:1.0", Some("publish"), true),
    ] {
        let out = admit(&pod, &ns, &set);
        assert_eq!(out.decision.applied.len(), 1, "{pod}");
        assert_eq!(
            out.pod["spec"]["tolerations"],
            json!([pool_toleration("cdn")])
        );
        assert!(
            out.decision.warnings.is_empty(),
            "{:?}",
            out.decision.warnings
        );
    }
    assert!(
        admit(&tekton_pod("golang:1.26", Some("publish"), true), &ns, &set)
            .decision
            .applied[0]
            .with_group
    );
    // Another pipeline's build is routed by its images only: not at all.
    let other = admit(&tekton_pod("golang:1.26", Some("test"), true), &ns, &set);
    assert!(other.decision.applied.is_empty());
    // A namespace that does not opt in gets nothing, labels or not.
    let outside = tekton_pod("ghcr.io/tektoncd/nop", Some("publish"), false);
    assert!(
        admit(&outside, &NamespaceInfo::new("other"), &set)
            .decision
            .applied
            .is_empty()
    );
}

#[test]
fn a_pod_routed_by_its_image_that_must_sit_beside_others_is_warned() {
    let set = mk_set(&[cdn()]);
    let ns = opted_in("cdn");
    let out = admit(
        &tekton_pod("example/cdn-uploader:1.0", None, true),
        &ns,
        &set,
    );
    assert_eq!(out.decision.applied.len(), 1);
    assert_eq!(
        out.decision.warnings.len(),
        1,
        "{:?}",
        out.decision.warnings
    );
    let warning = &out.decision.warnings[0];
    assert!(
        warning.starts_with("pool cdn: the pod must sit beside pods"),
        "{warning}"
    );
    assert!(warning.ends_with("with coscheduled"), "whole: {warning}");
    // Without a required pod affinity, or without a pool, nothing to say.
    let alone = admit(
        &tekton_pod("example/cdn-uploader:1.0", None, false),
        &ns,
        &set,
    );
    assert!(alone.decision.warnings.is_empty());
}

#[test]
fn coscheduled_may_not_select_every_pod() {
    let mut spec = serde_json::to_value(&cdn().spec).unwrap();
    spec["coscheduled"] = json!({});
    let (_, errors) = PolicySet::compile(&[mk_policy("cdn", spec)]);
    assert!(
        errors[0]
            .to_string()
            .contains("coscheduled: {} would route every pod"),
        "{errors:?}"
    );
}

#[test]
fn init_container_images_count() {
    let set = mk_set(&[cdn()]);
    let mut pod = mk_pod("nginx");
    pod["spec"]["initContainers"] =
        json!([{"name": "seed", "image": "registry.example.com/cdn/seed"}]);
    let out = admit(&pod, &opted_in("cdn"), &set);
    assert!(out.decision.applied[0].why[1].contains("init container seed"));
}

#[test]
fn preferred_placement_appends_a_weighted_term_and_no_required_one() {
    let set = mk_set(&[mk_policy(
        "cdn",
        json!({"images": ["*cdn*"], "pool": {"nodeNames": ["node2"], "placement": "Preferred", "weight": 80}}),
    )]);
    let mut pod = mk_pod("cdn");
    pod["spec"]["affinity"] = json!({"nodeAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [
        {"weight": 5, "preference": {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a"]}]}}
    ]}});
    let out = admit(&pod, &opted_in("cdn"), &set);
    assert_eq!(required_terms(&out.pod), Value::Null);
    let preferred = &out.pod["spec"]["affinity"]["nodeAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"];
    assert_eq!(preferred[0]["weight"], 5, "the user's term is kept first");
    assert_eq!(
        preferred[1],
        json!({"weight": 80, "preference": {"matchExpressions": [pool_in(&["cdn"])]}})
    );
}

#[test]
fn required_expressions_are_anded_into_every_existing_term() {
    let set = mk_set(&[cdn()]);
    let mut pod = mk_pod("cdn");
    let user_terms = json!([
        {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a"]}]},
        {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["node2"]}]}
    ]);
    pod["spec"]["affinity"] = json!({"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": user_terms}}});
    let out = admit(&pod, &opted_in("cdn"), &set);
    let terms = required_terms(&out.pod);
    assert_eq!(
        terms.as_array().unwrap().len(),
        2,
        "no term is added: that would widen placement"
    );
    assert_eq!(
        terms[0]["matchExpressions"],
        json!([{"key": "zone", "operator": "In", "values": ["a"]}, pool_in(&["cdn"])])
    );
    assert_eq!(terms[1]["matchExpressions"], json!([pool_in(&["cdn"])]));
    assert_eq!(terms[1]["matchFields"], user_terms[1]["matchFields"]);
}

#[test]
fn unknown_fields_survive_admission() {
    let set = mk_set(&[cdn()]);
    let mut pod = mk_pod("cdn");
    pod["spec"]["futureField"] = json!({"x": [1, 2]});
    pod["spec"]["containers"][0]["futureContainerField"] = json!(true);
    pod["spec"]["tolerations"] =
        json!([{"key": "a", "operator": "Exists", "futureTolerationField": 1}]);
    let out = admit(&pod, &opted_in("cdn"), &set);
    assert_eq!(out.pod["spec"]["futureField"], json!({"x": [1, 2]}));
    assert_eq!(
        out.pod["spec"]["containers"][0]["futureContainerField"],
        json!(true)
    );
    assert_eq!(
        out.pod["spec"]["tolerations"][0]["futureTolerationField"],
        json!(1)
    );
}

#[test]
fn admitting_berths_own_output_yields_an_empty_patch() {
    let set = mk_set(&[
        cdn(),
        mk_policy(
            "gpu",
            json!({"nodeAffinity": {
        "required": [{"key": "nvidia.com/gpu.product", "operator": "In", "values": ["A100"]}],
        "preferred": [{"weight": 50, "preference": {"key": "example.com/nvme", "operator": "Exists"}}]},
        "schedulerName": "gpu-scheduler"}),
        ),
    ]);
    let first = admit(&mk_pod("cdn"), &opted_in("cdn, gpu"), &set);
    assert!(!first.patch.0.is_empty());
    let second = admit(&first.pod, &opted_in("cdn, gpu"), &set);
    assert!(second.patch.0.is_empty(), "{:?}", second.patch);
}

#[test]
fn a_forged_pool_toleration_is_removed_with_a_warning() {
    let set = mk_set(&[cdn()]);
    let mut pod = mk_pod("nginx");
    pod["spec"]["tolerations"] =
        json!([pool_toleration("cdn"), {"key": "mine", "operator": "Exists"}]);
    let out = admit(&pod, &opted_in("cdn"), &set);
    assert_eq!(
        out.pod["spec"]["tolerations"],
        json!([{"key": "mine", "operator": "Exists"}])
    );
    assert_eq!(out.decision.stripped.len(), 1);
    assert!(
        out.decision
            .warnings
            .iter()
            .any(|w| w.starts_with("removed toleration berth.io/pool=cdn"))
    );
}

#[test]
fn a_forged_berth_annotation_is_removed_and_a_pool_expression_kept() {
    let set = mk_set(&[cdn()]);
    let mut pod = mk_pod("nginx");
    pod["metadata"]["annotations"] = json!({"berth.io/applied": "cdn", "keep": "me"});
    pod["spec"]["affinity"] = json!({"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
        {"matchExpressions": [pool_in(&["cdn"])]}
    ]}}});
    let out = admit(&pod, &opted_in("cdn"), &set);
    assert_eq!(out.pod["metadata"]["annotations"], json!({"keep": "me"}));
    // The pod asks for pool cdn itself: that only narrows where it may land, so it
    // stays (removing it would let the pod anywhere). Without the pool's
    // toleration, which berth does not grant, it still cannot land on the pool.
    assert_eq!(
        required_terms(&out.pod),
        json!([{"matchExpressions": [pool_in(&["cdn"])]}])
    );
    assert!(out.pod["spec"].get("tolerations").is_none());
}

#[test]
fn wildcard_toleration_gets_pool_exclusion_in_every_term() {
    let set = mk_set(&[
        cdn(),
        mk_policy(
            "gpu",
            json!({"images": ["*cuda*"], "pool": {"nodeNames": ["node3"]}}),
        ),
    ]);
    let mut pod = mk_pod("nginx");
    pod["spec"]["tolerations"] = json!([{"operator": "Exists"}]);
    pod["spec"]["affinity"] = json!({"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
        {"matchExpressions": [{"key": "a", "operator": "Exists"}]}, {"matchExpressions": [{"key": "b", "operator": "Exists"}]}
    ]}}});
    let out = admit(&pod, &opted_in("cdn"), &set);
    for term in required_terms(&out.pod).as_array().unwrap() {
        assert!(
            term["matchExpressions"]
                .as_array()
                .unwrap()
                .contains(&pool_not_in(&["cdn", "gpu"])),
            "{term}"
        );
    }
}

#[test]
fn a_wildcard_for_another_effect_needs_no_exclusion() {
    let set = mk_set(&[cdn()]);
    let mut pod = mk_pod("nginx");
    pod["spec"]["tolerations"] = json!([{"operator": "Exists", "effect": "NoExecute"}]);
    assert!(admit(&pod, &opted_in(""), &set).patch.0.is_empty());
}

#[test]
fn an_entitled_pod_with_a_wildcard_is_excluded_only_from_other_pools() {
    let set = mk_set(&[
        cdn(),
        mk_policy(
            "gpu",
            json!({"pool": {"nodeNames": ["node3"]}, "images": ["*cuda*"]}),
        ),
    ]);
    let mut pod = mk_pod("cdn");
    pod["spec"]["tolerations"] = json!([{"operator": "Exists"}]);
    let out = admit(&pod, &opted_in("cdn"), &set);
    assert_eq!(
        required_terms(&out.pod),
        json!([{"matchExpressions": [pool_in(&["cdn"]), pool_not_in(&["gpu"])]}])
    );
}

#[test]
fn node_name_on_a_dedicated_node_is_denied_unless_entitled() {
    let set = mk_set(&[cdn()]);
    let mut pod = mk_pod("nginx");
    pod["spec"]["nodeName"] = json!("node2");
    let denial = admit(&pod, &opted_in("cdn"), &set)
        .decision
        .denial
        .expect("denied");
    assert_eq!(
        denial,
        "spec.nodeName node2 is in dedicated pool cdn, which this pod is not entitled to"
    );
    pod["spec"]["containers"][0]["image"] = json!("cdn");
    assert!(
        admit(&pod, &opted_in("cdn"), &set)
            .decision
            .denial
            .is_none()
    );
    pod["spec"]["nodeName"] = json!("node1");
    pod["spec"]["containers"][0]["image"] = json!("nginx");
    assert!(
        admit(&pod, &opted_in("cdn"), &set)
            .decision
            .denial
            .is_none()
    );
}

/// A label only an admin sets on a node (a node cannot set it on itself).
const GPU_LABEL: &str = "node-restriction.kubernetes.io/gpu";

#[test]
fn node_name_denial_uses_pool_node_selectors_when_nodes_are_known() {
    let set = mk_set(&[mk_policy(
        "gpu",
        json!({"images": ["*cuda*"], "pool": {"nodeSelector": {"matchLabels": {"node-restriction.kubernetes.io/gpu": "yes"}}}}),
    )]);
    let mut pod = mk_pod("nginx");
    pod["spec"]["nodeName"] = json!("g1");
    let mut nodes = NodeIndex::new();
    nodes.insert(
        "g1".into(),
        NodeInfo {
            labels: [(GPU_LABEL.to_string(), "yes".to_string())].into(),
            taints: vec![],
        }
        .into(),
    );
    assert!(
        admit_with(&pod, &opted_in(""), &set, Some(&nodes))
            .decision
            .denial
            .is_some()
    );
}

fn daemonset_pod() -> Value {
    let mut pod = mk_pod("fluent-bit");
    pod["metadata"]["ownerReferences"] = json!([{"apiVersion": "apps/v1", "kind": "DaemonSet", "name": "logs", "uid": "u", "controller": true}]);
    pod["spec"]["affinity"] = json!({"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
        {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["node2"]}]}
    ]}}});
    pod["spec"]["tolerations"] = json!([{"operator": "Exists"}]);
    pod
}

/// A DaemonSet pod as the DaemonSet controller sends it.
fn from_daemonset_controller(pod: &Value, ns: &NamespaceInfo, set: &PolicySet) -> Outcome {
    admit_from(pod, ns, set, None, Requester::DaemonSetController)
}

#[test]
fn a_pool_that_names_no_daemonset_namespaces_takes_the_systems_and_its_own() {
    let set = mk_set(&[cdn()]);
    let pod = daemonset_pod();
    let tolerated = |ns: &NamespaceInfo| {
        let out = from_daemonset_controller(&pod, ns, &set);
        out.pod["spec"]["tolerations"]
            .as_array()
            .unwrap()
            .contains(&pool_toleration("cdn"))
    };
    assert!(tolerated(&NamespaceInfo::new("kube-system")));
    assert!(tolerated(&opted_in("cdn")), "a namespace that opts in");
    assert!(
        !tolerated(&NamespaceInfo::new("tenant")),
        "any other namespace's DaemonSet stays off: the short form keeps the pool closed"
    );
}

#[test]
fn daemonset_pods_get_tolerate_pool_tolerations_and_no_node_affinity() {
    let set = mk_set(&[
        cdn(),
        mk_policy(
            "gpu",
            json!({"pool": {"nodeNames": ["node3"], "daemonSets": "Exclude"}}),
        ),
    ]);
    let pod = daemonset_pod();
    let out = from_daemonset_controller(&pod, &NamespaceInfo::new("kube-system"), &set);
    assert_eq!(out.pod["spec"]["tolerations"][1], pool_toleration("cdn"));
    assert_eq!(
        out.pod["spec"]["tolerations"].as_array().unwrap().len(),
        2,
        "no gpu toleration"
    );
    assert_eq!(
        required_terms(&out.pod),
        required_terms(&pod),
        "its own per-node affinity is untouched"
    );
    assert!(
        out.decision.denial.is_none(),
        "it is made for node2, not gpu's node3"
    );
}

#[test]
fn a_daemonset_pod_that_tolerates_everything_is_refused_on_a_pool_that_does_not_take_it() {
    let set = mk_set(&[mk_policy(
        "gpu",
        json!({"pool": {"nodeNames": ["node3"], "daemonSets": "Exclude"}}),
    )]);
    let mut pod = daemonset_pod();
    pod["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
        [0]["matchFields"][0]["values"] = json!(["node3"]);
    let out = from_daemonset_controller(&pod, &NamespaceInfo::new("kube-logging"), &set);
    let denial = out.decision.denial.expect("refused");
    assert!(
        denial.contains("node node3") && denial.contains("daemonSets: Exclude"),
        "{denial}"
    );
}

#[test]
fn dedicated_pools_take_daemonsets_only_from_the_namespaces_they_select() {
    let set = mk_set(&[mk_policy(
        "cdn",
        json!({"pool": {"nodeNames": ["node2"],
            "daemonSetNamespaces": {"matchLabels": {"kubernetes.io/metadata.name": "kube-system"}}}}),
    )]);
    let mut system = NamespaceInfo::new("kube-system");
    system
        .labels
        .insert("kubernetes.io/metadata.name".into(), "kube-system".into());
    let out = from_daemonset_controller(&daemonset_pod(), &system, &set);
    assert_eq!(out.pod["spec"]["tolerations"][1], pool_toleration("cdn"));

    let mut pod = daemonset_pod();
    pod["spec"]["tolerations"] = json!([pool_toleration("cdn")]);
    let out = from_daemonset_controller(&pod, &NamespaceInfo::new("tenant"), &set);
    assert_eq!(
        out.pod["spec"]["tolerations"],
        json!([]),
        "a forged toleration goes"
    );
    assert_eq!(out.decision.stripped.len(), 1);
}

#[test]
fn a_daemonset_pod_hears_which_pools_do_not_take_it_and_why() {
    let set = mk_set(&[
        cdn(),
        mk_policy(
            "gpu",
            json!({"pool": {"nodeNames": ["node3"], "daemonSets": "Exclude"}}),
        ),
        mk_policy("batch", json!({"schedulerName": "batch"})),
    ]);
    let refused = |ns: &NamespaceInfo| {
        let out = from_daemonset_controller(&daemonset_pod(), ns, &set);
        (out.decision.refused_daemonset.into_iter())
            .map(|r| (r.policy, r.why))
            .collect::<Vec<_>>()
    };
    assert_eq!(
        refused(&NamespaceInfo::new("tenant")),
        [
            (
                "cdn".to_owned(),
                "it names no daemonSetNamespaces, so it takes kube-system's and those of the \
                 namespaces that opt in, not tenant's"
                    .to_owned()
            ),
            ("gpu".to_owned(), "daemonSets: Exclude".to_owned()),
        ],
        "every dedicated pool, none but them"
    );
    assert_eq!(
        refused(&NamespaceInfo::new("kube-system")),
        [("gpu".to_owned(), "daemonSets: Exclude".to_owned())]
    );
    let ordinary = admit(&mk_pod("nginx"), &NamespaceInfo::new("tenant"), &set);
    assert!(ordinary.decision.refused_daemonset.is_empty());
}

/// zeta and alpha both name node2; zeta is the older, so it holds the node.
fn two_pools_naming_node2() -> PolicySet {
    let pool = |name: &str, created: &str| {
        let mut policy = mk_policy(
            name,
            json!({"images": [format!("*{name}*")], "pool": {"nodeNames": ["node2"]}}),
        );
        policy.metadata.creation_timestamp = Some(
            k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(created.parse().unwrap()),
        );
        policy
    };
    mk_set(&[
        pool("zeta", "2026-01-01T00:00:00Z"),
        pool("alpha", "2026-06-01T00:00:00Z"),
    ])
}

#[test]
fn a_node_claimed_twice_is_refused_in_the_name_of_the_pool_that_holds_it() {
    let set = two_pools_naming_node2();
    let mut pod = mk_pod("nginx");
    pod["spec"]["nodeName"] = json!("node2");
    let denial = |pod: &Value| admit(pod, &opted_in("zeta, alpha"), &set).decision.denial;
    assert_eq!(
        denial(&pod).as_deref(),
        Some("spec.nodeName node2 is in dedicated pool zeta, which this pod is not entitled to")
    );
    pod["spec"]["containers"][0]["image"] = json!("zeta");
    assert_eq!(
        denial(&pod).as_deref(),
        Some(
            "spec.nodeName node2 is held by pool zeta but also named by dedicated pool alpha, \
             which this pod is not entitled to; while both claim the node, it stays closed to \
             what either refuses"
        )
    );
    pod["spec"]["containers"][0]["image"] = json!("alpha");
    assert_eq!(
        denial(&pod).as_deref(),
        Some("spec.nodeName node2 is in dedicated pool zeta, which this pod is not entitled to")
    );
    pod["spec"]["containers"]
        .as_array_mut()
        .unwrap()
        .push(json!({"name": "b", "image": "zeta"}));
    assert_eq!(denial(&pod), None, "entitled to both");

    // A DaemonSet pod that tolerates every taint, made for node2, of a
    // namespace that opts into one of them (whose DaemonSets that pool takes).
    let for_node2 = |ns: &str| {
        let out = from_daemonset_controller(&daemonset_pod(), &opted_in(ns), &set);
        out.decision.denial.unwrap_or_default()
    };
    assert!(
        for_node2("alpha").starts_with(
            "DaemonSet pod for node node2: the node is in pool zeta, which does not take this \
             DaemonSet ("
        ),
        "{}",
        for_node2("alpha")
    );
    assert!(
        for_node2("zeta").starts_with(
            "DaemonSet pod for node node2: the node is held by pool zeta but also named by \
             pool alpha, which does not take this DaemonSet ("
        ),
        "{}",
        for_node2("zeta")
    );
}

#[test]
fn an_owner_reference_a_user_wrote_makes_no_daemonset_pod() {
    let set = mk_set(&[cdn()]);
    let mut pod = daemonset_pod();
    pod["spec"]["nodeName"] = json!("node2");
    pod["spec"]["affinity"] = json!(null);
    // The same pod, sent by a tenant rather than the DaemonSet controller.
    let out = admit(&pod, &NamespaceInfo::new("tenant"), &set);
    let denial = out.decision.denial.expect("node2 is cdn's");
    assert!(denial.contains("dedicated pool cdn"), "{denial}");
    assert!(out.decision.grants.tolerations.is_empty());
    let exclusion = &out.decision.grants.required[0];
    assert_eq!(
        exclusion.operator, "NotIn",
        "the wildcard is kept off the pool"
    );
}

#[test]
fn namespace_scheduler_annotation_routes_pods_but_a_pods_own_scheduler_is_kept() {
    let set = mk_set(&[]);
    let mut ns = NamespaceInfo::new("batch");
    ns.annotations
        .insert("berth.io/scheduler-name".into(), "volcano".into());
    let out = admit(&mk_pod("nginx"), &ns, &set);
    assert_eq!(out.pod["spec"]["schedulerName"], "volcano");
    let mut pod = mk_pod("nginx");
    pod["spec"]["schedulerName"] = json!("default-scheduler");
    assert_eq!(
        admit(&pod, &ns, &set).pod["spec"]["schedulerName"],
        "volcano"
    );
    pod["spec"]["schedulerName"] = json!("mine");
    let out = admit(&pod, &ns, &set);
    assert_eq!(out.pod["spec"]["schedulerName"], "mine");
    assert!(out.decision.warnings[0].contains("berth leaves it"));
}

#[test]
fn a_broken_annotation_grants_nothing_but_still_strips_forged_tolerations() {
    let set = mk_set(&[cdn()]);
    let ns = opted_in("cdn,,gpu");
    let mut pod = mk_pod("cdn");
    pod["spec"]["tolerations"] = json!([pool_toleration("cdn")]);
    let out = admit(&pod, &ns, &set);
    assert!(out.decision.applied.is_empty());
    assert_eq!(out.pod["spec"]["tolerations"], json!([]));
    assert!(
        out.decision.warnings[0].contains("entry 2 is empty"),
        "{:?}",
        out.decision.warnings
    );
}

#[test]
fn unknown_policy_names_give_a_warning() {
    let out = admit(&mk_pod("nginx"), &opted_in("cnd"), &mk_set(&[cdn()]));
    assert_eq!(
        out.decision.warnings,
        ["namespace default opts into unknown policy \"cnd\" (berth.io/policies)"]
    );
}

#[test]
fn a_namespace_image_override_replaces_the_policy_images() {
    let set = mk_set(&[cdn()]);
    let mut ns = opted_in("cdn");
    ns.annotations.insert(
        "berth.io/images.cdn".into(),
        "registry.example.com/edge/*".into(),
    );
    assert!(admit(&mk_pod("cdn"), &ns, &set).decision.applied.is_empty());
    let out = admit(&mk_pod("registry.example.com/edge/app:1"), &ns, &set);
    assert_eq!(out.decision.applied[0].policy, "cdn");
}

#[test]
fn pod_and_namespace_selectors_narrow_and_widen_matching() {
    let set = mk_set(&[mk_policy(
        "web",
        json!({
        "namespaceSelector": {"matchLabels": {"tier": "edge"}},
        "podSelector": {"matchLabels": {"app": "web"}},
        "pool": {"nodeNames": ["node1"]}}),
    )]);
    let mut ns = NamespaceInfo::new("edge");
    ns.labels.insert("tier".into(), "edge".into());
    let mut pod = mk_pod("nginx");
    assert_eq!(
        admit(&pod, &ns, &set).decision.passed_over[0].why,
        "the pod's labels do not match podSelector"
    );
    pod["metadata"]["labels"] = json!({"app": "web"});
    assert_eq!(admit(&pod, &ns, &set).decision.applied[0].policy, "web");
}

#[test]
fn colocate_with_and_avoid_use_anchor_labels() {
    let set = mk_set(&[
        mk_policy(
            "b-near-a",
            json!({"colocateWith": {"matchLabels": {"app": "a"}}}),
        ),
        mk_policy(
            "redis",
            json!({"avoid": {"matchLabels": {"app": "redis-master"}}}),
        ),
    ]);
    let out = admit(&mk_pod("nginx"), &opted_in("b-near-a, redis"), &set);
    assert_eq!(
        required_terms(&out.pod),
        json!([{"matchExpressions": [
            {"key": "node-restriction.kubernetes.io/berth.runs.b-near-a", "operator": "In", "values": ["true"]},
            {"key": "node-restriction.kubernetes.io/berth.runs.redis", "operator": "DoesNotExist"}
        ]}])
    );
    assert_eq!(
        out.pod["metadata"]["annotations"]["berth.io/applied"],
        "b-near-a,redis"
    );
}

#[test]
fn a_pod_in_two_required_pools_may_use_either() {
    let set = mk_set(&[
        cdn(),
        mk_policy("edge", json!({"pool": {"nodeNames": ["node4"]}})),
    ]);
    let out = admit(&mk_pod("cdn"), &opted_in("cdn, edge"), &set);
    assert_eq!(
        required_terms(&out.pod)[0]["matchExpressions"][0],
        pool_in(&["cdn", "edge"])
    );
}

#[test]
fn a_pod_that_cannot_be_read_is_refused_with_the_reason() {
    let set = mk_set(&[cdn()]);
    let pod = json!({"kind": "Pod", "spec": {"containers": "not a list"}});
    let out = admit(&pod, &opted_in("cdn"), &set);
    assert!(out.patch.0.is_empty());
    let denial = out.decision.denial.expect("refused");
    assert!(
        denial.starts_with("berth cannot read this pod: not a readable Pod"),
        "{denial}"
    );
}

#[test]
fn an_empty_term_matches_nothing_and_stays_so() {
    let set = mk_set(&[cdn()]);
    let mut pod = mk_pod("cdn");
    pod["spec"]["affinity"] = json!({"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
        {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a"]}]},
        {"matchExpressions": []}
    ]}}});
    let out = admit(&pod, &opted_in("cdn"), &set);
    let terms = required_terms(&out.pod);
    assert_eq!(
        terms[1],
        json!({"matchExpressions": []}),
        "not widened to every pool node"
    );
    assert_eq!(terms[0]["matchExpressions"][1], pool_in(&["cdn"]));
    assert!(admit(&out.pod, &opted_in("cdn"), &set).patch.0.is_empty());
}

fn masters_avoid_replicas() -> PolicySet {
    mk_set(&[mk_policy(
        "masters",
        json!({"podSelector": {"matchLabels": {"role": "master"}}, "avoid": {"matchLabels": {"role": "replica"}}}),
    )])
}

fn labelled(role: &str) -> Value {
    let mut pod = mk_pod("redis:7");
    pod["metadata"]["labels"] = json!({"role": role});
    pod
}

#[test]
fn avoid_is_symmetric_a_pod_the_policy_avoids_keeps_off_its_pods_nodes() {
    let set = masters_avoid_replicas();
    let out = admit(&labelled("replica"), &opted_in("masters"), &set);
    assert!(
        out.decision.applied.is_empty(),
        "masters does not apply to a replica"
    );
    assert_eq!(
        required_terms(&out.pod)[0]["matchExpressions"],
        json!([{"key": "node-restriction.kubernetes.io/berth.placed.masters", "operator": "DoesNotExist"}])
    );
    assert_eq!(
        out.pod["spec"]["schedulingGates"],
        json!([{"name": "berth.io/avoid"}])
    );
    assert!(
        admit(&out.pod, &opted_in("masters"), &set)
            .patch
            .0
            .is_empty()
    );
}

#[test]
fn a_target_in_a_namespace_that_did_not_opt_in_is_kept_apart_but_never_held() {
    let set = mk_set(&[mk_policy(
        "masters",
        json!({"podSelector": {"matchLabels": {"role": "master"}},
            "avoid": {"matchLabels": {"role": "replica"}}, "anchorNamespaces": "All"}),
    )]);
    let out = admit(&labelled("replica"), &NamespaceInfo::new("elsewhere"), &set);
    assert_eq!(
        required_terms(&out.pod)[0]["matchExpressions"][0]["key"],
        "node-restriction.kubernetes.io/berth.placed.masters"
    );
    assert!(out.pod["spec"].get("schedulingGates").is_none());
}

#[test]
fn a_held_pod_that_names_its_node_is_pinned_there_and_refused_beside_a_pod_it_must_avoid() {
    let set = masters_avoid_replicas();
    let mut pod = labelled("master");
    pod["spec"]["nodeName"] = json!("node4");
    let mut nodes = NodeIndex::new();
    nodes.insert("node4".into(), NodeInfo::default().into());
    let out = admit_with(&pod, &opted_in("masters"), &set, Some(&nodes));
    assert!(out.decision.denial.is_none());
    // The apiserver refuses a gate beside a node name: the name becomes a term, and
    // the pod is held like any other, so two created together cannot both land.
    assert!(out.pod["spec"].get("nodeName").is_none());
    assert_eq!(
        out.pod["spec"]["schedulingGates"],
        json!([{"name": "berth.io/avoid"}])
    );
    assert_eq!(
        required_terms(&out.pod)[0]["matchFields"],
        json!([{"key": "metadata.name", "operator": "In", "values": ["node4"]}])
    );
    let placement =
        feasibility::Placement::after(&PodObject::read(&pod).unwrap(), &out.decision.grants);
    assert_eq!(placement.node_name, None);
    assert!(feasibility::node_fits(&placement, "node4", &NodeInfo::default()).is_ok());
    assert!(feasibility::node_fits(&placement, "node5", &NodeInfo::default()).is_err());
    assert!(
        admit_with(&out.pod, &opted_in("masters"), &set, Some(&nodes))
            .patch
            .0
            .is_empty()
    );

    let mut anchored = NodeInfo::default();
    anchored.labels.insert(
        "node-restriction.kubernetes.io/berth.runs.masters".into(),
        "true".into(),
    );
    nodes.insert("node4".into(), anchored.into());
    let out = admit_with(&pod, &opted_in("masters"), &set, Some(&nodes));
    let denial = out.decision.denial.expect("a replica runs on node4");
    assert!(denial.contains("policy masters"), "{denial}");
}

#[test]
fn a_warning_says_when_the_pods_own_constraints_leave_no_pool_node() {
    let set = mk_set(&[cdn()]);
    let mut pod = mk_pod("cdn");
    pod["spec"]["nodeSelector"] = json!({"disk": "ssd"});
    let mut nodes = NodeIndex::new();
    nodes.insert("node2".into(), NodeInfo::default().into());
    let warned = |set: &PolicySet, nodes: &NodeIndex, policy: &str| {
        let out = admit_with(&pod, &opted_in(policy), set, Some(nodes));
        let warning = format!("no node of pool {policy} fits");
        out.decision
            .warnings
            .iter()
            .any(|w| w.starts_with(&warning))
    };
    assert!(warned(&set, &nodes, "cdn"));
    // The pool's named node has the disk: no warning. A node outside the pool
    // with it changes nothing.
    let ssd = |labels: &[(&str, &str)]| NodeInfo {
        labels: labels
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
        taints: Vec::new(),
    };
    nodes.insert("node9".into(), ssd(&[("disk", "ssd")]).into());
    assert!(warned(&set, &nodes, "cdn"), "node9 is not in the pool");
    nodes.insert("node2".into(), ssd(&[("disk", "ssd")]).into());
    assert!(!warned(&set, &nodes, "cdn"));

    // A pool by node selector looks at every node's labels.
    let gpu = mk_policy(
        "gpu",
        json!({"images": ["*cdn*"], "pool": {"nodeSelector": {"matchLabels": {"node-restriction.kubernetes.io/gpu": "yes"}}}}),
    );
    let set = mk_set(&[gpu]);
    let mut nodes = NodeIndex::new();
    nodes.insert("g1".into(), ssd(&[(GPU_LABEL, "yes")]).into());
    assert!(warned(&set, &nodes, "gpu"));
    nodes.insert(
        "g2".into(),
        ssd(&[(GPU_LABEL, "yes"), ("disk", "ssd")]).into(),
    );
    assert!(!warned(&set, &nodes, "gpu"));
}

#[test]
fn terms_with_only_match_fields_or_empty_expressions_get_berths_expressions() {
    let set = mk_set(&[cdn()]);
    let mut pod = mk_pod("cdn");
    pod["spec"]["affinity"] = json!({"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
        {"matchExpressions": [], "matchFields": [{"key": "metadata.name", "operator": "In", "values": ["node2"]}]},
        {"matchExpressions": [pool_in(&["gpu"]), {"key": "zone", "operator": "Exists"}]}
    ]}}});
    let out = admit(&pod, &opted_in("cdn"), &set);
    let terms = required_terms(&out.pod);
    assert_eq!(terms[0]["matchExpressions"], json!([pool_in(&["cdn"])]));
    assert_eq!(
        terms[1]["matchExpressions"],
        json!([pool_in(&["gpu"]), {"key": "zone", "operator": "Exists"}, pool_in(&["cdn"])]),
        "the pod's own expressions are kept, berth's ANDed in"
    );
    assert!(admit(&out.pod, &opted_in("cdn"), &set).patch.0.is_empty());
}

#[test]
fn avoid_pods_are_held_by_a_scheduling_gate_and_forged_gates_are_removed() {
    let set = mk_set(&[mk_policy(
        "redis",
        json!({"avoid": {"matchLabels": {"app": "redis-master"}}}),
    )]);
    let out = admit(&mk_pod("redis:7"), &opted_in("redis"), &set);
    assert_eq!(
        out.pod["spec"]["schedulingGates"],
        json!([{"name": "berth.io/avoid"}])
    );
    assert!(
        admit(&out.pod, &opted_in("redis"), &set).patch.0.is_empty(),
        "the gate is kept, once"
    );
    let mut forged = mk_pod("nginx");
    forged["spec"]["schedulingGates"] = json!([{"name": "berth.io/avoid"},
        {"name": "example.com/mine"}, {"name": "berth.io/gang"}]);
    let out = admit(&forged, &opted_in(""), &set);
    assert_eq!(
        out.pod["spec"]["schedulingGates"],
        json!([{"name": "example.com/mine"}])
    );
}

fn groups_policy() -> PlacementPolicy {
    mk_policy(
        "release",
        json!({"gang": {}, "startOrder": {}, "queue": {}}),
    )
}

fn with_labels(labels: Value) -> Value {
    let mut pod = mk_pod("nginx");
    pod["metadata"]["labels"] = labels;
    pod
}

fn admit_groups(pod: &Value, groups: groups::GroupContext) -> Outcome {
    let set = mk_set(&[groups_policy()]);
    let ns = opted_in("release");
    let input = Input {
        pod,
        namespace: &ns,
        policies: &set,
        nodes: None,
        requester: Requester::Other,
        groups,
    };
    let decision = decide(&input);
    let patch = build_patch(pod, &decision.grants);
    let mut patched = pod.clone();
    json_patch::patch(&mut patched, &patch).expect("patch applies");
    Outcome {
        decision,
        patch,
        pod: patched,
    }
}

#[test]
fn group_members_are_gated_ranked_and_queued_and_the_result_is_idempotent() {
    let pod = with_labels(json!({"podGroup": "train", "minAvailable": "3",
        "berth.io/rank": "1", "groupPriority": "5"}));
    let out = admit_groups(&pod, Default::default());
    assert_eq!(
        out.pod["spec"]["schedulingGates"],
        json!([{"name": "berth.io/gang"}, {"name": "berth.io/rank"}])
    );
    // BestEffort: 3 x 5 + 0.
    assert_eq!(
        out.pod["spec"]["priorityClassName"],
        "berth-queue-release-15"
    );
    assert_eq!(out.pod["spec"]["priority"], 15);
    assert_eq!(out.pod["spec"]["preemptionPolicy"], "Never");
    let again = admit_groups(&out.pod, Default::default());
    assert!(again.patch.0.is_empty(), "{:?}", again.patch);
}

#[test]
fn native_gangs_join_a_pod_group_without_a_gate_and_share_one_priority() {
    let mut pod = with_labels(json!({"podGroup": "train", "minAvailable": "3",
        "groupPriority": "5", "pod-template-hash": "abc"}));
    pod["spec"]["containers"][0]["resources"] = json!({"limits": {"cpu": "1", "memory": "1Gi"}});
    let native = groups::GroupContext {
        gang_mode: groups::GangMode::PodGroup,
        default_class: None,
    };
    let out = admit_groups(&pod, native);
    let group = out.pod["spec"]["schedulingGroup"]["podGroupName"]
        .as_str()
        .unwrap();
    assert!(group.starts_with("berth-train-"), "{group}");
    assert!(out.pod["spec"].get("schedulingGates").is_none());
    assert_eq!(
        out.pod["spec"]["priority"], 15,
        "a Guaranteed member gets no QoS tie-break: the group shares one priority"
    );
    let again = admit_groups(&out.pod, native);
    assert!(again.patch.0.is_empty(), "idempotent: {:?}", again.patch);
    let gated = admit_groups(&pod, Default::default());
    assert_eq!(gated.pod["spec"]["priority"], 17, "Guaranteed: 3 x 5 + 2");
}

#[test]
fn native_gang_members_that_avoid_each_other_are_held_by_berth_instead() {
    let set = mk_set(&[mk_policy(
        "ring",
        json!({"gang": {}, "avoid": {"matchLabels": {"podGroup": "ring"}}}),
    )]);
    let pod = with_labels(json!({"podGroup": "ring", "minAvailable": "3"}));
    let ns = opted_in("ring");
    let input = Input {
        pod: &pod,
        namespace: &ns,
        policies: &set,
        nodes: None,
        requester: Requester::Other,
        groups: groups::GroupContext {
            gang_mode: groups::GangMode::PodGroup,
            default_class: None,
        },
    };
    let grants = decide(&input).grants;
    assert_eq!(
        grants.pod_group, None,
        "kube-scheduler's gang would wait forever"
    );
    let mut gates = grants.scheduling_gates.clone();
    gates.sort();
    assert_eq!(gates, ["berth.io/avoid", "berth.io/gang"]);
}

#[test]
fn a_pod_keeps_its_own_priority_class_but_not_the_cluster_default() {
    let mut pod = with_labels(json!({"groupPriority": "2"}));
    pod["spec"]["priorityClassName"] = json!("batch-low");
    pod["spec"]["priority"] = json!(10);
    let out = admit_groups(&pod, Default::default());
    assert_eq!(out.pod["spec"]["priorityClassName"], "batch-low");
    assert!(out.decision.warnings.iter().any(|w| w.contains("keeps")));
    let defaulted = groups::GroupContext {
        gang_mode: groups::GangMode::Gate,
        default_class: Some("batch-low"),
    };
    let out = admit_groups(&pod, defaulted);
    assert_eq!(
        out.pod["spec"]["priorityClassName"],
        "berth-queue-release-6"
    );
    assert_eq!(out.pod["spec"]["priority"], 6);
}

#[test]
fn broken_group_labels_warn_and_hold_nothing() {
    let pod = with_labels(json!({"podGroup": "train", "minAvailable": "lots",
        "berth.io/rank": "first", "groupPriority": "-4"}));
    let out = admit_groups(&pod, Default::default());
    assert!(out.pod["spec"].get("schedulingGates").is_none());
    assert!(out.pod["spec"].get("priorityClassName").is_none());
    assert_eq!(
        out.decision.warnings.len(),
        3,
        "{:?}",
        out.decision.warnings
    );
}

#[test]
fn a_comparison_toleration_on_berths_key_is_removed_as_any_forged_one() {
    // A pool named 450 is tainted berth.io/pool=450: `Gt 100` would tolerate it.
    let set = mk_set(&[mk_policy("450", json!({"pool": {"nodeNames": ["node2"]}}))]);
    let mut pod = mk_pod("nginx");
    pod["spec"]["tolerations"] = json!([{"key": "berth.io/pool", "operator": "Gt", "value": "100"},
        {"key": "sla", "operator": "Gt", "value": "900"}]);
    let out = admit(&pod, &NamespaceInfo::new("default"), &set);
    assert_eq!(
        out.pod["spec"]["tolerations"],
        json!([{"key": "sla", "operator": "Gt", "value": "900"}]),
        "berth's own key goes, a comparison on another key stays"
    );
    assert!(
        out.decision
            .warnings
            .iter()
            .any(|w| w.contains("removed toleration berth.io/pool")),
        "{:?}",
        out.decision.warnings
    );
}

#[test]
fn a_policy_expression_written_with_empty_values_is_granted_as_stored() {
    let set = mk_set(&[mk_policy(
        "ssd",
        json!({"nodeAffinity": {"required": [{"key": "disk", "operator": "Exists", "values": []}],
            "preferred": [{"weight": 50, "preference": {"key": "zone", "operator": "In", "values": ["a", "b"]}}]}}),
    )]);
    let out = admit(&mk_pod("nginx"), &opted_in("ssd"), &set);
    assert_eq!(
        required_terms(&out.pod)[0]["matchExpressions"],
        json!([{"key": "disk", "operator": "Exists"}])
    );
    // Stored, the pod spells the preference's values in another order: same meaning.
    let mut stored = out.pod.clone();
    stored["spec"]["affinity"]["nodeAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"]
        [0]["preference"]["matchExpressions"][0]["values"] = json!(["b", "a"]);
    assert!(admit(&stored, &opted_in("ssd"), &set).patch.0.is_empty());
}

/// A namespace's annotations are read once; a copy changed after is read again,
/// and a broken annotation stays an error on every read.
#[test]
fn a_namespace_reads_its_annotations_once_and_a_changed_copy_again() {
    let shop = opted_in("cdn");
    let first: *const NamespaceConfig = shop.config().unwrap();
    assert!(std::ptr::eq(first, shop.config().unwrap()), "read once");
    let mut moved = shop.clone();
    moved
        .annotations
        .insert(crate::names::POLICIES_ANNOTATION.into(), "gpu".into());
    assert_eq!(moved.config().unwrap().policies, ["gpu"]);
    assert_eq!(shop.config().unwrap().policies, ["cdn"]);
    moved
        .annotations
        .insert("berth.io/images.Bad_Name".into(), "*".into());
    let broken = moved.clone();
    assert_eq!(broken.config().unwrap_err().key, "berth.io/images.Bad_Name");
}

#[test]
fn the_namespace_index_answers_opt_in_from_annotations_read_once_and_labels() {
    use crate::policy::OptIn;
    let selecting = mk_policy(
        "edge",
        json!({"images": ["*edge*"], "namespaceSelector": {"matchLabels": {"team": "edge"}},
               "pool": {"nodeNames": ["node3"], "daemonSets": "Tolerate"}}),
    );
    let set = mk_set(&[cdn(), selecting]);
    let (cdn, edge) = (set.get("cdn").unwrap(), set.get("edge").unwrap());
    let mut labelled = NamespaceInfo::new("labelled");
    labelled.labels.insert("team".into(), "edge".into());
    let mut broken = NamespaceInfo::new("broken");
    broken.labels.insert("team".into(), "edge".into());
    broken
        .annotations
        .insert("berth.io/policies".into(), "cdn,,".into());
    assert!(broken.config().is_err(), "the annotation does not parse");
    let index: NamespaceIndex = [opted_in("cdn"), labelled, broken]
        .into_iter()
        .map(|ns| (ns.name.clone(), std::sync::Arc::new(ns)))
        .collect();
    assert!(index.opts_in(cdn, "default"), "named in berth.io/policies");
    assert_eq!(index.named("default"), ["cdn".to_string()]);
    assert!(!index.opts_in(edge, "default"));
    assert!(index.opts_in(edge, "labelled"), "selected by its labels");
    assert!(index.takes_daemonsets(edge, "labelled"));
    assert!(
        !index.opts_in(cdn, "broken"),
        "a broken annotation names nothing"
    );
    assert!(index.named("broken").is_empty());
    assert!(
        index.opts_in(edge, "broken"),
        "its labels are still selected"
    );
    assert!(
        !index.opts_in(cdn, "unknown"),
        "a namespace not in the cache"
    );
}
