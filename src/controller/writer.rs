//! Writes berth's part of a Node and nothing else.
//!
//! - Labels: server-side apply under field manager `berth`, so berth owns its keys
//!   and no one else's; a berth key someone else set is removed with a merge patch.
//! - Taints: `spec.taints` is an atomic list, so server-side apply would own the
//!   whole list. Instead: read, change only berth's entries, and write with the
//!   `resourceVersion` precondition, so a taint another owner adds in the meantime
//!   turns into a 409 and a retry on fresh data instead of being lost.
//! - No write at all when the node already carries what berth wants.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Node, Taint};
use kube::api::{Api, Patch, PatchParams};
use kube::{Client, ResourceExt};
use serde_json::json;

use super::desired::DesiredNode;
use crate::names::{FIELD_MANAGER, POOL_TAINT, is_owned_node_key};

/// How often a taint write is retried after a conflict.
const CONFLICT_RETRIES: usize = 5;

/// What one node write did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Written {
    pub labels: bool,
    pub taints: bool,
    /// 409s met and retried.
    pub conflicts: usize,
}

/// berth's labels on a node now.
pub fn berth_labels(node: &Node) -> BTreeMap<String, String> {
    node.labels()
        .iter()
        .filter(|(k, _)| is_owned_node_key(k))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect()
}

fn is_berth_taint(taint: &Taint) -> bool {
    taint.key == POOL_TAINT
}

/// berth's taints on a node now, without `timeAdded`, to compare with desired.
fn berth_taints(node: &Node) -> Vec<Taint> {
    taints(node)
        .iter()
        .filter(|t| is_berth_taint(t))
        .map(|t| Taint {
            time_added: None,
            ..t.clone()
        })
        .collect()
}

fn taints(node: &Node) -> &[Taint] {
    node.spec
        .as_ref()
        .and_then(|s| s.taints.as_deref())
        .unwrap_or_default()
}

/// Whether `node` already carries exactly what berth wants.
pub fn in_sync(node: &Node, desired: &DesiredNode) -> bool {
    berth_labels(node) == desired.labels && berth_taints(node) == desired.taints
}

/// Brings `node` to `desired`, writing only what differs.
pub async fn write_node(
    client: &Client,
    node: &Node,
    desired: &DesiredNode,
) -> kube::Result<Written> {
    let api: Api<Node> = Api::all(client.clone());
    let name = node.name_any();
    let mut written = Written::default();

    let mut current = node.clone();
    for attempt in 0..=CONFLICT_RETRIES {
        if berth_taints(&current) == desired.taints {
            break;
        }
        let mut next: Vec<Taint> = taints(&current)
            .iter()
            .filter(|t| !is_berth_taint(t))
            .cloned()
            .collect();
        next.extend(desired.taints.iter().cloned());
        let patch = json!({
            "metadata": {"resourceVersion": current.resource_version()},
            "spec": {"taints": next},
        });
        match api
            .patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
        {
            Ok(_) => {
                written.taints = true;
                break;
            }
            Err(kube::Error::Api(e)) if e.code == 409 && attempt < CONFLICT_RETRIES => {
                written.conflicts += 1;
                current = api.get(&name).await?;
            }
            Err(e) => return Err(e),
        }
    }

    let have = berth_labels(&current);
    if have != desired.labels {
        let strays: BTreeMap<&String, Option<()>> = have
            .keys()
            .filter(|k| !desired.labels.contains_key(*k))
            .map(|k| (k, None))
            .collect();
        if !strays.is_empty() {
            let patch = json!({"metadata": {"labels": strays}});
            api.patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
                .await?;
        }
        let apply = json!({
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {"name": name, "labels": desired.labels},
        });
        api.patch(
            &name,
            &PatchParams::apply(FIELD_MANAGER).force(),
            &Patch::Apply(&apply),
        )
        .await?;
        written.labels = true;
    }
    Ok(written)
}
