//! A lenient, read-only view of the pod under admission.
//!
//! berth reads only the fields it decides on, into its own small types: never
//! `metadata.managedFields` (free-form, any depth, timestamps a user may set out of
//! any range), never `status`, and nothing else it does not need. A pod is refused
//! only when a field berth needs has the wrong shape. The view also says which
//! objects and lists the pod has, as sent, for the patch ([`super::patch`]), whose
//! targeted operations leave every field these types do not know as it was.

use std::borrow::Cow;
use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{
    NodeSelectorRequirement, NodeSelectorTerm, PreferredSchedulingTerm, Toleration,
};
use serde::de::{DeserializeSeed, IgnoredAny, MapAccess, Visitor};
use serde::{Deserialize, Deserializer};
use serde_json::Value;

use crate::bounds::{
    CONTAINERS, OWNER_REFERENCES, PREFERRED_TERMS, REQUIRED_TERMS, SCHEDULING_GATES,
    TERM_REQUIREMENTS, TOLERATIONS,
};
use crate::names::{APPLIED_ANNOTATION, is_daemonset_controller};
use crate::objects::{ImageOnly, WorkloadObject};
use crate::policy::ImageRef;
use crate::policy::compile::Labels;
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

/// `null` reads as the default: YAML and older clients write `tolerations: null`.
fn nullable<'de, D, T>(deserializer: D) -> Result<T, D::Error>
where
    D: Deserializer<'de>,
    T: Deserialize<'de> + Default,
{
    Ok(Option::<T>::deserialize(deserializer)?.unwrap_or_default())
}

/// A field that reads `null` as its default, as [`nullable`] does, and says
/// whether the pod has it at all: the patch adds an object or a list the pod lacks
/// (absent or `null`) whole, and adds to one it has.
#[derive(Debug, Clone, Default)]
struct Present<T> {
    value: T,
    present: bool,
}

impl<'de, T: Deserialize<'de> + Default> Deserialize<'de> for Present<T> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let value = Option::<T>::deserialize(deserializer)?;
        Ok(Present {
            present: value.is_some(),
            value: value.unwrap_or_default(),
        })
    }
}

impl<T> std::ops::Deref for Present<T> {
    type Target = T;

    fn deref(&self) -> &T {
        &self.value
    }
}

/// A list of which berth keeps at most `MOST` items, its bound
/// ([`crate::bounds`]): the rest are stepped over and only counted, so that a list
/// over its bound costs no more to read than one at it, and is refused by its
/// length. Each item is read as `R` (itself, or for a node-selector term a type
/// that bounds the term's own lists, [`ReadTerm`]).
///
/// Hand-written (one visitor): a derived `Vec` would build every item before the
/// bound is checked, and an item of a few bytes (`{}`) becomes a struct of a
/// hundred, so what a review holds would no longer be within what it is charged
/// (see `crate::admission::review::read_cost`).
#[derive(Debug, Clone, Default)]
struct Bounded<T, const MOST: usize, R = T> {
    items: Vec<T>,
    /// Items stepped over past the bound.
    over: usize,
    /// The longest list within an item, kept or not (a term's requirements).
    longest: usize,
    read: std::marker::PhantomData<R>,
}

/// An item of a [`Bounded`] list as read, and the length of its longest list.
trait ReadItem<T> {
    fn into_item(self) -> (T, usize);
}

impl<T> ReadItem<T> for T {
    fn into_item(self) -> (T, usize) {
        (self, 0)
    }
}

impl<T, const MOST: usize, R> Bounded<T, MOST, R> {
    /// Every item, kept whatever the bound: for a list berth made itself.
    fn all(items: Vec<T>) -> Self {
        Bounded {
            items,
            over: 0,
            longest: 0,
            read: std::marker::PhantomData,
        }
    }

    /// How many items the list has, kept or not.
    fn count(&self) -> usize {
        self.items.len() + self.over
    }
}

impl<T, const MOST: usize, R> std::ops::Deref for Bounded<T, MOST, R> {
    type Target = [T];

    fn deref(&self) -> &[T] {
        &self.items
    }
}

impl<'a, T, const MOST: usize, R> IntoIterator for &'a Bounded<T, MOST, R> {
    type Item = &'a T;
    type IntoIter = std::slice::Iter<'a, T>;

    fn into_iter(self) -> Self::IntoIter {
        self.items.iter()
    }
}

impl<'de, T, R: Deserialize<'de> + ReadItem<T>, const MOST: usize> Deserialize<'de>
    for Bounded<T, MOST, R>
{
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_seq(BoundedVisitor(std::marker::PhantomData))
    }
}

struct BoundedVisitor<T, R, const MOST: usize>(std::marker::PhantomData<(T, R)>);

impl<'de, T, R: Deserialize<'de> + ReadItem<T>, const MOST: usize> Visitor<'de>
    for BoundedVisitor<T, R, MOST>
{
    type Value = Bounded<T, MOST, R>;

    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("a sequence")
    }

    fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
        let mut list = Bounded::all(Vec::new());
        while list.items.len() < MOST {
            let Some(read) = seq.next_element::<R>()? else {
                return Ok(list);
            };
            let (item, longest) = read.into_item();
            list.items.push(item);
            list.longest = list.longest.max(longest);
        }
        while seq.next_element::<IgnoredAny>()?.is_some() {
            list.over += 1;
        }
        Ok(list)
    }
}

/// Requirements of a node-selector term, read within their bound.
type Requirements = Option<Bounded<NodeSelectorRequirement, { TERM_REQUIREMENTS.most }>>;

/// A node-selector term read with its requirements bounded ([`Bounded`]), as
/// Kubernetes' type reads it otherwise.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
struct ReadTerm {
    #[serde(default)]
    match_expressions: Requirements,
    #[serde(default)]
    match_fields: Requirements,
}

impl ReadItem<NodeSelectorTerm> for ReadTerm {
    fn into_item(self) -> (NodeSelectorTerm, usize) {
        let count = |list: &Requirements| list.as_ref().map_or(0, |l| l.count());
        let longest = count(&self.match_expressions).max(count(&self.match_fields));
        let term = NodeSelectorTerm {
            match_expressions: self.match_expressions.map(|l| l.items),
            match_fields: self.match_fields.map(|l| l.items),
        };
        (term, longest)
    }
}

/// A preferred term, its requirements read as [`ReadTerm`] reads them.
#[derive(Debug, Clone, Default, Deserialize)]
struct ReadPreferred {
    #[serde(default)]
    weight: i32,
    #[serde(default)]
    preference: Option<ReadTerm>,
}

impl ReadItem<PreferredSchedulingTerm> for ReadPreferred {
    fn into_item(self) -> (PreferredSchedulingTerm, usize) {
        let (preference, longest) = self.preference.map(ReadTerm::into_item).unwrap_or_default();
        let weight = self.weight;
        (PreferredSchedulingTerm { weight, preference }, longest)
    }
}

/// A member's key, borrowed from the input when it holds no escapes: the key of a
/// member that is skipped costs no allocation.
struct Key<'de>(std::borrow::Cow<'de, str>);

impl<'de> Deserialize<'de> for Key<'de> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_str(KeyVisitor)
    }
}

struct KeyVisitor;

impl<'de> Visitor<'de> for KeyVisitor {
    type Value = Key<'de>;

    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("a key")
    }

    fn visit_borrowed_str<E: serde::de::Error>(self, key: &'de str) -> Result<Key<'de>, E> {
        Ok(Key(key.into()))
    }

    fn visit_str<E: serde::de::Error>(self, key: &str) -> Result<Key<'de>, E> {
        Ok(Key(key.to_owned().into()))
    }
}

/// A field as the pod has it: absent is `None`, `null` is `Some(None)` (the patch
/// removes a field the pod has, even `null`).
fn even_null<'de, D, T>(deserializer: D) -> Result<Option<Option<T>>, D::Error>
where
    D: Deserializer<'de>,
    T: Deserialize<'de>,
{
    Option::<T>::deserialize(deserializer).map(Some)
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Fields {
    #[serde(default)]
    kind: Option<String>,
    #[serde(default)]
    metadata: Present<Meta>,
    #[serde(default)]
    spec: Present<Spec>,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Meta {
    #[serde(default, deserialize_with = "nullable")]
    labels: Labels,
    /// Of the annotations, the one berth reads: its record of what it applied.
    #[serde(default, rename = "annotations")]
    applied: Present<AppliedRecord>,
    #[serde(default, deserialize_with = "nullable")]
    owner_references: Bounded<OwnerReference, { OWNER_REFERENCES.most }>,
}

/// The `berth.io/applied` annotation of a pod's annotations, the others stepped
/// over rather than copied (a pod may carry many, and berth reads none of them).
#[derive(Debug, Clone, Default)]
struct AppliedRecord(Option<String>);

impl<'de> Deserialize<'de> for AppliedRecord {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let picked = Picked::new([APPLIED_ANNOTATION], "a map of annotations", |_| false);
        let ([record], _) = picked.deserialize(deserializer)?;
        Ok(AppliedRecord(record))
    }
}

/// Of a map, the values of `keys` (the last of a repeated key), each read as `T`,
/// and whether any of its keys is `notable`; the other members are stepped over
/// rather than copied.
struct Picked<T, const N: usize> {
    keys: [&'static str; N],
    what: &'static str,
    notable: fn(&str) -> bool,
    value: std::marker::PhantomData<T>,
}

impl<T, const N: usize> Picked<T, N> {
    fn new(keys: [&'static str; N], what: &'static str, notable: fn(&str) -> bool) -> Self {
        Picked {
            keys,
            what,
            notable,
            value: std::marker::PhantomData,
        }
    }
}

impl<'de, T: Deserialize<'de>, const N: usize> DeserializeSeed<'de> for Picked<T, N> {
    type Value = ([Option<T>; N], bool);

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<Self::Value, D::Error> {
        deserializer.deserialize_map(self)
    }
}

impl<'de, T: Deserialize<'de>, const N: usize> Visitor<'de> for Picked<T, N> {
    type Value = ([Option<T>; N], bool);

    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str(self.what)
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let mut picked = std::array::from_fn(|_| None);
        let mut any = false;
        while let Some(Key(key)) = map.next_key()? {
            any |= (self.notable)(&key);
            match self.keys.iter().position(|k| *k == key) {
                Some(i) => picked[i] = Some(map.next_value()?),
                None => {
                    map.next_value::<IgnoredAny>()?;
                }
            }
        }
        Ok((picked, any))
    }
}

pub use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Spec {
    #[serde(default, deserialize_with = "nullable")]
    containers: Bounded<Container, { CONTAINERS.most }>,
    #[serde(default, deserialize_with = "nullable")]
    init_containers: Bounded<Container, { CONTAINERS.most }>,
    #[serde(default)]
    tolerations: Present<Bounded<Toleration, { TOLERATIONS.most }>>,
    #[serde(default, deserialize_with = "even_null")]
    node_name: Option<Option<String>>,
    #[serde(default, deserialize_with = "nullable")]
    node_selector: BTreeMap<String, String>,
    #[serde(default)]
    affinity: Present<Affinity>,
    #[serde(default)]
    scheduler_name: Option<String>,
    #[serde(default)]
    scheduling_gates: Present<Bounded<Gate, { SCHEDULING_GATES.most }>>,
    #[serde(default)]
    priority_class_name: Option<String>,
    /// The priority and preemption policy as sent, for the patch to compare with
    /// what a queue's PriorityClass sets: berth reads nothing else of them.
    #[serde(default)]
    priority: Option<Scalar>,
    #[serde(default)]
    preemption_policy: Option<Scalar>,
    #[serde(default, deserialize_with = "nullable")]
    scheduling_group: SchedulingGroup,
    /// Pod-level resources: when set, they decide the QoS class.
    #[serde(default, deserialize_with = "nullable")]
    resources: Resources,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Container {
    #[serde(default)]
    name: String,
    #[serde(default)]
    image: Option<String>,
    #[serde(default, deserialize_with = "nullable")]
    resources: Resources,
    /// `Always` on an init container makes it a sidecar, running beside the
    /// containers rather than before them.
    #[serde(default)]
    restart_policy: Option<String>,
}

impl Container {
    fn is_sidecar(&self) -> bool {
        self.restart_policy.as_deref() == Some("Always")
    }
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
struct SchedulingGroup {
    #[serde(default)]
    pod_group_name: Option<String>,
}

/// Requests and limits, as the QoS class reads them.
#[derive(Debug, Clone, Default, Deserialize)]
struct Resources {
    #[serde(default, deserialize_with = "nullable")]
    requests: Compute,
    #[serde(default, deserialize_with = "nullable")]
    limits: Compute,
}

/// Of a list of requests or limits, the CPU and memory, each quantity raw (a
/// string, or a number from some clients), and whether it names a resource that
/// pod-level resources manage; other resources are stepped over rather than
/// copied.
#[derive(Debug, Clone, Default)]
struct Compute {
    cpu: Option<Scalar>,
    memory: Option<Scalar>,
    names_pod_level: bool,
}

/// A JSON value berth compares or reads as a number, as sent when it is a string,
/// a number or a boolean. An array or an object is none of these: it is stepped
/// over rather than built, and kept as `null`, which equals nothing berth writes
/// and reads as no quantity.
#[derive(Debug, Clone)]
struct Scalar(serde_json::Value);

impl Scalar {
    fn json(&self) -> &serde_json::Value {
        &self.0
    }
}

impl<'de> Deserialize<'de> for Scalar {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_any(ScalarVisitor)
    }
}

struct ScalarVisitor;

impl<'de> Visitor<'de> for ScalarVisitor {
    type Value = Scalar;

    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("any JSON value")
    }

    fn visit_bool<E: serde::de::Error>(self, value: bool) -> Result<Scalar, E> {
        Ok(Scalar(value.into()))
    }

    fn visit_i64<E: serde::de::Error>(self, value: i64) -> Result<Scalar, E> {
        Ok(Scalar(value.into()))
    }

    fn visit_u64<E: serde::de::Error>(self, value: u64) -> Result<Scalar, E> {
        Ok(Scalar(value.into()))
    }

    fn visit_f64<E: serde::de::Error>(self, value: f64) -> Result<Scalar, E> {
        Ok(Scalar(value.into()))
    }

    fn visit_str<E: serde::de::Error>(self, value: &str) -> Result<Scalar, E> {
        Ok(Scalar(value.into()))
    }

    fn visit_unit<E: serde::de::Error>(self) -> Result<Scalar, E> {
        Ok(Scalar(serde_json::Value::Null))
    }

    fn visit_none<E: serde::de::Error>(self) -> Result<Scalar, E> {
        Ok(Scalar(serde_json::Value::Null))
    }

    fn visit_some<D: Deserializer<'de>>(self, deserializer: D) -> Result<Scalar, D::Error> {
        Scalar::deserialize(deserializer)
    }

    fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> Result<Scalar, A::Error> {
        while seq.next_element::<IgnoredAny>()?.is_some() {}
        Ok(Scalar(serde_json::Value::Null))
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Scalar, A::Error> {
        while map.next_entry::<IgnoredAny, IgnoredAny>()?.is_some() {}
        Ok(Scalar(serde_json::Value::Null))
    }
}

/// The resources a pod's own `resources` may set: CPU, memory and hugepages
/// (Kubernetes' `IsSupportedPodLevelResource`). Only when they name one of these
/// do they decide the pod's QoS class.
fn is_pod_level_resource(name: &str) -> bool {
    matches!(name, "cpu" | "memory") || name.starts_with("hugepages-")
}

impl Compute {
    /// The raw quantity of `cpu` or `memory`.
    fn get(&self, resource: &str) -> Option<&serde_json::Value> {
        let amount = match resource {
            "cpu" => self.cpu.as_ref(),
            "memory" => self.memory.as_ref(),
            _ => None,
        };
        amount.map(Scalar::json)
    }
}

impl<'de> Deserialize<'de> for Compute {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let picked = Picked::new(
            ["cpu", "memory"],
            "a map of resource quantities",
            is_pod_level_resource,
        );
        let ([cpu, memory], names_pod_level) = picked.deserialize(deserializer)?;
        Ok(Compute {
            cpu,
            memory,
            names_pod_level,
        })
    }
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Affinity {
    #[serde(default)]
    node_affinity: Present<NodeAffinity>,
    #[serde(default, deserialize_with = "nullable")]
    pod_affinity: PodAffinity,
}

/// Of a pod's pod affinity, whether it has required terms (read without keeping
/// them).
#[derive(Debug, Clone, Default, Deserialize)]
struct PodAffinity {
    #[serde(
        default,
        rename = "requiredDuringSchedulingIgnoredDuringExecution",
        deserialize_with = "nullable"
    )]
    required: Vec<serde::de::IgnoredAny>,
}

/// Node affinity as Kubernetes reads it. `required: null` (or absent) is no
/// requirement at all, while a `required` object whose `nodeSelectorTerms` is
/// empty or `null` matches no node: the two must not be confused, or berth would
/// turn "nowhere" into "anywhere".
#[derive(Debug, Clone, Default, Deserialize)]
struct NodeAffinity {
    #[serde(default, rename = "requiredDuringSchedulingIgnoredDuringExecution")]
    required: Option<NodeSelector>,
    #[serde(default, rename = "preferredDuringSchedulingIgnoredDuringExecution")]
    preferred: Present<Bounded<PreferredSchedulingTerm, { PREFERRED_TERMS.most }, ReadPreferred>>,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
struct NodeSelector {
    #[serde(default)]
    node_selector_terms: Present<Bounded<NodeSelectorTerm, { REQUIRED_TERMS.most }, ReadTerm>>,
}

#[derive(Debug, Clone, Default, Deserialize)]
struct Gate {
    #[serde(default)]
    name: String,
}

/// The fields of a pod that placement looks at.
#[derive(Debug, Clone, Default)]
pub struct PodView {
    fields: Fields,
}

/// A pod read straight from JSON text into its view, as an AdmissionReview's
/// object is read: no JSON value is built and dropped on the way. The fields it
/// reads are those [`PodView::read`] reads, by the same types, so the two read
/// every pod alike. A pod whose fields have the wrong shape fails the read (the
/// reader then says why, through [`PodView::read`]); one of another kind or over
/// a bound is read, as the reason berth refuses it.
///
/// It is boxed at once: a review is moved from step to step of its read, and
/// copying the view with it cost more than its allocation.
pub struct ReadPod(pub Box<Result<PodView, String>>);

impl<'de> Deserialize<'de> for ReadPod {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let fields = Fields::deserialize(deserializer)?;
        Ok(ReadPod(Box::new(PodView::checked(fields))))
    }
}

/// A pod template (a DaemonSet's `spec.template`) read as the pod it makes, as
/// [`ReadPod`] reads a pod: its metadata and spec are the pod's, present even
/// when the template leaves them out.
pub struct ReadTemplate(pub Box<Result<PodView, String>>);

impl<'de> Deserialize<'de> for ReadTemplate {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let mut fields = Fields::deserialize(deserializer)?;
        fields.kind = None;
        fields.metadata.present = true;
        fields.spec.present = true;
        Ok(ReadTemplate(Box::new(PodView::checked(fields))))
    }
}

/// One container image of the pod and the container that runs it.
#[derive(Debug, Clone)]
pub struct ContainerImage {
    pub container: String,
    pub init: bool,
    pub image: ImageRef,
}

impl PodView {
    /// Reads the fields berth needs from `raw`; the error says which field has the
    /// wrong shape.
    /// A pod over one of the [`crate::bounds`] is refused with the bound it breaks.
    pub fn read(raw: &serde_json::Value) -> Result<PodView, String> {
        let fields = Fields::deserialize(raw).map_err(|e| format!("not a readable Pod: {e}"))?;
        PodView::checked(fields)
    }

    /// The view of `fields`, unless they are of another kind or over a bound.
    fn checked(fields: Fields) -> Result<PodView, String> {
        if let Some(kind) = fields.kind.as_deref().filter(|k| *k != "Pod") {
            return Err(format!("expected a Pod, got kind {kind}"));
        }
        let view = PodView { fields };
        match crate::bounds::over(&view.counts()) {
            Some(reason) => Err(reason),
            None => Ok(view),
        }
    }

    /// A workload's pod template as policy matching reads it: its labels and its
    /// containers' (name, image), init containers apart; built directly, without a
    /// JSON pod to read again.
    pub fn of_workload<K>(workload: &WorkloadObject<K>) -> PodView {
        let template = &workload.spec.template;
        let list = |items: &[ImageOnly]| {
            items
                .iter()
                .map(|c| Container {
                    name: c.name.clone(),
                    image: c.image.clone(),
                    ..Container::default()
                })
                .collect()
        };
        let mut fields = Fields::default();
        fields.metadata.value.labels = template.metadata.labels.clone().unwrap_or_default();
        fields.spec.value.containers = Bounded::all(list(&template.spec.containers));
        fields.spec.value.init_containers = Bounded::all(list(&template.spec.init_containers));
        PodView { fields }
    }

    /// The length of each list [`crate::bounds`] bounds.
    fn counts(&self) -> Vec<(crate::bounds::Bound, usize)> {
        use crate::bounds::*;
        let spec = &self.fields.spec;
        let node_affinity = &spec.affinity.node_affinity;
        let terms = node_affinity
            .required
            .as_ref()
            .map(|r| &r.node_selector_terms);
        let preferred = &node_affinity.preferred;
        let longest_term = terms.map_or(0, |t| t.longest).max(preferred.longest);
        let meta = &self.fields.metadata;
        vec![
            (LABELS, meta.labels.len()),
            (OWNER_REFERENCES, meta.owner_references.count()),
            (TOLERATIONS, spec.tolerations.count()),
            (SCHEDULING_GATES, spec.scheduling_gates.count()),
            (REQUIRED_TERMS, terms.map_or(0, |t| t.count())),
            (PREFERRED_TERMS, preferred.count()),
            (TERM_REQUIREMENTS, longest_term),
            (
                CONTAINERS,
                spec.containers.count().max(spec.init_containers.count()),
            ),
        ]
    }

    pub fn labels(&self) -> &Labels {
        &self.fields.metadata.labels
    }

    /// The `berth.io/applied` annotation: berth's record of the policies it
    /// applied.
    pub fn applied_record(&self) -> Option<&str> {
        self.fields.metadata.applied.0.as_deref()
    }

    /// The controller ownerReference(s): who recreates the pod.
    pub fn controllers(&self) -> impl Iterator<Item = &OwnerReference> {
        self.fields
            .metadata
            .owner_references
            .iter()
            .filter(|o| o.controller == Some(true))
    }

    /// Images of init containers and containers, in that order.
    pub fn images(&self) -> Vec<ContainerImage> {
        let spec = &self.fields.spec;
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

    pub fn tolerations(&self) -> &[Toleration] {
        &self.fields.spec.tolerations
    }

    /// The node the pod names, if any (an empty name is none, as in Kubernetes).
    pub fn node_name(&self) -> Option<&str> {
        self.fields
            .spec
            .node_name
            .as_ref()
            .and_then(Option::as_deref)
            .filter(|n| !n.is_empty())
    }

    pub fn node_selector(&self) -> &BTreeMap<String, String> {
        &self.fields.spec.node_selector
    }

    pub fn scheduler_name(&self) -> Option<&str> {
        self.fields.spec.scheduler_name.as_deref()
    }

    pub fn scheduling_gates(&self) -> impl Iterator<Item = &str> {
        self.fields
            .spec
            .scheduling_gates
            .iter()
            .map(|g| g.name.as_str())
    }

    /// The terms of the required node affinity (ORed); `None` when the pod has no
    /// required node affinity. `Some` of no terms matches no node.
    pub fn required_affinity(&self) -> Option<&[NodeSelectorTerm]> {
        let required = self.fields.spec.affinity.node_affinity.required.as_ref()?;
        Some(&required.node_selector_terms)
    }

    /// The preferred node-affinity terms.
    /// Whether the pod must sit beside other pods (a required pod affinity term).
    pub fn requires_pod_affinity(&self) -> bool {
        !self.fields.spec.affinity.pod_affinity.required.is_empty()
    }

    pub fn preferred_terms(&self) -> &[PreferredSchedulingTerm] {
        &self.fields.spec.affinity.node_affinity.preferred
    }

    /// The Kubernetes PodGroup the pod names itself (`spec.schedulingGroup`).
    pub fn pod_group_name(&self) -> Option<&str> {
        self.fields.spec.scheduling_group.pod_group_name.as_deref()
    }

    pub fn priority_class_name(&self) -> Option<&str> {
        self.fields.spec.priority_class_name.as_deref()
    }

    /// The pod's QoS class as the apiserver records it (`ComputePodQOS` at create):
    /// from the pod's own resources when they name CPU, memory or hugepages, once
    /// filled from its containers as the apiserver fills them
    /// ([`PodView::pod_level`]), else from its containers and init containers,
    /// each a class of its own; containers of different classes make the pod
    /// Burstable.
    pub fn qos_class(&self) -> QosClass {
        let spec = &self.fields.spec;
        let own = &spec.resources;
        if own.requests.names_pod_level || own.limits.names_pod_level {
            return requirements_qos(|key| self.pod_level(key));
        }
        spec.init_containers
            .iter()
            .chain(&spec.containers)
            .map(|c| requirements_qos(|key| (c.resources.request(key), c.resources.limit(key))))
            .reduce(same_or_burstable)
            .unwrap_or(QosClass::BestEffort)
    }

    /// The pod-level request and limit of `key` (CPU or memory) as the apiserver
    /// stores them (`DefaultPodLevelResources`, after admission): a request left
    /// out is what the containers request together, else the pod's limit; a limit
    /// left out, when every container limits `key`, is what they limit together
    /// or the request, whichever is more.
    fn pod_level(&self, key: &str) -> (Option<f64>, Option<f64>) {
        let spec = &self.fields.spec;
        let own = &spec.resources;
        let limit = own.limit(key);
        let request = quantity(&own.requests, key)
            .or_else(|| together(spec, |c| c.resources.request(key)))
            .or(limit);
        let all_limit = || {
            spec.init_containers
                .iter()
                .chain(&spec.containers)
                .all(|c| c.resources.limit(key).is_some())
        };
        let limit = match (limit, request) {
            (None, Some(request)) if all_limit() => {
                together(spec, |c| c.resources.limit(key)).map(|l| l.max(request))
            }
            (limit, _) => limit,
        };
        (request, limit)
    }

    /// The DaemonSet that controls the pod, as its ownerReferences say
    /// ([`daemonset_owner`]): any user can write that; see
    /// [`PodView::is_daemonset_pod`].
    pub fn daemonset_owner(&self) -> Option<&OwnerReference> {
        daemonset_owner(&self.fields.metadata.owner_references)
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

/// The objects of a pod that berth's patch may have to create, each under its
/// parent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Part {
    Metadata,
    Annotations,
    Spec,
    Affinity,
    NodeAffinity,
    RequiredNodeAffinity,
}

impl Part {
    pub fn parent(self) -> Option<Part> {
        match self {
            Part::Metadata | Part::Spec => None,
            Part::Annotations => Some(Part::Metadata),
            Part::Affinity => Some(Part::Spec),
            Part::NodeAffinity => Some(Part::Affinity),
            Part::RequiredNodeAffinity => Some(Part::NodeAffinity),
        }
    }

    /// Where it stands in the pod, as JSON Pointer tokens.
    pub fn path(self) -> &'static [&'static str] {
        match self {
            Part::Metadata => &["metadata"],
            Part::Annotations => &["metadata", "annotations"],
            Part::Spec => &["spec"],
            Part::Affinity => &["spec", "affinity"],
            Part::NodeAffinity => &["spec", "affinity", "nodeAffinity"],
            Part::RequiredNodeAffinity => &[
                "spec",
                "affinity",
                "nodeAffinity",
                "requiredDuringSchedulingIgnoredDuringExecution",
            ],
        }
    }
}

/// A list as the pod has it: `None` when it has none (absent or `null`).
fn listed<T, const MOST: usize, R>(list: &Present<Bounded<T, MOST, R>>) -> Option<&[T]> {
    list.present.then_some(&list.value.items)
}

/// What berth's patch compares before it writes ([`super::patch`]): which objects
/// and lists the pod has, and the fields berth may set, as sent.
impl PodView {
    /// Whether the pod has `part`, as an object (absent or `null` it has not).
    pub fn has(&self, part: Part) -> bool {
        let (meta, spec) = (&self.fields.metadata, &self.fields.spec);
        match part {
            Part::Metadata => meta.present,
            Part::Annotations => meta.applied.present,
            Part::Spec => spec.present,
            Part::Affinity => spec.affinity.present,
            Part::NodeAffinity => spec.affinity.node_affinity.present,
            Part::RequiredNodeAffinity => spec.affinity.node_affinity.required.is_some(),
        }
    }

    pub fn toleration_list(&self) -> Option<&[Toleration]> {
        listed(&self.fields.spec.tolerations)
    }

    pub fn preferred_list(&self) -> Option<&[PreferredSchedulingTerm]> {
        listed(&self.fields.spec.affinity.node_affinity.preferred)
    }

    /// The names of the scheduling gates, when the pod has a list of them.
    pub fn gate_list(&self) -> Option<Vec<&str>> {
        let gates = listed(&self.fields.spec.scheduling_gates)?;
        Some(gates.iter().map(|g| g.name.as_str()).collect())
    }

    /// The required node-affinity terms, when the pod has a list of them.
    pub fn required_term_list(&self) -> Option<&[NodeSelectorTerm]> {
        let required = self.fields.spec.affinity.node_affinity.required.as_ref()?;
        listed(&required.node_selector_terms)
    }

    /// Whether the pod has `spec.nodeName` at all, even empty or `null`.
    pub fn has_node_name(&self) -> bool {
        self.fields.spec.node_name.is_some()
    }

    /// `spec.priority` as sent.
    pub fn priority(&self) -> Option<&serde_json::Value> {
        self.fields.spec.priority.as_ref().map(Scalar::json)
    }

    /// `spec.preemptionPolicy` as sent.
    pub fn preemption_policy(&self) -> Option<&serde_json::Value> {
        self.fields
            .spec
            .preemption_policy
            .as_ref()
            .map(Scalar::json)
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
fn together(spec: &Spec, amount: impl Fn(&Container) -> Option<f64>) -> Option<f64> {
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

/// The quantity `compute` lists for `key`, when it reads as one.
fn quantity(compute: &Compute, key: &str) -> Option<f64> {
    compute.get(key).and_then(crate::quantity::from_json)
}

impl Resources {
    /// The request for `key`; left out, the limit (the apiserver's defaulting of
    /// a container, which a pod `berth explain` reads from a file has not had yet).
    fn request(&self, key: &str) -> Option<f64> {
        quantity(&self.requests, key).or_else(|| self.limit(key))
    }

    fn limit(&self, key: &str) -> Option<f64> {
        quantity(&self.limits, key)
    }
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

/// A pod as berth decides on it: its [`PodView`], or why it cannot be read.
pub trait PodSource {
    fn view(&self) -> Result<Cow<'_, PodView>, String>;
}

impl PodSource for Value {
    fn view(&self) -> Result<Cow<'_, PodView>, String> {
        PodView::read(self).map(Cow::Owned)
    }
}

impl PodSource for PodView {
    fn view(&self) -> Result<Cow<'_, PodView>, String> {
        Ok(Cow::Borrowed(self))
    }
}

/// A pod as the webhook reads it: its view, or why it cannot be read.
impl PodSource for Result<PodView, String> {
    fn view(&self) -> Result<Cow<'_, PodView>, String> {
        self.as_ref().map(Cow::Borrowed).map_err(Clone::clone)
    }
}

/// The DaemonSet that controls a pod, as its ownerReferences say: its `apps/v1`
/// DaemonSet controller ownerReference. Anyone can write one, so on its own it
/// proves nothing: the webhook also asks who sends the pod
/// ([`PodView::is_daemonset_pod`]), the controller whether that DaemonSet exists in
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
    fn managed_fields_out_of_range_times_and_deep_values_are_never_read() {
        let mut deep = json!("leaf");
        for _ in 0..200 {
            deep = json!({ "f:x": deep });
        }
        let pod = json!({
            "kind": "Pod",
            "metadata": {"name": "p", "labels": {"app": "a"},
                "managedFields": [{"time": "9999-12-31T23:59:59Z", "fieldsV1": deep}],
                "creationTimestamp": "9999-12-31T23:59:59Z"},
            "spec": {"nodeName": "node2", "tolerations": null,
                "containers": [{"name": "c", "image": "nginx"}]},
            "status": {"conditions": [{"lastTransitionTime": "9999-12-31T23:59:59Z"}]}
        });
        let view = PodView::read(&pod).expect("readable");
        assert_eq!(view.node_name(), Some("node2"));
        assert_eq!(view.labels()["app"], "a");
        assert!(view.tolerations().is_empty());
    }

    #[test]
    fn a_terms_requirements_are_kept_within_their_bound_and_counted_past_it() {
        let term =
            |n: usize| json!({"matchFields": vec![json!({"key": "k", "operator": "Exists"}); n]});
        let within = json!({"spec": {"affinity": {"nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [term(64)]},
            "preferredDuringSchedulingIgnoredDuringExecution": [{"weight": 3, "preference": term(2)}]}}}});
        let pod = PodView::read(&within).unwrap();
        let fields = pod.required_affinity().unwrap()[0].match_fields.as_ref();
        assert_eq!(fields.map(Vec::len), Some(64));
        assert_eq!(pod.preferred_terms()[0].weight, 3);
        // Past the bound, in a required or a preferred term: refused by the count,
        // having kept no more than the bound.
        for over in [
            json!({"spec": {"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution":
                {"nodeSelectorTerms": [term(1), term(70)]}}}}}),
            json!({"spec": {"affinity": {"nodeAffinity": {"preferredDuringSchedulingIgnoredDuringExecution":
                [{"weight": 1, "preference": term(70)}]}}}}),
        ] {
            let error = PodView::read(&over).unwrap_err();
            assert!(
                error.contains("has 70 items; berth reads at most 64"),
                "{error}"
            );
        }
    }

    #[test]
    fn a_field_berth_needs_with_the_wrong_shape_is_named() {
        let pod = json!({"kind": "Pod", "spec": {"tolerations": "all of them"}});
        let error = PodView::read(&pod).unwrap_err();
        assert!(error.contains("not a readable Pod"), "{error}");
        let error = PodView::read(&json!({"kind": "Node"})).unwrap_err();
        assert_eq!(error, "expected a Pod, got kind Node");
    }

    #[test]
    fn qos_classes_follow_requests_and_limits() {
        let qos = |containers: serde_json::Value| {
            PodView::read(&json!({"kind": "Pod", "spec": {"containers": containers}}))
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
            PodView::read(&json!({"kind": "Pod", "spec": spec}))
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
    fn of_the_annotations_only_berths_record_is_read() {
        let record = |annotations: serde_json::Value| {
            let pod = json!({"kind": "Pod", "metadata": {"annotations": annotations}});
            PodView::read(&pod)
                .unwrap()
                .applied_record()
                .map(str::to_owned)
        };
        let annotations = json!({"a": "1", APPLIED_ANNOTATION: "cdn,gpu", "z": "2"});
        assert_eq!(record(annotations), Some("cdn,gpu".into()));
        assert_eq!(record(json!({"a": "1"})), None);
        assert_eq!(record(json!(null)), None);
        let error = PodView::read(&json!({"kind": "Pod", "metadata": {"annotations": {
            APPLIED_ANNOTATION: 7}}}))
        .unwrap_err();
        assert!(error.contains("not a readable Pod"), "{error}");
    }

    #[test]
    fn only_the_daemonset_controller_makes_daemonset_pods() {
        let pod = |api_version: &str| {
            PodView::read(&json!({"kind": "Pod", "metadata": {"ownerReferences": [
                {"apiVersion": api_version, "kind": "DaemonSet", "name": "agent", "uid": "u", "controller": true}]}}))
            .unwrap()
        };
        let controller = Requester::from_username(crate::names::DAEMONSET_CONTROLLER_USERS[0]);
        assert!(pod("apps/v1").is_daemonset_pod(controller));
        assert!(!pod("apps/v1").is_daemonset_pod(Requester::from_username("tenant")));
        assert!(!pod("redteam.example.com/v1").is_daemonset_pod(controller));
    }
}
