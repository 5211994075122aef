//! Native gang scheduling (SPEC "Groups", PodGroup mode): where the apiserver serves
//! `scheduling.k8s.io/v1beta1` PodGroups (the `GenericWorkload` feature), the webhook
//! puts each gang member in its group (`spec.schedulingGroup`) and the controller
//! keeps one PodGroup per group with `minCount`, so kube-scheduler itself places
//! the group all at once or not at all.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use k8s_openapi::api::scheduling::v1beta1::{
    GangSchedulingPolicy, PodGroup, PodGroupSchedulingPolicy, PodGroupSpec,
};
use kube::Resource;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use kube::runtime::events::EventType;
use serde_json::json;

use super::context::Pass;
use super::context::Snapshot;
use super::events::{Reported, event};
use super::writes::{self, Kind};
use crate::names::{FIELD_MANAGER, owned_metadata};
use crate::objects::PodObject;
use crate::placement::opt_in::pod_entitlements;

pub use crate::cluster::groups::POD_GROUP_API;

/// The PodGroups this controller has made sure of since the last resync: each is
/// checked once, not on every pass; a resync checks them all again.
#[derive(Debug, Default)]
pub struct PodGroups {
    known: BTreeSet<(String, String)>,
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
    pub fn forget(&mut self) {
        self.known.clear();
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
    pub async fn keep(
        &mut self,
        pass: &Pass<'_>,
        pods: &[Arc<PodObject>],
        snapshot: &Snapshot,
        reported: &mut Reported,
    ) {
        for ((namespace, name), (min_count, class)) in wanted(pods, snapshot) {
            let key = (namespace.clone(), name.clone());
            if self.known.contains(&key) {
                continue;
            }
            let api: Api<PodGroup> = Api::namespaced(pass.client.clone(), &namespace);
            let result = match api.get_opt(&name).await {
                Ok(None) => create(pass, &api, &name, min_count, class).await,
                Ok(Some(found)) => {
                    let verdict = compare(&found.spec, min_count, class.as_deref());
                    put_right(pass, &api, &found, verdict, min_count, reported).await
                }
                Err(e) => Err(e.into()),
            };
            match result {
                Ok(true) => {
                    self.known.insert(key);
                }
                Ok(false) => {}
                Err(e) => {
                    tracing::warn!(%namespace, %name, error = %e, "cannot keep the PodGroup; retrying on the next pass")
                }
            }
        }
    }
}

/// The PodGroups the gangs need, by namespace and name: `minCount` and class.
fn wanted(
    pods: &[Arc<PodObject>],
    snapshot: &Snapshot,
) -> BTreeMap<(String, String), (u32, Option<String>)> {
    let mut wanted: BTreeMap<(String, String), (u32, Option<String>)> = BTreeMap::new();
    for pod in pods.iter().filter(|p| !p.is_terminated()) {
        let Some(group) = pod.pod_group_name() else {
            continue;
        };
        let meta = &pod.metadata;
        let namespace = meta.namespace.clone().unwrap_or_default();
        let member = pod_entitlements(pod, &snapshot.compiled.set, &snapshot.namespaces)
            .into_iter()
            .find_map(|p| {
                let member = p.spec.gang.as_ref()?.member(meta.labels.as_ref()?).ok()??;
                (member.pod_group_name(&p.name) == group).then_some(member)
            });
        let Some(member) = member else { continue };
        let entry = wanted
            .entry((namespace, group.to_owned()))
            .or_insert((0, pod.spec.priority_class_name.clone()));
        entry.0 = entry.0.max(member.min_available);
    }
    wanted
}

/// Creates a PodGroup; true once it exists.
async fn create(
    pass: &Pass<'_>,
    api: &Api<PodGroup>,
    name: &str,
    min_count: u32,
    class: Option<String>,
) -> Result<bool, writes::Error> {
    let params = PostParams {
        field_manager: Some(FIELD_MANAGER.into()),
        ..PostParams::default()
    };
    match pass
        .writes
        .make(
            Kind::PodGroup,
            api.create(&params, &pod_group(name, min_count, class)),
        )
        .await
    {
        Ok(_) => {
            tracing::info!(name, min_count, "PodGroup created");
            Ok(true)
        }
        // Made meanwhile: checked on the next pass.
        Err(e) if e.status() == Some(409) => Ok(false),
        Err(e) => Err(e),
    }
}

/// Puts a found PodGroup right; true when it is berth's as it stands.
async fn put_right(
    pass: &Pass<'_>,
    api: &Api<PodGroup>,
    found: &PodGroup,
    verdict: Found,
    min_count: u32,
    reported: &mut Reported,
) -> Result<bool, writes::Error> {
    let name = found.metadata.name.clone().unwrap_or_default();
    let (note, kept) = match verdict {
        Found::Kept => return Ok(true),
        // Being deleted (by berth or anyone): made again once it is gone.
        Found::Foreign(_) if found.metadata.deletion_timestamp.is_some() => return Ok(false),
        Found::MinCount => {
            let patch = json!({"spec": {"schedulingPolicy": {"gang": {"minCount": min_count}}}});
            let params = PatchParams::apply(FIELD_MANAGER);
            pass.writes
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
            pass.writes
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
    let reference = found.object_ref(&());
    let key = format!(
        "podgroup/{}/{}",
        found.metadata.uid.as_deref().unwrap_or_default(),
        found
            .metadata
            .resource_version
            .as_deref()
            .unwrap_or_default()
    );
    let event = event(EventType::Warning, "PodGroupTampered", "Restore", note);
    reported.publish(pass.events, key, event, &reference);
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
