#![cfg(feature = "e2e")]
//! Smoke tests of the real control plane that every other end-to-end test stands
//! on: the scheduler binds pods to fake nodes, the controller-manager runs the
//! workload controllers, and fake nodes stay Ready without a kubelet.

mod support;

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use k8s_openapi::api::apps::v1::{DaemonSet, Deployment};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::Client;
use kube::api::{Api, ListParams, PostParams};
use serde_json::json;
use support::fixtures::{self, PodFixture};
use support::{Nodes, TestCluster, eventually, fresh_namespace, is_bound, wait_for};

const NODES: Nodes = Nodes {
    count: 4,
    prefix: "node",
};

/// The fake nodes' Lease duration here: short, so that the node-lifecycle
/// controller's grace period (the duration + 10 s) passes within the test.
const LEASE_SECONDS: i64 = 8;

fn cluster() -> &'static TestCluster {
    TestCluster::shared_with(NODES, &["--node-lease-seconds", &LEASE_SECONDS.to_string()])
}

/// A small nginx pod named and labelled `app: <app>`.
fn app_pod(app: &str) -> PodFixture {
    fixtures::pod(app)
        .container("app", "nginx:1.27")
        .cpu("100m")
        .memory("64Mi")
        .labels(json!({"app": app}))
}

/// Pods in `ns` whose label `app` is `app`, keyed by name, with their node.
async fn bound_pods(client: &Client, ns: &str, app: &str) -> BTreeMap<String, Option<String>> {
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    pods.list(&ListParams::default().labels(&format!("app={app}")))
        .await
        .expect("list pods")
        .items
        .into_iter()
        .map(|p| {
            let node = p.spec.and_then(|s| s.node_name);
            (p.metadata.name.unwrap_or_default(), node)
        })
        .collect()
}

#[tokio::test]
async fn a_pod_is_bound_by_the_real_scheduler_within_seconds() {
    let client = cluster().client().await;
    let ns = fresh_namespace(&client, "smoke-pod").await;
    let pods: Api<Pod> = Api::namespaced(client, &ns);
    let pod = app_pod("one").build();

    let started = Instant::now();
    pods.create(&PostParams::default(), &pod)
        .await
        .expect("create pod");
    let bound = wait_for(&pods, "one", is_bound, Duration::from_secs(20))
        .await
        .expect("pod exists");

    let node = bound.spec.unwrap().node_name.unwrap();
    assert!(
        cluster().node_names().contains(&node),
        "bound to unknown node {node}"
    );
    eprintln!("pod bound to {node} in {:?}", started.elapsed());
}

#[tokio::test]
async fn a_deployments_pods_are_created_by_the_controller_manager_and_bound() {
    let client = cluster().client().await;
    let ns = fresh_namespace(&client, "smoke-deploy").await;
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), &ns);
    let deployment: Deployment = serde_json::from_value(json!({
        "metadata": {"name": "web"},
        "spec": {"replicas": 6, "selector": {"matchLabels": {"app": "web"}},
                 "template": app_pod("web").template()}
    }))
    .unwrap();
    deployments
        .create(&PostParams::default(), &deployment)
        .await
        .expect("create deployment");

    let placed = eventually("6 bound web pods", Duration::from_secs(60), || async {
        let pods = bound_pods(&client, &ns, "web").await;
        (pods.len() == 6 && pods.values().all(Option::is_some)).then_some(pods)
    })
    .await;
    let nodes: BTreeSet<_> = placed.values().flatten().collect();
    // The default scheduler spreads replicas of one owner over nodes.
    assert!(nodes.len() > 1, "all replicas on one node: {placed:?}");
}

#[tokio::test]
async fn a_daemonset_gets_one_pod_per_node() {
    let client = cluster().client().await;
    let ns = fresh_namespace(&client, "smoke-ds").await;
    let daemonsets: Api<DaemonSet> = Api::namespaced(client.clone(), &ns);
    let daemonset: DaemonSet = serde_json::from_value(json!({
        "metadata": {"name": "agent"},
        "spec": {"selector": {"matchLabels": {"app": "agent"}},
                 "template": app_pod("agent").template()}
    }))
    .unwrap();
    daemonsets
        .create(&PostParams::default(), &daemonset)
        .await
        .expect("create daemonset");

    // As many agent pods as nodes, bound to every node: one on each.
    let want: BTreeSet<String> = cluster().node_names().into_iter().collect();
    eventually(
        "one agent pod per node",
        Duration::from_secs(60),
        || async {
            let pods = bound_pods(&client, &ns, "agent").await;
            let nodes: BTreeSet<String> = pods.values().flatten().cloned().collect();
            (pods.len() == want.len() && nodes == want).then_some(())
        },
    )
    .await;
}

#[tokio::test]
async fn fake_nodes_stay_ready_and_schedulable_past_the_grace_period() {
    let client = cluster().client().await;
    // The node-lifecycle controller calls a node silent when its Lease goes
    // unrenewed for the grace period, and taints it. Wait, by the Leases' own
    // record, until every node has been renewed a whole grace period after the
    // newest renewal seen now: only kwok renewing them keeps them Ready.
    let grace = LEASE_SECONDS + 10;
    let leases: Api<Lease> = Api::namespaced(client.clone(), "kube-node-lease");
    let renewed = || async {
        let list = leases.list(&ListParams::default()).await.ok()?;
        let times: Vec<_> = list
            .items
            .into_iter()
            .filter(|l| {
                cluster()
                    .node_names()
                    .contains(&l.metadata.name.clone().unwrap_or_default())
            })
            .filter_map(|l| Some(l.spec?.renew_time?.0))
            .collect();
        (times.len() == NODES.count as usize).then_some(times)
    };
    let start = eventually("every node's Lease", Duration::from_secs(60), renewed)
        .await
        .into_iter()
        .max()
        .unwrap();
    eventually(
        "a grace period of renewals",
        Duration::from_secs(90),
        || async {
            let times = renewed().await?;
            times
                .iter()
                .all(|t| t.duration_since(start).as_secs() > grace)
                .then_some(())
        },
    )
    .await;

    let nodes: Api<Node> = Api::all(client.clone());
    for name in cluster().node_names() {
        let node = nodes.get(&name).await.expect("node exists");
        let spec = node.spec.unwrap_or_default();
        assert_ne!(
            spec.unschedulable,
            Some(true),
            "{name} became unschedulable"
        );
        let taints = spec.taints.unwrap_or_default();
        assert!(taints.is_empty(), "{name} gained taints: {taints:?}");
        let ready = node
            .status
            .and_then(|s| s.conditions)
            .unwrap_or_default()
            .into_iter()
            .find(|c| c.type_ == "Ready")
            .map(|c| c.status);
        assert_eq!(ready.as_deref(), Some("True"), "{name} is not Ready");
    }

    let ns = fresh_namespace(&client, "smoke-later").await;
    let pods: Api<Pod> = Api::namespaced(client, &ns);
    let pod = app_pod("late").build();
    pods.create(&PostParams::default(), &pod)
        .await
        .expect("create pod");
    wait_for(&pods, "late", is_bound, Duration::from_secs(20)).await;
}
