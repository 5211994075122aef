//! berth checked against Kubernetes' own code, on generated worlds: where a pod
//! may run before and after berth is decided by the apiserver's validation and
//! kube-scheduler's node-affinity and taint code (`k8s.io/component-helpers`), run
//! by the oracle (tests/cluster/oracle), and the contract's promises are checked
//! as set equations over those answers. Nothing here asks berth whether berth is
//! right: the expectations come from the contract's words (`differential/expect`),
//! the judgement from Kubernetes.
//!
//! `make test` runs `SEMANTICS_WORLDS` worlds (default 150, seconds);
//! `make test-semantics` runs the long version and prints the counts. A failure
//! prints the seed (`SEMANTICS_SEED`) that reproduces it.

#![cfg(feature = "oracle")]

mod differential;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use berth::admission::cel;
use berth::names::{self, BERTH_SERVICE_ACCOUNT};
use berth::objects::PodObject;
use berth::objects::{NodeIndex, NodeInfo};
use berth::placement::entitlement::{Standing, pool_breaches, pool_nodes};
use berth::placement::feasibility::{Placement, node_fits};
use berth::placement::matching::opts_in;
use berth::placement::namespace::NamespaceInfo;
use berth::placement::{Decision, Input, Requester, build_patch, decide};
use berth::policy::{NamespaceConfig, PlacementPolicy, PolicySet};
use differential::expect::{Expected, Pools, Tally, canonical_requirement, expect, scoring_pod};
use differential::oracle::{Oracle, PodAnswer};
use differential::world::{DAEMONSET_CONTROLLER, POOL_TAINT, World, arb_world, compile};
use k8s_openapi::api::core::v1::{Namespace, Node};
use proptest::prelude::{Just, any, prop, prop_oneof};
use proptest::strategy::{BoxedStrategy, Strategy, ValueTree};
use proptest::test_runner::{Config, RngAlgorithm, TestRng, TestRunner};
use serde_json::{Value, json};

fn env_number(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// `count` worlds from the seed `SEMANTICS_SEED` (a fixed one by default, so that
/// `make test` is repeatable), each with its index.
fn worlds(count: u64) -> impl Iterator<Item = (u64, World)> {
    let seed = env_number("SEMANTICS_SEED", 23);
    let mut bytes = [0u8; 32];
    bytes[..8].copy_from_slice(&seed.to_le_bytes());
    let rng = TestRng::from_seed(RngAlgorithm::ChaCha, &bytes);
    let mut runner = TestRunner::new_with_rng(Config::default(), rng);
    let strategy = arb_world();
    (0..count).map(move |i| {
        let world = strategy.new_tree(&mut runner).expect("a world").current();
        (i, world)
    })
}

fn node_index(nodes: &[Value]) -> NodeIndex {
    nodes
        .iter()
        .map(|n| {
            let node: Node = serde_json::from_value(n.clone()).expect("a Node");
            (
                node.metadata.name.clone().unwrap(),
                Arc::new(NodeInfo::from_node(&node)),
            )
        })
        .collect()
}

fn namespace_info(namespace: &Value) -> NamespaceInfo {
    let namespace: Namespace = serde_json::from_value(namespace.clone()).expect("a Namespace");
    NamespaceInfo::from_namespace(&namespace)
}

fn namespace_of<'w>(world: &'w World, pod: &Value) -> &'w Value {
    let name = &pod["metadata"]["namespace"];
    world
        .namespaces
        .iter()
        .find(|n| &n["metadata"]["name"] == name)
        .expect("the pod's namespace")
}

fn requester(daemonset: bool) -> Requester {
    if daemonset {
        Requester::from_username(DAEMONSET_CONTROLLER)
    } else {
        Requester::Other
    }
}

/// One pod as berth admitted it, in one of its forms.
struct Admission {
    /// `p3 in ns-all, as written` or `..., as served`: which pod and form.
    label: String,
    form: Value,
    daemonset: bool,
    namespace: NamespaceInfo,
    decision: Decision,
    /// The pod after berth's patch; `None` when berth denied it.
    mutated: Option<Value>,
    expected: Expected,
}

struct Judged {
    original: PodAnswer,
    mutated: Option<PodAnswer>,
    tolerating: PodAnswer,
    required: Option<PodAnswer>,
    scoring: PodAnswer,
}

fn admit(
    label: String,
    form: Value,
    daemonset: bool,
    world: &World,
    pools: &Pools,
    set: &PolicySet,
    index: &NodeIndex,
) -> Admission {
    let namespace_json = namespace_of(world, &form);
    let namespace = namespace_info(namespace_json);
    let decision = decide(&Input {
        pod: &form,
        namespace: &namespace,
        policies: set,
        nodes: Some(index),
        requester: requester(daemonset),
        groups: Default::default(),
    });
    let mutated = decision.denial.is_none().then(|| {
        let mut pod = form.clone();
        json_patch::patch(&mut pod, &build_patch(&form, &decision.grants))
            .expect("berth's patch applies");
        pod
    });
    let expected = expect(pools, namespace_json, &form, daemonset);
    Admission {
        label,
        form,
        daemonset,
        namespace,
        decision,
        mutated,
        expected,
    }
}

fn set_of(flags: &[bool]) -> BTreeSet<usize> {
    (0..flags.len()).filter(|&i| flags[i]).collect()
}

fn required_terms(pod: &Value) -> Option<&Value> {
    pod.pointer("/spec/affinity/nodeAffinity/requiredDuringSchedulingIgnoredDuringExecution")
}

fn expressions(term: &Value) -> BTreeSet<String> {
    term.get("matchExpressions")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .map(|e| canonical_requirement(e).to_string())
        .collect()
}

fn is_empty_term(term: &Value) -> bool {
    ["matchExpressions", "matchFields"].iter().all(|k| {
        term.get(*k)
            .and_then(Value::as_array)
            .is_none_or(Vec::is_empty)
    })
}

fn canonical_toleration(t: &Value) -> String {
    let text = |k: &str| t.get(k).and_then(Value::as_str).unwrap_or("").to_owned();
    let operator = match text("operator").as_str() {
        "" => "Equal".to_owned(),
        op => op.to_owned(),
    };
    json!([
        text("key"),
        operator,
        text("value"),
        text("effect"),
        t.get("tolerationSeconds")
    ])
    .to_string()
}

fn tolerations(pod: &Value, owned: bool) -> Vec<Value> {
    pod["spec"]["tolerations"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|t| (t.get("key").and_then(Value::as_str) == Some(POOL_TAINT)) == owned)
        .cloned()
        .collect()
}

/// The contract's promises for one admission, judged by Kubernetes' answers.
fn check(
    a: &Admission,
    j: &Judged,
    world: &World,
    pools: &Pools,
    set: &PolicySet,
    index: &NodeIndex,
    tally: &mut Tally,
) {
    let names: Vec<String> = pools
        .nodes
        .iter()
        .map(|n| n["metadata"]["name"].as_str().unwrap().to_owned())
        .collect();
    let context = || {
        format!(
            "{}:\n  pod {}\n  decision {:?}\n  mutated {}\n  world {:?}",
            a.label,
            a.form,
            a.decision.grants,
            a.mutated
                .as_ref()
                .map(Value::to_string)
                .unwrap_or("denied".into()),
            world.policies
        )
    };
    let e = &a.expected;
    let mut applied = a.decision.grants.applied.clone();
    applied.sort();
    tally.check(
        "the policies that apply are the contract's",
        applied == e.applied,
        || {
            format!(
                "berth {:?}, contract {:?}; {}",
                applied,
                e.applied,
                context()
            )
        },
    );

    // Where the pod may run after berth, by Kubernetes' code: nowhere if denied.
    let after: BTreeSet<usize> = j
        .mutated
        .as_ref()
        .map(|m| set_of(&m.placeable()))
        .unwrap_or_default();
    let all: BTreeSet<usize> = (0..names.len()).collect();
    let tolerating = set_of(&j.tolerating.placeable());
    let required = j
        .required
        .as_ref()
        .map(|r| set_of(&r.fits))
        .unwrap_or_else(|| all.clone());
    let pool = e.pool_nodes.clone().unwrap_or_else(|| all.clone());
    let exact: BTreeSet<usize> = tolerating
        .iter()
        .filter(|i| required.contains(i) && pool.contains(i) && !e.closed.contains(i))
        .filter(|_| !e.names_a_closed_node)
        .copied()
        .collect();
    tally.check(
        "placed exactly: (tolerating ∩ required ∩ pool) minus closed pools",
        after == exact,
        || format!("after berth {after:?}, contract {exact:?} (tolerating {tolerating:?}, required {required:?}, pool {pool:?}, closed {:?}); why not: {:?}, refused for: {:?}; {}", e.closed, j.mutated.as_ref().map(|m| &m.why), j.mutated.as_ref().map(|m| &m.errors), context()),
    );
    let before = set_of(&j.original.placeable());
    tally.check(
        "never wider than the original but for entitled pools",
        after
            .iter()
            .all(|i| before.contains(i) || e.entitled_nodes.contains(i)),
        || {
            format!(
                "after {after:?}, before {before:?}, entitled {:?}; {}",
                e.entitled_nodes,
                context()
            )
        },
    );

    // berth's own reading of the pod agrees with Kubernetes' (explain --nodes).
    let view = PodObject::read(&a.form).expect("berth reads generated pods");
    let infos: Vec<Arc<NodeInfo>> = names.iter().map(|n| index[n].clone()).collect();
    let berth_before: Vec<bool> = names
        .iter()
        .zip(&infos)
        .map(|(n, info)| node_fits(&Placement::of(&view), n, info).is_ok())
        .collect();
    tally.check(
        "explain reads the original pod as Kubernetes does",
        berth_before == j.original.fits,
        || {
            format!(
                "berth {berth_before:?}, Kubernetes {:?} ({:?}); {}",
                j.original.fits,
                j.original.why,
                context()
            )
        },
    );

    let (Some(mutated), Some(judged)) = (a.mutated.as_ref(), j.mutated.as_ref()) else {
        return;
    };
    let placement = Placement::after(&view, &a.decision.grants);
    let berth_after: Vec<bool> = names
        .iter()
        .zip(&infos)
        .map(|(n, info)| node_fits(&placement, n, info).is_ok())
        .collect();
    tally.check(
        "explain --nodes says where the mutated pod may run",
        berth_after == judged.fits,
        || {
            format!(
                "berth {berth_after:?}, Kubernetes {:?} ({:?}); {}",
                judged.fits,
                judged.why,
                context()
            )
        },
    );
    tally.check(
        "preferences are added once: the scores are the contract's",
        judged.scores == j.scoring.scores,
        || {
            format!(
                "berth's pod scores {:?}, contract {:?} ({:?}); {}",
                judged.scores,
                j.scoring.scores,
                e.preferred,
                context()
            )
        },
    );

    // Required node affinity: ANDed into every term that matches something; a
    // term or a list of terms that matches nothing stays so.
    if let Some(own) = required_terms(&a.form).filter(|r| r.is_object()) {
        let kept = required_terms(mutated);
        let own_terms = own.get("nodeSelectorTerms").and_then(Value::as_array);
        let holds = match (
            own_terms,
            kept.and_then(|k| k.get("nodeSelectorTerms"))
                .and_then(Value::as_array),
        ) {
            (Some(own_terms), Some(terms)) if !own_terms.is_empty() => {
                own_terms.len() == terms.len()
                    && own_terms.iter().zip(terms).all(|(o, t)| {
                        if is_empty_term(o) {
                            o == t
                        } else {
                            let have = expressions(t);
                            expressions(o).is_subset(&have)
                                && e.required_expressions
                                    .iter()
                                    .all(|r| have.contains(&canonical_requirement(r).to_string()))
                                && o.get("matchFields") == t.get("matchFields")
                        }
                    })
            }
            // No terms, in whatever spelling: berth adds none.
            _ => kept == Some(own),
        };
        tally.check(
            "required expressions are ANDed into every term, none added",
            holds,
            context,
        );
    }

    // Tolerations: the pod's own kept verbatim, the entitled pools' added once.
    let owned: Vec<String> = tolerations(mutated, true)
        .iter()
        .map(canonical_toleration)
        .collect();
    let distinct: BTreeSet<&String> = owned.iter().collect();
    let wanted: BTreeSet<String> = e
        .pool_tolerations
        .iter()
        .map(canonical_toleration)
        .collect();
    tally.check(
        "tolerations: the pod's own verbatim, each entitled pool's once",
        tolerations(mutated, false) == tolerations(&a.form, false)
            && distinct.len() == owned.len()
            && distinct.into_iter().cloned().collect::<BTreeSet<_>>() == wanted,
        context,
    );

    // Idempotent: on berth's output, and on that output as the apiserver stores it.
    let again = |pod: &Value| {
        let decision = decide(&Input {
            pod,
            namespace: &a.namespace,
            policies: set,
            nodes: Some(index),
            requester: requester(a.daemonset),
            groups: Default::default(),
        });
        build_patch(pod, &decision.grants)
    };
    let patch = again(mutated);
    tally.check(
        "admitting berth's output again changes nothing",
        patch.0.is_empty(),
        || {
            format!(
                "patch {}; {}",
                serde_json::to_string(&patch).unwrap(),
                context()
            )
        },
    );
    if let Some(stored) = judged.stored.as_ref().filter(|_| judged.valid) {
        let patch = again(stored);
        tally.check(
            "admitting berth's output as stored changes nothing",
            patch.0.is_empty(),
            || {
                format!(
                    "patch {}; stored {stored}; {}",
                    serde_json::to_string(&patch).unwrap(),
                    context()
                )
            },
        );
    }
}

fn judge_world(oracle: &mut Oracle, world: &World, tally: &mut Tally) {
    let pools = Pools::of(world);
    let set = compile(world);
    let index = node_index(&pools.nodes);
    let untainted = pools.untainted();
    // The webhook sees a pod as the apiserver decoded it; berth mutate as written.
    let raw: Vec<Value> = world.pods.iter().map(|c| c.pod.clone()).collect();
    let served = oracle.evaluate(&raw, &pools.nodes);
    let mut admissions = Vec::new();
    for (case, answer) in world.pods.iter().zip(&served) {
        let name = format!(
            "{} in {}",
            case.pod["metadata"]["name"], case.pod["metadata"]["namespace"]
        );
        admissions.push(admit(
            format!("{name}, as written"),
            case.pod.clone(),
            case.daemonset,
            world,
            &pools,
            &set,
            &index,
        ));
        if let Some(stored) = &answer.stored {
            admissions.push(admit(
                format!("{name}, as served"),
                stored.clone(),
                case.daemonset,
                world,
                &pools,
                &set,
                &index,
            ));
        }
    }
    let mut tainted_batch = Vec::new();
    let mut untainted_batch = Vec::new();
    for a in &admissions {
        tainted_batch.push(a.form.clone());
        tainted_batch.push(a.mutated.clone().unwrap_or_else(|| a.form.clone()));
        tainted_batch.push(a.expected.tolerating.clone());
        untainted_batch.push(scoring_pod(&a.expected.preferred));
        untainted_batch.push(
            a.expected
                .required
                .clone()
                .unwrap_or_else(|| scoring_pod(&[])),
        );
    }
    let mut tainted = oracle.evaluate(&tainted_batch, &pools.nodes).into_iter();
    let mut plain = oracle.evaluate(&untainted_batch, &untainted).into_iter();
    for a in &admissions {
        let original = tainted.next().unwrap();
        let mutated = tainted.next().unwrap();
        let tolerating = tainted.next().unwrap();
        let scoring = plain.next().unwrap();
        let required = plain.next().unwrap();
        let judged = Judged {
            original,
            mutated: a.mutated.as_ref().map(|_| mutated),
            tolerating,
            required: a.expected.required.as_ref().map(|_| required),
            scoring,
        };
        check(a, &judged, world, &pools, &set, &index, tally);
    }
}

fn finish(tally: &Tally, title: &str) {
    println!("{}", tally.report(title));
    assert_eq!(
        tally.violations(),
        0,
        "{} violations (seed {}); the first:\n{}",
        tally.violations(),
        env_number("SEMANTICS_SEED", 23),
        tally.examples.join("\n\n")
    );
}

#[test]
fn kubernetes_own_node_affinity_table_agrees_with_berths_reading() {
    let mut oracle = Oracle::start();
    let seeds = oracle.seeds();
    assert!(
        seeds.len() >= 20,
        "Kubernetes' table has its cases: {}",
        seeds.len()
    );
    let mut tally = Tally::default();
    for seed in &seeds {
        let mut pod = seed.pod.clone();
        pod["metadata"] = json!({"name": "seed", "namespace": "default"});
        pod["spec"]["containers"] = json!([{"name": "c", "image": "nginx"}]);
        let node: Node = serde_json::from_value(seed.node.clone()).expect("a Node");
        let name = node.metadata.name.clone().unwrap_or_default();
        let view = PodObject::read(&pod).expect("berth reads the table's pods");
        let fits = node_fits(&Placement::of(&view), &name, &NodeInfo::from_node(&node)).is_ok();
        tally.check(
            "berth matches as Kubernetes' own table says",
            fits == seed.want,
            || format!("{}: berth {fits}, the table {}", seed.name, seed.want),
        );
    }
    finish(&tally, &format!("Kubernetes' table: {} cases", seeds.len()));
}

/// Requests or limits as a user writes them: a few of CPU, memory, a hugepage
/// size and ephemeral storage (which the QoS class ignores), zero included.
fn arb_resource_list() -> impl Strategy<Value = Value> {
    let name = prop::sample::select(vec!["cpu", "memory", "hugepages-2Mi", "ephemeral-storage"]);
    let amount = prop::sample::select(vec![
        "0", "1", "1000m", "500m", "2", "100Mi", "1Gi", "1024Mi",
    ]);
    prop::collection::btree_map(name, amount, 0..4).prop_map(|list| json!(list))
}

/// A container's (or a pod's own) resources: requests, and limits that are left
/// out, the requests again (the usual Guaranteed pod), or a list of their own.
fn arb_requirements() -> impl Strategy<Value = Value> {
    let limits = prop_oneof![
        Just(None),
        Just(Some(None)),
        arb_resource_list().prop_map(|l| Some(Some(l)))
    ];
    (prop::option::of(arb_resource_list()), limits).prop_map(|(requests, limits)| {
        let mut resources = json!({});
        if let Some(requests) = &requests {
            resources["requests"] = requests.clone();
        }
        match limits {
            None => {}
            Some(None) => resources["limits"] = requests.unwrap_or_else(|| json!({})),
            Some(Some(limits)) => resources["limits"] = limits,
        }
        resources
    })
}

/// CPU and memory both requested and limited alike, of the amounts given: what
/// makes a container Guaranteed, unless an amount is zero.
fn arb_guaranteed_of(cpu: Vec<&'static str>, memory: Vec<&'static str>) -> BoxedStrategy<Value> {
    (prop::sample::select(cpu), prop::sample::select(memory))
        .prop_map(|(cpu, memory)| {
            let both = json!({"cpu": cpu, "memory": memory});
            json!({"requests": both, "limits": both})
        })
        .boxed()
}

fn arb_guaranteed() -> BoxedStrategy<Value> {
    let amounts = vec!["0", "1", "1000m", "2", "1Gi", "1024Mi"];
    arb_guaranteed_of(amounts.clone(), amounts)
}

/// A pod of one to three containers and up to two init containers (sidecars or
/// not), with pod-level resources half the time. A third of the pods have every
/// container (or the pod itself) Guaranteed-shaped, which unrelated lists seldom
/// are.
fn arb_resource_pod() -> impl Strategy<Value = Value> {
    let pod = |requirements: BoxedStrategy<Value>, own: BoxedStrategy<Option<Value>>| {
        let containers = |range| prop::collection::vec(requirements.clone(), range);
        let sidecars = prop::collection::vec(any::<bool>(), 2);
        (containers(1..4), containers(0..3), sidecars, own)
    };
    let half = |own: BoxedStrategy<Value>| prop::option::weighted(0.5, own).boxed();
    // Pod-level limits alone over Guaranteed containers: the apiserver fills the
    // pod's requests (and limits) from what the containers, sidecars counted
    // apart, add up to, and the class turns on the sum.
    let small = arb_guaranteed_of(vec!["500m", "1"], vec!["512Mi", "1Gi"]);
    let (cpu, memory) = (
        vec!["1", "1500m", "2", "3"],
        vec!["1Gi", "1536Mi", "2Gi", "3Gi"],
    );
    let limits_alone = (prop::sample::select(cpu), prop::sample::select(memory))
        .prop_map(|(cpu, memory)| Some(json!({"limits": {"cpu": cpu, "memory": memory}})))
        .boxed();
    prop_oneof![
        2 => pod(arb_requirements().boxed(), half(arb_requirements().boxed())),
        1 => pod(arb_guaranteed(), half(arb_guaranteed())),
        1 => pod(small, limits_alone),
    ]
    .prop_map(|(containers, init, sidecars, pod_level)| {
        let named = |prefix: &str, list: Vec<Value>| -> Vec<Value> {
            list.into_iter()
                .enumerate()
                .map(|(i, resources)| {
                    json!({"name": format!("{prefix}{i}"), "image": "nginx", "resources": resources})
                })
                .collect()
        };
        let mut init = named("i", init);
        // A sidecar is an init container that keeps running beside the others.
        for (container, sidecar) in init.iter_mut().zip(sidecars) {
            if sidecar {
                container["restartPolicy"] = json!("Always");
            }
        }
        let mut pod = json!({"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "qos", "namespace": "default"},
            "spec": {"containers": named("c", containers), "initContainers": init}});
        if let Some(resources) = pod_level {
            pod["spec"]["resources"] = resources;
        }
        pod
    })
}

/// The QoS class orders a queue (`qosTieBreak`): berth's reading of it is the
/// class Kubernetes' pod registry records at create (`PrepareForCreate`, after it
/// has filled in the pod-level resources the webhook never sees filled), on
/// generated requests and limits, container and pod level, sidecars among the
/// init containers, of every pod the apiserver accepts.
#[test]
fn berth_reads_the_qos_class_kubernetes_computes() {
    let mut oracle = Oracle::start();
    let mut runner = TestRunner::new_with_rng(
        Config::default(),
        TestRng::from_seed(RngAlgorithm::ChaCha, &[7; 32]),
    );
    let strategy = arb_resource_pod();
    let pods: Vec<Value> = (0..env_number("SEMANTICS_QOS_PODS", 3000))
        .map(|_| strategy.new_tree(&mut runner).expect("a pod").current())
        .collect();
    let mut tally = Tally::default();
    let mut classes: BTreeMap<String, usize> = BTreeMap::new();
    let mut pod_level = 0;
    for (pod, answer) in pods.iter().zip(oracle.evaluate(&pods, &[])) {
        let Some(stored) = answer.stored.filter(|_| answer.valid) else {
            continue;
        };
        // As the webhook reads it (before the apiserver fills pod-level resources
        // in) and as the controller reads it once stored.
        for (property, read) in [
            (
                "berth's QoS class of the pod as admitted is Kubernetes'",
                pod,
            ),
            (
                "berth's QoS class of the pod as stored is Kubernetes'",
                &stored,
            ),
        ] {
            let view = PodObject::read(read).expect("berth reads a pod the apiserver accepts");
            let berth = format!("{:?}", view.qos_class());
            tally.check(property, berth == answer.qos, || {
                format!(
                    "berth {berth}, Kubernetes {} for {}, stored as {}",
                    answer.qos, pod["spec"], stored["spec"]
                )
            });
        }
        *classes.entry(answer.qos).or_default() += 1;
        pod_level += usize::from(stored["spec"]["resources"].is_object());
    }
    // Every class, and pods whose own resources decide, among those accepted.
    for class in ["Guaranteed", "Burstable", "BestEffort"] {
        assert!(
            classes.get(class).copied().unwrap_or(0) >= 20,
            "too few accepted {class} pods to judge by: {classes:?}"
        );
    }
    assert!(
        pod_level >= 20,
        "too few accepted pods with pod-level resources: {pod_level}"
    );
    finish(
        &tally,
        &format!(
            "QoS: {} generated pods, accepted by class {classes:?}, {pod_level} with pod-level resources",
            pods.len()
        ),
    );
}

/// Worlds built around each case of Kubernetes' own table, the first cases of the
/// differential test: the table's pod in each namespace, its node beside nodes of
/// a dedicated Required pool and a pool by nodeSelector.
fn seeded_worlds(oracle: &mut Oracle) -> Vec<World> {
    let mut worlds = Vec::new();
    for seed in oracle.seeds() {
        let mut node = seed.node.clone();
        if node["metadata"]["name"]
            .as_str()
            .unwrap_or_default()
            .is_empty()
        {
            node["metadata"]["name"] = json!("seed");
        }
        node["spec"] = json!({"taints": []});
        let nodes = vec![
            node,
            json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "n1", "labels": {"zone": "a", "foo": "bar"}}, "spec": {"taints": []}}),
            json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "n2", "labels": {"zone": "b", "node-restriction.kubernetes.io/pool": "edge"}}, "spec": {"taints": [{"key": "dedicated", "value": "team", "effect": "NoSchedule"}]}}),
        ];
        let policies = vec![
            json!({"apiVersion": "berth.io/v1alpha1", "kind": "PlacementPolicy",
                "metadata": {"name": "cdn", "creationTimestamp": "2026-01-01T00:00:00Z"},
                "spec": {"pool": {"nodeNames": ["n1"]}}}),
            json!({"apiVersion": "berth.io/v1alpha1", "kind": "PlacementPolicy",
                "metadata": {"name": "edge", "creationTimestamp": "2026-01-02T00:00:00Z"},
                "spec": {"pool": {"nodeSelector": {"matchLabels": {"node-restriction.kubernetes.io/pool": "edge"}}, "placement": "Preferred"},
                    "nodeAffinity": {"preferred": [{"weight": 50, "preference": {"key": "foo", "operator": "Exists", "values": []}}]}}}),
        ];
        let namespaces: Vec<Value> = differential::world::NAMESPACES
            .iter()
            .zip([Some("cdn, edge"), Some("cdn"), None])
            .map(|(name, opt)| {
                let annotations = opt
                    .map(|o| json!({names::POLICIES_ANNOTATION: o}))
                    .unwrap_or(json!({}));
                json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name,
                    "labels": {"kubernetes.io/metadata.name": name}, "annotations": annotations}})
            })
            .collect();
        let pods = differential::world::NAMESPACES
            .iter()
            .enumerate()
            .map(|(i, ns)| {
                let mut pod = seed.pod.clone();
                pod["metadata"] = json!({"name": format!("seed-{i}"), "namespace": ns});
                pod["spec"]["containers"] = json!([{"name": "c", "image": "nginx"}]);
                differential::world::PodCase {
                    pod,
                    daemonset: false,
                }
            })
            .collect();
        worlds.push(World {
            nodes,
            policies,
            namespaces,
            pods,
        });
    }
    worlds
}

#[test]
fn berth_places_pods_where_kubernetes_code_says_the_contract_allows() {
    let mut oracle = Oracle::start();
    let mut tally = Tally::default();
    let seeded = seeded_worlds(&mut oracle);
    let seeded_count = seeded.len();
    for world in &seeded {
        judge_world(&mut oracle, world, &mut tally);
    }
    let count = env_number("SEMANTICS_WORLDS", 150);
    let mut pods = 0;
    for (_, world) in worlds(count) {
        pods += world.pods.len();
        judge_world(&mut oracle, &world, &mut tally);
    }
    let cases = tally
        .checked
        .get("never wider than the original but for entitled pools")
        .copied()
        .unwrap_or(0);
    finish(
        &tally,
        &format!(
            "placements: {seeded_count} worlds from Kubernetes' table, then {count} generated worlds of {pods} pods; \
             {cases} admissions (each pod as written and as the apiserver serves it)"
        ),
    );
}

#[test]
fn the_admission_policies_agree_with_berths_entitlement_rule() {
    let mut oracle = Oracle::start();
    let manifests = cel::manifests(BERTH_SERVICE_ACCOUNT);
    let policy: Value = manifests
        .split("---\n")
        .map(|d| serde_yaml_ng::from_str::<Value>(d).expect("YAML"))
        .find(|d| {
            d["kind"] == "ValidatingAdmissionPolicy" && d["metadata"]["name"] == "berth-pools"
        })
        .expect("berth-pools");
    // Updates that add one toleration each: a wildcard, berth's key by Exists, by a
    // comparison, and by a pool's name.
    let added = [
        json!({"operator": "Exists"}),
        json!({"key": POOL_TAINT, "operator": "Exists"}),
        json!({"key": POOL_TAINT, "operator": "Gt", "value": "100"}),
        json!({"key": POOL_TAINT, "operator": "Lt", "value": "1000"}),
        json!({"key": POOL_TAINT, "operator": "Equal", "value": "cdn", "effect": "NoSchedule"}),
    ];
    let mut tally = Tally::default();
    let mut nanos = 0i64;
    let count = env_number("SEMANTICS_WORLDS", 150) / 2;
    for (_, world) in worlds(count) {
        let pools = Pools::of(&world);
        let set = compile(&world);
        let index = node_index(&pools.nodes);
        let raw: Vec<Value> = world.pods.iter().map(|c| c.pod.clone()).collect();
        let judged = oracle.evaluate(&raw, &pools.nodes);
        // (pod, old pod, daemonset, what the Rust rule says, what is checked)
        let mut cases: Vec<(Value, Option<Value>, bool, Option<&'static str>)> = Vec::new();
        for (case, answer) in world.pods.iter().zip(&judged) {
            // The apiserver validates a pod before admission policies see it.
            if !answer.valid {
                continue;
            }
            let served = answer.stored.clone().expect("a valid pod is stored");
            cases.push((served.clone(), None, case.daemonset, None));
            let a = admit(
                String::new(),
                served,
                case.daemonset,
                &world,
                &pools,
                &set,
                &index,
            );
            if let Some(mutated) = a.mutated {
                let stored = oracle.evaluate(&[mutated], &pools.nodes).remove(0);
                if let (true, Some(stored)) = (stored.valid, stored.stored) {
                    cases.push((stored.clone(), None, case.daemonset, Some("berth's output")));
                    for toleration in &added {
                        let mut new = stored.clone();
                        match new["spec"]["tolerations"].as_array_mut() {
                            Some(list) => list.push(toleration.clone()),
                            None => new["spec"]["tolerations"] = json!([toleration]),
                        }
                        cases.push((new, Some(stored.clone()), case.daemonset, None));
                    }
                }
            }
        }
        for compiled in set.iter() {
            let pool = pool_nodes(compiled, &set, Some(&index));
            let mut params = world
                .policies
                .iter()
                .find(|p| p["metadata"]["name"] == compiled.name.as_str())
                .unwrap()
                .clone();
            params["status"] = json!({"nodeNames": pool});
            let requests: Vec<Value> = cases
                .iter()
                .map(|(pod, old, daemonset, _)| {
                    let username = if *daemonset { DAEMONSET_CONTROLLER } else { "tenant" };
                    let mut request = json!({"operation": if old.is_some() { "UPDATE" } else { "CREATE" },
                        "resource": "pods", "object": pod, "namespace": namespace_of(&world, pod),
                        "params": params, "username": username, "groups": ["system:authenticated"]});
                    if let Some(old) = old {
                        request["oldObject"] = old.clone();
                    }
                    request
                })
                .collect();
            let answers = oracle.admission_policy(&policy, &requests);
            for ((pod, old, daemonset, what), answer) in cases.iter().zip(answers) {
                nanos += answer.nanos;
                tally.check(
                    "the admission policy evaluates without error",
                    answer.error.is_none(),
                    || format!("{:?} on {pod}", answer.error),
                );
                let namespace = namespace_info(namespace_of(&world, pod));
                let config = NamespaceConfig::parse(&namespace.annotations).ok();
                let daemonset_pod = PodObject::read(pod)
                    .unwrap()
                    .is_daemonset_pod(requester(*daemonset));
                let standing = Standing {
                    entitled: opts_in(compiled, &namespace, config.as_ref())
                        || (daemonset_pod
                            && compiled.takes_daemonsets_from(
                                &namespace.labels,
                                opts_in(compiled, &namespace, config.as_ref()),
                            )),
                    pool_nodes: &pool,
                };
                let breaches =
                    |pod: &Value| pool_breaches(&PodObject::read(pod).unwrap(), compiled, standing);
                let refused = match old {
                    None => !breaches(pod).is_empty(),
                    // An update is refused only for what it adds, and never for a
                    // node name, which an update cannot set.
                    Some(old) => {
                        let before = breaches(old);
                        breaches(pod).into_iter().any(|b| {
                            !before.contains(&b)
                                && b != berth::placement::entitlement::Breach::NodeName
                        })
                    }
                };
                let property = match (what, old) {
                    (Some(_), _) => "with berth up, the policy admits what berth admitted",
                    (None, None) => {
                        "at CREATE, the policy refuses exactly the Rust rule's breaches"
                    }
                    (None, Some(_)) => "at UPDATE, the policy refuses exactly what the update adds",
                };
                let holds = if what.is_some() {
                    !answer.denied
                } else {
                    answer.denied == refused
                };
                tally.check(property, holds, || {
                    format!(
                        "policy {}: CEL denied {} ({:?}), Rust rule {refused}; pod {pod}; old {old:?}; params {params}",
                        compiled.name, answer.denied, answer.messages
                    )
                });
            }
        }
    }
    finish(
        &tally,
        &format!(
            "admission policy berth-pools: {count} worlds, {:.1} ms of CEL in all",
            nanos as f64 / 1e6
        ),
    );
}

/// The admission policy named `name`, as `berth admission-policy` prints it.
fn admission_policy(name: &str) -> Value {
    cel::manifests(BERTH_SERVICE_ACCOUNT)
        .split("---\n")
        .map(|d| serde_yaml_ng::from_str::<Value>(d).expect("YAML"))
        .find(|d| d["kind"] == "ValidatingAdmissionPolicy" && d["metadata"]["name"] == name)
        .expect("the policy")
}

#[test]
fn the_bounds_policy_refuses_exactly_the_pods_berth_will_not_read() {
    use berth::bounds::*;
    let mut oracle = Oracle::start();
    let policy = admission_policy("berth-limits");
    let namespace = json!({"apiVersion": "v1", "kind": "Namespace",
        "metadata": {"name": "tenant", "labels": {"kubernetes.io/metadata.name": "tenant"}}});
    let base = || {
        json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "namespace": "tenant"},
        "spec": {"containers": [{"name": "c", "image": "nginx"}]}})
    };
    let term = |n: usize| json!({"matchExpressions": (0..n).map(|i| json!({"key": format!("k{i}"), "operator": "Exists"})).collect::<Vec<_>>()});
    // Each bound, at it and one past it.
    let mut pods = Vec::new();
    for n in [0usize, 1] {
        let mut p = base();
        p["metadata"]["labels"] = (0..LABELS.most + n)
            .map(|i| (format!("l{i}"), json!("v")))
            .collect::<serde_json::Map<_, _>>()
            .into();
        pods.push(p);
        let mut p = base();
        p["metadata"]["ownerReferences"] = json!((0..OWNER_REFERENCES.most + n)
            .map(|i| json!({"apiVersion": "v1", "kind": "ConfigMap", "name": format!("o{i}"), "uid": format!("u{i}")}))
            .collect::<Vec<_>>());
        pods.push(p);
        let mut p = base();
        p["spec"]["tolerations"] = json!(
            (0..TOLERATIONS.most + n)
                .map(|i| json!({"key": format!("t{i}"), "operator": "Exists"}))
                .collect::<Vec<_>>()
        );
        pods.push(p);
        let mut p = base();
        p["spec"]["schedulingGates"] = json!(
            (0..SCHEDULING_GATES.most + n)
                .map(|i| json!({"name": format!("g/{i}")}))
                .collect::<Vec<_>>()
        );
        pods.push(p);
        let mut p = base();
        p["spec"]["containers"] = json!(
            (0..CONTAINERS.most + n)
                .map(|i| json!({"name": format!("c{i}"), "image": "nginx"}))
                .collect::<Vec<_>>()
        );
        pods.push(p);
        let mut p = base();
        p["spec"]["affinity"] = json!({"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
            "nodeSelectorTerms": (0..REQUIRED_TERMS.most + n).map(|_| term(1)).collect::<Vec<_>>()}}});
        pods.push(p);
        let mut p = base();
        p["spec"]["affinity"] = json!({"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
            "nodeSelectorTerms": [term(TERM_REQUIREMENTS.most + n)]}}});
        pods.push(p);
        let mut p = base();
        p["spec"]["affinity"] = json!({"nodeAffinity": {"preferredDuringSchedulingIgnoredDuringExecution":
            (0..PREFERRED_TERMS.most + n).map(|_| json!({"weight": 1, "preference": term(1)})).collect::<Vec<_>>()}});
        pods.push(p);
    }
    let cases: Vec<Value> = pods
        .iter()
        .map(|pod| {
            json!({"operation": "CREATE", "resource": "pods", "object": pod,
            "namespace": namespace, "username": "tenant", "groups": ["system:authenticated"]})
        })
        .collect();
    let answers = oracle.admission_policy(&policy, &cases);
    let mut tally = Tally::default();
    for (pod, answer) in pods.iter().zip(answers) {
        tally.check(
            "the bounds policy evaluates without error",
            answer.error.is_none(),
            || format!("{:?}", answer.error),
        );
        let refused = PodObject::read(pod).is_err();
        tally.check(
            "berth-limits refuses exactly what berth will not read",
            answer.denied == refused,
            || {
                format!(
                    "CEL {} ({:?}), berth {refused}",
                    answer.denied, answer.messages
                )
            },
        );
    }
    finish(
        &tally,
        &format!("berth-limits: {} pods at and past each bound", pods.len()),
    );
}

#[test]
fn the_queue_policy_refuses_exactly_what_the_webhook_refuses() {
    let mut oracle = Oracle::start();
    let policy = admission_policy("berth-queues");
    let policies = [
        json!({"apiVersion": "berth.io/v1alpha1", "kind": "PlacementPolicy", "metadata": {"name": "jobs"},
            "spec": {"queue": {}}}),
        json!({"apiVersion": "berth.io/v1alpha1", "kind": "PlacementPolicy", "metadata": {"name": "jobs-b.c"},
            "spec": {"queue": {}, "namespaceSelector": {"matchLabels": {"team": "b"}}}}),
    ];
    let typed: Vec<PlacementPolicy> = policies
        .iter()
        .map(|p| serde_json::from_value(p.clone()).unwrap())
        .collect();
    let (set, _) = PolicySet::compile(&typed);
    let namespaces = [
        json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "a",
            "labels": {"kubernetes.io/metadata.name": "a"}, "annotations": {names::POLICIES_ANNOTATION: "jobs"}}}),
        json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "b",
            "labels": {"kubernetes.io/metadata.name": "b", "team": "b"}}}),
        json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "none",
            "labels": {"kubernetes.io/metadata.name": "none"}}}),
    ];
    let classes = [
        "berth-queue-jobs-3",
        "berth-queue-jobs-b.c-30",
        "berth-queue-jobs-b.c-07",
        "berth-queue-other-3",
        "berth-queue-jobs",
        "high-priority",
    ];
    let mut tally = Tally::default();
    for namespace in &namespaces {
        let info = namespace_info(namespace);
        let config = NamespaceConfig::parse(&info.annotations).ok();
        let pods: Vec<Value> = classes
            .iter()
            .map(|class| json!({"apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": "p", "namespace": namespace["metadata"]["name"]},
                "spec": {"containers": [{"name": "c", "image": "nginx"}], "priorityClassName": class}}))
            .collect();
        let mut denied = vec![false; pods.len()];
        for params in &policies {
            let cases: Vec<Value> = pods
                .iter()
                .map(|pod| {
                    json!({"operation": "CREATE", "resource": "pods", "object": pod,
                    "namespace": namespace, "params": params, "username": "tenant"})
                })
                .collect();
            for (i, answer) in oracle
                .admission_policy(&policy, &cases)
                .into_iter()
                .enumerate()
            {
                tally.check(
                    "the queue policy evaluates without error",
                    answer.error.is_none(),
                    || format!("{:?}", answer.error),
                );
                denied[i] |= answer.denied;
            }
        }
        for (pod, denied) in pods.iter().zip(denied) {
            let view = PodObject::read(pod).unwrap();
            let rust =
                berth::placement::groups::foreign_queue_class(&view, &info, config.as_ref(), &set);
            tally.check(
                "berth-queues refuses exactly the webhook's refusals",
                denied == rust.is_some(),
                || {
                    format!(
                        "{} in {}: CEL {denied}, webhook {rust:?}",
                        pod["spec"]["priorityClassName"], info.name
                    )
                },
            );
        }
    }
    finish(&tally, "berth-queues: each class in each namespace");
}

#[test]
fn the_holds_policy_refuses_exactly_what_the_webhook_refuses() {
    let mut oracle = Oracle::start();
    let policy = admission_policy("berth-holds");
    let policies = [
        json!({"apiVersion": "berth.io/v1alpha1", "kind": "PlacementPolicy", "metadata": {"name": "masters"},
            "spec": {"avoid": {"matchLabels": {"role": "master"}}}}),
        json!({"apiVersion": "berth.io/v1alpha1", "kind": "PlacementPolicy", "metadata": {"name": "cdn"},
            "spec": {"pool": {"nodeNames": ["node2"]}, "avoid": {"matchLabels": {"app": "cdn"}}}}),
        json!({"apiVersion": "berth.io/v1alpha1", "kind": "PlacementPolicy", "metadata": {"name": "jobs"},
            "spec": {"queue": {}}}),
    ];
    let typed: Vec<PlacementPolicy> = policies
        .iter()
        .map(|p| serde_json::from_value(p.clone()).unwrap())
        .collect();
    let (set, _) = PolicySet::compile(&typed);
    let namespace = json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "a",
        "labels": {"kubernetes.io/metadata.name": "a"}}});
    let records = [
        None,
        Some(""),
        Some("jobs"),
        Some("masters"),
        Some("jobs, masters"),
        Some("cdn,jobs"),
        Some("mastersx"),
    ];
    let gates: [&[&str]; 3] = [&[], &["mine"], &["mine", names::AVOID_GATE]];
    let mut cases = Vec::new();
    for record in records {
        for gates in gates {
            for daemonset in [false, true] {
                let owners = daemonset.then(|| {
                    json!([{"apiVersion": "apps/v1", "kind": "DaemonSet",
                    "name": "agent", "uid": "u1", "controller": true}])
                });
                let pod = json!({"apiVersion": "v1", "kind": "Pod",
                    "metadata": {"name": "p", "namespace": "a", "ownerReferences": owners,
                        "annotations": record.map(|r| json!({names::APPLIED_ANNOTATION: r}))},
                    "spec": {"containers": [{"name": "c", "image": "nginx"}],
                        "schedulingGates": gates.iter().map(|g| json!({"name": g})).collect::<Vec<_>>()}});
                for sender in ["tenant", DAEMONSET_CONTROLLER] {
                    cases.push((pod.clone(), sender));
                }
            }
        }
    }
    let mut tally = Tally::default();
    let mut denied = vec![false; cases.len()];
    for params in &policies {
        let requests: Vec<Value> = cases
            .iter()
            .map(|(pod, sender)| {
                json!({"operation": "CREATE", "resource": "pods", "object": pod,
                "namespace": namespace, "params": params, "username": sender})
            })
            .collect();
        for (i, answer) in oracle
            .admission_policy(&policy, &requests)
            .into_iter()
            .enumerate()
        {
            tally.check(
                "the holds policy evaluates without error",
                answer.error.is_none(),
                || format!("{:?}", answer.error),
            );
            denied[i] |= answer.denied;
        }
    }
    let refused = denied.iter().filter(|d| **d).count();
    assert!(
        refused > 0 && refused < cases.len(),
        "the cases refuse some pods and admit others: {refused} of {}",
        cases.len()
    );
    for ((pod, sender), denied) in cases.iter().zip(denied) {
        let view = PodObject::read(pod).unwrap();
        let rust =
            berth::placement::records::unheld_record(&view, Requester::from_username(sender), &set);
        tally.check(
            "berth-holds refuses exactly the webhook's refusals",
            denied == rust.is_some(),
            || {
                format!(
                    "{} from {sender}: CEL {denied}, webhook {rust:?}",
                    pod["metadata"]
                )
            },
        );
    }
    finish(&tally, &format!("berth-holds: {} pods", cases.len()));
}

// The oracle's own MutatingAdmissionPolicy and CEL answers, on hand-written cases
// whose outcome is known: the ground under the differential tests of berth's
// static placement policy and its CEL snippets.

/// A MutatingAdmissionPolicy for CREATE of pods whose mutations are the given
/// JSONPatch expressions, in order.
fn mutating_policy(failure: &str, reinvocation: &str, patches: &[&str]) -> Value {
    let mutations: Vec<Value> = patches
        .iter()
        .map(|e| json!({"patchType": "JSONPatch", "jsonPatch": {"expression": e}}))
        .collect();
    json!({"apiVersion": "admissionregistration.k8s.io/v1", "kind": "MutatingAdmissionPolicy",
        "metadata": {"name": "oracle-check"},
        "spec": {"matchConstraints": {"resourceRules": [{"apiGroups": [""], "apiVersions": ["v1"],
                "operations": ["CREATE"], "resources": ["pods"]}]},
            "matchConditions": [{"name": "not-skipped",
                "expression": "!has(object.metadata.labels) || !('skip' in object.metadata.labels)"}],
            "failurePolicy": failure, "reinvocationPolicy": reinvocation, "mutations": mutations}})
}

fn mutation_case(labels: Value, tolerations: Option<Value>) -> Value {
    let mut pod = json!({"apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "p", "namespace": "a", "labels": labels},
        "spec": {"containers": [{"name": "c", "image": "nginx"}]}});
    if let Some(tolerations) = tolerations {
        pod["spec"]["tolerations"] = tolerations;
    }
    json!({"operation": "CREATE", "resource": "pods", "object": pod, "username": "tenant",
        "namespace": {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "a"}}})
}

/// The toleration `ADD_TOLERATION` adds.
fn added_toleration() -> Value {
    json!({"key": "k", "operator": "Exists"})
}

/// Adds `added_toleration()`, making the list first when the pod has none.
const ADD_TOLERATION: &str = "(has(object.spec.tolerations) ? [] : \
    [JSONPatch{op: 'add', path: '/spec/tolerations', value: []}]) + \
    [JSONPatch{op: 'add', path: '/spec/tolerations/-', \
    value: Object.spec.tolerations{key: 'k', operator: 'Exists'}}]";

fn tolerations_of(object: &Option<Value>) -> Vec<Value> {
    let object = object.as_ref().expect("the policy leaves a pod");
    object["spec"]["tolerations"]
        .as_array()
        .cloned()
        .unwrap_or_default()
}

#[test]
fn the_oracle_applies_a_mutating_policy_as_the_apiserver_does() {
    let mut oracle = Oracle::start();
    let other = json!({"key": "other", "operator": "Equal", "value": "v", "effect": "NoSchedule"});
    let cases = [
        mutation_case(json!({}), None),
        mutation_case(json!({}), Some(json!([other]))),
        mutation_case(json!({"skip": "yes"}), None),
    ];
    let policy = mutating_policy("Fail", "Never", &[ADD_TOLERATION]);
    let answers = oracle.mutating_policy(&policy, &cases);
    for answer in &answers[..2] {
        assert!(
            answer.matched && !answer.rejected && !answer.reinvoked,
            "{answer:?}"
        );
        assert_eq!(answer.error, None, "{answer:?}");
    }
    assert_eq!(tolerations_of(&answers[0].object), [added_toleration()]);
    assert_eq!(
        tolerations_of(&answers[1].object),
        [other.clone(), added_toleration()]
    );
    // The mutated pod is the one the apiserver holds: v1 defaults filled in.
    let object = answers[0].object.as_ref().unwrap();
    assert_eq!(object["spec"]["restartPolicy"], "Always", "{object}");
    assert_eq!(object["metadata"]["labels"], json!(null), "{object}");
    assert!(
        answers[0].cost > 0,
        "the mutation's CEL cost is counted: {} in {} ns",
        answers[0].cost,
        answers[0].nanos
    );
    // A matchCondition that is false leaves the pod alone.
    assert!(
        !answers[2].matched && answers[2].object.is_none(),
        "{:?}",
        answers[2]
    );

    // The params a binding selects (a cluster-scoped custom resource) are `params`.
    let mut policy = mutating_policy(
        "Fail",
        "Never",
        &["[JSONPatch{op: 'add', path: '/spec/nodeSelector', value: params.spec.nodeSelector}]"],
    );
    policy["spec"]["paramKind"] =
        json!({"apiVersion": "berth.io/v1alpha1", "kind": "StaticPlacement"});
    let mut case = cases[0].clone();
    case["params"] = json!({"apiVersion": "berth.io/v1alpha1", "kind": "StaticPlacement",
        "metadata": {"name": "gpu"}, "spec": {"nodeSelector": {"pool": "gpu"}}});
    let answer = &oracle.mutating_policy(&policy, &[case])[0];
    let object = answer.object.as_ref().expect("a pod");
    assert_eq!(
        object["spec"]["nodeSelector"],
        json!({"pool": "gpu"}),
        "{answer:?}"
    );

    // IfNeeded: the apiserver runs a policy that mutated a second time on its own
    // output, so a mutation that is not idempotent applies twice.
    let policy = mutating_policy("Fail", "IfNeeded", &[ADD_TOLERATION]);
    let answers = oracle.mutating_policy(&policy, &cases[..1]);
    assert!(answers[0].reinvoked, "{:?}", answers[0]);
    assert_eq!(
        tolerations_of(&answers[0].object),
        [added_toleration(), added_toleration()]
    );
}

#[test]
fn the_oracle_skips_a_failing_mutation_under_ignore_as_the_apiserver_does() {
    let mut oracle = Oracle::start();
    let failing = "[JSONPatch{op: 'remove', path: '/metadata/annotations/missing'}]";
    let cases = [mutation_case(json!({"app": "x"}), None)];

    let policy = mutating_policy("Ignore", "Never", &[failing, ADD_TOLERATION]);
    let answer = &oracle.mutating_policy(&policy, &cases)[0];
    assert!(answer.matched && !answer.rejected, "{answer:?}");
    let error = answer
        .error
        .as_deref()
        .expect("the failing mutation's error");
    assert!(error.contains("/metadata/annotations/missing"), "{error}");
    assert_eq!(answer.errors.len(), 1, "{answer:?}");
    assert_eq!(tolerations_of(&answer.object), [added_toleration()]);

    // Under Fail the same error refuses the request: no pod.
    let policy = mutating_policy("Fail", "Never", &[failing, ADD_TOLERATION]);
    let answer = &oracle.mutating_policy(&policy, &cases)[0];
    assert!(answer.rejected && answer.object.is_none(), "{answer:?}");
    let error = answer.error.as_deref().expect("the refusal");
    assert!(
        error.contains("denied request") && error.contains("/metadata/annotations/missing"),
        "{error}"
    );
}

#[test]
fn the_oracle_evaluates_cel_with_kubernetes_libraries() {
    let mut oracle = Oracle::start();
    assert_eq!(
        oracle.cel("'a/b:c'.split('/')", &json!({})),
        Ok(json!(["a", "b:c"]))
    );
    assert_eq!(
        oracle.cel("x.matches('^a+$')", &json!({"x": "aaa"})),
        Ok(json!(true))
    );
    assert_eq!(
        oracle.cel("x.matches('^a+$')", &json!({"x": "ab"})),
        Ok(json!(false))
    );
    // JSON integers are CEL ints, as in objects the apiserver decodes.
    assert_eq!(oracle.cel("n + 1", &json!({"n": 2})), Ok(json!(3)));
    let error = oracle.cel("x.nope()", &json!({"x": "a"})).unwrap_err();
    assert!(error.contains("compilation failed"), "{error}");

    let expressions: Vec<String> = [
        "image.split(':')[0]",
        "image.matches('^[a-z]+$')",
        "image[9]",
    ]
    .iter()
    .map(|e| e.to_string())
    .collect();
    let values = oracle.cel_many(&expressions, &json!({"image": "nginx:1.27"}));
    assert_eq!(values[0], Ok(json!("nginx")));
    assert_eq!(values[1], Ok(json!(false)));
    assert!(values[2].is_err(), "{:?}", values[2]);
}
