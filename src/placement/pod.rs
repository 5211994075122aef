//! A pod as decisions read it: the one pod model ([`PodObject`]) and what placement
//! derives from it: who sends it, its images, its QoS class, whether it is a
//! DaemonSet's.

use std::borrow::Cow;

use k8s_openapi::api::core::v1::Toleration;
use serde_json::Value;

use crate::names::is_daemonset_controller;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;

use crate::objects::PodObject;
use crate::objects::pod::{Container, PodSpec, Quantities, Resources};
use crate::policy::ImageRef;
use crate::policy::groups::QosClass;

/// Who sends the pod to the apiserver, from `request.userInfo`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Requester {
    /// The DaemonSet controller (see [`crate::names::DAEMONSET_CONTROLLER_USERS`]).
    DaemonSetController,
    /// Anyone else: a user, a CI system, another controller.
    #[default]
    Other,
}

impl Requester {
    pub fn from_username(username: &str) -> Requester {
        if is_daemonset_controller(username) {
            Requester::DaemonSetController
        } else {
            Requester::Other
        }
    }
}

/// One container image of the pod and the container that runs it.
#[derive(Debug, Clone)]
pub struct ContainerImage {
    pub container: String,
    pub init: bool,
    pub image: ImageRef,
}

/// What placement derives of a pod.
impl PodObject {
    /// Images of init containers and containers, in that order.
    pub fn images(&self) -> Vec<ContainerImage> {
        let spec = &self.spec;
        let init = spec.init_containers.iter().map(|c| (c, true));
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

    /// The pod's QoS class as the apiserver records it (`ComputePodQOS` at create):
    /// from the pod's own resources when they name CPU, memory or hugepages, once
    /// filled from its containers as the apiserver fills them
    /// ([`PodObject::pod_level`]), else from its containers and init containers,
    /// each a class of its own; containers of different classes make the pod
    /// Burstable.
    pub fn qos_class(&self) -> QosClass {
        let spec = &self.spec;
        let own = &spec.resources;
        if names_pod_level(&own.requests) || names_pod_level(&own.limits) {
            return requirements_qos(|key| self.pod_level(key));
        }
        spec.init_containers
            .iter()
            .chain(&spec.containers)
            .map(|c| requirements_qos(|key| (request(&c.resources, key), limit(&c.resources, key))))
            .reduce(same_or_burstable)
            .unwrap_or(QosClass::BestEffort)
    }

    /// The pod-level request and limit of `key` (CPU or memory) as the apiserver
    /// stores them (`DefaultPodLevelResources`, after admission): a request left
    /// out is what the containers request together, else the pod's limit; a limit
    /// left out, when every container limits `key`, is what they limit together
    /// or the request, whichever is more.
    fn pod_level(&self, key: &str) -> (Option<f64>, Option<f64>) {
        let spec = &self.spec;
        let own = &spec.resources;
        let own_limit = limit(own, key);
        let request = quantity(&own.requests, key)
            .or_else(|| together(spec, |c| request(&c.resources, key)))
            .or(own_limit);
        let all_limit = || {
            spec.init_containers
                .iter()
                .chain(&spec.containers)
                .all(|c| limit(&c.resources, key).is_some())
        };
        let limit = match (own_limit, request) {
            (None, Some(request)) if all_limit() => {
                together(spec, |c| limit(&c.resources, key)).map(|l| l.max(request))
            }
            (own_limit, _) => own_limit,
        };
        (request, limit)
    }

    /// The DaemonSet that controls the pod, as its ownerReferences say
    /// ([`daemonset_owner`]): any user can write that; see
    /// [`PodObject::is_daemonset_pod`].
    pub fn daemonset_owner(&self) -> Option<&OwnerReference> {
        daemonset_owner(self.owner_references())
    }

    /// Whether this is a DaemonSet pod: the DaemonSet controller sends it and its
    /// controller ownerReference is an `apps/v1` DaemonSet. An ownerReference a user
    /// wrote proves nothing, at CREATE or at UPDATE.
    pub fn is_daemonset_pod(&self, requester: Requester) -> bool {
        requester == Requester::DaemonSetController && self.daemonset_owner().is_some()
    }

    /// The one node a DaemonSet pod is made for: the DaemonSet controller pins each
    /// pod with `matchFields metadata.name In [node]` in every required term.
    pub fn daemonset_node(&self) -> Option<&str> {
        self.required_affinity()?.iter().find_map(|term| {
            term.match_fields.iter().flatten().find_map(|f| {
                let values = f.values.as_deref().unwrap_or_default();
                (f.key == "metadata.name" && f.operator == "In" && values.len() == 1)
                    .then(|| values[0].as_str())
            })
        })
    }
}

/// The QoS class of one container's (or a pod's own) requests and limits, given
/// the request and limit of each resource, as Kubernetes' `requirementsQOS`: CPU
/// and memory of different classes make it Burstable.
fn requirements_qos(amounts: impl Fn(&str) -> (Option<f64>, Option<f64>)) -> QosClass {
    same_or_burstable(amounts_qos(amounts("cpu")), amounts_qos(amounts("memory")))
}

/// The QoS class of one resource's request and limit, as Kubernetes'
/// `resourceQOS`: a request other than the limit is Burstable, both zero or
/// absent BestEffort, both the same above zero Guaranteed. A zero limit is no
/// limit at all.
fn amounts_qos((request, limit): (Option<f64>, Option<f64>)) -> QosClass {
    let (request, limit) = (request.unwrap_or(0.0), limit.unwrap_or(0.0));
    if request != limit {
        QosClass::Burstable
    } else if request == 0.0 {
        QosClass::BestEffort
    } else {
        QosClass::Guaranteed
    }
}

/// What a pod's containers need of one resource together, as Kubernetes adds it
/// up (`aggregateContainerResourcesByFn`): the containers and the sidecars run
/// at once, and each other init container runs alone beside the sidecars started
/// before it, so the pod needs the more of the two. `None` when no container
/// lists the resource.
fn together(spec: &PodSpec, amount: impl Fn(&Container) -> Option<f64>) -> Option<f64> {
    let mut listed = false;
    let mut of = |c: &Container| {
        let a = amount(c);
        listed |= a.is_some();
        a.unwrap_or(0.0)
    };
    let mut running: f64 = spec.containers.iter().map(&mut of).sum();
    let (mut sidecars, mut initialising) = (0.0_f64, 0.0_f64);
    for init in &spec.init_containers {
        let a = of(init);
        if init.is_sidecar() {
            running += a;
            sidecars += a;
            initialising = initialising.max(sidecars);
        } else {
            initialising = initialising.max(a + sidecars);
        }
    }
    listed.then_some(running.max(initialising))
}

/// The resources a pod's own `resources` may set: CPU, memory and hugepages
/// (Kubernetes' `IsSupportedPodLevelResource`). Only when they name one of these
/// do they decide the pod's QoS class.
fn names_pod_level(amounts: &Quantities) -> bool {
    amounts
        .iter()
        .any(|(name, _)| matches!(name, "cpu" | "memory") || name.starts_with("hugepages-"))
}

/// The quantity `amounts` lists for `key`, when it reads as one.
fn quantity(amounts: &Quantities, key: &str) -> Option<f64> {
    amounts.get(key)
}

/// The request for `key`; left out, the limit (the apiserver's defaulting of a
/// container, which a pod `berth explain` reads from a file has not had yet).
fn request(resources: &Resources, key: &str) -> Option<f64> {
    quantity(&resources.requests, key).or_else(|| limit(resources, key))
}

fn limit(resources: &Resources, key: &str) -> Option<f64> {
    quantity(&resources.limits, key)
}

/// Two classes as one: the class they share, else Burstable.
fn same_or_burstable(a: QosClass, b: QosClass) -> QosClass {
    if a == b { a } else { QosClass::Burstable }
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

/// A pod as berth decides on it: its [`PodObject`], or why it cannot be read.
pub trait PodSource {
    fn view(&self) -> Result<Cow<'_, PodObject>, String>;
}

impl PodSource for Value {
    fn view(&self) -> Result<Cow<'_, PodObject>, String> {
        PodObject::read(self).map(Cow::Owned)
    }
}

impl PodSource for PodObject {
    fn view(&self) -> Result<Cow<'_, PodObject>, String> {
        Ok(Cow::Borrowed(self))
    }
}

/// A pod as the webhook reads it: its view, or why it cannot be read.
impl PodSource for Result<PodObject, String> {
    fn view(&self) -> Result<Cow<'_, PodObject>, String> {
        self.as_ref().map(Cow::Borrowed).map_err(Clone::clone)
    }
}

/// The DaemonSet that controls a pod, as its ownerReferences say: its `apps/v1`
/// DaemonSet controller ownerReference. Anyone can write one, so on its own it
/// proves nothing: the webhook also asks who sends the pod
/// ([`PodObject::is_daemonset_pod`]), the controller whether that DaemonSet exists in
/// the pod's namespace ([`super::daemonset::is_daemonset_pod_of`]).
pub fn daemonset_owner(owners: &[OwnerReference]) -> Option<&OwnerReference> {
    owners
        .iter()
        .find(|o| o.controller == Some(true) && o.kind == "DaemonSet" && o.api_version == "apps/v1")
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn qos_classes_follow_requests_and_limits() {
        let qos = |containers: serde_json::Value| {
            PodObject::read(&json!({"kind": "Pod", "spec": {"containers": containers}}))
                .unwrap()
                .qos_class()
        };
        let both = json!({"cpu": "1", "memory": "1Gi"});
        assert_eq!(qos(json!([{"name": "a"}])), QosClass::BestEffort);
        assert_eq!(
            qos(json!([{"name": "a", "resources": {"limits": both}}])),
            QosClass::Guaranteed,
            "requests default to limits"
        );
        assert_eq!(
            qos(
                json!([{"name": "a", "resources": {"requests": {"cpu": "1000m", "memory": "1Gi"}, "limits": both}}])
            ),
            QosClass::Guaranteed
        );
        assert_eq!(
            qos(json!([{"name": "a", "resources": {"requests": {"cpu": "500m"}, "limits": both}}])),
            QosClass::Burstable
        );
        assert_eq!(
            qos(json!([{"name": "a", "resources": {"limits": both}}, {"name": "b"}])),
            QosClass::Burstable,
            "one container without limits"
        );
        assert_eq!(
            qos(json!([{"name": "a", "resources": {"requests": {"ephemeral-storage": "1Gi"}}}])),
            QosClass::BestEffort,
            "only cpu and memory count"
        );
        assert_eq!(
            qos(json!([{"name": "a", "resources": {"limits": {"cpu": "0"}}}])),
            QosClass::BestEffort,
            "a zero limit is no limit"
        );
    }

    #[test]
    fn pod_level_resources_decide_the_qos_class_once_filled_from_the_containers() {
        let qos = |spec: serde_json::Value| {
            PodObject::read(&json!({"kind": "Pod", "spec": spec}))
                .unwrap()
                .qos_class()
        };
        let container = |name: &str, limits: serde_json::Value| json!({"name": name, "resources": {"limits": limits}});
        let one = json!({"cpu": "1", "memory": "1Gi"});
        let guaranteed = json!([container("a", one.clone())]);
        assert_eq!(qos(json!({"containers": guaranteed})), QosClass::Guaranteed);
        assert_eq!(
            qos(json!({"containers": guaranteed, "resources": {"requests": {"cpu": "1"}}})),
            QosClass::Guaranteed,
            "the pod's limits are filled from its containers', which all limit both"
        );
        assert_eq!(
            qos(json!({"containers": [{"name": "a"}], "resources": {"requests": {"cpu": "1"}}})),
            QosClass::Burstable,
            "a request no limit is filled for"
        );
        let two = json!({"limits": {"cpu": "2", "memory": "2Gi"}});
        assert_eq!(
            qos(json!({"containers": guaranteed, "resources": two})),
            QosClass::Burstable,
            "the pod's requests are filled from its containers', under its limits"
        );
        let with_init = |restart: Option<&str>| {
            let mut init = container("init", one.clone());
            if let Some(policy) = restart {
                init["restartPolicy"] = json!(policy);
            }
            qos(json!({"containers": guaranteed, "initContainers": [init], "resources": two}))
        };
        assert_eq!(
            with_init(Some("Always")),
            QosClass::Guaranteed,
            "a sidecar runs beside the container: together they request the limits"
        );
        assert_eq!(
            with_init(None),
            QosClass::Burstable,
            "an init container runs before the container, not beside it"
        );
    }

    #[test]
    fn only_the_daemonset_controller_makes_daemonset_pods() {
        let pod = |api_version: &str| {
            PodObject::read(&json!({"kind": "Pod", "metadata": {"ownerReferences": [
                {"apiVersion": api_version, "kind": "DaemonSet", "name": "agent", "uid": "u", "controller": true}]}}))
            .unwrap()
        };
        let controller = Requester::from_username(crate::names::DAEMONSET_CONTROLLER_USERS[0]);
        assert!(pod("apps/v1").is_daemonset_pod(controller));
        assert!(!pod("apps/v1").is_daemonset_pod(Requester::from_username("tenant")));
        assert!(!pod("redteam.example.com/v1").is_daemonset_pod(controller));
    }
}
