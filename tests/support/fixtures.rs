//! Typed fixtures: the PlacementPolicies and pods the tests make, built in one
//! place instead of by a builder in every test file.
//!
//! A policy is berth's own [`PlacementPolicy`]: a spec that does not fit the CRD's
//! type fails here, naming the policy and serde's reason, rather than as an
//! apiserver error somewhere in a test's output. Policies meant to be malformed
//! (tests of the schema, of `berth`'s own errors) are not made here.

use berth::policy::{PlacementPolicy, PlacementPolicySpec};
use k8s_openapi::api::core::v1::Pod;
use serde_json::{Value, json};

use super::TestCluster;

/// The PlacementPolicy `name` with `spec` (its JSON form, as in the contract).
/// Panics, naming the policy and what does not fit, if `spec` is no valid spec
/// of berth's type.
pub fn policy(name: &str, spec: Value) -> PlacementPolicy {
    let typed: PlacementPolicySpec = serde_json::from_value(spec.clone())
        .unwrap_or_else(|e| panic!("PlacementPolicy {name}: the spec {spec} does not fit: {e}"));
    PlacementPolicy::new(name, typed)
}

impl TestCluster {
    /// `kubectl apply` of `policies`, in order (one List), which must succeed.
    pub fn apply_policies(&self, policies: &[PlacementPolicy]) {
        let list = json!({"apiVersion": "v1", "kind": "List", "items": policies});
        self.apply(&list.to_string());
    }
}

/// A pod under construction: named, with one container `c` running `nginx:1.27`
/// and nothing else until the test adds it. [`PodFixture::build`] makes the
/// typed pod, [`PodFixture::json`] the manifest (for kubectl, or a test that
/// changes it as JSON).
#[derive(Debug, Clone)]
#[must_use]
pub struct PodFixture(Value);

/// A pod named `name`; see [`PodFixture`].
pub fn pod(name: &str) -> PodFixture {
    PodFixture(
        json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
        "spec": {"containers": [{"name": "c", "image": "nginx:1.27"}]}}),
    )
}

/// `extra`'s fields set on the object `target`, each replacing the one there.
fn merge(target: &mut Value, extra: Value) {
    if let (Some(target), Value::Object(extra)) = (target.as_object_mut(), extra) {
        target.extend(extra);
    }
}

impl PodFixture {
    /// The container's image.
    pub fn image(mut self, image: &str) -> Self {
        self.container_mut()["image"] = json!(image);
        self
    }

    /// The container's name and image.
    pub fn container(mut self, name: &str, image: &str) -> Self {
        self.container_mut()["name"] = json!(name);
        self.image(image)
    }

    /// The container requests `cpu`.
    pub fn cpu(self, cpu: &str) -> Self {
        self.request("cpu", cpu)
    }

    /// The container requests `memory`.
    pub fn memory(self, memory: &str) -> Self {
        self.request("memory", memory)
    }

    /// The pod's labels (a JSON object), replacing any before.
    pub fn labels(mut self, labels: Value) -> Self {
        self.0["metadata"]["labels"] = labels;
        self
    }

    /// The pod's annotations (a JSON object), replacing any before.
    pub fn annotations(mut self, annotations: Value) -> Self {
        self.0["metadata"]["annotations"] = annotations;
        self
    }

    /// The pod's ownerReferences (a JSON array), replacing any before.
    pub fn owners(mut self, owners: Value) -> Self {
        self.0["metadata"]["ownerReferences"] = owners;
        self
    }

    /// `extra`'s fields (a JSON object) set in the pod's metadata.
    pub fn metadata(mut self, extra: Value) -> Self {
        merge(&mut self.0["metadata"], extra);
        self
    }

    /// `extra`'s fields (a JSON object) set in the pod's spec: `containers` there
    /// replaces the fixture's container.
    pub fn spec(mut self, extra: Value) -> Self {
        merge(&mut self.0["spec"], extra);
        self
    }

    /// The pod's manifest.
    pub fn json(self) -> Value {
        self.0
    }

    /// The pod as the template of a workload (a Deployment's, a DaemonSet's): its
    /// metadata without the name, and its spec.
    pub fn template(self) -> Value {
        let mut metadata = self.0["metadata"].clone();
        if let Some(metadata) = metadata.as_object_mut() {
            metadata.remove("name");
        }
        json!({"metadata": metadata, "spec": self.0["spec"]})
    }

    /// The typed pod.
    pub fn build(self) -> Pod {
        let name = self.0["metadata"]["name"].clone();
        serde_json::from_value(self.0).unwrap_or_else(|e| panic!("pod {name}: {e}"))
    }

    fn container_mut(&mut self) -> &mut Value {
        &mut self.0["spec"]["containers"][0]
    }

    fn request(mut self, resource: &str, quantity: &str) -> Self {
        self.container_mut()["resources"]["requests"][resource] = json!(quantity);
        self
    }
}
