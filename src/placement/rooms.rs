//! Room on nodes, as the controller predicts it before it lets a held pod go: a
//! gang is released only when every member finds a node at once, and a pod of an
//! exclusion group is handed only nodes where it fits. The prediction covers what
//! kube-scheduler checks that berth can see: resources left after the pods bound
//! there, the pod's node selector, required node affinity and tolerations. What it
//! cannot see (host ports, volumes, inter-pod rules) is left to the scheduler, and
//! [`Fit::predictable`] says when that matters.

use kube::ResourceExt;
use std::collections::BTreeMap;
use std::sync::Arc;

use crate::objects::{NodeIndex, NodeInfo};
use crate::objects::{NodeObject, PodObject};
use crate::placement::error::Error;
use crate::placement::feasibility::{Placement, node_fits};

/// What a node offers a held pod.
#[derive(Debug, Clone, Default)]
pub struct NodeRoom {
    /// Labels and taints, shared: a pass copies the room, not the labels.
    pub info: Arc<NodeInfo>,
    /// Allocatable minus what the pods bound there request, per resource; `pods`
    /// counts pods.
    pub free: BTreeMap<String, f64>,
}

/// The nodes as the fit check sees them, by name.
pub type Rooms = BTreeMap<String, NodeRoom>;

/// Builds each node's room from its allocatable and the pods bound to it.
pub fn rooms<'p>(
    nodes: &NodeIndex,
    allocatable: &BTreeMap<String, BTreeMap<String, f64>>,
    pods: impl IntoIterator<Item = &'p PodObject>,
) -> Rooms {
    let mut rooms: Rooms = nodes
        .iter()
        .map(|(name, info)| {
            let room = NodeRoom {
                info: info.clone(),
                free: allocatable.get(name).cloned().unwrap_or_default(),
            };
            (name.clone(), room)
        })
        .collect();
    take_bound(&mut rooms, pods);
    rooms
}

/// Counts every pod bound to a node (and not finished) as placed there.
fn take_bound<'p>(rooms: &mut Rooms, pods: impl IntoIterator<Item = &'p PodObject>) {
    for pod in pods.into_iter().filter(|p| !p.is_terminated()) {
        let Some(room) = pod.node_name().and_then(|n| rooms.get_mut(n)) else {
            continue;
        };
        room.take(&pod.requests());
    }
}

/// A node's labels, taints and allocatable, before any pod.
fn empty_room(node: &NodeObject) -> NodeRoom {
    let taints = node
        .spec
        .taints
        .iter()
        .filter_map(|t| serde_json::from_value(t.clone()).ok())
        .collect();
    let free = node.status.allocatable.iter().cloned().collect();
    NodeRoom {
        info: Arc::new(NodeInfo {
            labels: node.labels().clone(),
            taints,
        }),
        free,
    }
}

/// Each node's labels, taints and resources left.
pub fn node_rooms<'p>(
    nodes: &[impl std::ops::Deref<Target = NodeObject>],
    pods: impl IntoIterator<Item = &'p PodObject>,
) -> Rooms {
    let mut rooms = nodes
        .iter()
        .map(|n| (n.name_any(), empty_room(n)))
        .collect();
    take_bound(&mut rooms, pods);
    rooms
}

/// The room on every node, kept from pass to pass and made again only for the
/// nodes that changed (the node, or a pod bound to it): a controller pass with
/// held pods then costs what changed, not a look at every node and pod.
#[derive(Debug, Default)]
pub struct RoomCache {
    rooms: Rooms,
}

impl RoomCache {
    /// Every node's room again, from all nodes and pods.
    pub fn rebuild<'p>(
        &mut self,
        nodes: &[impl std::ops::Deref<Target = NodeObject>],
        pods: impl IntoIterator<Item = &'p PodObject>,
    ) {
        self.rooms = node_rooms(nodes, pods);
    }

    /// The room on node `name` again: `node` as cached now (`None` once it is
    /// gone) and the pods bound to it (only those: each counts on its own node).
    pub fn refresh<'p>(
        &mut self,
        name: &str,
        node: Option<&NodeObject>,
        pods: impl IntoIterator<Item = &'p PodObject>,
    ) {
        let Some(node) = node else {
            self.rooms.remove(name);
            return;
        };
        self.rooms.insert(name.to_owned(), empty_room(node));
        take_bound(&mut self.rooms, pods);
    }

    pub fn rooms(&self) -> &Rooms {
        &self.rooms
    }
}

impl NodeRoom {
    /// Counts a pod with `requests` as placed here.
    pub fn take(&mut self, requests: &BTreeMap<String, f64>) {
        for (resource, amount) in requests {
            *self.free.entry(resource.clone()).or_default() -= amount;
        }
        *self.free.entry("pods".into()).or_default() -= 1.0;
    }

    /// Whether there is room left for a pod with `requests`.
    pub fn has_room(&self, requests: &BTreeMap<String, f64>) -> Result<(), Error> {
        if self.free.get("pods").copied().unwrap_or_default() < 1.0 {
            return Err(Error::NoPodSlots);
        }
        for (resource, amount) in requests.iter().filter(|(_, a)| **a > 0.0) {
            let free = self.free.get(resource).copied().unwrap_or_default();
            if free < *amount {
                return Err(Error::Short {
                    resource: resource.clone(),
                    free,
                    requested: *amount,
                });
            }
        }
        Ok(())
    }
}

/// What the fit check needs of a held pod.
#[derive(Debug, Clone)]
pub struct Fit {
    pub placement: Placement,
    pub requests: BTreeMap<String, f64>,
    /// Whether the check sees everything that decides where the pod may go.
    pub predictable: bool,
}

impl Fit {
    /// The fit check's view of a held pod; `None` when it cannot be read.
    pub fn of(pod: &PodObject) -> Option<Fit> {
        Some(Fit {
            placement: Placement::of_object(pod)?,
            requests: pod.requests(),
            predictable: predictable(pod),
        })
    }

    /// Whether the pod may go to `node` and finds room there; the error says why not.
    pub fn fits(&self, node: &str, room: &NodeRoom) -> Result<(), Error> {
        node_fits(&self.placement, node, &room.info)?;
        room.has_room(&self.requests)
    }
}

/// Whether nothing the fit check cannot see decides which nodes the pod may take: no
/// required inter-pod (anti-)affinity, no `DoNotSchedule` topology spread, no host
/// port, no volume bound to a zone or node (a claim, or an ephemeral one). Preferred
/// inter-pod terms and `ScheduleAnyway` spreads only score nodes: a node the check
/// finds feasible stays feasible, so they leave a pod predictable.
fn predictable(pod: &PodObject) -> bool {
    let spec = &pod.spec;
    let inter_pod = pod.too_large() || spec.inter_pod_required();
    let host_port = spec
        .containers
        .iter()
        .chain(&spec.init_containers)
        .any(|c| c.host_port);
    !(inter_pod || spec.hard_spread || host_port || spec.bound_volumes)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn pod(spec: serde_json::Value) -> PodObject {
        serde_json::from_value(json!({"metadata": {"name": "p"}, "spec": spec})).unwrap()
    }

    #[test]
    fn what_the_check_cannot_see_makes_a_pod_unpredictable() {
        let plain = json!({"containers": [{"name": "c", "ports": [{"containerPort": 80}]}],
            "volumes": [{"name": "cfg", "configMap": {"name": "x"}}],
            "affinity": {"nodeAffinity": {}, "podAntiAffinity": {}}});
        assert!(predictable(&pod(plain)), "no inter-pod term, no constraint");
        let term = json!([{"topologyKey": "kubernetes.io/hostname", "labelSelector": {}}]);
        let weighted = json!([{"weight": 1, "podAffinityTerm": term[0]}]);
        // What only scores nodes never makes one infeasible: a chart's soft
        // anti-affinity and a ScheduleAnyway spread leave the pod predictable.
        for spec in [
            json!({"affinity": {"podAntiAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": weighted}}}),
            json!({"affinity": {"podAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": weighted}}}),
            json!({"topologySpreadConstraints": [{"maxSkew": 1, "whenUnsatisfiable": "ScheduleAnyway"}]}),
        ] {
            assert!(predictable(&pod(spec.clone())), "{spec}");
        }
        for spec in [
            json!({"affinity": {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": term}}}),
            json!({"affinity": {"podAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": term}}}),
            json!({"affinity": {"podAntiAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": weighted,
                "requiredDuringSchedulingIgnoredDuringExecution": term}}}),
            json!({"topologySpreadConstraints": [{"maxSkew": 1, "whenUnsatisfiable": "DoNotSchedule"}]}),
            json!({"topologySpreadConstraints": [{"maxSkew": 1}]}),
            json!({"containers": [{"name": "c", "ports": [{"containerPort": 80, "hostPort": 80}]}]}),
            json!({"initContainers": [{"name": "c", "ports": [{"hostPort": 9}]}]}),
            json!({"volumes": [{"name": "d", "persistentVolumeClaim": {"claimName": "d"}}]}),
            json!({"volumes": [{"name": "d", "ephemeral": {}}]}),
        ] {
            assert!(!predictable(&pod(spec.clone())), "{spec}");
        }
        // A field too large to read is not predicted either.
        let value = "y".repeat(crate::objects::pod::PLACEMENT_FIELD_BYTES);
        let huge = json!({"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
            "nodeSelectorTerms": [{"matchExpressions": [{"key": "k", "operator": "In", "values": [value]}]}]}}}});
        assert!(!predictable(&pod(huge.clone())));
        assert!(Placement::of_object(&pod(huge)).is_none());
    }

    fn node(name: &str, version: &str, zone: &str) -> Arc<NodeObject> {
        Arc::new(
            serde_json::from_value(json!({
                "metadata": {"name": name, "resourceVersion": version, "labels": {"zone": zone}},
                "status": {"allocatable": {"cpu": "4", "pods": "110"}}}))
            .unwrap(),
        )
    }

    #[test]
    fn the_room_cache_makes_again_only_the_nodes_it_is_told_of() {
        let mut cache = RoomCache::default();
        let bound = pod(json!({"nodeName": "n1",
            "containers": [{"name": "c", "resources": {"requests": {"cpu": "1"}}}]}));
        cache.rebuild(&[node("n1", "1", "a"), node("n2", "1", "a")], [&bound]);
        assert_eq!(cache.rooms()["n1"].free["cpu"], 3.0);
        assert_eq!(cache.rooms()["n2"].free["cpu"], 4.0);
        let n2 = cache.rooms()["n2"].info.clone();
        // The pod left n1, and n1's labels changed: n1 alone is made again.
        cache.refresh("n1", Some(&node("n1", "2", "b")), []);
        assert_eq!(cache.rooms()["n1"].free["cpu"], 4.0);
        assert_eq!(cache.rooms()["n1"].info.labels["zone"], "b");
        assert!(Arc::ptr_eq(&n2, &cache.rooms()["n2"].info), "n2 untouched");
        // A finished pod takes no room; a node gone has none.
        let mut done = bound.clone();
        done.status.phase = Some("Succeeded".into());
        cache.refresh("n1", Some(&node("n1", "3", "b")), [&done]);
        assert_eq!(cache.rooms()["n1"].free["cpu"], 4.0);
        cache.refresh("n2", None, []);
        assert!(!cache.rooms().contains_key("n2"));
    }

    #[test]
    fn room_counts_requests_and_pod_slots() {
        let mut room = NodeRoom {
            free: BTreeMap::from([("cpu".into(), 2.0), ("pods".into(), 2.0)]),
            ..NodeRoom::default()
        };
        let one = BTreeMap::from([("cpu".to_string(), 1.0)]);
        assert!(room.has_room(&one).is_ok());
        room.take(&one);
        room.take(&BTreeMap::new());
        assert_eq!(
            room.has_room(&BTreeMap::new()).unwrap_err().to_string(),
            "no pod slots left"
        );
        room.free.insert("pods".into(), 5.0);
        assert_eq!(
            room.has_room(&BTreeMap::from([("cpu".to_string(), 1.5)]))
                .unwrap_err()
                .to_string(),
            "cpu: 1 left, 1.5 requested"
        );
    }
}
