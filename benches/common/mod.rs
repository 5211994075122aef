//! Shared by the benches on a real control plane (`admission.rs`, `cluster.rs`):
//! pod creates at a fixed concurrency, and saving and restoring configuration.
#![allow(dead_code)] // each bench uses a different part

use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use kube::Client;
use kube::api::{Api, DeleteParams, ListParams, PostParams};
use serde_json::{Value, json};

use crate::support::{self, Berth};

/// How many creates are in flight at once.
pub const CONCURRENCY: usize = 8;

pub fn pod(name: &str, image: &str) -> Pod {
    serde_json::from_value(json!({"metadata": {"name": name},
        "spec": {"containers": [{"name": "c", "image": image, "resources": {"requests": {"cpu": "1m"}}}]}}))
    .unwrap()
}

/// Creates pods in `namespaces`, `CONCURRENCY` at a time, until `length` is up; the
/// successful creates and their latencies in milliseconds.
pub async fn create_for(
    client: &Client,
    namespaces: &[String],
    tag: &str,
    length: Duration,
) -> (u64, Vec<f64>) {
    let deadline = Instant::now() + length;
    let stream = futures::stream::iter(0u64..)
        .take_while(|_| futures::future::ready(Instant::now() < deadline))
        .map(|i| {
            let ns = &namespaces[i as usize % namespaces.len()];
            let api: Api<Pod> = Api::namespaced(client.clone(), ns);
            let image = if i % 2 == 0 {
                "example/cdn-uploader:1"
            } else {
                "nginx:1.27"
            };
            let pod = pod(&format!("{tag}-{i}"), image);
            async move {
                let started = Instant::now();
                let ok = api.create(&PostParams::default(), &pod).await.is_ok();
                (ok, started.elapsed().as_secs_f64() * 1000.0)
            }
        })
        .buffer_unordered(CONCURRENCY);
    let results: Vec<(bool, f64)> = stream.collect().await;
    let created = results.iter().filter(|(ok, _)| *ok).count() as u64;
    (
        created,
        results
            .into_iter()
            .filter(|(ok, _)| *ok)
            .map(|(_, ms)| ms)
            .collect(),
    )
}

pub async fn clear(client: &Client, namespaces: &[String]) {
    for ns in namespaces {
        let api: Api<Pod> = Api::namespaced(client.clone(), ns);
        let now = DeleteParams {
            grace_period_seconds: Some(0),
            ..DeleteParams::default()
        };
        let _ = api.delete_collection(&now, &ListParams::default()).await;
    }
}

pub fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    sorted[((sorted.len() - 1) as f64 * p).round() as usize]
}

/// The configuration objects as they are now, to put back later.
pub fn saved(berth: &Berth, kind: &str) -> Value {
    let out = berth.cluster.kubectl_ok(&["get", kind, "-o", "json"]);
    let mut list: Value = serde_json::from_str(&out).unwrap();
    for item in list["items"].as_array_mut().unwrap() {
        let meta = item["metadata"].as_object_mut().unwrap();
        for key in [
            "resourceVersion",
            "uid",
            "creationTimestamp",
            "generation",
            "managedFields",
        ] {
            meta.remove(key);
        }
    }
    list
}

pub fn put_back(berth: &Berth, list: &Value) {
    let out =
        support::kubectl_with_input(&berth.cluster.dir, &["apply", "-f", "-"], &list.to_string());
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}
