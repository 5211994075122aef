//! A typed, read-only view of the pod under admission.
//!
//! Decisions read the pod through k8s-openapi types; patches are computed against
//! the raw JSON (see [`super::patch`]), so fields these types do not know survive.

use k8s_openapi::api::core::v1::{Pod, Toleration};
use serde::Deserialize;

use crate::policy::ImageRef;
use crate::policy::compile::Labels;

/// The fields of a pod that placement looks at.
#[derive(Debug, Clone)]
pub struct PodView {
    pod: Pod,
}

/// One container image of the pod and the container that runs it.
#[derive(Debug, Clone)]
pub struct ContainerImage {
    pub container: String,
    pub init: bool,
    pub image: ImageRef,
}

impl PodView {
    /// Reads `raw` as a Pod; the error says which field has the wrong shape.
    pub fn read(raw: &serde_json::Value) -> Result<PodView, String> {
        if raw
            .get("kind")
            .and_then(|k| k.as_str())
            .is_some_and(|k| k != "Pod")
        {
            return Err(format!("expected a Pod, got kind {}", raw["kind"]));
        }
        Pod::deserialize(raw)
            .map(|pod| PodView { pod })
            .map_err(|e| format!("not a readable Pod: {e}"))
    }

    pub fn labels(&self) -> Labels {
        self.pod.metadata.labels.clone().unwrap_or_default()
    }

    /// Images of init containers and containers, in that order.
    pub fn images(&self) -> Vec<ContainerImage> {
        let Some(spec) = &self.pod.spec else {
            return Vec::new();
        };
        let init = spec.init_containers.iter().flatten().map(|c| (c, true));
        let main = spec.containers.iter().map(|c| (c, false));
        init.chain(main)
            .filter_map(|(c, init)| {
                Some(ContainerImage {
                    container: c.name.clone(),
                    init,
                    image: ImageRef::new(c.image.as_deref()?),
                })
            })
            .collect()
    }

    pub fn tolerations(&self) -> &[Toleration] {
        self.pod
            .spec
            .as_ref()
            .and_then(|s| s.tolerations.as_deref())
            .unwrap_or_default()
    }

    pub fn node_name(&self) -> Option<&str> {
        self.pod.spec.as_ref()?.node_name.as_deref()
    }

    pub fn scheduler_name(&self) -> Option<&str> {
        self.pod.spec.as_ref()?.scheduler_name.as_deref()
    }

    /// Whether a DaemonSet controls this pod (its controller owner reference).
    pub fn is_daemonset_pod(&self) -> bool {
        self.pod
            .metadata
            .owner_references
            .iter()
            .flatten()
            .any(|o| o.kind == "DaemonSet" && o.controller == Some(true))
    }
}

/// Whether a toleration is a wildcard for `effect`: no key and `Exists` tolerates
/// every taint with a matching (or any, when unset) effect.
pub fn is_wildcard_for(toleration: &Toleration, effect: &str) -> bool {
    toleration.key.as_deref().unwrap_or_default().is_empty()
        && toleration.operator.as_deref() == Some("Exists")
        && toleration
            .effect
            .as_deref()
            .is_none_or(|e| e.is_empty() || e == effect)
}
