//! Whether the apiserver reaches berth's webhook now, asked of the apiserver
//! itself: a server-side dry-run create of a PlacementPolicy that carries
//! [`WEBHOOK_PROBE_ANNOTATION`]. `/validate` refuses every such policy with
//! [`WEBHOOK_PROBE_ANSWER`], so the refusal comes back only through the whole
//! path a pod's review takes (the webhook configurations, the Service and its
//! ready endpoints, TLS and the apiserver's client certificate). With the webhook
//! unreachable the apiserver ignores it (`failurePolicy: Ignore`) and the dry run
//! succeeds; nothing is stored either way.
//!
//! The missed scan evicts only after a probe answered: a pod recreated while the
//! webhook cannot be reached is admitted without berth again, and would be
//! evicted for nothing (after every berth replica restarts, the leader may act
//! before the Service has a ready endpoint).

use kube::api::{Api, DynamicObject, PostParams};
use kube::core::{ApiResource, GroupVersionKind};
use kube::{Client, Error};
use serde_json::json;

use crate::names::{GROUP, WEBHOOK_PROBE_ANNOTATION, WEBHOOK_PROBE_ANSWER};

/// Whether the webhook answered a probe now.
pub async fn answers(client: &Client) -> bool {
    let resource =
        ApiResource::from_gvk(&GroupVersionKind::gvk(GROUP, "v1alpha1", "PlacementPolicy"));
    let api: Api<DynamicObject> = Api::all_with(client.clone(), &resource);
    let probe: DynamicObject = match serde_json::from_value(json!({
        "apiVersion": format!("{GROUP}/v1alpha1"),
        "kind": "PlacementPolicy",
        "metadata": {
            "generateName": "berth-webhook-probe-",
            "annotations": {WEBHOOK_PROBE_ANNOTATION: "dry run"},
        },
        // The least a policy may be: the schema wants it to grant something.
        "spec": {"images": ["berth-webhook-probe"], "schedulerName": "berth-webhook-probe"},
    })) {
        Ok(probe) => probe,
        Err(_) => return false,
    };
    let dry_run = PostParams {
        dry_run: true,
        field_manager: Some(crate::names::FIELD_MANAGER.to_owned()),
    };
    let answer = tokio::time::timeout(
        std::time::Duration::from_secs(10),
        api.create(&dry_run, &probe),
    )
    .await;
    match answer {
        Ok(Err(Error::Api(status))) if heard(&status.message) => true,
        Ok(Err(Error::Api(status))) => {
            tracing::warn!(message = %status.message, "the webhook probe was refused by another");
            false
        }
        Ok(Ok(_)) => {
            tracing::info!(
                "the webhook probe was admitted without berth: the apiserver does not reach berth's webhook yet"
            );
            false
        }
        Ok(Err(e)) => {
            tracing::warn!(error = %e, "cannot probe the webhook path");
            false
        }
        Err(_) => {
            tracing::warn!("the webhook probe took longer than 10 s");
            false
        }
    }
}

/// Whether an apiserver's refusal is berth's answer to a probe.
fn heard(message: &str) -> bool {
    message.contains(WEBHOOK_PROBE_ANSWER)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_berths_refusal_is_an_answer() {
        assert!(heard(
            "admission webhook \"placementpolicies.validate.berth.io\" denied the request: berth's webhook answers"
        ));
        assert!(!heard(
            "placementpolicies.berth.io is forbidden: User cannot create"
        ));
        assert!(!heard(""));
    }
}
