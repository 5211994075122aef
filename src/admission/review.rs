//! `admission.k8s.io/v1` AdmissionReview, read and written by hand.
//!
//! A Pod is read straight from the review's bytes into berth's view of it
//! ([`PodObject`]: the fields berth decides on, and which objects and lists the pod
//! has, for the patch), and nothing else of it is kept: no JSON value is built to
//! be read again and dropped. Every other object stays JSON (`serde_json::Value`),
//! read leniently. Either way `metadata.managedFields` (free-form, any depth,
//! timestamps a user may set out of any range), `status` and all berth neither
//! reads nor patches are stepped over without being parsed, and the object is read
//! apart from the envelope, so an object berth cannot read still leaves the uid to
//! answer with a denial. Every answer is a 200 AdmissionReview echoing the
//! request's uid; `patchType` is set exactly when a patch is.

use base64::Engine;
use serde::de::{DeserializeSeed, Error, IgnoredAny, MapAccess, Visitor};
use serde::{Deserialize, Deserializer, Serialize};
use serde_json::value::RawValue;
use serde_json::{Value, json};

use crate::lenient::{Key, LenientObject, Meter, OptionSeed, Skip};
use crate::objects::PodObject;
use crate::objects::pod::ReadPod;

const API_VERSION: &str = "admission.k8s.io/v1";

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
    /// The object, read leniently (see the module comment).
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
    /// An object of any other kind, as JSON.
    Json(Value),
}

impl Object {
    pub fn pod(&self) -> Option<&Result<PodObject, String>> {
        match self {
            Object::Pod(pod) => Some(pod.as_ref()),
            Object::Json(_) => None,
        }
    }

    pub fn json(&self) -> Option<&Value> {
        match self {
            Object::Json(value) => Some(value),
            Object::Pod(_) => None,
        }
    }
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
        self.kind.group == group && self.kind.kind == kind && self.sub_resource.is_none()
    }
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Envelope<R> {
    api_version: Option<String>,
    kind: Option<String>,
    request: Option<R>,
}

impl<R> Envelope<R> {
    /// The request, once the envelope is an AdmissionReview berth speaks.
    fn request(self) -> Result<R, String> {
        if self.kind.as_deref() != Some("AdmissionReview") {
            return Err("the body is not an AdmissionReview: kind must be AdmissionReview".into());
        }
        if self.api_version.as_deref() != Some(API_VERSION) {
            return Err(format!(
                "unsupported AdmissionReview version {:?}; berth speaks {API_VERSION}",
                self.api_version.unwrap_or_default()
            ));
        }
        self.request
            .ok_or_else(|| "the AdmissionReview has no request".to_string())
    }
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

/// Whether objects of `kind` are Pods, read into berth's view of a pod.
fn is_pod_kind(kind: &GroupVersionKind) -> bool {
    kind.group.is_empty() && kind.kind == "Pod"
}

/// What is skipped of an object of `kind` read as JSON: a pod's container details
/// are neither read nor patched (see `Skip`).
fn skip_for(kind: &GroupVersionKind) -> Skip {
    if is_pod_kind(kind) {
        Skip::PodContainerDetail
    } else {
        Skip::Status
    }
}

/// Reads a request body whose cost is charged; the error is the reason for a 400.
///
/// A well-formed review is read in one pass ([`read_within`]); anything else (an
/// object berth cannot read, an object before its kind, a duplicate field) is read
/// again in two, which finds the uid whatever the object holds and says what is
/// wrong. The two read every review they both read alike.
pub fn parse(body: &[u8]) -> Result<AdmissionRequest, String> {
    parse_after(body, None)
}

/// [`parse`] for a body [`read_within`] has already tried (`tried`, why it gave
/// up): one it could not read for its shape goes straight to the two passes.
pub fn parse_after(body: &[u8], tried: Option<GaveUp>) -> Result<AdmissionRequest, String> {
    if tried != Some(GaveUp::Shape)
        && let Ok((request, _)) = read_within(body, usize::MAX)
    {
        return request;
    }
    parse_in_two(body)
}

/// Why [`read_within`] gave up on a review.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GaveUp {
    /// It would have built more than its allowance: read it once charged.
    Allowance,
    /// One pass cannot read it (an object before its kind, a duplicate field, an
    /// object the lenient read refuses, malformed JSON): two passes can say what
    /// is wrong, and find the uid.
    Shape,
}

/// Reads a well-formed review in one pass, building at most `allowance` (in the
/// units of [`crate::lenient`]): the request, or why its envelope is refused, and
/// what the read built. The read stops at the first surprise or once it would
/// build more, and says which.
pub fn read_within(
    body: &[u8],
    allowance: usize,
) -> Result<(Result<AdmissionRequest, String>, usize), GaveUp> {
    let meter = Meter::within(allowance);
    // The meter counts what it refused too: past the allowance, that is why.
    let gave_up = |_| {
        if meter.spent() > allowance {
            GaveUp::Allowance
        } else {
            GaveUp::Shape
        }
    };
    // JSON is UTF-8: checked once here, so that serde_json need not check each
    // string it reads (a body that is not goes to the two passes, which say so).
    let text = std::str::from_utf8(body).map_err(|_| GaveUp::Shape)?;
    let mut deserializer = serde_json::Deserializer::from_str(text);
    let envelope = OnePass(&meter)
        .deserialize(&mut deserializer)
        .map_err(gave_up)?;
    deserializer.end().map_err(gave_up)?;
    Ok((envelope.request(), meter.spent()))
}

/// Reads the envelope with the objects raw, then each object on its own.
fn parse_in_two(body: &[u8]) -> Result<AdmissionRequest, String> {
    // JSON is UTF-8, in the parts berth skips too (serde_json reads past a stray
    // byte in a string it ignores).
    let text = std::str::from_utf8(body)
        .map_err(|e| format!("the body is not an AdmissionReview: it is not UTF-8 ({e})"))?;
    let envelope: Envelope<RawRequest> = serde_json::from_str(text)
        .map_err(|e| format!("the body is not an AdmissionReview: {e}"))?;
    let raw = envelope.request()?;
    let skip = skip_for(&raw.kind);
    let pod = is_pod_kind(&raw.kind);
    let mut unreadable = None;
    let read_object = |raw: &RawValue| match pod {
        true => read_pod(raw.get()),
        false => crate::lenient::read_json(raw.get(), skip).map(|o| o.map(Object::Json)),
    };
    let mut read = |raw: Option<&RawValue>, what: &str| match raw.map(read_object).transpose() {
        Ok(object) => object.flatten(),
        Err(e) => {
            unreadable.get_or_insert(format!("{what}: {e}"));
            None
        }
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

/// A Pod's JSON read into its view, as one pass reads it. One the typed read
/// refuses (a field of the wrong shape, a field written twice) is read as JSON,
/// where a repeated key keeps its last value, as the apiserver reads it; its view
/// then says what berth cannot read, if anything.
fn read_pod(text: &str) -> serde_json::Result<Option<Object>> {
    if let Ok(pod) = serde_json::from_str::<Option<ReadPod>>(text) {
        return Ok(pod.map(|ReadPod(pod)| Object::Pod(pod)));
    }
    let json = crate::lenient::read_json(text, Skip::PodContainerDetail)?;
    Ok(json.map(|json| Object::Pod(Box::new(PodObject::read(&json)))))
}

/// Sets a field once: a second one is a surprise.
fn once<T, E: Error>(field: &mut Option<T>, value: T, name: &'static str) -> Result<(), E> {
    match field.replace(value) {
        None => Ok(()),
        Some(_) => Err(E::duplicate_field(name)),
    }
}

/// A string, counted on the meter.
fn metered_string<'de, A: MapAccess<'de>>(map: &mut A, meter: &Meter) -> Result<String, A::Error> {
    let text = map.next_value::<String>()?;
    meter.charge_text(text.len())?;
    Ok(text)
}

/// An optional string (`null` is none), counted on the meter.
fn metered_option<'de, A: MapAccess<'de>>(
    map: &mut A,
    meter: &Meter,
) -> Result<Option<String>, A::Error> {
    let text = map.next_value::<Option<String>>()?;
    meter.charge_text(text.as_ref().map_or(0, String::len))?;
    Ok(text)
}

/// A review read in one pass, counted on the meter, its objects read leniently
/// where they stand: the apiserver writes `kind` before them, and says by it what
/// to skip. Any surprise is an error, and [`parse`] reads the body again in two
/// passes.
#[derive(Clone, Copy)]
struct OnePass<'m>(&'m Meter);

impl<'de> DeserializeSeed<'de> for OnePass<'_> {
    type Value = Envelope<AdmissionRequest>;

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<Self::Value, D::Error> {
        deserializer.deserialize_map(self)
    }
}

impl<'de> Visitor<'de> for OnePass<'_> {
    type Value = Envelope<AdmissionRequest>;

    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("an AdmissionReview")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let (mut api_version, mut kind, mut request) = (None, None, None);
        while let Some(Key(key)) = map.next_key()? {
            match &*key {
                "apiVersion" => once(
                    &mut api_version,
                    metered_option(&mut map, self.0)?,
                    "apiVersion",
                )?,
                "kind" => once(&mut kind, metered_option(&mut map, self.0)?, "kind")?,
                "request" => {
                    let value = map.next_value_seed(OptionSeed(OnePassRequest(self.0)))?;
                    once(&mut request, value, "request")?;
                }
                _ => {
                    map.next_value::<IgnoredAny>()?;
                }
            }
        }
        Ok(Envelope {
            api_version: api_version.flatten(),
            kind: kind.flatten(),
            request: request.flatten(),
        })
    }
}

/// `request`, read in one pass (see [`OnePass`]).
#[derive(Clone, Copy)]
struct OnePassRequest<'m>(&'m Meter);

impl<'de> DeserializeSeed<'de> for OnePassRequest<'_> {
    type Value = AdmissionRequest;

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<Self::Value, D::Error> {
        deserializer.deserialize_map(self)
    }
}

impl<'de> Visitor<'de> for OnePassRequest<'_> {
    type Value = AdmissionRequest;

    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("an admission request")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<AdmissionRequest, A::Error> {
        let meter = self.0;
        let (mut uid, mut kind, mut sub_resource, mut operation) = (None, None, None, None);
        let (mut namespace, mut name, mut user_info, mut dry_run) = (None, None, None, None);
        let (mut object, mut old_object) = (None, None);
        while let Some(Key(key)) = map.next_key()? {
            match &*key {
                "uid" => once(&mut uid, metered_string(&mut map, meter)?, "uid")?,
                "kind" => {
                    let gvk = map.next_value::<GroupVersionKind>()?;
                    meter.charge_text(gvk.group.len() + gvk.version.len() + gvk.kind.len())?;
                    once(&mut kind, gvk, "kind")?;
                }
                "subResource" => once(
                    &mut sub_resource,
                    metered_option(&mut map, meter)?,
                    "subResource",
                )?,
                "operation" => once(
                    &mut operation,
                    metered_string(&mut map, meter)?,
                    "operation",
                )?,
                "namespace" => once(
                    &mut namespace,
                    metered_option(&mut map, meter)?,
                    "namespace",
                )?,
                "name" => once(&mut name, metered_option(&mut map, meter)?, "name")?,
                "userInfo" => {
                    let value = map.next_value_seed(UserInfoSeed(meter))?;
                    once(&mut user_info, value, "userInfo")?;
                }
                "dryRun" => once(&mut dry_run, map.next_value::<Option<bool>>()?, "dryRun")?,
                "object" | "oldObject" => {
                    let kind = kind
                        .as_ref()
                        .ok_or_else(|| A::Error::custom("an object before its kind"))?;
                    let value = if is_pod_kind(kind) {
                        map.next_value_seed(OptionSeed(PodSeed(meter)))?
                    } else {
                        let json = map.next_value_seed(LenientObject(skip_for(kind), meter))?;
                        json.map(Object::Json)
                    };
                    let (field, name) = match &*key {
                        "object" => (&mut object, "object"),
                        _ => (&mut old_object, "oldObject"),
                    };
                    once(field, value, name)?;
                }
                _ => {
                    map.next_value::<IgnoredAny>()?;
                }
            }
        }
        Ok(AdmissionRequest {
            uid: uid.ok_or_else(|| A::Error::missing_field("uid"))?,
            kind: kind.ok_or_else(|| A::Error::missing_field("kind"))?,
            sub_resource: sub_resource.flatten(),
            operation: operation.ok_or_else(|| A::Error::missing_field("operation"))?,
            namespace: namespace.flatten(),
            name: name.flatten(),
            user_info: user_info.unwrap_or_default(),
            dry_run: dry_run.flatten().unwrap_or(false),
            object: object.flatten(),
            old_object: old_object.flatten(),
            unreadable: None,
        })
    }
}

/// A Pod under review, read straight into its view ([`ReadPod`]), what it
/// allocates counted on the meter.
struct PodSeed<'m>(&'m Meter);

impl<'de> DeserializeSeed<'de> for PodSeed<'_> {
    type Value = Object;

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<Object, D::Error> {
        let ReadPod(pod) = self
            .0
            .charge_allocated(|| ReadPod::deserialize(deserializer))?;
        Ok(Object::Pod(pod))
    }
}

/// `request.userInfo`, as [`UserInfo`] reads it, each string counted on the meter.
#[derive(Clone, Copy)]
struct UserInfoSeed<'m>(&'m Meter);

impl<'de> DeserializeSeed<'de> for UserInfoSeed<'_> {
    type Value = UserInfo;

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<UserInfo, D::Error> {
        deserializer.deserialize_map(self)
    }
}

impl<'de> Visitor<'de> for UserInfoSeed<'_> {
    type Value = UserInfo;

    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("the requester's user info")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<UserInfo, A::Error> {
        let (mut username, mut groups) = (None, None);
        while let Some(Key(key)) = map.next_key()? {
            match &*key {
                "username" => once(&mut username, metered_string(&mut map, self.0)?, "username")?,
                "groups" => once(&mut groups, map.next_value_seed(Groups(self.0))?, "groups")?,
                _ => {
                    map.next_value::<IgnoredAny>()?;
                }
            }
        }
        Ok(UserInfo {
            username: username.unwrap_or_default(),
            groups: groups.unwrap_or_default(),
        })
    }
}

/// `userInfo.groups`, each counted on the meter.
struct Groups<'m>(&'m Meter);

impl<'de> DeserializeSeed<'de> for Groups<'_> {
    type Value = Vec<String>;

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<Vec<String>, D::Error> {
        deserializer.deserialize_seq(self)
    }
}

impl<'de> Visitor<'de> for Groups<'_> {
    type Value = Vec<String>;

    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("a list of groups")
    }

    fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> Result<Vec<String>, A::Error> {
        let mut groups = Vec::new();
        while let Some(group) = seq.next_element::<String>()? {
            self.0.charge_text(group.len())?;
            self.0.push(&mut groups, group)?;
        }
        Ok(groups)
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
    use super::*;
    use crate::admission::body::BodyLimits;

    fn review(object: &str) -> String {
        format!(
            r#"{{"kind":"AdmissionReview","apiVersion":"admission.k8s.io/v1","request":{{"uid":"u-1",
            "kind":{{"group":"","version":"v1","kind":"Pod"}},"operation":"CREATE",
            "userInfo":{{"username":"tenant","groups":["system:authenticated"]}},"object":{object}}}}}"#
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

    /// A pod one pass cannot read into its view is read as JSON, for its view to
    /// say why: of its spec, only what admission reads.
    #[test]
    fn a_pod_read_as_json_keeps_only_what_admission_reads_of_its_spec() {
        let text = deployment_pod().to_string();
        let object = crate::lenient::read_json(&text, Skip::PodContainerDetail)
            .unwrap()
            .unwrap();
        let whole = deployment_pod();
        for list in ["initContainers", "containers"] {
            let kept: Vec<&Value> = object["spec"][list].as_array().unwrap().iter().collect();
            let expected: Vec<Value> = whole["spec"][list]
                .as_array()
                .unwrap()
                .iter()
                .map(|c| json!({"name": c["name"], "image": c["image"], "resources": c["resources"]}))
                .collect();
            assert_eq!(kept, expected.iter().collect::<Vec<_>>(), "{list}");
        }
        // What admission reads or patches outside the containers is read as sent;
        // the rest of the spec not at all.
        for key in ["tolerations", "affinity"] {
            assert_eq!(object["spec"][key], whole["spec"][key], "{key}");
        }
        assert!(object["spec"].get("volumes").is_none());
        assert_eq!(object["metadata"], whole["metadata"]);
    }

    #[test]
    fn keys_written_with_escapes_are_read_as_what_they_spell() {
        let object = r#"{"kind":"Pod","spec":{"t\u006flerations":[],"v\u006flumes":[1],
            "containers":[{"n\u0061me":"c","im\u0061ge":"x","\u0065nv":[1]}]}}"#;
        let request = in_one(&review(object)).expect("read in one pass");
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
            // Read in one pass, and in two (as JSON, then into its view).
            for request in [
                in_one(&body).unwrap(),
                parse_in_two(body.as_bytes()).unwrap(),
            ] {
                let lean = request.object.unwrap().pod().cloned().unwrap();
                assert_eq!(build_patch(&lean, &grants), patch, "{whole}");
            }
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
        let request = parse(review(r#"{"kind":"Pod","spec":{"containers":["app"]}}"#).as_bytes());
        let why = request.unwrap().unreadable.unwrap();
        assert!(why.contains("expected a container"), "{why}");
        let request = parse(review(r#"{"kind":"Pod","spec":{"containers":{}}}"#).as_bytes());
        let why = request.unwrap().unreadable.unwrap();
        assert!(why.contains("expected a list of containers"), "{why}");
    }

    #[test]
    fn only_pods_lose_their_container_details() {
        let daemonset = json!({"kind": "DaemonSet", "spec": {"template": {"spec": {"containers": [
            {"name": "agent", "env": [{"name": "A", "value": "b"}]}]}}}});
        let body = review(&daemonset.to_string()).replace(
            r#"{"group":"","version":"v1","kind":"Pod"}"#,
            r#"{"group":"apps","version":"v1","kind":"DaemonSet"}"#,
        );
        let request = parse(body.as_bytes()).unwrap();
        assert_eq!(request.kind.kind, "DaemonSet");
        assert_eq!(request.object.unwrap().json(), Some(&daemonset));
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

    /// Reads `body` in one pass only: `None` when that pass gives up or the
    /// envelope is refused.
    fn in_one(body: &str) -> Option<AdmissionRequest> {
        read_within(body.as_bytes(), usize::MAX).ok()?.0.ok()
    }

    #[test]
    fn one_pass_and_two_read_every_review_alike() {
        let pod = deployment_pod().to_string();
        let request = |fields: &str| {
            format!(
                r#"{{"kind":"AdmissionReview","apiVersion":"admission.k8s.io/v1","request":{{{fields}}}}}"#
            )
        };
        let kind = r#""kind":{"group":"","version":"v1","kind":"Pod"}"#;
        let read_in_one = [
            review(&pod),
            review("null"),
            review(
                r#"{"kind":"Pod","status":{"phase":"Pending"},"spec":{"containers":[{"name":"c","env":[1]}]}}"#,
            ),
            // Deep in a field berth does not read: stepped over, as is all it
            // does not read of a pod.
            review(&format!(
                r#"{{"x":{}1{}}}"#,
                "[".repeat(126),
                "]".repeat(126)
            )),
            // Over a bound: read, to be refused for it.
            review(&format!(
                r#"{{"spec":{{"tolerations":[{}]}}}}"#,
                vec![r#"{"operator":"Exists"}"#; 200].join(",")
            )),
            request(&format!(
                r#""uid":"u",{kind},"subResource":null,"operation":"UPDATE","namespace":"n","name":"p",
                "dryRun":true,"extra":{{"a":[1,2]}},"object":{pod},"oldObject":{pod}"#
            )),
            request(&format!(
                r#""\u0075id":"u",{kind},"operation":"CREATE","namespace":null,"object":{{}}"#
            )),
            request(&format!(
                r#""uid":"u",{kind},"operation":"CREATE","userInfo":{{"username":"alice","uid":"1",
                "groups":["a","b"],"extra":{{"x":["y"]}}}}"#
            )),
            review(
                &json!({"kind": "DaemonSet", "spec": {"template": {"spec": {"containers": [
                {"name": "agent", "env": [{"name": "A", "value": "b"}]}]}}}})
                .to_string(),
            )
            .replace(
                r#""group":"","version":"v1","kind":"Pod""#,
                r#""group":"apps","version":"v1","kind":"DaemonSet""#,
            ),
        ];
        let read_in_two = [
            request(&format!(
                r#""uid":"u","object":{pod},{kind},"operation":"CREATE""#
            )),
            request(&format!(
                r#""uid":"u","uid":"v",{kind},"operation":"CREATE""#
            )),
            request(r#""uid":"u","operation":"CREATE""#),
            review(r#"{"kind":"Pod","spec":"not an object"}"#),
            review(r#"{"kind":"Pod","spec":{"containers":{"name":"c"}}}"#),
            // Deep where berth reads: its view cannot say what it is.
            review(&format!(
                r#"{{"metadata":{{"labels":{}1{}}}}}"#,
                "[".repeat(126),
                "]".repeat(126)
            )),
            review(&pod).replace("AdmissionReview", "Review"),
            request(&format!(r#"{kind},"operation":"CREATE""#)),
            request(&format!(
                r#""uid":"u",{kind},"operation":"CREATE","userInfo":{{"groups":null}}"#
            )),
            request(&format!(
                r#""uid":"u",{kind},"operation":"CREATE","userInfo":{{"username":"a","username":"b"}}"#
            )),
        ];
        for body in &read_in_one {
            let one = in_one(body).unwrap_or_else(|| panic!("one pass reads {body}"));
            let two = parse_in_two(body.as_bytes()).unwrap();
            assert_eq!(format!("{one:?}"), format!("{two:?}"), "{body}");
            assert_eq!(
                format!("{:?}", parse(body.as_bytes())),
                format!("{:?}", Ok::<_, String>(two))
            );
        }
        for body in &read_in_two {
            assert!(in_one(body).is_none(), "{body}");
            // Without an allowance, only its shape stops the one pass.
            let gave_up = read_within(body.as_bytes(), usize::MAX).err();
            assert_ne!(gave_up, Some(GaveUp::Allowance), "{body}");
            let two = format!("{:?}", parse_in_two(body.as_bytes()));
            assert_eq!(format!("{:?}", parse(body.as_bytes())), two, "{body}");
            // Told that one pass gave up on its shape, the read goes to two.
            let after = parse_after(body.as_bytes(), Some(GaveUp::Shape));
            assert_eq!(format!("{after:?}"), two, "{body}");
        }
    }

    #[test]
    fn a_body_that_is_not_utf8_is_refused_wherever_the_byte_is() {
        // JSON is UTF-8; the one pass checks it once rather than per string, and
        // the two passes check it first: a stray byte in a string berth skips (in
        // the object or in the envelope) is refused as one in a string it reads.
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
            assert_eq!(read_within(&body, usize::MAX).err(), Some(GaveUp::Shape));
            let why = parse(&body).unwrap_err();
            assert!(why.contains("not UTF-8"), "{why}");
        }
    }

    /// A pod's view is counted once it is read: whatever shape a small review
    /// takes, what the read allocates before the count stays a small multiple of
    /// its bytes (what the contract states), so that one read per async worker
    /// at a time can overshoot the free allowance only so far. The worst is a list
    /// of empty strings one past a power of two: each string's slot, and the
    /// list's growth by doubling.
    #[test]
    fn what_a_pod_view_allocates_is_a_small_multiple_of_its_bytes() {
        let many = |item: &str, n: usize| vec![item; n].join(",");
        let keys = |n: usize| {
            let members: Vec<String> = (0..n).map(|i| format!(r#""{i:x}":"""#)).collect();
            members.join(",")
        };
        let nested = |n| format!("[{}]", many(r#"{"a":[1]}"#, n));
        let shapes = [
            format!(
                r#"{{"spec":{{"affinity":{{"nodeAffinity":{{"requiredDuringSchedulingIgnoredDuringExecution":
                {{"nodeSelectorTerms":[{{"matchExpressions":[{{"key":"k","operator":"In","values":[{}]}}]}}]}}}}}}}}}}"#,
                many(r#""""#, 16_385)
            ),
            format!(
                r#"{{"spec":{{"affinity":{{"nodeAffinity":{{"requiredDuringSchedulingIgnoredDuringExecution":
                {{"nodeSelectorTerms":[{{"matchExpressions":[{}]}}]}}}}}}}}}}"#,
                many(r#"{"key":"","operator":""}"#, 2_049)
            ),
            format!(r#"{{"spec":{{"nodeSelector":{{{}}}}}}}"#, keys(5_000)),
            format!(r#"{{"metadata":{{"labels":{{{}}}}}}}"#, keys(5_000)),
            format!(r#"{{"spec":{{"tolerations":[{}]}}}}"#, many("{}", 20_000)),
            format!(r#"{{"spec":{{"containers":[{}]}}}}"#, many("{}", 20_000)),
            format!(
                r#"{{"metadata":{{"ownerReferences":[{}]}}}}"#,
                many("{}", 20_000)
            ),
            format!(
                r#"{{"spec":{{"containers":[{{"resources":{{"requests":{{"cpu":{}}}}}}}],"priority":{}}}}}"#,
                nested(2_500),
                nested(2_500)
            ),
            format!(
                r#"{{"spec":{{"schedulingGates":[{}]}}}}"#,
                many("{}", 20_000)
            ),
        ];
        for object in shapes {
            let body = review(&object);
            assert!(BodyLimits::is_small(body.len()), "{} bytes", body.len());
            let (request, built) = read_within(body.as_bytes(), usize::MAX).unwrap();
            assert!(request.unwrap().object.unwrap().pod().is_some());
            assert!(
                built <= 36 * body.len(),
                "{built} bytes built of {}: {}",
                body.len(),
                &object[..80]
            );
        }
        // Only a sender other than the apiserver (which writes every requirement's
        // key and operator out) can send requirements left empty: the worst shape
        // of all, bounded too.
        let empty = format!(
            r#"{{"spec":{{"affinity":{{"nodeAffinity":{{"requiredDuringSchedulingIgnoredDuringExecution":
            {{"nodeSelectorTerms":[{{"matchExpressions":[{}]}}]}}}}}}}}}}"#,
            many("{}", 16_385)
        );
        let body = review(&empty);
        let (_, built) = read_within(body.as_bytes(), usize::MAX).unwrap();
        assert!(built <= 128 * body.len(), "{built} of {}", body.len());
    }

    #[test]
    fn a_read_stops_once_it_would_build_more_than_it_may() {
        let body = review(&deployment_pod().to_string());
        let (request, built) = read_within(body.as_bytes(), usize::MAX).unwrap();
        assert!(request.is_ok());
        assert!(read_within(body.as_bytes(), built).is_ok());
        assert_eq!(
            read_within(body.as_bytes(), built - 1).err(),
            Some(GaveUp::Allowance)
        );
        // The walk that costs a review before it is read counts at least as much:
        // what the walk would let through free, the read does too.
        assert!(built <= crate::admission::cost::parse_cost(body.as_bytes()));
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
