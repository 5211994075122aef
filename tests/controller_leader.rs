#![cfg(feature = "e2e")]
//! Leader election on the `berth-controller` Lease: any number of replicas, one
//! writer. SIGTERM releases the Lease at once; a killed leader is replaced once its
//! Lease expires, and the new leader does the writing.

mod support;

use std::process::Command;
use std::time::Duration;

use berth::names;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Node;
use kube::Client;
use kube::api::Api;
use serde_json::json;
use support::fixtures::policy;
use support::{Berth, Nodes, Replica, eventually, lease_holder};

const NODES: Nodes = Nodes {
    count: 2,
    prefix: "node",
};

async fn wait_holder(client: &Client, identity: &str, limit: Duration) {
    eventually(&format!("{identity} holds the Lease"), limit, || async {
        (lease_holder(client).await.as_deref() == Some(identity)).then_some(())
    })
    .await;
}

/// Removes node1's pool label by hand and waits until the current leader puts it back.
async fn drift_is_repaired(berth: &Berth, client: &Client) {
    let out =
        berth
            .cluster
            .kubectl(&["label", "node", "node1", &format!("{}-", names::POOL_LABEL)]);
    assert!(out.status.success());
    let nodes: Api<Node> = Api::all(client.clone());
    eventually(
        "the pool label back on node1",
        Duration::from_secs(30),
        || async {
            let node = nodes.get("node1").await.ok()?;
            (node.metadata.labels?.get(names::POOL_LABEL)?.as_str() == "lead").then_some(())
        },
    )
    .await;
}

#[tokio::test]
async fn the_lease_passes_on_sigterm_at_once_and_after_a_kill_on_expiry() {
    let berth = Berth::shared(NODES);
    let client = berth.cluster.client().await;
    berth.cluster.apply_policies(&[policy(
        "lead",
        json!({"pool": {"nodeNames": ["node1"], "dedicated": false}}),
    )]);

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

    // A killed leader cannot release: the next replica takes over on expiry, and
    // not before. The Lease's own record shows it: the second acquired it no
    // sooner than a full lease term after the first's last renewal.
    let second = Replica::start(berth, "second", &berth.cluster.kubeconfig());
    first.signal("-KILL");
    let leases: Api<Lease> = Api::namespaced(client.clone(), "berth-system");
    let last = leases.get("berth-controller").await.unwrap().spec.unwrap();
    assert_eq!(last.holder_identity.as_deref(), Some("first"));
    wait_holder(&client, "second", Duration::from_secs(60)).await;
    let taken = leases.get("berth-controller").await.unwrap().spec.unwrap();
    let renewed = last.renew_time.unwrap().0;
    let acquired = taken.acquire_time.unwrap().0;
    let term = i64::from(last.lease_duration_seconds.unwrap());
    assert!(
        acquired.duration_since(renewed).as_secs() >= term,
        "second took the Lease {:?} after first's last renewal, within its {term} s term",
        acquired.duration_since(renewed)
    );
    drift_is_repaired(berth, &client).await;
    drop(second);
}
