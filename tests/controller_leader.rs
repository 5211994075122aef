//! Leader election on the `berth-controller` Lease: any number of replicas, one
//! writer. SIGTERM releases the Lease at once; a killed leader is replaced once its
//! Lease expires, and the new leader does the writing.

mod support;

use std::process::Command;
use std::time::Duration;

use k8s_openapi::api::core::v1::Node;
use kube::Client;
use kube::api::Api;
use support::{Berth, Nodes, Replica, eventually, kubectl_with_input, lease_holder};

const NODES: Nodes = Nodes {
    count: 2,
    prefix: "node",
};
const POOL_LABEL: &str = "node-restriction.kubernetes.io/berth.pool";

async fn wait_holder(client: &Client, identity: &str, limit: Duration) {
    eventually(&format!("{identity} holds the Lease"), limit, || async {
        (lease_holder(client).await.as_deref() == Some(identity)).then_some(())
    })
    .await;
}

/// Removes node1's pool label by hand and waits until the current leader puts it back.
async fn drift_is_repaired(berth: &Berth, client: &Client) {
    let out = berth
        .cluster
        .kubectl(&["label", "node", "node1", &format!("{POOL_LABEL}-")]);
    assert!(out.status.success());
    let nodes: Api<Node> = Api::all(client.clone());
    eventually(
        "the pool label back on node1",
        Duration::from_secs(30),
        || async {
            let node = nodes.get("node1").await.ok()?;
            (node.metadata.labels?.get(POOL_LABEL)?.as_str() == "lead").then_some(())
        },
    )
    .await;
}

#[tokio::test]
async fn the_lease_passes_on_sigterm_at_once_and_after_a_kill_on_expiry() {
    let berth = Berth::shared(NODES);
    let client = berth.cluster.client().await;
    let policy = "apiVersion: berth.io/v1alpha1\nkind: PlacementPolicy\nmetadata: {name: lead}\nspec:\n  pool: {nodeNames: [node1], dedicated: false}\n";
    let out = kubectl_with_input(&berth.cluster.dir, &["apply", "-f", "-"], policy);
    assert!(out.status.success());

    let first = Replica::start(berth, "first", &berth.cluster.kubeconfig());
    // berth-up's replica leads; the other two stand by.
    let leader = eventually("a leader", Duration::from_secs(30), || {
        lease_holder(&client)
    })
    .await;
    assert_ne!(leader, "first");
    drift_is_repaired(berth, &client).await;

    // SIGTERM on the leader (berth-up's replica) releases the Lease at once (no
    // holder until the standby's next look), and the standby takes it over.
    let status = Command::new("kill")
        .args(["-TERM", &berth.pid().to_string()])
        .status()
        .unwrap();
    assert!(status.success());
    eventually("the Lease released", Duration::from_secs(8), || async {
        let now = lease_holder(&client).await;
        (now.as_deref() != Some(leader.as_str())).then_some(())
    })
    .await;
    wait_holder(&client, "first", Duration::from_secs(30)).await;
    drift_is_repaired(berth, &client).await;

    // A killed leader cannot release: the next replica takes over on expiry.
    let second = Replica::start(berth, "second", &berth.cluster.kubeconfig());
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(
        lease_holder(&client).await.as_deref(),
        Some("first"),
        "only one leader"
    );
    first.signal("-KILL");
    wait_holder(&client, "second", Duration::from_secs(60)).await;
    drift_is_repaired(berth, &client).await;
    drop(second);
}
