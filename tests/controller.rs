#![cfg(feature = "e2e")]
//! The node controller against the real apiserver: drift repair, taints of other
//! owners kept while berth writes its own, cleanup when a policy is deleted, pods
//! on a dedicated node without entitlement reported, or evicted by NoExecute, and
//! a node that labels itself (as its kubelet, through NodeRestriction) refused by a
//! pool unless the policy trusts such labels. Each test has a node of its own.

mod support;

use std::time::Duration;

use berth::names;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::Client;
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use serde_json::{Value, json};
use support::fixtures::{self, policy};
use support::{Berth, Nodes, eventually, fresh_namespace, is_bound, wait_for};

const NODES: Nodes = Nodes {
    count: 6,
    prefix: "node",
};
const WAIT: Duration = Duration::from_secs(60);

fn berth() -> &'static Berth {
    Berth::shared(NODES)
}

/// Applies the policy `name` whose pool is `node`, tainted with `effect`, for the
/// images named like it.
fn apply_pool_policy(name: &str, node: &str, effect: &str) {
    berth().cluster.apply_policies(&[policy(
        name,
        json!({"images": [format!("*{name}*")], "pool": {"nodeNames": [node], "effect": effect}}),
    )]);
}

/// The node's taints as `key=value:effect`.
fn taints(node: &Node) -> Vec<String> {
    node.spec
        .as_ref()
        .and_then(|s| s.taints.clone())
        .unwrap_or_default()
        .into_iter()
        .map(|t| format!("{}={}:{}", t.key, t.value.unwrap_or_default(), t.effect))
        .collect()
}

async fn wait_node(client: &Client, name: &str, what: &str, check: impl Fn(&Node) -> bool) -> Node {
    let nodes: Api<Node> = Api::all(client.clone());
    eventually(&format!("{name}: {what}"), WAIT, || async {
        let node = nodes.get(name).await.ok()?;
        check(&node).then_some(node)
    })
    .await
}

/// `kubectl apply` of `policies` as an administrator, which must succeed; the
/// warnings kubectl printed (berth's `/validate` among them).
fn apply_warned(policies: &[berth::policy::PlacementPolicy]) -> String {
    let list = json!({"apiVersion": "v1", "kind": "List", "items": policies});
    let dir = &berth().cluster.dir;
    let out = support::kubectl_with_input(dir, &["apply", "-f", "-"], &list.to_string());
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(out.status.success(), "{stderr}");
    stderr
}

/// The node `node` patching its own labels as its kubelet would.
async fn label_as_node(node: &str, labels: Value) -> Result<Node, kube::Error> {
    let as_node: Api<Node> = Api::all(berth().cluster.node_client(node).await);
    let patch = json!({"metadata": {"labels": labels}});
    as_node
        .patch(node, &PatchParams::default(), &Patch::Merge(&patch))
        .await
}

/// The policy's condition `type_`, as the cluster stores it.
fn policy_condition(policy: &str, type_: &str) -> Option<Value> {
    let out = berth()
        .cluster
        .kubectl(&["get", "bpp", policy, "-o", "json"]);
    let policy: Value = serde_json::from_slice(&out.stdout).ok()?;
    policy["status"]["conditions"]
        .as_array()?
        .iter()
        .find(|c| c["type"] == type_)
        .cloned()
}

/// The policy's `status.nodeNames`.
fn status_nodes(policy: &str) -> Vec<String> {
    let out =
        berth()
            .cluster
            .kubectl_ok(&["get", "bpp", policy, "-o", "jsonpath={.status.nodeNames}"]);
    serde_json::from_str(&out).unwrap_or_default()
}

fn pool_label(node: &Node) -> Option<&str> {
    node.metadata
        .labels
        .as_ref()?
        .get(names::POOL_LABEL)
        .map(String::as_str)
}

#[tokio::test]
async fn a_berth_label_removed_by_hand_comes_back() {
    let client = berth().cluster.client().await;
    apply_pool_policy("drift", "node1", "NoSchedule");
    wait_node(&client, "node1", "pool label", |n| {
        pool_label(n) == Some("drift")
    })
    .await;
    let out =
        berth()
            .cluster
            .kubectl(&["label", "node", "node1", &format!("{}-", names::POOL_LABEL)]);
    assert!(out.status.success());
    let out =
        berth()
            .cluster
            .kubectl(&["taint", "node", "node1", &format!("{}-", names::POOL_TAINT)]);
    assert!(out.status.success());
    wait_node(&client, "node1", "label and taint back", |n| {
        pool_label(n) == Some("drift")
            && taints(n).contains(&format!("{}=drift:NoSchedule", names::POOL_TAINT))
    })
    .await;
}

#[tokio::test]
async fn taints_of_other_owners_survive_berths_writes() {
    let client = berth().cluster.client().await;
    let nodes: Api<Node> = Api::all(client.clone());
    // berth rewrites node2's taint on every effect change while another owner adds
    // taints at the same moments: the resourceVersion precondition turns every
    // race into a retry, never into a lost taint.
    for i in 0..8 {
        let effect = if i % 2 == 0 {
            "NoSchedule"
        } else {
            "NoExecute"
        };
        apply_pool_policy("flip", "node2", effect);
        let node = nodes.get("node2").await.unwrap();
        let mut list: Vec<Value> = node
            .spec
            .and_then(|s| s.taints)
            .unwrap_or_default()
            .into_iter()
            .map(|t| serde_json::to_value(t).unwrap())
            .collect();
        list.push(json!({"key": format!("example.com/other-{i}"), "effect": "PreferNoSchedule"}));
        let patch = json!({"metadata": {"resourceVersion": node.metadata.resource_version}, "spec": {"taints": list}});
        // Our own write may lose the race too; then read again and retry, as any
        // well-behaved owner of an atomic list must.
        if nodes
            .patch("node2", &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .is_err()
        {
            let node = nodes.get("node2").await.unwrap();
            let mut list: Vec<Value> = taints_json(&node);
            list.push(
                json!({"key": format!("example.com/other-{i}"), "effect": "PreferNoSchedule"}),
            );
            let patch = json!({"metadata": {"resourceVersion": node.metadata.resource_version}, "spec": {"taints": list}});
            nodes
                .patch("node2", &PatchParams::default(), &Patch::Merge(&patch))
                .await
                .expect("second try");
        }
    }
    let node = wait_node(&client, "node2", "final berth taint", |n| {
        taints(n).contains(&format!("{}=flip:NoExecute", names::POOL_TAINT))
    })
    .await;
    let all = taints(&node);
    for i in 0..8 {
        assert!(
            all.contains(&format!("example.com/other-{i}=:PreferNoSchedule")),
            "lost other-{i}: {all:?}"
        );
    }
    assert_eq!(
        all.iter()
            .filter(|t| t.starts_with(names::POOL_TAINT))
            .count(),
        1,
        "{all:?}"
    );
}

fn taints_json(node: &Node) -> Vec<Value> {
    node.spec
        .as_ref()
        .and_then(|s| s.taints.clone())
        .unwrap_or_default()
        .into_iter()
        .map(|t| serde_json::to_value(t).unwrap())
        .collect()
}

#[tokio::test]
async fn deleting_a_policy_cleans_its_nodes() {
    let client = berth().cluster.client().await;
    apply_pool_policy("gone", "node3", "NoSchedule");
    wait_node(&client, "node3", "pool label", |n| {
        pool_label(n) == Some("gone")
    })
    .await;
    let out = berth()
        .cluster
        .kubectl(&["delete", "placementpolicy", "gone", "--timeout=60s"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let node = wait_node(&client, "node3", "clean", |n| pool_label(n).is_none()).await;
    assert!(
        taints(&node)
            .iter()
            .all(|t| !t.starts_with(names::POOL_TAINT)),
        "{:?}",
        taints(&node)
    );
}

#[tokio::test]
async fn a_pod_on_a_pool_node_without_entitlement_is_reported_and_noexecute_evicts_it() {
    let client = berth().cluster.client().await;
    let ns = fresh_namespace(&client, "stray").await;
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
    // Placed on node4 before any pool exists there, as if the webhook had been down.
    let stray = fixtures::pod("stray")
        .image("nginx")
        .spec(json!({"nodeSelector": {"kubernetes.io/hostname": "node4"}}))
        .build();
    pods.create(&PostParams::default(), &stray).await.unwrap();
    wait_for(&pods, "stray", is_bound, WAIT).await;

    apply_pool_policy("strict", "node4", "NoSchedule");
    let condition = eventually("UnentitledPods condition", WAIT, || async {
        let out = berth()
            .cluster
            .kubectl(&["get", "bpp", "strict", "-o", "json"]);
        let policy: Value = serde_json::from_slice(&out.stdout).ok()?;
        policy["status"]["conditions"]
            .as_array()?
            .iter()
            .find(|c| c["type"] == "UnentitledPods" && c["status"] == "True")
            .cloned()
    })
    .await;
    assert!(
        condition["message"]
            .as_str()
            .unwrap()
            .contains(&format!("{ns}/stray")),
        "{condition}"
    );
    let metric = "berth_unentitled_pods{policy=\"strict\"} 1";
    eventually("the unentitled-pods metric", WAIT, || async {
        berth().metrics().contains(metric).then_some(())
    })
    .await;
    // The policy's Event names this test's own pod (the policy is cluster-wide, so
    // its Events are read by what they say, not where they are).
    let expected = format!("pod {ns}/stray runs on pool strict without entitlement");
    eventually(
        "an UnentitledPod event naming the stray pod",
        WAIT,
        || async {
            let out = berth().cluster.kubectl(&[
                "get",
                "events",
                "-A",
                "--field-selector",
                "reason=UnentitledPod",
                "-o",
                "jsonpath={.items[*].message}",
            ]);
            String::from_utf8_lossy(&out.stdout)
                .contains(&expected)
                .then_some(())
        },
    )
    .await;

    // With NoExecute, the apiserver's taint-eviction controller removes it.
    apply_pool_policy("strict", "node4", "NoExecute");
    eventually("the stray pod evicted", WAIT, || async {
        let list = pods.list(&ListParams::default()).await.ok()?;
        list.items
            .iter()
            .all(|p| {
                p.metadata.name.as_deref() != Some("stray")
                    || p.metadata.deletion_timestamp.is_some()
            })
            .then_some(())
    })
    .await;
}

/// A label a node may set on its own Node (NodeRestriction leaves it open).
const SELF_SET_LABEL: &str = "gpu.example.com/model";
/// A label only an administrator sets on a node.
const RESTRICTED_LABEL: &str = "node-restriction.kubernetes.io/gpu-model";

#[tokio::test]
async fn a_node_that_labels_itself_to_match_a_pool_is_not_taken_in() {
    let client = berth().cluster.client().await;
    let warnings = apply_warned(&[
        policy(
            "selfset",
            json!({"images": ["*selfset*"],
                "pool": {"nodeSelector": {"matchLabels": {SELF_SET_LABEL: "a100"}}}}),
        ),
        policy(
            "restricted",
            json!({"images": ["*restricted*"],
                "pool": {"nodeSelector": {"matchLabels": {RESTRICTED_LABEL: "a100"}}}}),
        ),
    ]);

    // As node5's kubelet: NodeRestriction refuses it berth's prefix, not the other.
    let refused = label_as_node("node5", json!({RESTRICTED_LABEL: "a100"}))
        .await
        .expect_err("a node may not set a node-restriction.kubernetes.io/ label");
    assert!(
        matches!(&refused, kube::Error::Api(e) if e.code == 403),
        "{refused}"
    );
    label_as_node("node5", json!({SELF_SET_LABEL: "a100"}))
        .await
        .expect("a node may set a label outside kubernetes.io on itself");

    // Once the controller has judged node5 for the pool (it counts it, or it
    // names it refused), node5 must not be a member.
    let counted = eventually(
        "the controller's word on node5 for selfset",
        WAIT,
        || async {
            if status_nodes("selfset").iter().any(|n| n == "node5") {
                return Some(true);
            }
            let condition = policy_condition("selfset", "SelfSetLabels")?;
            condition["message"]
                .as_str()?
                .contains("node5")
                .then_some(false)
        },
    )
    .await;
    assert!(!counted, "node5 made itself a member of pool selfset");
    let nodes: Api<Node> = Api::all(client.clone());
    let node = nodes.get("node5").await.unwrap();
    assert_eq!(pool_label(&node), None);
    assert!(
        taints(&node)
            .iter()
            .all(|t| !t.starts_with(names::POOL_TAINT)),
        "{:?}",
        taints(&node)
    );
    let condition = policy_condition("selfset", "SelfSetLabels").unwrap();
    assert_eq!(
        (&condition["status"], &condition["reason"]),
        (&json!("True"), &json!("NotTrusted")),
        "{condition}"
    );
    assert!(
        condition["message"]
            .as_str()
            .unwrap()
            .contains(&format!("({SELF_SET_LABEL})")),
        "{condition}"
    );
    // /validate said so when the policy was written, and not of the other one.
    assert!(
        warnings.contains(&format!(
            "pool.nodeSelector: no new node joins by labels nodes set themselves \
             (pool.trustSelfSetLabels): {SELF_SET_LABEL}"
        )),
        "{warnings}"
    );
    assert!(!warnings.contains(RESTRICTED_LABEL), "{warnings}");
    // A Warning Event names the node refused.
    let expected =
        "node node5 matches this pool's nodeSelector only by labels it can set on itself";
    eventually("a SelfSetLabels Event naming node5", WAIT, || async {
        let out = berth().cluster.kubectl(&[
            "get",
            "events",
            "-A",
            "--field-selector",
            "reason=SelfSetLabels",
            "-o",
            "jsonpath={.items[*].message}",
        ]);
        String::from_utf8_lossy(&out.stdout)
            .contains(expected)
            .then_some(())
    })
    .await;

    // The label an administrator sets takes node5 into the pool that reads it.
    berth().cluster.kubectl_ok(&[
        "label",
        "node",
        "node5",
        &format!("{RESTRICTED_LABEL}=a100"),
    ]);
    berth()
        .cluster
        .wait_for_pool("restricted", &["node5"], WAIT);
    let condition = policy_condition("restricted", "SelfSetLabels").unwrap();
    assert_eq!(
        (&condition["status"], &condition["reason"]),
        (&json!("False"), &json!("NodeRestricted")),
        "{condition}"
    );
}

#[tokio::test]
async fn a_pool_that_trusts_self_set_labels_takes_a_node_that_labels_itself() {
    let warnings = apply_warned(&[policy(
        "trusting",
        json!({"images": ["*trusting*"], "pool": {"trustSelfSetLabels": true,
            "nodeSelector": {"matchLabels": {"gpu.example.com/trusted": "yes"}}}}),
    )]);
    assert!(
        warnings.contains(
            "pool.trustSelfSetLabels: a node can join this pool by setting on itself \
             gpu.example.com/trusted"
        ),
        "{warnings}"
    );
    label_as_node("node6", json!({"gpu.example.com/trusted": "yes"}))
        .await
        .expect("a node may set a label outside kubernetes.io on itself");
    berth().cluster.wait_for_pool("trusting", &["node6"], WAIT);
    let condition = policy_condition("trusting", "SelfSetLabels").unwrap();
    assert_eq!(
        (&condition["status"], &condition["reason"]),
        (&json!("True"), &json!("Trusted")),
        "{condition}"
    );
}
