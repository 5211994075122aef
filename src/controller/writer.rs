//! Writes berth's part of a Node and nothing else, in one request.
//!
//! - Labels and taints go together: written apart, a pool taint could land before
//!   the pool label, and a pod that tolerates every taint (kept off pools only by
//!   the label) could be scheduled onto the node in between.
//! - `spec.taints` is an atomic list, so one entry cannot be written alone (a
//!   server-side apply of it would own the whole list). The node is read, only
//!   berth's entries change, every other taint is written back exactly as it was,
//!   and the write carries the node's `resourceVersion`: a taint another owner adds
//!   in the meantime turns into a 409 and a retry on fresh data instead of being
//!   lost. The labels ride in the same merge patch: only berth's keys, each set or
//!   removed by name, under field manager `berth`.
//! - No write at all when the node already carries what berth wants.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Taint;
use kube::api::{Api, Patch, PatchParams};
use kube::{Client, ResourceExt};
use serde_json::{Map, Value, json};

use super::error::{CONFLICT_RETRIES, Error};
use super::writes::{Kind, Writes};
use crate::names::{FIELD_MANAGER, POOL_TAINT, is_owned_node_key};
use crate::objects::NodeObject;
use crate::placement::desired::DesiredNode;

/// What one node write did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Written {
    pub labels: bool,
    pub taints: bool,
    /// 409s met and retried.
    pub conflicts: usize,
}

/// berth's labels on a node now.
pub fn berth_labels(node: &NodeObject) -> BTreeMap<String, String> {
    node.labels()
        .iter()
        .filter(|(k, _)| is_owned_node_key(k))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect()
}

fn is_berth_taint(taint: &Value) -> bool {
    taint.get("key").and_then(Value::as_str) == Some(POOL_TAINT)
}

/// A taint as berth compares it: key, value and effect (not `timeAdded`).
fn triple(taint: &Value) -> (String, String, String) {
    let field = |k: &str| {
        taint
            .get(k)
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_owned()
    };
    (field("key"), field("value"), field("effect"))
}

fn taint_json(taint: &Taint) -> Value {
    json!({"key": taint.key, "value": taint.value, "effect": taint.effect})
}

/// berth's taints on a node now, as triples.
fn berth_taints(node: &NodeObject) -> Vec<(String, String, String)> {
    node.spec
        .taints
        .iter()
        .filter(|t| is_berth_taint(t))
        .map(triple)
        .collect()
}

fn desired_taints(desired: &DesiredNode) -> Vec<(String, String, String)> {
    desired
        .taints
        .iter()
        .map(|t| triple(&taint_json(t)))
        .collect()
}

/// Whether `node` already carries exactly what berth wants.
pub fn in_sync(node: &NodeObject, desired: &DesiredNode) -> bool {
    berth_labels(node) == desired.labels && berth_taints(node) == desired_taints(desired)
}

/// The merge patch that brings `node` to `desired`, if anything differs.
fn node_patch(node: &NodeObject, desired: &DesiredNode) -> Option<(Value, Written)> {
    let mut written = Written::default();
    let mut patch = Map::new();
    let mut metadata = Map::new();
    metadata.insert("resourceVersion".into(), json!(node.resource_version()));
    let have = berth_labels(node);
    if have != desired.labels {
        let mut labels: Map<String, Value> = have
            .keys()
            .filter(|k| !desired.labels.contains_key(*k))
            .map(|k| (k.clone(), Value::Null))
            .collect();
        labels.extend(desired.labels.iter().map(|(k, v)| (k.clone(), json!(v))));
        metadata.insert("labels".into(), Value::Object(labels));
        written.labels = true;
    }
    patch.insert("metadata".into(), Value::Object(metadata));
    if berth_taints(node) != desired_taints(desired) {
        let mut taints: Vec<Value> = node
            .spec
            .taints
            .iter()
            .filter(|t| !is_berth_taint(t))
            .cloned()
            .collect();
        taints.extend(desired.taints.iter().map(taint_json));
        patch.insert("spec".into(), json!({"taints": taints}));
        written.taints = true;
    }
    (written.labels || written.taints).then_some((Value::Object(patch), written))
}

/// Brings `node` to `desired` in one write, made again at once on fresh data after
/// a conflict, at most [`CONFLICT_RETRIES`] times.
pub async fn write_node(
    writes: &Writes,
    client: &Client,
    node: &NodeObject,
    desired: &DesiredNode,
) -> Result<Written, Error> {
    let api: Api<NodeObject> = Api::all(client.clone());
    let name = node.name_any();
    let params = PatchParams {
        field_manager: Some(FIELD_MANAGER.into()),
        ..PatchParams::default()
    };
    let mut current = node.clone();
    let mut conflicts = 0;
    loop {
        let Some((patch, written)) = node_patch(&current, desired) else {
            return Ok(Written {
                conflicts,
                ..Written::default()
            });
        };
        let patch = Patch::Merge(&patch);
        match writes
            .make(Kind::Node, api.patch(&name, &params, &patch))
            .await
        {
            Ok(_) => {
                return Ok(Written {
                    conflicts,
                    ..written
                });
            }
            Err(e) if e.is_conflict() && conflicts < CONFLICT_RETRIES => {
                conflicts += 1;
                current = writes.make(Kind::Node, api.get(&name)).await?;
            }
            Err(e) => return Err(e),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::controller::mock::{answer, body, mock_apiserver};

    fn node(labels: Value, taints: Value) -> NodeObject {
        serde_json::from_value(
            json!({"metadata": {"name": "n", "resourceVersion": "7", "labels": labels},
            "spec": {"taints": taints}}),
        )
        .unwrap()
    }

    fn desired(labels: &[(&str, &str)], pool: Option<&str>) -> DesiredNode {
        DesiredNode {
            labels: labels
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            taints: pool
                .map(|p| Taint {
                    key: POOL_TAINT.into(),
                    value: Some(p.into()),
                    effect: "NoSchedule".into(),
                    time_added: None,
                })
                .into_iter()
                .collect(),
            ..DesiredNode::default()
        }
    }

    const POOL: &str = "node-restriction.kubernetes.io/berth.pool";

    #[test]
    fn labels_and_taints_go_in_one_patch_that_keeps_other_owners_taints_verbatim() {
        let other =
            json!({"key": "gpu", "effect": "NoExecute", "timeAdded": "2026-01-01T00:00:00Z"});
        let current = node(
            json!({"team": "a", "node-restriction.kubernetes.io/berth.runs.old": "true"}),
            json!([other]),
        );
        let (patch, written) =
            node_patch(&current, &desired(&[(POOL, "cdn")], Some("cdn"))).unwrap();
        assert!(written.labels && written.taints);
        assert_eq!(patch["metadata"]["resourceVersion"], "7");
        assert_eq!(
            patch["metadata"]["labels"],
            json!({POOL: "cdn", "node-restriction.kubernetes.io/berth.runs.old": null})
        );
        assert_eq!(
            patch["spec"]["taints"],
            json!([other, {"key": "berth.io/pool", "value": "cdn", "effect": "NoSchedule"}])
        );
    }

    #[test]
    fn a_node_in_sync_gets_no_write() {
        let current = node(
            json!({POOL: "cdn"}),
            json!([{"key": "berth.io/pool", "value": "cdn", "effect": "NoSchedule", "timeAdded": null}]),
        );
        let wanted = desired(&[(POOL, "cdn")], Some("cdn"));
        assert!(in_sync(&current, &wanted));
        assert!(node_patch(&current, &wanted).is_none());
    }

    #[tokio::test]
    async fn a_node_write_is_one_merge_patch_by_berth_retried_on_fresh_data_after_a_conflict() {
        let (client, mut apiserver) = mock_apiserver();
        let (_leading, leader) = tokio::sync::watch::channel(true);
        let writes = Writes::new(
            std::sync::Arc::default(),
            leader,
            super::super::writes::Rates::all(100),
        );
        let current = node(json!({}), json!([]));
        let wanted = desired(&[(POOL, "cdn")], Some("cdn"));
        let server = tokio::spawn(async move {
            let (request, send) = apiserver.next_request().await.expect("a patch");
            assert_eq!(request.method(), "PATCH");
            assert_eq!(request.uri().path(), "/api/v1/nodes/n");
            assert_eq!(request.uri().query(), Some("&fieldManager=berth"));
            assert_eq!(
                request.headers()["content-type"],
                "application/merge-patch+json"
            );
            let patch = body(request).await;
            assert_eq!(patch["metadata"]["resourceVersion"], "7");
            assert_eq!(patch["metadata"]["labels"], json!({POOL: "cdn"}));
            let conflict = json!({"kind": "Status", "apiVersion": "v1", "status": "Failure",
                "reason": "Conflict", "code": 409, "message": "the object has been modified"});
            send.send_response(answer(409, conflict));

            let (request, send) = apiserver.next_request().await.expect("a read");
            assert_eq!(request.method(), "GET");
            assert_eq!(request.uri().path(), "/api/v1/nodes/n");
            let taint = json!({"key": "gpu", "effect": "NoSchedule"});
            send.send_response(answer(
                200,
                json!({"apiVersion": "v1", "kind": "Node",
                "metadata": {"name": "n", "resourceVersion": "8"},
                "spec": {"taints": [taint]}}),
            ));

            let (request, send) = apiserver.next_request().await.expect("a patch again");
            let patch = body(request).await;
            assert_eq!(patch["metadata"]["resourceVersion"], "8", "on fresh data");
            assert_eq!(
                patch["spec"]["taints"],
                json!([taint, {"key": "berth.io/pool", "value": "cdn", "effect": "NoSchedule"}]),
                "the taint added meanwhile is kept"
            );
            send.send_response(answer(
                200,
                json!({"apiVersion": "v1", "kind": "Node",
                "metadata": {"name": "n", "resourceVersion": "9"}}),
            ));
        });
        let written = write_node(&writes, &client, &current, &wanted)
            .await
            .unwrap();
        server.await.unwrap();
        assert!(written.labels && written.taints);
        assert_eq!(written.conflicts, 1);
    }

    #[tokio::test]
    async fn a_replica_without_the_lease_sends_nothing() {
        let (client, mut apiserver) = mock_apiserver();
        let (_leading, follower) = tokio::sync::watch::channel(false);
        let writes = Writes::new(
            std::sync::Arc::default(),
            follower,
            super::super::writes::Rates::all(100),
        );
        let current = node(json!({}), json!([]));
        let wanted = desired(&[(POOL, "cdn")], None);
        let result = write_node(&writes, &client, &current, &wanted).await;
        assert!(matches!(result, Err(Error::NotLeader)));
        drop(client);
        assert!(apiserver.next_request().await.is_none(), "no request sent");
    }
}
