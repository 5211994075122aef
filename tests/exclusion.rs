#![cfg(feature = "e2e")]
//! Exclusion that holds when pods are created together (seeds 001, 002): 30
//! redis-master pods created at once on 40 nodes land on 30 distinct nodes, round
//! after round; masters and replicas never share a node; a surplus waits and is
//! placed when nodes are added. The same 30 pods with native podAntiAffinity are
//! timed for comparison (the numbers are printed, not asserted).

mod support;

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use berth::names;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::Client;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams};
use serde_json::{Value, json};
use support::fixtures::policy;
use support::{
    Berth, Nodes, create_at_once, eventually, fresh_namespace, opted_in, placed, test_pod,
};

const NODES: Nodes = Nodes {
    count: 40,
    prefix: "node",
};
const WAIT: Duration = Duration::from_secs(180);

fn berth() -> &'static Berth {
    Berth::shared(NODES)
}

/// Force-deletes the pods in `ns` (no kubelet will confirm a graceful deletion)
/// and waits until no node carries the anchor label of `policy` any more.
async fn clear(client: &Client, ns: &str, policy: &str) {
    let api: Api<Pod> = Api::namespaced(client.clone(), ns);
    let params = DeleteParams {
        grace_period_seconds: Some(0),
        ..Default::default()
    };
    api.delete_collection(&params, &ListParams::default())
        .await
        .unwrap();
    let nodes: Api<Node> = Api::all(client.clone());
    let key = names::anchor_label(policy);
    eventually("anchor labels cleared", WAIT, || async {
        let list = nodes.list(&ListParams::default().labels(&key)).await.ok()?;
        list.items.is_empty().then_some(())
    })
    .await;
}

fn masters(count: usize, prefix: &str) -> Vec<Pod> {
    (0..count)
        .map(|i| {
            test_pod(
                &format!("{prefix}-{i}"),
                json!({"app": "redis-master"}),
                json!({}),
            )
        })
        .collect()
}

#[tokio::test]
async fn thirty_masters_created_at_once_land_on_thirty_nodes_every_round() {
    let client = berth().cluster.client().await;
    let policy = support::repo_root().join("policies/redis-master.yaml");
    berth()
        .cluster
        .kubectl_ok(&["apply", "-f", policy.to_str().unwrap()]);
    let mut timings = Vec::new();
    for round in 0..3 {
        let ns = opted_in(
            &client,
            &format!("masters-{round}"),
            "redis-master",
            json!({"app": "redis-master"}),
            WAIT,
        )
        .await;
        let started = Instant::now();
        create_at_once(&client, &ns, masters(30, "master")).await;
        let nodes = placed(&client, &ns, "app=redis-master", 30, WAIT).await;
        timings.push(started.elapsed());
        let distinct: BTreeSet<&String> = nodes.values().collect();
        if distinct.len() != 30 {
            let out = berth()
                .cluster
                .kubectl(&["get", "pods", "-n", &ns, "-o", "json"]);
            let list: Value = serde_json::from_slice(&out.stdout).unwrap();
            for p in list["items"].as_array().unwrap() {
                let terms = &p["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"];
                eprintln!(
                    "{} {} applied={} fields={}",
                    p["metadata"]["name"],
                    p["spec"]["nodeName"],
                    p["metadata"]["annotations"][names::APPLIED_ANNOTATION],
                    terms["nodeSelectorTerms"][0]["matchFields"]
                );
            }
            eprintln!("berth's log:\n{}", berth().log());
        }
        assert_eq!(
            distinct.len(),
            30,
            "round {round}: two masters share a node: {nodes:?}"
        );
        clear(&client, &ns, "redis-master").await;
    }
    eprintln!("berth exclusion: 30 gated pods placed in {timings:?}");

    // The same pods with native inter-pod anti-affinity, in a namespace berth does
    // not touch, for comparison.
    let ns = fresh_namespace(&client, "native").await;
    let anti = json!({"affinity": {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
        {"topologyKey": "kubernetes.io/hostname", "labelSelector": {"matchLabels": {"app": "native-master"}}}]}}});
    let pods = (0..30)
        .map(|i| {
            test_pod(
                &format!("native-{i}"),
                json!({"app": "native-master"}),
                anti.clone(),
            )
        })
        .collect();
    let started = Instant::now();
    create_at_once(&client, &ns, pods).await;
    let nodes = placed(&client, &ns, "app=native-master", 30, WAIT).await;
    let native = started.elapsed();
    assert_eq!(nodes.values().collect::<BTreeSet<_>>().len(), 30);
    eprintln!("native podAntiAffinity: 30 pods placed in {native:?}");
}

#[tokio::test]
async fn masters_and_replicas_that_avoid_each_other_never_share_a_node() {
    let client = berth().cluster.client().await;
    let pair = |role: &str, avoid: &str| {
        json!({"podSelector": {"matchLabels": {"role": role}},
            "avoid": {"matchLabels": {"role": avoid}}})
    };
    berth().cluster.apply_policies(&[
        policy("shard-masters", pair("master", "replica")),
        policy("shard-replicas", pair("replica", "master")),
    ]);
    let ns = opted_in(
        &client,
        "pairs",
        "shard-masters, shard-replicas",
        json!({"role": "master"}),
        WAIT,
    )
    .await;
    let mut pods = Vec::new();
    for i in 0..8 {
        pods.push(test_pod(
            &format!("master-{i}"),
            json!({"role": "master", "shard": i.to_string()}),
            json!({}),
        ));
        pods.push(test_pod(
            &format!("replica-{i}"),
            json!({"role": "replica", "shard": i.to_string()}),
            json!({}),
        ));
    }
    create_at_once(&client, &ns, pods).await;
    let masters = placed(&client, &ns, "role=master", 8, WAIT).await;
    let replicas = placed(&client, &ns, "role=replica", 8, WAIT).await;
    let master_nodes: BTreeSet<&String> = masters.values().collect();
    for (replica, node) in &replicas {
        assert!(
            !master_nodes.contains(node),
            "{replica} shares {node} with a master"
        );
    }
}

#[tokio::test]
async fn a_surplus_waits_with_a_reason_and_is_placed_when_nodes_are_added() {
    let client = berth().cluster.client().await;
    // Only nodes labelled zone=small are eligible: three of them, five pods.
    let nodes: Api<Node> = Api::all(client.clone());
    let small = json!({"metadata": {"labels": {"zone": "small"}}});
    for node in ["node38", "node39", "node40"] {
        nodes
            .patch(node, &PatchParams::default(), &Patch::Merge(&small))
            .await
            .unwrap();
    }
    berth().cluster.apply_policies(&[policy(
        "small-zone",
        json!({"podSelector": {"matchLabels": {"app": "cache"}},
            "avoid": {"matchLabels": {"app": "cache"}},
            "nodeAffinity": {"required": [{"key": "zone", "operator": "In", "values": ["small"]}]}}),
    )]);
    let ns = opted_in(
        &client,
        "surplus",
        "small-zone",
        json!({"app": "cache"}),
        WAIT,
    )
    .await;
    let pods = (0..5)
        .map(|i| test_pod(&format!("cache-{i}"), json!({"app": "cache"}), json!({})))
        .collect();
    create_at_once(&client, &ns, pods).await;
    let first = placed(&client, &ns, "app=cache", 3, WAIT).await;
    assert_eq!(first.values().collect::<BTreeSet<_>>().len(), 3);

    // The other two wait held: every node where they fit runs a pod they must
    // avoid. Released, they would be narrowed off those nodes for good; berth says
    // why in an Event and in `berth explain pod`.
    let api: Api<Pod> = Api::namespaced(client.clone(), &ns);
    let held = eventually("two pods held", WAIT, || async {
        let list = api
            .list(&ListParams::default().labels("app=cache"))
            .await
            .ok()?;
        let unbound: Vec<Pod> = list
            .items
            .into_iter()
            .filter(|p| p.spec.as_ref().is_some_and(|s| s.node_name.is_none()))
            .collect();
        let gated = unbound.iter().all(|p| {
            p.spec
                .as_ref()
                .and_then(|s| s.scheduling_gates.as_ref())
                .is_some_and(|g| g.iter().any(|g| g.name == names::AVOID_GATE))
        });
        (unbound.len() == 2 && gated).then_some(unbound)
    })
    .await;
    let why = "every node where it fits runs a pod it must avoid (policy small-zone)";
    // Each was first held behind a pod in flight; its Event now says the new cause.
    for pod in &held {
        let name = pod.metadata.name.as_deref().unwrap();
        support::held_for_exclusion(&client, &ns, name, why).await;
    }

    let kubeconfig = berth().cluster.kubeconfig();
    let explain = |pod: &Pod| {
        let out = berth().run(&[
            "explain",
            "pod",
            &pod.metadata.name.clone().unwrap(),
            "-n",
            &ns,
            "--kubeconfig",
            kubeconfig.to_str().unwrap(),
        ]);
        assert!(out.status.success(), "{out:?}");
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let text = eventually("explain says why the pod is held", WAIT, || async {
        let text = explain(&held[0]);
        text.contains("Now: held").then_some(text)
    })
    .await;
    assert!(
        text.contains(&format!(
            "Now: held by the scheduling gate {}: {why}",
            names::AVOID_GATE
        )),
        "{text}"
    );
    assert!(
        text.contains("Policies that apply:\n  small-zone, because:"),
        "{text}"
    );
    let missing = berth().run(&[
        "explain",
        "pod",
        "nope",
        "-n",
        &ns,
        "--kubeconfig",
        kubeconfig.to_str().unwrap(),
    ]);
    assert_eq!(missing.status.code(), Some(2));
    assert!(
        String::from_utf8_lossy(&missing.stderr).contains(&format!("pod {ns}/nope not found")),
        "{missing:?}"
    );

    // Two nodes join the cluster: the held pods land there, one on each.
    let dir = berth().cluster.dir.to_string_lossy().into_owned();
    support::cluster_script("add-nodes", &[&dir, "2", "--prefix", "small"]);
    for node in ["small1", "small2"] {
        nodes
            .patch(node, &PatchParams::default(), &Patch::Merge(&small))
            .await
            .unwrap();
    }
    let all = placed(&client, &ns, "app=cache", 5, WAIT).await;
    assert_eq!(
        all.values().collect::<BTreeSet<_>>().len(),
        5,
        "two pods share a node: {all:?}"
    );
}
