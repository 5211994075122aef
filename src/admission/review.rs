//! `admission.k8s.io/v1` AdmissionReview: read once, typed, and answered.
//!
//! The envelope is read with the object and the old object left raw (borrowed from
//! the body, stepped over rather than parsed), then each object on its own into the
//! one type berth decides on for the request's kind: a Pod, or a DaemonSet's pod
//! template, into berth's view of a pod ([`PodView`]); a Namespace's annotations; a
//! PlacementPolicy. Every field those types do not name is skipped unparsed, and
//! serde_json skips a value without recursion, so no depth there can fail the read:
//! `metadata.managedFields` (free-form, any depth, timestamps a user may set out of
//! any range), `status`, a container's env and probes. An object berth cannot read
//! still leaves the uid, read apart, to answer with a denial. The lists berth walks
//! are read within their bounds ([`crate::placement::bounds`]), so what a read holds
//! is at most [`READ_COST`] times the body's length, which is what the memory
//! budget charges it. Every answer is a 200 AdmissionReview echoing the request's
//! uid; `patchType` is set exactly when a patch is.

use base64::Engine;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use serde::de::{DeserializeOwned, IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde::{Deserialize, Deserializer, Serialize};
use serde_json::value::RawValue;
use serde_json::{Value, json};

use crate::placement::pod::{PodView, ReadPod, ReadTemplate};
use crate::policy::compile::Labels;
use crate::policy::{PlacementPolicy, PlacementPolicySpec};

const API_VERSION: &str = "admission.k8s.io/v1";

/// What reading a review holds in memory, at most, per byte of its body (the body
/// included): the memory budget charges a review its length times this
/// ([`super::body::BodyLimits::charge`]). The test
/// `the_worst_reviews_hold_at_most_read_cost_per_byte` pins it: each shape that
/// costs most per byte within berth's bounds (lists of `{}` just past a power of
/// two, one-letter strings, many short keys), counted by the allocator while it is
/// read. No other count is kept: a review is charged before it is read.
pub const READ_COST: usize = 48;

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
    Pod(Box<Result<PodView, String>>),
    /// A DaemonSet, as the pod its template makes; none when berth cannot read that
    /// pod (it then patches nothing).
    DaemonSet(Option<Box<PodView>>),
    /// A Namespace: its annotations (none when they are not a map of strings).
    Namespace(Labels),
    /// A PlacementPolicy.
    Policy(Box<Policy>),
}

impl Object {
    pub fn pod(&self) -> Option<&Result<PodView, String>> {
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
struct Envelope<'a> {
    api_version: Option<String>,
    kind: Option<String>,
    #[serde(borrow)]
    request: Option<RawRequest<'a>>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct RawRequest<'a> {
    uid: String,
    kind: GroupVersionKind,
    #[serde(default)]
    sub_resource: Option<String>,
    operation: String,
    #[serde(default)]
    namespace: Option<String>,
    #[serde(default)]
    name: Option<String>,
    #[serde(default)]
    user_info: UserInfo,
    #[serde(default)]
    dry_run: Option<bool>,
    // Raw: read on its own, so that its depth or content cannot hide the uid.
    #[serde(default, borrow)]
    object: Option<&'a RawValue>,
    #[serde(default, borrow)]
    old_object: Option<&'a RawValue>,
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
    fn of(request: &RawRequest) -> Option<Decided> {
        let is = |group, kind| is_kind(&request.kind, request.sub_resource.as_deref(), group, kind);
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

/// Reads a request body (charged to the budget before, [`READ_COST`]); the error
/// is the reason for a 400.
pub fn parse(body: &[u8]) -> Result<AdmissionRequest, String> {
    // JSON is UTF-8, in the parts berth skips too (serde_json reads past a stray
    // byte in a string it ignores).
    let text = std::str::from_utf8(body)
        .map_err(|e| format!("the body is not an AdmissionReview: it is not UTF-8 ({e})"))?;
    let envelope: Envelope = serde_json::from_str(text)
        .map_err(|e| format!("the body is not an AdmissionReview: {e}"))?;
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
    let decided = Decided::of(&raw);
    let mut unreadable = None;
    let mut read = |raw: Option<&RawValue>, what: &str| {
        let object = read_object(decided?, raw?.get());
        object.unwrap_or_else(|e| {
            unreadable.get_or_insert(format!("{what}: {e}"));
            None
        })
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
        Decided::Pod => read_view(text, |ReadPod(pod)| pod)?.map(Object::Pod),
        Decided::DaemonSet => {
            let Some(daemonset) = serde_json::from_str::<Option<DaemonSet>>(text)? else {
                return Ok(None);
            };
            let template = daemonset.spec.and_then(|spec| spec.template);
            let view = match template {
                Some(template) => read_view(template.get(), |ReadTemplate(pod)| pod)?,
                None => None,
            };
            Some(Object::DaemonSet(view.and_then(|view| (*view).ok().map(Box::new))))
        }
        Decided::Namespace => serde_json::from_str::<Option<Named>>(text)?.map(|namespace| {
            let annotations = namespace.metadata.and_then(|m| m.annotations);
            let read = annotations.and_then(|a| serde_json::from_str(a.get()).ok());
            Object::Namespace(read.unwrap_or_default())
        }),
        Decided::Policy => serde_json::from_str::<Option<PolicyObject>>(text)?
            .map(|policy| Object::Policy(Box::new(policy.into_policy()))),
    })
}

/// A pod's view from `text`, as `R` reads it: a pod of the wrong shape is read as
/// why berth refuses it, unless its JSON is one berth cannot read at all (the
/// error).
fn read_view<R: DeserializeOwned>(
    text: &str,
    view: fn(R) -> Box<Result<PodView, String>>,
) -> serde_json::Result<Option<Box<Result<PodView, String>>>> {
    match serde_json::from_str::<Option<R>>(text) {
        Ok(read) => Ok(read.map(view)),
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

/// Of a DaemonSet, its pod template, raw: read as the pod it makes.
#[derive(Deserialize)]
struct DaemonSet<'a> {
    #[serde(default, borrow)]
    spec: Option<DaemonSetSpec<'a>>,
}

#[derive(Deserialize)]
struct DaemonSetSpec<'a> {
    #[serde(default, borrow)]
    template: Option<&'a RawValue>,
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
                let mut policy = PlacementPolicy::new(meta.name.as_deref().unwrap_or_default(), spec);
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

