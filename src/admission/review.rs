//! `admission.k8s.io/v1` AdmissionReview, read and written by hand.
//!
//! The object stays raw JSON (`serde_json::Value`): patches are computed against
//! exactly what the apiserver sent, so fields unknown to the compiled Kubernetes
//! types survive. Every answer is a 200 AdmissionReview echoing the request's uid;
//! `patchType` is set exactly when a patch is.

use base64::Engine;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

const API_VERSION: &str = "admission.k8s.io/v1";

/// What the apiserver asks about one object.
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AdmissionRequest {
    pub uid: String,
    pub kind: GroupVersionKind,
    #[serde(default)]
    pub sub_resource: Option<String>,
    pub operation: String,
    #[serde(default)]
    pub namespace: Option<String>,
    #[serde(default)]
    pub name: Option<String>,
    #[serde(default)]
    pub object: Option<Value>,
    #[serde(default)]
    pub old_object: Option<Value>,
    #[serde(default)]
    pub dry_run: Option<bool>,
}

#[derive(Debug, Clone, Deserialize, PartialEq, Eq)]
pub struct GroupVersionKind {
    #[serde(default)]
    pub group: String,
    pub version: String,
    pub kind: String,
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
struct Envelope {
    api_version: Option<String>,
    kind: Option<String>,
    request: Option<AdmissionRequest>,
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
    envelope
        .request
        .ok_or_else(|| "the AdmissionReview has no request".into())
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
        AdmissionResponse {
            uid: request.uid.clone(),
            allowed: true,
            status: None,
            patch: None,
            patch_type: None,
            warnings: Vec::new(),
        }
    }

    /// Refused with `reason`, which kubectl shows the user.
    pub fn deny(request: &AdmissionRequest, reason: &str) -> Self {
        AdmissionResponse {
            allowed: false,
            status: Some(json!({"code": 403, "reason": "Forbidden", "message": reason})),
            ..Self::allow(request)
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
    pub fn into_review(self) -> Value {
        json!({"apiVersion": API_VERSION, "kind": "AdmissionReview", "response": self})
    }
}
