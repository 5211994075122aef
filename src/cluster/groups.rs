//! What the cluster offers groups: how it enforces gangs (API discovery, once a
//! minute for the whole process) and its PriorityClasses.

use std::collections::BTreeSet;

use k8s_openapi::api::scheduling::v1::PriorityClass;
use kube::{Client, ResourceExt};

use crate::names::QUEUE_CLASS_PREFIX;
use crate::placement::groups::GangMode;

/// The API the PodGroups of native gang scheduling are served under.
pub const POD_GROUP_API: &str = "scheduling.k8s.io/v1beta1";

/// What the cluster offers group decisions.
#[derive(Debug, Clone, Default)]
pub struct GroupState {
    pub gang_mode: GangMode,
    /// The global-default PriorityClass, if the cluster has one.
    pub default_class: Option<String>,
    /// The `berth-queue-` PriorityClasses that exist.
    pub queue_classes: BTreeSet<String>,
}

impl GroupState {
    /// Takes the default and the queue classes from the cluster's PriorityClasses.
    pub fn set_classes(&mut self, classes: &[std::sync::Arc<PriorityClass>]) {
        self.default_class = classes
            .iter()
            .find(|c| c.global_default == Some(true))
            .map(|c| c.name_any());
        self.queue_classes = classes
            .iter()
            .map(|c| c.name_any())
            .filter(|n| n.starts_with(QUEUE_CLASS_PREFIX))
            .collect();
    }
}

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
