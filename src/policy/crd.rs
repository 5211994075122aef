//! The `PlacementPolicy` custom resource (SPEC "PlacementPolicy").
//!
//! The schema validates what a schema can: enums, weight 1..100, a policy name of at
//! most 50 characters, at least one thing to grant, and no unknown fields. What a
//! schema cannot (glob syntax, conflicting pools) is checked by [`super::compile`].

use k8s_openapi::api::core::v1::NodeSelectorRequirement;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, LabelSelector};
use kube::{CustomResource, KubeSchema};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// Which pods get which placement.
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[kube(
    group = "berth.io",
    version = "v1alpha1",
    kind = "PlacementPolicy",
    plural = "placementpolicies",
    shortname = "bpp",
    status = "PlacementPolicyStatus",
    printcolumn = r#"{"name":"Nodes","type":"integer","jsonPath":".status.nodes"}"#,
    printcolumn = r#"{"name":"Dedicated","type":"boolean","jsonPath":".spec.pool.dedicated"}"#,
    printcolumn = r#"{"name":"Placement","type":"string","jsonPath":".spec.pool.placement"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#,
    validation = Rule::new("size(self.metadata.name) <= 50").message("policy names are at most 50 characters: they become part of node label keys")
)]
#[x_kube(
    validation = Rule::new("has(self.pool) || has(self.nodeAffinity) || has(self.colocateWith) || has(self.avoid) || has(self.schedulerName) || has(self.gang) || has(self.startOrder) || has(self.queue)").message("a policy must grant something: pool, nodeAffinity, colocateWith, avoid, schedulerName, gang, startOrder or queue")
)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct PlacementPolicySpec {
    /// Namespaces whose labels match opt in, besides those that name the policy in
    /// their `berth.io/policies` annotation. As everywhere in Kubernetes, an empty
    /// selector (`{}`) matches every namespace.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace_selector: Option<LabelSelector>,
    /// Globs on the normalised image reference (`docker.io/library/nginx:latest`) of
    /// any container or init container. Empty: every pod.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub images: Vec<String>,
    /// Only pods whose labels match. Absent: every pod.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod_selector: Option<LabelSelector>,
    /// Pods whose labels match are routed by this policy whatever their images and
    /// podSelector: a group a controller ties together with required pod affinity
    /// (Tekton's affinity assistant and the task pods of a PipelineRun, which all
    /// carry the PipelineRun's and its Pipeline's labels) goes to the pool as one,
    /// so the pods a member must sit beside are there too. Absent: none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub coscheduled: Option<LabelSelector>,
    /// A set of nodes this policy owns.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pool: Option<Pool>,
    /// Extra node requirements, for example a GPU product or an NVMe class.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_affinity: Option<ExtraNodeAffinity>,
    /// Pods must share a node with a pod matching this selector.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub colocate_with: Option<LabelSelector>,
    /// Pods must not share a node with a pod matching this selector.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub avoid: Option<LabelSelector>,
    /// Where `colocateWith`/`avoid` pods are looked for.
    #[serde(default, skip_serializing_if = "is_default")]
    pub anchor_namespaces: AnchorNamespaces,
    /// The scheduler that places matching pods.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scheduler_name: Option<String>,
    /// All-or-nothing: the pods of one group are placed together or not at all.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gang: Option<Gang>,
    /// Ordered start: rank k is scheduled once every lower rank is Ready.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub start_order: Option<StartOrder>,
    /// Queue order: a higher priority label is scheduled first, never preempting.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub queue: Option<Queue>,
    /// Pods this policy applies to that lack its decision (admitted while berth's
    /// webhook was unreachable, or older than the policy or the namespace's
    /// opt-in): `Report` them, or also `Evict` those a ReplicaSet or StatefulSet
    /// recreates, so that their replacements come through the webhook.
    #[serde(default, skip_serializing_if = "is_default")]
    pub on_missed: OnMissed,
}

/// What berth does with the pods a policy missed.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum OnMissed {
    /// Status condition `MissedPods`, a Warning Event on each pod, a metric.
    #[default]
    Report,
    /// Report, and evict the pods a ReplicaSet or StatefulSet recreates (through
    /// the Eviction API, so PodDisruptionBudgets hold), once one replacement has
    /// come back with the policy's decision.
    Evict,
}

/// All-or-nothing placement of pod groups (seed 003's `podGroup`/`minAvailable`).
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Gang {
    /// Pods with one value of this label form a group.
    #[serde(default = "default_group_label")]
    #[schemars(default = "default_group_label")]
    pub group_label: String,
    /// The group's size: an integer label on its pods.
    #[serde(default = "default_min_available_label")]
    #[schemars(default = "default_min_available_label")]
    pub min_available_label: String,
    /// A group not placed by then gets an Event and the policy a condition; its
    /// members stay held.
    #[serde(default = "default_gang_timeout")]
    #[schemars(range(min = 1, max = 31536000), default = "default_gang_timeout")]
    pub timeout_seconds: i64,
}

impl Default for Gang {
    fn default() -> Self {
        Gang {
            group_label: default_group_label(),
            min_available_label: default_min_available_label(),
            timeout_seconds: default_gang_timeout(),
        }
    }
}

/// Ranked start (seed 002's change groups).
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct StartOrder {
    /// An integer label: rank k starts after every lower rank is Ready.
    #[serde(default = "default_rank_label")]
    #[schemars(default = "default_rank_label")]
    pub rank_label: String,
}

impl Default for StartOrder {
    fn default() -> Self {
        StartOrder {
            rank_label: default_rank_label(),
        }
    }
}

/// Queue order (seed 003's `groupPriority` QueueSort).
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Queue {
    /// An integer label, 0 or more: higher is scheduled first.
    #[serde(default = "default_priority_label")]
    #[schemars(default = "default_priority_label")]
    pub priority_label: String,
    /// Among equal priorities: Guaranteed, then Burstable, then BestEffort.
    #[serde(default = "default_true")]
    #[schemars(default = "default_true")]
    pub qos_tie_break: bool,
    /// The highest priority label value that counts; a higher one counts as this.
    /// The controller keeps a PriorityClass for every value up to it, so it also
    /// bounds how far above other pods this policy's pods can be queued.
    #[serde(default = "default_max_priority")]
    #[schemars(default = "default_max_priority", range(min = 0, max = 100))]
    pub max_priority: i32,
}

impl Default for Queue {
    fn default() -> Self {
        Queue {
            priority_label: default_priority_label(),
            qos_tie_break: true,
            max_priority: default_max_priority(),
        }
    }
}

fn default_max_priority() -> i32 {
    10
}

/// A set of nodes a policy owns.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Pool {
    /// Nodes whose labels match are in the pool.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_selector: Option<LabelSelector>,
    /// Nodes named here are in the pool.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub node_names: Vec<String>,
    /// Taint pool nodes so that pods not entitled stay off.
    #[serde(default = "default_true")]
    #[schemars(default = "default_true")]
    pub dedicated: bool,
    /// The taint effect; `NoExecute` also evicts pods that got there around admission.
    #[serde(default)]
    pub effect: PoolEffect,
    /// Whether entitled pods must (`Required`) or should (`Preferred`) use the pool.
    #[serde(default)]
    pub placement: Placement,
    /// Weight of the preference when `placement` is `Preferred`.
    #[serde(default = "default_weight")]
    #[schemars(range(min = 1, max = 100), default = "default_weight")]
    pub weight: i32,
    /// Whether DaemonSet pods may run on pool nodes.
    #[serde(default)]
    pub daemon_sets: DaemonSets,
    /// With `daemonSets: Tolerate`, only DaemonSets in namespaces whose labels match
    /// may run on pool nodes. Absent: kube-system's and those of the namespaces that
    /// opt into the policy.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub daemon_set_namespaces: Option<LabelSelector>,
    /// Whether `nodeSelector` may take a node in through labels the node can set
    /// on its own Node (under NodeRestriction, keys outside `kubernetes.io` and
    /// `k8s.io`, such as `nvidia.com/gpu.product`, and the kubelet's own there).
    /// `false`: a selector that reads such a label keeps the nodes already in the
    /// pool while they match, and takes no other, so a compromised node cannot
    /// make itself a member.
    #[serde(default)]
    #[schemars(default = "default_false")]
    pub trust_self_set_labels: bool,
}

impl Default for Pool {
    fn default() -> Self {
        Pool {
            node_selector: None,
            node_names: Vec::new(),
            dedicated: true,
            effect: PoolEffect::default(),
            placement: Placement::default(),
            weight: default_weight(),
            daemon_sets: DaemonSets::default(),
            daemon_set_namespaces: None,
            trust_self_set_labels: false,
        }
    }
}

/// Taint effect of a dedicated pool.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum PoolEffect {
    #[default]
    NoSchedule,
    NoExecute,
}

impl PoolEffect {
    pub fn as_str(self) -> &'static str {
        match self {
            PoolEffect::NoSchedule => "NoSchedule",
            PoolEffect::NoExecute => "NoExecute",
        }
    }
}

/// Whether entitled pods must or should land in the pool.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Placement {
    #[default]
    Required,
    Preferred,
}

/// What DaemonSet pods get on a dedicated pool.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum DaemonSets {
    /// DaemonSet pods get the pool toleration and may run on pool nodes.
    #[default]
    Tolerate,
    /// DaemonSet pods get nothing and stay off pool nodes.
    Exclude,
}

/// Where the pods named by `colocateWith` and `avoid` are looked for.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum AnchorNamespaces {
    /// In the namespaces that opt into the policy (the anchor label on nodes is
    /// per policy, not per namespace).
    #[default]
    Same,
    /// In every namespace.
    All,
}

/// Extra node requirements of a policy.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ExtraNodeAffinity {
    /// ANDed into every required node selector term of the pod.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub required: Vec<NodeSelectorRequirement>,
    /// Appended to the pod's preferred terms.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub preferred: Vec<WeightedRequirement>,
}

/// One preferred node requirement with its weight.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct WeightedRequirement {
    #[schemars(range(min = 1, max = 100))]
    pub weight: i32,
    pub preference: NodeSelectorRequirement,
}

/// What the controller reports about a policy.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct PlacementPolicyStatus {
    /// Nodes in the pool now.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nodes: Option<i32>,
    /// The names of the pool's nodes now, sorted. The ValidatingAdmissionPolicy reads
    /// them (it cannot see Node labels) to refuse `spec.nodeName` on a pool node.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub node_names: Vec<String>,
    /// The last spec that compiled, written by the controller: a policy that stops
    /// compiling keeps it in force, also in a berth that starts afresh.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_good_spec: Option<PlacementPolicySpec>,
    /// How `gang` is enforced in this cluster, found by API discovery: `PodGroup`
    /// (kube-scheduler's own gang scheduling) or `Gate` (berth holds and releases).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gang_mode: Option<String>,
    /// `Ready` (False while the spec does not compile; the last good version stays
    /// in force); `Conflict` when a node is claimed by two pools (the older one wins);
    /// `UnentitledPods`; `MissedPods` (pods that lack this policy's decision);
    /// `SelfSetLabels` (the pool's nodeSelector reads labels a node can set on
    /// itself, and the nodes it refuses); `GangTimeout` (groups not placed within
    /// `timeoutSeconds`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
}

fn default_true() -> bool {
    true
}

fn default_false() -> bool {
    false
}

fn default_weight() -> i32 {
    50
}

fn default_group_label() -> String {
    "podGroup".into()
}

fn default_min_available_label() -> String {
    "minAvailable".into()
}

fn default_gang_timeout() -> i64 {
    600
}

fn default_rank_label() -> String {
    "berth.io/rank".into()
}

fn default_priority_label() -> String {
    "groupPriority".into()
}

fn is_default<T: Default + PartialEq>(value: &T) -> bool {
    *value == T::default()
}

/// The CustomResourceDefinition generated from these types, as YAML; what
/// `berth crd` prints and `manifests/crd.yaml` holds.
pub fn crd_yaml() -> String {
    use kube::CustomResourceExt;
    serde_yaml_ng::to_string(&PlacementPolicy::crd()).expect("a CRD always serialises to YAML")
}
