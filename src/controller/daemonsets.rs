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
//!
//! The nodes pass finds the DaemonSets that drift and hands them to the DaemonSet
//! writer ([`super::wishes`]), which works out the patch again from the DaemonSet,
//! the namespaces and the policies as they are when it writes.

use std::future::Future;
use std::sync::Arc;

use json_patch::Patch;
use kube::api::{Api, PatchParams};
use kube::runtime::reflector::ObjectRef;
use kube::{Client, ResourceExt};
use serde_json::json;

use super::error::Error;
use super::wishes::Writer;
use super::writes::{Kind, Writes};
use crate::cluster::Cluster;
use crate::names::FIELD_MANAGER;
use crate::objects::{DaemonSetObject, NamespaceMeta};
use crate::placement::daemonset::template_drift;
use crate::placement::namespace::NamespaceInfo;
use crate::placement::patch as ops;
use crate::policy::PolicySet;
use crate::policy::exempt::Exempt;
use crate::telemetry::Metrics;

/// What the DaemonSet writer works with.
pub struct DaemonSetWriter {
    pub writes: Writes,
    pub client: Client,
    pub cluster: Arc<Cluster>,
    pub exempt: Exempt,
    pub metrics: Arc<Metrics>,
}

impl Writer for DaemonSetWriter {
    type Key = ObjectRef<DaemonSetObject>;
    type Wish = ();

    /// Each write rolls a DaemonSet: one at a time.
    const CONCURRENCY: usize = 1;

    const WHAT: &'static str = "write the DaemonSet's template";

    fn object(key: &ObjectRef<DaemonSetObject>) -> String {
        key.to_string()
    }

    fn write(
        &self,
        key: &ObjectRef<DaemonSetObject>,
        (): (),
    ) -> Option<impl Future<Output = Result<(), Error>> + Send + 'static> {
        let daemonset = self.cluster.stores.daemonsets.get(key)?;
        let patch = daemonset_patch(
            &daemonset,
            &self.cluster.stores.namespaces.state(),
            &self.cluster.in_force().set,
            &self.exempt,
        )?;
        let (writes, client) = (self.writes.clone(), self.client.clone());
        let metrics = self.metrics.clone();
        Some(async move {
            write_daemonset(&writes, &client, &daemonset, patch).await?;
            metrics.daemonset_updates.inc();
            Ok(())
        })
    }
}

/// The patch for `daemonset`, with a `resourceVersion` test first: a template
/// changed since the cache saw it is left for the next pass. The DaemonSets of
/// namespaces berth never sees are left alone, as the webhook leaves them.
pub fn daemonset_patch(
    daemonset: &DaemonSetObject,
    namespaces: &[std::sync::Arc<NamespaceMeta>],
    policies: &PolicySet,
    exempt: &Exempt,
) -> Option<Patch> {
    let namespace = daemonset.namespace()?;
    if exempt.daemonsets_of(&namespace) {
        return None;
    }
    let meta = namespaces
        .iter()
        .find(|ns| ns.metadata.name.as_deref() == Some(namespace.as_str()))?;
    let info = NamespaceInfo::from_meta(&meta.metadata);
    let drift = template_drift(daemonset.template(), policies, &info)?;
    let version = ops::test(
        &["metadata", "resourceVersion"],
        json!(daemonset.resource_version()),
    );
    Some(Patch(std::iter::once(version).chain(drift.0).collect()))
}

/// Applies `patch` to `daemonset`.
pub async fn write_daemonset(
    writes: &Writes,
    client: &Client,
    daemonset: &DaemonSetObject,
    patch: Patch,
) -> Result<(), Error> {
    let namespace = daemonset.namespace().unwrap_or_default();
    let api: Api<DaemonSetObject> = Api::namespaced(client.clone(), &namespace);
    let params = PatchParams {
        field_manager: Some(FIELD_MANAGER.into()),
        ..PatchParams::default()
    };
    writes
        .make(
            Kind::DaemonSet,
            api.patch(
                &daemonset.name_any(),
                &params,
                &kube::api::Patch::<()>::Json(patch),
            ),
        )
        .await?;
    tracing::info!(daemonset = %daemonset.name_any(), %namespace, "brought the DaemonSet's template in line with the pools");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::controller::mock::{answer, body, mock_apiserver};
    use crate::controller::writes::Rates;
    use crate::policy::test_policies as policies;
    use serde_json::Value;
    use std::sync::Arc;

    fn namespace(name: &str) -> Arc<NamespaceMeta> {
        Arc::new(serde_json::from_value(json!({"metadata": {"name": name}})).unwrap())
    }

    fn agent(namespace: &str) -> DaemonSetObject {
        serde_json::from_value(json!({
            "metadata": {"name": "agent", "namespace": namespace, "resourceVersion": "41"},
            "spec": {"template": {"spec": {"containers": [{"name": "c", "image": "agent"}]}}}}))
        .unwrap()
    }

    #[tokio::test]
    async fn a_template_is_patched_under_a_resource_version_test_by_berth() {
        let set = policies(&[("cdn", json!({"pool": {"nodeNames": ["node2"]}}))]);
        let namespaces = [namespace("kube-system"), namespace("berth-system")];
        let exempt = Exempt::shipped();
        assert!(
            daemonset_patch(&agent("berth-system"), &namespaces, &set, &exempt).is_none(),
            "berth's own namespace is left alone"
        );
        // kube-proxy and the CNI must run on the pool's nodes too.
        let daemonset = agent("kube-system");
        let patch = daemonset_patch(&daemonset, &namespaces, &set, &exempt).expect("drift");

        let (client, mut apiserver) = mock_apiserver();
        let (_leading, leader) = tokio::sync::watch::channel(true);
        let writes = Writes::new(Arc::default(), leader, Rates::all(100));
        let server = tokio::spawn(async move {
            let (request, send) = apiserver.next_request().await.expect("a patch");
            assert_eq!(request.method(), "PATCH");
            assert_eq!(
                request.uri().path(),
                "/apis/apps/v1/namespaces/kube-system/daemonsets/agent"
            );
            assert_eq!(request.uri().query(), Some("&fieldManager=berth"));
            assert_eq!(
                request.headers()["content-type"],
                "application/json-patch+json"
            );
            let ops = body(request).await;
            assert_eq!(
                ops[0],
                json!({"op": "test", "path": "/metadata/resourceVersion", "value": "41"}),
                "a template changed since the cache saw it is left alone"
            );
            let tolerations: Vec<&Value> = ops.as_array().unwrap()[1..]
                .iter()
                .filter(|op| op["path"].as_str().unwrap().contains("tolerations"))
                .collect();
            assert!(!tolerations.is_empty(), "the pool's toleration: {ops}");
            send.send_response(answer(
                200,
                json!({"apiVersion": "apps/v1", "kind": "DaemonSet",
                    "metadata": {"name": "agent", "namespace": "kube-system", "resourceVersion": "42"}}),
            ));
        });
        write_daemonset(&writes, &client, &daemonset, patch)
            .await
            .unwrap();
        server.await.unwrap();
    }
}
