#![cfg(feature = "e2e")]
//! Exclusion that stays live: a released pod the scheduler can never place (here,
//! its own pod affinity names pods that do not exist) holds the pods of its
//! policy behind it only for a bounded wait. Then berth evicts it, its controller
//! makes it again behind them, and they are placed, no two on one node; the held
//! pods' Event names it and the scheduler's reason meanwhile.

mod support;

use std::collections::BTreeSet;
use std::time::Duration;

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::events::v1::Event;
use kube::api::{Api, ListParams, PostParams};
use serde_json::json;
use support::{Berth, Nodes, create_at_once, eventually, opted_in, placed, test_pod};

const NODES: Nodes = Nodes {
    count: 4,
    prefix: "node",
};
const WAIT: Duration = Duration::from_secs(120);

fn berth() -> &'static Berth {
    Berth::shared_with(
        NODES,
        &[],
        &[
            "--requeue-unschedulable-seconds",
            "5",
            "--resync-seconds",
            "2",
        ],
    )
}

#[tokio::test]
async fn a_pod_that_can_never_be_placed_holds_the_others_only_for_a_bounded_wait() {
    let client = berth().cluster.client().await;
    berth()
        .cluster
        .apply_app_policy("apart", json!({"avoid": {"matchLabels": {"app": "apart"}}}));
    let ns = opted_in(&client, "liveness", "apart", json!({"app": "apart"}), WAIT).await;

    // A Deployment's pod that must sit beside pods that do not exist: berth cannot
    // predict that, so it goes alone, and the scheduler never places it.
    let stuck: Deployment = serde_json::from_value(json!({
        "metadata": {"name": "stuck"},
        "spec": {"replicas": 1, "selector": {"matchLabels": {"app": "apart", "role": "stuck"}},
            "template": {"metadata": {"labels": {"app": "apart", "role": "stuck"}},
                "spec": {"containers": [{"name": "c", "image": "redis:7"}],
                    "affinity": {"podAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
                        {"topologyKey": "kubernetes.io/hostname",
                            "labelSelector": {"matchLabels": {"app": "nowhere"}}}]}}}}}}))
    .unwrap();
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), &ns);
    deployments
        .create(&PostParams::default(), &stuck)
        .await
        .unwrap();
    let pods: Api<k8s_openapi::api::core::v1::Pod> = Api::namespaced(client.clone(), &ns);
    let first = eventually("the stuck pod released and Unschedulable", WAIT, || async {
        let list = pods
            .list(&ListParams::default().labels("role=stuck"))
            .await
            .ok()?;
        list.items.into_iter().find_map(|p| {
            let unschedulable =
                p.status.as_ref()?.conditions.as_ref()?.iter().any(|c| {
                    c.type_ == "PodScheduled" && c.reason.as_deref() == Some("Unschedulable")
                });
            unschedulable.then(|| p.metadata.name.clone()).flatten()
        })
    })
    .await;

    // Three pods of the policy come at once; they wait behind it, told why.
    let others = (0..3)
        .map(|i| test_pod(&format!("apart-{i}"), json!({"app": "apart"}), json!({})))
        .collect();
    create_at_once(&client, &ns, others).await;
    support::held_for_exclusion(
        &client,
        &ns,
        "apart-0",
        &format!("first {ns}/{first}) is still being placed"),
    )
    .await;

    // berth evicts it after the wait; the others are placed, each on its own node.
    let nodes = placed(&client, &ns, "app=apart,!role", 3, WAIT).await;
    assert_eq!(
        nodes.values().collect::<BTreeSet<_>>().len(),
        3,
        "two pods that must avoid each other share a node: {nodes:?}"
    );
    let events: Api<Event> = Api::namespaced(client.clone(), &ns);
    let note = eventually("berth's RequeuedUnschedulable Event", WAIT, || async {
        let list = events
            .list(&ListParams::default().fields("reason=RequeuedUnschedulable"))
            .await
            .ok()?;
        list.items
            .into_iter()
            .find(|e| e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(first.as_str()))
            .and_then(|e| e.note)
    })
    .await;
    assert!(note.contains("the scheduler cannot place it"), "{note}");
    // Its controller made it again: one stuck pod, not the evicted one.
    eventually("the stuck pod made again", WAIT, || async {
        let again = pods
            .list(&ListParams::default().labels("role=stuck"))
            .await
            .ok()?
            .items;
        let live: Vec<&str> = again
            .iter()
            .filter(|p| p.metadata.deletion_timestamp.is_none())
            .filter_map(|p| p.metadata.name.as_deref())
            .collect();
        (live.len() == 1 && live[0] != first).then_some(())
    })
    .await;
}
