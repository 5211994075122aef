//! Native gang scheduling (SPEC "Groups", PodGroup mode): where the apiserver serves
//! `scheduling.k8s.io/v1beta1` PodGroups (the `GenericWorkload` feature), the webhook
//! puts each gang member in its group (`spec.schedulingGroup`) and the controller
//! keeps one PodGroup per group with `minCount`, so kube-scheduler itself places
//! the group all at once or not at all.
//!
//! The releases loop works out which PodGroups the gangs need ([`PodGroups::keep`])
//! and hands them to the PodGroup writer ([`super::wishes`]), which looks each one
//! up and makes or puts it right: a pass never waits for those reads and writes,
//! and with them neither does a release.

use std::collections::{BTreeMap, BTreeSet};
use std::future::Future;
use std::sync::{Arc, Mutex};

use k8s_openapi::api::scheduling::v1beta1::{
    GangSchedulingPolicy, PodGroup, PodGroupSchedulingPolicy, PodGroupSpec,
};
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use kube::runtime::events::EventType;
use kube::{Client, Resource};
use serde_json::json;

use super::context::{Pass, Snapshot};
use super::error::Error;
use super::events::{Events, event};
use super::wishes::locked;
use super::wishes::{GroupKey, GroupWish, Writer};
use super::writes::{Kind, Writes};
use crate::names::{FIELD_MANAGER, owned_metadata};
use crate::objects::PodObject;
use crate::placement::opt_in::pod_entitlements;

pub use crate::cluster::groups::POD_GROUP_API;

/// The PodGroups made sure of since the last resync: each is checked once, not on
/// every pass; a resync checks them all again. The writer adds to it, the loop
/// reads and forgets it.
#[derive(Debug, Default, Clone)]
pub struct PodGroups {
    known: Arc<Mutex<BTreeSet<GroupKey>>>,
}

/// What berth's PodGroup of a gang holds, as the controller finds it.
#[derive(Debug, PartialEq, Eq)]
enum Found {
    /// What berth made: a gang of the group's `minCount` and the members' class.
    Kept,
    /// Only `minCount` differs; it may be changed in place.
    MinCount,
    /// Something that cannot be changed after creation differs (the reason): the
    /// PodGroup was made by someone else, and is deleted so that berth makes it
    /// anew once Kubernetes lets it go (after the pods that name it).
    Foreign(String),
}

/// Compares a PodGroup with what berth wants of it: a gang of `min_count`, with
/// the priority class `class`, and nothing else set that would change how its
/// members are placed.
fn compare(spec: &PodGroupSpec, min_count: u32, class: Option<&str>) -> Found {
    let policy = &spec.scheduling_policy;
    let foreign = if policy.basic.is_some() || policy.gang.is_none() {
        Some("it is not a gang")
    } else if spec.priority_class_name.as_deref() != class {
        Some("it has another priority class")
    } else if spec.workload_ref.is_some() || spec.parent_composite_pod_group_name.is_some() {
        Some("it belongs to a workload")
    } else if spec.scheduling_constraints.is_some()
        || spec.resource_claims.as_ref().is_some_and(|c| !c.is_empty())
        || spec
            .disruption_mode
            .as_ref()
            .is_some_and(|m| m.all.is_some())
    {
        Some("it has constraints, claims or a disruption mode berth never sets")
    } else {
        None
    };
    match (foreign, &policy.gang) {
        (Some(why), _) => Found::Foreign(why.into()),
        (None, Some(gang)) if gang.min_count != min_count as i32 => Found::MinCount,
        _ => Found::Kept,
    }
}

impl PodGroups {
    /// Forgets what it made sure of, so a PodGroup deleted or changed by hand is
    /// put right.
    pub fn forget(&self) {
        locked(&self.known).clear();
    }

    fn knows(&self, key: &GroupKey) -> bool {
        locked(&self.known).contains(key)
    }

    /// Keeps the PodGroup of every group whose members the webhook joined to one
    /// (`spec.schedulingGroup`) under a gang policy their namespace opts into:
    /// `minCount` is the group's `minAvailable`, its priority the members' class.
    /// Pods may come before their PodGroup; kube-scheduler holds them until it
    /// exists. A PodGroup of berth's name that says anything else was written by
    /// someone else (the admission policy `berth-podgroups` keeps tenants from
    /// it): its `minCount` is put back, or, where Kubernetes allows no change, it
    /// is deleted and made again. PodGroups are left to Kubernetes' own protection
    /// once their pods are gone.
    pub fn keep(&self, pass: &Pass<'_>, pods: &[Arc<PodObject>], snapshot: &Snapshot) {
        for (key, wish) in wanted(pods, snapshot) {
            if self.knows(&key) {
                pass.pod_group_writes.settled(&key);
            } else {
                pass.pod_group_writes.want(key, wish);
            }
        }
    }
}

/// What the PodGroup writer works with.
pub struct PodGroupWriter {
    pub writes: Writes,
    pub client: Client,
    pub events: Events,
    /// Shared with the releases loop: the writer notes each PodGroup it found or
    /// made as berth's.
    pub known: PodGroups,
}

impl Writer for PodGroupWriter {
    type Key = GroupKey;
    type Wish = GroupWish;

    /// A look-up and a write each; gangs are few.
    const CONCURRENCY: usize = 4;

    const WHAT: &'static str = "keep a gang's PodGroup";

    fn object((namespace, name): &GroupKey) -> String {
        format!("{namespace}/{name}")
    }

    fn write(
        &self,
        key: &GroupKey,
        wish: GroupWish,
    ) -> Option<impl Future<Output = Result<(), Error>> + Send + 'static> {
        if self.known.knows(key) {
            return None;
        }
        let (writes, events, known) =
            (self.writes.clone(), self.events.clone(), self.known.clone());
        let api: Api<PodGroup> = Api::namespaced(self.client.clone(), &key.0);
        let key = key.clone();
        Some(async move {
            let name = &key.1;
            let result = match api.get_opt(name).await {
                Ok(None) => create(&writes, &api, name, &wish).await,
                Ok(Some(found)) => {
                    let verdict = compare(&found.spec, wish.min_count, wish.class.as_deref());
                    put_right(&writes, &events, &api, &found, verdict, wish.min_count).await
                }
                Err(e) => Err(e.into()),
            };
            // Made meanwhile, or being deleted (false): looked at on the next pass.
            if result? {
                locked(&known.known).insert(key);
            }
            Ok(())
        })
    }
}

/// The PodGroups the gangs need, by namespace and name: `minCount` and class.
fn wanted(pods: &[Arc<PodObject>], snapshot: &Snapshot) -> BTreeMap<GroupKey, GroupWish> {
    let mut wanted: BTreeMap<GroupKey, GroupWish> = BTreeMap::new();
    for pod in pods.iter().filter(|p| !p.is_terminated()) {
        let Some(group) = pod.pod_group_name() else {
            continue;
        };
        let meta = &pod.metadata;
        let namespace = meta.namespace.clone().unwrap_or_default();
        let member = pod_entitlements(pod, &snapshot.compiled.set, &*snapshot.namespaces)
            .into_iter()
            .find_map(|p| {
                let member = p.spec.gang.as_ref()?.member(meta.labels.as_ref()?).ok()??;
                (member.pod_group_name(&p.name) == group).then_some(member)
            });
        let Some(member) = member else { continue };
        let entry = wanted
            .entry((namespace, group.to_owned()))
            .or_insert(GroupWish {
                min_count: 0,
                class: pod.spec.priority_class_name.clone(),
            });
        entry.min_count = entry.min_count.max(member.min_available);
    }
    wanted
}

/// Creates a PodGroup; true once it exists.
async fn create(
    writes: &Writes,
    api: &Api<PodGroup>,
    name: &str,
    wish: &GroupWish,
) -> Result<bool, Error> {
    let params = PostParams {
        field_manager: Some(FIELD_MANAGER.into()),
        ..PostParams::default()
    };
    let group = pod_group(name, wish.min_count, wish.class.clone());
    match writes
        .make(Kind::PodGroup, api.create(&params, &group))
        .await
    {
        Ok(_) => {
            tracing::info!(name, min_count = wish.min_count, "PodGroup created");
            Ok(true)
        }
        // Made meanwhile: checked on the next pass.
        Err(e) if e.is_conflict() => Ok(false),
        Err(e) => Err(e),
    }
}

/// Puts a found PodGroup right, with a Warning Event on it; true when it is
/// berth's as it stands.
async fn put_right(
    writes: &Writes,
    events: &Events,
    api: &Api<PodGroup>,
    found: &PodGroup,
    verdict: Found,
    min_count: u32,
) -> Result<bool, Error> {
    let name = found.metadata.name.clone().unwrap_or_default();
    let (note, kept) = match verdict {
        Found::Kept => return Ok(true),
        // Being deleted (by berth or anyone): made again once it is gone.
        Found::Foreign(_) if found.metadata.deletion_timestamp.is_some() => return Ok(false),
        Found::MinCount => {
            let patch = json!({"spec": {"schedulingPolicy": {"gang": {"minCount": min_count}}}});
            let params = PatchParams::apply(FIELD_MANAGER);
            writes
                .make(
                    Kind::PodGroup,
                    api.patch(&name, &params, &Patch::Merge(&patch)),
                )
                .await?;
            (
                format!("minCount was changed by someone else; set back to {min_count}"),
                true,
            )
        }
        Found::Foreign(why) => {
            writes
                .make(Kind::PodGroup, api.delete(&name, &DeleteParams::default()))
                .await?;
            (
                format!(
                    "{why}: not as berth made it, so deleted; berth makes it again once it is gone"
                ),
                false,
            )
        }
    };
    tracing::warn!(namespace = ?found.metadata.namespace, %name, %note, "PodGroup put right");
    // Each write is its own cause: one Event, sent at once.
    let event = event(EventType::Warning, "PodGroupTampered", "Restore", note);
    if !events.send(event, &found.object_ref(&())) {
        tracing::debug!(%name, "event queue full; the PodGroup's Event is dropped");
    }
    Ok(kept)
}

/// A gang PodGroup berth keeps.
fn pod_group(name: &str, min_count: u32, class: Option<String>) -> PodGroup {
    PodGroup {
        metadata: owned_metadata(name),
        spec: PodGroupSpec {
            scheduling_policy: PodGroupSchedulingPolicy {
                gang: Some(GangSchedulingPolicy {
                    min_count: min_count as i32,
                }),
                ..Default::default()
            },
            priority_class_name: class,
            ..Default::default()
        },
        status: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::controller::wishes::PodGroupWrites;

    use crate::controller::mock::{answer, body, mock_apiserver};
    use crate::controller::wishes;
    use crate::controller::writes::Rates;
    use tokio_util::sync::CancellationToken;

    #[tokio::test]
    async fn the_writer_makes_a_missing_pod_group_and_puts_back_a_changed_min_count() {
        let (client, mut apiserver) = mock_apiserver();
        let (_leading, leader) = tokio::sync::watch::channel(true);
        let (recorder_client, _events) = mock_apiserver();
        let recorder = kube::runtime::events::Recorder::new(recorder_client, "berth".into());
        let known = PodGroups::default();
        let writer = PodGroupWriter {
            writes: Writes::new(Arc::default(), leader, Rates::all(100)),
            client,
            events: Events::start(recorder),
            known: known.clone(),
        };
        let wishes = Arc::new(PodGroupWrites::default());
        let shutdown = CancellationToken::new();
        let task = tokio::spawn(wishes::run(
            writer,
            wishes.clone(),
            |_: &GroupKey, _| panic!("nothing fails"),
            shutdown.clone(),
        ));
        let path = "/apis/scheduling.k8s.io/v1beta1/namespaces/jobs/podgroups";
        let wish = |min_count| GroupWish {
            min_count,
            class: Some("berth-queue-jobs-3".into()),
        };
        let key = |name: &str| ("jobs".to_string(), name.to_string());

        wishes.want(key("berth-a"), wish(3));
        let (request, send) = apiserver.next_request().await.unwrap();
        assert_eq!(
            (request.method().as_str(), request.uri().path()),
            ("GET", &*format!("{path}/berth-a"))
        );
        send.send_response(answer(
            404,
            json!({"kind": "Status", "code": 404, "reason": "NotFound"}),
        ));
        let (request, send) = apiserver.next_request().await.unwrap();
        assert_eq!(
            (request.method().as_str(), request.uri().path()),
            ("POST", path)
        );
        assert_eq!(request.uri().query(), Some("&fieldManager=berth"));
        let made = body(request).await;
        assert_eq!(made["spec"]["schedulingPolicy"]["gang"]["minCount"], 3);
        assert_eq!(made["spec"]["priorityClassName"], "berth-queue-jobs-3");
        send.send_response(answer(201, made));

        // Someone set minCount to 1: put back, under berth's field manager.
        let mut changed =
            serde_json::to_value(pod_group("berth-b", 1, Some("berth-queue-jobs-3".into())))
                .unwrap();
        changed["metadata"]["namespace"] = json!("jobs");
        wishes.want(key("berth-b"), wish(3));
        let (request, send) = apiserver.next_request().await.unwrap();
        assert_eq!(
            (request.method().as_str(), request.uri().path()),
            ("GET", &*format!("{path}/berth-b"))
        );
        send.send_response(answer(200, changed.clone()));
        let (request, send) = apiserver.next_request().await.unwrap();
        assert_eq!(
            (request.method().as_str(), request.uri().path()),
            ("PATCH", &*format!("{path}/berth-b"))
        );
        assert!(
            request
                .uri()
                .query()
                .unwrap()
                .contains("fieldManager=berth")
        );
        assert_eq!(
            body(request).await,
            json!({"spec": {"schedulingPolicy": {"gang": {"minCount": 3}}}})
        );
        send.send_response(answer(200, changed));

        // Both are berth's now: asked again, nothing is read or written.
        for _ in 0..100 {
            if known.knows(&key("berth-a")) && known.knows(&key("berth-b")) {
                break;
            }
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
        assert!(known.knows(&key("berth-a")) && known.knows(&key("berth-b")));
        wishes.want(key("berth-a"), wish(3));
        wishes.want(key("berth-b"), wish(3));
        shutdown.cancel();
        task.await.unwrap();
        assert!(apiserver.next_request().await.is_none(), "no other request");
    }

    #[test]
    fn a_pod_group_is_berths_only_as_berth_made_it() {
        let made = pod_group("berth-g", 3, Some("berth-queue-jobs-3".into())).spec;
        assert_eq!(compare(&made, 3, Some("berth-queue-jobs-3")), Found::Kept);
        assert_eq!(
            compare(&made, 4, Some("berth-queue-jobs-3")),
            Found::MinCount
        );
        assert!(matches!(compare(&made, 3, None), Found::Foreign(_)));
        let mut basic = made.clone();
        basic.scheduling_policy = PodGroupSchedulingPolicy {
            basic: Some(Default::default()),
            gang: None,
        };
        assert!(
            matches!(compare(&basic, 3, Some("berth-queue-jobs-3")), Found::Foreign(w) if w.contains("gang"))
        );
        let mut all = made.clone();
        all.disruption_mode = Some(k8s_openapi::api::scheduling::v1beta1::DisruptionMode {
            all: Some(Default::default()),
            single: None,
        });
        assert!(matches!(
            compare(&all, 3, Some("berth-queue-jobs-3")),
            Found::Foreign(_)
        ));
    }
}
