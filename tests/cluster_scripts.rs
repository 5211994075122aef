//! The `tests/cluster/` scripts themselves: two clusters run side by side, `down`
//! stops exactly its own processes, and bad arguments fail with a clear message.

mod support;

use std::path::Path;
use std::process::Command;

use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, ListParams};
use support::{Nodes, TestCluster, client_for, cluster_script, repo_root};

const NODES: Nodes = Nodes {
    count: 2,
    prefix: "worker",
};

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

/// Whether `pid` is a live process; a zombie waiting for its parent to reap it
/// has already stopped.
fn running(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|stat| {
            let state = stat.rsplit_once(") ")?.1.chars().next()?;
            Some(state != 'Z')
        })
        .unwrap_or(false)
}

#[tokio::test]
async fn a_second_cluster_runs_beside_the_first_and_down_stops_only_it() {
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
        4,
        "etcd, apiserver, scheduler, controller-manager"
    );
    cluster_script("down", &[&second]);

    assert!(
        second_pids.iter().all(|&p| !running(p)),
        "down left a process running"
    );
    assert!(
        first_pids.iter().all(|&p| running(p)),
        "down stopped the other cluster"
    );
    assert_eq!(names(first_client).await, ["worker1", "worker2"]);
}

#[test]
fn scripts_reject_bad_arguments_with_a_clear_message() {
    assert!(script_fails("up", &[]).contains("usage: up DIR"));
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
}

/// A new folder under target/ for a cluster or a failing script to use.
fn tempfile_dir(purpose: &str) -> std::path::PathBuf {
    let dir = repo_root()
        .join("target/test-clusters")
        .join(format!("{purpose}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("create test folder");
    dir
}
