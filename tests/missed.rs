#![cfg(feature = "e2e")]
//! Pods berth missed while it was down (the webhook fails open, so they were
//! created as written): once berth is back, a policy with `onMissed: Evict` has
//! their Deployment recreate them through the webhook, onto the pool; a bare pod is
//! reported only; a policy with the default `Report` reports and evicts nothing.
//! Its own cluster: the test kills berth and starts it again. Without the
//! MutatingAdmissionPolicy `berth-placement`, which would place these pods with
//! berth down (as on a cluster before 1.36; `tests/placement_down.rs` runs it).

mod support;

use std::collections::{BTreeMap, BTreeSet};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use berth::names;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::events::v1::Event;
use kube::api::{Api, ListParams, PostParams};
use serde_json::{Value, json};
use support::fixtures::{self, policy};
use support::{
    Berth, Nodes, Tenant, eventually, fresh_namespace, kubectl_with_input, opt_in, placed,
};

const NODES: Nodes = Nodes {
    count: 4,
    prefix: "node",
};
const WAIT: Duration = Duration::from_secs(120);

/// A berth process the test started, killed when dropped.
struct Restarted(Child);

impl Drop for Restarted {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn deployment(ns: &str, name: &str, replicas: u32, image: &str) -> String {
    json!({"apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": name, "namespace": ns},
        "spec": {"replicas": replicas, "selector": {"matchLabels": {"app": name}},
            "template": {"metadata": {"labels": {"app": name}},
                "spec": {"containers": [{"name": "c", "image": image}]}}}})
    .to_string()
}

fn apply(berth: &Berth, manifest: &str) {
    let out = kubectl_with_input(&berth.cluster.dir, &["apply", "-f", "-"], manifest);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// What matters of a pod here: its uid, whether berth's `berth.io/applied` names
/// the policy, and its node.
#[derive(Debug, PartialEq)]
struct Seen {
    uid: String,
    applied: bool,
    node: Option<String>,
}

/// The pods labelled `app=<app>` that are not being deleted, by name.
async fn pods_of(api: &Api<Pod>, app: &str, policy: &str) -> BTreeMap<String, Seen> {
    let list = api
        .list(&ListParams::default().labels(&format!("app={app}")))
        .await
        .unwrap();
    list.items
        .into_iter()
        .filter(|p| p.metadata.deletion_timestamp.is_none())
        .map(|p| {
            let applied = p
                .metadata
                .annotations
                .as_ref()
                .and_then(|a| a.get(names::APPLIED_ANNOTATION))
                .is_some_and(|a| a.split(',').any(|x| x == policy));
            let seen = Seen {
                uid: p.metadata.uid.unwrap(),
                applied,
                node: p.spec.and_then(|s| s.node_name),
            };
            (p.metadata.name.unwrap(), seen)
        })
        .collect()
}

/// The `MissedPods` condition of `policy`, once it is True.
async fn missed_condition(berth: &Berth, policy: &str) -> String {
    eventually(
        &format!("{policy}'s MissedPods condition"),
        WAIT,
        || async {
            let out = berth.cluster.kubectl(&["get", "bpp", policy, "-o", "json"]);
            let object: Value = serde_json::from_slice(&out.stdout).ok()?;
            object["status"]["conditions"]
                .as_array()?
                .iter()
                .find(|c| c["type"] == "MissedPods" && c["status"] == "True")
                .and_then(|c| c["message"].as_str().map(str::to_owned))
        },
    )
    .await
}

#[tokio::test]
async fn pods_created_while_berth_was_down_are_evicted_back_through_it_or_reported() {
    let berth = Berth::shared_without_placement_policy(NODES);
    let client = berth.cluster.client().await;
    berth.cluster.apply_policies(&[
        policy(
            "edge",
            json!({"images": ["*edge*"], "pool": {"nodeNames": ["node2"]}, "onMissed": "Evict"}),
        ),
        policy(
            "audit",
            json!({"images": ["*audit*"], "pool": {"nodeNames": ["node3"]}}),
        ),
        // Cluster-wide: every namespace opts in, kube-system too as far as the
        // policy says; but the webhook never sees kube-system, so nothing there is
        // missed.
        policy(
            "sweep",
            json!({"namespaceSelector": {}, "images": ["*sweep*"],
                "pool": {"nodeNames": ["node4"]}, "onMissed": "Evict"}),
        ),
    ]);
    let ns = fresh_namespace(&client, "missed").await;
    let probe = fixtures::pod("probe").image("example/edge:1").build();
    opt_in(&client, &ns, "edge,audit", &probe, WAIT).await;
    let api: Api<Pod> = Api::namespaced(client.clone(), &ns);
    let tenant = Tenant::new(berth.cluster, &format!("tenant-{ns}"), &ns).await;
    apply(berth, &deployment(&ns, "edge", 1, "example/edge:1"));
    placed(&client, &ns, "app=edge", 1, WAIT).await;

    // berth goes down hard. What is created now is admitted as written.
    let pid = berth.pid();
    let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap();
    let args: Vec<String> = cmdline
        .split(|b| *b == 0)
        .filter(|a| !a.is_empty())
        .map(|a| String::from_utf8_lossy(a).into_owned())
        .collect();
    assert!(
        Command::new("kill")
            .args(["-KILL", &pid.to_string()])
            .status()
            .unwrap()
            .success()
    );
    eventually("berth gone", WAIT, || async {
        (!std::path::Path::new(&format!("/proc/{pid}")).exists()).then_some(())
    })
    .await;
    apply(berth, &deployment(&ns, "edge", 4, "example/edge:1"));
    apply(berth, &deployment(&ns, "audit", 2, "example/audit:1"));
    apply(berth, &deployment(&ns, "sweep", 1, "example/sweep:1"));
    apply(
        berth,
        &deployment("kube-system", "sweep", 1, "example/sweep:1"),
    );
    let stray = fixtures::pod("stray")
        .image("example/edge:1")
        .labels(json!({"app": "stray"}))
        .build();
    api.create(&PostParams::default(), &stray).await.unwrap();
    // A tenant's pods that claim what they are not: berth's record written by the
    // tenant, and a DaemonSet owner that does not exist (a made-up API group).
    let forged = fixtures::pod("forged")
        .image("example/edge:1")
        .labels(json!({"app": "forged"}))
        .annotations(json!({names::APPLIED_ANNOTATION: "edge"}))
        .json();
    let orphan = fixtures::pod("orphan")
        .image("example/edge:1")
        .labels(json!({"app": "orphan"}))
        .owners(
            json!([{"apiVersion": "redteam.example.com/v1", "kind": "DaemonSet",
            "name": "agent", "uid": "6a1c8f2e-0000-4000-8000-000000000001", "controller": true}]),
        )
        .json();
    for pod in [forged, orphan] {
        let out = tenant.create(berth.cluster, &pod.to_string());
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let edge = placed(&client, &ns, "app=edge", 4, WAIT).await;
    let audit = placed(&client, &ns, "app=audit", 2, WAIT).await;
    for app in ["stray", "forged", "orphan"] {
        placed(&client, &ns, &format!("app={app}"), 1, WAIT).await;
    }
    let missed_edge: BTreeSet<String> = pods_of(&api, "edge", "edge")
        .await
        .into_values()
        .filter(|seen| !seen.applied)
        .map(|seen| seen.uid)
        .collect();
    assert_eq!(
        missed_edge.len(),
        3,
        "three edge pods were created without berth: {edge:?}"
    );
    let audit_before = pods_of(&api, "audit", "audit").await;
    let system: Api<Pod> = Api::namespaced(client.clone(), "kube-system");
    placed(&client, "kube-system", "app=sweep", 1, WAIT).await;
    let system_before = pods_of(&system, "sweep", "sweep").await;
    let stray_uid = api.get("stray").await.unwrap().metadata.uid.unwrap();

    // berth is back, with the same flags.
    let log = std::fs::File::create(berth.cluster.dir.join("logs/berth-again.log")).unwrap();
    let _again = Restarted(
        Command::new(&args[0])
            .args(&args[1..])
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap(),
    );

    // onMissed: Evict: the Deployment recreates the missed pods through the
    // webhook, and the scheduler puts them on the pool.
    let now = eventually(
        "every edge pod with berth's decision, on node2",
        WAIT,
        || async {
            let pods = pods_of(&api, "edge", "edge").await;
            (pods.len() == 4
                && pods
                    .values()
                    .all(|s| s.applied && s.node.as_deref() == Some("node2")))
            .then_some(pods)
        },
    )
    .await;
    let uids: BTreeSet<String> = now.values().map(|s| s.uid.clone()).collect();
    assert!(
        uids.is_disjoint(&missed_edge),
        "the missed pods were replaced, not patched"
    );
    let events: Api<Event> = Api::namespaced(client.clone(), &ns);
    let evicted = eventually("an EvictedMissed Event for each", WAIT, || async {
        let list = events
            .list(&ListParams::default().fields("reason=EvictedMissed"))
            .await
            .ok()?;
        let uids: BTreeSet<String> = list
            .items
            .into_iter()
            .filter_map(|e| e.regarding)
            .filter(|r| r.name.as_deref().is_some_and(|n| n.starts_with("edge-")))
            .filter_map(|r| r.uid)
            .collect();
        (uids.len() >= missed_edge.len()).then_some(uids)
    })
    .await;
    assert_eq!(evicted, missed_edge, "exactly the missed pods were evicted");

    // The cluster-wide policy evicts its missed pod in the tenant's namespace and
    // leaves kube-system's alone (CoreDNS would be evicted every scan otherwise).
    eventually(
        "the sweep pod back through berth, on node4",
        WAIT,
        || async {
            let pods = pods_of(&api, "sweep", "sweep").await;
            (pods.len() == 1
                && pods
                    .values()
                    .all(|s| s.applied && s.node.as_deref() == Some("node4")))
            .then_some(())
        },
    )
    .await;
    assert_eq!(pods_of(&system, "sweep", "sweep").await, system_before);
    let system_events: Api<Event> = Api::namespaced(client.clone(), "kube-system");
    let evicted = system_events
        .list(&ListParams::default().fields("reason=EvictedMissed"))
        .await
        .unwrap()
        .items;
    assert!(evicted.is_empty(), "kube-system pods evicted: {evicted:?}");

    // A bare pod has no owner to recreate it: reported, left as it is. So are the
    // tenant's: a record the pod wrote itself is not berth's decision, and an owner
    // that does not exist does not make a DaemonSet pod.
    let message = missed_condition(berth, "edge").await;
    for pod in ["stray", "forged", "orphan"] {
        assert!(message.contains(&format!("{ns}/{pod}")), "{pod}: {message}");
    }
    assert_eq!(
        api.get("stray").await.unwrap().metadata.uid.unwrap(),
        stray_uid
    );
    let reported = events
        .list(&ListParams::default().fields("reason=MissedByWebhook,regarding.name=stray"))
        .await
        .unwrap()
        .items;
    assert!(
        !reported.is_empty(),
        "no MissedByWebhook Event on the stray pod"
    );

    // onMissed: Report (the default): both audit pods are named, and none of them
    // was evicted: the same pods, off the pool.
    let message = missed_condition(berth, "audit").await;
    for pod in audit.keys() {
        assert!(message.contains(&format!("{ns}/{pod}")), "{message}");
    }
    assert_eq!(pods_of(&api, "audit", "audit").await, audit_before);
    assert!(audit.values().all(|n| n != "node3"), "{audit:?}");
}
