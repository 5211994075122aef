#![cfg(feature = "e2e")]
//! berth never blocks the cluster: with berth stopped (SIGTERM, graceful), pods are
//! still created everywhere, its own and the system namespaces included.

mod support;

use std::time::{Duration, Instant};

use berth::names;
use k8s_openapi::api::core::v1::{Namespace, Pod};
use kube::api::{Api, Patch, PatchParams, PostParams};
use serde_json::json;
use support::fixtures;
use support::{Berth, Nodes, TestCluster, fresh_namespace, samples};

const NODES: Nodes = Nodes {
    count: 2,
    prefix: "node",
};

#[tokio::test]
async fn with_berth_stopped_pods_are_still_created_everywhere() {
    let berth = Berth::shared(NODES);
    let client = berth.cluster.client().await;
    let opted_in = fresh_namespace(&client, "opted-in").await;
    let namespaces: Api<Namespace> = Api::all(client.clone());
    let annotate = json!({"metadata": {"annotations": {names::POLICIES_ANNOTATION: "cdn"}}});
    namespaces
        .patch(&opted_in, &PatchParams::default(), &Patch::Merge(&annotate))
        .await
        .unwrap();
    let plain = fresh_namespace(&client, "plain").await;

    // SIGTERM: berth stops accepting, finishes what is in flight and exits.
    let pid = berth.pid();
    let status = std::process::Command::new("kill")
        .args(["-TERM", &pid.to_string()])
        .status()
        .unwrap();
    assert!(status.success());
    let deadline = Instant::now() + Duration::from_secs(15);
    while support::running(pid) {
        assert!(
            Instant::now() < deadline,
            "berth did not exit after SIGTERM"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let log = berth.log();
    assert!(
        log.contains("shutting down") && log.contains("stopped accepting"),
        "{log}"
    );

    // The system namespaces are never sent to berth; the others are, and the
    // apiserver, finding berth gone, lets the pod through (failurePolicy Ignore)
    // and counts it.
    for (ns, sent) in [
        ("kube-system", false),
        ("berth-system", false),
        (plain.as_str(), true),
        (opted_in.as_str(), true),
    ] {
        let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
        let pod = fixtures::pod("while-berth-is-down")
            .image("example/cdn-uploader:1")
            .build();
        let before = failed_open(berth.cluster);
        let started = Instant::now();
        pods.create(&PostParams::default(), &pod)
            .await
            .unwrap_or_else(|e| panic!("a pod in {ns} was blocked: {e}"));
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "creating in {ns} took {:?}",
            started.elapsed()
        );
        assert_eq!(
            failed_open(berth.cluster) - before,
            if sent { 1.0 } else { 0.0 },
            "the apiserver's count of pods let past berth, for one in {ns}"
        );
    }
}

/// The apiserver's own count of requests it let through berth's pod webhook
/// unanswered (`failurePolicy: Ignore`).
fn failed_open(cluster: &TestCluster) -> f64 {
    let metrics = cluster.kubectl_ok(&["get", "--raw", "/metrics"]);
    let sample =
        r#"apiserver_admission_webhook_fail_open_count{name="pods.mutate.berth.io",type="admit"}"#;
    // The apiserver prints a counter only once it has counted something.
    samples(&metrics)
        .find_map(|(name, value)| (name == sample).then_some(value))
        .unwrap_or(0.0)
}
