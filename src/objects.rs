//! Kubernetes objects as berth reads them from the apiserver: only the parts it
//! uses, leniently.
//!
//! Tenants write pods and DaemonSets, kubelets write their Nodes, and either can
//! put anything in `metadata.managedFields`: JSON nested deeper than a parser's
//! recursion limit, or a timestamp the apiserver accepts and a Rust time type does
//! not (`9999-12-31T23:59:59Z`). Read with the full k8s-openapi types, one such
//! object fails its watch event, and a relist page holding it fails whole: berth
//! would be blind to every object of that kind. These types skip `managedFields`
//! unparsed (serde_json skips a value without recursion), drop timestamps that do
//! not parse, and read nothing else berth does not need.

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::marker::PhantomData;
use std::sync::Arc;

use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::{Namespace, Node, NodeSelectorTerm, Pod, Taint, Toleration};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference, Time};
use kube::Resource;
use serde::de::IgnoredAny;
use serde::{Deserialize, Deserializer};
use serde_json::{Map, Value};

use crate::bounds;
use crate::names::{POOL_TAINT, is_berth_gate, is_owned_node_key};
use crate::policy::compile::{Labels, PolicySource};
use crate::policy::{PlacementPolicy, PlacementPolicySpec};

/// `null` reads as the default.
fn nullable<'de, D, T>(deserializer: D) -> Result<T, D::Error>
where
    D: Deserializer<'de>,
    T: Deserialize<'de> + Default,
{
    Ok(Option::<T>::deserialize(deserializer)?.unwrap_or_default())
}

/// A timestamp, or nothing when it does not parse.
fn lenient_time<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Option<Time>, D::Error> {
    let text = Option::<String>::deserialize(deserializer)?;
    Ok(text.and_then(|t| t.parse().ok()).map(Time))
}

/// The parts of `metadata` berth uses. Unknown keys, `managedFields` among them,
/// are skipped unparsed.
#[derive(Deserialize, Default)]
#[serde(rename_all = "camelCase")]
struct MetaFields {
    #[serde(default)]
    name: Option<String>,
    #[serde(default)]
    namespace: Option<String>,
    #[serde(default)]
    uid: Option<String>,
    #[serde(default)]
    resource_version: Option<String>,
    #[serde(default)]
    generation: Option<i64>,
    #[serde(default, deserialize_with = "nullable")]
    labels: Labels,
    #[serde(default, deserialize_with = "nullable")]
    annotations: Labels,
    #[serde(default, deserialize_with = "nullable")]
    owner_references: Vec<OwnerReference>,
    #[serde(default, deserialize_with = "nullable")]
    finalizers: Vec<String>,
    #[serde(default, deserialize_with = "lenient_time")]
    creation_timestamp: Option<Time>,
    #[serde(default, deserialize_with = "lenient_time")]
    deletion_timestamp: Option<Time>,
}

/// `metadata`, read leniently into the usual `ObjectMeta`, without `managedFields`.
fn lenient_meta<'de, D: Deserializer<'de>>(deserializer: D) -> Result<ObjectMeta, D::Error> {
    let m = Option::<MetaFields>::deserialize(deserializer)?.unwrap_or_default();
    let some = |map: Labels| (!map.is_empty()).then_some(map);
    Ok(ObjectMeta {
        name: m.name,
        namespace: m.namespace,
        uid: m.uid,
        resource_version: m.resource_version,
        generation: m.generation,
        labels: some(m.labels),
        annotations: some(m.annotations),
        owner_references: (!m.owner_references.is_empty()).then_some(m.owner_references),
        finalizers: (!m.finalizers.is_empty()).then_some(m.finalizers),
        creation_timestamp: m.creation_timestamp,
        deletion_timestamp: m.deletion_timestamp,
        ..ObjectMeta::default()
    })
}

/// Implements `kube::Resource` for a lenient type by borrowing the kind, group,
/// version and plural of the k8s-openapi type it stands for.
macro_rules! stands_for {
    ($lenient:ty, $of:ty, metadata_api: $meta:expr, $($generics:tt)*) => {
        impl $($generics)* Resource for $lenient {
            type DynamicType = ();
            type Scope = <$of as Resource>::Scope;
            fn kind(_: &()) -> Cow<'_, str> {
                <$of as Resource>::kind(&())
            }
            fn group(_: &()) -> Cow<'_, str> {
                <$of as Resource>::group(&())
            }
            fn version(_: &()) -> Cow<'_, str> {
                <$of as Resource>::version(&())
            }
            fn plural(_: &()) -> Cow<'_, str> {
                <$of as Resource>::plural(&())
            }
            fn metadata_api() -> bool {
                $meta
            }
            fn meta(&self) -> &ObjectMeta {
                &self.metadata
            }
            fn meta_mut(&mut self) -> &mut ObjectMeta {
                &mut self.metadata
            }
        }
    };
}

/// Only the metadata of a `K`: a metadata-only watch (the apiserver sends
/// `PartialObjectMetadata`), so that, say, Node heartbeats never reach berth.
#[derive(Debug, Deserialize)]
pub struct MetaOnly<K> {
    #[serde(default, deserialize_with = "lenient_meta")]
    pub metadata: ObjectMeta,
    #[serde(skip)]
    kind: PhantomData<fn() -> K>,
}

impl<K> Clone for MetaOnly<K> {
    fn clone(&self) -> Self {
        MetaOnly {
            metadata: self.metadata.clone(),
            kind: PhantomData,
        }
    }
}

stands_for!(MetaOnly<K>, K, metadata_api: true, <K: Resource<DynamicType = ()>>);

/// A Namespace's metadata: its labels and annotations are all berth reads.
pub type NamespaceMeta = MetaOnly<Namespace>;
/// A Node's metadata: its labels.
pub type NodeMeta = MetaOnly<Node>;

/// A node as decisions read it: its labels and taints.
#[derive(Debug, Clone, Default)]
pub struct NodeInfo {
    pub labels: Labels,
    pub taints: Vec<Taint>,
}

impl NodeInfo {
    pub fn from_node(node: &Node) -> Self {
        NodeInfo {
            labels: node.metadata.labels.clone().unwrap_or_default(),
            taints: node
                .spec
                .as_ref()
                .and_then(|s| s.taints.clone())
                .unwrap_or_default(),
        }
    }
}

/// Known nodes by name. A persistent map: the webhook's cache takes a label
/// change in O(log n) and hands each review a snapshot that costs a pointer, where
/// a copy of the whole map per change cost O(n) each time a burst labelled
/// thousands of nodes.
pub type NodeIndex = imbl::OrdMap<String, std::sync::Arc<NodeInfo>>;

/// A Node with its taints, for the controller, which writes them.
///
/// Its labels are not in `metadata`: they are read into `indexed`, which the
/// webhook's node index shares, so each node's labels are held once, not once per
/// reader (at 5,000 nodes, 4 MiB). Read them with [`NodeObject::labels`].
#[derive(Debug, Clone, Deserialize)]
#[serde(from = "NodeFields")]
pub struct NodeObject {
    pub metadata: ObjectMeta,
    /// What the webhook's node index holds of the node: its labels (the
    /// controller reads taints from `spec`, to write them back as they are).
    pub indexed: Arc<NodeInfo>,
    pub spec: NodeSpec,
    pub status: NodeStatus,
}

impl NodeObject {
    /// The node's labels. (`ResourceExt::labels` would read the metadata, which
    /// holds none.)
    pub fn labels(&self) -> &Labels {
        &self.indexed.labels
    }
}

/// A Node as the apiserver sends it, before its labels move out of `metadata`.
#[derive(Deserialize)]
struct NodeFields {
    #[serde(default, deserialize_with = "lenient_meta")]
    metadata: ObjectMeta,
    #[serde(default, deserialize_with = "nullable")]
    spec: NodeSpec,
    #[serde(default, deserialize_with = "nullable")]
    status: NodeStatus,
}

impl From<NodeFields> for NodeObject {
    fn from(node: NodeFields) -> Self {
        let mut metadata = node.metadata;
        let labels = metadata.labels.take().unwrap_or_default();
        NodeObject {
            metadata,
            indexed: Arc::new(NodeInfo {
                labels,
                taints: Vec::new(),
            }),
            spec: node.spec,
            status: node.status,
        }
    }
}

#[derive(Debug, Clone, Default, Deserialize)]
pub struct NodeStatus {
    /// What pods may request of the node, by resource name in order, each that
    /// berth can read as a number (one it cannot is left out).
    #[serde(default, deserialize_with = "readable_quantities")]
    pub allocatable: Box<[(String, f64)]>,
}

/// Resource quantities read as numbers, leaving out those that are not.
fn readable_quantities<'de, D: Deserializer<'de>>(
    deserializer: D,
) -> Result<Box<[(String, f64)]>, D::Error> {
    read_quantities(deserializer, None)
}

/// Resource quantities by name, in order, each read as a number; one that is not
/// counts as `unreadable` (left out when `None`).
fn read_quantities<'de, D: Deserializer<'de>>(
    deserializer: D,
    unreadable: Option<f64>,
) -> Result<Box<[(String, f64)]>, D::Error> {
    let raw = Option::<BTreeMap<String, Value>>::deserialize(deserializer)?.unwrap_or_default();
    Ok(raw
        .into_iter()
        .filter_map(|(k, v)| Some((k, crate::quantity::from_json(&v).or(unreadable)?)))
        .collect())
}

#[derive(Debug, Clone, Default, Deserialize)]
pub struct NodeSpec {
    /// Each taint as the apiserver has it: berth writes back the ones it does not
    /// own exactly as they were (`timeAdded` included).
    #[serde(default, deserialize_with = "nullable")]
    pub taints: Vec<Value>,
}

stands_for!(NodeObject, Node, metadata_api: false,);

/// A Pod, for the controller: where it is bound, what holds it, its phase.
#[derive(Debug, Clone, Deserialize)]
pub struct PodObject {
    #[serde(default, deserialize_with = "lenient_meta")]
    pub metadata: ObjectMeta,
    #[serde(default, deserialize_with = "nullable")]
    pub spec: PodSpec,
    #[serde(default, deserialize_with = "nullable")]
    pub status: PodStatus,
}

/// The most JSON one of a pod's placement fields (its node selector, affinity or
/// tolerations) may take for the controller to keep it. Tenants write pods: read
/// into values, 1.3 MB of them would cost 30 times that in every replica's cache.
/// Kept typed and compact within this bound; beyond it the pod is known to be too
/// large to read ([`Bounded::TooLarge`]) and is never released from berth's gates.
pub const PLACEMENT_FIELD_BYTES: usize = 64 * 1024;

/// A pod field the controller keeps only within [`PLACEMENT_FIELD_BYTES`].
#[derive(Debug, Clone, Default, PartialEq)]
pub enum Bounded<T> {
    #[default]
    Absent,
    Kept(T),
    /// Over the bound, or of a shape berth cannot read.
    TooLarge,
}

impl<T> Bounded<T> {
    /// The value, or `Some(None)` when absent; `None` when it is too large.
    pub fn read(&self) -> Option<Option<&T>> {
        match self {
            Bounded::Absent => Some(None),
            Bounded::Kept(value) => Some(Some(value)),
            Bounded::TooLarge => None,
        }
    }

    /// Changes a kept value in place.
    fn edit(&mut self, change: impl FnOnce(&mut T)) {
        if let Bounded::Kept(value) = self {
            change(value);
        }
    }
}

impl PodSpec {
    /// Drops from its placement fields all but berth's marks: tolerations of
    /// berth's pool taint (and wildcards), and node expressions and selector
    /// entries on berth's own keys (the pool's `In`, anchors); the node affinity
    /// only with `affinity_too`. What the missed scan checks a pod's record against
    /// ([`crate::placement::missed`]); a field too large to keep stays so.
    pub fn keep_berths_marks(&mut self, affinity_too: bool) {
        self.tolerations.edit(|tolerations| {
            tolerations.retain(|t| {
                t.key
                    .as_deref()
                    .is_none_or(|k| k.is_empty() || k == POOL_TAINT)
            })
        });
        self.node_selector
            .edit(|selector| selector.retain(|k, _| is_owned_node_key(k)));
        if !affinity_too {
            return;
        }
        self.affinity.edit(|affinity| {
            let terms = affinity
                .node_affinity
                .required
                .iter_mut()
                .flat_map(|r| &mut r.node_selector_terms);
            for term in terms {
                if let Some(expressions) = term.match_expressions.as_mut() {
                    expressions.retain(|e| is_owned_node_key(&e.key));
                }
                term.match_fields = None;
            }
        });
    }
}

/// Reads a field into `T` only when its JSON is within [`PLACEMENT_FIELD_BYTES`];
/// the raw text is held only while this runs.
fn bounded<'de, D, T>(deserializer: D) -> Result<Bounded<T>, D::Error>
where
    D: Deserializer<'de>,
    T: serde::de::DeserializeOwned,
{
    let raw = Option::<Box<serde_json::value::RawValue>>::deserialize(deserializer)?;
    Ok(match raw {
        None => Bounded::Absent,
        Some(raw) if raw.get() == "null" => Bounded::Absent,
        Some(raw) if raw.get().len() > PLACEMENT_FIELD_BYTES => Bounded::TooLarge,
        Some(raw) => serde_json::from_str(raw.get()).map_or(Bounded::TooLarge, Bounded::Kept),
    })
}

/// Whether a list that may be absent or `null` has an item, read without keeping it.
fn non_empty<'de, D: Deserializer<'de>>(deserializer: D) -> Result<bool, D::Error> {
    let list = Option::<Vec<IgnoredAny>>::deserialize(deserializer)?;
    Ok(list.is_some_and(|l| !l.is_empty()))
}

/// Whether a pod's topology spread constraints include one the scheduler must
/// satisfy: any but `ScheduleAnyway` (the field is required; a constraint without it
/// is taken as the stricter kind).
fn hard_spread<'de, D: Deserializer<'de>>(deserializer: D) -> Result<bool, D::Error> {
    #[derive(Deserialize)]
    #[serde(rename_all = "camelCase")]
    struct Constraint {
        #[serde(default)]
        when_unsatisfiable: Option<String>,
    }
    let constraints = Option::<Vec<Constraint>>::deserialize(deserializer)?.unwrap_or_default();
    Ok(constraints
        .iter()
        .any(|c| c.when_unsatisfiable.as_deref() != Some("ScheduleAnyway")))
}

/// Whether a pod's volumes include one bound to a zone or node (a claim, or an
/// ephemeral one), read without keeping them.
fn claims_volume<'de, D: Deserializer<'de>>(deserializer: D) -> Result<bool, D::Error> {
    #[derive(Deserialize)]
    #[serde(rename_all = "camelCase")]
    struct Volume {
        #[serde(default)]
        persistent_volume_claim: Option<IgnoredAny>,
        #[serde(default)]
        ephemeral: Option<IgnoredAny>,
    }
    let volumes = Option::<Vec<Volume>>::deserialize(deserializer)?.unwrap_or_default();
    Ok(volumes
        .iter()
        .any(|v| v.persistent_volume_claim.is_some() || v.ephemeral.is_some()))
}

/// What the controller keeps of a pod's spec: where it is bound, what holds it,
/// and for a pod being placed, what decides where it may go, all read compactly:
/// no raw JSON of what a tenant writes is kept.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PodSpec {
    #[serde(default)]
    pub node_name: Option<String>,
    #[serde(default, deserialize_with = "nullable")]
    pub scheduling_gates: Vec<Gate>,
    #[serde(default, deserialize_with = "bounded")]
    pub node_selector: Bounded<BTreeMap<String, String>>,
    /// Its node affinity (the required terms) and whether it has inter-pod terms.
    #[serde(default, deserialize_with = "bounded")]
    pub affinity: Bounded<AffinityView>,
    #[serde(default, deserialize_with = "bounded")]
    pub tolerations: Bounded<Vec<Toleration>>,
    /// Boxed slices: a list read from JSON has room to grow that a cache never uses.
    #[serde(default, deserialize_with = "nullable")]
    pub containers: Box<[Container]>,
    #[serde(default, deserialize_with = "nullable")]
    pub init_containers: Box<[Container]>,
    #[serde(default)]
    pub priority_class_name: Option<String>,
    #[serde(default, deserialize_with = "nullable")]
    pub scheduling_group: SchedulingGroup,
    /// Whether it has a topology spread constraint the scheduler must satisfy
    /// (`DoNotSchedule`); a `ScheduleAnyway` one only scores nodes.
    #[serde(
        default,
        rename = "topologySpreadConstraints",
        deserialize_with = "hard_spread"
    )]
    pub hard_spread: bool,
    /// Whether a volume binds it to a zone or node.
    #[serde(default, rename = "volumes", deserialize_with = "claims_volume")]
    pub bound_volumes: bool,
}

/// A pod's affinity, as far as the controller reads it.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AffinityView {
    #[serde(default, deserialize_with = "nullable")]
    pub node_affinity: NodeAffinityView,
    #[serde(default, deserialize_with = "nullable")]
    pub pod_affinity: InterPodView,
    #[serde(default, deserialize_with = "nullable")]
    pub pod_anti_affinity: InterPodView,
}

impl AffinityView {
    /// The required node-affinity terms: `None` without a requirement, `Some` of no
    /// terms matching no node.
    pub fn required_terms(&self) -> Option<&[NodeSelectorTerm]> {
        self.node_affinity
            .required
            .as_ref()
            .map(|r| r.node_selector_terms.as_slice())
    }

    /// Whether it has required inter-pod (anti-)affinity terms.
    pub fn inter_pod_required(&self) -> bool {
        self.pod_affinity.required || self.pod_anti_affinity.required
    }
}

#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
pub struct NodeAffinityView {
    #[serde(default, rename = "requiredDuringSchedulingIgnoredDuringExecution")]
    pub required: Option<NodeSelectorView>,
}

#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NodeSelectorView {
    #[serde(default, deserialize_with = "nullable")]
    pub node_selector_terms: Vec<NodeSelectorTerm>,
}

/// Whether a pod has required inter-pod terms of a kind, read without keeping them.
/// Preferred terms only score nodes, so the controller need not know of them.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
pub struct InterPodView {
    #[serde(
        default,
        rename = "requiredDuringSchedulingIgnoredDuringExecution",
        deserialize_with = "non_empty"
    )]
    pub required: bool,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SchedulingGroup {
    #[serde(default)]
    pub pod_group_name: Option<String>,
}

/// A container, as far as its image (which policies apply), what it requests and
/// whether it takes a host port.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct Container {
    #[serde(default, deserialize_with = "image_within_bound")]
    pub image: Option<String>,
    #[serde(default, deserialize_with = "nullable")]
    pub resources: ContainerResources,
    #[serde(default, rename = "ports", deserialize_with = "takes_host_port")]
    pub host_port: bool,
}

/// An image reference, kept only within [`bounds::IMAGE_BYTES`] (a longer one names
/// nothing a node can pull).
fn image_within_bound<'de, D: Deserializer<'de>>(
    deserializer: D,
) -> Result<Option<String>, D::Error> {
    let image = Option::<String>::deserialize(deserializer)?;
    Ok(image.filter(|i| i.len() <= bounds::IMAGE_BYTES))
}

/// Whether a container's ports include a host port, read without keeping them.
fn takes_host_port<'de, D: Deserializer<'de>>(deserializer: D) -> Result<bool, D::Error> {
    #[derive(Deserialize)]
    #[serde(rename_all = "camelCase")]
    struct Port {
        #[serde(default)]
        host_port: Option<IgnoredAny>,
    }
    let ports = Option::<Vec<Port>>::deserialize(deserializer)?.unwrap_or_default();
    Ok(ports.iter().any(|p| p.host_port.is_some()))
}

#[derive(Debug, Clone, Default, Deserialize)]
pub struct ContainerResources {
    /// Each request read as a number (one berth cannot read counts as nothing),
    /// by resource name, in order: a slice, as a map of one or two entries would
    /// cost a tree node of 384 bytes in every cached pod.
    #[serde(default, deserialize_with = "quantities")]
    pub requests: Box<[(String, f64)]>,
}

/// Resource quantities read as numbers, one that is not counting as nothing.
fn quantities<'de, D: Deserializer<'de>>(
    deserializer: D,
) -> Result<Box<[(String, f64)]>, D::Error> {
    read_quantities(deserializer, Some(0.0))
}

#[derive(Debug, Clone, Default, Deserialize)]
pub struct Gate {
    #[serde(default)]
    pub name: String,
}

#[derive(Debug, Clone, Default, Deserialize)]
pub struct PodStatus {
    #[serde(default)]
    pub phase: Option<String>,
    /// A boxed slice: with it a cached pod fits a smaller allocation.
    #[serde(default, deserialize_with = "nullable")]
    pub conditions: Box<[PodCondition]>,
}

/// A pod condition.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PodCondition {
    #[serde(rename = "type", default)]
    pub type_: String,
    #[serde(default)]
    pub status: String,
    #[serde(default)]
    pub reason: Option<String>,
    #[serde(default)]
    pub message: Option<String>,
    #[serde(default)]
    pub last_transition_time: Option<Time>,
}

stands_for!(PodObject, Pod, metadata_api: false,);

impl PodObject {
    /// Whether the pod has finished (Succeeded or Failed): it holds no node.
    pub fn is_terminated(&self) -> bool {
        matches!(self.status.phase.as_deref(), Some("Succeeded" | "Failed"))
    }

    /// Whether the pod is being deleted (terminating).
    pub fn is_terminating(&self) -> bool {
        self.metadata.deletion_timestamp.is_some()
    }

    /// The scheduler's reason for not placing the pod, from its PodScheduled
    /// condition.
    pub fn unscheduled_reason(&self) -> Option<String> {
        self.status
            .conditions
            .iter()
            .find(|c| c.type_ == "PodScheduled" && c.status == "False")
            .map(|c| {
                c.message
                    .clone()
                    .or_else(|| c.reason.clone())
                    .unwrap_or_default()
            })
    }

    /// Since when the scheduler has reported the pod Unschedulable (no node fits
    /// it), with its message, if it does now.
    pub fn unschedulable(&self) -> Option<(&Time, &str)> {
        self.status
            .conditions
            .iter()
            .find(|c| {
                c.type_ == "PodScheduled"
                    && c.status == "False"
                    && c.reason.as_deref() == Some("Unschedulable")
            })
            .and_then(|c| {
                let since = c.last_transition_time.as_ref()?;
                Some((since, c.message.as_deref().unwrap_or_default()))
            })
    }

    /// Whether the pod's controller makes it again, the same, when it is deleted
    /// before it runs: a ReplicaSet, a StatefulSet or a ReplicationController. (A
    /// Job counts a deleted pod against its backoff limit, and Tekton or Argo
    /// fail the run; they are not.)
    pub fn is_remade_by_its_controller(&self) -> bool {
        self.metadata
            .owner_references
            .iter()
            .flatten()
            .filter(|o| o.controller == Some(true))
            .any(|o| {
                matches!(
                    (o.api_version.as_str(), o.kind.as_str()),
                    ("apps/v1", "ReplicaSet" | "StatefulSet") | ("v1", "ReplicationController")
                )
            })
    }

    /// The pod's uid, or its namespace and name: how held pods are told apart.
    pub fn key(&self) -> String {
        let meta = &self.metadata;
        meta.uid.clone().unwrap_or_else(|| {
            format!(
                "{}/{}",
                meta.namespace.as_deref().unwrap_or_default(),
                meta.name.as_deref().unwrap_or_default()
            )
        })
    }

    /// What the pod requests of its node: per resource, the larger of its
    /// containers' sum and its largest init container (they run one at a time
    /// before the others). Quantities berth cannot read count as nothing.
    pub fn requests(&self) -> BTreeMap<String, f64> {
        let mut total: BTreeMap<String, f64> = BTreeMap::new();
        for container in &self.spec.containers {
            for (key, value) in &container.resources.requests {
                *total.entry(key.clone()).or_default() += value;
            }
        }
        for container in &self.spec.init_containers {
            for (key, value) in &container.resources.requests {
                let slot = total.entry(key.clone()).or_default();
                *slot = slot.max(*value);
            }
        }
        total
    }

    /// Whether the pod's Ready condition is True.
    pub fn is_ready(&self) -> bool {
        self.status
            .conditions
            .iter()
            .any(|c| c.type_ == "Ready" && c.status == "True")
    }

    /// The Kubernetes PodGroup the pod belongs to (`spec.schedulingGroup`).
    pub fn pod_group_name(&self) -> Option<&str> {
        self.spec.scheduling_group.pod_group_name.as_deref()
    }

    /// The images of its containers, init containers first.
    pub fn images(&self) -> impl Iterator<Item = &str> {
        let spec = &self.spec;
        spec.init_containers
            .iter()
            .chain(&spec.containers)
            .filter_map(|c| c.image.as_deref())
    }

    /// The index of the scheduling gate `name`, if the pod is held by it.
    pub fn gate(&self, name: &str) -> Option<usize> {
        self.spec
            .scheduling_gates
            .iter()
            .position(|g| g.name == name)
    }

    /// Whether berth holds the pod by one of its scheduling gates.
    pub fn held_by_berth(&self) -> bool {
        self.spec
            .scheduling_gates
            .iter()
            .any(|g| is_berth_gate(&g.name))
    }
}

/// A Deployment or StatefulSet (`K`), as far as ordered start looks at it: desired
/// and Ready replicas, and its pod template's labels and images (to tell which
/// policy ranks it). The rest is skipped unparsed.
#[derive(Debug, Clone, Deserialize)]
#[serde(bound = "")]
pub struct WorkloadObject<K> {
    #[serde(default, deserialize_with = "lenient_meta")]
    pub metadata: ObjectMeta,
    #[serde(default, deserialize_with = "nullable")]
    pub spec: WorkloadSpec,
    #[serde(default, deserialize_with = "nullable")]
    pub status: WorkloadStatus,
    #[serde(skip)]
    kind: PhantomData<K>,
}

#[derive(Debug, Clone, Default, Deserialize)]
pub struct WorkloadSpec {
    /// Absent means 1, as in Kubernetes.
    #[serde(default)]
    pub replicas: Option<i32>,
    #[serde(default, deserialize_with = "nullable")]
    pub template: WorkloadTemplate,
}

#[derive(Debug, Clone, Default, Deserialize)]
pub struct WorkloadTemplate {
    #[serde(default, deserialize_with = "lenient_meta")]
    pub metadata: ObjectMeta,
    #[serde(default, deserialize_with = "nullable")]
    pub spec: WorkloadPodSpec,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct WorkloadPodSpec {
    #[serde(default, deserialize_with = "nullable")]
    pub containers: Vec<ImageOnly>,
    #[serde(default, deserialize_with = "nullable")]
    pub init_containers: Vec<ImageOnly>,
}

#[derive(Debug, Clone, Default, Deserialize)]
pub struct ImageOnly {
    #[serde(default)]
    pub name: String,
    #[serde(default)]
    pub image: Option<String>,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct WorkloadStatus {
    #[serde(default)]
    pub observed_generation: Option<i64>,
    #[serde(default)]
    pub ready_replicas: Option<i32>,
    #[serde(default)]
    pub updated_replicas: Option<i32>,
}

stands_for!(WorkloadObject<K>, K, metadata_api: false, <K: Resource<DynamicType = ()>>);

impl<K> WorkloadObject<K> {
    pub fn desired(&self) -> i32 {
        self.spec.replicas.unwrap_or(1)
    }

    pub fn ready(&self) -> i32 {
        self.status.ready_replicas.unwrap_or(0)
    }

    /// Its controller has seen the latest spec and every desired replica runs it.
    pub fn rolled_out(&self) -> bool {
        let observed = self.status.observed_generation.unwrap_or(0);
        observed >= self.metadata.generation.unwrap_or(0)
            && self.status.updated_replicas.unwrap_or(0) >= self.desired()
    }
}

/// A Deployment, for ordered start.
pub type DeploymentObject = WorkloadObject<k8s_openapi::api::apps::v1::Deployment>;
/// A StatefulSet, for ordered start.
pub type StatefulSetObject = WorkloadObject<k8s_openapi::api::apps::v1::StatefulSet>;

/// A PlacementPolicy, its spec raw: read into berth's types one object at a time,
/// so a spec this berth cannot read (a field from a newer berth) is one policy
/// reported, not a failed watch.
#[derive(Debug, Clone, Deserialize)]
pub struct PolicyObject {
    #[serde(default, deserialize_with = "lenient_meta")]
    pub metadata: ObjectMeta,
    #[serde(default)]
    pub spec: Value,
    #[serde(default)]
    pub status: Option<Value>,
}

stands_for!(PolicyObject, PlacementPolicy, metadata_api: false,);

impl PolicyObject {
    /// The policy as berth's types read it, or why they cannot.
    pub fn source(&self) -> PolicySource {
        let policy = PlacementPolicySpec::deserialize(&self.spec)
            .map(|spec| PlacementPolicy {
                metadata: self.metadata.clone(),
                spec,
                status: None,
            })
            .map_err(|e| e.to_string());
        let last_good = self
            .status
            .as_ref()
            .and_then(|s| s.get("lastGoodSpec"))
            .and_then(|spec| PlacementPolicySpec::deserialize(spec).ok())
            .map(|spec| PlacementPolicy {
                metadata: self.metadata.clone(),
                spec,
                status: None,
            });
        PolicySource {
            name: self.metadata.name.clone().unwrap_or_default(),
            uid: self.metadata.uid.clone(),
            deleting: self.metadata.deletion_timestamp.is_some(),
            policy,
            last_good,
        }
    }
}

/// A DaemonSet, as far as the controller brings its pod template in line: the
/// template's tolerations, node affinity and scheduling gates, raw. The rest of the
/// spec (a tenant writes it) is skipped unparsed.
#[derive(Debug, Clone, Deserialize)]
pub struct DaemonSetObject {
    #[serde(default, deserialize_with = "lenient_meta")]
    pub metadata: ObjectMeta,
    #[serde(default, deserialize_with = "nullable")]
    spec: DaemonSetSpec,
}

#[derive(Debug, Clone, Default, Deserialize)]
struct DaemonSetSpec {
    #[serde(default, deserialize_with = "nullable")]
    template: Template,
}

#[derive(Debug, Clone, Default, Deserialize)]
struct Template {
    #[serde(default, deserialize_with = "nullable")]
    spec: TemplateSpec,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
struct TemplateSpec {
    #[serde(default)]
    tolerations: Option<Value>,
    #[serde(default)]
    affinity: Option<Value>,
    #[serde(default)]
    scheduling_gates: Option<Value>,
}

stands_for!(DaemonSetObject, DaemonSet, metadata_api: false,);

impl DaemonSetObject {
    /// The DaemonSet as JSON, with the part of its template the patch reads.
    pub fn as_json(&self) -> Value {
        let t = &self.spec.template.spec;
        let mut spec = Map::new();
        for (key, value) in [
            ("tolerations", &t.tolerations),
            ("affinity", &t.affinity),
            ("schedulingGates", &t.scheduling_gates),
        ] {
            if let Some(value) = value {
                spec.insert(key.into(), value.clone());
            }
        }
        serde_json::json!({"spec": {"template": {"spec": spec}}})
    }
}

/// How long the apiserver keeps one watch open before berth's watcher resumes it
/// from where it was (no relist): about a request a minute per watch.
pub const WATCH_SECONDS: u32 = 60;

/// How every watch of berth's is opened. The watcher gives up on a watch that has
/// sent nothing for [`WATCH_SECONDS`] and a few seconds more, and opens it again:
/// a connection that went silent (a lost NAT entry, a partition that sends no
/// reset) is noticed within about a minute, not after the default five.
pub fn watch_config() -> kube::runtime::watcher::Config {
    kube::runtime::watcher::Config::default().timeout(WATCH_SECONDS)
}

#[cfg(test)]
mod tests {
    use super::*;
    use kube::core::ObjectList;

    /// What a poisoned pod looks like to a watch: managedFields too deep for a
    /// recursive parser, and a time out of range.
    fn poisoned_pod(name: &str) -> String {
        let deep = format!(
            "{}{}",
            "{\"f:x\":".repeat(300),
            "{}".to_owned() + &"}".repeat(300)
        );
        format!(
            r#"{{"apiVersion":"v1","kind":"Pod","metadata":{{"name":"{name}","namespace":"t","uid":"u-{name}",
            "creationTimestamp":"2026-11-23T10:00:00Z",
            "managedFields":[{{"manager":"x","time":"9999-12-31T23:59:59Z","fieldsType":"FieldsV1","fieldsV1":{deep}}}]}},
            "spec":{{"nodeName":"node2","containers":[{{"name":"c","image":"x"}}]}},"status":{{"phase":"Pending"}}}}"#
        )
    }

    #[test]
    fn a_poisoned_pod_does_not_fail_the_list_page_that_holds_it() {
        let page = format!(
            r#"{{"apiVersion":"v1","kind":"PodList","metadata":{{"resourceVersion":"7"}},"items":[{},{}]}}"#,
            poisoned_pod("a"),
            poisoned_pod("b")
        );
        assert!(
            serde_json::from_str::<ObjectList<Pod>>(&page).is_err(),
            "the full type fails, which is why these types exist"
        );
        let list: ObjectList<PodObject> = serde_json::from_str(&page).expect("lenient read");
        assert_eq!(list.items.len(), 2);
        assert_eq!(list.items[1].spec.node_name.as_deref(), Some("node2"));
        assert!(list.items[0].metadata.creation_timestamp.is_some());
        assert!(list.items[0].metadata.managed_fields.is_none());
    }

    #[test]
    fn a_policy_whose_spec_this_berth_cannot_read_is_reported_alone() {
        let object: PolicyObject = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "cdn", "uid": "u"},
            "spec": {"pool": {"nodeNames": ["node2"]}, "fromTheFuture": true}}))
        .unwrap();
        let source = object.source();
        assert_eq!(source.name, "cdn");
        assert!(source.policy.unwrap_err().contains("fromTheFuture"));
    }

    #[test]
    fn a_daemonset_is_read_only_as_far_as_its_template_patch_goes() {
        let deep = format!("{}{{}}{}", "{\"f:x\":".repeat(300), "}".repeat(300));
        let text = format!(
            r#"{{"metadata":{{"name":"agent","namespace":"logs","resourceVersion":"9"}},
            "spec":{{"selector":{{}},"template":{{"metadata":{{"managedFields":[{{"time":"9999-12-31T23:59:59Z","fieldsV1":{deep}}}],
            "annotations":{{"x":{deep}}}}},"spec":{{"tolerations":[{{"operator":"Exists"}}],"containers":[{{"name":"c"}}]}}}}}}}}"#
        );
        let daemonset: DaemonSetObject = serde_json::from_str(&text).expect("lenient read");
        assert_eq!(
            daemonset.as_json(),
            serde_json::json!({"spec": {"template": {"spec": {"tolerations": [{"operator": "Exists"}]}}}})
        );
    }

    /// Bytes this thread holds now, from jemalloc's own counters.
    fn held() -> u64 {
        let allocated = tikv_jemalloc_ctl::thread::allocatedp::read().unwrap().get();
        let freed = tikv_jemalloc_ctl::thread::deallocatedp::read()
            .unwrap()
            .get();
        allocated - freed
    }

    #[test]
    fn a_held_pod_is_kept_compact_and_a_huge_one_costs_nothing_more() {
        let pod = |tolerations: usize| {
            let list: Vec<String> = (0..tolerations)
                .map(|i| format!(r#"{{"key":"k{i}","operator":"Exists","effect":"NoSchedule"}}"#))
                .collect();
            format!(
                r#"{{"metadata":{{"name":"p","namespace":"t","uid":"u"}},
                "spec":{{"schedulingGates":[{{"name":"berth.io/avoid"}}],"tolerations":[{}],
                "containers":[{{"name":"c","image":"nginx","env":[{{"name":"A","value":"{}"}}]}}]}}}}"#,
                list.join(","),
                "x".repeat(100_000)
            )
        };
        // Within the bound: kept typed, a few times its bytes.
        let small = pod(100);
        let before = held();
        let object: PodObject = serde_json::from_str(&small).unwrap();
        let kept = held() - before;
        assert!(matches!(object.spec.tolerations, Bounded::Kept(ref t) if t.len() == 100));
        assert!(
            kept < 64 * 1024,
            "kept {kept} bytes for a pod of {}",
            small.len()
        );
        drop(object);
        // 1.3 MB of tolerations: known to be too large, and nothing of it is kept.
        let huge = pod(25_000);
        assert!(huge.len() > 1_300_000);
        let before = held();
        let object: PodObject = serde_json::from_str(&huge).unwrap();
        let kept = held() - before;
        assert_eq!(object.spec.tolerations, Bounded::TooLarge);
        assert!(
            kept < 16 * 1024,
            "kept {kept} bytes for a pod of {}",
            huge.len()
        );
        assert!(
            crate::placement::feasibility::Placement::of_object(&object).is_none(),
            "never released on a guess"
        );
    }

    #[test]
    fn metadata_only_types_ask_for_metadata() {
        assert!(NodeMeta::metadata_api());
        assert!(!NodeObject::metadata_api());
        assert_eq!(NodeMeta::plural(&()), "nodes");
        assert_eq!(PolicyObject::group(&()), "berth.io");
    }
}
