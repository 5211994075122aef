#![cfg(feature = "e2e")]
//! A compromised node against exclusion, acting as the node identity
//! (`system:node:<name>` in `system:nodes`, through NodeRestriction): a kubelet may
//! set `kubernetes.io/hostname` on its own Node, and berth's release sets name
//! nodes by that label. A node that copies another's hostname must not be let
//! into that node's sets, nor let a pod onto a node where a pod it must avoid runs.

mod support;

use std::time::Duration;

use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{Api, Patch, PatchParams, PostParams};
use serde_json::json;
use support::{Berth, Nodes, eventually, opted_in, test_pod};

const NODES: Nodes = Nodes {
    count: 3,
    prefix: "node",
};
const WAIT: Duration = Duration::from_secs(90);

/// The `kubernetes.io/hostname In` values of a pod's required node affinity.
fn hostnames_in(pod: &Pod) -> Vec<String> {
    pod.spec
        .as_ref()
        .and_then(|s| s.affinity.as_ref())
        .and_then(|a| a.node_affinity.as_ref())
        .and_then(|n| {
            n.required_during_scheduling_ignored_during_execution
                .as_ref()
        })
        .map(|r| {
            r.node_selector_terms
                .iter()
                .flat_map(|t| t.match_expressions.iter().flatten())
                .filter(|e| e.key == "kubernetes.io/hostname" && e.operator == "In")
                .flat_map(|e| e.values.clone().unwrap_or_default())
                .collect()
        })
        .unwrap_or_default()
}

#[tokio::test]
async fn a_node_that_copies_anothers_hostname_takes_no_pod_beside_one_it_avoids() {
    let berth = Berth::shared(NODES);
    let cluster = &berth.cluster;
    let client = cluster.client().await;
    let policy = support::repo_root().join("policies/redis-master.yaml");
    cluster.kubectl_ok(&["apply", "-f", policy.to_str().unwrap()]);

    // Only node1 and node2 take the team's masters (labels the admin set).
    let nodes: Api<Node> = Api::all(client.clone());
    for node in ["node1", "node2"] {
        let patch = json!({"metadata": {"labels": {"team": "red"}}});
        nodes
            .patch(node, &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .unwrap();
    }
    // node2, compromised, copies node1's hostname label on its own Node: the
    // apiserver lets it (NodeRestriction allows a kubelet that label).
    let as_node2: Api<Node> = Api::all(cluster.node_client("node2").await);
    let copy = json!({"metadata": {"labels": {"kubernetes.io/hostname": "node1"}}});
    as_node2
        .patch("node2", &PatchParams::default(), &Patch::Merge(&copy))
        .await
        .expect("a node may set its own hostname label");

    let ns = opted_in(
        &client,
        "copied-hostname",
        "redis-master",
        json!({"app": "redis-master"}),
        WAIT,
    )
    .await;
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
    let master = |name: &str| {
        test_pod(
            name,
            json!({"app": "redis-master"}),
            json!({"nodeSelector": {"team": "red"}}),
        )
    };
    let bound_node = |name: &'static str| {
        let pods = pods.clone();
        async move {
            eventually(&format!("{name} bound"), WAIT, || async {
                pods.get(name).await.ok()?.spec?.node_name
            })
            .await
        }
    };
    pods.create(&PostParams::default(), &master("first"))
        .await
        .unwrap();
    let first_node = bound_node("first").await;
    pods.create(&PostParams::default(), &master("second"))
        .await
        .unwrap();
    let second_node = bound_node("second").await;

    // berth's own record: the second master was released onto no hostname that
    // the first's node carries, and they run on two nodes.
    let second = pods.get("second").await.unwrap();
    let first_host = nodes
        .get(&first_node)
        .await
        .unwrap()
        .metadata
        .labels
        .unwrap_or_default()
        .get("kubernetes.io/hostname")
        .cloned()
        .unwrap_or_default();
    let set = hostnames_in(&second);
    assert!(
        !set.contains(&first_host),
        "the second master was released onto {set:?}, which takes in {first_node} \
         (hostname {first_host}), where the first runs"
    );
    assert_ne!(first_node, second_node, "two masters on one node");
}
