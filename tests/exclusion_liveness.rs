#![cfg(feature = "e2e")]
//! Exclusion that stays live: a released pod the scheduler can never place (here,
//! its own pod affinity names pods that do not exist) holds the pods of its
//! policy behind it only for a bounded wait. Then berth evicts it, its controller
//! makes it again behind them, and they are placed, no two on one node; the held
//! pods' Event names it and the scheduler's reason meanwhile. A tenant's bare pod
//! that no scheduler will take (one named that nobody runs; an impossible node
//! selector with a host port) is set aside after the same wait: another team's
//! masters created with it are all placed, no two on one node.

mod support;

use std::collections::BTreeSet;
use std::time::Duration;

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::events::v1::Event;
use kube::api::{Api, ListParams, PostParams};
use serde_json::json;
use support::{Berth, Nodes, Tenant, create_at_once, eventually, opted_in, placed, test_pod};

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

/// A tenant's bare pod of the policy `app`, created first, that no scheduler takes
/// (`spec` makes it so), released first, and three masters of another team's
/// namespace created behind it: the masters are placed, each on its own node, and
/// the tenant's pod is told it was set aside.
async fn a_tenants_stuck_pod_holds_another_teams_masters_only_for_the_wait(
    app: &str,
    spec: serde_json::Value,
) {
    let cluster = berth().cluster;
    let client = cluster.client().await;
    cluster.apply_app_policy(app, json!({"avoid": {"matchLabels": {"app": app}}}));
    let team = opted_in(
        &client,
        &format!("{app}-team"),
        app,
        json!({"app": app}),
        WAIT,
    )
    .await;
    let tenant_ns = opted_in(
        &client,
        &format!("{app}-tenant"),
        app,
        json!({"app": app}),
        WAIT,
    )
    .await;
    let tenant = Tenant::new(cluster, &format!("tenant-{tenant_ns}"), &tenant_ns).await;

    let mut stuck = json!({"apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "stuck", "namespace": tenant_ns, "labels": {"app": app}},
        "spec": {"containers": [{"name": "c", "image": "redis:7"}]}});
    for (key, value) in spec.as_object().unwrap() {
        stuck["spec"][key] = value.clone();
    }
    let out = tenant.create(cluster, &stuck.to_string());
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // Released before the masters exist, so that it is the one in flight they
    // wait behind: created together, berth may release the masters first (the
    // tenant's pod not yet in its cache), and then nothing is held.
    let tenant_pods: Api<k8s_openapi::api::core::v1::Pod> =
        Api::namespaced(client.clone(), &tenant_ns);
    eventually("the tenant's pod released", WAIT, || async {
        let pod = tenant_pods.get("stuck").await.ok()?;
        let gated = pod
            .spec?
            .scheduling_gates
            .unwrap_or_default()
            .iter()
            .any(|g| g.name == berth::names::AVOID_GATE);
        (!gated).then_some(())
    })
    .await;
    let masters = (0..3)
        .map(|i| test_pod(&format!("master-{i}"), json!({"app": app}), json!({})))
        .collect();
    create_at_once(&client, &team, masters).await;

    let nodes = placed(&client, &team, &format!("app={app}"), 3, WAIT).await;
    assert_eq!(
        nodes.values().collect::<BTreeSet<_>>().len(),
        3,
        "two masters share a node: {nodes:?}"
    );
    let stuck = tenant_pods.get("stuck").await.unwrap();
    let stuck_node = stuck.spec.as_ref().and_then(|s| s.node_name.clone());
    assert!(
        stuck_node.is_none(),
        "the stuck pod was bound to {stuck_node:?}"
    );
    let events: Api<Event> = Api::namespaced(client.clone(), &tenant_ns);
    let note = eventually("berth's SetAsideUnplaceable Event", WAIT, || async {
        let list = events
            .list(&ListParams::default().fields("reason=SetAsideUnplaceable"))
            .await
            .ok()?;
        list.items
            .into_iter()
            .find(|e| e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some("stuck"))
            .and_then(|e| e.note)
    })
    .await;
    assert!(note.contains("no longer holds"), "{note}");
}

#[tokio::test]
async fn a_tenants_pod_for_a_scheduler_nobody_runs_stops_holding_the_others() {
    a_tenants_stuck_pod_holds_another_teams_masters_only_for_the_wait(
        "nobody",
        json!({"schedulerName": "nobody-runs-this"}),
    )
    .await;
}

#[tokio::test]
async fn a_tenants_bare_pod_that_fits_no_node_stops_holding_the_others() {
    a_tenants_stuck_pod_holds_another_teams_masters_only_for_the_wait(
        "nowhere",
        json!({"nodeSelector": {"no-such-label": "x"},
            "containers": [{"name": "c", "image": "redis:7",
                "ports": [{"containerPort": 8080, "hostPort": 8080}]}]}),
    )
    .await;
}
