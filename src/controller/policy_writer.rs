//! The policy writer: the task that writes PlacementPolicies' status, and takes
//! berth's finalizer off a deleted policy once its nodes are clean. The nodes
//! pass decides ([`super::status`]) and hands its wishes over
//! ([`super::wishes`]), so a slow or failing status write holds back neither the
//! pass nor any node.
//!
//! Each write starts from the policy as the cache holds it then: the finalizer is
//! taken from the finalizers the policy has then, under its resourceVersion; a
//! status already as wished, and any write to a policy gone, is not made. A
//! deleted policy gets no status.
//!
//! The one policy write the nodes pass makes itself is adding the finalizer
//! ([`add_finalizer`]): a policy acts on nodes only once it carries it, so the
//! pass that first sees a policy waits for that write and does the policy's node
//! work at once. Handed to the writer, it would wait for the watch to show the
//! finalizer and then for the next pass (5 s more for a new pool at 5,000
//! nodes, whose pass is paused twice its own length).

use std::future::Future;

use kube::api::{Api, Patch, PatchParams};
use kube::runtime::reflector::{ObjectRef, Store};
use kube::{Client, Resource, ResourceExt};
use serde::Deserialize;
use serde_json::json;

use super::error::Error;
use super::wishes::{Part, PolicyWish, Writer};
use super::writes::{Kind, Writes};
use crate::names::{FIELD_MANAGER, POLICY_FINALIZER};
use crate::objects::PolicyObject;
use crate::policy::crd::PlacementPolicyStatus;

/// `policy`'s status as berth writes it, if it has one berth can read.
pub fn current_status(policy: &PolicyObject) -> Option<PlacementPolicyStatus> {
    policy
        .status
        .as_ref()
        .and_then(|s| PlacementPolicyStatus::deserialize(s).ok())
}

/// Whether `policy` carries berth's finalizer.
pub fn finalized(policy: &PolicyObject) -> bool {
    policy.finalizers().iter().any(|f| f == POLICY_FINALIZER)
}

/// What the policy writer works with.
pub struct PolicyWriter {
    pub writes: Writes,
    pub client: Client,
    /// The cluster model's policies: each write starts from the policy as held there.
    pub policies: Store<PolicyObject>,
}

impl Writer for PolicyWriter {
    type Key = (String, Part);
    type Wish = PolicyWish;

    /// Policies are few, and each write is small.
    const CONCURRENCY: usize = 8;

    const WHAT: &'static str = "write the policy's status or finalizer";

    fn object((name, part): &(String, Part)) -> String {
        format!("{name} ({part:?})")
    }

    fn write(
        &self,
        (name, _): &(String, Part),
        wish: PolicyWish,
    ) -> Option<impl Future<Output = Result<(), Error>> + Send + 'static> {
        let policy = self.policies.get(&ObjectRef::new(name))?;
        let deleted = policy.meta().deletion_timestamp.is_some();
        let (kind, patch) = match wish {
            PolicyWish::RemoveFinalizer if deleted && finalized(&policy) => {
                let rest = policy
                    .finalizers()
                    .iter()
                    .filter(|f| *f != POLICY_FINALIZER)
                    .cloned()
                    .collect();
                (Kind::Finalizer, finalizers_patch(&policy, rest))
            }
            PolicyWish::Status(status)
                if !deleted && current_status(&policy).as_ref() != Some(&*status) =>
            {
                (Kind::PolicyStatus, json!({"status": status}))
            }
            _ => return None,
        };
        let (writes, client, name) = (self.writes.clone(), self.client.clone(), name.clone());
        Some(async move { write(&writes, &client, kind, &name, patch).await })
    }
}

/// Adds berth's finalizer to `policy` (live, without it), under its
/// resourceVersion.
pub async fn add_finalizer(
    writes: &Writes,
    client: &Client,
    policy: &PolicyObject,
) -> Result<(), Error> {
    let mut finalizers = policy.finalizers().to_vec();
    finalizers.push(POLICY_FINALIZER.into());
    let patch = finalizers_patch(policy, finalizers);
    write(writes, client, Kind::Finalizer, &policy.name_any(), patch).await
}

/// Merge-patches policy `name` (its status, for a status write) under berth's
/// field manager.
async fn write(
    writes: &Writes,
    client: &Client,
    kind: Kind,
    name: &str,
    patch: serde_json::Value,
) -> Result<(), Error> {
    let api: Api<PolicyObject> = Api::all(client.clone());
    let params = PatchParams {
        field_manager: Some(FIELD_MANAGER.into()),
        ..PatchParams::default()
    };
    let patch = Patch::Merge(&patch);
    match kind {
        Kind::PolicyStatus => {
            writes
                .make(kind, api.patch_status(name, &params, &patch))
                .await
        }
        _ => writes.make(kind, api.patch(name, &params, &patch)).await,
    }
    .map(drop)
}

/// A merge patch that sets `policy`'s finalizers, if its resourceVersion still
/// holds (a policy changed since the cache saw it answers 409, and is tried again
/// from its new version).
fn finalizers_patch(policy: &PolicyObject, finalizers: Vec<String>) -> serde_json::Value {
    json!({"metadata": {"finalizers": finalizers, "resourceVersion": policy.resource_version()}})
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::controller::mock::{answer, body, mock_apiserver};
    use crate::controller::wishes::PolicyWrites;
    use crate::controller::writes::Rates;
    use crate::controller::{error::RETRY_FAILED, wishes};
    use kube::runtime::watcher::Event;
    use std::sync::Arc;
    use tokio_util::sync::CancellationToken;

    fn policy(name: &str, finalizers: &[&str], deleted: bool, nodes: Option<i32>) -> PolicyObject {
        let mut metadata = json!({"name": name, "resourceVersion": "7", "finalizers": finalizers});
        if deleted {
            metadata["deletionTimestamp"] = json!("2026-11-26T00:00:00Z");
        }
        serde_json::from_value(json!({
            "apiVersion": "berth.io/v1alpha1", "kind": "PlacementPolicy",
            "metadata": metadata, "spec": {"pool": {"nodeNames": ["n"]}},
            "status": nodes.map(|n| json!({"nodes": n}))}))
        .unwrap()
    }

    fn status(nodes: i32) -> PolicyWish {
        PolicyWish::Status(Box::new(PlacementPolicyStatus {
            nodes: Some(nodes),
            ..PlacementPolicyStatus::default()
        }))
    }

    #[tokio::test(start_paused = true)]
    async fn finalizers_and_status_are_written_from_the_policy_as_cached() {
        let (client, mut apiserver) = mock_apiserver();
        let (_leading, leader) = tokio::sync::watch::channel(true);
        let (policies, mut feed) = kube::runtime::reflector::store::<PolicyObject>();
        for p in [
            policy("new", &["other.io/keep"], false, None),
            policy("done", &[POLICY_FINALIZER], false, Some(3)),
            policy(
                "deleted",
                &["other.io/keep", POLICY_FINALIZER],
                true,
                Some(3),
            ),
            policy("going", &[], true, None),
        ] {
            feed.apply_watcher_event(&Event::Apply(p));
        }
        let wishes = Arc::new(PolicyWrites::default());
        let writes = Writes::new(Arc::default(), leader, Rates::all(100));
        let writer = PolicyWriter {
            writes: writes.clone(),
            client: client.clone(),
            policies,
        };
        let (retried, mut retries) = tokio::sync::mpsc::unbounded_channel();
        let shutdown = CancellationToken::new();
        let task = tokio::spawn(wishes::run(
            writer,
            wishes.clone(),
            move |key: &(String, Part), _| retried.send(key.clone()).unwrap(),
            shutdown.clone(),
        ));
        let want = |name: &str, wish: PolicyWish| wishes.want((name.into(), wish.part()), wish);
        // Nothing to write: live, already as wished, deleted, not berth's, gone.
        want("done", PolicyWish::RemoveFinalizer);
        want("done", status(3));
        want("deleted", status(1));
        want("going", PolicyWish::RemoveFinalizer);
        want("gone", status(1));
        want("deleted", PolicyWish::RemoveFinalizer);
        want("new", status(2));

        let mut seen = Vec::new();
        for _ in 0..2 {
            let (request, send) = apiserver.next_request().await.expect("a write");
            assert_eq!(request.method(), "PATCH");
            assert_eq!(request.uri().query(), Some("&fieldManager=berth"));
            assert_eq!(
                request.headers()["content-type"],
                "application/merge-patch+json"
            );
            let path = request.uri().path().to_owned();
            let patch = body(request).await;
            if path.ends_with("/status") {
                send.send_response(answer(500, json!({"kind": "Status", "code": 500})));
            } else {
                send.send_response(answer(
                    200,
                    json!({"apiVersion": "berth.io/v1alpha1", "kind": "PlacementPolicy",
                        "metadata": {"name": "x", "resourceVersion": "8"}}),
                ));
            }
            seen.push((path, patch));
        }
        seen.sort_by(|a, b| a.0.cmp(&b.0));
        let base = "/apis/berth.io/v1alpha1/placementpolicies";
        assert_eq!(
            seen,
            [
                (
                    format!("{base}/deleted"),
                    json!({"metadata": {"finalizers": ["other.io/keep"], "resourceVersion": "7"}})
                ),
                (
                    format!("{base}/new/status"),
                    json!({"status": {"nodes": 2}})
                ),
            ]
        );
        let failed_at = tokio::time::Instant::now();
        assert_eq!(
            retries.recv().await.unwrap(),
            ("new".to_string(), Part::Status),
            "the failed status is handed back"
        );
        assert!(failed_at.elapsed() >= RETRY_FAILED);

        // The nodes pass adds the finalizer itself, keeping the others'.
        let new = policy("new", &["other.io/keep"], false, None);
        let adding = tokio::spawn(async move { add_finalizer(&writes, &client, &new).await });
        let (request, send) = apiserver.next_request().await.expect("a write");
        assert_eq!(request.method(), "PATCH");
        assert_eq!(request.uri().path(), format!("{base}/new"));
        assert_eq!(
            body(request).await,
            json!({"metadata": {"finalizers": ["other.io/keep", POLICY_FINALIZER], "resourceVersion": "7"}})
        );
        send.send_response(answer(
            200,
            json!({"apiVersion": "berth.io/v1alpha1", "kind": "PlacementPolicy",
                "metadata": {"name": "new", "resourceVersion": "8"}}),
        ));
        adding.await.unwrap().unwrap();
        shutdown.cancel();
        task.await.unwrap();
        assert!(apiserver.next_request().await.is_none(), "no other write");
    }
}
