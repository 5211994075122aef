#![cfg(feature = "e2e")]
//! Exclusion on disjoint sets of nodes, read from the cluster's own record: pods
//! that avoid each other are released together, each confined (in its own spec)
//! to nodes no other pod in flight may take, and a new controller that takes over
//! reads those sets back from the pods and keeps clear of them. Its own cluster:
//! the webhook runs alone (`--no-controller`), kube-scheduler is stopped while the
//! sets are handed out, and the test starts, kills and replaces the controller.
//! Pods with only soft inter-pod terms (preferred anti-affinity, `ScheduleAnyway`
//! spread) are predicted like any other and fly together too.

mod support;

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, ListParams};
use serde_json::json;
use support::{
    Berth, Nodes, Replica, create_at_once, eventually, lease_holder, opted_in, placed, test_pod,
};

const NODES: Nodes = Nodes {
    count: 12,
    prefix: "node",
};
const WAIT: Duration = Duration::from_secs(120);

/// Each pod's `kubernetes.io/hostname In` values (its set), for the pods released
/// and not bound yet; and the names of the pods still gated.
async fn sets(pods: &Api<Pod>) -> (BTreeMap<String, BTreeSet<String>>, BTreeSet<String>) {
    let mut sets = BTreeMap::new();
    let mut gated = BTreeSet::new();
    for pod in pods.list(&ListParams::default()).await.unwrap() {
        let name = pod.metadata.name.clone().unwrap();
        let spec = pod.spec.unwrap();
        if spec.scheduling_gates.is_some_and(|g| !g.is_empty()) {
            gated.insert(name);
            continue;
        }
        let terms = spec
            .affinity
            .and_then(|a| a.node_affinity)
            .and_then(|n| n.required_during_scheduling_ignored_during_execution)
            .map(|r| r.node_selector_terms)
            .unwrap_or_default();
        let hosts: BTreeSet<String> = terms
            .iter()
            .flat_map(|t| t.match_expressions.iter().flatten())
            .filter(|e| e.key == "kubernetes.io/hostname" && e.operator == "In")
            .flat_map(|e| e.values.clone().unwrap_or_default())
            .collect();
        sets.insert(name, hosts);
    }
    (sets, gated)
}

fn assert_disjoint(sets: &BTreeMap<String, BTreeSet<String>>) {
    let all: Vec<_> = sets.iter().collect();
    for (i, (a, hosts)) in all.iter().enumerate() {
        assert!(!hosts.is_empty(), "{a} was released without a set");
        for (b, other) in &all[i + 1..] {
            assert!(
                hosts.is_disjoint(other),
                "{a} and {b} may share a node: {sets:?}"
            );
        }
    }
}

#[tokio::test]
async fn pods_that_avoid_each_other_fly_together_on_disjoint_sets_across_a_leader_change() {
    let berth = Berth::shared_with(NODES, &[], &["--no-controller"]);
    let client = berth.cluster.client().await;
    let dir = berth.cluster.dir.to_string_lossy().into_owned();
    berth
        .cluster
        .apply_app_policy("apart", json!({"avoid": {"matchLabels": {"app": "apart"}}}));
    let ns = opted_in(&client, "apart", "apart", json!({"app": "apart"}), WAIT).await;
    // No controller yet: the webhook holds all eight, so the first controller finds
    // them together. No scheduler: what it hands out stays visible.
    support::cluster_script("component", &[&dir, "stop", "kube-scheduler"]);
    let pods = (0..8)
        .map(|i| test_pod(&format!("apart-{i}"), json!({"app": "apart"}), json!({})))
        .collect();
    create_at_once(&client, &ns, pods).await;
    let account = berth.cluster.berth_service_account_kubeconfig();
    let first = Replica::start(berth, "first", &account);

    // Twelve nodes, eight pods: sets of at least two nodes, so six go at once and
    // the last two find every node taken by a pod in flight.
    let api: Api<Pod> = Api::namespaced(client.clone(), &ns);
    let (in_flight, gated) = eventually("six released on sets", WAIT, || async {
        let (sets, gated) = sets(&api).await;
        (sets.len() == 6).then_some((sets, gated))
    })
    .await;
    assert_disjoint(&in_flight);
    assert_eq!(gated.len(), 2, "{gated:?}");

    // The controller crashes; the next one knows the sets only from the pods.
    first.signal("-KILL");
    let second = Replica::start(berth, "second", &account);
    eventually("the second controller leads", WAIT, || async {
        (lease_holder(&client).await.as_deref() == Some("second")).then_some(())
    })
    .await;
    support::cluster_script("add-nodes", &[&dir, "4", "--prefix", "extra"]);
    let (all, _) = eventually("the last two released", WAIT, || async {
        let (sets, gated) = sets(&api).await;
        gated.is_empty().then_some((sets, gated))
    })
    .await;
    assert_disjoint(&all);
    for pod in &gated {
        assert!(
            all[pod].iter().all(|h| h.starts_with("extra")),
            "only the new nodes are free of the sets in flight: {all:?}"
        );
    }

    // The scheduler comes back: each lands inside its set, no two on one node.
    support::cluster_script("component", &[&dir, "start", "kube-scheduler"]);
    let nodes = placed(&client, &ns, "app=apart", 8, WAIT).await;
    assert_eq!(
        nodes.values().collect::<BTreeSet<_>>().len(),
        8,
        "{nodes:?}"
    );
    for (pod, node) in &nodes {
        assert!(all[pod].contains(node), "{pod} on {node}, outside {all:?}");
    }

    // What a chart renders by default, a preferred anti-affinity, only scores
    // nodes: such pods are predicted like any other and fly together (the
    // scheduler is stopped, so one that went alone would hold the other back),
    // rather than one at a time behind each other's binding.
    support::cluster_script("component", &[&dir, "stop", "kube-scheduler"]);
    let soft = json!({"affinity": {"podAntiAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [
        {"weight": 100, "podAffinityTerm": {"topologyKey": "kubernetes.io/hostname",
            "labelSelector": {"matchLabels": {"app": "apart"}}}}]}},
        "topologySpreadConstraints": [{"maxSkew": 1, "topologyKey": "kubernetes.io/hostname",
            "whenUnsatisfiable": "ScheduleAnyway", "labelSelector": {"matchLabels": {"app": "apart"}}}]});
    let pods = (0..2)
        .map(|i| test_pod(&format!("soft-{i}"), json!({"app": "apart"}), soft.clone()))
        .collect();
    create_at_once(&client, &ns, pods).await;
    let (soft_sets, _) = eventually("both soft pods released together", WAIT, || async {
        let (sets, gated) = sets(&api).await;
        let soft: BTreeMap<_, _> = sets
            .into_iter()
            .filter(|(n, _)| n.starts_with("soft-"))
            .collect();
        (soft.len() == 2).then_some((soft, gated))
    })
    .await;
    assert_disjoint(&soft_sets);
    for hosts in soft_sets.values() {
        assert!(
            hosts.iter().all(|h| !nodes.values().any(|n| n == h)),
            "a set includes a node where a pod it avoids runs: {soft_sets:?}"
        );
    }
    support::cluster_script("component", &[&dir, "start", "kube-scheduler"]);
    drop(second);
}
