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

mod read;

pub mod pod;

use std::marker::PhantomData;
use std::sync::Arc;

use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::{Namespace, Node, Taint};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::Resource;
use serde::Deserialize;
use serde_json::Value;

use crate::policy::compile::{Labels, PolicySource};
use crate::policy::{PlacementPolicy, PlacementPolicySpec};
pub use pod::PodObject;
use read::{lenient_meta, nullable, readable_quantities, stands_for};

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

#[derive(Debug, Clone, Default, Deserialize)]
pub struct NodeSpec {
    /// Each taint as the apiserver has it: berth writes back the ones it does not
    /// own exactly as they were (`timeAdded` included).
    #[serde(default, deserialize_with = "nullable")]
    pub taints: Vec<Value>,
}

stands_for!(NodeObject, Node, metadata_api: false,);

/// A Deployment or StatefulSet (`K`), as far as ordered start looks at it: desired
/// and Ready replicas, and its pod template (to tell which policy ranks it).
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
    /// Its pod template, read as a pod.
    #[serde(default, deserialize_with = "nullable")]
    pub template: PodObject,
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

/// A DaemonSet, as far as the controller brings its pod template in line: its
/// template, read as a pod.
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
    template: PodObject,
}

stands_for!(DaemonSetObject, DaemonSet, metadata_api: false,);

impl DaemonSetObject {
    /// Its pod template, as a pod.
    pub fn template(&self) -> &PodObject {
        &self.spec.template
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
        let template = daemonset.template();
        assert_eq!(
            serde_json::to_value(template.tolerations()).unwrap(),
            serde_json::json!([{"operator": "Exists"}])
        );
        assert!(template.required_affinity().is_none() && template.gate_list().is_none());
        assert!(template.metadata.annotations.is_none());
    }

    #[test]
    fn metadata_only_types_ask_for_metadata() {
        assert!(NodeMeta::metadata_api());
        assert!(!NodeObject::metadata_api());
        assert_eq!(NodeMeta::plural(&()), "nodes");
        assert_eq!(PolicyObject::group(&()), "berth.io");
    }
}
