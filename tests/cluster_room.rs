#![cfg(feature = "e2e")]
//! The cluster model against the real apiserver: what berth reads of a policy is
//! its spec and finalizers, so a status write (berth's own, every pass) wakes
//! nothing, while a spec change costs one compile and one node pass. One test in
//! this binary, with a berth of its own, so nothing else moves its counters.

mod support;

use std::time::Duration;

use berth::names;
use kube::api::{Api, DynamicObject, Patch, PatchParams};
use serde_json::{Value, json};
use support::{Berth, Nodes, eventually};

const NODES: Nodes = Nodes {
    count: 2,
    prefix: "node",
};
const WAIT: Duration = Duration::from_secs(60);

/// berth with no resync during the test: every pass counted is one a change woke.
fn berth() -> &'static Berth {
    Berth::shared_with(NODES, &[], &["--resync-seconds", "3600"])
}

/// Waits until berth recorded `images` as the last good spec of `policy` and its
/// finalizer is on it: the node pass that compiled that spec has run, and no
/// finalizer write of berth's is still to come (one that met a change of the test's
/// would fail, and its retry be a pass no change asked for).
async fn recorded(api: &Api<DynamicObject>, policy: &str, images: &Value) {
    eventually(&format!("{policy}: {images} recorded"), WAIT, || async {
        let object = api.get(policy).await.ok()?;
        let finalized = object
            .metadata
            .finalizers
            .as_ref()
            .is_some_and(|f| f.iter().any(|f| f == names::POLICY_FINALIZER));
        (finalized && object.data["status"]["lastGoodSpec"]["images"] == *images).then_some(())
    })
    .await;
}

fn counter(name: &str) -> f64 {
    berth().metric(name).unwrap_or(0.0)
}

#[tokio::test]
async fn a_policy_status_write_wakes_nothing_and_a_spec_change_one_pass() {
    let berth = berth();
    let client = berth.cluster.client().await;
    let api = support::audit::policy_api(&client);
    for name in ["quiet-a", "quiet-b"] {
        berth.cluster.apply_app_policy(
            name,
            json!({"images": [format!("*{name}*")],
                "schedulerName": "berth-quiet"}),
        );
    }
    // Neither policy is changed before berth has finalized both: a change racing a
    // finalizer write fails that write, and its retry is a pass of its own.
    recorded(&api, "quiet-a", &json!(["*quiet-a*"])).await;
    recorded(&api, "quiet-b", &json!(["*quiet-b*"])).await;
    // A change to quiet-b, once recorded, leaves no wake behind: every earlier one
    // (creations, finalizers) was taken by the pass that recorded it or before.
    let spec = |images: &str| Patch::Merge(json!({"spec": {"images": [images]}}));
    let params = PatchParams::default();
    api.patch("quiet-b", &params, &spec("*quiet-b-1*"))
        .await
        .unwrap();
    recorded(&api, "quiet-b", &json!(["*quiet-b-1*"])).await;
    let compiles = counter("berth_policy_compiles_total");
    let passes = counter("berth_reconciles_total");

    // Five status writes, as berth makes every pass, then one spec change: the
    // policy watch delivers them in order, so once the spec change is recorded,
    // every status write was seen.
    for i in 0..5 {
        let status = Patch::Merge(json!({"status": {"nodes": i, "nodeNames": [format!("n{i}")]}}));
        api.patch_status("quiet-a", &params, &status).await.unwrap();
    }
    api.patch("quiet-b", &params, &spec("*quiet-b-2*"))
        .await
        .unwrap();
    recorded(&api, "quiet-b", &json!(["*quiet-b-2*"])).await;
    assert_eq!(
        counter("berth_policy_compiles_total") - compiles,
        1.0,
        "the spec change compiled the policies once; the status writes, never"
    );
    assert_eq!(
        counter("berth_reconciles_total") - passes,
        1.0,
        "one node pass, for the spec change; berth's log:\n{}",
        berth.log()
    );
}
