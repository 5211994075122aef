//! Generated worlds: nodes with labels (numeric ones for Gt/Lt) and taints of
//! every effect; one to three PlacementPolicies with pools by `nodeNames` and by
//! `nodeSelector` (on a label a node can set, trusted or not), Required and
//! Preferred, dedicated or not, and `nodeAffinity`;
//! namespaces that opt into all, some and none of them; and pods with
//! nodeSelector, required terms of every operator and `matchFields`, empty and
//! null terms, preferred terms, tolerations with wildcards, key-only `Exists` and
//! comparisons, `nodeName`, and DaemonSet pods. Much of it is what the apiserver
//! would refuse, since the webhook sees pods before validation.

use berth::names;
use berth::policy::{PlacementPolicy, PolicySet};
use proptest::prelude::*;
use serde_json::{Value, json};

pub const POOL_LABEL: &str = names::POOL_LABEL;
pub const POOL_TAINT: &str = names::POOL_TAINT;
const HOSTNAME: &str = "kubernetes.io/hostname";
/// Policy names; "450" is a number, so a `Gt` toleration could tolerate its taint.
const POLICY_NAMES: [&str; 4] = ["cdn", "gpu", "450", "edge"];
pub const NAMESPACES: [&str; 3] = ["ns-all", "ns-some", "ns-none"];
pub const DAEMONSET_CONTROLLER: &str = "system:serviceaccount:kube-system:daemon-set-controller";

#[derive(Debug, Clone)]
pub struct World {
    /// Nodes as they are, without berth's labels and taints.
    pub nodes: Vec<Value>,
    /// PlacementPolicies, oldest first.
    pub policies: Vec<Value>,
    pub namespaces: Vec<Value>,
    pub pods: Vec<PodCase>,
}

#[derive(Debug, Clone)]
pub struct PodCase {
    pub pod: Value,
    /// Sent by the DaemonSet controller (and owned by a DaemonSet).
    pub daemonset: bool,
}

/// Values each node label key takes (numbers for `cores`, one of them not a
/// number).
fn label_values(key: &str) -> &'static [&'static str] {
    match key {
        "zone" => &["a", "b", "c"],
        "disk" => &["ssd", "hdd"],
        "cores" => &["2", "8", "16", "64", "many"],
        "example.com/gpu" => &["A100", "H100"],
        _ => &["x"],
    }
}

const LABEL_KEYS: [&str; 4] = ["zone", "disk", "cores", "example.com/gpu"];

fn arb_node(index: usize) -> impl Strategy<Value = Value> {
    let labels =
        LABEL_KEYS.map(|key| prop::option::weighted(0.7, prop::sample::select(label_values(key))));
    let taint = (
        prop::sample::select(vec![
            ("dedicated", "team"),
            ("dedicated", "infra"),
            ("sla", "950"),
            ("sla", "100"),
            ("sla", "x"),
            ("gpu", ""),
        ]),
        prop::sample::select(vec!["NoSchedule", "NoExecute", "PreferNoSchedule"]),
    );
    (labels, prop::collection::vec(taint, 0..=2)).prop_map(move |(values, taints)| {
        let name = format!("n{index}");
        let mut labels = serde_json::Map::new();
        labels.insert(HOSTNAME.into(), json!(name));
        for (key, value) in LABEL_KEYS.iter().zip(values) {
            if let Some(value) = value {
                labels.insert((*key).into(), json!(value));
            }
        }
        let mut seen = std::collections::BTreeSet::new();
        let taints: Vec<Value> = taints
            .into_iter()
            .filter(|((key, _), effect)| seen.insert((*key, *effect)))
            .map(|((key, value), effect)| json!({"key": key, "value": value, "effect": effect}))
            .collect();
        json!({"apiVersion": "v1", "kind": "Node",
            "metadata": {"name": name, "labels": labels}, "spec": {"taints": taints}})
    })
}

/// A requirement on a node label, valid (`valid`) or as a tenant might write it.
fn arb_requirement(valid: bool) -> impl Strategy<Value = Value> {
    let keys = prop::sample::select(vec!["zone", "disk", "cores", "example.com/gpu", HOSTNAME]);
    let operators = if valid {
        vec!["In", "NotIn", "Exists", "DoesNotExist", "Gt", "Lt"]
    } else {
        vec![
            "In",
            "NotIn",
            "Exists",
            "DoesNotExist",
            "Gt",
            "Lt",
            "In",
            "NotIn",
            "Bogus",
        ]
    };
    (
        keys,
        prop::sample::select(operators),
        prop::sample::subsequence(vec!["a", "b", "c", "ssd", "A100", "n1", "n2"], 1..=3)
            .prop_shuffle(),
        prop::sample::select(vec!["4", "10", "16", "x"]),
        0..8u8,
    )
        .prop_map(move |(key, op, mut values, number, spelling)| {
            // Values each key really has, so that In and NotIn match sometimes.
            if let Some(first) = label_values(key).first()
                && spelling % 2 == 0
            {
                values.push(first);
            }
            let broken = !valid && spelling == 7;
            let values: Option<Vec<&str>> = match op {
                "In" | "NotIn" if broken => Some(vec![]),
                "In" | "NotIn" | "Bogus" => Some(values),
                "Gt" | "Lt" if broken => Some(vec!["x"]),
                "Gt" | "Lt" => Some(vec![if valid && number == "x" { "8" } else { number }]),
                _ if broken => Some(vec!["a"]),
                // Exists and DoesNotExist: no values, spelled as absent or [].
                _ if spelling < 4 => None,
                _ => Some(vec![]),
            };
            match values {
                Some(values) => json!({"key": key, "operator": op, "values": values}),
                None => json!({"key": key, "operator": op}),
            }
        })
}

fn arb_field() -> impl Strategy<Value = Value> {
    (
        prop::sample::select(vec!["In", "NotIn", "In"]),
        prop::sample::subsequence(vec!["n0", "n1", "n2", "n3"], 1..=2),
        any::<bool>(),
    )
        .prop_map(|(op, nodes, one)| {
            let values: Vec<&str> = if one { nodes[..1].to_vec() } else { nodes };
            json!({"key": "metadata.name", "operator": op, "values": values})
        })
}

fn arb_term() -> impl Strategy<Value = Value> {
    prop_oneof![
        1 => Just(json!({})),
        1 => Just(json!({"matchExpressions": []})),
        8 => prop::collection::vec(arb_requirement(false), 1..=3)
            .prop_map(|e| json!({"matchExpressions": e})),
        2 => prop::collection::vec(arb_field(), 1..=2).prop_map(|f| json!({"matchFields": f})),
        2 => (prop::collection::vec(arb_requirement(false), 1..=2), arb_field())
            .prop_map(|(e, f)| json!({"matchExpressions": e, "matchFields": [f]})),
        1 => prop::collection::vec(arb_requirement(false), 1..=2).prop_map(|mut e| {
            // A tenant's own expression on berth's pool label.
            e.push(json!({"key": POOL_LABEL, "operator": "In", "values": ["cdn"]}));
            json!({"matchExpressions": e})
        }),
    ]
}

/// `requiredDuringSchedulingIgnoredDuringExecution`: absent (`None`), null, no
/// terms in three spellings, or one to three terms.
fn arb_required() -> impl Strategy<Value = Option<Value>> {
    prop_oneof![
        6 => Just(None),
        1 => Just(Some(Value::Null)),
        1 => Just(Some(json!({}))),
        1 => Just(Some(json!({"nodeSelectorTerms": []}))),
        1 => Just(Some(json!({"nodeSelectorTerms": null}))),
        8 => prop::collection::vec(arb_term(), 1..=3).prop_map(|t| Some(json!({"nodeSelectorTerms": t}))),
    ]
}

fn arb_preferred(valid: bool) -> impl Strategy<Value = Value> {
    (
        prop::sample::select(vec![10, 50, 80]),
        prop::collection::vec(arb_requirement(valid), 1..=2),
    )
        .prop_map(|(weight, expressions)| {
            json!({"weight": weight, "preference": {"matchExpressions": expressions}})
        })
}

fn arb_toleration() -> impl Strategy<Value = Value> {
    let pool = prop::sample::select(POLICY_NAMES.to_vec());
    prop_oneof![
        prop::sample::select(vec![None, Some("NoSchedule"), Some("NoExecute")]).prop_map(
            |effect| {
                match effect {
                    Some(effect) => json!({"operator": "Exists", "effect": effect}),
                    None => json!({"operator": "Exists"}),
                }
            }
        ),
        Just(json!({"key": "dedicated", "operator": "Exists"})),
        Just(
            json!({"key": "dedicated", "operator": "Equal", "value": "team", "effect": "NoSchedule"})
        ),
        Just(json!({"key": "dedicated", "value": "infra"})),
        Just(json!({"key": "gpu", "operator": "Exists", "effect": "NoSchedule"})),
        prop::sample::select(vec![
            ("Gt", "500"),
            ("Lt", "500"),
            ("Gt", "99"),
            ("Lt", "0950")
        ])
        .prop_map(|(op, value)| json!({"key": "sla", "operator": op, "value": value})),
        pool.clone().prop_map(
            |p| json!({"key": POOL_TAINT, "operator": "Equal", "value": p, "effect": "NoSchedule"})
        ),
        Just(json!({"key": POOL_TAINT, "operator": "Exists"})),
        Just(json!({"key": POOL_TAINT, "operator": "Gt", "value": "100"})),
    ]
}

fn arb_policy(index: usize, name: &'static str, node_count: usize) -> impl Strategy<Value = Value> {
    let pool = (
        prop::option::of(prop::sample::select(vec!["a", "b"])),
        prop::sample::subsequence((0..node_count).collect::<Vec<_>>(), 1..=2),
        prop::option::of(any::<bool>()),
        prop::option::of(prop::sample::select(vec!["NoSchedule", "NoExecute"])),
        prop::option::of(prop::sample::select(vec!["Required", "Preferred"])),
        prop::option::of(prop::sample::select(vec![30, 70])),
        prop::option::of(prop::sample::select(vec!["Tolerate", "Exclude"])),
        any::<bool>(),
        any::<bool>(),
    )
        .prop_map(
            |(
                zone,
                names,
                dedicated,
                effect,
                placement,
                weight,
                daemonsets,
                ds_namespaces,
                trust,
            )| {
                let mut pool = serde_json::Map::new();
                match zone {
                    // A node can set `zone` on itself: without trustSelfSetLabels
                    // the pool takes in none of the nodes, which carry no pool
                    // label yet.
                    Some(zone) => {
                        if trust {
                            pool.insert("trustSelfSetLabels".into(), json!(true));
                        }
                        pool.insert(
                            "nodeSelector".into(),
                            json!({"matchLabels": {"zone": zone}}),
                        )
                    }
                    None => pool.insert(
                        "nodeNames".into(),
                        json!(names.iter().map(|n| format!("n{n}")).collect::<Vec<_>>()),
                    ),
                };
                let fields = [
                    ("dedicated", dedicated.map(Value::from)),
                    ("effect", effect.map(Value::from)),
                    ("placement", placement.map(Value::from)),
                    ("weight", weight.map(Value::from)),
                    ("daemonSets", daemonsets.map(Value::from)),
                    (
                        "daemonSetNamespaces",
                        ds_namespaces.then(|| json!({"matchLabels": {"platform": "true"}})),
                    ),
                ];
                for (key, value) in fields {
                    if let Some(value) = value {
                        pool.insert(key.into(), value);
                    }
                }
                Value::Object(pool)
            },
        );
    let affinity = (
        prop::collection::vec(arb_requirement(true), 0..=2),
        prop::collection::vec(arb_preferred(true), 0..=2),
    )
        .prop_map(|(required, preferred)| {
            let preferred: Vec<Value> = preferred
                .into_iter()
                .map(|p| {
                    json!({"weight": p["weight"], "preference": p["preference"]["matchExpressions"][0]})
                })
                .collect();
            json!({"required": required, "preferred": preferred})
        });
    (
        prop::option::of(pool),
        prop::option::of(affinity),
        any::<bool>(),
        any::<bool>(),
    )
        .prop_map(move |(pool, affinity, namespace_selector, pod_selector)| {
            let mut spec = serde_json::Map::new();
            // A policy grants something: a pool or node affinity at least.
            let (pool, affinity) = match (pool, affinity) {
                (None, None) => (None, Some(json!({"required": [{"key": "disk", "operator": "Exists"}]}))),
                other => other,
            };
            if let Some(pool) = pool {
                spec.insert("pool".into(), pool);
            }
            if let Some(affinity) = affinity {
                spec.insert("nodeAffinity".into(), affinity);
            }
            if namespace_selector {
                spec.insert("namespaceSelector".into(), json!({"matchLabels": {"team": "edge"}}));
            }
            if pod_selector {
                spec.insert("podSelector".into(), json!({"matchLabels": {"app": "a"}}));
            }
            json!({"apiVersion": "berth.io/v1alpha1", "kind": "PlacementPolicy",
                "metadata": {"name": name, "creationTimestamp": format!("2026-01-0{}T00:00:00Z", index + 1)},
                "spec": spec})
        })
}

fn arb_namespaces(names: Vec<&'static str>) -> impl Strategy<Value = Vec<Value>> {
    (any::<bool>(), any::<bool>(), any::<bool>()).prop_map(move |(team, platform, spaced)| {
        let joiner = if spaced { ", " } else { "," };
        let opted: [Option<String>; 3] =
            [Some(names.join(joiner)), Some(names[0].to_owned()), None];
        NAMESPACES
            .iter()
            .zip(opted)
            .enumerate()
            .map(|(i, (name, policies))| {
                let mut labels = json!({"kubernetes.io/metadata.name": name});
                if team && i != 2 || !team && i == 2 {
                    labels["team"] = json!("edge");
                }
                if platform && i == 1 {
                    labels["platform"] = json!("true");
                }
                let annotations = match policies {
                    Some(p) => json!({names::POLICIES_ANNOTATION: p}),
                    None => json!({}),
                };
                json!({"apiVersion": "v1", "kind": "Namespace",
                    "metadata": {"name": name, "labels": labels, "annotations": annotations}})
            })
            .collect()
    })
}

fn arb_pod(index: usize, node_count: usize) -> impl Strategy<Value = PodCase> {
    (
        prop::sample::select(NAMESPACES.to_vec()),
        prop::option::of(prop::sample::select(vec!["a", "b"])),
        prop::option::weighted(0.3, (prop::sample::select(vec!["zone", "disk"]), prop::sample::select(vec!["a", "ssd"]))),
        arb_required(),
        prop::collection::vec(arb_preferred(false), 0..=2),
        prop::collection::vec(arb_toleration(), 0..=3),
        prop::option::weighted(0.12, 0..node_count),
        prop::option::weighted(0.15, 0..node_count),
        any::<bool>(),
    )
        .prop_map(
            move |(namespace, app, selector, required, preferred, tolerations, node_name, daemonset, forged)| {
                let mut spec = json!({"containers": [{"name": "c", "image": "nginx"}]});
                let mut metadata = json!({"name": format!("p{index}"), "namespace": namespace});
                if let Some(app) = app {
                    metadata["labels"] = json!({"app": app});
                }
                if forged {
                    // A tenant's own record claims a policy: berth derives its own.
                    metadata["annotations"] = json!({names::APPLIED_ANNOTATION: "cdn"});
                }
                if let Some((key, value)) = selector {
                    spec["nodeSelector"] = json!({key: value});
                }
                let mut node_affinity = serde_json::Map::new();
                let mut required = required;
                if let Some(node) = daemonset {
                    // The DaemonSet controller pins each pod to its node in every term.
                    let pin = json!({"key": "metadata.name", "operator": "In", "values": [format!("n{node}")]});
                    let terms = match required.as_ref().and_then(|r| r.get("nodeSelectorTerms")).and_then(Value::as_array) {
                        Some(terms) if !terms.is_empty() => terms
                            .iter()
                            .map(|t| {
                                let mut t = t.clone();
                                t["matchFields"] = json!([pin]);
                                t
                            })
                            .collect(),
                        _ => vec![json!({"matchFields": [pin]})],
                    };
                    required = Some(json!({"nodeSelectorTerms": terms}));
                    metadata["ownerReferences"] = json!([{"apiVersion": "apps/v1", "kind": "DaemonSet",
                        "name": "agent", "uid": "7e5d2d4c-0000-4000-8000-000000000001", "controller": true}]);
                }
                if let Some(required) = required {
                    node_affinity.insert("requiredDuringSchedulingIgnoredDuringExecution".into(), required);
                }
                if !preferred.is_empty() {
                    node_affinity.insert("preferredDuringSchedulingIgnoredDuringExecution".into(), json!(preferred));
                }
                if !node_affinity.is_empty() {
                    spec["affinity"] = json!({"nodeAffinity": node_affinity});
                }
                if !tolerations.is_empty() {
                    spec["tolerations"] = json!(tolerations);
                }
                if let (Some(node), None) = (node_name, daemonset) {
                    spec["nodeName"] = json!(format!("n{node}"));
                }
                PodCase {
                    pod: json!({"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": spec}),
                    daemonset: daemonset.is_some(),
                }
            },
        )
}

/// A world of 3 to 7 nodes, 1 to 3 policies, the three namespaces, and 4 to 8 pods.
pub fn arb_world() -> impl Strategy<Value = World> {
    (
        3..=7usize,
        prop::sample::subsequence(POLICY_NAMES.to_vec(), 1..=3).prop_shuffle(),
    )
        .prop_flat_map(|(node_count, names)| {
            let nodes: Vec<_> = (0..node_count).map(arb_node).collect();
            let policies: Vec<_> = names
                .iter()
                .enumerate()
                .map(|(i, name)| arb_policy(i, name, node_count))
                .collect();
            let pods = (4..=8usize)
                .prop_flat_map(move |n| (0..n).map(|i| arb_pod(i, node_count)).collect::<Vec<_>>());
            let echoes =
                prop::collection::vec(prop::option::weighted(0.3, any::<prop::sample::Index>()), 8);
            (nodes, policies, arb_namespaces(names.clone()), pods, echoes)
        })
        .prop_map(|(nodes, policies, namespaces, mut pods, echoes)| {
            for (case, echo) in pods.iter_mut().zip(echoes) {
                if let Some(which) = echo {
                    echo_preference(&mut case.pod, &policies, which);
                }
            }
            World {
                nodes,
                policies,
                namespaces,
                pods,
            }
        })
}

/// Gives the pod a preference one of the policies also gives, spelled otherwise
/// (its values reversed, `values: []` dropped): berth must not count it twice.
fn echo_preference(pod: &mut Value, policies: &[Value], which: prop::sample::Index) {
    let preferences: Vec<&Value> = policies
        .iter()
        .flat_map(|p| {
            p.pointer("/spec/nodeAffinity/preferred")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
        })
        .collect();
    if preferences.is_empty() {
        return;
    }
    let chosen = which.get(&preferences);
    let mut requirement = chosen["preference"].clone();
    match requirement.get_mut("values").and_then(Value::as_array_mut) {
        Some(values) if values.is_empty() => {
            requirement.as_object_mut().unwrap().remove("values");
        }
        Some(values) => values.reverse(),
        None => {}
    }
    let term =
        json!({"weight": chosen["weight"], "preference": {"matchExpressions": [requirement]}});
    let affinity = &mut pod["spec"]["affinity"];
    if affinity.is_null() {
        *affinity = json!({"nodeAffinity": {}});
    }
    let preferred =
        &mut affinity["nodeAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"];
    match preferred.as_array_mut() {
        Some(list) => list.push(term),
        None => *preferred = json!([term]),
    }
}

/// The world's policies, compiled as berth compiles them; every generated one
/// compiles.
pub fn compile(world: &World) -> PolicySet {
    let policies: Vec<PlacementPolicy> = world
        .policies
        .iter()
        .map(|p| serde_json::from_value(p.clone()).expect("a PlacementPolicy"))
        .collect();
    let (set, errors) = PolicySet::compile(&policies);
    assert!(errors.is_empty(), "generated policies compile: {errors:?}");
    set
}
