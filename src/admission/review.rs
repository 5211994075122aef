//! `admission.k8s.io/v1` AdmissionReview: read once, typed, and answered.
//!
//! The envelope is read once. A pod that follows its kind, as the apiserver writes
//! it, is read in that pass; any other object is left raw (borrowed from the body,
//! stepped over rather than parsed), then read on its own into the one type berth
//! decides on for the request's kind ([`RawRequest`]): a Pod into the one pod model
//! ([`PodObject`], by its one reader); a DaemonSet as [`DaemonSetObject`] (its
//! template that same pod); a Namespace's annotations; a PlacementPolicy. Every field those types do not name is skipped unparsed, and
//! serde_json skips a value without recursion, so no depth there can fail the read:
//! `metadata.managedFields` (free-form, any depth, timestamps a user may set out of
//! any range), `status`, a container's env and probes. An object berth cannot read
//! still leaves the uid, read apart, to answer with a denial. The lists berth walks
//! are read within their bounds ([`crate::placement::bounds`]), so what a read holds
//! is at most its [`read_cost`], which is what the memory budget charges it. Every answer is a 200 AdmissionReview echoing the request's
//! uid; `patchType` is set exactly when a patch is.

use base64::Engine;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use serde::de::{IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde::{Deserialize, Deserializer, Serialize};
use serde_json::value::RawValue;
use serde_json::{Value, json};

use crate::objects::pod::ReadPod;
use crate::objects::{DaemonSetObject, PodObject};
use crate::policy::compile::Labels;
use crate::policy::{PlacementPolicy, PlacementPolicySpec};

const API_VERSION: &str = "admission.k8s.io/v1";

/// What reading a review may hold, the body included, charged to the memory
/// budget before it is read ([`super::body::BodyLimits::charge`]); no other count
/// is kept. It is an upper bound by what reading allocates, whatever the JSON:
///
/// - the body, and the strings read out of it: a string's content is never longer
///   than its JSON (escapes only shorten it), and serde_json unescapes into one
///   scratch buffer that may grow to twice the longest string and, while it
///   grows, hold the old buffer too: at most [`PER_BYTE`] times the length;
/// - each value kept in a list, a map or a struct: a slot in its `Vec` (up to
///   three times its size while the `Vec` doubles) or its share of a B-tree node.
///   Every such value is an item of an array or a member of an object, so it
///   follows a `[`, `{` or `,` outside strings ([`items`]): at most [`PER_ITEM`]
///   each;
/// - the bounded lists of the largest items ([`crate::bounds`]: containers,
///   node-selector requirements), which may hold more per item than [`PER_ITEM`]
///   while they double, but never more than [`LEAST`] over it in all.
///
/// In a review over 64 KiB, string content costs its length only, however many
/// commas or quotes it holds: a review up to the body limit (19 MiB) of strings
/// is read within the default budget. The test `the_worst_reviews_hold_at_most_their_read_cost` pins the
/// constants: the shapes that hold most per byte and per item, counted by the
/// allocator while they are read. A JSON value kept whole, or a list of large
/// structs read without a bound, would break it: read within a bound
/// ([`crate::objects::pod`]).
pub fn read_cost(body: &[u8]) -> usize {
    // A small review (read at once, on the async worker) counts those bytes in its
    // strings too, in a pass a twentieth of the time of stepping over strings (0.2
    // against 5 µs on the bench's review): an upper bound still, its strings adding
    // at most 128 times 64 KiB, which the budget holds. A large one steps over
    // strings, so that string content costs its length only.
    let items = if super::body::BodyLimits::is_small(body.len()) {
        body.chunks(255)
            .map(|chunk| chunk.iter().fold(0u8, |n, &b| n + u8::from(opens(b))))
            .map(usize::from)
            .sum()
    } else {
        items(body)
    };
    let items = items.saturating_mul(PER_ITEM);
    LEAST
        .saturating_add(body.len().saturating_mul(PER_BYTE))
        .saturating_add(items)
}

/// Whether `byte` may open an item or a member: `[`, `{` or `,`.
fn opens(byte: u8) -> bool {
    matches!(byte, b'[' | b'{' | b',')
}

/// Per byte of the body: the body itself, a string's content copied out of it,
/// and serde_json's scratch buffer for a string with escapes (up to twice its
/// content while it doubles, the old buffer held as it grows). The worst shape,
/// a kept string of escapes one byte past a power of two, holds 3.9 per byte.
pub const PER_BYTE: usize = 4;
/// Per item or member: a `Vec` slot of a `String` (24 bytes, up to three times
/// that while the `Vec` doubles) or a map entry of two (a B-tree node holds up to
/// 11 in 540 bytes, and at least 5). Measured, maps of empty strings hold about
/// 65 per item; a B-tree at its least fill would hold about 105.
pub const PER_ITEM: usize = 128;
/// What any review is charged besides: the lists of large structs berth reads are
/// bounded ([`crate::bounds`]), and at their bounds hold more than their items
/// are charged, by about 32 KiB (two lists of containers, about 200 bytes each).
pub const LEAST: usize = 64 * 1024;

/// The items and members of the body's arrays and objects, counted by the bytes
/// that may open one outside strings (`[`, `{` and `,`; an empty `[]` or `{}`
/// counts too, and a struct may be read from it). Strings are stepped over as
/// serde_json reads them, to the first quote not escaped, so their content costs
/// nothing here whatever it holds; where the JSON is malformed, serde_json stops
/// reading at the first error, and what it read before is counted all the same.
pub fn items(body: &[u8]) -> usize {
    // One plain loop, about a nanosecond a byte: faster than memchr's calls
    // between short strings (by 4x on the bench's review).
    let (mut count, mut in_string, mut escaped) = (0, false, false);
    for &byte in body {
        if escaped {
            escaped = false;
        } else if in_string {
            match byte {
                b'\\' => escaped = true,
                b'"' => in_string = false,
                _ => {}
            }
        } else {
            match byte {
                b'"' => in_string = true,
                _ => count += usize::from(opens(byte)),
            }
        }
    }
    count
}

/// What the apiserver asks about one object.
#[derive(Debug, Clone)]
pub struct AdmissionRequest {
    pub uid: String,
    pub kind: GroupVersionKind,
    pub sub_resource: Option<String>,
    pub operation: String,
    pub namespace: Option<String>,
    pub name: Option<String>,
    /// Who sends the object.
    pub user_info: UserInfo,
    /// A server-side dry run: berth then writes nothing to the cluster.
    pub dry_run: bool,
    /// The object, read as berth reads its kind (none for kinds it does not decide
    /// on).
    pub object: Option<Object>,
    pub old_object: Option<Object>,
    /// Why the object (or the old object) could not be read; berth then refuses.
    pub unreadable: Option<String>,
}

/// An object under review, as berth reads it.
#[derive(Debug, Clone)]
pub enum Object {
    /// A Pod, read into berth's view of it ([`ReadPod`], boxed as it reads it), or
    /// why berth cannot read it (a field it needs of the wrong shape, a list over
    /// its bound): the pod is then refused.
    Pod(Box<Result<PodObject, String>>),
    /// A DaemonSet, its template read as a pod; none when berth cannot read it (it
    /// then patches nothing).
    DaemonSet(Option<Box<DaemonSetObject>>),
    /// A Namespace: its annotations (none when they are not a map of strings).
    Namespace(Labels),
    /// A PlacementPolicy.
    Policy(Box<Policy>),
}

impl Object {
    pub fn pod(&self) -> Option<&Result<PodObject, String>> {
        match self {
            Object::Pod(pod) => Some(pod.as_ref()),
            _ => None,
        }
    }
}

/// A PlacementPolicy under review.
#[derive(Debug, Clone)]
pub struct Policy {
    /// It carries the controller's probe annotation (`controller::webhook_path`).
    pub probe: bool,
    /// The policy, or why it is not a valid one.
    pub policy: Result<PlacementPolicy, String>,
}

#[derive(Debug, Clone, Deserialize, PartialEq, Eq)]
pub struct GroupVersionKind {
    #[serde(default)]
    pub group: String,
    pub version: String,
    pub kind: String,
}

/// `request.userInfo`.
#[derive(Debug, Clone, Default, Deserialize, PartialEq, Eq)]
pub struct UserInfo {
    #[serde(default)]
    pub username: String,
    #[serde(default)]
    pub groups: Vec<String>,
}

impl AdmissionRequest {
    /// Whether the request is about a core/v1 Pod itself (not a subresource).
    pub fn is_pod(&self) -> bool {
        self.is_kind("", "Pod")
    }

    pub fn is_kind(&self, group: &str, kind: &str) -> bool {
        is_kind(&self.kind, self.sub_resource.as_deref(), group, kind)
    }
}

fn is_kind(gvk: &GroupVersionKind, sub_resource: Option<&str>, group: &str, kind: &str) -> bool {
    gvk.group == group && gvk.kind == kind && sub_resource.is_none()
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Envelope<'a, const RAW: bool> {
    api_version: Option<String>,
    kind: Option<String>,
    #[serde(borrow)]
    request: Option<RawRequest<'a, RAW>>,
}

/// `request`, with each object either read where it stands or left raw for a
/// second pass.
///
/// Hand-written (one visitor), for what a profile showed: stepping over a 6 kB
/// pod as a raw value before reading it took 4.7 of the 12.1 µs its review's
/// read took (8.9 µs in one pass, `benches/decision.rs`). The
/// apiserver writes `kind` before `object`, so with `RAW` false a pod is read
/// typed in the envelope's one pass. A review in another order, or one whose pod
/// berth cannot read typed, is read again with `RAW` true: each object raw, read
/// on its own after, so that its content cannot hide the uid.
struct RawRequest<'a, const RAW: bool> {
    uid: String,
    kind: GroupVersionKind,
    sub_resource: Option<String>,
    operation: String,
    namespace: Option<String>,
    name: Option<String>,
    user_info: UserInfo,
    dry_run: Option<bool>,
    object: Option<Slot<'a>>,
    old_object: Option<Slot<'a>>,
}

/// An object as the envelope's pass leaves it.
enum Slot<'a> {
    Raw(&'a RawValue),
    Pod(Box<Result<PodObject, String>>),
}

#[derive(Deserialize)]
#[serde(field_identifier, rename_all = "camelCase")]
enum Field {
    Uid,
    Kind,
    SubResource,
    Operation,
    Namespace,
    Name,
    UserInfo,
    DryRun,
    Object,
    OldObject,
    #[serde(other)]
    Other,
}

impl<'de: 'a, 'a, const RAW: bool> Deserialize<'de> for RawRequest<'a, RAW> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_map(RequestVisitor::<RAW>)
    }
}

struct RequestVisitor<const RAW: bool>;

impl<'de, const RAW: bool> Visitor<'de> for RequestVisitor<RAW> {
    type Value = RawRequest<'de, RAW>;

    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("an admission request")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        use serde::de::Error;
        fn once<'de, A: MapAccess<'de>, T: Deserialize<'de>>(
            map: &mut A,
            slot: &mut Option<T>,
            name: &'static str,
        ) -> Result<(), A::Error> {
            if slot.is_some() {
                return Err(A::Error::duplicate_field(name));
            }
            *slot = Some(map.next_value()?);
            Ok(())
        }
        let (mut uid, mut kind, mut sub_resource, mut operation) = (None, None, None, None);
        let (mut namespace, mut name, mut user_info, mut dry_run) = (None, None, None, None);
        let (mut object, mut old_object) = (None::<Option<Slot>>, None::<Option<Slot>>);
        while let Some(field) = map.next_key::<Field>()? {
            match field {
                Field::Uid => once(&mut map, &mut uid, "uid")?,
                Field::Kind => once(&mut map, &mut kind, "kind")?,
                Field::SubResource => once(&mut map, &mut sub_resource, "subResource")?,
                Field::Operation => once(&mut map, &mut operation, "operation")?,
                Field::Namespace => once(&mut map, &mut namespace, "namespace")?,
                Field::Name => once(&mut map, &mut name, "name")?,
                Field::UserInfo => once(&mut map, &mut user_info, "userInfo")?,
                Field::DryRun => once(&mut map, &mut dry_run, "dryRun")?,
                Field::Object | Field::OldObject => {
                    // A pod by what the request said before its object.
                    let typed = !RAW
                        && kind.as_ref().is_some_and(|kind| {
                            let sub_resource = sub_resource.as_ref().and_then(Option::as_deref);
                            matches!(Decided::of(kind, sub_resource), Some(Decided::Pod))
                        });
                    let (slot, name) = match field {
                        Field::Object => (&mut object, "object"),
                        _ => (&mut old_object, "oldObject"),
                    };
                    if slot.is_some() {
                        return Err(A::Error::duplicate_field(name));
                    }
                    *slot = Some(if typed {
                        map.next_value::<Option<ReadPod>>()?
                            .map(|ReadPod(pod)| Slot::Pod(pod))
                    } else {
                        map.next_value::<Option<&RawValue>>()?.map(Slot::Raw)
                    });
                }
                Field::Other => {
                    map.next_value::<IgnoredAny>()?;
                }
            }
        }
        Ok(RawRequest {
            uid: uid.ok_or_else(|| A::Error::missing_field("uid"))?,
            kind: kind.ok_or_else(|| A::Error::missing_field("kind"))?,
            sub_resource: sub_resource.flatten(),
            operation: operation.ok_or_else(|| A::Error::missing_field("operation"))?,
            namespace: namespace.flatten(),
            name: name.flatten(),
            user_info: user_info.unwrap_or_default(),
            dry_run: dry_run.flatten(),
            object: object.flatten(),
            old_object: old_object.flatten(),
        })
    }
}

/// The kinds berth decides on, whose objects it reads.
#[derive(Debug, Clone, Copy)]
enum Decided {
    Pod,
    DaemonSet,
    Namespace,
    Policy,
}

impl Decided {
    fn of(gvk: &GroupVersionKind, sub_resource: Option<&str>) -> Option<Decided> {
        let is = |group, kind| is_kind(gvk, sub_resource, group, kind);
        [
            (is("", "Pod"), Decided::Pod),
            (is("apps", "DaemonSet"), Decided::DaemonSet),
            (is("", "Namespace"), Decided::Namespace),
            (is(crate::names::GROUP, "PlacementPolicy"), Decided::Policy),
        ]
        .into_iter()
        .find_map(|(is, decided)| is.then_some(decided))
    }
}

/// Reads a request body (charged to the budget before, [`read_cost`]); the error
/// is the reason for a 400.
pub fn parse(body: &[u8]) -> Result<AdmissionRequest, String> {
    // JSON is UTF-8, in the parts berth skips too (serde_json reads past a stray
    // byte in a string it ignores).
    let text = std::str::from_utf8(body)
        .map_err(|e| format!("the body is not an AdmissionReview: it is not UTF-8 ({e})"))?;
    // One pass where it can be (a pod after its kind, read typed), else two.
    match serde_json::from_str::<Envelope<false>>(text) {
        Ok(envelope) if envelope.request.as_ref().is_none_or(read_in_one_pass) => {
            into_request(envelope)
        }
        _ => into_request(
            serde_json::from_str::<Envelope<true>>(text)
                .map_err(|e| format!("the body is not an AdmissionReview: {e}"))?,
        ),
    }
}

/// Whether the one pass read the objects as the whole request says to: typed
/// exactly when it is a pod (a `kind` or `subResource` after the object can
/// change that).
fn read_in_one_pass(request: &RawRequest<'_, false>) -> bool {
    let decided = Decided::of(&request.kind, request.sub_resource.as_deref());
    let pod = matches!(decided, Some(Decided::Pod));
    [&request.object, &request.old_object]
        .into_iter()
        .flatten()
        .all(|slot| match slot {
            Slot::Raw(_) => !pod,
            Slot::Pod(_) => pod,
        })
}

fn into_request<const RAW: bool>(envelope: Envelope<'_, RAW>) -> Result<AdmissionRequest, String> {
    if envelope.kind.as_deref() != Some("AdmissionReview") {
        return Err("the body is not an AdmissionReview: kind must be AdmissionReview".into());
    }
    if envelope.api_version.as_deref() != Some(API_VERSION) {
        return Err(format!(
            "unsupported AdmissionReview version {:?}; berth speaks {API_VERSION}",
            envelope.api_version.unwrap_or_default()
        ));
    }
    let raw = envelope
        .request
        .ok_or_else(|| "the AdmissionReview has no request".to_string())?;
    let decided = Decided::of(&raw.kind, raw.sub_resource.as_deref());
    let mut unreadable = None;
    let mut read = |slot: Option<Slot>, what: &str| match slot? {
        Slot::Pod(pod) => Some(Object::Pod(pod)),
        Slot::Raw(raw) => read_object(decided?, raw.get()).unwrap_or_else(|e| {
            unreadable.get_or_insert(format!("{what}: {e}"));
            None
        }),
    };
    let object = read(raw.object, "the object");
    let old_object = read(raw.old_object, "the old object");
    Ok(AdmissionRequest {
        uid: raw.uid,
        kind: raw.kind,
        sub_resource: raw.sub_resource,
        operation: raw.operation,
        namespace: raw.namespace,
        name: raw.name,
        user_info: raw.user_info,
        dry_run: raw.dry_run.unwrap_or(false),
        object,
        old_object,
        unreadable,
    })
}

/// An object of a kind berth decides on, from its JSON; `null` is none. The error
/// is JSON berth cannot read (malformed, nested deeper than serde_json reads, a
/// field it needs of the wrong shape outside a pod's view).
fn read_object(kind: Decided, text: &str) -> serde_json::Result<Option<Object>> {
    Ok(match kind {
        Decided::Pod => read_pod(text)?.map(Object::Pod),
        Decided::DaemonSet => match serde_json::from_str::<Option<DaemonSetObject>>(text) {
            Ok(daemonset) => daemonset.map(|d| Object::DaemonSet(Some(Box::new(d)))),
            Err(e) if e.is_data() => {
                serde_json::from_str::<Shape>(text)?;
                Some(Object::DaemonSet(None))
            }
            Err(e) => return Err(e),
        },
        Decided::Namespace => serde_json::from_str::<Option<Named>>(text)?.map(|namespace| {
            let annotations = namespace.metadata.and_then(|m| m.annotations);
            let read = annotations.and_then(|a| serde_json::from_str(a.get()).ok());
            Object::Namespace(read.unwrap_or_default())
        }),
        Decided::Policy => serde_json::from_str::<Option<PolicyObject>>(text)?
            .map(|policy| Object::Policy(Box::new(policy.into_policy()))),
    })
}

/// A pod from `text` ([`ReadPod`]): a pod of the wrong shape is read as why berth
/// refuses it, unless its JSON is one berth cannot read at all (the error).
fn read_pod(text: &str) -> serde_json::Result<Option<Box<Result<PodObject, String>>>> {
    match serde_json::from_str::<Option<ReadPod>>(text) {
        Ok(read) => Ok(read.map(|ReadPod(pod)| pod)),
        Err(e) if e.is_data() => {
            serde_json::from_str::<Shape>(text)?;
            Ok(Some(Box::new(Err(format!("not a readable Pod: {e}")))))
        }
        Err(e) => Err(e),
    }
}

/// Any JSON, read for its shape only: nothing is built, and serde_json's limit on
/// nesting holds, as it does in every typed read but not when a value is skipped
/// (`IgnoredAny`). Hand-written (one visitor): it tells JSON berth cannot read at
/// all from a pod of the wrong shape, which a typed read stops at first.
struct Shape;

impl<'de> Deserialize<'de> for Shape {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Shape, D::Error> {
        deserializer.deserialize_any(Shape)
    }
}

impl<'de> Visitor<'de> for Shape {
    type Value = Shape;

    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("any JSON value")
    }

    fn visit_bool<E>(self, _: bool) -> Result<Shape, E> {
        Ok(Shape)
    }

    fn visit_i64<E>(self, _: i64) -> Result<Shape, E> {
        Ok(Shape)
    }

    fn visit_u64<E>(self, _: u64) -> Result<Shape, E> {
        Ok(Shape)
    }

    fn visit_f64<E>(self, _: f64) -> Result<Shape, E> {
        Ok(Shape)
    }

    fn visit_str<E>(self, _: &str) -> Result<Shape, E> {
        Ok(Shape)
    }

    fn visit_unit<E>(self) -> Result<Shape, E> {
        Ok(Shape)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Shape, A::Error> {
        while seq.next_element::<Shape>()?.is_some() {}
        Ok(Shape)
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Shape, A::Error> {
        while map.next_entry::<IgnoredAny, Shape>()?.is_some() {}
        Ok(Shape)
    }
}

/// Of a Namespace, its annotations, raw: read as strings, or as none.
#[derive(Deserialize)]
struct Named<'a> {
    #[serde(default, borrow)]
    metadata: Option<Annotated<'a>>,
}

#[derive(Deserialize)]
struct Annotated<'a> {
    #[serde(default, borrow)]
    annotations: Option<&'a RawValue>,
}

/// A PlacementPolicy: of its metadata what validation reads, and its spec, raw, so
/// that a spec that is not a valid one is refused for it.
#[derive(Deserialize)]
struct PolicyObject<'a> {
    #[serde(default)]
    metadata: Option<PolicyMeta>,
    #[serde(default, borrow)]
    spec: Option<&'a RawValue>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct PolicyMeta {
    #[serde(default)]
    name: Option<String>,
    #[serde(default)]
    annotations: Option<Labels>,
    #[serde(default)]
    creation_timestamp: Option<Time>,
}

impl PolicyObject<'_> {
    fn into_policy(self) -> Policy {
        let meta = self.metadata.unwrap_or(PolicyMeta {
            name: None,
            annotations: None,
            creation_timestamp: None,
        });
        let probe = meta
            .annotations
            .as_ref()
            .is_some_and(|a| a.contains_key(crate::names::WEBHOOK_PROBE_ANNOTATION));
        let spec = match self.spec {
            Some(spec) => serde_json::from_str::<PlacementPolicySpec>(spec.get()),
            None => Err(serde::de::Error::missing_field("spec")),
        };
        let policy = spec
            .map(|spec| {
                let mut policy =
                    PlacementPolicy::new(meta.name.as_deref().unwrap_or_default(), spec);
                policy.metadata.name = meta.name;
                policy.metadata.annotations = meta.annotations;
                policy.metadata.creation_timestamp = meta.creation_timestamp;
                policy
            })
            .map_err(|e| format!("not a valid PlacementPolicy: {e}"));
        Policy { probe, policy }
    }
}

/// The request uid from the first bytes of a body too large to read whole, when
/// they hold it: the apiserver writes `request.uid` near the start. Scans the
/// top-level object for `request`, and in it for `uid`, skipping other values.
pub fn uid_from_prefix(prefix: &[u8]) -> Option<String> {
    let mut scan = Scanner {
        text: prefix,
        at: 0,
    };
    scan.expect(b'{')?;
    loop {
        let key = scan.string()?;
        scan.expect(b':')?;
        if key == "request" {
            scan.expect(b'{')?;
            loop {
                let key = scan.string()?;
                scan.expect(b':')?;
                if key == "uid" {
                    return scan.string().filter(|uid| !uid.is_empty());
                }
                scan.skip_value()?;
                scan.expect(b',')?;
            }
        }
        scan.skip_value()?;
        scan.expect(b',')?;
    }
}

/// Just enough JSON to walk keys and skip values in a possibly cut-off prefix.
struct Scanner<'a> {
    text: &'a [u8],
    at: usize,
}

impl Scanner<'_> {
    fn peek(&mut self) -> Option<u8> {
        while self.text.get(self.at)?.is_ascii_whitespace() {
            self.at += 1;
        }
        self.text.get(self.at).copied()
    }

    fn expect(&mut self, byte: u8) -> Option<()> {
        (self.peek()? == byte).then(|| self.at += 1)
    }

    /// A string, unescaped only as far as a uid or a key needs (no escapes).
    fn string(&mut self) -> Option<String> {
        self.expect(b'"')?;
        let start = self.at;
        loop {
            match *self.text.get(self.at)? {
                b'"' => break,
                b'\\' => return None,
                _ => self.at += 1,
            }
        }
        let text = std::str::from_utf8(&self.text[start..self.at]).ok()?;
        self.at += 1;
        Some(text.to_owned())
    }

    /// Skips a string whose opening quote is next; escapes are stepped over.
    fn skip_string(&mut self) -> Option<()> {
        self.expect(b'"')?;
        loop {
            match *self.text.get(self.at)? {
                b'\\' => self.at += 2,
                b'"' => {
                    self.at += 1;
                    return Some(());
                }
                _ => self.at += 1,
            }
        }
    }

    /// Skips one value: a string, a number or literal, or a whole object or array.
    fn skip_value(&mut self) -> Option<()> {
        let mut depth = 0usize;
        loop {
            match self.peek()? {
                b'{' | b'[' => {
                    depth += 1;
                    self.at += 1;
                }
                b'}' | b']' => {
                    depth = depth.checked_sub(1)?;
                    self.at += 1;
                }
                b'"' => self.skip_string()?,
                _ if depth > 0 => self.at += 1,
                _ => {
                    while !matches!(self.text.get(self.at)?, b',' | b'}' | b']') {
                        self.at += 1;
                    }
                }
            }
            if depth == 0 {
                return Some(());
            }
        }
    }
}

/// The answer to one request.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct AdmissionResponse {
    pub uid: String,
    pub allowed: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub status: Option<Value>,
    /// The patch, base64-encoded, as the JSON string the answer carries: written
    /// once, as it is, rather than scanned again for characters to escape
    /// (base64 has none).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub patch: Option<Box<RawValue>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub patch_type: Option<String>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub warnings: Vec<String>,
}

impl AdmissionResponse {
    /// Allowed, unchanged.
    pub fn allow(request: &AdmissionRequest) -> Self {
        Self::allow_uid(&request.uid)
    }

    fn allow_uid(uid: &str) -> Self {
        AdmissionResponse {
            uid: uid.to_owned(),
            allowed: true,
            status: None,
            patch: None,
            patch_type: None,
            warnings: Vec::new(),
        }
    }

    /// Refused with `reason`, which kubectl shows the user.
    pub fn deny(request: &AdmissionRequest, reason: &str) -> Self {
        Self::deny_uid(&request.uid, reason)
    }

    /// Refused with `reason`, for a request known only by its uid.
    pub fn deny_uid(uid: &str, reason: &str) -> Self {
        AdmissionResponse {
            allowed: false,
            status: Some(json!({"code": 403, "reason": "Forbidden", "message": reason})),
            ..Self::allow_uid(uid)
        }
    }

    /// Adds `patch`, and `patchType` with it, unless the patch is empty.
    pub fn with_patch(self, patch: &json_patch::Patch) -> Self {
        if patch.0.is_empty() {
            return self;
        }
        // A patch of JSON values and pointers always serialises; were it not to,
        // the patch would be empty rather than cut short.
        match serde_json::to_vec(patch) {
            Ok(json) => self.with_patch_text(&json),
            Err(_) => self,
        }
    }

    /// Adds the JSON Patch `json`, already written as text, and `patchType`.
    pub fn with_patch_text(mut self, json: &[u8]) -> Self {
        let mut text = String::with_capacity(json.len().div_ceil(3) * 4 + 2);
        text.push('"');
        base64::engine::general_purpose::STANDARD.encode_string(json, &mut text);
        text.push('"');
        // A quoted base64 string is JSON.
        self.patch = RawValue::from_string(text).ok();
        self.patch_type = Some("JSONPatch".into());
        self
    }

    pub fn with_warnings(mut self, warnings: Vec<String>) -> Self {
        self.warnings = warnings;
        self
    }

    /// The AdmissionReview that carries this response.
    pub fn into_review(self) -> Review {
        Review {
            api_version: API_VERSION,
            kind: "AdmissionReview",
            response: self,
        }
    }
}

/// An AdmissionReview answering a request, serialised as it stands (no
/// intermediate JSON value).
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Review {
    api_version: &'static str,
    kind: &'static str,
    response: AdmissionResponse,
}

#[cfg(test)]
mod tests {
    use std::alloc::{GlobalAlloc, Layout};
    use std::cell::Cell;

    use super::*;

    /// berth's allocator, counting on each thread the bytes it holds and the most
    /// it held: berth's unit tests run with it (see `lib.rs`), so that what a read
    /// holds is measured, not estimated. A `realloc` counts as the new block taken
    /// before the old one is given back, as when it moves.
    struct Counting;

    thread_local! {
        static HELD: Cell<usize> = const { Cell::new(0) };
        static PEAK: Cell<usize> = const { Cell::new(0) };
    }

    fn count(taken: usize, given_back: usize) {
        let _ = HELD.try_with(|held| {
            let most = held.get() + taken;
            let _ = PEAK.try_with(|peak| peak.set(peak.get().max(most)));
            // A block freed here may have been taken on another thread.
            held.set(most.saturating_sub(given_back));
        });
    }

    // SAFETY: every call is passed on to jemalloc as it came.
    #[allow(unsafe_code)]
    unsafe impl GlobalAlloc for Counting {
        unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
            count(layout.size(), 0);
            unsafe { tikv_jemallocator::Jemalloc.alloc(layout) }
        }

        unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
            count(layout.size(), 0);
            unsafe { tikv_jemallocator::Jemalloc.alloc_zeroed(layout) }
        }

        unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
            count(0, layout.size());
            unsafe { tikv_jemallocator::Jemalloc.dealloc(ptr, layout) }
        }

        unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
            count(new_size, layout.size());
            unsafe { tikv_jemallocator::Jemalloc.realloc(ptr, layout, new_size) }
        }
    }

    #[global_allocator]
    static ALLOCATOR: Counting = Counting;

    /// The most this thread held beyond what it held before while `body` was
    /// read, its request included.
    fn held_reading(body: &str) -> usize {
        let before = HELD.with(Cell::get);
        PEAK.with(|peak| peak.set(before));
        let request = parse(body.as_bytes());
        let most = PEAK.with(Cell::get);
        assert!(request.is_ok(), "{request:?}");
        drop(request);
        most - before
    }

    fn review(object: &str) -> String {
        format!(
            r#"{{"kind":"AdmissionReview","apiVersion":"admission.k8s.io/v1","request":{{"uid":"u-1",
            "kind":{{"group":"","version":"v1","kind":"Pod"}},"operation":"CREATE",
            "userInfo":{{"username":"tenant","groups":["system:authenticated"]}},"object":{object}}}}}"#
        )
    }

    /// A review of `object` as an object of `group` and `kind`.
    fn review_of(group: &str, kind: &str, object: &str) -> String {
        review(object).replace(
            r#"{"group":"","version":"v1","kind":"Pod"}"#,
            &format!(r#"{{"group":"{group}","version":"v1","kind":"{kind}"}}"#),
        )
    }

    #[test]
    fn managed_fields_of_any_depth_and_status_are_skipped_unread() {
        let deep = format!("{}1{}", "[".repeat(100_000), "]".repeat(100_000));
        let object = format!(
            r#"{{"kind":"Pod","metadata":{{"name":"p","managedFields":[{{"time":"9999-12-31T23:59:59Z","fieldsV1":{deep}}}]}},
            "spec":{{"nodeName":"node2"}},"status":{deep}}}"#
        );
        let request = parse(review(&object).as_bytes()).expect("readable");
        assert_eq!(request.uid, "u-1");
        assert_eq!(request.user_info.username, "tenant");
        assert!(request.unreadable.is_none());
        let pod = request.object.unwrap().pod().cloned().unwrap().unwrap();
        assert_eq!(pod.node_name(), Some("node2"));
    }

    /// A pod as a Deployment makes it, with what berth reads and patches and what
    /// it does neither with.
    fn deployment_pod() -> Value {
        let container = |name: &str| {
            json!({"name": name, "image": format!("example/{name}:1"),
                   "env": [{"name": "A", "value": "b"}], "args": ["--x"],
                   "readinessProbe": {"httpGet": {"path": "/", "port": 80}},
                   "resources": {"requests": {"cpu": "100m"}}})
        };
        json!({"kind": "Pod", "metadata": {"name": "p", "annotations": {"a": "b"}},
               "spec": {"initContainers": [container("init")], "containers": [container("app"), container("proxy")],
                        "volumes": [{"name": "v", "emptyDir": {}}],
                        "tolerations": [{"key": "k", "operator": "Exists"}],
                        "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution":
                            {"nodeSelectorTerms": [{"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a"]}]}]}}}}})
    }

    /// A pod after its kind is read in the envelope's one pass; in any other
    /// order, or when it cannot be read typed, in two: both read it alike.
    #[test]
    fn a_review_reads_alike_in_one_pass_or_two() {
        let request = |fields: &[String]| {
            let body = format!(
                r#"{{"kind":"AdmissionReview","apiVersion":"admission.k8s.io/v1","request":{{{}}}}}"#,
                fields.join(",")
            );
            format!("{:?}", parse(body.as_bytes()))
        };
        let kind = r#""kind":{"group":"","version":"v1","kind":"Pod"}"#.to_string();
        let fields = |object: &str| {
            [
                r#""uid":"u-1","operation":"UPDATE""#.to_string(),
                format!(r#""object":{object},"oldObject":{object}"#),
            ]
        };
        let wrong_shape = r#"{"kind":"Pod","spec":{"tolerations":"all"}}"#;
        for object in [deployment_pod().to_string(), wrong_shape.to_string()] {
            let [ids, objects] = fields(&object);
            let in_one = request(&[ids.clone(), kind.clone(), objects.clone()]);
            let in_two = request(&[objects, ids, kind.clone()]);
            assert_eq!(in_one, in_two);
            assert!(
                in_one.contains("Pod(Ok(") || in_one.contains("not a readable Pod"),
                "{in_one}"
            );
        }
        // A subresource named after the object: not a pod, so nothing is read.
        let [ids, objects] = fields(&deployment_pod().to_string());
        let status = request(&[ids, kind, objects, r#""subResource":"status""#.into()]);
        assert!(
            status.contains("object: None, old_object: None"),
            "{status}"
        );
    }

    #[test]
    fn keys_written_with_escapes_are_read_as_what_they_spell() {
        let object = r#"{"kind":"Pod","spec":{"t\u006flerations":[],"v\u006flumes":[1],
            "containers":[{"n\u0061me":"c","im\u0061ge":"x","\u0065nv":[1]}]}}"#;
        let request = parse(review(object).as_bytes()).expect("readable");
        let pod = request.object.unwrap().pod().cloned().unwrap().unwrap();
        assert_eq!(pod.toleration_list(), Some(&[][..]));
        let images = pod.images();
        let [image] = images.as_slice() else {
            panic!("{images:?}")
        };
        assert_eq!(
            (image.container.as_str(), image.image.written.as_str()),
            ("c", "x")
        );
    }

    /// Every part of the patch compares what the pod has before it writes: the lean
    /// pod must have it too, or berth would write what is already there.
    #[test]
    fn the_lean_pod_gets_the_patch_the_whole_pod_gets() {
        use crate::placement::grants::{Grants, QueuePriority};
        use crate::placement::patch::build_patch;
        use k8s_openapi::api::core::v1::{
            NodeSelectorRequirement, NodeSelectorTerm, PreferredSchedulingTerm, Toleration,
        };

        let pool = NodeSelectorRequirement {
            key: "berth.io/pool".into(),
            operator: "In".into(),
            values: Some(vec!["cdn".into()]),
        };
        let grants = Grants {
            tolerations: vec![Toleration {
                key: Some("berth.io/pool".into()),
                operator: Some("Equal".into()),
                value: Some("cdn".into()),
                effect: Some("NoSchedule".into()),
                ..Toleration::default()
            }],
            required: vec![pool.clone()],
            preferred: vec![PreferredSchedulingTerm {
                weight: 10,
                preference: NodeSelectorTerm {
                    match_expressions: Some(vec![pool]),
                    ..NodeSelectorTerm::default()
                },
            }],
            scheduler_name: Some("berth-scheduler".into()),
            scheduling_gates: vec!["berth.io/avoid".into()],
            applied: vec!["cdn".into()],
            pod_group: Some("g".into()),
            priority: Some(QueuePriority {
                class: "berth-queue-jobs-3".into(),
                value: 3,
            }),
            pinned_to: Some("node2".into()),
        };
        // As written by a user, and with everything the patch sets already set.
        let mut settled = deployment_pod();
        for (field, value) in [
            ("schedulerName", json!("berth-scheduler")),
            ("schedulingGroup", json!({"podGroupName": "g"})),
            ("priorityClassName", json!("berth-queue-jobs-3")),
            ("priority", json!(3)),
            ("preemptionPolicy", json!("Never")),
            ("schedulingGates", json!([{"name": "berth.io/avoid"}])),
            ("nodeName", json!("node2")),
        ] {
            settled["spec"][field] = value;
        }
        for whole in [deployment_pod(), settled] {
            let body = review(&whole.to_string());
            let patch = build_patch(&whole, &grants);
            assert!(!patch.0.is_empty());
            let request = parse(body.as_bytes()).unwrap();
            let lean = request.object.unwrap().pod().cloned().unwrap();
            assert_eq!(build_patch(&lean, &grants), patch, "{whole}");
            // And the patch applies to the whole pod as sent.
            let mut patched = whole.clone();
            json_patch::patch(&mut patched, &patch).expect("applies");
            assert_eq!(patched["spec"]["containers"], whole["spec"]["containers"]);
        }
    }

    #[test]
    fn odd_container_lists_are_kept_null_or_refused_with_the_reason() {
        let request = parse(review(r#"{"kind":"Pod","spec":{"containers":null}}"#).as_bytes());
        let pod = request.unwrap().object.unwrap().pod().cloned().unwrap();
        assert!(pod.unwrap().images().is_empty());
        for (containers, why) in [
            (r#"["app"]"#, "expected struct Container"),
            ("{}", "expected a sequence"),
        ] {
            let object = format!(r#"{{"kind":"Pod","spec":{{"containers":{containers}}}}}"#);
            let request = parse(review(&object).as_bytes()).unwrap();
            assert!(request.unreadable.is_none());
            let pod = request.object.unwrap().pod().cloned().unwrap();
            let reason = pod.unwrap_err();
            assert!(reason.starts_with("not a readable Pod"), "{reason}");
            assert!(reason.contains(why), "{reason}");
        }
    }

    #[test]
    fn a_daemonset_is_read_as_the_pod_its_template_makes() {
        use crate::placement::namespace::NamespaceInfo;
        let daemonset = json!({"kind": "DaemonSet", "spec": {"template": {
            "metadata": {"labels": {"app": "agent"}},
            "spec": {"containers": [{"name": "agent", "image": "example/cdn-agent:1",
                "env": [{"name": "A", "value": "b"}]}]}}},
            "status": {"x": [1]}});
        let body = review_of("apps", "DaemonSet", &daemonset.to_string());
        let request = parse(body.as_bytes()).unwrap();
        let Some(Object::DaemonSet(Some(read))) = &request.object else {
            panic!("{:?}", request.object)
        };
        let pod = read.template();
        assert_eq!(pod.labels().get("app").map(String::as_str), Some("agent"));
        assert_eq!(pod.images()[0].image.written, "example/cdn-agent:1");
        // The patch admission writes is the one the controller writes of the
        // whole DaemonSet.
        let policies =
            crate::policy::test_policies(&[("cdn", json!({"pool": {"nodeNames": ["node2"]}}))]);
        let mut namespace = NamespaceInfo::new("default");
        let opt_in = (
            crate::names::POLICIES_ANNOTATION.to_string(),
            "cdn".to_string(),
        );
        namespace.annotations.extend([opt_in]);
        let whole: DaemonSetObject = serde_json::from_value(daemonset).unwrap();
        let whole =
            crate::placement::daemonset::template_patch(whole.template(), &policies, &namespace);
        let read = crate::placement::daemonset::template_patch(pod, &policies, &namespace);
        assert!(!read.0.is_empty());
        assert_eq!(read, whole);
        // A template berth cannot read as a pod is patched by neither.
        let odd = r#"{"spec":{"template":{"spec":{"tolerations":"none"}}}}"#;
        let request = parse(review_of("apps", "DaemonSet", odd).as_bytes()).unwrap();
        assert!(matches!(request.object, Some(Object::DaemonSet(None))));
    }

    #[test]
    fn an_object_too_deep_to_read_still_leaves_the_uid() {
        let deep = format!("{}1{}", "[".repeat(200), "]".repeat(200));
        let object = format!(r#"{{"kind":"Pod","spec":{{"affinity":{deep}}}}}"#);
        let request = parse(review(&object).as_bytes()).expect("the envelope is readable");
        assert_eq!(request.uid, "u-1");
        assert!(request.object.is_none());
        let why = request.unreadable.unwrap();
        assert!(
            why.starts_with("the object: recursion limit exceeded"),
            "{why}"
        );
    }

    #[test]
    fn a_review_is_read_whatever_the_order_of_its_fields_and_refused_when_malformed() {
        let pod = deployment_pod().to_string();
        let request = |fields: &str| {
            format!(
                r#"{{"kind":"AdmissionReview","apiVersion":"admission.k8s.io/v1","request":{{{fields}}}}}"#
            )
        };
        let kind = r#""kind":{"group":"","version":"v1","kind":"Pod"}"#;
        let read = parse(
            request(&format!(
                r#""object":{pod},"\u0075id":"u","dryRun":true,"extra":{{"a":[1,2]}},"subResource":null,
                "userInfo":{{"username":"alice","uid":"1","groups":["a","b"],"extra":{{"x":["y"]}}}},
                "oldObject":null,{kind},"operation":"UPDATE","namespace":null"#
            ))
            .as_bytes(),
        )
        .unwrap();
        assert_eq!((read.uid.as_str(), read.dry_run), ("u", true));
        assert_eq!(read.user_info.groups, ["a", "b"]);
        assert!(read.object.unwrap().pod().unwrap().is_ok());
        assert!(read.old_object.is_none() && read.namespace.is_none());
        for malformed in [
            request(&format!(
                r#""uid":"u","uid":"v",{kind},"operation":"CREATE""#
            )),
            request(r#""uid":"u","operation":"CREATE""#),
            request(&format!(r#"{kind},"operation":"CREATE""#)),
            request(&format!(
                r#""uid":"u",{kind},"operation":"CREATE","userInfo":{{"groups":null}}"#
            )),
            request(&format!(
                r#""uid":"u",{kind},"operation":"CREATE","userInfo":{{"username":"a","username":"b"}}"#
            )),
            review(&pod).replace("AdmissionReview", "Review"),
        ] {
            assert!(parse(malformed.as_bytes()).is_err(), "{malformed}");
        }
    }

    #[test]
    fn a_body_that_is_not_utf8_is_refused_wherever_the_byte_is() {
        // JSON is UTF-8, checked once rather than per string: a stray byte in a
        // string berth skips (in the object or in the envelope) is refused as one
        // in a string it reads.
        let in_envelope =
            review("null").replace(r#""operation""#, r#""options":{"kind":"_"},"operation""#);
        for body in [
            review(r#"{"kind":"Pod","metadata":{"name":"_"}}"#),
            review(r#"{"kind":"Pod","status":{"message":"_"}}"#),
            in_envelope,
        ] {
            let mut body = body.into_bytes();
            let at = body.iter().rposition(|&b| b == b'_').unwrap();
            body[at] = 0xff;
            let why = parse(&body).unwrap_err();
            assert!(why.contains("not UTF-8"), "{why}");
        }
    }

    /// What reading a review holds is at most its `read_cost`, the body included,
    /// for the shapes that hold most per byte, per item and in all within berth's
    /// bounds: lists of empty objects (each a struct of up to two hundred bytes)
    /// and of empty strings, one item past a power of two (the list's growth by
    /// doubling), at and over their bound; maps of short keys, filled from either
    /// end; every bounded list at its bound, or one past half of it, at once; the
    /// least review of each kind; and strings berth keeps, of commas, of escaped
    /// quotes, and with escapes that grow serde_json's scratch buffer. The worst
    /// per byte (the last) holds 97% of its charge; the worst per item (maps of
    /// empty strings) about 65 bytes of [`PER_ITEM`]'s 128.
    #[test]
    fn the_worst_reviews_hold_at_most_their_read_cost() {
        let many = |item: &str, n: usize| vec![item; n].join(",");
        let keys = |n: usize| {
            let members: Vec<String> = (0..n).map(|i| format!(r#""{i:x}":"""#)).collect();
            members.join(",")
        };
        let term = |n: usize| format!(r#"{{"matchExpressions":[{}]}}"#, many("{}", n));
        let mut pods = Vec::new();
        for n in [1, 2, 3, 5, 9, 17, 33, 65, 129, 1_000] {
            let empty = many("{}", n);
            pods.extend([
                format!(r#"{{"spec":{{"tolerations":[{empty}]}}}}"#),
                format!(r#"{{"spec":{{"containers":[{empty}],"initContainers":[{empty}]}}}}"#),
                format!(r#"{{"metadata":{{"ownerReferences":[{empty}]}}}}"#),
                format!(r#"{{"spec":{{"schedulingGates":[{empty}]}}}}"#),
                format!(
                    r#"{{"spec":{{"affinity":{{"nodeAffinity":{{"requiredDuringSchedulingIgnoredDuringExecution":
                    {{"nodeSelectorTerms":[{empty},{}]}},"preferredDuringSchedulingIgnoredDuringExecution":
                    [{}]}}}}}}}}"#,
                    term(n),
                    many(&format!(r#"{{"preference":{}}}"#, term(n)), n.min(64)),
                ),
            ]);
        }
        for n in [1_025, 16_385, 65_537] {
            let strings = many(r#""""#, n);
            pods.extend([
                format!(
                    r#"{{"spec":{{"affinity":{{"nodeAffinity":{{"requiredDuringSchedulingIgnoredDuringExecution":
                    {{"nodeSelectorTerms":[{{"matchExpressions":[{{"values":[{strings}]}}]}}]}}}}}}}}}}"#
                ),
                format!(r#"{{"spec":{{"nodeSelector":{{{}}}}}}}"#, keys(n)),
                format!(r#"{{"metadata":{{"labels":{{{}}}}}}}"#, keys(n)),
            ]);
        }
        // Every bounded list at its bound, each term with its requirements at theirs.
        let full = |n| many("{}", n);
        pods.push(format!(
            r#"{{"metadata":{{"ownerReferences":[{}]}},"spec":{{"tolerations":[{}],"containers":[{}],
            "initContainers":[{}],"schedulingGates":[{}],"affinity":{{"nodeAffinity":{{
            "requiredDuringSchedulingIgnoredDuringExecution":{{"nodeSelectorTerms":[{}]}},
            "preferredDuringSchedulingIgnoredDuringExecution":[{}]}}}}}}}}"#,
            full(16),
            full(128),
            full(128),
            full(128),
            full(32),
            many(&term(64), 32),
            many(&format!(r#"{{"preference":{}}}"#, term(64)), 64),
        ));
        let half = |n: usize| many("{}", n / 2 + 1);
        pods.push(format!(
            r#"{{"metadata":{{"ownerReferences":[{}]}},"spec":{{"tolerations":[{}],"containers":[{}],
            "initContainers":[{}],"schedulingGates":[{}],"affinity":{{"nodeAffinity":{{
            "requiredDuringSchedulingIgnoredDuringExecution":{{"nodeSelectorTerms":[{}]}},
            "preferredDuringSchedulingIgnoredDuringExecution":[{}]}}}}}}}}"#,
            half(16),
            half(128),
            half(128),
            half(128),
            half(32),
            many(&term(33), 17),
            many(&format!(r#"{{"preference":{}}}"#, term(33)), 33),
        ));
        let mut bodies: Vec<String> = pods.iter().map(|pod| review(pod)).collect();
        for pod in &pods {
            let template = format!(r#"{{"spec":{{"template":{pod}}}}}"#);
            bodies.push(review_of("apps", "DaemonSet", &template));
        }
        bodies.extend([
            review("{}"),
            review("null"),
            review_of("", "Namespace", r#"{"metadata":{"annotations":{}}}"#),
            review_of(
                "",
                "Namespace",
                &format!(r#"{{"metadata":{{"annotations":{{{}}}}}}}"#, keys(16_385)),
            ),
            review_of(crate::names::GROUP, "PlacementPolicy", "{}"),
            review(r#"{"kind":"Pod"}"#).replace(
                r#""groups":["system:authenticated"]"#,
                &format!(r#""groups":[{}]"#, many(r#""""#, 16_385)),
            ),
        ]);
        // Maps filled from the right and from the left (B-tree nodes split there
        // half full), and strings berth keeps: of the bytes the count steps over,
        // and with escapes, unescaped into serde_json's scratch buffer as it
        // doubles (its content one byte past a power of two).
        let backwards: Vec<String> = (0..16_385)
            .rev()
            .map(|i| format!(r#""{i:05}":"""#))
            .collect();
        let escaped = format!("{}ab", format!("{}\\n", "a".repeat(63)).repeat(1 << 14));
        let strings = [",".repeat(1 << 20), r#"\""#.repeat(1 << 19), escaped];
        bodies.push(review(&format!(
            r#"{{"spec":{{"nodeSelector":{{{}}}}}}}"#,
            backwards.join(",")
        )));
        for content in &strings {
            bodies.extend([
                review(&format!(
                    r#"{{"metadata":{{"labels":{{"a":"{content}"}}}}}}"#
                )),
                review_of(
                    "",
                    "Namespace",
                    &format!(r#"{{"metadata":{{"annotations":{{"{content}":"{content}"}}}}}}"#),
                ),
            ]);
        }
        for n in [5, 33, 65, 16_385] {
            let selector = format!(r#"{{"matchExpressions":[{}]}}"#, many("{}", n));
            let spec = format!(
                r#"{{"namespaceSelector":{selector},"podSelector":{selector},"avoid":{selector},
                "nodeAffinity":{{"required":[{}],"preferred":[{}]}},"images":[{}]}}"#,
                many("{}", n),
                many("{}", n),
                many(r#""""#, n),
            );
            let policy = format!(r#"{{"metadata":{{"name":"p"}},"spec":{spec}}}"#);
            bodies.push(review_of(crate::names::GROUP, "PlacementPolicy", &policy));
        }
        let mut worst = (0.0, 0);
        for body in &bodies {
            let held = held_reading(body) + body.len();
            let cost = read_cost(body.as_bytes());
            let share = held as f64 / cost as f64;
            if share > worst.0 {
                worst = (share, body.len());
            }
            assert!(
                held <= cost,
                "{held} bytes held reading {} bytes: {}",
                body.len(),
                &body[..body.len().min(300)]
            );
        }
        println!(
            "the worst: {:.0}% of its read cost, a review of {} bytes",
            worst.0 * 100.0,
            worst.1
        );
    }

    #[test]
    fn what_berth_does_not_read_costs_it_nothing() {
        let env = vec![r#"{"name":"a","value":"b"}"#; 20_000].join(",");
        let pod = review(&format!(
            r#"{{"metadata":{{"name":"p","managedFields":[{env}]}},"status":{{"x":[{env}]}},
            "spec":{{"containers":[{{"name":"c","image":"nginx","env":[{env}]}}],"volumes":[{env}]}}}}"#
        ));
        assert!(held_reading(&pod) < 16_384, "{}", held_reading(&pod));
    }

    #[test]
    fn the_uid_is_found_in_a_cut_off_prefix() {
        let body = review(r#"{"kind":"Pod","spec":{"containers":[{"env":"<<<<"#);
        assert_eq!(uid_from_prefix(body.as_bytes()).as_deref(), Some("u-1"));
        let later = r#"{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","x":{"a":[1,"}",{"b":null}]},"request":{"kind":{"kind":"Pod"},"uid":"u-2","object":{"#;
        assert_eq!(uid_from_prefix(later.as_bytes()).as_deref(), Some("u-2"));
        assert_eq!(uid_from_prefix(br#"{"kind":"AdmissionReview","requ"#), None);
        assert_eq!(uid_from_prefix(b"not json"), None);
    }
}
