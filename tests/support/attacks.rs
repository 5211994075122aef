//! Pods a tenant builds to make the apiserver, berth's admission policies or berth
//! itself work hard, shared by the attack tests with berth up (tests/attacks.rs)
//! and down (tests/enforcement_down.rs).

use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Pod;
use kube::Client;
use kube::api::{Api, PostParams};
use serde_json::{Value, json};

use super::TestCluster;
use super::fixtures;
use super::fleet::cpu_seconds;

/// A pod with `count` tolerations, the first a wildcard, so that every admission
/// policy that looks at tolerations looks at it: 30,000 are about 1 MB.
pub fn many_tolerations(count: usize) -> Value {
    let mut tolerations = vec![json!({"operator": "Exists"})];
    tolerations.extend((1..count).map(|i| json!({"key": format!("k{i}"), "operator": "Exists"})));
    fixtures::pod("tolerant")
        .spec(json!({"tolerations": tolerations}))
        .json()
}

/// The costliest pod within berth's bounds for the admission policies: every list
/// at its bound (128 tolerations, a wildcard first; 32 required terms of 63
/// requirements, each on berth's pool key with values that never name a pool, one
/// short of the bound because berth adds its pool exclusion to each term), so that
/// `berth-pools` walks all of it once per PlacementPolicy. About 1 MB.
pub fn worst_within_bounds() -> Value {
    use berth::bounds::{REQUIRED_TERMS, TERM_REQUIREMENTS, TOLERATIONS};
    let mut tolerations = vec![json!({"operator": "Exists"})];
    tolerations.extend(
        (1..TOLERATIONS.most).map(|i| json!({"key": format!("k{i}"), "operator": "Exists"})),
    );
    let values: Vec<String> = (0..60).map(|i| format!("not-a-pool-{i}")).collect();
    let term = json!({"matchExpressions": (1..TERM_REQUIREMENTS.most)
        .map(|_| json!({"key": berth::names::POOL_LABEL, "operator": "NotIn", "values": values}))
        .collect::<Vec<_>>()});
    fixtures::pod("worst")
        .spec(
            json!({"tolerations": tolerations, "affinity": {"nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": vec![term; REQUIRED_TERMS.most]}}}}),
        )
        .json()
}

/// What one dry-run create of `pod` as `client` cost: kube-apiserver's CPU seconds
/// and the wall time, and the apiserver's answer (its error text on a refusal).
pub async fn dry_run_cost(
    cluster: &TestCluster,
    client: &Client,
    namespace: &str,
    pod: &Value,
) -> (f64, Duration, Result<(), String>) {
    let apiserver = cluster.pid("kube-apiserver").expect("kube-apiserver runs");
    let api: Api<Pod> = Api::namespaced(client.clone(), namespace);
    let typed: Pod = serde_json::from_value(pod.clone()).expect("a pod");
    let dry_run = PostParams {
        dry_run: true,
        ..PostParams::default()
    };
    let (cpu, started) = (cpu_seconds(apiserver), Instant::now());
    let answer = api
        .create(&dry_run, &typed)
        .await
        .map(drop)
        .map_err(|e| e.to_string());
    (cpu_seconds(apiserver) - cpu, started.elapsed(), answer)
}
