#![cfg(feature = "e2e")]
//! A gang across a controller crash: berth counts a group's members from the
//! cluster (their gates and labels), never from memory, so a new controller that
//! takes over a half-counted group holds it and releases it whole once the last
//! member arrives. Its own cluster: the webhook runs alone (`--no-controller`), and
//! the test starts, kills and replaces the controller.

mod support;

use std::time::Duration;

use berth::names;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, ListParams};
use serde_json::json;
use support::fixtures::policy;
use support::{
    Berth, Nodes, Replica, create_at_once, eventually, gang_member, lease_holder, opted_in,
};

const NODES: Nodes = Nodes {
    count: 3,
    prefix: "node",
};
const WAIT: Duration = Duration::from_secs(120);

/// A member of the gang `crew` of three.
fn member(name: &str) -> Pod {
    gang_member("crew", name, "crew", 3, "100m")
}

/// Waits until controller `identity` has published a WaitingForGang Event in
/// `ns` that `says` it. A controller publishes one per count it sees, and may see
/// the first of two members created at once before the second.
async fn waiting_events(berth: &Berth, ns: &str, identity: &str, says: &str) {
    eventually(
        &format!("a WaitingForGang Event from {identity}: {says}"),
        WAIT,
        || async {
            let out = berth.cluster.kubectl(&[
                "get",
                "events",
                "-n",
                ns,
                "--field-selector",
                "reason=WaitingForGang",
                "-o",
                &format!("jsonpath={{.items[?(@.reportingInstance==\"{identity}\")].message}}"),
            ]);
            String::from_utf8_lossy(&out.stdout)
                .contains(says)
                .then_some(())
        },
    )
    .await
}

#[tokio::test]
async fn a_new_controller_holds_a_half_counted_gang_and_releases_it_whole() {
    let berth = Berth::shared_with(NODES, &[], &["--no-controller"]);
    let client = berth.cluster.client().await;
    let account = berth.cluster.berth_service_account_kubeconfig();
    let first = Replica::start(berth, "first", &account);
    berth.cluster.apply_policies(&[policy(
        "crew",
        json!({"podSelector": {"matchLabels": {"app": "crew"}}, "gang": {}}),
    )]);
    let ns = opted_in(&client, "crew", "crew", json!({"app": "crew"}), WAIT).await;
    create_at_once(&client, &ns, vec![member("a"), member("b")]).await;
    waiting_events(berth, &ns, "first", "gang crew has 2 of its 3 members").await;

    // The controller crashes with the group half-counted; a new one takes the
    // Lease once it expires, knowing only what the cluster says.
    first.signal("-KILL");
    let second = Replica::start(berth, "second", &account);
    eventually("the second controller leads", WAIT, || async {
        (lease_holder(&client).await.as_deref() == Some("second")).then_some(())
    })
    .await;
    waiting_events(berth, &ns, "second", "gang crew has 2 of its 3 members").await;
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
    for pod in pods.list(&ListParams::default()).await.unwrap() {
        let spec = pod.spec.unwrap();
        assert_eq!(spec.node_name, None, "{:?}", pod.metadata.name);
        let gates = spec.scheduling_gates.unwrap_or_default();
        assert!(
            gates.iter().any(|g| g.name == names::GANG_GATE),
            "{gates:?}"
        );
    }

    // The last member arrives: the new controller releases all three.
    create_at_once(&client, &ns, vec![member("c")]).await;
    eventually("all three bound", WAIT, || async {
        let all = pods.list(&ListParams::default()).await.ok()?.items;
        let bound = all.iter().filter(|p| support::is_bound(Some(p))).count();
        (bound == 3).then_some(())
    })
    .await;
    drop(second);
    // The new controller ran as the shipped ServiceAccount, sweeps included.
    let log = std::fs::read_to_string(berth.cluster.dir.join("logs/second.log")).unwrap();
    assert!(
        !log.contains("forbidden"),
        "the shipped RBAC falls short:\n{log}"
    );
}
