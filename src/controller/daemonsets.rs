//! DaemonSets that predate a pool, brought in line (SPEC "The webhook": DaemonSet
//! pods). The webhook gives a DaemonSet's template the pool tolerations (and
//! exclusions) when the DaemonSet is created or updated; a log agent, a CNI or
//! kube-proxy created before the pool would otherwise never get a pod on its nodes
//! again once one is evicted or deleted.
//!
//! The controller patches such a template with the same patch the webhook makes
//! ([`template_drift`]). Each template change rolls the DaemonSet (its pods are
//! replaced as its `updateStrategy` says), so it writes only when a toleration or an
//! exclusion of a policy in force is missing or wrong, never to tidy up after a pool
//! that is gone.

use kube::api::{Api, Patch, PatchParams};
use kube::{Client, ResourceExt};
use serde_json::{Value, json};

use super::writes::{Error, Kind, Writes};
use crate::names::FIELD_MANAGER;
use crate::objects::{DaemonSetObject, NamespaceMeta};
use crate::placement::NamespaceInfo;
use crate::placement::daemonset::template_drift;
use crate::policy::PolicySet;
use crate::policy::exempt::Exempt;

/// The patch for `daemonset`, with a `resourceVersion` test first: a template
/// changed since the cache saw it is left for the next pass. The DaemonSets of
/// namespaces berth never sees are left alone, as the webhook leaves them.
pub fn daemonset_patch(
    daemonset: &DaemonSetObject,
    namespaces: &[std::sync::Arc<NamespaceMeta>],
    policies: &PolicySet,
    exempt: &Exempt,
) -> Option<Value> {
    let namespace = daemonset.namespace()?;
    if exempt.daemonsets_of(&namespace) {
        return None;
    }
    let meta = namespaces
        .iter()
        .find(|ns| ns.metadata.name.as_deref() == Some(namespace.as_str()))?;
    let info = NamespaceInfo::from_meta(&meta.metadata);
    let patch = template_drift(&daemonset.as_json(), policies, &info)?;
    let mut ops = vec![json!({"op": "test", "path": "/metadata/resourceVersion",
        "value": daemonset.resource_version()})];
    ops.extend(
        serde_json::to_value(&patch)
            .ok()?
            .as_array()?
            .iter()
            .cloned(),
    );
    Some(Value::Array(ops))
}

/// Applies `patch` to `daemonset`.
pub async fn write_daemonset(
    writes: &Writes,
    client: &Client,
    daemonset: &DaemonSetObject,
    patch: Value,
) -> Result<(), Error> {
    let namespace = daemonset.namespace().unwrap_or_default();
    let api: Api<DaemonSetObject> = Api::namespaced(client.clone(), &namespace);
    let patch: json_patch::Patch =
        serde_json::from_value(patch).map_err(kube::Error::SerdeError)?;
    let params = PatchParams {
        field_manager: Some(FIELD_MANAGER.into()),
        ..PatchParams::default()
    };
    writes
        .make(
            Kind::DaemonSet,
            api.patch(&daemonset.name_any(), &params, &Patch::<()>::Json(patch)),
        )
        .await?;
    tracing::info!(daemonset = %daemonset.name_any(), %namespace, "brought the DaemonSet's template in line with the pools");
    Ok(())
}
