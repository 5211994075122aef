//! Cleaning up the objects berth creates for groups once nothing uses them: the
//! queue PriorityClasses `berth-queue-<policy>-<value>` no policy allows any more
//! ([`super::queues`] keeps the ones policies allow) and, in PodGroup mode, the
//! gangs' PodGroups. A class counts as used only by pods of namespaces that opt
//! into its policy: a namespace that names a class of a policy it does not opt into
//! (refused at admission by `berth-queues`, but possible before it) keeps nothing
//! alive.
//!
//! An object goes only when it is older than [`GRACE`] and no live pod used it at
//! this sweep or the one before: a class the webhook just made, or a group whose
//! pods are being replaced, survives.
//!
//! The nodes loop sweeps at each resync: it lists berth's objects and decides, and
//! hands what may go to the sweep writer ([`SweepWriter`]), which deletes it. A
//! delete that fails is left to the next sweep.

use std::collections::{BTreeMap, BTreeSet};
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::scheduling::v1::PriorityClass;
use k8s_openapi::api::scheduling::v1beta1::PodGroup;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, DeleteParams, ListParams, Preconditions};
use kube::{Client, Resource, ResourceExt};

use super::error::Error;
use super::wishes::{SweepWrites, Unused, Writer};
use super::writes::{Kind, Writes};
use crate::names::{FIELD_MANAGER, MANAGED_BY_LABEL, QUEUE_CLASS_PREFIX, queue_class_parts};
use crate::objects::PodObject;
use crate::policy::{OptIn, PolicySet};

/// How old an unused object must be before it is deleted.
pub const GRACE: Duration = Duration::from_secs(600);

/// What the last sweep found unused, by kind: an object is deleted only when two
/// sweeps in a row find it so.
#[derive(Debug, Default)]
pub struct Sweeper {
    unused_classes: BTreeSet<String>,
    unused_groups: BTreeSet<String>,
}

impl Sweeper {
    /// Hands to the sweep writer the queue PriorityClasses no policy allows (not in
    /// `wanted`) that no live pod of a namespace opting into their policy names,
    /// and with `pod_groups`, the PodGroups no live pod joins.
    pub async fn sweep(
        &mut self,
        deletes: &SweepWrites,
        client: &Client,
        pods: &[Arc<PodObject>],
        pod_groups: bool,
        wanted: &BTreeMap<String, i32>,
        (policies, opt_in): (&PolicySet, &(dyn OptIn + Sync)),
    ) {
        let live = || pods.iter().filter(|p| !p.is_terminated());
        let classes: BTreeSet<String> = live()
            .filter_map(|p| {
                let class = p.spec.priority_class_name.as_deref()?;
                let (policy, _) = queue_class_parts(class)?;
                let namespace = p.metadata.namespace.as_deref()?;
                opt_in
                    .opts_in(policies.get(policy)?, namespace)
                    .then(|| class.to_owned())
            })
            .collect();
        let api: Api<PriorityClass> = Api::all(client.clone());
        let found = list_ours(&api).await;
        let found = found.into_iter().filter(|c| {
            let name = c.name_any();
            name.starts_with(QUEUE_CLASS_PREFIX) && !wanted.contains_key(&name)
        });
        let name = |c: &PriorityClass| c.name_any();
        let unused = |c: &PriorityClass| Unused::Class(c.name_any());
        self.unused_classes =
            delete_unused(deletes, found, &classes, &self.unused_classes, name, unused);

        if !pod_groups {
            self.unused_groups.clear();
            return;
        }
        let groups: BTreeSet<String> = live()
            .filter_map(|p| {
                Some(format!(
                    "{}/{}",
                    p.metadata.namespace.as_deref()?,
                    p.pod_group_name()?
                ))
            })
            .collect();
        let found = list_ours(&Api::<PodGroup>::all(client.clone())).await;
        let namespace = |g: &PodGroup| g.namespace().unwrap_or_default();
        let key = |g: &PodGroup| format!("{}/{}", namespace(g), g.name_any());
        let unused = |g: &PodGroup| Unused::PodGroup((namespace(g), g.name_any()));
        self.unused_groups =
            delete_unused(deletes, found, &groups, &self.unused_groups, key, unused);
    }
}

/// The objects of `api` that carry berth's managed-by label; none on error.
async fn list_ours<K>(api: &Api<K>) -> Vec<K>
where
    K: Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    let params = ListParams::default().labels(&format!("{MANAGED_BY_LABEL}={FIELD_MANAGER}"));
    match api.list(&params).await {
        Ok(list) => list.items,
        Err(e) => {
            tracing::warn!(error = %e, "cannot list berth's objects to clean up; trying at the next resync");
            Vec::new()
        }
    }
}

/// Hands the objects [`unused`] picks to the sweep writer, each as `unused_as`
/// names it, with its uid; returns the keys unused now.
fn delete_unused<K>(
    deletes: &SweepWrites,
    found: impl IntoIterator<Item = K>,
    used: &BTreeSet<String>,
    unused_before: &BTreeSet<String>,
    key: impl Fn(&K) -> String,
    unused_as: impl Fn(&K) -> Unused,
) -> BTreeSet<String>
where
    K: Resource,
{
    let found: Vec<(String, K)> = found.into_iter().map(|o| (key(&o), o)).collect();
    let created = |o: &K| o.meta().creation_timestamp.as_ref().map(|t| t.0);
    let (doomed, unused_now) = unused(
        found.iter().map(|(k, o)| (k.as_str(), created(o))),
        used,
        unused_before,
        k8s_openapi::jiff::Timestamp::now(),
    );
    for (_, object) in found.iter().filter(|(k, _)| doomed.contains(k)) {
        deletes.want(unused_as(object), object.meta().uid.clone());
    }
    unused_now
}

/// What the sweep writer works with.
pub struct SweepWriter {
    pub writes: Writes,
    pub client: Client,
}

impl Writer for SweepWriter {
    type Key = Unused;
    type Wish = Option<String>;

    /// Deletes are rare and small.
    const CONCURRENCY: usize = 2;

    const WHAT: &'static str = "delete an object berth no longer needs";

    fn object(unused: &Unused) -> String {
        format!("{unused:?}")
    }

    /// Deletes the object, bound to its uid: a namesake made in the meantime stays.
    fn write(
        &self,
        unused: &Unused,
        uid: Option<String>,
    ) -> Option<impl Future<Output = Result<(), Error>> + Send + 'static> {
        let (writes, client, unused) = (self.writes.clone(), self.client.clone(), unused.clone());
        Some(async move {
            let params = DeleteParams {
                preconditions: Some(Preconditions {
                    uid,
                    resource_version: None,
                }),
                ..DeleteParams::default()
            };
            let deleted = match &unused {
                Unused::Class(name) => {
                    let api: Api<PriorityClass> = Api::all(client);
                    writes
                        .make(Kind::Sweep, api.delete(name, &params))
                        .await
                        .map(drop)
                }
                Unused::PodGroup((namespace, name)) => {
                    let api: Api<PodGroup> = Api::namespaced(client, namespace);
                    writes
                        .make(Kind::Sweep, api.delete(name, &params))
                        .await
                        .map(drop)
                }
            };
            match deleted {
                Ok(()) => tracing::info!(object = ?unused, "deleted, unused"),
                // Gone already, or a namesake made since (its uid differs): done.
                Err(e) if matches!(e.status(), Some(404 | 409)) => {}
                Err(e) => return Err(e),
            }
            Ok(())
        })
    }
}

/// Of the objects `found` (key, creation time): which to delete, and the keys
/// unused now. One goes when it is not `used` now, was not at the last sweep
/// either (`unused_before` holds what that sweep found unused), and is older than
/// [`GRACE`].
fn unused<'a>(
    found: impl IntoIterator<Item = (&'a str, Option<Timestamp>)>,
    used: &BTreeSet<String>,
    unused_before: &BTreeSet<String>,
    now: Timestamp,
) -> (BTreeSet<String>, BTreeSet<String>) {
    let mut doomed = BTreeSet::new();
    let mut unused = BTreeSet::new();
    for (key, created) in found.into_iter().filter(|(k, _)| !used.contains(*k)) {
        unused.insert(key.to_owned());
        let old_enough = created.is_some_and(|t| now.duration_since(t).unsigned_abs() >= GRACE);
        if old_enough && unused_before.contains(key) {
            doomed.insert(key.to_owned());
        }
    }
    (doomed, unused)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::controller::mock::{answer, body, mock_apiserver};
    use crate::controller::wishes;
    use crate::controller::writes::Rates;
    use serde_json::json;
    use tokio_util::sync::CancellationToken;

    #[tokio::test(start_paused = true)]
    async fn the_writer_deletes_what_the_sweep_hands_over_bound_to_its_uid() {
        let (client, mut apiserver) = mock_apiserver();
        let (_leading, leader) = tokio::sync::watch::channel(true);
        let metrics = Arc::new(crate::telemetry::Metrics::default());
        let deletes = Arc::new(SweepWrites::default());
        let writer = SweepWriter {
            writes: Writes::new(metrics.clone(), leader, Rates::all(100)),
            client,
        };
        let shutdown = CancellationToken::new();
        let (retried, mut retries) = tokio::sync::mpsc::unbounded_channel();
        let task = tokio::spawn(wishes::run(
            writer,
            deletes.clone(),
            move |unused: &Unused, uid| retried.send((unused.clone(), uid)).unwrap(),
            shutdown.clone(),
        ));
        deletes.want(Unused::Class("berth-queue-old-1".into()), Some("u1".into()));
        deletes.want(
            Unused::PodGroup(("ns".into(), "gang".into())),
            Some("u2".into()),
        );
        let mut seen = Vec::new();
        for _ in 0..2 {
            let (request, send) = apiserver.next_request().await.expect("a delete");
            assert_eq!(request.method(), "DELETE");
            let path = request.uri().path().to_owned();
            let params = body(request).await;
            send.send_response(answer(
                500,
                json!({"kind": "Status", "apiVersion": "v1", "status": "Failure", "code": 500}),
            ));
            seen.push((path, params["preconditions"]["uid"].clone()));
        }
        seen.sort_by(|a, b| a.0.cmp(&b.0));
        assert_eq!(
            seen,
            [
                (
                    "/apis/scheduling.k8s.io/v1/priorityclasses/berth-queue-old-1".to_string(),
                    json!("u1")
                ),
                (
                    "/apis/scheduling.k8s.io/v1beta1/namespaces/ns/podgroups/gang".to_string(),
                    json!("u2")
                ),
            ]
        );
        let failed_at = tokio::time::Instant::now();
        let mut handed_back = vec![retries.recv().await.unwrap(), retries.recv().await.unwrap()];
        assert!(failed_at.elapsed() >= crate::controller::error::RETRY_FAILED);
        handed_back.sort();
        assert_eq!(
            handed_back,
            [
                (Unused::Class("berth-queue-old-1".into()), Some("u1".into())),
                (
                    Unused::PodGroup(("ns".into(), "gang".into())),
                    Some("u2".into())
                ),
            ],
            "each failed delete is handed back with the uid it is bound to"
        );
        while deletes.writing_any(|_| true) {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        shutdown.cancel();
        task.await.unwrap();
        let failed = metrics
            .controller_writes
            .get_or_create(&crate::telemetry::WriteLabels {
                kind: "sweep".into(),
                outcome: "error".into(),
            })
            .get();
        assert_eq!(failed, 2, "each delete counted as a sweep write");
    }

    #[test]
    fn only_objects_unused_twice_and_past_the_grace_go() {
        let now: Timestamp = "2026-11-23T12:00:00Z".parse().unwrap();
        let long_ago: Timestamp = "2026-11-23T11:00:00Z".parse().unwrap();
        let just_now: Timestamp = "2026-11-23T11:59:00Z".parse().unwrap();
        let set = |keys: &[&str]| keys.iter().map(|k| k.to_string()).collect::<BTreeSet<_>>();
        let found = [
            ("in-use", Some(long_ago)),
            ("unused-twice", Some(long_ago)),
            ("unused-once", Some(long_ago)),
            ("new", Some(just_now)),
            ("undated", None),
        ];
        let (doomed, unused_now) = unused(
            found,
            &set(&["in-use"]),
            &set(&["unused-twice", "new", "undated", "in-use"]),
            now,
        );
        assert_eq!(doomed, set(&["unused-twice"]));
        assert_eq!(
            unused_now,
            set(&["unused-twice", "unused-once", "new", "undated"])
        );
    }
}
