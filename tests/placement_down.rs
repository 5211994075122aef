#![cfg(feature = "e2e")]
//! Placement that holds with berth down, on the real control plane with berth
//! installed as shipped (the MutatingAdmissionPolicy `berth-placement` included,
//! by `tests/cluster/berth-up`):
//!
//! - every generated pod (images in and out of the globs, several terms with
//!   `matchFields`, an empty term, wildcard and forged tolerations, schedulers,
//!   pod anti-affinity, namespaces in and out) is admitted with berth up and
//!   again with every berth process killed, and the two pods the apiserver
//!   would store have the same placement, lists compared as sets;
//! - a pod a webhook-only policy applies to, or that brings a pool toleration it
//!   is not entitled to, is, with berth down, admitted as it was sent (what the
//!   contract says the policy leaves to the webhook);
//! - seed 000: with berth down, the CDN upload pods land on the CDN pool, and a
//!   pod of another image does not.

mod support;

use std::time::Duration;

use berth::names;
use k8s_openapi::api::core::v1::{Namespace, Pod};
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::{Client, ResourceExt};
use serde_json::{Value, json};
use support::fixtures::policy;
use support::{Berth, Nodes, eventually, fresh_namespace};

const NODES: Nodes = Nodes {
    count: 4,
    prefix: "node",
};
const WAIT: Duration = Duration::from_secs(60);

fn policies() -> Vec<berth::policy::PlacementPolicy> {
    vec![
        // Seed 000: CDN uploads on node2, nothing else there.
        policy(
            "cdn",
            json!({"images": ["*cdn*"], "pool": {"nodeNames": ["node2"]}}),
        ),
        policy(
            "train",
            json!({"podSelector": {"matchLabels": {"app": "train"}},
                "nodeAffinity": {"required": [{"key": "example.com/gpu", "operator": "In", "values": ["a100", "h100"]}],
                    "preferred": [{"weight": 40, "preference": {"key": "disk", "operator": "In", "values": ["ssd"]}}]}}),
        ),
        policy(
            "edge",
            json!({"images": ["registry.example.com/edge/*"],
                "pool": {"nodeNames": ["node3"], "placement": "Preferred", "weight": 60}}),
        ),
        policy(
            "batch",
            json!({"podSelector": {"matchLabels": {"tier": "batch"}}, "schedulerName": "batch-scheduler"}),
        ),
        // Webhook-only: it needs to know where its pods run.
        policy(
            "apart",
            json!({"podSelector": {"matchLabels": {"role": "apart"}}, "avoid": {"matchLabels": {"role": "apart"}}}),
        ),
    ]
}

/// The pods to admit: every combination of the parts below, in `namespace`.
fn pods(namespace: &str) -> Vec<Pod> {
    let images = [
        "registry.example.com/cdn/upload:1",
        "nginx",
        "registry.example.com/edge/cache:2",
    ];
    let labels = [
        json!({}),
        json!({"app": "train"}),
        json!({"tier": "batch"}),
        json!({"app": "train", "tier": "batch"}),
    ];
    let affinities = [
        Value::Null,
        json!({"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
            {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["b", "a"]}]},
            {"matchExpressions": [{"key": "example.com/gpu", "operator": "In", "values": ["h100", "a100"]}],
             "matchFields": [{"key": "metadata.name", "operator": "NotIn", "values": ["node4"]}]}]},
            "preferredDuringSchedulingIgnoredDuringExecution": [
                {"weight": 40, "preference": {"matchExpressions": [{"key": "disk", "operator": "In", "values": ["ssd"]}]}}]},
            "podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
                {"labelSelector": {"matchLabels": {"app": "train"}}, "topologyKey": "kubernetes.io/hostname"}]}}),
    ];
    let tolerations = [
        Value::Null,
        json!([{"operator": "Exists"}]),
        json!([{"key": names::POOL_TAINT, "operator": "Equal", "value": "edge", "effect": "NoSchedule"},
               {"key": "dedicated", "operator": "Exists"}]),
    ];
    let schedulers = [Value::Null, json!("my-scheduler")];
    let mut pods = Vec::new();
    for (i, image) in images.iter().enumerate() {
        for (l, labels) in labels.iter().enumerate() {
            for (a, affinity) in affinities.iter().enumerate() {
                for (t, tolerations) in tolerations.iter().enumerate() {
                    for (s, scheduler) in schedulers.iter().enumerate() {
                        let mut spec = json!({"containers": [{"name": "c", "image": image}]});
                        if !affinity.is_null() {
                            spec["affinity"] = affinity.clone();
                        }
                        if !tolerations.is_null() {
                            spec["tolerations"] = tolerations.clone();
                        }
                        if !scheduler.is_null() {
                            spec["schedulerName"] = scheduler.clone();
                        }
                        let pod = json!({"apiVersion": "v1", "kind": "Pod",
                            "metadata": {"name": format!("p-{i}{l}{a}{t}{s}"), "namespace": namespace,
                                "labels": labels},
                            "spec": spec});
                        pods.push(serde_json::from_value(pod).expect("a Pod"));
                    }
                }
            }
        }
    }
    pods
}

/// What berth places in a stored pod, lists as sorted sets.
fn placement(pod: &Pod) -> Value {
    let value = serde_json::to_value(pod).expect("a pod serialises");
    let sorted = |v: &Value| -> Value {
        let mut items: Vec<Value> = v.as_array().cloned().unwrap_or_default();
        for item in &mut items {
            if let Some(values) = item.get_mut("values").and_then(Value::as_array_mut) {
                values.sort_by_key(|v| v.to_string());
            }
        }
        items.sort_by_key(|i| i.to_string());
        Value::Array(items)
    };
    let affinity = &value["spec"]["affinity"]["nodeAffinity"];
    let terms: Vec<Value> = affinity
        .pointer("/requiredDuringSchedulingIgnoredDuringExecution/nodeSelectorTerms")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .map(|t| json!({"e": sorted(&t["matchExpressions"]), "f": sorted(&t["matchFields"])}))
        .collect();
    let preferred: Vec<Value> = affinity["preferredDuringSchedulingIgnoredDuringExecution"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|p| json!({"w": p["weight"], "e": sorted(&p["preference"]["matchExpressions"])}))
        .collect();
    json!({
        "tolerations": sorted(&value["spec"]["tolerations"]),
        "terms": terms,
        "preferred": sorted(&Value::Array(preferred)),
        "podAntiAffinity": value["spec"]["affinity"]["podAntiAffinity"],
        "schedulerName": value["spec"]["schedulerName"],
        "applied": value["metadata"]["annotations"][names::APPLIED_ANNOTATION],
        "gates": value["spec"]["schedulingGates"],
    })
}

/// Each pod as the apiserver would store it (a dry-run create), or the reason it
/// was refused.
async fn admit(client: &Client, namespace: &str, pods: &[Pod]) -> Vec<Result<Pod, String>> {
    let api: Api<Pod> = Api::namespaced(client.clone(), namespace);
    let dry_run = PostParams {
        dry_run: true,
        ..Default::default()
    };
    let mut out = Vec::new();
    for pod in pods {
        out.push(api.create(&dry_run, pod).await.map_err(|e| e.to_string()));
    }
    out
}

#[tokio::test]
async fn with_berth_down_the_apiserver_places_pods_as_berth_does() {
    let berth = Berth::shared(NODES);
    let client = berth.cluster.client().await;
    berth.cluster.apply_policies(&policies());
    berth.cluster.wait_for_pool("cdn", &["node2"], WAIT);
    berth.cluster.wait_for_pool("edge", &["node3"], WAIT);
    let namespaces: Api<Namespace> = Api::all(client.clone());
    let opted_in = fresh_namespace(&client, "placed").await;
    let annotate = json!({"metadata": {"annotations": {
        names::POLICIES_ANNOTATION: "cdn, train, edge, batch, apart"}}});
    namespaces
        .patch(&opted_in, &PatchParams::default(), &Patch::Merge(&annotate))
        .await
        .unwrap();
    let plain = fresh_namespace(&client, "plain").await;

    // The controller has compiled every policy for the apiserver: each says so.
    for name in ["cdn", "train", "edge", "batch", "apart"] {
        eventually(&format!("{name}'s InApiserver condition"), WAIT, || async {
            let conditions = berth.cluster.kubectl_ok(&[
                "get",
                "bpp",
                name,
                "-o",
                "jsonpath={.status.conditions[?(@.type==\"InApiserver\")].status}",
            ]);
            (!conditions.trim().is_empty()).then_some(())
        })
        .await;
    }
    let apart = berth.cluster.kubectl_ok(&[
        "get",
        "bpp",
        "apart",
        "-o",
        "jsonpath={.status.conditions[?(@.type==\"InApiserver\")].reason}",
    ]);
    assert_eq!(apart.trim(), "WebhookOnly");
    let compiled = berth.cluster.kubectl_ok(&[
        "get",
        "staticplacement",
        "berth",
        "-o",
        "jsonpath={.spec.policies[*].name}",
    ]);
    assert_eq!(compiled.trim(), "apart batch cdn edge train");

    let mut cases = pods(&opted_in);
    cases.extend(pods(&plain).into_iter().take(12));
    let up = admit(&client, &opted_in, &cases[..cases.len() - 12]).await;
    let up_plain = admit(&client, &plain, &cases[cases.len() - 12..]).await;

    // Every berth process killed: no webhook, no controller.
    let pid = berth.pid();
    let killed = std::process::Command::new("kill")
        .args(["-KILL", &pid.to_string()])
        .status()
        .unwrap();
    assert!(killed.success());
    eventually("berth to exit", WAIT, || async {
        (!support::running(pid)).then_some(())
    })
    .await;

    let down = admit(&client, &opted_in, &cases[..cases.len() - 12]).await;
    let down_plain = admit(&client, &plain, &cases[cases.len() - 12..]).await;
    let mut compared = 0;
    let mut placed = 0;
    let mut left = 0;
    for ((pod, up), down) in cases
        .iter()
        .zip(up.iter().chain(&up_plain))
        .zip(down.iter().chain(&down_plain))
    {
        let name = pod.metadata.name.clone().unwrap_or_default();
        // The pools a pod tolerates.
        let pools = |p: &Pod| -> std::collections::BTreeSet<String> {
            p.spec
                .iter()
                .flat_map(|s| s.tolerations.iter().flatten())
                .filter(|t| t.key.as_deref() == Some(names::POOL_TAINT))
                .map(|t| t.value.clone().unwrap_or_default())
                .collect()
        };
        let (up, down) = match (up, down) {
            (Ok(up), Ok(down)) => (up, down),
            // The pod brings a pool toleration its namespace does not opt into:
            // the webhook removes it, and with berth down berth-placement leaves
            // the pod to the webhook and berth-pools refuses it.
            (Ok(up), Err(refused))
                if refused.contains("berth-pools") && !pools(pod).is_subset(&pools(up)) =>
            {
                left += 1;
                continue;
            }
            (up, down) => panic!(
                "{name}: admitted {:?} with berth up, {:?} with it down",
                up.as_ref().err(),
                down.as_ref().err()
            ),
        };
        // A pool toleration the pod brings and is not entitled to: the webhook
        // removes it with a warning, so berth-placement leaves the pod to it, and
        // with berth down it is admitted as sent.
        if !pools(pod).is_subset(&pools(up)) {
            assert!(
                pools(down) == pools(pod)
                    && !down.annotations().contains_key(names::APPLIED_ANNOTATION),
                "{name}: with berth down, admitted otherwise than sent: {:?}",
                placement(down)
            );
            left += 1;
            continue;
        }
        assert_eq!(
            placement(down),
            placement(up),
            "{name}: placed otherwise with berth down"
        );
        compared += 1;
        if up.annotations().contains_key(names::APPLIED_ANNOTATION) {
            placed += 1;
        }
    }
    assert!(
        compared + left == cases.len() && placed > 0 && left > 0,
        "{compared} compared, {placed} placed, {left} left to the webhook"
    );

    // A pod the webhook-only policy applies to: with berth down, admitted as sent.
    let apart: Pod = serde_json::from_value(json!({"apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "apart", "labels": {"role": "apart"}},
        "spec": {"containers": [{"name": "c", "image": "nginx"}]}}))
    .unwrap();
    let admitted = admit(&client, &opted_in, &[apart])
        .await
        .remove(0)
        .expect("admitted");
    assert!(
        !admitted
            .annotations()
            .contains_key(names::APPLIED_ANNOTATION)
            && admitted
                .spec
                .as_ref()
                .and_then(|s| s.scheduling_gates.as_ref())
                .is_none(),
        "{admitted:?}"
    );

    // Seed 000, for real: CDN uploads land on the CDN pool with berth down.
    let api: Api<Pod> = Api::namespaced(client.clone(), &opted_in);
    for (name, image) in [
        ("upload-1", "registry.example.com/cdn/upload:1"),
        ("upload-2", "registry.example.com/cdn/upload:1"),
        ("web", "nginx"),
    ] {
        let pod: Pod = serde_json::from_value(json!({"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name},
            "spec": {"containers": [{"name": "c", "image": image}]}}))
        .unwrap();
        api.create(&PostParams::default(), &pod).await.unwrap();
    }
    for (name, on_pool) in [("upload-1", true), ("upload-2", true), ("web", false)] {
        let node = eventually(&format!("{name} to be bound"), WAIT, || async {
            api.get(name)
                .await
                .ok()
                .and_then(|p| p.spec.and_then(|s| s.node_name))
        })
        .await;
        assert_eq!(node == "node2", on_pool, "{name} is on {node}");
    }
}
