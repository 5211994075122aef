//! All-or-nothing (seeds 002, 003) in gate mode, on the real control plane: the
//! members of a gang are held by `berth.io/gang` until `minAvailable` of them exist
//! and berth's fit check finds room for all; then every member goes at once. The
//! test cluster serves no PodGroup API, so berth holds and releases them itself.

mod support;

use std::collections::BTreeSet;
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use kube::Client;
use kube::api::{Api, ListParams};
use serde_json::{Value, json};
use support::{Berth, Nodes, create_at_once, eventually, opted_in, test_pod};

const NODES: Nodes = Nodes {
    count: 6,
    prefix: "gnode",
};
const WAIT: Duration = Duration::from_secs(120);

fn berth() -> &'static Berth {
    Berth::shared(NODES)
}

/// A PlacementPolicy `name` with `spec` for pods labelled `app: <name>`.
fn apply_policy(name: &str, spec: Value) {
    let mut spec = spec;
    spec["podSelector"] = json!({"matchLabels": {"app": name}});
    let policy = json!({"apiVersion": "berth.io/v1alpha1", "kind": "PlacementPolicy",
        "metadata": {"name": name}, "spec": spec});
    berth().cluster.apply(&policy.to_string());
}

/// Gang member `name` of `policy`'s group `group` of `size`, requesting `cpu`.
fn member(policy: &str, name: &str, group: &str, size: u32, cpu: &str) -> Pod {
    let mut pod = test_pod(
        name,
        json!({"app": policy, "podGroup": group, "minAvailable": size.to_string()}),
        json!({}),
    );
    let spec = pod.spec.as_mut().unwrap();
    spec.containers[0].resources =
        Some(serde_json::from_value(json!({"requests": {"cpu": cpu}})).unwrap());
    pod
}

fn gates(pod: &Pod) -> Vec<String> {
    pod.spec
        .as_ref()
        .and_then(|s| s.scheduling_gates.as_ref())
        .map(|g| g.iter().map(|g| g.name.clone()).collect())
        .unwrap_or_default()
}

fn node(pod: &Pod) -> Option<String> {
    pod.spec.as_ref()?.node_name.clone()
}

/// The messages of the Events with `reason` in `ns`, once there is one.
async fn events(ns: &str, reason: &str) -> String {
    eventually(&format!("a {reason} Event"), WAIT, || async {
        let out = berth().cluster.kubectl(&[
            "get",
            "events",
            "-n",
            ns,
            "--field-selector",
            &format!("reason={reason}"),
            "-o",
            "jsonpath={.items[*].message}",
        ]);
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        (!text.is_empty()).then_some(text)
    })
    .await
}

/// Waits until every pod in `ns` is bound; returns their nodes by name.
async fn all_bound(client: &Client, ns: &str, count: usize) -> Vec<(String, String)> {
    let api: Api<Pod> = Api::namespaced(client.clone(), ns);
    eventually("every member bound", WAIT, || async {
        let pods = api.list(&ListParams::default()).await.ok()?;
        let bound: Vec<(String, String)> = pods
            .items
            .iter()
            .filter_map(|p| Some((p.metadata.name.clone()?, node(p)?)))
            .collect();
        (bound.len() == count).then_some(bound)
    })
    .await
}

/// Every pod in `ns`: none is bound, each still held by the gang gate.
async fn none_bound(client: &Client, ns: &str) -> Vec<Pod> {
    let api: Api<Pod> = Api::namespaced(client.clone(), ns);
    let pods = api.list(&ListParams::default()).await.unwrap().items;
    for pod in &pods {
        assert_eq!(node(pod), None, "{:?} bound", pod.metadata.name);
        assert!(
            gates(pod).iter().any(|g| g == "berth.io/gang"),
            "{:?} released: {:?}",
            pod.metadata.name,
            gates(pod)
        );
    }
    pods
}

#[tokio::test]
async fn a_gang_waits_for_its_last_member_then_goes_at_once() {
    let client = berth().cluster.client().await;
    apply_policy("gang-count", json!({"gang": {}}));
    let probe = json!({"app": "gang-count"});
    let ns = opted_in(&client, "gang-count", "gang-count", probe, WAIT).await;
    let pods = vec![
        member("gang-count", "a", "g1", 3, "100m"),
        member("gang-count", "b", "g1", 3, "100m"),
    ];
    create_at_once(&client, &ns, pods).await;
    let note = events(&ns, "WaitingForGang").await;
    assert!(note.contains("gang g1 has 2 of its 3 members"), "{note}");
    // The controller looked at the group (its Event says so) and held both.
    assert_eq!(none_bound(&client, &ns).await.len(), 2);

    create_at_once(
        &client,
        &ns,
        vec![member("gang-count", "c", "g1", 3, "100m")],
    )
    .await;
    let bound = all_bound(&client, &ns, 3).await;
    assert_eq!(bound.len(), 3, "{bound:?}");
}

#[tokio::test]
async fn a_gang_that_does_not_fit_stays_held_until_a_node_is_added() {
    let client = berth().cluster.client().await;
    // A dedicated pool of two nodes, 8 cpus each: room for two 5-cpu members
    // (the other tests' small pods may take a little of it before the taint).
    let pool =
        |nodes: &[&str]| json!({"gang": {"timeoutSeconds": 3}, "pool": {"nodeNames": nodes}});
    apply_policy("gang-fit", pool(&["gnode1", "gnode2"]));
    let probe = json!({"app": "gang-fit"});
    let ns = opted_in(&client, "gang-fit", "gang-fit", probe, WAIT).await;
    let pods = ["a", "b", "c"]
        .iter()
        .map(|n| member("gang-fit", n, "big", 3, "5"))
        .collect();
    create_at_once(&client, &ns, pods).await;
    let note = events(&ns, "GangDoesNotFit").await;
    assert!(note.contains("gang big (3 held) does not fit"), "{note}");
    assert!(note.contains("cpu"), "{note}");
    none_bound(&client, &ns).await;
    // Past timeoutSeconds: a Warning, the policy's condition, and still held.
    let note = events(&ns, "GangTimeout").await;
    assert!(note.contains("members stay held"), "{note}");
    let condition = eventually("the GangTimeout condition", WAIT, || async {
        let out = berth().cluster.kubectl(&[
            "get",
            "bpp",
            "gang-fit",
            "-o",
            "jsonpath={.status.conditions[?(@.type==\"GangTimeout\")].status} {.status.gangMode}",
        ]);
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        text.starts_with("True").then_some(text)
    })
    .await;
    assert_eq!(
        condition, "True Gate",
        "this cluster serves no PodGroup API"
    );
    none_bound(&client, &ns).await;

    // A third node joins the pool: all three go, one per node.
    apply_policy("gang-fit", pool(&["gnode1", "gnode2", "gnode3"]));
    let bound = all_bound(&client, &ns, 3).await;
    let nodes: BTreeSet<&String> = bound.iter().map(|(_, n)| n).collect();
    assert_eq!(nodes.len(), 3, "5 cpus each: one per node; {bound:?}");
}

#[tokio::test]
async fn gang_members_that_avoid_each_other_go_together_on_distinct_nodes() {
    let client = berth().cluster.client().await;
    apply_policy(
        "gang-apart",
        json!({"gang": {}, "avoid": {"matchLabels": {"podGroup": "ring"}}}),
    );
    let probe = json!({"app": "gang-apart"});
    let ns = opted_in(&client, "gang-apart", "gang-apart", probe, WAIT).await;
    let pods: Vec<Pod> = ["a", "b", "c"]
        .iter()
        .map(|n| member("gang-apart", n, "ring", 3, "100m"))
        .collect();
    create_at_once(&client, &ns, pods).await;
    let bound = all_bound(&client, &ns, 3).await;
    let nodes: BTreeSet<&String> = bound.iter().map(|(_, n)| n).collect();
    assert_eq!(nodes.len(), 3, "{bound:?}");
}
