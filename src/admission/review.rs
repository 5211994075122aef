//! `admission.k8s.io/v1` AdmissionReview, read and written by hand.
//!
//! The object stays raw JSON (`serde_json::Value`): patches are computed against
//! exactly what the apiserver sent, so fields unknown to the compiled Kubernetes
//! types survive. It is read leniently: `metadata.managedFields` (free-form, any
//! depth, timestamps a user may set out of any range), `status` and, in a pod, its
//! containers' details (env, probes, mounts: never read, never patched) are
//! skipped without being parsed, and the object is read apart from the envelope, so an
//! object berth cannot read still leaves the uid to answer with a denial. Every
//! answer is a 200 AdmissionReview echoing the request's uid; `patchType` is set
//! exactly when a patch is.

use base64::Engine;
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;
use serde_json::{Value, json};

use crate::objects::Skip;

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
    pub object: Option<Value>,
    pub old_object: Option<Value>,
    /// Why the object (or the old object) could not be read; berth then refuses.
    pub unreadable: Option<String>,
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

/// Reads a request body; the error is the reason for a 400.
pub fn parse(body: &[u8]) -> Result<AdmissionRequest, String> {
    let envelope: Envelope = serde_json::from_slice(body)
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
    // A pod's container details are neither read nor patched (see `Skip`).
    let skip = if raw.kind.group.is_empty() && raw.kind.kind == "Pod" {
        Skip::PodContainerDetail
    } else {
        Skip::Status
    };
    let mut unreadable = None;
    let read_object = |raw: &RawValue| crate::objects::read_json(raw.get(), skip);
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
#[derive(Debug, Clone, Serialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct AdmissionResponse {
    pub uid: String,
    pub allowed: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub status: Option<Value>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub patch: Option<String>,
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
    pub fn with_patch(mut self, patch: &json_patch::Patch) -> Self {
        if !patch.0.is_empty() {
            let bytes = serde_json::to_vec(patch).unwrap_or_default();
            self.patch = Some(base64::engine::general_purpose::STANDARD.encode(bytes));
            self.patch_type = Some("JSONPatch".into());
        }
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
        let object = request.object.unwrap();
        assert_eq!(object["spec"]["nodeName"], "node2");
        assert_eq!(object["metadata"], json!({"name": "p"}));
        assert!(object.get("status").is_none());
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

    #[test]
    fn a_pod_keeps_only_its_containers_names_images_and_resources() {
        let request = parse(review(&deployment_pod().to_string()).as_bytes()).expect("readable");
        let object = request.object.unwrap();
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
        // Everything outside the containers is read as sent.
        for key in ["volumes", "tolerations", "affinity"] {
            assert_eq!(object["spec"][key], whole["spec"][key], "{key}");
        }
        assert_eq!(object["metadata"], whole["metadata"]);
    }

    #[test]
    fn the_lean_pod_gets_the_patch_the_whole_pod_gets() {
        use crate::placement::grants::Grants;
        use crate::placement::patch::build_patch;
        use k8s_openapi::api::core::v1::{NodeSelectorRequirement, Toleration};

        let grants = Grants {
            tolerations: vec![Toleration {
                key: Some("berth.io/pool".into()),
                operator: Some("Equal".into()),
                value: Some("cdn".into()),
                effect: Some("NoSchedule".into()),
                ..Toleration::default()
            }],
            required: vec![NodeSelectorRequirement {
                key: "berth.io/pool".into(),
                operator: "In".into(),
                values: Some(vec!["cdn".into()]),
            }],
            scheduling_gates: vec!["berth.io/avoid".into()],
            applied: vec!["cdn".into()],
            ..Grants::default()
        };
        let whole = deployment_pod();
        let lean = parse(review(&whole.to_string()).as_bytes())
            .unwrap()
            .object
            .unwrap();
        let patch = build_patch(&whole, &grants);
        assert!(!patch.0.is_empty());
        assert_eq!(build_patch(&lean, &grants), patch);
        // And the patch applies to the whole pod as sent.
        let mut patched = whole.clone();
        json_patch::patch(&mut patched, &patch).expect("applies");
        assert_eq!(patched["spec"]["containers"], whole["spec"]["containers"]);
    }

    #[test]
    fn odd_container_lists_are_kept_null_or_refused_with_the_reason() {
        let request = parse(review(r#"{"kind":"Pod","spec":{"containers":null}}"#).as_bytes());
        assert_eq!(
            request.unwrap().object.unwrap()["spec"]["containers"],
            Value::Null
        );
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
        assert_eq!(request.object.unwrap(), daemonset);
    }

    #[test]
    fn an_object_too_deep_to_read_still_leaves_the_uid() {
        let deep = format!("{}1{}", "[".repeat(200), "]".repeat(200));
        let object = format!(r#"{{"kind":"Pod","spec":{{"x":{deep}}}}}"#);
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
    fn the_uid_is_found_in_a_cut_off_prefix() {
        let body = review(r#"{"kind":"Pod","spec":{"containers":[{"env":"<<<<"#);
        assert_eq!(uid_from_prefix(body.as_bytes()).as_deref(), Some("u-1"));
        let later = r#"{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","x":{"a":[1,"}",{"b":null}]},"request":{"kind":{"kind":"Pod"},"uid":"u-2","object":{"#;
        assert_eq!(uid_from_prefix(later.as_bytes()).as_deref(), Some("u-2"));
        assert_eq!(uid_from_prefix(br#"{"kind":"AdmissionReview","requ"#), None);
        assert_eq!(uid_from_prefix(b"not json"), None);
    }
}
