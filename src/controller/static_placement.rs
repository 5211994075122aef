//! The StaticPlacement writer: keeps the one `StaticPlacement` object, `berth`,
//! the params of the admission policies that place pods while berth is down
//! ([`crate::admission::static_cel`]), equal to the compile of the policies in
//! force and of the namespaces' image overrides ([`StaticPlacementSpec::compile`]).
//!
//! A task of its own, not a part of the nodes pass: the object is one, small, and
//! depends only on the policies and the namespaces; and its CRD may be missing (a
//! cluster upgraded without it), so a write that keeps failing must hold back
//! nothing else. It looks when a policy or a namespace changes (a burst of changes
//! is one look), at each resync and when this replica starts to lead, and writes
//! only when what it computes differs from what the object holds: a server-side
//! apply of the whole spec under field manager `berth`, forced (no one else owns
//! these fields), both lists written even when empty, since the CEL reads both.
//!
//! The object is not watched: what it holds is known from this task's last read
//! or write, and read again at each resync and each change of leadership, so one
//! changed or deleted by hand is put back within a resync. A failed read or write
//! is logged and looked at again as the one retry policy says ([`Error::retry`]),
//! computed anew from what holds then.

use std::sync::Arc;
use std::time::Duration;

use kube::api::{Api, ApiResource, DynamicObject, Patch, PatchParams};
use kube::{Client, Resource};
use serde_json::json;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use super::context::leadership_changed;
use super::error::{Error, Retry};
use super::wishes::until;
use super::writes::{Kind, WRITE_TIMEOUT, Writes};
use crate::cluster::Cluster;
use crate::names::{FIELD_MANAGER, IMAGES_ANNOTATION_PREFIX};
use crate::placement::namespace::NamespaceIndex;
use crate::placement::static_placement::{
    STATIC_PLACEMENT_NAME, StaticPlacement, StaticPlacementSpec,
};
use crate::policy::PolicySet;

/// Changes within this window after the first are looked at once.
const BATCH: Duration = Duration::from_millis(100);

/// What `StaticPlacement/berth` should hold: `policies` (the policies in force,
/// as the webhook reads them) compiled, with every value of a
/// `berth.io/images.<policy>` annotation on any of `namespaces`.
pub fn wanted(policies: &PolicySet, namespaces: &NamespaceIndex) -> StaticPlacementSpec {
    let overrides = namespaces.values().flat_map(|ns| {
        ns.annotations
            .iter()
            .filter(|(key, _)| key.starts_with(IMAGES_ANNOTATION_PREFIX))
            .map(|(_, value)| value.as_str())
    });
    StaticPlacementSpec::compile(policies, overrides)
}

/// Keeps `StaticPlacement/berth` as [`wanted`] says while this replica leads,
/// until `shutdown`.
pub async fn run(
    cluster: Arc<Cluster>,
    writes: Writes,
    resync: Duration,
    mut leadership: watch::Receiver<bool>,
    shutdown: CancellationToken,
) {
    let api = api(cluster.client());
    // What the object holds, as this replica last read or wrote it; `None`: read it.
    let mut held: Option<Option<StaticPlacementSpec>> = None;
    let mut retry: Option<tokio::time::Instant> = None;
    // The first tick is at once: the first look.
    let mut resync = tokio::time::interval(resync);
    loop {
        tokio::select! {
            () = shutdown.cancelled() => break,
            changed = leadership_changed(&mut leadership) => {
                if changed.is_none() {
                    break;
                }
                // Another replica may have written since.
                held = None;
            }
            () = cluster.wakes.placement.notified() => tokio::time::sleep(BATCH).await,
            () = until(retry) => retry = None,
            _ = resync.tick() => held = None,
        }
        if !*leadership.borrow() {
            continue;
        }
        let spec = wanted(&cluster.in_force().set, &cluster.namespaces());
        match bring(&api, &writes, held.take(), spec).await {
            Ok(now) => {
                held = Some(Some(now));
                retry = None;
            }
            Err(error) => match error.retry() {
                Retry::Never => {
                    tracing::debug!(%error, "cannot write StaticPlacement/berth; {}", Retry::Never)
                }
                then @ Retry::After(delay) => {
                    tracing::warn!(%error, "cannot write StaticPlacement/berth; {then}");
                    retry = Some(tokio::time::Instant::now() + delay);
                }
            },
        }
    }
}

/// The StaticPlacement objects, read whole as JSON: one whose spec berth cannot
/// read (written by hand) is one to write over, not an error.
fn api(client: &Client) -> Api<DynamicObject> {
    Api::all_with(client.clone(), &ApiResource::erase::<StaticPlacement>(&()))
}

/// Brings the object to `wanted`, from `held` (what it holds, `None` when absent),
/// read first when not known. Returns what it holds after.
async fn bring(
    api: &Api<DynamicObject>,
    writes: &Writes,
    held: Option<Option<StaticPlacementSpec>>,
    wanted: StaticPlacementSpec,
) -> Result<StaticPlacementSpec, Error> {
    let held = match held {
        Some(held) => held,
        None => read(api).await?,
    };
    if held.as_ref() == Some(&wanted) {
        return Ok(wanted);
    }
    let object = json!({
        "apiVersion": StaticPlacement::api_version(&()),
        "kind": StaticPlacement::kind(&()),
        "metadata": {"name": STATIC_PLACEMENT_NAME},
        "spec": wanted,
    });
    let params = PatchParams::apply(FIELD_MANAGER).force();
    let patch = Patch::Apply(&object);
    let apply = api.patch(STATIC_PLACEMENT_NAME, &params, &patch);
    writes.make(Kind::StaticPlacement, apply).await?;
    tracing::info!(
        policies = wanted.policies.len(),
        image_overrides = wanted.image_overrides.len(),
        "StaticPlacement/berth written"
    );
    Ok(wanted)
}

/// The object's spec; `None` when there is no object or its spec cannot be read.
async fn read(api: &Api<DynamicObject>) -> Result<Option<StaticPlacementSpec>, Error> {
    let found = tokio::time::timeout(WRITE_TIMEOUT, api.get_opt(STATIC_PLACEMENT_NAME))
        .await
        .map_err(|_| Error::Timeout(WRITE_TIMEOUT))??;
    Ok(found.and_then(|object| serde_json::from_value(object.data.get("spec")?.clone()).ok()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::controller::error::RETRY_FAILED;
    use crate::controller::mock::{answer, body, mock_apiserver};
    use crate::controller::writes::Rates;
    use crate::placement::namespace::NamespaceInfo;
    use crate::policy::compile::Labels;
    use crate::policy::test_policies;

    fn namespaces(annotations: &[(&str, &[(&str, &str)])]) -> NamespaceIndex {
        annotations
            .iter()
            .map(|(name, pairs)| {
                let annotations: Labels = pairs
                    .iter()
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .collect();
                let info = NamespaceInfo::with(name, Labels::new(), annotations);
                (name.to_string(), Arc::new(info))
            })
            .collect()
    }

    #[test]
    fn the_object_holds_every_policy_in_force_and_each_override_value_once() {
        let policies = test_policies(&[
            ("web", json!({"pool": {"nodeNames": ["n1"]}})),
            (
                "apart",
                json!({"avoid": {"matchLabels": {"app": "db"}}, "podSelector": {"matchLabels": {"app": "db"}}}),
            ),
        ]);
        let namespaces = namespaces(&[
            (
                "shop",
                &[("berth.io/images.web", "shop/*"), ("other.io/x", "y")],
            ),
            ("lab", &[("berth.io/images.apart", "shop/*")]),
            ("dev", &[("berth.io/images.web", "dev/*, lab/*")]),
        ]);
        let spec = wanted(&policies, &namespaces);
        let names: Vec<&str> = spec.policies.iter().map(|p| p.name.as_str()).collect();
        assert_eq!(names, ["apart", "web"], "sorted by name");
        assert_eq!(spec.policy("web").unwrap().webhook_only, None);
        assert!(spec.policy("web").unwrap().required_pool);
        assert_eq!(
            spec.policy("apart").unwrap().webhook_only.as_deref(),
            Some("avoid needs the cluster's state, which only the webhook sees")
        );
        let values: Vec<&str> = spec.image_overrides.keys().map(String::as_str).collect();
        assert_eq!(values, ["dev/*, lab/*", "shop/*"], "each value once");
        // Both lists are written, even empty: the CEL reads both.
        let empty = serde_json::to_value(wanted(&PolicySet::default(), &NamespaceIndex::new()));
        assert_eq!(
            empty.unwrap(),
            json!({"policies": [], "imageOverrides": {}})
        );
    }

    #[test]
    fn status_and_explain_name_the_admission_policy_as_it_is_made() {
        assert_eq!(
            crate::names::PLACEMENT_POLICY,
            crate::admission::static_cel::PLACEMENT_POLICY
        );
    }

    /// The object as the apiserver would answer a GET, holding `spec`.
    fn object(spec: &StaticPlacementSpec) -> serde_json::Value {
        json!({"apiVersion": "berth.io/v1alpha1", "kind": "StaticPlacement",
            "metadata": {"name": "berth", "resourceVersion": "3"}, "spec": spec})
    }

    #[tokio::test]
    async fn the_object_is_written_only_when_it_differs() {
        let (client, mut apiserver) = mock_apiserver();
        let (_leading, leader) = watch::channel(true);
        let writes = Writes::new(Arc::default(), leader, Rates::all(100));
        let api = api(&client);
        let policies = test_policies(&[("web", json!({"pool": {"nodeNames": ["n1"]}}))]);
        let spec = wanted(&policies, &NamespaceIndex::new());
        let path = "/apis/berth.io/v1alpha1/staticplacements/berth";

        // Known to hold it: no request at all.
        let known = bring(&api, &writes, Some(Some(spec.clone())), spec.clone());
        assert_eq!(known.await.unwrap(), spec);

        // Not known: read, and as wanted, so not written.
        let same = tokio::spawn({
            let (api, writes, spec) = (api.clone(), writes.clone(), spec.clone());
            async move { bring(&api, &writes, None, spec).await }
        });
        let (request, send) = apiserver.next_request().await.expect("a read");
        assert_eq!(
            (request.method().as_str(), request.uri().path()),
            ("GET", path)
        );
        send.send_response(answer(200, object(&spec)));
        assert_eq!(same.await.unwrap().unwrap(), spec);

        // Absent: applied whole, under berth's field manager, forced.
        let absent = tokio::spawn({
            let (api, writes, spec) = (api.clone(), writes.clone(), spec.clone());
            async move { bring(&api, &writes, None, spec).await }
        });
        let (request, send) = apiserver.next_request().await.expect("a read");
        assert_eq!(request.method(), "GET");
        send.send_response(answer(
            404,
            json!({"kind": "Status", "code": 404, "reason": "NotFound"}),
        ));
        let (request, send) = apiserver.next_request().await.expect("a write");
        assert_eq!(request.method(), "PATCH");
        assert_eq!(request.uri().path(), path);
        assert_eq!(
            request.uri().query(),
            Some("&force=true&fieldManager=berth")
        );
        assert_eq!(
            request.headers()["content-type"],
            "application/apply-patch+yaml"
        );
        assert_eq!(
            body(request).await,
            json!({"apiVersion": "berth.io/v1alpha1", "kind": "StaticPlacement",
                "metadata": {"name": "berth"}, "spec": spec})
        );
        send.send_response(answer(200, object(&spec)));
        assert_eq!(absent.await.unwrap().unwrap(), spec);

        // Holding an older compile (a policy since deleted): written over.
        let older = wanted(
            &test_policies(&[
                ("web", json!({"pool": {"nodeNames": ["n1"]}})),
                ("gone", json!({"pool": {"nodeNames": ["n2"]}})),
            ]),
            &NamespaceIndex::new(),
        );
        let stale = tokio::spawn({
            let (api, writes, spec) = (api.clone(), writes.clone(), spec.clone());
            async move { bring(&api, &writes, Some(Some(older)), spec).await }
        });
        let (request, send) = apiserver.next_request().await.expect("a write");
        assert_eq!(request.method(), "PATCH");
        send.send_response(answer(500, json!({"kind": "Status", "code": 500})));
        let failed = stale.await.unwrap().unwrap_err();
        assert_eq!(
            failed.retry(),
            Retry::After(RETRY_FAILED),
            "looked at again"
        );
        drop(api);
        drop(writes);
        drop(client);
        assert!(apiserver.next_request().await.is_none(), "no other request");
    }
}
