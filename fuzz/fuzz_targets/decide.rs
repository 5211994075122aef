//! Feeds arbitrary bytes into the placement decision and the patch builder.
//!
//! Input layout: `POD [0x00 CONFIG]`, split at the *last* 0x00 byte.
//!
//! - `POD` is parsed as JSON. When it is not valid JSON, it is taken as a (lossy
//!   UTF-8) string and wrapped into a pod-like JSON document at one of several
//!   places chosen by its first byte, so that most runs still reach `decide`.
//! - `CONFIG` (optional) is one flags byte followed by strings separated by 0x01:
//!   `policies`, `images-policy`, `images-value`, `scheduler-name`, `namespace`,
//!   `requester` (a non-empty string: the DaemonSet controller sends the pod).
//!   Without a CONFIG part (e.g. a plain pod JSON from the seed corpus) the
//!   namespace opts into every policy and nodes are given when the input length is
//!   odd.
//!
//! Checked for every input:
//! - nothing panics (`decide` promises it never does, whatever the JSON), nor do
//!   the readers in front of it: the AdmissionReview parser, the lenient object
//!   reader and the uid scanner for bodies too large to read, all fed the raw bytes;
//! - every warning is under 120 characters;
//! - the patch applies to the pod it was built from;
//! - when the decision has neither `unreadable` nor `denial`, the patched pod is
//!   still readable and deciding again on it yields an empty patch (idempotency);
//! - `explain` runs.
#![no_main]

use std::collections::BTreeMap;
use std::sync::OnceLock;

use berth::objects::{NodeIndex, NodeInfo};
use berth::placement::explain::explain;
use berth::placement::namespace::NamespaceInfo;
use berth::placement::{Input, Requester, build_patch, decide};
use berth::policy::{PlacementPolicy, PolicySet};
use libfuzzer_sys::fuzz_target;
use serde_json::{Value, json};

/// Flags of the CONFIG byte.
const NODES: u8 = 1 << 0;
const POLICIES: u8 = 1 << 1;
const POLICIES_FROM_FUZZ: u8 = 1 << 2;
const IMAGES: u8 = 1 << 3;
const SCHEDULER: u8 = 1 << 4;
const NS_LABELS: u8 = 1 << 5;
const NODE_VARIANT: u8 = 1 << 6;
const NS_NAME_FROM_FUZZ: u8 = 1 << 7;

const ALL_POLICIES: &str = "cdn, edge, gpu, redis, sidecar, batch, training";

fn policy(name: &str, spec: Value) -> PlacementPolicy {
    serde_json::from_value(json!({
        "apiVersion": "berth.io/v1alpha1",
        "kind": "PlacementPolicy",
        "metadata": {"name": name},
        "spec": spec,
    }))
    .expect("fuzz policy deserialises")
}

fn policies() -> &'static PolicySet {
    static SET: OnceLock<PolicySet> = OnceLock::new();
    SET.get_or_init(|| {
        let list = [
            // A dedicated Required pool on named nodes.
            policy(
                "cdn",
                json!({"images": ["*cdn*"], "pool": {"nodeNames": ["node2"]}}),
            ),
            // A dedicated Preferred pool, opted into by namespace labels too.
            policy(
                "edge",
                json!({
                    "namespaceSelector": {"matchLabels": {"tier": "edge"}},
                    "images": ["*edge*", "docker.io/library/nginx:*"],
                    "pool": {"nodeNames": ["node1"], "placement": "Preferred", "weight": 30}
                }),
            ),
            // A nodeSelector pool with NoExecute, DaemonSets excluded, and extra
            // required and preferred node affinity.
            policy(
                "gpu",
                json!({
                    "images": ["*cuda*", "*gpu*"],
                    "pool": {
                        "nodeSelector": {"matchLabels": {"accelerator": "nvidia"}},
                        "effect": "NoExecute",
                        "daemonSets": "Exclude"
                    },
                    "nodeAffinity": {
                        "required": [
                            {"key": "nvidia.com/gpu.product", "operator": "In", "values": ["A100", "H100"]},
                            {"key": "gpu-mem", "operator": "Gt", "values": ["16"]}
                        ],
                        "preferred": [
                            {"weight": 20, "preference": {"key": "disk", "operator": "In", "values": ["nvme"]}},
                            {"weight": 5, "preference": {"key": "spot", "operator": "DoesNotExist"}}
                        ]
                    }
                }),
            ),
            // avoid and a scheduler, for labelled pods of any image.
            policy(
                "redis",
                json!({
                    "podSelector": {"matchExpressions": [{"key": "role", "operator": "Exists"}]},
                    "avoid": {"matchLabels": {"role": "master"}},
                    "anchorNamespaces": "All",
                    "schedulerName": "berth-scheduler"
                }),
            ),
            // colocateWith (a policy has one of colocateWith and avoid).
            policy(
                "sidecar",
                json!({
                    "podSelector": {"matchExpressions": [{"key": "role", "operator": "Exists"}]},
                    "colocateWith": {"matchLabels": {"app": "cache"}}
                }),
            ),
            // Another scheduler (conflicts with redis) and a non-dedicated pool.
            policy(
                "batch",
                json!({
                    "images": ["*batch*", "*job*", "*cdn*"],
                    "schedulerName": "batch-scheduler",
                    "pool": {"nodeSelector": {"matchExpressions": [{"key": "batch", "operator": "Exists"}]}, "dedicated": false},
                    "nodeAffinity": {"required": [{"key": "kubernetes.io/arch", "operator": "In", "values": ["amd64"]}]}
                }),
            ),
            // Groups: a gang, ranks and a queue on the labels of case 6 below.
            policy(
                "training",
                json!({
                    "podSelector": {"matchExpressions": [{"key": "podGroup", "operator": "Exists"}]},
                    "gang": {"timeoutSeconds": 30},
                    "startOrder": {},
                    "queue": {}
                }),
            ),
        ];
        let (set, errors) = PolicySet::compile(&list);
        assert!(errors.is_empty(), "fuzz policies must compile: {errors:?}");
        set
    })
}

fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

fn nodes(variant: bool) -> NodeIndex {
    let taint = |key: &str, value: &str, effect: &str| {
        serde_json::from_value(json!({"key": key, "value": value, "effect": effect}))
            .expect("taint")
    };
    let mut index = NodeIndex::new();
    index.insert(
        "node1".into(),
        NodeInfo {
            labels: labels(&[("kubernetes.io/arch", "amd64"), ("disk", "nvme")]),
            taints: Vec::new(),
        }
        .into(),
    );
    index.insert(
        "node2".into(),
        NodeInfo {
            labels: labels(&[("kubernetes.io/arch", "arm64")]),
            taints: if variant {
                vec![taint("berth.io/pool", "stale", "NoSchedule")]
            } else {
                Vec::new()
            },
        }
        .into(),
    );
    index.insert(
        "node3".into(),
        NodeInfo {
            labels: labels(&[
                ("accelerator", "nvidia"),
                ("nvidia.com/gpu.product", "A100"),
                ("gpu-mem", "40"),
                ("kubernetes.io/arch", "amd64"),
            ]),
            taints: if variant {
                vec![taint("dedicated", "ml", "NoExecute")]
            } else {
                Vec::new()
            },
        }
        .into(),
    );
    if variant {
        index.insert(
            "node4".into(),
            NodeInfo {
                labels: labels(&[("batch", ""), ("accelerator", "nvidia")]),
                taints: vec![taint("spot", "true", "PreferNoSchedule")],
            }
            .into(),
        );
    }
    index
}

/// Arbitrary bytes as a string at one place of an otherwise ordinary pod.
fn wrap(bytes: &[u8]) -> Value {
    let selector = bytes.first().copied().unwrap_or(0);
    let s = String::from_utf8_lossy(bytes.get(1..).unwrap_or_default()).into_owned();
    let mut pod = json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "fuzz", "namespace": "ns", "labels": {"app": "web"}},
        "spec": {"containers": [{"name": "app", "image": "example/cdn-uploader:1.0"}]}
    });
    let spec = &mut pod["spec"];
    match selector % 8 {
        0 => spec["containers"][0]["image"] = json!(s),
        1 => spec["nodeName"] = json!(s),
        2 => spec["schedulerName"] = json!(s),
        3 => {
            spec["tolerations"] = json!([
                {"key": "berth.io/pool", "operator": "Equal", "value": s, "effect": "NoSchedule"},
                {"operator": "Exists", "effect": s}
            ])
        }
        4 => {
            spec["affinity"] = json!({"nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
                    {"matchExpressions": [
                        {"key": "node-restriction.kubernetes.io/berth.pool", "operator": "In", "values": [s]},
                        {"key": s, "operator": "Exists"}
                    ]}
                ]},
                "preferredDuringSchedulingIgnoredDuringExecution": [
                    {"weight": 1, "preference": {"matchExpressions": [
                        {"key": "node-restriction.kubernetes.io/berth.runs.redis", "operator": "In", "values": [s]}
                    ]}}
                ]
            }})
        }
        5 => {
            pod["metadata"]["ownerReferences"] = json!([{
                "apiVersion": "apps/v1", "kind": "DaemonSet", "name": s,
                "uid": "00000000-0000-0000-0000-000000000000", "controller": true
            }]);
            pod["spec"]["tolerations"] = json!([{"operator": "Exists"}]);
        }
        6 => {
            pod["metadata"]["labels"] = json!({"role": s, "app": "redis", "podGroup": s,
                "minAvailable": s, "berth.io/rank": s, "groupPriority": s});
            pod["metadata"]["annotations"] = json!({"berth.io/applied": s});
        }
        _ => {
            pod["spec"]["initContainers"] = json!([{"name": s, "image": s}]);
            pod["metadata"]["name"] = json!(s);
        }
    }
    pod
}

fn warnings_are_short(warnings: &[String]) {
    for w in warnings {
        assert!(
            w.chars().count() < 120,
            "warning of {} characters: {w}",
            w.chars().count()
        );
    }
}

fuzz_target!(|data: &[u8]| {
    // The admission edge sees the bytes first.
    let _ = berth::admission::review::parse(data);
    let _ = berth::admission::review::uid_from_prefix(data);
    let (pod_bytes, config) = match data.iter().rposition(|&b| b == 0) {
        Some(i) => (&data[..i], Some(&data[i + 1..])),
        None => (data, None),
    };
    let (flags, strings): (u8, Vec<String>) = match config {
        Some(config) => {
            let flags = config.first().copied().unwrap_or(0);
            let rest = config.get(1..).unwrap_or_default();
            let strings = rest
                .split(|&b| b == 1)
                .map(|s| String::from_utf8_lossy(s).into_owned())
                .collect();
            (flags, strings)
        }
        None => (POLICIES | (data.len() as u8 & NODES), Vec::new()),
    };
    let string = |i: usize| strings.get(i).map(String::as_str).unwrap_or_default();

    let pod: Value = match serde_json::from_slice(pod_bytes) {
        Ok(value) => value,
        Err(_) => wrap(pod_bytes),
    };

    let mut namespace = NamespaceInfo::new(if flags & NS_NAME_FROM_FUZZ != 0 {
        string(4)
    } else {
        "ns"
    });
    if flags & POLICIES != 0 {
        let value = if flags & POLICIES_FROM_FUZZ != 0 {
            string(0)
        } else {
            ALL_POLICIES
        };
        namespace
            .annotations
            .insert("berth.io/policies".into(), value.into());
    }
    if flags & IMAGES != 0 {
        let policy = match string(1) {
            "" => "cdn",
            other => other,
        };
        namespace
            .annotations
            .insert(format!("berth.io/images.{policy}"), string(2).into());
    }
    if flags & SCHEDULER != 0 {
        namespace
            .annotations
            .insert("berth.io/scheduler-name".into(), string(3).into());
    }
    if flags & NS_LABELS != 0 {
        namespace.labels.insert("tier".into(), "edge".into());
    }
    let index = nodes(flags & NODE_VARIANT != 0);
    let policies = policies();
    let input = Input {
        pod: &pod,
        namespace: &namespace,
        policies,
        nodes: (flags & NODES != 0).then_some(&index),
        requester: if string(5).is_empty() {
            Requester::Other
        } else {
            Requester::DaemonSetController
        },
        // Either gang mode, by the length of the input.
        groups: berth::placement::groups::GroupContext {
            gang_mode: if data.len() % 2 == 0 {
                berth::placement::groups::GangMode::Gate
            } else {
                berth::placement::groups::GangMode::PodGroup
            },
            default_class: None,
        },
    };

    let decision = decide(&input);
    warnings_are_short(&decision.warnings);
    let patch = build_patch(&pod, &decision.grants);
    let mut patched = pod.clone();
    if let Err(e) = json_patch::patch(&mut patched, &patch) {
        panic!(
            "patch does not apply to the pod it was built from: {e}\npod: {pod}\npatch: {}",
            serde_json::to_string(&patch).unwrap_or_default()
        );
    }

    if decision.unreadable.is_none() && decision.denial.is_none() {
        let again = Input {
            pod: &patched,
            ..input
        };
        let second = decide(&again);
        warnings_are_short(&second.warnings);
        assert!(
            second.unreadable.is_none(),
            "berth's patch made a readable pod unreadable: {:?}\npod: {pod}\npatched: {patched}",
            second.unreadable
        );
        let second_patch = build_patch(&patched, &second.grants);
        assert!(
            second_patch.0.is_empty(),
            "not idempotent: second patch {}\npod: {pod}\nfirst patch: {}\npatched: {patched}",
            serde_json::to_string(&second_patch).unwrap_or_default(),
            serde_json::to_string(&patch).unwrap_or_default()
        );
    }

    let name = pod
        .pointer("/metadata/name")
        .and_then(Value::as_str)
        .unwrap_or("<unnamed>");
    let text = explain(&input, name, &decision, None);
    assert!(!text.is_empty());
});
