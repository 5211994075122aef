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
use kube::Client;
use kube::api::{Api, PostParams};

use super::caches::Snapshot;
use super::run::Pass;
use crate::names::{FIELD_MANAGER, owned_metadata};
use crate::objects::PodObject;
use crate::placement::groups::GangMode;
use crate::placement::opt_in::pod_entitlements;

/// The API the PodGroups of native gang scheduling are served under.
pub const POD_GROUP_API: &str = "scheduling.k8s.io/v1beta1";

/// Which gang mode the cluster gets, by API discovery: `PodGroup` when the
/// apiserver serves `podgroups` in [`POD_GROUP_API`], else `Gate`. An error other
/// than "not served" keeps `previous`, so a blip never flips the mode.
pub async fn discover_gang_mode(client: &Client, previous: GangMode) -> GangMode {
    match client.list_api_group_resources(POD_GROUP_API).await {
        Ok(list) if list.resources.iter().any(|r| r.name == "podgroups") => GangMode::PodGroup,
        Ok(_) => GangMode::Gate,
        Err(kube::Error::Api(status)) if status.code == 404 => GangMode::Gate,
        Err(e) => {
            tracing::warn!(error = %e, "API discovery of PodGroups failed; keeping the gang mode");
            previous
        }
    }
}

/// The PodGroups this controller has made sure of since the last resync: each is
/// created once, not on every pass.
#[derive(Debug, Default)]
pub struct PodGroups {
    known: BTreeSet<(String, String)>,
}

impl PodGroups {
    /// Forgets what it made sure of, so a PodGroup deleted by hand comes back.
    pub fn forget(&mut self) {
        self.known.clear();
    }

    /// Creates the PodGroup of every group whose members the webhook joined to one
    /// (`spec.schedulingGroup`) under a gang policy their namespace opts into:
    /// `minCount` is the group's `minAvailable`, its priority the members' class.
    /// Pods may come before their PodGroup; kube-scheduler holds them until it
    /// exists. PodGroups are left to Kubernetes' own protection once their pods
    /// are gone.
    pub async fn keep(&mut self, pass: &Pass<'_>, pods: &[Arc<PodObject>], snapshot: &Snapshot) {
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
        for ((namespace, name), (min_count, class)) in wanted {
            let key = (namespace.clone(), name.clone());
            if self.known.contains(&key) {
                continue;
            }
            let api: Api<PodGroup> = Api::namespaced(pass.client.clone(), &namespace);
            let group = pod_group(&name, min_count, class);
            let params = PostParams {
                field_manager: Some(FIELD_MANAGER.into()),
                ..PostParams::default()
            };
            match api.create(&params, &group).await {
                Ok(_) => {
                    tracing::info!(%namespace, %name, min_count, "PodGroup created");
                    self.known.insert(key);
                }
                Err(kube::Error::Api(status)) if status.code == 409 => {
                    self.known.insert(key);
                }
                Err(e) => {
                    tracing::warn!(%namespace, %name, error = %e, "cannot create the PodGroup; retrying on the next pass")
                }
            }
        }
    }
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
