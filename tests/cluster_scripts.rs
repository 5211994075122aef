#![cfg(feature = "e2e")]
//! The `tests/cluster/` scripts themselves: two clusters run side by side, `down`
//! stops exactly its own processes, kwok runs the pods bound to the fake nodes
//! (which report the resources a kubelet would, ephemeral-storage included),
//! `component` stops and starts one part, a real node (`add-real-node`) runs pods
//! beside the fake ones and `down` leaves nothing of it behind, and bad arguments
//! fail with a clear message.

mod support;

use std::path::Path;
use std::process::Command;

use std::time::Duration;

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use serde_json::json;
use support::{
    Nodes, TestCluster, client_for, cluster_script, eventually, fresh_namespace, is_bound,
    repo_root, test_pod, wait_for,
};

const NODES: Nodes = Nodes {
    count: 2,
    prefix: "worker",
};

/// Held by the test that stops and starts the shared cluster's scheduler and by
/// the test that checks every process of the shared cluster still runs.
static RESTARTS: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// Runs a script expecting failure; returns its stderr.
fn script_fails(name: &str, args: &[&str]) -> String {
    let output = Command::new(repo_root().join("tests/cluster").join(name))
        .args(args)
        .output()
        .expect("run script");
    assert!(!output.status.success(), "{name} {args:?} should fail");
    String::from_utf8_lossy(&output.stderr).into_owned()
}

/// The pids `up` recorded in `dir`.
fn recorded_pids(dir: &Path) -> Vec<u32> {
    std::fs::read_to_string(dir.join("pids"))
        .expect("pids file")
        .lines()
        .filter_map(|l| l.split_whitespace().nth(1)?.parse().ok())
        .collect()
}

#[tokio::test]
async fn a_second_cluster_runs_beside_the_first_and_down_stops_only_it() {
    let _restarts = RESTARTS.lock().await;
    let first = TestCluster::shared(NODES);
    let second_dir = tempfile_dir("second");
    let second = second_dir.to_string_lossy().into_owned();
    cluster_script("up", &[&second]);
    cluster_script("add-nodes", &[&second, "3", "--prefix", "other"]);

    let first_client = first.client().await;
    let second_client = client_for(&second_dir.join("kubeconfig")).await;
    let names = |client: kube::Client| async move {
        let nodes: Api<Node> = Api::all(client);
        let mut names: Vec<String> = nodes
            .list(&ListParams::default())
            .await
            .expect("list nodes")
            .items
            .into_iter()
            .filter_map(|n| n.metadata.name)
            .collect();
        names.sort();
        names
    };
    assert_eq!(names(first_client.clone()).await, ["worker1", "worker2"]);
    assert_eq!(names(second_client).await, ["other1", "other2", "other3"]);

    let first_pids = recorded_pids(&first.dir);
    let second_pids = recorded_pids(&second_dir);
    assert_eq!(
        second_pids.len(),
        5,
        "etcd, apiserver, scheduler, controller-manager, kwok"
    );
    cluster_script("down", &[&second]);

    assert!(
        second_pids.iter().all(|&p| !support::running(p)),
        "down left a process running"
    );
    assert!(
        first_pids.iter().all(|&p| support::running(p)),
        "down stopped the other cluster"
    );
    assert_eq!(names(first_client).await, ["worker1", "worker2"]);
}

#[test]
fn scripts_reject_bad_arguments_with_a_clear_message() {
    assert!(script_fails("up", &[]).contains("usage: up DIR"));
    assert!(
        script_fails("up", &[&tempfile_dir("flag").to_string_lossy(), "--bogus"])
            .contains("unknown argument '--bogus'")
    );
    assert!(script_fails("component", &["/nonexistent"]).contains("usage: component DIR"));
    assert!(script_fails("down", &[]).contains("usage: down DIR"));
    assert!(script_fails("add-nodes", &["/nonexistent"]).contains("usage: add-nodes DIR N"));
    let dir = tempfile_dir("empty");
    let dir = dir.to_string_lossy();
    assert!(
        script_fails("add-nodes", &[&dir, "zero"]).contains("N must be a positive whole number")
    );
    assert!(script_fails("add-nodes", &[&dir, "2"]).contains("no cluster in"));
    assert!(
        script_fails("add-nodes", &[&dir, "2", "--prefix", "Bad_Name"])
            .contains("not a valid node name")
    );
    assert!(script_fails("add-real-node", &[]).contains("usage: add-real-node DIR"));
    assert!(script_fails("add-real-node", &[&dir]).contains("no cluster in"));
    assert!(
        script_fails("add-real-node", &[&dir, "--name", "Bad_Name"])
            .contains("not a valid node name")
    );
    assert!(script_fails("load-image", &[]).contains("usage: load-image DIR [TAG]"));
    assert!(script_fails("load-image", &[&dir]).contains("no real node in"));
    assert!(script_fails("load-image", &[&dir, "bad tag"]).contains("not a valid image tag"));
}

/// The phase and Ready condition of pod `name`, as `Running/True`.
async fn pod_state(pods: &Api<Pod>, name: &str) -> Option<String> {
    let pod = pods.get_opt(name).await.ok()??;
    let status = pod.status?;
    let ready = status
        .conditions?
        .into_iter()
        .find(|c| c.type_ == "Ready")
        .map(|c| c.status)
        .unwrap_or_default();
    Some(format!("{}/{ready}", status.phase?))
}

#[tokio::test]
async fn kwok_runs_bound_pods_and_a_test_can_hold_one_unready() {
    let cluster = TestCluster::shared(NODES);
    let client = cluster.client().await;
    let ns = fresh_namespace(&client, "kwok").await;
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
    let held = json!({"berth.test/unready": "true"});
    // What a chart's resource preset asks for (bitnami's "nano"): the nodes report
    // ephemeral-storage and hugepages as a kubelet does, so it runs unchanged.
    let preset = json!({"containers": [{"name": "redis", "image": "redis:7", "resources": {
        "requests": {"cpu": "100m", "memory": "128Mi", "ephemeral-storage": "50Mi"},
        "limits": {"cpu": "150m", "memory": "192Mi", "ephemeral-storage": "2Gi"}}}]});
    for (name, labels, spec) in [
        ("runs", json!({}), json!({})),
        ("held", held, json!({})),
        ("preset", json!({}), preset),
    ] {
        let pod = test_pod(name, labels, spec);
        pods.create(&PostParams::default(), &pod)
            .await
            .expect("create");
    }
    let wait = Duration::from_secs(60);
    for name in ["runs", "preset"] {
        eventually(&format!("{name} Running and Ready"), wait, || async {
            (pod_state(&pods, name).await? == "Running/True").then_some(())
        })
        .await;
    }
    eventually("held Running, not Ready", wait, || async {
        (pod_state(&pods, "held").await? == "Running/False").then_some(())
    })
    .await;
    // Without the label the readiness "probe" passes.
    let unlabel = json!({"metadata": {"labels": {"berth.test/unready": null}}});
    pods.patch("held", &PatchParams::default(), &Patch::Merge(&unlabel))
        .await
        .expect("unlabel");
    eventually("held Ready once unlabelled", wait, || async {
        (pod_state(&pods, "held").await? == "Running/True").then_some(())
    })
    .await;

    // Each node's Lease is renewed, as a kubelet does, so node-lifecycle keeps
    // the nodes Ready.
    let leases: Api<Lease> = Api::namespaced(client, "kube-node-lease");
    let renewed = |lease: Lease| lease.spec.and_then(|s| s.renew_time).map(|t| t.0);
    let first = renewed(leases.get("worker1").await.expect("worker1 has a Lease"));
    eventually("worker1's Lease renewed", wait, || async {
        let now = renewed(leases.get("worker1").await.ok()?);
        (now > first).then_some(())
    })
    .await;
}

#[tokio::test]
async fn component_stops_and_starts_the_scheduler() {
    let _restarts = RESTARTS.lock().await;
    let cluster = TestCluster::shared(NODES);
    let client = cluster.client().await;
    let ns = fresh_namespace(&client, "component").await;
    let pods: Api<Pod> = Api::namespaced(client, &ns);
    let dir = cluster.dir.to_string_lossy().into_owned();
    let scheduler_pid = || {
        std::fs::read_to_string(cluster.dir.join("pids"))
            .expect("pids")
            .lines()
            .find_map(|l| {
                l.strip_prefix("kube-scheduler ")?
                    .split(' ')
                    .next()?
                    .parse::<u32>()
                    .ok()
            })
    };
    let before = scheduler_pid().expect("up started kube-scheduler");
    cluster_script("component", &[&dir, "stop", "kube-scheduler"]);
    assert!(!support::running(before), "the scheduler stopped");
    assert_eq!(scheduler_pid(), None, "and left the pids file");
    assert!(
        script_fails("component", &[&dir, "stop", "kube-scheduler"]).contains("is not running")
    );
    pods.create(
        &PostParams::default(),
        &test_pod("later", json!({}), json!({})),
    )
    .await
    .expect("create");
    cluster_script("component", &[&dir, "start", "kube-scheduler"]);
    assert!(
        scheduler_pid().is_some_and(support::running),
        "a new scheduler runs"
    );
    // The restarted scheduler binds the pod (no other scheduler runs).
    wait_for(&pods, "later", is_bound, Duration::from_secs(60)).await;
}

/// A new folder under target/ for a cluster or a failing script to use.
fn tempfile_dir(purpose: &str) -> std::path::PathBuf {
    let dir = repo_root()
        .join("target/test-clusters")
        .join(format!("{purpose}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("create test folder");
    dir
}

/// The `KEY=VALUE` lines add-real-node keeps in DIR/node/env.
fn node_env(dir: &Path) -> std::collections::BTreeMap<String, String> {
    std::fs::read_to_string(dir.join("node/env"))
        .expect("node/env")
        .lines()
        .filter_map(|l| l.split_once('='))
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect()
}

/// What a real node of `env` has on this machine: its processes (kubelet,
/// containerd, shims, and those in its cgroups), mounts, network interfaces,
/// cgroup folders, DNAT rule and run folder, one line each.
fn real_node_traces(dir: &Path, env: &std::collections::BTreeMap<String, String>) -> Vec<String> {
    let mut traces = Vec::new();
    let bin = &env["bin"];
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        if let Ok(exe) = std::fs::read_link(entry.path().join("exe"))
            && exe.starts_with(bin)
        {
            let pid = entry.file_name();
            traces.push(format!(
                "process {} {}",
                pid.to_string_lossy(),
                exe.display()
            ));
        }
    }
    let node = dir.join("node");
    let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    for line in mounts.lines() {
        let point = line.split(' ').nth(4).unwrap_or_default();
        if point.starts_with(&env["run"]) || Path::new(point).starts_with(&node) {
            traces.push(format!("mount {point}"));
        }
    }
    let links = Command::new("ip")
        .args(["-o", "link", "show"])
        .output()
        .unwrap();
    for line in String::from_utf8_lossy(&links.stdout).lines() {
        if line.contains(&env["bridge"]) {
            traces.push(format!("interface {line}"));
        }
    }
    for entry in std::fs::read_dir("/sys/fs/cgroup").unwrap().flatten() {
        let root = entry
            .path()
            .join(env["cgroup_root"].trim_start_matches('/'));
        if root.exists() {
            traces.push(format!("cgroup {}", root.display()));
        }
    }
    let own = Path::new("/sys/fs/cgroup").join(env["cgroup_root"].trim_start_matches('/'));
    if own.exists()
        && !traces
            .iter()
            .any(|t| t.ends_with(&own.display().to_string()))
    {
        traces.push(format!("cgroup {}", own.display()));
    }
    let rules = Command::new("iptables")
        .args(["-t", "nat", "-S"])
        .output()
        .unwrap();
    for line in String::from_utf8_lossy(&rules.stdout).lines() {
        if line.contains(&format!("berth-test-{}", env["id"])) {
            traces.push(format!("rule {line}"));
        }
    }
    if Path::new(&env["run"]).exists() {
        traces.push(format!("folder {}", env["run"]));
    }
    traces
}

#[tokio::test]
async fn a_real_node_runs_pods_beside_kwok_and_down_leaves_nothing_behind() {
    let dir = tempfile_dir("real");
    let arg = dir.to_string_lossy().into_owned();
    cluster_script("up", &[&arg]);
    cluster_script("add-nodes", &[&arg, "1", "--prefix", "fake"]);
    let out = cluster_script("add-real-node", &[&arg]);
    let name = out.lines().last().unwrap().trim().to_owned();
    assert_eq!(name, "real1");
    let env = node_env(&dir);
    let client = client_for(&dir.join("kubeconfig")).await;

    // The real node is its kubelet's (containerd reported as its runtime), not
    // kwok's; the fake one stays kwok's.
    let nodes: Api<Node> = Api::all(client.clone());
    let runtime = |node: Node| {
        let status = node.status.unwrap();
        let ready = status
            .conditions
            .unwrap_or_default()
            .into_iter()
            .any(|c| c.type_ == "Ready" && c.status == "True");
        (ready, status.node_info.unwrap().container_runtime_version)
    };
    let (ready, version) = runtime(nodes.get(&name).await.unwrap());
    assert!(ready, "{name} Ready");
    assert!(version.starts_with("containerd://2."), "{name}: {version}");
    let (ready, version) = runtime(nodes.get("fake1").await.unwrap());
    assert!(ready, "fake1 Ready");
    assert!(!version.starts_with("containerd://"), "fake1: {version}");

    // A pod on it runs in a container, with an address on the node's pod network.
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    let pause = format!("registry.berth.test/pause:{}", k8s_version());
    let pod: Pod = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": "on-real"},
        "spec": {"nodeName": name, "containers": [
            {"name": "pause", "image": pause, "imagePullPolicy": "Never"}]}
    }))
    .unwrap();
    pods.create(&PostParams::default(), &pod).await.unwrap();
    let ip = eventually(
        "the pod Running with an IP",
        Duration::from_secs(60),
        || async {
            let pod = pods.get("on-real").await.ok()?;
            let status = pod.status?;
            (status.phase.as_deref() == Some("Running")).then_some(status.pod_ip?)
        },
    )
    .await;
    let subnet = env["subnet"].trim_end_matches("0/24");
    assert!(
        ip.starts_with(subnet),
        "pod IP {ip} outside {}",
        env["subnet"]
    );
    let before = real_node_traces(&dir, &env);
    for kind in ["process", "mount", "interface", "cgroup", "rule", "folder"] {
        assert!(
            before.iter().any(|t| t.starts_with(kind)),
            "no {kind} of the real node seen while it runs: {before:#?}"
        );
    }

    cluster_script("down", &[&arg]);
    let after = real_node_traces(&dir, &env);
    assert!(after.is_empty(), "down left behind: {after:#?}");
}

/// The Kubernetes version the cluster scripts pin (lib.sh).
fn k8s_version() -> String {
    let lib = std::fs::read_to_string(repo_root().join("tests/cluster/lib.sh")).unwrap();
    lib.lines()
        .find_map(|l| l.strip_prefix("K8S_VERSION=\""))
        .and_then(|v| v.strip_suffix('"'))
        .expect("K8S_VERSION in lib.sh")
        .to_owned()
}
