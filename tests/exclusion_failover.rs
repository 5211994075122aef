#![cfg(feature = "e2e")]
//! Exclusion across a leader change: the state of the held pods lives in the
//! cluster (gates, bindings), so a new leader rebuilds it from there. It must not
//! release a pod beside one the old leader left in flight, and it must release the
//! rest once that one is bound. Its own cluster: the test kills berth's leader.
//! The new leader runs as the ServiceAccount of `manifests/rbac.yaml`.

mod support;

use std::collections::BTreeSet;
use std::process::Command;
use std::time::Duration;

use berth::names;
use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::api::events::v1::Event;
use kube::Client;
use kube::api::{Api, ListParams, Patch, PatchParams};
use serde_json::json;
use support::fixtures::policy;
use support::{
    Berth, Nodes, Replica, create_at_once, eventually, lease_holder, opted_in, placed, test_pod,
};

const NODES: Nodes = Nodes {
    count: 8,
    prefix: "node",
};
const WAIT: Duration = Duration::from_secs(120);

async fn label_eligible(client: &Client, nodes: &[&str]) {
    let api: Api<Node> = Api::all(client.clone());
    let patch = json!({"metadata": {"labels": {"zone": "failover"}}});
    for node in nodes {
        api.patch(node, &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .unwrap();
    }
}

/// (bound, released but unbound, still gated) among the pods in `ns`.
async fn census(client: &Client, ns: &str) -> (usize, usize, usize) {
    let api: Api<Pod> = Api::namespaced(client.clone(), ns);
    let pods = api.list(&ListParams::default()).await.unwrap().items;
    let gated = |p: &&Pod| {
        p.spec
            .as_ref()
            .and_then(|s| s.scheduling_gates.as_ref())
            .is_some_and(|g| !g.is_empty())
    };
    let bound = |p: &&Pod| p.spec.as_ref().is_some_and(|s| s.node_name.is_some());
    (
        pods.iter().filter(bound).count(),
        pods.iter().filter(|p| !bound(p) && !gated(p)).count(),
        pods.iter().filter(gated).count(),
    )
}

#[tokio::test]
async fn a_new_leader_keeps_the_old_leaders_pod_in_flight_and_releases_the_rest() {
    let berth = Berth::shared(NODES);
    let client = berth.cluster.client().await;
    // Three eligible nodes for six pods: the old leader binds three, leaves the
    // fourth in flight (released, unschedulable; see below) and two held.
    label_eligible(&client, &["node1", "node2", "node3"]).await;
    berth.cluster.apply_policies(&[policy(
        "failover",
        json!({"podSelector": {"matchLabels": {"app": "failover"}},
            "avoid": {"matchLabels": {"app": "failover"}},
            "nodeAffinity": {"required": [{"key": "zone", "operator": "In", "values": ["failover"]}]}}),
    )]);
    let ns = opted_in(
        &client,
        "failover",
        "failover",
        json!({"app": "failover"}),
        WAIT,
    )
    .await;
    let leader = eventually("a leader", WAIT, || lease_holder(&client)).await;
    // The standby has only what the shipped RBAC grants, so the take-over below
    // also shows that an installation may hold the Lease, release pods and label
    // nodes.
    let account = berth.cluster.berth_service_account_kubeconfig();
    let standby = Replica::start(berth, "standby", &account);

    // A host port hides from berth where a pod fits: each goes alone, and the
    // fourth, narrowed off the three nodes taken, stays in flight, unschedulable.
    // (A pod whose fit berth predicts would wait held instead.)
    let host_port = json!({"containers": [{"name": "redis", "image": "redis:7",
        "ports": [{"containerPort": 6379, "hostPort": 6379}],
        "resources": {"requests": {"cpu": "100m"}}}]});
    let pods = (0..6)
        .map(|i| {
            let name = format!("cache-{i}");
            test_pod(&name, json!({"app": "failover"}), host_port.clone())
        })
        .collect();
    create_at_once(&client, &ns, pods).await;
    eventually("three bound, one in flight, two held", WAIT, || async {
        (census(&client, &ns).await == (3, 1, 2)).then_some(())
    })
    .await;
    // The leader's metrics (no other test shares this berth): four released and
    // timed, two held now.
    eventually("the leader's gate metrics", WAIT, || async {
        let held = berth.metric(&format!(
            r#"berth_gated_pods{{gate="{}"}}"#,
            names::AVOID_GATE
        ));
        let timed = berth.metric(&format!(
            r#"berth_gated_seconds_count{{gate="{}"}}"#,
            names::AVOID_GATE
        ));
        (held == Some(2.0) && timed == Some(4.0)).then_some(())
    })
    .await;

    // A leader that is killed cannot hand over: the standby takes the Lease when
    // it expires, with nothing but what it reads from the cluster.
    let killed = Command::new("kill")
        .args(["-KILL", &berth.pid().to_string()])
        .status()
        .unwrap();
    assert!(killed.success());
    eventually("the standby leads", WAIT, || async {
        (lease_holder(&client).await.as_deref() == Some("standby")).then_some(())
    })
    .await;
    assert_ne!(leader, "standby");
    // The new leader's own Events say it has looked at both held pods and holds
    // them behind the pod in flight; it released nothing.
    let events: Api<Event> = Api::namespaced(client.clone(), &ns);
    eventually("the new leader's word on both held pods", WAIT, || async {
        let list = events
            .list(&ListParams::default().fields("reason=HeldForExclusion"))
            .await
            .ok()?;
        let held: BTreeSet<String> = list
            .items
            .into_iter()
            .filter(|e| e.reporting_instance.as_deref() == Some("standby"))
            .filter_map(|e| e.regarding?.name)
            .collect();
        (held.len() == 2).then_some(())
    })
    .await;
    assert_eq!(
        census(&client, &ns).await,
        (3, 1, 2),
        "the new leader releases nothing while the old leader's pod is in flight"
    );

    // Room for everyone: the pod in flight lands, then the held ones, one by one.
    label_eligible(&client, &["node4", "node5", "node6"]).await;
    let nodes = placed(&client, &ns, "app=failover", 6, WAIT).await;
    let distinct: BTreeSet<&String> = nodes.values().collect();
    assert_eq!(distinct.len(), 6, "two pods share a node: {nodes:?}");
    // The new leader also keeps the anchor label on every node with a pod.
    let api: Api<Node> = Api::all(client.clone());
    for node in distinct {
        eventually(&format!("the anchor label on {node}"), WAIT, || async {
            let labels = api.get(node).await.ok()?.metadata.labels?;
            labels
                .contains_key(&names::anchor_label("failover"))
                .then_some(())
        })
        .await;
    }
    let log = std::fs::read_to_string(berth.cluster.dir.join("logs/standby.log")).unwrap();
    assert!(
        !log.contains("forbidden"),
        "the shipped RBAC falls short:\n{log}"
    );
    drop(standby);
}
