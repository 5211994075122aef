//! Releasing pods held by `berth.io/avoid` (see [`super::exclusion`] for which and
//! when): one test-guarded JSON Patch per pod that narrows its node affinity and
//! removes the gate.

use std::collections::BTreeSet;
use std::time::Instant;

use k8s_openapi::api::core::v1::ObjectReference;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::events::EventType;
use serde_json::{Value, json};

use super::events::event;
use super::exclusion::{self, ExclusionPod, Hold, Term};
use super::run::{Pass, Snapshot};
use crate::names::{AVOID_GATE, FIELD_MANAGER};
use crate::objects::{PodObject, PolicyObject};
use crate::policy::OptIn;

/// The JSON Patch that releases a held pod: the gate must still be where we saw it
/// (so a stale cache cannot remove another gate, and no pod is released twice),
/// every required term that matches some node is narrowed to keep off
/// `avoid_nodes`, and the gate goes, in one update.
pub fn release_patch(release: &exclusion::Release, gate: usize) -> Value {
    let mut ops = vec![
        json!({"op": "test", "path": format!("/spec/schedulingGates/{gate}/name"), "value": AVOID_GATE}),
    ];
    if !release.avoid_nodes.is_empty() {
        // A node field selector takes one value, so one NotIn per node, ANDed.
        let keep_off: Vec<Value> = release
            .avoid_nodes
            .iter()
            .map(|node| json!({"key": "metadata.name", "operator": "NotIn", "values": [node]}))
            .collect();
        let terms = "/spec/affinity/nodeAffinity/requiredDuringSchedulingIgnoredDuringExecution/nodeSelectorTerms";
        for (i, term) in release.pod.terms.iter().enumerate() {
            match term {
                // It matches no node; a field would make it match some.
                Term::Empty => {}
                Term::Fields => {
                    for entry in &keep_off {
                        ops.push(json!({"op": "add", "path": format!("{terms}/{i}/matchFields/-"), "value": entry}));
                    }
                }
                Term::Expressions => {
                    ops.push(json!({"op": "add", "path": format!("{terms}/{i}/matchFields"), "value": keep_off}));
                }
            }
        }
    }
    ops.push(json!({"op": "remove", "path": format!("/spec/schedulingGates/{gate}")}));
    Value::Array(ops)
}

/// Policies that held pods were admitted with, that `snapshot` does not hold, and
/// that exist. The webhook's and the controller's watches lag independently, so a
/// pod may name a policy created a moment ago; one GET tells that apart from a
/// deleted policy. Only names the pod's namespace opts into by annotation are
/// asked about: a pod can name thousands of policies, a namespace only what its
/// administrator wrote.
async fn unseen_policies(
    pass: &Pass<'_>,
    snapshot: &Snapshot,
    pods: &[ExclusionPod],
) -> BTreeSet<String> {
    let missing: BTreeSet<&String> = pods
        .iter()
        .filter(|p| p.gate.is_some())
        .flat_map(|p| {
            let named = snapshot.namespaces.named(&p.namespace);
            p.applied.iter().filter(move |name| named.contains(name))
        })
        .filter(|name| !snapshot.has(name))
        .collect();
    let api: Api<PolicyObject> = Api::all(pass.client.clone());
    let mut unseen = BTreeSet::new();
    for name in missing {
        match api.get_opt(name).await {
            Ok(None) => {}
            Ok(Some(_)) => {
                unseen.insert(name.clone());
            }
            Err(e) => {
                // Unknown either way: keep the pod held, the next pass asks again.
                tracing::warn!(policy = %name, error = %e, "cannot look up policy");
                unseen.insert(name.clone());
            }
        }
    }
    unseen
}

/// Releases the held pods that may go now and tells the others, with an Event,
/// which pod they wait for. True when the next pass should come quickly: a held pod
/// waits behind a pod released a moment ago.
pub async fn release_held_pods(
    pass: &Pass<'_>,
    snapshot: &Snapshot,
    pods: &[std::sync::Arc<PodObject>],
    nodes: &exclusion::NodeLabels,
    released: &mut exclusion::Released,
    reported: &mut super::events::Reported,
) -> bool {
    let mut all: Vec<ExclusionPod> = pods
        .iter()
        .filter_map(|p| ExclusionPod::from_pod(p))
        .collect();
    released.overlay(&mut all);
    let unseen = unseen_policies(pass, snapshot, &all).await;
    let policies = &snapshot.compiled.set;
    let plan = exclusion::plan(&all, policies, &snapshot.namespaces, &unseen, nodes);
    let held = all.iter().filter(|p| p.gate.is_some()).count();
    pass.metrics
        .gated_pods
        .set((held - plan.release.len()) as i64);
    let params = PatchParams {
        field_manager: Some(FIELD_MANAGER.into()),
        ..PatchParams::default()
    };
    for release in &plan.release {
        let pod = release.pod;
        let Some(gate) = pod.gate else { continue };
        if pod.terms.is_empty() && !release.avoid_nodes.is_empty() {
            // berth gives every pod it holds a required term; without one there is
            // nothing to narrow, and the labels must do.
            tracing::warn!(pod = %pod.name, "held pod has no required node affinity to narrow");
        }
        let api: Api<PodObject> = Api::namespaced(pass.client.clone(), &pod.namespace);
        let Ok(patch) = serde_json::from_value::<json_patch::Patch>(release_patch(release, gate))
        else {
            continue;
        };
        match api
            .patch(&pod.name, &params, &Patch::<()>::Json(patch))
            .await
        {
            Ok(_) => {
                released.record(pod, Instant::now());
                let held_for = pod
                    .created
                    .as_ref()
                    .map(|t| {
                        (k8s_openapi::jiff::Timestamp::now() - t.0).get_milliseconds() as f64
                            / 1000.0
                    })
                    .unwrap_or_default();
                pass.metrics.gated_seconds.observe(held_for.max(0.0));
                tracing::info!(pod = %pod.name, namespace = %pod.namespace, keep_off = ?release.avoid_nodes, "released from {AVOID_GATE}");
            }
            Err(e) => {
                tracing::warn!(pod = %pod.name, error = %e, "release failed; retrying on the next pass")
            }
        }
    }
    for waiting in &plan.waiting {
        // A policy not seen yet is a moment's lag, not worth an Event.
        let Hold::Behind {
            pod: behind,
            policy,
        } = &waiting.reason
        else {
            continue;
        };
        // One event per held pod and policy: repeated events are folded into a
        // series by the recorder, so the note must not name a blocker that changes.
        let pod = waiting.pod;
        let key = format!("held/{}/{policy}", pod.uid.as_deref().unwrap_or(&pod.name));
        let reference = ObjectReference {
            api_version: Some("v1".into()),
            kind: Some("Pod".into()),
            namespace: Some(pod.namespace.clone()),
            name: Some(pod.name.clone()),
            uid: pod.uid.clone(),
            ..Default::default()
        };
        let note = format!(
            "held by {AVOID_GATE}: a pod it must avoid (policy {policy}, first {}/{}) is still being placed; \
             it is released once that pod is bound",
            behind.namespace, behind.name
        );
        let event = event(EventType::Normal, "HeldForExclusion", "Hold", note);
        reported
            .publish(pass.recorder, key, event, &reference)
            .await;
    }
    released.hurry(&plan, Instant::now(), super::run::HURRY_WINDOW)
}
