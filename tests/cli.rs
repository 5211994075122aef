//! `berth mutate`, `berth explain` and `berth crd` through the real binary: output
//! formats, exit codes, messages, and every example policy in `policies/`.

mod support;

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use berth::names;
use serde_json::{Value, json};
use support::fixtures;

fn repo(path: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(path)
}

fn berth(args: &[&str], stdin: Option<&str>) -> Output {
    let mut child = Command::new(env!("CARGO_BIN_EXE_berth"))
        .args(args)
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run berth");
    let mut input = child.stdin.take().unwrap();
    if let Some(text) = stdin {
        input.write_all(text.as_bytes()).unwrap();
    }
    drop(input);
    child.wait_with_output().unwrap()
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// Runs `berth mutate -o json` on one pod given as JSON, with `policies`.
fn mutate_json(pod: &Value, policies: &str) -> (Value, Output) {
    let out = berth(
        &["mutate", "-f", "-", "--policies", policies, "-o", "json"],
        Some(&pod.to_string()),
    );
    assert!(out.status.success(), "{}", stderr(&out));
    (
        serde_json::from_slice(&out.stdout).expect("json output"),
        out,
    )
}

/// The pod `default/p` of `image`, labelled `labels`, as JSON.
fn pod(labels: Value, image: &str) -> Value {
    fixtures::pod("p")
        .image(image)
        .metadata(json!({"namespace": "default"}))
        .labels(labels)
        .json()
}

fn required(pod: &Value) -> &Value {
    &pod["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
        [0]["matchExpressions"]
}

#[test]
fn mutate_prints_every_pod_of_a_multi_document_file_as_yaml() {
    let out = berth(
        &[
            "mutate",
            "-f",
            "tests/data/cdn-pod.yaml",
            "--policies",
            "policies/cdn.yaml",
        ],
        None,
    );
    assert!(out.status.success(), "{}", stderr(&out));
    let text = stdout(&out);
    assert_eq!(text.matches("kind: Pod").count(), 2);
    assert!(text.contains(&format!("{}: cdn", names::APPLIED_ANNOTATION)));
    assert!(
        text.contains("operator: NotIn"),
        "the wildcard pod is kept off node2"
    );
}

#[test]
fn mutate_prints_json_and_patches_for_several_pods_as_arrays() {
    let args = [
        "mutate",
        "-f",
        "tests/data/cdn-pod.yaml",
        "--policies",
        "policies/cdn.yaml",
        "-o",
    ];
    let json: Value =
        serde_json::from_slice(&berth(&[&args[..], &["json"]].concat(), None).stdout).unwrap();
    assert_eq!(json.as_array().unwrap().len(), 2);
    let patches: Value =
        serde_json::from_slice(&berth(&[&args[..], &["patch"]].concat(), None).stdout).unwrap();
    let first = &patches[0];
    assert!(
        first
            .as_array()
            .unwrap()
            .iter()
            .any(|op| op["path"] == "/spec/tolerations")
    );
    assert!(
        first
            .as_array()
            .unwrap()
            .iter()
            .any(|op| op["path"] == "/metadata/annotations")
    );
}

#[test]
fn mutate_reads_stdin_and_puts_warnings_on_stderr() {
    let mut p = pod(json!({}), "nginx");
    p["spec"]["tolerations"] = json!([{"key": names::POOL_TAINT, "operator": "Equal", "value": "cdn", "effect": "NoSchedule"}]);
    let (mutated, out) = mutate_json(&p, "policies/cdn.yaml");
    assert_eq!(mutated["spec"]["tolerations"], json!([]));
    assert_eq!(
        stderr(&out).trim(),
        format!(
            "warning: removed toleration {}=cdn: the pod is not entitled to that pool",
            names::POOL_TAINT
        )
    );
}

#[test]
fn a_node_name_on_a_dedicated_node_is_denied_with_exit_1() {
    let mut p = pod(json!({}), "nginx");
    p["spec"]["nodeName"] = json!("node2");
    let out = berth(
        &["mutate", "-f", "-", "--policies", "policies/cdn.yaml"],
        Some(&p.to_string()),
    );
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(
        stderr(&out).trim(),
        "denied: spec.nodeName node2 is in dedicated pool cdn, which this pod is not entitled to"
    );
    assert!(stdout(&out).is_empty(), "a denied pod is not printed");
}

#[test]
fn bad_input_exits_2_with_one_line_naming_the_file() {
    let dir = std::env::temp_dir().join(format!("berth-cli-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let write = |name: &str, text: &str| {
        let path = dir.join(name);
        std::fs::write(&path, text).unwrap();
        path.to_string_lossy().into_owned()
    };
    let good_pod = "tests/data/cdn-pod.yaml";
    let cases: Vec<(Vec<String>, String, &str)> = vec![
        (
            vec![write("broken.yaml", "kind: Pod\n  spec: [")],
            "policies".into(),
            "document 1 is not valid YAML",
        ),
        (
            vec![write(
                "configmap.yaml",
                "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: c}\n",
            )],
            "policies".into(),
            "document 1 is a ConfigMap; berth reads Pods and the pods of Deployments",
        ),
        (
            vec![write(
                "deploy.yaml",
                "apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: d}\n",
            )],
            "policies".into(),
            "document 1 is a Deployment with no pod template (spec.template.spec)",
        ),
        (
            vec![write(
                "cronjob.yaml",
                "apiVersion: batch/v1\nkind: CronJob\nmetadata: {name: c}\nspec: {schedule: '* * * * *', jobTemplate: {spec: {template: {spec: {containers: {}}}}}}\n",
            )],
            "policies".into(),
            "document 1 is not a valid CronJob",
        ),
        (
            vec![good_pod.into()],
            write(
                "unknown.yaml",
                "apiVersion: berth.io/v1alpha1\nkind: PlacementPolicy\nmetadata: {name: x}\nspec: {schedulerName: s, colour: red}\n",
            ),
            "unknown field `colour`",
        ),
        (
            vec![good_pod.into()],
            write(
                "glob.yaml",
                "apiVersion: berth.io/v1alpha1\nkind: PlacementPolicy\nmetadata: {name: x}\nspec: {images: ['[cdn'], schedulerName: s}\n",
            ),
            "policy x: images: bad image glob",
        ),
        (
            vec![good_pod.into()],
            write(
                "empty.yaml",
                "apiVersion: berth.io/v1alpha1\nkind: PlacementPolicy\nmetadata: {name: x}\nspec: {}\n",
            ),
            "policy x: grants nothing",
        ),
        (
            vec![dir.join("missing.yaml").to_string_lossy().into_owned()],
            "policies".into(),
            "cannot read",
        ),
    ];
    for (pods, policies, expected) in cases {
        let out = berth(&["mutate", "-f", &pods[0], "--policies", &policies], None);
        let err = stderr(&out);
        assert_eq!(out.status.code(), Some(2), "{err}");
        assert_eq!(err.lines().count(), 1, "one line: {err}");
        assert!(err.starts_with("error: "), "{err}");
        assert!(err.contains(expected), "{err} should contain {expected}");
        let file = if policies == "policies" {
            &pods[0]
        } else {
            &policies
        };
        assert!(err.contains(file.as_str()), "{err} should name {file}");
    }
}

#[test]
fn live_explain_with_an_unreadable_kubeconfig_exits_2_naming_it() {
    let missing = std::env::temp_dir().join("berth-no-such-kubeconfig");
    let out = berth(
        &[
            "explain",
            "pod",
            "web",
            "-n",
            "shop",
            "--kubeconfig",
            missing.to_str().unwrap(),
        ],
        None,
    );
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert_eq!(err.lines().count(), 1, "one line: {err}");
    assert!(err.starts_with("error: "), "{err}");
    assert!(err.contains("berth-no-such-kubeconfig"), "{err}");
    // Offline and live explain do not mix.
    let out = berth(
        &["explain", "-f", "tests/data/cdn-pod.yaml", "pod", "web"],
        None,
    );
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
}

#[test]
fn a_namespace_file_decides_which_policies_apply() {
    let ns = std::env::temp_dir().join(format!("berth-ns-{}.yaml", std::process::id()));
    let namespace = format!(
        "apiVersion: v1\nkind: Namespace\nmetadata:\n  name: default\n  annotations: {{{}: gpu}}\n",
        names::POLICIES_ANNOTATION
    );
    std::fs::write(&ns, namespace).unwrap();
    let out = berth(
        &[
            "mutate",
            "-f",
            "tests/data/cdn-pod.yaml",
            "--policies",
            "policies",
            "--namespace",
            ns.to_str().unwrap(),
            "-o",
            "json",
        ],
        None,
    );
    let pods: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert!(
        pods[0]["metadata"].get("annotations").is_none(),
        "cdn does not apply: {}",
        pods[0]
    );
}

#[test]
fn explain_says_why_and_where_in_plain_words() {
    let out = berth(
        &[
            "explain",
            "-f",
            "tests/data/cdn-pod.yaml",
            "--policies",
            "policies/cdn.yaml",
            "--nodes",
            "tests/data/nodes.yaml",
        ],
        None,
    );
    assert!(out.status.success(), "{}", stderr(&out));
    let text = stdout(&out);
    let tolerates = format!("+ tolerates {}=cdn:NoSchedule", names::POOL_TAINT);
    for expected in [
        "Pod uploader in namespace default",
        "image docker.io/example/cdn-uploader:1.0 of container upload matches *cdn*",
        &tolerates,
        "+ must run on a node of pool cdn",
        "The pod may land on: node2.",
        "cdn: no image matches *cdn*",
        "+ must stay off dedicated pool cdn: it tolerates every taint",
        "The pod may land on: node1, node3, node4.",
    ] {
        assert!(text.contains(expected), "missing {expected:?} in:\n{text}");
    }
}

#[test]
fn berth_crd_matches_the_checked_in_manifest() {
    let out = berth(&["crd"], None);
    assert!(out.status.success());
    let checked_in = std::fs::read_to_string(repo("manifests/crd.yaml")).unwrap();
    assert!(
        stdout(&out) == checked_in,
        "manifests/crd.yaml is stale: run `berth crd > manifests/crd.yaml`"
    );
}

#[test]
fn berth_webhooks_matches_the_checked_in_manifest() {
    let out = berth(&["webhooks"], None);
    assert!(out.status.success());
    let checked_in = std::fs::read_to_string(repo("manifests/webhooks.yaml")).unwrap();
    assert!(
        stdout(&out) == checked_in,
        "manifests/webhooks.yaml is stale: run `berth webhooks > manifests/webhooks.yaml`"
    );
}

#[test]
fn berth_admission_policy_matches_the_checked_in_manifest() {
    let out = berth(&["admission-policy"], None);
    assert!(out.status.success());
    let checked_in = std::fs::read_to_string(repo("manifests/admission-policy.yaml")).unwrap();
    assert!(
        stdout(&out) == checked_in,
        "manifests/admission-policy.yaml is stale: run `berth admission-policy > manifests/admission-policy.yaml`"
    );
    let other = berth(
        &[
            "admission-policy",
            "--berth-user",
            "system:serviceaccount:ops:berth",
        ],
        None,
    );
    assert!(
        stdout(&other).contains("request.userInfo.username != 'system:serviceaccount:ops:berth'")
    );
}

#[test]
fn berth_admission_policy_placement_matches_the_checked_in_manifest() {
    let out = berth(&["admission-policy", "--placement"], None);
    assert!(out.status.success());
    let checked_in = std::fs::read_to_string(repo("manifests/placement-policy.yaml")).unwrap();
    assert!(
        stdout(&out) == checked_in,
        "manifests/placement-policy.yaml is stale: run `berth admission-policy --placement > manifests/placement-policy.yaml`"
    );
    // berth's namespace, from its user, is one the policy never sees.
    let other = berth(
        &[
            "admission-policy",
            "--placement",
            "--berth-user",
            "system:serviceaccount:ops:berth",
        ],
        None,
    );
    assert!(other.status.success());
    let selector = |yaml: &str| -> Value {
        let policy: Value = serde_yaml_ng::Deserializer::from_str(yaml)
            .map(|d| serde::Deserialize::deserialize(d).expect("valid YAML"))
            .find(|o: &Value| o["kind"] == "MutatingAdmissionPolicy")
            .expect("a MutatingAdmissionPolicy");
        policy["spec"]["matchConstraints"]["namespaceSelector"]["matchExpressions"][0]["values"]
            .clone()
    };
    assert_eq!(
        selector(&checked_in),
        json!(["kube-system", "kube-node-lease", "berth-system"])
    );
    assert_eq!(
        selector(&stdout(&other)),
        json!(["kube-system", "kube-node-lease", "ops"])
    );
}

#[test]
fn example_cdn_policy_sends_cdn_pods_to_node2() {
    let (p, _) = mutate_json(
        &pod(json!({}), "registry.example.com/cdn/edge:2"),
        "policies/cdn.yaml",
    );
    assert_eq!(
        required(&p)[0],
        json!({"key": names::POOL_LABEL, "operator": "In", "values": ["cdn"]})
    );
}

#[test]
fn example_redis_master_policy_avoids_nodes_with_a_master() {
    let (p, _) = mutate_json(
        &pod(json!({"app": "redis-master"}), "redis:7"),
        "policies/redis-master.yaml",
    );
    assert_eq!(
        required(&p)[0],
        json!({"key": names::anchor_label("redis-master"), "operator": "DoesNotExist"})
    );
    let (other, _) = mutate_json(
        &pod(json!({"app": "redis-replica"}), "redis:7"),
        "policies/redis-master.yaml",
    );
    assert!(other["spec"].get("affinity").is_none());
}

#[test]
fn example_sidecar_policy_puts_b_beside_a() {
    let (p, _) = mutate_json(
        &pod(json!({"app": "b"}), "busybox"),
        "policies/sidecar.yaml",
    );
    assert_eq!(
        required(&p)[0],
        json!({"key": names::anchor_label("b-beside-a"), "operator": "In", "values": ["true"]})
    );
}

#[test]
fn example_gpu_policy_requires_the_gpu_and_prefers_nvme() {
    let (p, _) = mutate_json(
        &pod(json!({}), "nvcr.io/nvidia/cuda:12.4.0-base"),
        "policies/gpu.yaml",
    );
    assert_eq!(
        required(&p)[0],
        json!({"key": "nvidia.com/gpu.product", "operator": "In", "values": ["A100", "H100"]})
    );
    let preferred =
        &p["spec"]["affinity"]["nodeAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"];
    assert_eq!(preferred[0]["weight"], 50);
}

#[test]
fn example_batch_policy_routes_pods_to_its_scheduler() {
    let (p, _) = mutate_json(&pod(json!({}), "spark:3"), "policies/batch-scheduler.yaml");
    assert_eq!(p["spec"]["schedulerName"], "batch-scheduler");
}

#[test]
fn example_training_policy_holds_a_gang_and_queues_it() {
    let labels = json!({"podGroup": "resnet", "minAvailable": "4", "groupPriority": "7"});
    let (p, _) = mutate_json(&pod(labels, "trainer:1"), "policies/training-gang.yaml");
    assert_eq!(
        p["spec"]["schedulingGates"],
        json!([{"name": names::GANG_GATE}])
    );
    assert_eq!(
        p["spec"]["priorityClassName"],
        names::queue_class("training", 21)
    );
    assert_eq!(p["spec"]["priority"], 21);
    assert_eq!(p["spec"]["preemptionPolicy"], "Never");
}

#[test]
fn explain_says_which_gate_holds_a_group_pod_and_until_when() {
    let labels = json!({"podGroup": "resnet", "minAvailable": "4", "groupPriority": "7",
        "berth.io/rank": "2"});
    for (policies, expected) in [
        (
            "policies/training-gang.yaml",
            vec![
                format!(
                    "+ is held by the scheduling gate {} until 4 members of gang resnet exist",
                    names::GANG_GATE
                ),
                format!(
                    "+ is queued with PriorityClass {} (priority 21, preemptionPolicy Never)",
                    names::queue_class("training", 21)
                ),
            ],
        ),
        (
            "policies/release-order.yaml",
            vec![format!(
                "+ is held by the scheduling gate {} until every pod of a rank below 2",
                names::RANK_GATE
            )],
        ),
    ] {
        let out = berth(
            &["explain", "-f", "-", "--policies", policies],
            Some(&pod(labels.clone(), "trainer:1").to_string()),
        );
        assert!(out.status.success(), "{}", stderr(&out));
        let text = stdout(&out);
        for line in expected {
            assert!(text.contains(&line), "missing {line:?} in:\n{text}");
        }
    }
}

#[test]
fn example_release_policy_holds_ranked_pods() {
    let (p, _) = mutate_json(
        &pod(json!({"berth.io/rank": "2"}), "api:1"),
        "policies/release-order.yaml",
    );
    assert_eq!(
        p["spec"]["schedulingGates"],
        json!([{"name": names::RANK_GATE}])
    );
    let (p, _) = mutate_json(&pod(json!({}), "api:1"), "policies/release-order.yaml");
    assert!(
        p["spec"].get("schedulingGates").is_none(),
        "unranked: not held"
    );
}

#[test]
fn every_example_policy_has_a_test() {
    let tested = [
        "batch-scheduler.yaml",
        "cdn.yaml",
        "gpu.yaml",
        "redis-master.yaml",
        "release-order.yaml",
        "sidecar.yaml",
        "training-gang.yaml",
    ];
    let mut found: Vec<String> = std::fs::read_dir(repo("policies"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    found.sort();
    assert_eq!(found, tested, "a new example policy needs a test here");
}

#[test]
fn mutate_shows_the_pod_each_workload_makes_as_the_webhook_sees_it() {
    let out = berth(
        &[
            "mutate",
            "-f",
            "tests/data/workloads.yaml",
            "--policies",
            "policies/cdn.yaml",
            "-o",
            "json",
        ],
        None,
    );
    assert!(out.status.success(), "{}", stderr(&out));
    let pods: Vec<Value> = serde_json::from_slice(&out.stdout).unwrap();
    let owners: Vec<(&str, &str)> = pods
        .iter()
        .map(|p| {
            let owner = &p["metadata"]["ownerReferences"][0];
            assert_eq!(owner["controller"], json!(true), "{p}");
            (
                owner["kind"].as_str().unwrap(),
                owner["name"].as_str().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        owners,
        [
            ("ReplicaSet", "edge"),
            ("ReplicaSet", "edge-old"),
            ("StatefulSet", "cache"),
            ("Job", "purge"),
            ("Job", "warm"),
            ("DaemonSet", "shipper"),
        ]
    );
    // Each lands in its workload's namespace with its template's labels, and the
    // cdn pods are put on the pool as a bare cdn pod would be.
    for pod in &pods[..5] {
        assert_eq!(pod["kind"], "Pod");
        assert_eq!(pod["metadata"]["namespace"], "shop", "{pod}");
        assert_eq!(
            pod["metadata"]["annotations"][names::APPLIED_ANNOTATION],
            "cdn"
        );
        assert!(
            pod["spec"]["tolerations"]
                .as_array()
                .unwrap()
                .contains(&json!({"key": names::POOL_TAINT, "operator": "Equal", "value": "cdn", "effect": "NoSchedule"})),
            "{pod}"
        );
        assert_eq!(
            required(pod)[0],
            json!({"key": names::POOL_LABEL, "operator": "In", "values": ["cdn"]}),
            "{pod}"
        );
    }
    assert_eq!(pods[0]["metadata"]["labels"], json!({"app": "edge"}));
    assert_eq!(pods[0]["metadata"]["generateName"], "edge-");
    // A StatefulSet's first pod has its ordinal name and labels.
    assert_eq!(pods[2]["metadata"]["name"], "cache-0");
    assert_eq!(
        pods[2]["metadata"]["labels"]["statefulset.kubernetes.io/pod-name"],
        "cache-0"
    );
    assert_eq!(pods[3]["metadata"]["labels"]["job-name"], "purge");
    assert_eq!(pods[4]["metadata"]["labels"], json!({"app": "warm"}));
    // The DaemonSet's pod comes from the DaemonSet controller: it gets the pool's
    // toleration (logging is one of the namespaces cdn takes DaemonSets from) and
    // never a node affinity, beside the tolerations its controller adds.
    let shipper = &pods[5];
    assert_eq!(shipper["metadata"]["namespace"], "logging");
    let tolerations = shipper["spec"]["tolerations"].as_array().unwrap();
    for key in [
        names::POOL_TAINT,
        "node.kubernetes.io/not-ready",
        "node.kubernetes.io/network-unavailable",
    ] {
        assert!(
            tolerations.iter().any(|t| t["key"] == key),
            "{key} missing: {shipper}"
        );
    }
    assert!(shipper["spec"].get("affinity").is_none(), "{shipper}");
}

#[test]
fn explain_names_the_workload_and_where_its_pods_may_land() {
    let out = berth(
        &[
            "explain",
            "-f",
            "tests/data/workloads.yaml",
            "--policies",
            "policies/cdn.yaml",
            "--nodes",
            "tests/data/nodes.yaml",
        ],
        None,
    );
    assert!(out.status.success(), "{}", stderr(&out));
    let text = stdout(&out);
    for expected in [
        "Pod edge-* (Deployment edge) in namespace shop",
        "Pod cache-0 (StatefulSet cache) in namespace shop",
        "Pod warm-* (CronJob warm) in namespace shop",
        "image docker.io/example/cdn-edge:2.1 of container edge matches *cdn*",
        "Pod shipper-* (DaemonSet shipper) in namespace logging",
    ] {
        assert!(text.contains(expected), "missing {expected:?} in:\n{text}");
    }
    let landing: Vec<&str> = text
        .lines()
        .filter(|l| l.starts_with("The pod may land on"))
        .collect();
    assert_eq!(
        landing,
        [
            "The pod may land on: node2.",
            "The pod may land on: node2.",
            "The pod may land on: node2.",
            "The pod may land on: node2.",
            "The pod may land on: node2.",
            "The pod may land on: node1, node2, node3, node4.",
        ],
        "{text}"
    );
}

/// Runs `berth ARGS -f -` on `pod`, with the policies, namespace and nodes of
/// tests/data/semantics.
fn semantics(command: &str, pod: &Value, namespace: &str, extra: &[&str]) -> Output {
    let namespace = format!("tests/data/semantics/{namespace}.yaml");
    let mut args = vec![
        command,
        "-f",
        "-",
        "--policies",
        "tests/data/semantics/edge.yaml",
        "--namespace",
        &namespace,
    ];
    args.extend_from_slice(extra);
    berth(&args, Some(&pod.to_string()))
}

#[test]
fn a_required_affinity_with_no_terms_is_never_given_one() {
    // Kubernetes matches such a pod to no node (and the apiserver refuses it);
    // a term of berth's own would make it valid and placeable.
    for required in [
        json!({"nodeSelectorTerms": []}),
        json!({"nodeSelectorTerms": null}),
        json!({}),
    ] {
        let mut pod = pod(json!({"tier": "edge"}), "nginx");
        pod["spec"]["tolerations"] = json!([{"operator": "Exists"}]);
        pod["spec"]["affinity"] =
            json!({"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": required}});
        for namespace in ["tenant", "opted-in"] {
            let out = semantics("mutate", &pod, namespace, &["-o", "json"]);
            assert!(out.status.success(), "{}", stderr(&out));
            let mutated: Value = serde_json::from_slice(&out.stdout).unwrap();
            assert_eq!(
                mutated["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"],
                required,
                "{namespace}: {required}"
            );
        }
    }
}

#[test]
fn a_pod_that_names_its_node_is_not_kept_off_by_a_noschedule_taint() {
    // The kubelet admits a pod with spec.nodeName past NoSchedule taints.
    let mut named = pod(json!({}), "nginx");
    named["spec"]["nodeName"] = json!("w1");
    let out = semantics(
        "explain",
        &named,
        "tenant",
        &["--nodes", "tests/data/semantics/nodes.yaml"],
    );
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(
        stdout(&out).contains("The pod may land on: w1."),
        "{}",
        stdout(&out)
    );
    // Entitled and named to its pool's node, which carries a NoSchedule taint of
    // someone else's: no false "will stay Pending" warning.
    let mut entitled = pod(json!({"tier": "edge"}), "nginx");
    entitled["spec"]["nodeName"] = json!("e1");
    let out = semantics(
        "explain",
        &entitled,
        "opted-in",
        &["--nodes", "tests/data/semantics/nodes.yaml"],
    );
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(!stdout(&out).contains("Warnings:"), "{}", stdout(&out));
    assert!(
        stdout(&out).contains("The pod may land on: e1."),
        "{}",
        stdout(&out)
    );
}

#[test]
fn the_pod_as_the_apiserver_stores_it_is_admitted_to_an_empty_patch() {
    let edge = pod(json!({"tier": "edge"}), "nginx");
    let out = semantics("mutate", &edge, "opted-in", &["-o", "json"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let mut stored: Value = serde_json::from_slice(&out.stdout).unwrap();
    let terms = &stored["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
        ["nodeSelectorTerms"];
    assert!(
        terms[0]["matchExpressions"]
            .as_array()
            .unwrap()
            .iter()
            .all(|e| e.get("values") != Some(&json!([]))),
        "berth writes no empty values: {terms}"
    );
    // The apiserver drops empty lists; berth compares by meaning, so the stored pod
    // gets no second copy of anything.
    for e in
        stored["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
            ["nodeSelectorTerms"][0]["matchExpressions"]
            .as_array_mut()
            .unwrap()
    {
        if e["values"] == json!([]) {
            e.as_object_mut().unwrap().remove("values");
        }
    }
    let again = semantics("mutate", &stored, "opted-in", &["-o", "patch"]);
    assert!(again.status.success(), "{}", stderr(&again));
    assert_eq!(
        serde_json::from_slice::<Value>(&again.stdout).unwrap(),
        json!([])
    );
}

#[test]
fn a_preference_the_pod_has_in_another_spelling_is_not_added_again() {
    let mut edge = pod(json!({"tier": "edge"}), "nginx");
    edge["spec"]["affinity"] = json!({"nodeAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [
        {"weight": 50, "preference": {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["b", "a"]}]}}]}});
    let out = semantics("mutate", &edge, "opted-in", &["-o", "json"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let mutated: Value = serde_json::from_slice(&out.stdout).unwrap();
    let preferred = mutated["spec"]["affinity"]["nodeAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"]
        .as_array()
        .unwrap();
    let zones = preferred
        .iter()
        .filter(|p| p["preference"]["matchExpressions"][0]["key"] == "zone")
        .count();
    assert_eq!(zones, 1, "{preferred:?}");
}

#[test]
fn mutate_and_explain_with_nodes_refuse_a_node_that_labelled_itself_into_a_pool() {
    // Pool gpu selects by a label a node can set on itself: g1 is in it already,
    // g2 labelled itself to match. berth's CLI judges them as the controller does.
    let run = |command: &str, pod: &Value| {
        let args = [
            command,
            "-f",
            "-",
            "--policies",
            "tests/data/semantics/self-set.yaml",
            "--namespace",
            "tests/data/semantics/tenant.yaml",
            "--nodes",
            "tests/data/semantics/self-set-nodes.yaml",
        ];
        berth(&args, Some(&pod.to_string()))
    };
    let mut named = pod(json!({}), "nginx");
    named["spec"]["nodeName"] = json!("g1");
    let member = run("mutate", &named);
    assert_eq!(member.status.code(), Some(1), "{}", stderr(&member));
    assert!(
        stderr(&member).contains("spec.nodeName g1 is in dedicated pool gpu"),
        "{}",
        stderr(&member)
    );
    named["spec"]["nodeName"] = json!("g2");
    let refused = run("mutate", &named);
    assert!(
        refused.status.success(),
        "g2 is not the pool's: {}",
        stderr(&refused)
    );

    // A pod that tolerates every taint is kept off the pool's node only.
    let mut tolerant = pod(json!({}), "nginx");
    tolerant["spec"]["tolerations"] = json!([{"operator": "Exists"}]);
    let out = run("explain", &tolerant);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(
        stdout(&out).contains("The pod may land on: g2."),
        "{}",
        stdout(&out)
    );
}

#[test]
fn mutate_with_nodes_knows_which_nodes_a_pool_by_selector_claims() {
    let mut named = pod(json!({}), "nginx");
    named["spec"]["nodeName"] = json!("e1");
    let blind = semantics("mutate", &named, "tenant", &[]);
    assert!(
        blind.status.success(),
        "without nodes berth cannot know e1 is edge's"
    );
    let seeing = semantics(
        "mutate",
        &named,
        "tenant",
        &["--nodes", "tests/data/semantics/nodes.yaml"],
    );
    assert_eq!(seeing.status.code(), Some(1), "{}", stderr(&seeing));
    assert!(
        stderr(&seeing).contains("spec.nodeName e1 is in dedicated pool edge"),
        "{}",
        stderr(&seeing)
    );

    // A DaemonSet pod that tolerates every taint, made for e1, of a namespace the
    // pool does not take.
    let mut agent = pod(json!({}), "fluent-bit");
    agent["metadata"]["ownerReferences"] = json!([{"apiVersion": "apps/v1", "kind": "DaemonSet",
        "name": "agent", "uid": "u", "controller": true}]);
    agent["spec"]["tolerations"] = json!([{"operator": "Exists"}]);
    agent["spec"]["affinity"] = json!({"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
        "nodeSelectorTerms": [{"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["e1"]}]}]}}});
    assert!(semantics("mutate", &agent, "tenant", &[]).status.success());
    let seeing = semantics(
        "mutate",
        &agent,
        "tenant",
        &["--nodes", "tests/data/semantics/nodes.yaml"],
    );
    assert_eq!(seeing.status.code(), Some(1), "{}", stderr(&seeing));
    assert!(
        stderr(&seeing).contains("the node is in pool edge, which does not take this DaemonSet"),
        "{}",
        stderr(&seeing)
    );
}

#[test]
fn explain_marks_a_grant_the_pod_has_already_apart_from_what_berth_adds() {
    // edge prefers zones a and b with weight 50; this pod has that preference
    // already, in another spelling, so the patch adds the toleration, the
    // requirements and the annotation, and not the preference.
    let mut edge = pod(json!({"tier": "edge"}), "nginx");
    edge["spec"]["affinity"] = json!({"nodeAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [
        {"weight": 50, "preference": {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["b", "a"]}]}}]}});
    let out = semantics("mutate", &edge, "opted-in", &["-o", "patch"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let patch: Value = serde_json::from_slice(&out.stdout).unwrap();
    let paths: Vec<&str> = patch
        .as_array()
        .unwrap()
        .iter()
        .map(|op| op["path"].as_str().unwrap())
        .collect();
    assert!(
        paths.iter().all(|p| !p.contains("preferred")),
        "the patch adds no preference: {paths:?}"
    );

    let out = semantics("explain", &edge, "opted-in", &[]);
    assert!(out.status.success(), "{}", stderr(&out));
    let text = stdout(&out);
    let tolerates = format!("+ tolerates {}=edge:NoSchedule", names::POOL_TAINT);
    for expected in [
        "= prefers nodes with zone In [a, b] (weight 50); the pod has it already",
        &tolerates,
        "+ must run on a node of pool edge (added to every node-affinity term)",
        "+ is annotated berth.io/applied=edge",
    ] {
        assert!(text.contains(expected), "missing {expected:?} in:\n{text}");
    }
    assert!(!text.contains("+ prefers"), "{text}");

    // Without the preference, the patch adds it, and explain says so.
    edge["spec"]["affinity"] = json!({});
    let text = stdout(&semantics("explain", &edge, "opted-in", &[]));
    assert!(
        text.contains("+ prefers nodes with zone In [a, b] (weight 50)\n"),
        "{text}"
    );
}

/// Runs `berth explain -f -` on `pod` with the two pools of tests/data/conflict,
/// which both name node2 (zeta, the older, holds it), and `extra` arguments.
fn explain_conflict(pod: &Value, extra: &[&str]) -> Output {
    let args = [
        &["explain", "-f", "-", "--policies", "tests/data/conflict"][..],
        extra,
    ]
    .concat();
    berth(&args, Some(&pod.to_string()))
}

#[test]
fn a_node_name_conflict_names_the_pool_that_holds_the_node() {
    let denied = |pod: &Value, extra: &[&str]| {
        let out = explain_conflict(pod, extra);
        assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
        let text = stdout(&out);
        let line = text.lines().find(|l| l.starts_with("Denied: "));
        line.unwrap_or_else(|| panic!("no denial in:\n{text}"))
            .to_owned()
    };
    // Entitled to neither: the node is zeta's, though alpha's name sorts first.
    let mut named = pod(json!({}), "nginx");
    named["spec"]["nodeName"] = json!("node2");
    assert_eq!(
        denied(&named, &[]),
        "Denied: spec.nodeName node2 is in dedicated pool zeta, which this pod is not \
         entitled to."
    );
    // Entitled to zeta, which holds the node: alpha, which names it too, refuses.
    named["spec"]["containers"][0]["image"] = json!("zeta-app");
    assert_eq!(
        denied(&named, &[]),
        "Denied: spec.nodeName node2 is held by pool zeta but also named by dedicated \
         pool alpha, which this pod is not entitled to; while both claim the node, it \
         stays closed to what either refuses."
    );

    // Given the nodes, a denied pod lands on none, whatever fits.
    let out = explain_conflict(&named, &["--nodes", "tests/data/nodes.yaml"]);
    let text = stdout(&out);
    assert!(
        text.contains("The pod is denied: it is not created, so it lands on no node."),
        "{text}"
    );
    assert!(!text.contains("may land on"), "{text}");

    // A DaemonSet pod made for node2 that tolerates every taint, of a namespace
    // that opts into zeta only: zeta takes its DaemonSets, alpha does not.
    let dir = std::env::temp_dir().join(format!("berth-conflict-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let ns = dir.join("shop.yaml");
    std::fs::write(
        &ns,
        format!(
            "apiVersion: v1\nkind: Namespace\nmetadata:\n  name: default\n  annotations: {{{}: zeta}}\n",
            names::POLICIES_ANNOTATION
        ),
    )
    .unwrap();
    let mut agent = pod(json!({}), "fluent-bit");
    agent["metadata"]["ownerReferences"] = json!([{"apiVersion": "apps/v1", "kind": "DaemonSet",
        "name": "agent", "uid": "u", "controller": true}]);
    agent["spec"]["tolerations"] = json!([{"operator": "Exists"}]);
    agent["spec"]["affinity"] = json!({"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
        "nodeSelectorTerms": [{"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["node2"]}]}]}}});
    let line = denied(&agent, &["--namespace", ns.to_str().unwrap()]);
    assert!(
        line.starts_with(
            "Denied: DaemonSet pod for node node2: the node is held by pool zeta but also \
             named by pool alpha, which does not take this DaemonSet ("
        ),
        "{line}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn explain_says_which_pools_do_not_take_a_tenants_daemonset() {
    // edge takes the DaemonSets of namespaces labelled platform=true; tenant is not.
    let mut agent = pod(json!({}), "fluent-bit");
    agent["metadata"]["namespace"] = json!("tenant");
    agent["metadata"]["ownerReferences"] = json!([{"apiVersion": "apps/v1", "kind": "DaemonSet",
        "name": "agent", "uid": "u", "controller": true}]);
    let out = semantics("explain", &agent, "tenant", &[]);
    assert!(out.status.success(), "{}", stderr(&out));
    let text = stdout(&out);
    let expected = "No policy applies to this pod.\n\n\
                    Pools that do not take DaemonSets of namespace tenant:\n  \
                    edge: daemonSetNamespaces does not select tenant\n";
    assert!(text.contains(expected), "missing {expected:?} in:\n{text}");
}

#[test]
fn explain_says_which_applied_policies_the_apiserver_also_applies() {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("explain-in-apiserver");
    std::fs::create_dir_all(&dir).unwrap();
    let policies = [
        fixtures::policy(
            "plain",
            json!({"podSelector": {"matchLabels": {"app": "db"}}, "pool": {"nodeNames": ["node1"]}}),
        ),
        fixtures::policy(
            "apart",
            json!({"podSelector": {"matchLabels": {"app": "db"}},
                "avoid": {"matchLabels": {"app": "web"}}}),
        ),
    ];
    let file = dir.join("policies.yaml");
    let list = json!({"apiVersion": "v1", "kind": "List", "items": policies});
    std::fs::write(&file, list.to_string()).unwrap();
    let out = berth(
        &["explain", "-f", "-", "--policies", file.to_str().unwrap()],
        Some(&pod(json!({"app": "db"}), "db:1").to_string()),
    );
    assert!(out.status.success(), "{}", stderr(&out));
    let text = stdout(&out);
    let plain = text
        .split("  plain, because:")
        .nth(1)
        .expect("plain applies");
    assert!(
        plain.contains("\n    also applied by the apiserver (berth-placement)\n"),
        "{text}"
    );
    let apart = text
        .split("  apart, because:")
        .nth(1)
        .expect("apart applies");
    let line = apart
        .lines()
        .skip(1)
        .find(|l| !l.starts_with("    - "))
        .unwrap();
    assert_eq!(
        line, "    webhook only: avoid needs the cluster's state, which only the webhook sees",
        "{text}"
    );
}
