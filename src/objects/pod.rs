//! The pod, as berth reads it: one type, read by one reader from a watch (the
//! controller's cache) and from an AdmissionReview (the webhook) alike, and from a
//! workload's or a DaemonSet's pod template.
//!
//! berth reads only the fields it decides on, into its own small types: never
//! `metadata.managedFields` (free-form, any depth, timestamps a user may set out of
//! any range), of the annotations only its own record, and nothing else it does
//! not need. Each list [`crate::bounds`] bounds is read up to its bound and past it
//! only counted, so a list over its bound costs no more to read than one at it. A
//! pod is refused only when a field berth needs has the wrong shape or a list is
//! over its bound. The pod also says which objects and lists it has, as sent, for
//! the patch ([`crate::placement::patch`]), whose targeted operations leave every
//! field these types do not know as it was.
//!
//! The cache keeps a pod for as long as it exists, so it keeps less of it
//! ([`PodObject::keep_within_bounds`]).

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{
    NodeSelectorRequirement, NodeSelectorTerm, PreferredSchedulingTerm, Toleration,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference, Time};
use serde::de::{DeserializeSeed, IgnoredAny, MapAccess, Visitor};
use serde::{Deserialize, Deserializer};

use super::read::{MetaFields, lenient_time, nullable, stands_for};
use crate::bounds::{
    self, Bound, CONTAINERS, LABELS, OWNER_REFERENCES, PREFERRED_TERMS, REQUIRED_TERMS,
    SCHEDULING_GATES, TERM_REQUIREMENTS, TOLERATIONS,
};
use crate::names::{APPLIED_ANNOTATION, POOL_TAINT, is_berth_gate, is_owned_node_key};
use crate::policy::compile::Labels;

/// The annotation the kubelet puts on a static pod's mirror.
pub const MIRROR_ANNOTATION: &str = "kubernetes.io/config.mirror";

/// The most JSON one of a pod's placement fields (its node selector, node affinity
/// or tolerations) may take for the controller to keep it. Tenants write pods, and
/// the cache holds each for as long as it exists. Beyond it the pod is known to be
/// too large to read ([`PodObject::too_large`]) and is never released from
/// berth's gates.
pub const PLACEMENT_FIELD_BYTES: usize = 64 * 1024;

/// A field that reads `null` as its default, as [`nullable`] does, and says
/// whether the pod has it at all: the patch adds an object or a list the pod lacks
/// (absent or `null`) whole, and adds to one it has.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Present<T> {
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

impl<T> std::ops::DerefMut for Present<T> {
    fn deref_mut(&mut self) -> &mut T {
        &mut self.value
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
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Bounded<T, const MOST: usize, R = T> {
    items: Vec<T>,
    /// Items stepped over past the bound.
    over: usize,
    /// The longest list within an item, kept or not (a term's requirements).
    longest: usize,
    read: std::marker::PhantomData<R>,
}

/// An item of a [`Bounded`] list as read, and the length of its longest list.
pub trait ReadItem<T> {
    fn into_item(self) -> (T, usize);
}

impl<T> ReadItem<T> for T {
    fn into_item(self) -> (T, usize) {
        (self, 0)
    }
}

impl<T, const MOST: usize, R> Bounded<T, MOST, R> {
    /// How many items the list has, kept or not.
    fn count(&self) -> usize {
        self.items.len() + self.over
    }
}

impl<T, const MOST: usize, R> std::ops::Deref for Bounded<T, MOST, R> {
    type Target = Vec<T>;

    fn deref(&self) -> &Vec<T> {
        &self.items
    }
}

impl<T, const MOST: usize, R> std::ops::DerefMut for Bounded<T, MOST, R> {
    fn deref_mut(&mut self) -> &mut Vec<T> {
        &mut self.items
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
        let mut list = Bounded {
            items: Vec::new(),
            over: 0,
            longest: 0,
            read: std::marker::PhantomData,
        };
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
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ReadTerm {
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
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
pub struct ReadPreferred {
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

/// A field as the pod has it: absent is `None`, `null` is `Some(None)` (the patch
/// removes a field the pod has, even `null`).
fn even_null<'de, D, T>(deserializer: D) -> Result<Option<Option<T>>, D::Error>
where
    D: Deserializer<'de>,
    T: Deserialize<'de>,
{
    Option::<T>::deserialize(deserializer).map(Some)
}

/// Of a map, the values of `keys` (the last of a repeated key), each read as `T`;
/// the other members are stepped over rather than copied.
struct Picked<T, const N: usize> {
    keys: [&'static str; N],
    what: &'static str,
    value: std::marker::PhantomData<T>,
}

impl<'de, T: Deserialize<'de>, const N: usize> DeserializeSeed<'de> for Picked<T, N> {
    type Value = [Option<T>; N];

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<Self::Value, D::Error> {
        deserializer.deserialize_map(self)
    }
}

impl<'de, T: Deserialize<'de>, const N: usize> Visitor<'de> for Picked<T, N> {
    type Value = [Option<T>; N];

    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str(self.what)
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let mut picked = std::array::from_fn(|_| None);
        while let Some(Key(key)) = map.next_key()? {
            match self.keys.iter().position(|k| *k == key) {
                Some(i) => picked[i] = Some(map.next_value()?),
                None => {
                    map.next_value::<IgnoredAny>()?;
                }
            }
        }
        Ok(picked)
    }
}

/// A map key, borrowed from the text when it can be.
struct Key<'de>(std::borrow::Cow<'de, str>);

impl<'de> Deserialize<'de> for Key<'de> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        std::borrow::Cow::<'de, str>::deserialize(deserializer).map(Key)
    }
}

/// Of a pod's annotations, those berth reads: its record of what it applied, and
/// the mirror pod's mark.
#[derive(Debug, Clone, Default)]
pub struct PickedAnnotations(Labels);

impl<'de> Deserialize<'de> for PickedAnnotations {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let keys = [APPLIED_ANNOTATION, MIRROR_ANNOTATION];
        let picked = Picked::<String, 2> {
            keys,
            what: "a map of annotations",
            value: std::marker::PhantomData,
        };
        let values = picked.deserialize(deserializer)?;
        Ok(PickedAnnotations(
            keys.iter()
                .zip(values)
                .filter_map(|(k, v)| Some(((*k).to_owned(), v?)))
                .collect(),
        ))
    }
}

/// A JSON value berth compares or reads as a number, as sent when it is a string,
/// a number or a boolean. An array or an object is none of these: it is stepped
/// over rather than built, and kept as `null`, which equals nothing berth writes
/// and reads as no quantity.
#[derive(Debug, Clone, PartialEq)]
pub struct Scalar(serde_json::Value);

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

/// Whether a list that may be absent or `null` has an item, read without keeping it.
fn non_empty<'de, D: Deserializer<'de>>(deserializer: D) -> Result<bool, D::Error> {
    let list = Option::<Vec<IgnoredAny>>::deserialize(deserializer)?;
    Ok(list.is_some_and(|l| !l.is_empty()))
}

/// A value read as `T` when it is a map or a list, and as nothing when it is of
/// another shape: for what only the cache's predictions read (spreads, volumes,
/// ports), which the apiserver has checked, so that a review is never refused
/// for them.
struct Loose<T>(Option<T>);

impl<'de, T: Deserialize<'de>> Deserialize<'de> for Loose<T> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Shape<T>(std::marker::PhantomData<T>);
        impl<'de, T: Deserialize<'de>> Visitor<'de> for Shape<T> {
            type Value = Loose<T>;

            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("any JSON value")
            }

            fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<Loose<T>, A::Error> {
                T::deserialize(serde::de::value::MapAccessDeserializer::new(map))
                    .map(|t| Loose(Some(t)))
            }

            fn visit_seq<A: serde::de::SeqAccess<'de>>(self, seq: A) -> Result<Loose<T>, A::Error> {
                T::deserialize(serde::de::value::SeqAccessDeserializer::new(seq))
                    .map(|t| Loose(Some(t)))
            }

            fn visit_bool<E: serde::de::Error>(self, _: bool) -> Result<Loose<T>, E> {
                Ok(Loose(None))
            }

            fn visit_i64<E: serde::de::Error>(self, _: i64) -> Result<Loose<T>, E> {
                Ok(Loose(None))
            }

            fn visit_u64<E: serde::de::Error>(self, _: u64) -> Result<Loose<T>, E> {
                Ok(Loose(None))
            }

            fn visit_f64<E: serde::de::Error>(self, _: f64) -> Result<Loose<T>, E> {
                Ok(Loose(None))
            }

            fn visit_str<E: serde::de::Error>(self, _: &str) -> Result<Loose<T>, E> {
                Ok(Loose(None))
            }

            fn visit_unit<E: serde::de::Error>(self) -> Result<Loose<T>, E> {
                Ok(Loose(None))
            }
        }
        deserializer.deserialize_any(Shape(std::marker::PhantomData))
    }
}

/// Whether any item of a list (absent, `null` or of another shape: none) is
/// one for which `holds`, the items read as `T` and not kept.
fn any_item<'de, D, T>(deserializer: D, holds: fn(&T) -> bool) -> Result<bool, D::Error>
where
    D: Deserializer<'de>,
    T: Deserialize<'de>,
{
    struct Items<T>(fn(&T) -> bool);
    impl<'de, T: Deserialize<'de>> Visitor<'de> for Items<T> {
        type Value = bool;

        fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
            f.write_str("any JSON value")
        }

        // Each item is read and dropped before the next: none is held.
        fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> Result<bool, A::Error> {
            let mut any = false;
            while let Some(Loose(item)) = seq.next_element::<Loose<T>>()? {
                any |= item.as_ref().is_some_and(self.0);
            }
            Ok(any)
        }

        fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<bool, A::Error> {
            while map.next_entry::<IgnoredAny, IgnoredAny>()?.is_some() {}
            Ok(false)
        }

        fn visit_bool<E: serde::de::Error>(self, _: bool) -> Result<bool, E> {
            Ok(false)
        }

        fn visit_i64<E: serde::de::Error>(self, _: i64) -> Result<bool, E> {
            Ok(false)
        }

        fn visit_u64<E: serde::de::Error>(self, _: u64) -> Result<bool, E> {
            Ok(false)
        }

        fn visit_f64<E: serde::de::Error>(self, _: f64) -> Result<bool, E> {
            Ok(false)
        }

        fn visit_str<E: serde::de::Error>(self, _: &str) -> Result<bool, E> {
            Ok(false)
        }

        fn visit_unit<E: serde::de::Error>(self) -> Result<bool, E> {
            Ok(false)
        }
    }
    deserializer.deserialize_any(Items(holds))
}

/// Whether a pod's topology spread constraints include one the scheduler must
/// satisfy: any but `ScheduleAnyway` (the field is required; a constraint without it
/// is taken as the stricter kind).
fn hard_spread<'de, D: Deserializer<'de>>(deserializer: D) -> Result<bool, D::Error> {
    #[derive(Deserialize)]
    #[serde(rename_all = "camelCase")]
    struct Spread {
        #[serde(default)]
        when_unsatisfiable: Option<Scalar>,
    }
    any_item(deserializer, |c: &Spread| {
        c.when_unsatisfiable.as_ref().map(|s| &s.0) != Some(&"ScheduleAnyway".into())
    })
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
    any_item(deserializer, |v: &Volume| {
        v.persistent_volume_claim.is_some() || v.ephemeral.is_some()
    })
}

/// Whether a container's ports include a host port, read without keeping them.
fn takes_host_port<'de, D: Deserializer<'de>>(deserializer: D) -> Result<bool, D::Error> {
    #[derive(Deserialize)]
    #[serde(rename_all = "camelCase")]
    struct Port {
        #[serde(default)]
        host_port: Option<IgnoredAny>,
    }
    any_item(deserializer, |p: &Port| p.host_port.is_some())
}

/// A pod: what berth reads of its metadata, spec and status.
#[derive(Debug, Clone, Default)]
pub struct PodObject {
    pub metadata: ObjectMeta,
    pub spec: PodSpec,
    pub status: PodStatus,
    /// Which of `metadata`, its annotations and `spec` the pod has, as sent.
    has: [bool; 3],
    /// `kind`, as sent: a review may carry an object of another kind.
    kind: Option<String>,
    /// The first of [`crate::bounds`] the pod breaks, as the reason to refuse it.
    over_bound: Option<String>,
    /// Whether the cache found a placement field too large to keep
    /// ([`PodObject::keep_within_bounds`]).
    too_large: bool,
}

/// A pod as it is read, before it is checked against its bounds.
#[derive(Deserialize)]
struct PodFields {
    #[serde(default)]
    kind: Option<String>,
    #[serde(default)]
    metadata: Option<
        MetaFields<Present<PickedAnnotations>, Bounded<OwnerReference, { OWNER_REFERENCES.most }>>,
    >,
    #[serde(default)]
    spec: Option<PodSpec>,
    #[serde(default, deserialize_with = "status")]
    status: PodStatus,
}

/// A pod's status when it is an object; of any other shape (a user's, in a
/// review) it is stepped over unread, whatever its depth, and reads as none.
fn status<'de, D: Deserializer<'de>>(deserializer: D) -> Result<PodStatus, D::Error> {
    struct Status;
    impl<'de> Visitor<'de> for Status {
        type Value = PodStatus;

        fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
            f.write_str("any JSON value")
        }

        fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<PodStatus, A::Error> {
            PodStatus::deserialize(serde::de::value::MapAccessDeserializer::new(map))
        }

        fn visit_seq<A: serde::de::SeqAccess<'de>>(
            self,
            mut seq: A,
        ) -> Result<PodStatus, A::Error> {
            while seq.next_element::<IgnoredAny>()?.is_some() {}
            Ok(PodStatus::default())
        }

        fn visit_bool<E: serde::de::Error>(self, _: bool) -> Result<PodStatus, E> {
            Ok(PodStatus::default())
        }

        fn visit_i64<E: serde::de::Error>(self, _: i64) -> Result<PodStatus, E> {
            Ok(PodStatus::default())
        }

        fn visit_u64<E: serde::de::Error>(self, _: u64) -> Result<PodStatus, E> {
            Ok(PodStatus::default())
        }

        fn visit_f64<E: serde::de::Error>(self, _: f64) -> Result<PodStatus, E> {
            Ok(PodStatus::default())
        }

        fn visit_str<E: serde::de::Error>(self, _: &str) -> Result<PodStatus, E> {
            Ok(PodStatus::default())
        }

        fn visit_unit<E: serde::de::Error>(self) -> Result<PodStatus, E> {
            Ok(PodStatus::default())
        }
    }
    deserializer.deserialize_any(Status)
}

impl From<PodFields> for PodObject {
    fn from(fields: PodFields) -> Self {
        let has_meta = fields.metadata.is_some();
        let mut meta = fields.metadata.unwrap_or_default();
        let annotations = std::mem::take(&mut meta.annotations);
        let owners = std::mem::take(&mut meta.owner_references);
        let owners_count = owners.count();
        let has = [has_meta, annotations.present, fields.spec.is_some()];
        let mut pod = PodObject {
            metadata: meta.into_meta(annotations.value.0, owners.items),
            spec: fields.spec.unwrap_or_default(),
            status: fields.status,
            has,
            kind: fields.kind,
            over_bound: None,
            too_large: false,
        };
        let mut counts = pod.spec.counts();
        counts.push((LABELS, pod.labels().len()));
        counts.push((OWNER_REFERENCES, owners_count));
        pod.over_bound = bounds::over(&counts);
        pod
    }
}

/// A pod as the controller's cache holds it: read, then kept within the cache's
/// bounds ([`PodObject::keep_within_bounds`]). The webhook reads with the same
/// reader ([`PodObject::read`], [`ReadPod`]) and keeps all it read.
impl<'de> Deserialize<'de> for PodObject {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let mut pod = PodObject::from(PodFields::deserialize(deserializer)?);
        pod.keep_within_bounds();
        Ok(pod)
    }
}

/// A pod read straight from JSON text, as an AdmissionReview's object is read: no
/// JSON value is built and dropped on the way, and the reader is the one
/// [`PodObject::read`] uses, so the two read every pod alike. A pod whose fields
/// have the wrong shape fails the read (the reader then says why, through
/// [`PodObject::read`]); one of another kind or over a bound is read, as the
/// reason berth refuses it.
///
/// It is boxed at once: a review is moved from step to step of its read, and
/// copying the pod with it cost more than its allocation.
pub struct ReadPod(pub Box<Result<PodObject, String>>);

impl<'de> Deserialize<'de> for ReadPod {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let pod = PodObject::from(PodFields::deserialize(deserializer)?);
        Ok(ReadPod(Box::new(pod.checked())))
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

/// What berth reads of a pod's spec.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PodSpec {
    #[serde(default, deserialize_with = "even_null")]
    node_name: Option<Option<String>>,
    #[serde(default)]
    pub scheduling_gates: Present<Bounded<Gate, { SCHEDULING_GATES.most }>>,
    #[serde(default, deserialize_with = "nullable")]
    pub node_selector: BTreeMap<String, String>,
    #[serde(default)]
    pub affinity: Present<Affinity>,
    #[serde(default)]
    pub tolerations: Present<Bounded<Toleration, { TOLERATIONS.most }>>,
    #[serde(default, deserialize_with = "nullable")]
    pub containers: Bounded<Container, { CONTAINERS.most }>,
    #[serde(default, deserialize_with = "nullable")]
    pub init_containers: Bounded<Container, { CONTAINERS.most }>,
    #[serde(default)]
    pub scheduler_name: Option<String>,
    #[serde(default)]
    pub priority_class_name: Option<String>,
    /// The priority and preemption policy as sent, for the patch to compare with
    /// what a queue's PriorityClass sets: berth reads nothing else of them.
    #[serde(default)]
    pub priority: Option<Scalar>,
    #[serde(default)]
    pub preemption_policy: Option<Scalar>,
    #[serde(default, deserialize_with = "nullable")]
    pub scheduling_group: SchedulingGroup,
    /// Pod-level resources: when set, they decide the QoS class.
    #[serde(default, deserialize_with = "nullable")]
    pub resources: Resources,
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

/// Node affinity and whether the pod has required inter-pod terms.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Affinity {
    #[serde(default)]
    node_affinity: Present<NodeAffinity>,
    #[serde(default, deserialize_with = "nullable")]
    pod_affinity: InterPod,
    #[serde(default, deserialize_with = "nullable")]
    pod_anti_affinity: InterPod,
}

/// Node affinity as Kubernetes reads it. `required: null` (or absent) is no
/// requirement at all, while a `required` object whose `nodeSelectorTerms` is
/// empty or `null` matches no node: the two must not be confused, or berth would
/// turn "nowhere" into "anywhere".
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
struct NodeAffinity {
    #[serde(default, rename = "requiredDuringSchedulingIgnoredDuringExecution")]
    required: Option<NodeSelector>,
    #[serde(default, rename = "preferredDuringSchedulingIgnoredDuringExecution")]
    preferred: Present<Bounded<PreferredSchedulingTerm, { PREFERRED_TERMS.most }, ReadPreferred>>,
}

#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase")]
struct NodeSelector {
    #[serde(default)]
    node_selector_terms: Present<Bounded<NodeSelectorTerm, { REQUIRED_TERMS.most }, ReadTerm>>,
}

/// Whether a pod has required inter-pod terms of a kind, read without keeping them.
/// Preferred terms only score nodes, so berth need not know of them.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
struct InterPod {
    #[serde(
        default,
        rename = "requiredDuringSchedulingIgnoredDuringExecution",
        deserialize_with = "non_empty"
    )]
    required: bool,
}

#[derive(Debug, Clone, Default, Deserialize)]
pub struct Gate {
    #[serde(default)]
    pub name: String,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SchedulingGroup {
    #[serde(default)]
    pub pod_group_name: Option<String>,
}

/// A container, as far as its image (which policies apply), what it requests and
/// limits (room on nodes, the QoS class), whether it is a sidecar and whether it
/// takes a host port.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Container {
    #[serde(default)]
    pub name: String,
    #[serde(default)]
    pub image: Option<String>,
    #[serde(default, deserialize_with = "nullable")]
    pub resources: Resources,
    /// `Always` on an init container makes it a sidecar, running beside the
    /// containers rather than before them.
    #[serde(default)]
    pub restart_policy: Option<String>,
    #[serde(default, rename = "ports", deserialize_with = "takes_host_port")]
    pub host_port: bool,
}

impl Container {
    pub fn is_sidecar(&self) -> bool {
        self.restart_policy.as_deref() == Some("Always")
    }
}

/// Requests and limits.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct Resources {
    #[serde(default, deserialize_with = "nullable")]
    pub requests: Quantities,
    #[serde(default, deserialize_with = "nullable")]
    pub limits: Quantities,
}

/// Resource quantities by name, in order, each read as a number (`None` when it
/// does not read as one): a slice, as a map of one or two entries would cost a
/// tree node of 384 bytes in every cached pod.
#[derive(Debug, Clone, Default)]
pub struct Quantities(Box<[(String, Option<f64>)]>);

impl Quantities {
    /// The quantity of `resource`, when it reads as one.
    pub fn get(&self, resource: &str) -> Option<f64> {
        self.0.iter().find(|(k, _)| k == resource)?.1
    }

    /// Each resource and its quantity, when it reads as one.
    pub fn iter(&self) -> impl Iterator<Item = (&str, Option<f64>)> {
        self.0.iter().map(|(k, v)| (k.as_str(), *v))
    }
}

impl<'de> Deserialize<'de> for Quantities {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Amounts;
        impl<'de> Visitor<'de> for Amounts {
            type Value = Quantities;

            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a map of resource quantities")
            }

            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Quantities, A::Error> {
                let mut amounts: Vec<(String, Option<f64>)> = Vec::new();
                while let Some(Key(key)) = map.next_key()? {
                    let Scalar(raw) = map.next_value()?;
                    let amount = crate::quantity::from_json(&raw);
                    // The last of a repeated name, as a map reads it.
                    match amounts.iter_mut().find(|(k, _)| *k == key) {
                        Some(slot) => slot.1 = amount,
                        None => amounts.push((key.into_owned(), amount)),
                    }
                }
                Ok(Quantities(amounts.into_boxed_slice()))
            }
        }
        deserializer.deserialize_map(Amounts)
    }
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
    #[serde(default, deserialize_with = "lenient_time")]
    pub last_transition_time: Option<Time>,
}

stands_for!(PodObject, k8s_openapi::api::core::v1::Pod, metadata_api: false,);

/// The bytes of `value` as JSON.
fn json_len<T: serde::Serialize + ?Sized>(value: &T) -> usize {
    struct Count(usize);
    impl std::io::Write for Count {
        fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
            self.0 += bytes.len();
            Ok(bytes.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let mut count = Count(0);
    let _ = serde_json::to_writer(&mut count, value);
    count.0
}

impl PodSpec {
    /// The length of each list in the spec that [`crate::bounds`] bounds.
    fn counts(&self) -> Vec<(Bound, usize)> {
        let node_affinity = &self.affinity.node_affinity;
        let terms = node_affinity
            .required
            .as_ref()
            .map(|r| &r.node_selector_terms);
        let preferred = &node_affinity.preferred;
        let longest_term = terms.map_or(0, |t| t.longest).max(preferred.longest);
        vec![
            (TOLERATIONS, self.tolerations.count()),
            (SCHEDULING_GATES, self.scheduling_gates.count()),
            (REQUIRED_TERMS, terms.map_or(0, |t| t.count())),
            (PREFERRED_TERMS, preferred.count()),
            (TERM_REQUIREMENTS, longest_term),
            (
                CONTAINERS,
                self.containers.count().max(self.init_containers.count()),
            ),
        ]
    }

    /// The node the pod names, if any (an empty name is none, as in Kubernetes).
    pub fn node_name(&self) -> Option<&str> {
        self.node_name
            .as_ref()
            .and_then(Option::as_deref)
            .filter(|n| !n.is_empty())
    }

    /// Binds the pod to `node`, as the scheduler does.
    pub fn bind(&mut self, node: &str) {
        self.node_name = Some(Some(node.to_owned()));
    }

    /// The required node-affinity terms (ORed): `None` without a requirement,
    /// `Some` of no terms matching no node.
    pub fn required_terms(&self) -> Option<&[NodeSelectorTerm]> {
        let required = self.affinity.node_affinity.required.as_ref()?;
        Some(&required.node_selector_terms)
    }

    /// Whether it has required inter-pod (anti-)affinity terms.
    pub fn inter_pod_required(&self) -> bool {
        self.affinity.pod_affinity.required || self.affinity.pod_anti_affinity.required
    }

    /// Drops from its placement fields all but berth's marks: tolerations of
    /// berth's pool taint (and wildcards), and node expressions and selector
    /// entries on berth's own keys (the pool's `In`, anchors); the node affinity
    /// only with `affinity_too`. What the missed scan checks a pod's record against
    /// ([`crate::placement::missed`]).
    pub fn keep_berths_marks(&mut self, affinity_too: bool) {
        self.tolerations.retain(|t| {
            t.key
                .as_deref()
                .is_none_or(|k| k.is_empty() || k == POOL_TAINT)
        });
        self.node_selector.retain(|k, _| is_owned_node_key(k));
        if !affinity_too {
            return;
        }
        let required = self.affinity.node_affinity.required.as_mut();
        for term in required
            .into_iter()
            .flat_map(|r| r.node_selector_terms.iter_mut())
        {
            if let Some(expressions) = term.match_expressions.as_mut() {
                expressions.retain(|e| is_owned_node_key(&e.key));
            }
            term.match_fields = None;
        }
    }
}

/// A list as the pod has it: `None` when it has none (absent or `null`).
fn listed<T, const MOST: usize, R>(list: &Present<Bounded<T, MOST, R>>) -> Option<&[T]> {
    list.present.then_some(&list.value.items)
}

impl PodObject {
    /// Reads a pod from `raw` as the webhook does; the error says which field has
    /// the wrong shape, or which of [`crate::bounds`] the pod breaks.
    pub fn read(raw: &serde_json::Value) -> Result<PodObject, String> {
        let fields = PodFields::deserialize(raw).map_err(|e| format!("not a readable Pod: {e}"))?;
        PodObject::from(fields).checked()
    }

    /// The pod, unless it is of another kind or over a bound.
    fn checked(self) -> Result<PodObject, String> {
        if let Some(kind) = self.kind.as_deref().filter(|k| *k != "Pod") {
            return Err(format!("expected a Pod, got kind {kind}"));
        }
        match self.over_bound {
            Some(reason) => Err(reason),
            None => Ok(self),
        }
    }

    /// The first of [`crate::bounds`] the pod breaks, as the reason to refuse it.
    pub fn over_bound(&self) -> Option<&str> {
        self.over_bound.as_deref()
    }

    /// Keeps what the controller's cache needs, within its bounds: an image
    /// reference within [`bounds::IMAGE_BYTES`] (a longer one names nothing a node
    /// can pull), and the placement fields (node selector, node affinity,
    /// tolerations) only when each is within [`PLACEMENT_FIELD_BYTES`] and no list
    /// of the spec is over its bound; else none of them, and the pod is
    /// [`too large`](PodObject::too_large).
    fn keep_within_bounds(&mut self) {
        let spec = &mut self.spec;
        for container in spec
            .containers
            .iter_mut()
            .chain(spec.init_containers.iter_mut())
        {
            container.image.take_if(|i| i.len() > bounds::IMAGE_BYTES);
        }
        let over = spec.counts().into_iter().any(|(b, n)| n > b.most);
        self.too_large = over
            || json_len(&spec.node_selector) > PLACEMENT_FIELD_BYTES
            || json_len(&(
                spec.required_terms(),
                spec.affinity.node_affinity.preferred.as_slice(),
            )) > PLACEMENT_FIELD_BYTES
            || json_len(spec.tolerations.as_slice()) > PLACEMENT_FIELD_BYTES;
        if self.too_large {
            spec.node_selector = BTreeMap::new();
            spec.affinity.node_affinity = Present::default();
            spec.tolerations = Present::default();
        }
        spec.tolerations.shrink_to_fit();
        spec.containers.shrink_to_fit();
        spec.init_containers.shrink_to_fit();
    }

    /// Whether a placement field was too large for the cache to keep: where the
    /// pod may go is not known, and it is never released on a guess.
    pub fn too_large(&self) -> bool {
        self.too_large
    }

    /// Whether the pod has `part`, as an object (absent or `null` it has not).
    pub fn has(&self, part: Part) -> bool {
        let spec = &self.spec;
        match part {
            Part::Metadata => self.has[0],
            Part::Annotations => self.has[1],
            Part::Spec => self.has[2],
            Part::Affinity => spec.affinity.present,
            Part::NodeAffinity => spec.affinity.node_affinity.present,
            Part::RequiredNodeAffinity => spec.affinity.node_affinity.required.is_some(),
        }
    }

    pub fn labels(&self) -> &Labels {
        static NONE: Labels = Labels::new();
        self.metadata.labels.as_ref().unwrap_or(&NONE)
    }

    /// The `berth.io/applied` annotation: berth's record of the policies it
    /// applied.
    pub fn applied_record(&self) -> Option<&str> {
        let annotations = self.metadata.annotations.as_ref()?;
        annotations.get(APPLIED_ANNOTATION).map(String::as_str)
    }

    pub fn owner_references(&self) -> &[OwnerReference] {
        self.metadata
            .owner_references
            .as_deref()
            .unwrap_or_default()
    }

    /// The controller ownerReference(s): who recreates the pod.
    pub fn controllers(&self) -> impl Iterator<Item = &OwnerReference> {
        self.owner_references()
            .iter()
            .filter(|o| o.controller == Some(true))
    }

    pub fn tolerations(&self) -> &[Toleration] {
        &self.spec.tolerations
    }

    /// The node the pod names, if any (an empty name is none, as in Kubernetes).
    pub fn node_name(&self) -> Option<&str> {
        self.spec.node_name()
    }

    /// Whether the pod has `spec.nodeName` at all, even empty or `null`.
    pub fn has_node_name(&self) -> bool {
        self.spec.node_name.is_some()
    }

    pub fn node_selector(&self) -> &BTreeMap<String, String> {
        &self.spec.node_selector
    }

    pub fn scheduler_name(&self) -> Option<&str> {
        self.spec.scheduler_name.as_deref()
    }

    pub fn scheduling_gates(&self) -> impl Iterator<Item = &str> {
        self.spec.scheduling_gates.iter().map(|g| g.name.as_str())
    }

    /// The terms of the required node affinity (ORed); `None` when the pod has no
    /// required node affinity. `Some` of no terms matches no node.
    pub fn required_affinity(&self) -> Option<&[NodeSelectorTerm]> {
        self.spec.required_terms()
    }

    /// Whether the pod must sit beside other pods (a required pod affinity term).
    pub fn requires_pod_affinity(&self) -> bool {
        self.spec.affinity.pod_affinity.required
    }

    /// The preferred node-affinity terms.
    pub fn preferred_terms(&self) -> &[PreferredSchedulingTerm] {
        &self.spec.affinity.node_affinity.preferred
    }

    pub fn toleration_list(&self) -> Option<&[Toleration]> {
        listed(&self.spec.tolerations)
    }

    pub fn preferred_list(&self) -> Option<&[PreferredSchedulingTerm]> {
        listed(&self.spec.affinity.node_affinity.preferred)
    }

    /// The names of the scheduling gates, when the pod has a list of them.
    pub fn gate_list(&self) -> Option<Vec<&str>> {
        let gates = listed(&self.spec.scheduling_gates)?;
        Some(gates.iter().map(|g| g.name.as_str()).collect())
    }

    /// The required node-affinity terms, when the pod has a list of them.
    pub fn required_term_list(&self) -> Option<&[NodeSelectorTerm]> {
        let required = self.spec.affinity.node_affinity.required.as_ref()?;
        listed(&required.node_selector_terms)
    }

    /// `spec.priority` as sent.
    pub fn priority(&self) -> Option<&serde_json::Value> {
        self.spec.priority.as_ref().map(|s| &s.0)
    }

    /// `spec.preemptionPolicy` as sent.
    pub fn preemption_policy(&self) -> Option<&serde_json::Value> {
        self.spec.preemption_policy.as_ref().map(|s| &s.0)
    }

    pub fn priority_class_name(&self) -> Option<&str> {
        self.spec.priority_class_name.as_deref()
    }

    /// The Kubernetes PodGroup the pod names itself (`spec.schedulingGroup`).
    pub fn pod_group_name(&self) -> Option<&str> {
        self.spec.scheduling_group.pod_group_name.as_deref()
    }

    /// Whether the pod has finished (Succeeded or Failed): it holds no node.
    pub fn is_terminated(&self) -> bool {
        matches!(self.status.phase.as_deref(), Some("Succeeded" | "Failed"))
    }

    /// Whether the pod is being deleted (terminating).
    pub fn is_terminating(&self) -> bool {
        self.metadata.deletion_timestamp.is_some()
    }

    /// Whether the pod is a static pod's mirror.
    pub fn is_mirror(&self) -> bool {
        let annotations = self.metadata.annotations.as_ref();
        annotations.is_some_and(|a| a.contains_key(MIRROR_ANNOTATION))
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
            for (key, value) in container.resources.requests.iter() {
                *total.entry(key.to_owned()).or_default() += value.unwrap_or(0.0);
            }
        }
        for container in &self.spec.init_containers {
            for (key, value) in container.resources.requests.iter() {
                let slot = total.entry(key.to_owned()).or_default();
                *slot = slot.max(value.unwrap_or(0.0));
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

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::Pod;
    use kube::core::ObjectList;
    use serde_json::json;

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
        assert_eq!(list.items[1].node_name(), Some("node2"));
        assert!(list.items[0].metadata.creation_timestamp.is_some());
        assert!(list.items[0].metadata.managed_fields.is_none());
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
        assert!(!object.too_large() && object.tolerations().len() == 100);
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
        assert!(object.too_large() && object.tolerations().is_empty());
        assert!(
            kept < 16 * 1024,
            "kept {kept} bytes for a pod of {}",
            huge.len()
        );
        // Never released on a guess: `Placement::of_object` is `None` for a pod too
        // large (placement::rooms tests it with a pod whose affinity is).
        assert!(object.too_large());
    }

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
        let view = PodObject::read(&pod).expect("readable");
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
        let pod = PodObject::read(&within).unwrap();
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
            let error = PodObject::read(&over).unwrap_err();
            assert!(
                error.contains("has 70 items; berth reads at most 64"),
                "{error}"
            );
        }
    }

    #[test]
    fn a_field_berth_needs_with_the_wrong_shape_is_named() {
        let pod = json!({"kind": "Pod", "spec": {"tolerations": "all of them"}});
        let error = PodObject::read(&pod).unwrap_err();
        assert!(error.contains("not a readable Pod"), "{error}");
        let error = PodObject::read(&json!({"kind": "Node"})).unwrap_err();
        assert_eq!(error, "expected a Pod, got kind Node");
    }

    #[test]
    fn of_the_annotations_only_berths_record_is_read() {
        let record = |annotations: serde_json::Value| {
            let pod = json!({"kind": "Pod", "metadata": {"annotations": annotations}});
            PodObject::read(&pod)
                .unwrap()
                .applied_record()
                .map(str::to_owned)
        };
        let annotations = json!({"a": "1", APPLIED_ANNOTATION: "cdn,gpu", "z": "2"});
        assert_eq!(record(annotations), Some("cdn,gpu".into()));
        assert_eq!(record(json!({"a": "1"})), None);
        assert_eq!(record(json!(null)), None);
        let error = PodObject::read(&json!({"kind": "Pod", "metadata": {"annotations": {
            APPLIED_ANNOTATION: 7}}}))
        .unwrap_err();
        assert!(error.contains("not a readable Pod"), "{error}");
    }
}
