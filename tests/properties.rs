//! Property tests of the placement engine over generated pods, namespaces and
//! policies: berth never widens where a pod may land, idempotency, unknown fields
//! survive, entitlement always holds.

mod support;

use berth::names::{self, POOL_LABEL, POOL_TAINT};
use berth::objects::NodeInfo;
use berth::objects::PodObject;
use berth::placement::feasibility::{Placement, node_fits};
use berth::placement::namespace::NamespaceInfo;
use berth::placement::patch::{added, write_patch};
use berth::placement::pod::PodSource;
use berth::placement::{Decision, Grants, Input, Requester, build_patch, decide};
use berth::policy::crd::{Pool, PoolEffect};
use berth::policy::{PlacementPolicy, PolicySet};
use proptest::prelude::*;
use serde_json::{Value, json};
use support::fixtures;

fn arb_selector() -> impl Strategy<Value = Option<Value>> {
    prop_oneof![
        Just(None),
        prop::sample::select(vec!["a", "b", "redis-master"])
            .prop_map(|app| Some(json!({"matchLabels": {"app": app}}))),
    ]
}

prop_compose! {
    fn arb_policy(index: usize)(
        images in prop::sample::subsequence(vec!["*cdn*", "*cuda*", "registry.example.com/*", "docker.io/library/nginx:*"], 0..3),
        pool in prop::option::of((any::<bool>(), any::<bool>(), any::<bool>(), any::<bool>(), 1..=100i32, prop::sample::subsequence(vec!["node1", "node2", "node3"], 1..3))),
        pod_selector in arb_selector(),
        // One of colocateWith and avoid at most: they share the anchor label.
        anchor in prop::option::of((any::<bool>(), arb_selector())),
        gpu in any::<bool>(),
        scheduler in prop::option::of(prop::sample::select(vec!["s1", "s2"])),
    ) -> PlacementPolicy {
        let mut spec = json!({"images": images});
        if let Some((dedicated, no_execute, preferred, exclude_ds, weight, nodes)) = pool {
            spec["pool"] = json!({
                "nodeNames": nodes, "dedicated": dedicated,
                "effect": if no_execute { "NoExecute" } else { "NoSchedule" },
                "placement": if preferred { "Preferred" } else { "Required" },
                "weight": weight, "daemonSets": if exclude_ds { "Exclude" } else { "Tolerate" },
            });
        }
        if let Some(s) = pod_selector { spec["podSelector"] = s; }
        if let Some((colocate, Some(s))) = anchor {
            spec[if colocate { "colocateWith" } else { "avoid" }] = s;
        }
        if gpu {
            spec["nodeAffinity"] = json!({
                "required": [{"key": "gpu", "operator": "In", "values": ["A100"]}],
                "preferred": [{"weight": 10, "preference": {"key": "nvme", "operator": "Exists"}}]});
        }
        if let Some(s) = scheduler { spec["schedulerName"] = json!(s); }
        if spec.get("pool").is_none() && spec.get("nodeAffinity").is_none() && spec.get("colocateWith").is_none()
            && spec.get("avoid").is_none() && spec.get("schedulerName").is_none() {
            spec["schedulerName"] = json!("fallback");
        }
        fixtures::policy(&format!("p{index}"), spec)
    }
}

fn arb_policies() -> impl Strategy<Value = Vec<PlacementPolicy>> {
    (arb_policy(0), arb_policy(1), arb_policy(2), 1..=3usize)
        .prop_map(|(a, b, c, n)| [a, b, c].into_iter().take(n).collect())
}

fn arb_expression() -> impl Strategy<Value = Value> {
    prop_oneof![
        Just(json!({"key": "zone", "operator": "In", "values": ["a", "b"]})),
        Just(json!({"key": "disk", "operator": "Exists"})),
        Just(json!({"key": POOL_LABEL, "operator": "In", "values": ["p0"]})),
        Just(json!({"key": names::anchor_label("p1"), "operator": "DoesNotExist"})),
    ]
}

fn arb_toleration() -> impl Strategy<Value = Value> {
    prop_oneof![
        Just(json!({"operator": "Exists"})),
        Just(json!({"operator": "Exists", "effect": "NoSchedule"})),
        Just(json!({"operator": "Exists", "effect": "NoExecute"})),
        Just(
            json!({"key": POOL_TAINT, "operator": "Equal", "value": "p0", "effect": "NoSchedule"})
        ),
        Just(json!({"key": POOL_TAINT, "operator": "Exists"})),
        Just(json!({"key": "dedicated", "operator": "Equal", "value": "x"})),
    ]
}

prop_compose! {
    fn arb_pod()(
        image in prop::sample::select(vec!["cdn-app", "nginx", "nvidia/cuda:12", "registry.example.com/x/y:1", "Not A Ref"]),
        app in prop::sample::select(vec!["a", "b", "redis-master", "web"]),
        tolerations in prop::option::of(prop::collection::vec(arb_toleration(), 0..4)),
        terms in prop::option::of(prop::collection::vec(prop::collection::vec(arb_expression(), 0..3), 1..3)),
        preferred in prop::option::of(prop::collection::vec(arb_expression(), 0..3)),
        node_name in prop::option::of(prop::sample::select(vec!["node1", "node2", "node9"])),
        scheduler in prop::option::of(prop::sample::select(vec!["default-scheduler", "mine"])),
        daemonset in any::<bool>(),
        forged_annotation in any::<bool>(),
        unknown in "[a-z]{1,8}",
    ) -> Value {
        let mut pod = json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "p", "labels": {"app": app}, "futureMeta": {"k": unknown}},
            "spec": {"containers": [{"name": "c", "image": image, "futureContainer": 1}], "futureSpec": [unknown]}
        });
        if let Some(t) = tolerations { pod["spec"]["tolerations"] = json!(t); }
        if let Some(terms) = terms {
            let terms: Vec<Value> = terms.into_iter().map(|e| json!({"matchExpressions": e})).collect();
            pod["spec"]["affinity"] = json!({"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": terms}}});
        }
        if let Some(p) = preferred {
            let terms: Vec<Value> = p.into_iter().map(|e| json!({"weight": 1, "preference": {"matchExpressions": [e]}})).collect();
            pod["spec"]["affinity"]["nodeAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"] = json!(terms);
        }
        if let Some(n) = node_name { pod["spec"]["nodeName"] = json!(n); }
        if let Some(s) = scheduler { pod["spec"]["schedulerName"] = json!(s); }
        if daemonset {
            pod["metadata"]["ownerReferences"] = json!([{"apiVersion": "apps/v1", "kind": "DaemonSet", "name": "d", "uid": "u", "controller": true}]);
        }
        if forged_annotation { pod["metadata"]["annotations"] = json!({names::APPLIED_ANNOTATION: "p0"}); }
        pod
    }
}

prop_compose! {
    fn arb_namespace()(
        opted in prop::sample::subsequence(vec!["p0", "p1", "p2", "unknown"], 0..4),
        override_images in any::<bool>(),
        broken in prop::sample::select(vec![false, false, false, true]),
    ) -> NamespaceInfo {
        let mut ns = NamespaceInfo::new("team");
        let value = if broken { "p0,,p1".to_owned() } else { opted.join(", ") };
        ns.annotations.insert(names::POLICIES_ANNOTATION.into(), value);
        if override_images {
            ns.annotations.insert(format!("{}p0", names::IMAGES_ANNOTATION_PREFIX), "*nginx*".into());
        }
        ns
    }
}

fn compile(policies: &[PlacementPolicy]) -> PolicySet {
    let (set, errors) = PolicySet::compile(policies);
    assert!(errors.is_empty(), "{errors:?}");
    set
}

/// Admits `pod`; returns the patched pod and the decision's applied policies.
fn admit(pod: &Value, ns: &NamespaceInfo, set: &PolicySet) -> (Value, Vec<String>, usize) {
    let decision = decide_in(pod, ns, set);
    let patch = build_patch(pod, &decision.grants);
    // The webhook writes the same operations as text, straight into its answer.
    let view = pod.view().expect("a generated pod is readable");
    let text = write_patch(&view, &decision.grants)
        .finish()
        .expect("berth's patch is written");
    let written: json_patch::Patch = text.map_or_else(Default::default, |t| {
        serde_json::from_slice(&t).expect("JSON Patch")
    });
    assert_eq!(
        written, patch,
        "the webhook's patch text differs from the patch"
    );
    let mut out = pod.clone();
    json_patch::patch(&mut out, &patch).expect("a patch applies to the pod it was built for");
    (out, decision.grants.applied, patch.0.len())
}

fn dedicated_pools(policies: &[PlacementPolicy]) -> Vec<(String, String)> {
    policies
        .iter()
        .filter_map(|p| {
            let pool = p.spec.pool.as_ref().filter(|pool| pool.dedicated)?;
            Some((
                p.metadata.name.clone().unwrap(),
                pool.effect.as_str().to_owned(),
            ))
        })
        .collect()
}

/// Nodes that tell placements apart: pool, anchor and other labels, and pool and
/// other taints, under the names pods may ask for.
fn probe_nodes() -> Vec<(String, NodeInfo)> {
    let taint = |key: &str, value: &str, effect: &str| k8s_openapi::api::core::v1::Taint {
        key: key.into(),
        value: Some(value.into()),
        effect: effect.into(),
        time_added: None,
    };
    let labels = |pairs: &[(&str, &str)]| {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    };
    let node = |pairs: &[(&str, &str)], taints| NodeInfo {
        labels: labels(pairs),
        taints,
    };
    let anchor = names::anchor_label("p1");
    let shapes = [
        node(&[], vec![]),
        node(
            &[(POOL_LABEL, "p0")],
            vec![taint(POOL_TAINT, "p0", "NoSchedule")],
        ),
        node(
            &[(POOL_LABEL, "p1"), ("zone", "a")],
            vec![taint(POOL_TAINT, "p1", "NoExecute")],
        ),
        node(
            &[("zone", "b"), ("disk", "")],
            vec![taint("other", "x", "NoSchedule")],
        ),
        node(
            &[(anchor.as_str(), "true"), ("zone", "a"), ("disk", "")],
            vec![],
        ),
        node(&[("gpu", "A100"), ("nvme", ""), (POOL_LABEL, "p2")], vec![]),
    ];
    ["node1", "node2", "node9"]
        .iter()
        .flat_map(|name| shapes.iter().map(|n| (name.to_string(), n.clone())))
        .collect()
}

/// Fields of a pod's spec besides those `arb_pod` writes: some admission reads or
/// patches, some it skips unread.
fn arb_spec_extras() -> impl Strategy<Value = Vec<(&'static str, Value)>> {
    prop::sample::subsequence(
        vec![
            ("volumes", json!([{"name": "v", "emptyDir": {}}])),
            ("dnsPolicy", json!("ClusterFirst")),
            ("nodeSelector", json!({"disk": "ssd"})),
            ("priorityClassName", json!("berth-queue-p0-1")),
            ("priority", json!(5)),
            ("preemptionPolicy", json!("Never")),
            ("schedulingGates", json!([{"name": "example.com/wait"}])),
            ("schedulingGroup", json!({"podGroupName": "g"})),
            ("resources", json!({"requests": {"cpu": "1"}})),
            (
                "initContainers",
                json!([{"name": "i", "image": "nginx", "env": [{"name": "A"}]}]),
            ),
        ],
        0..10,
    )
}

/// The pod of a review of `pod`'s CREATE, as admission reads it.
fn as_admission_reads(pod: &Value) -> Result<PodObject, String> {
    let review = json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
        "request": {"uid": "u", "kind": {"group": "", "version": "v1", "kind": "Pod"},
            "operation": "CREATE", "object": pod}});
    berth::admission::review::parse(review.to_string().as_bytes())
        .expect("a review")
        .object
        .and_then(|object| object.pod().cloned())
        .expect("the pod")
}

/// The decision on `pod` in `ns` under `set`, from anyone but the DaemonSet
/// controller.
fn decide_in<P: PodSource + ?Sized>(pod: &P, ns: &NamespaceInfo, set: &PolicySet) -> Decision {
    decide(&Input {
        pod,
        namespace: ns,
        policies: set,
        nodes: None,
        requester: Requester::Other,
        groups: Default::default(),
    })
}

/// What the patch added to the pod, of `grants`, read from the pod before and
/// after it, item by item (as Kubernetes compares them), never from the builder.
fn added_between(before: &PodObject, after: &PodObject, grants: &Grants) -> Grants {
    use berth::placement::canonical::{preferred_key, requirement_key, toleration_key};
    let tolerations = grants
        .tolerations
        .iter()
        .filter(|t| {
            let key = toleration_key(t);
            let has = |pod: &PodObject| pod.tolerations().iter().any(|o| toleration_key(o) == key);
            has(after) && !has(before)
        })
        .cloned()
        .collect();
    let terms = |pod: &PodObject| pod.required_affinity().unwrap_or_default().to_vec();
    let (terms_before, terms_after) = (terms(before), terms(after));
    let required = grants
        .required
        .iter()
        .filter(|r| {
            let key = requirement_key(r);
            let in_term = |term: Option<&k8s_openapi::api::core::v1::NodeSelectorTerm>| {
                term.and_then(|t| t.match_expressions.as_ref())
                    .is_some_and(|e| e.iter().any(|e| requirement_key(e) == key))
            };
            (0..terms_after.len())
                .any(|i| in_term(terms_after.get(i)) && !in_term(terms_before.get(i)))
        })
        .cloned()
        .collect();
    let preferred = grants
        .preferred
        .iter()
        .filter(|p| {
            let key = preferred_key(p);
            let has = |pod: &PodObject| {
                pod.preferred_terms()
                    .iter()
                    .any(|o| preferred_key(o) == key)
            };
            has(after) && !has(before)
        })
        .cloned()
        .collect();
    let scheduling_gates = grants
        .scheduling_gates
        .iter()
        .filter(|g| {
            let has = |pod: &PodObject| pod.scheduling_gates().any(|o| o == g.as_str());
            has(after) && !has(before)
        })
        .cloned()
        .collect();
    let changed = |read: &dyn Fn(&PodObject) -> Option<Value>| read(before) != read(after);
    Grants {
        tolerations,
        required,
        preferred,
        scheduling_gates,
        pod_group: (grants.pod_group.clone())
            .filter(|_| changed(&|p| p.pod_group_name().map(Value::from))),
        priority: grants.priority.clone().filter(|_| {
            changed(&|p| {
                Some(json!([
                    p.priority_class_name(),
                    p.priority(),
                    p.preemption_policy()
                ]))
            })
        }),
        scheduler_name: (grants.scheduler_name.clone())
            .filter(|_| changed(&|p| p.scheduler_name().map(Value::from))),
        applied: Some(grants.applied.clone())
            .filter(|_| changed(&|p| p.applied_record().map(Value::from)))
            .unwrap_or_default(),
        pinned_to: grants.pinned_to.clone(),
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    /// The webhook's "no pool node fits" warning and `explain --nodes` predict the
    /// pod's placement after the patch without applying it.
    #[test]
    fn the_placement_berth_predicts_is_that_of_the_patched_pod(
        policies in arb_policies(), mut pod in arb_pod(), ns in arb_namespace(), extra in 0..3usize,
    ) {
        // Terms of the other shapes: one that matches no node, one of fields only.
        let term = [None, Some(json!({})), Some(json!({"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["node2"]}]}))][extra].clone();
        if let (Some(term), Some(terms)) = (term, pod.pointer_mut("/spec/affinity/nodeAffinity/requiredDuringSchedulingIgnoredDuringExecution/nodeSelectorTerms").and_then(Value::as_array_mut)) {
            terms.push(term);
        }
        let set = compile(&policies);
        let decision = decide(&Input {
            pod: &pod,
            namespace: &ns,
            policies: &set,
            nodes: None,
            requester: Requester::Other,
            groups: Default::default(),
        });
        let predicted = Placement::after(&PodObject::read(&pod).unwrap(), &decision.grants);
        let (out, _, _) = admit(&pod, &ns, &set);
        let patched = Placement::of(&PodObject::read(&out).unwrap());
        for (name, node) in probe_nodes() {
            prop_assert_eq!(
                node_fits(&predicted, &name, &node).is_ok(),
                node_fits(&patched, &name, &node).is_ok(),
                "{} {:?}: predicted {:?}, patched {:?}", name, node, predicted, patched
            );
        }
    }

    /// Judged on the pods alone (as written, and as berth returns it), never on
    /// berth's own account of its decision: the patched pod may land only where
    /// the pod as written could, or on a dedicated pool it is entitled to (the
    /// pool's toleration is the one thing berth adds that lets a pod in).
    #[test]
    fn berth_never_widens_where_a_pod_may_land(
        policies in arb_policies(), pod in arb_pod(), ns in arb_namespace(),
    ) {
        let set = compile(&policies);
        let (out, applied, _) = admit(&pod, &ns, &set);
        let before = Placement::of(&PodObject::read(&pod).unwrap());
        let after = Placement::of(&PodObject::read(&out).unwrap());
        for (name, node) in probe_nodes() {
            let entitled_pool = node.taints.iter().any(|t| {
                t.key == POOL_TAINT
                    && applied.iter().any(|a| Some(a.as_str()) == t.value.as_deref())
            });
            if node_fits(&after, &name, &node).is_ok() && !entitled_pool {
                prop_assert!(
                    node_fits(&before, &name, &node).is_ok(),
                    "{} {:?}: the pod as written could not land there, berth's output can: {} from {}",
                    name, node, out, pod
                );
            }
        }
    }

    #[test]
    fn admitting_the_output_again_yields_an_empty_patch(policies in arb_policies(), pod in arb_pod(), ns in arb_namespace()) {
        let set = compile(&policies);
        let (once, _, _) = admit(&pod, &ns, &set);
        let (twice, _, ops) = admit(&once, &ns, &set);
        prop_assert_eq!(ops, 0, "second patch not empty; after it: {}", twice);
    }

    /// What `explain` marks as added (`+`) is exactly what the patch adds, item by
    /// item; the rest (`=`) the pod had already, or berth leaves it off a
    /// required node affinity that matches no node. Checked on the pod as
    /// written and on berth's output, which has everything already.
    #[test]
    fn what_explain_calls_added_is_what_the_patch_adds(
        policies in arb_policies(), mut pod in arb_pod(), ns in arb_namespace(), extra in 0..4usize,
    ) {
        // Required node affinities of the other shapes: a term that matches no
        // node beside others, only such terms, and none at all.
        let required = "/spec/affinity/nodeAffinity/requiredDuringSchedulingIgnoredDuringExecution";
        match extra {
            1 => if let Some(terms) = pod.pointer_mut(&format!("{required}/nodeSelectorTerms")).and_then(Value::as_array_mut) {
                terms.push(json!({}));
            },
            2 => pod["spec"]["affinity"] = json!({"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [{}]}}}),
            3 => pod["spec"]["affinity"] = json!({"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": []}}}),
            _ => {}
        }
        let set = compile(&policies);
        let (out, _, _) = admit(&pod, &ns, &set);
        for written in [&pod, &out] {
            let grants = decide_in(written, &ns, &set).grants;
            let mut patched = written.clone();
            json_patch::patch(&mut patched, &build_patch(written, &grants)).unwrap();
            let (before, after) = (PodObject::read(written).unwrap(), PodObject::read(&patched).unwrap());
            prop_assert_eq!(added(written, &grants), added_between(&before, &after, &grants), "{}", written);
        }
    }

    #[test]
    fn unknown_fields_survive(policies in arb_policies(), pod in arb_pod(), ns in arb_namespace()) {
        let set = compile(&policies);
        let (out, _, _) = admit(&pod, &ns, &set);
        prop_assert_eq!(&out["metadata"]["futureMeta"], &pod["metadata"]["futureMeta"]);
        prop_assert_eq!(&out["spec"]["futureSpec"], &pod["spec"]["futureSpec"]);
        prop_assert_eq!(&out["spec"]["containers"], &pod["spec"]["containers"]);
    }

    #[test]
    fn a_pod_not_entitled_to_a_dedicated_pool_never_keeps_its_toleration(policies in arb_policies(), pod in arb_pod(), ns in arb_namespace()) {
        let set = compile(&policies);
        let (out, applied, _) = admit(&pod, &ns, &set);
        for toleration in out["spec"]["tolerations"].as_array().into_iter().flatten() {
            if toleration["key"] == POOL_TAINT {
                let pool = toleration["value"].as_str().unwrap_or_default();
                prop_assert!(applied.iter().any(|a| a == pool), "kept {} without entitlement", toleration);
            }
        }
    }

    #[test]
    fn a_wildcard_toleration_always_ends_with_the_exclusion_in_every_term(
        mut policies in arb_policies(), mut pod in arb_pod(), ns in arb_namespace(), effect in prop::option::of(prop::sample::select(vec!["NoSchedule", "NoExecute"])),
    ) {
        // Shape the inputs so every case has something to exclude: an ordinary pod
        // with a wildcard toleration, and a dedicated pool in the first policy.
        pod["metadata"].as_object_mut().unwrap().remove("ownerReferences");
        let wildcard = match effect { Some(e) => json!({"operator": "Exists", "effect": e}), None => json!({"operator": "Exists"}) };
        match pod["spec"]["tolerations"].as_array_mut() {
            Some(list) => list.push(wildcard),
            None => pod["spec"]["tolerations"] = json!([wildcard]),
        }
        policies[0].spec.pool = Some(Pool {
            node_names: vec!["node1".into()],
            dedicated: true,
            effect: if effect == Some("NoExecute") { PoolEffect::NoExecute } else { PoolEffect::NoSchedule },
            ..Pool::default()
        });
        let set = compile(&policies);
        let (out, applied, _) = admit(&pod, &ns, &set);
        let tolerations = pod["spec"]["tolerations"].as_array().cloned().unwrap_or_default();
        let wildcard_for = |effect: &str| tolerations.iter().any(|t| t.get("key").is_none() && t["operator"] == "Exists"
            && (t.get("effect").is_none() || t["effect"] == effect));
        let excluded: Vec<String> = dedicated_pools(&policies).into_iter()
            .filter(|(name, effect)| !applied.contains(name) && wildcard_for(effect))
            .map(|(name, _)| name).collect();
        if excluded.is_empty() {
            // Entitled to every pool it could reach: nothing to exclude.
            return Ok(());
        }
        let terms = out.pointer("/spec/affinity/nodeAffinity/requiredDuringSchedulingIgnoredDuringExecution/nodeSelectorTerms")
            .and_then(Value::as_array).cloned().unwrap_or_default();
        prop_assert!(!terms.is_empty());
        for term in &terms {
            // An empty term matches no node: it needs no exclusion, and gets none.
            let empty = ["matchExpressions", "matchFields"].iter()
                .all(|k| term[k].as_array().is_none_or(|a| a.is_empty()));
            let keeps_off = term["matchExpressions"].as_array().into_iter().flatten().any(|e| {
                e["key"] == POOL_LABEL && e["operator"] == "NotIn"
                    && excluded.iter().all(|p| e["values"].as_array().unwrap().contains(&json!(p)))
            });
            prop_assert!(empty || keeps_off, "term {} lacks the exclusion of {:?}", term, excluded);
        }
    }

    /// Admission reads only part of a pod (most of its spec and its containers'
    /// details are skipped unread): what it reads decides and patches as the whole
    /// pod does.
    #[test]
    fn what_admission_reads_of_a_pod_decides_and_patches_as_the_whole_pod(
        policies in arb_policies(), mut pod in arb_pod(), ns in arb_namespace(), extras in arb_spec_extras(),
    ) {
        for (key, value) in extras {
            pod["spec"][key] = value;
        }
        let lean = as_admission_reads(&pod);
        let set = compile(&policies);
        let (whole_decision, lean_decision) = (decide_in(&pod, &ns, &set), decide_in(&lean, &ns, &set));
        prop_assert_eq!(format!("{:?}", lean_decision), format!("{:?}", whole_decision));
        prop_assert_eq!(
            build_patch(&lean, &lean_decision.grants),
            build_patch(&pod, &whole_decision.grants)
        );
    }
}
