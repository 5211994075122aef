//! Workloads as the webhook meets them. Users write Deployments, StatefulSets,
//! DaemonSets, Jobs, CronJobs and ReplicaSets, but the webhook only ever sees the
//! pods their controllers make. [`Subject::from_document`] turns a workload into
//! that pod: the template's metadata and spec, in the workload's namespace, with
//! the controller ownerReference and the labels its controller adds, so `berth
//! mutate` and `berth explain` answer "where will my Deployment's pods go, and
//! why?" before any pod exists.

use std::fmt;

use serde::Deserialize;
use serde::de::DeserializeOwned;
use serde_json::{Map, Value, json};

/// The kinds whose pods berth can show, and the `apiVersion` each is read at.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Deployment,
    ReplicaSet,
    StatefulSet,
    DaemonSet,
    Job,
    CronJob,
}

impl Kind {
    pub fn from_name(kind: &str) -> Option<Kind> {
        Some(match kind {
            "Deployment" => Kind::Deployment,
            "ReplicaSet" => Kind::ReplicaSet,
            "StatefulSet" => Kind::StatefulSet,
            "DaemonSet" => Kind::DaemonSet,
            "Job" => Kind::Job,
            "CronJob" => Kind::CronJob,
            _ => return None,
        })
    }

    pub fn name(self) -> &'static str {
        match self {
            Kind::Deployment => "Deployment",
            Kind::ReplicaSet => "ReplicaSet",
            Kind::StatefulSet => "StatefulSet",
            Kind::DaemonSet => "DaemonSet",
            Kind::Job => "Job",
            Kind::CronJob => "CronJob",
        }
    }

    fn api_version(self) -> &'static str {
        match self {
            Kind::Job | Kind::CronJob => "batch/v1",
            _ => "apps/v1",
        }
    }

    /// The kind of the pod's controller ownerReference: the object that makes it.
    fn pod_owner(self) -> Kind {
        match self {
            Kind::Deployment => Kind::ReplicaSet,
            Kind::CronJob => Kind::Job,
            other => other,
        }
    }

    /// Where objects of this kind in `namespace` are read from.
    pub fn url_path(self, namespace: &str) -> String {
        use k8s_openapi::api::{apps::v1 as apps, batch::v1 as batch};
        use kube::Resource;
        let namespace = Some(namespace);
        match self {
            Kind::Deployment => apps::Deployment::url_path(&(), namespace),
            Kind::ReplicaSet => apps::ReplicaSet::url_path(&(), namespace),
            Kind::StatefulSet => apps::StatefulSet::url_path(&(), namespace),
            Kind::DaemonSet => apps::DaemonSet::url_path(&(), namespace),
            Kind::Job => batch::Job::url_path(&(), namespace),
            Kind::CronJob => batch::CronJob::url_path(&(), namespace),
        }
    }

    /// Where the pod template sits in the object.
    fn template_pointer(self) -> &'static str {
        match self {
            Kind::CronJob => "/spec/jobTemplate/spec/template",
            _ => "/spec/template",
        }
    }

    /// Checks `doc` against the kind's schema, for a message naming the bad field
    /// rather than a pod that silently lacks it.
    fn validate(self, doc: &Value) -> Result<(), String> {
        use k8s_openapi::api::{apps::v1 as apps, batch::v1 as batch};
        fn check<T: DeserializeOwned>(doc: &Value) -> Result<(), String> {
            T::deserialize(doc).map(drop).map_err(|e| e.to_string())
        }
        match self {
            Kind::Deployment => check::<apps::Deployment>(doc),
            Kind::ReplicaSet => check::<apps::ReplicaSet>(doc),
            Kind::StatefulSet => check::<apps::StatefulSet>(doc),
            Kind::DaemonSet => check::<apps::DaemonSet>(doc),
            Kind::Job => check::<batch::Job>(doc),
            Kind::CronJob => check::<batch::CronJob>(doc),
        }
    }
}

impl fmt::Display for Kind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// What one document stands for at admission: a Pod as written, or the pod a
/// workload's controller makes from its template.
#[derive(Debug, Clone)]
pub struct Subject {
    /// The pod as the webhook receives it.
    pub pod: Value,
    /// How to name it to a person: the pod's name, or `web-* (Deployment web)`.
    pub title: String,
}

impl Subject {
    /// The subject of one document of kind Pod or one of the workload [`Kind`]s.
    pub fn from_document(doc: Value) -> Result<Subject, String> {
        let kind = doc
            .get("kind")
            .and_then(Value::as_str)
            .unwrap_or("<no kind>");
        if kind == "Pod" {
            k8s_openapi::api::core::v1::Pod::deserialize(&doc)
                .map_err(|e| format!("is not a valid Pod: {e}"))?;
            let title = pod_name(&doc);
            return Ok(Subject { pod: doc, title });
        }
        let kind = Kind::from_name(kind).ok_or_else(|| {
            format!(
                "is a {kind}; berth reads Pods and the pods of Deployments, ReplicaSets, \
                 StatefulSets, DaemonSets, Jobs and CronJobs"
            )
        })?;
        if doc.get("apiVersion").and_then(Value::as_str) != Some(kind.api_version()) {
            return Err(format!("is a {kind} but not {}", kind.api_version()));
        }
        kind.validate(&doc)
            .map_err(|e| format!("is not a valid {kind}: {e}"))?;
        template_pod(kind, &doc)
    }
}

/// A pod's name for people: `metadata.name`, else its `generateName` and a `*`.
fn pod_name(pod: &Value) -> String {
    if let Some(name) = pod.pointer("/metadata/name").and_then(Value::as_str) {
        return name.to_owned();
    }
    match pod
        .pointer("/metadata/generateName")
        .and_then(Value::as_str)
    {
        Some(prefix) => format!("{prefix}*"),
        None => "<unnamed>".into(),
    }
}

/// The tolerations the DaemonSet controller adds to every pod it makes, so that
/// node conditions never keep a DaemonSet off a node (and hostNetwork pods run
/// before the network is ready).
fn daemonset_tolerations(host_network: bool) -> Vec<Value> {
    let mut tolerations: Vec<Value> = [
        ("node.kubernetes.io/not-ready", "NoExecute"),
        ("node.kubernetes.io/unreachable", "NoExecute"),
        ("node.kubernetes.io/disk-pressure", "NoSchedule"),
        ("node.kubernetes.io/memory-pressure", "NoSchedule"),
        ("node.kubernetes.io/pid-pressure", "NoSchedule"),
        ("node.kubernetes.io/unschedulable", "NoSchedule"),
    ]
    .into_iter()
    .chain(host_network.then_some(("node.kubernetes.io/network-unavailable", "NoSchedule")))
    .map(|(key, effect)| json!({"key": key, "operator": "Exists", "effect": effect}))
    .collect();
    tolerations.dedup();
    tolerations
}

/// The pod `kind`'s controller makes from the template of `doc`. Names its
/// controller would make from hashes or schedules it cannot know offline end in
/// `-` (`generateName`); a Deployment's pod is owned by a ReplicaSet named after
/// the Deployment (berth reads an owner's kind, never its name).
fn template_pod(kind: Kind, doc: &Value) -> Result<Subject, String> {
    let name = doc
        .pointer("/metadata/name")
        .and_then(Value::as_str)
        .unwrap_or("<unnamed>")
        .to_owned();
    let template = doc
        .pointer(kind.template_pointer())
        .filter(|t| t.get("spec").is_some_and(Value::is_object))
        .cloned()
        .ok_or_else(|| {
            let field = kind.template_pointer()[1..].replace('/', ".");
            format!("is a {kind} with no pod template ({field}.spec)")
        })?;
    let template_meta = template.get("metadata").cloned().unwrap_or_default();
    let mut metadata = Map::new();
    if let Some(namespace) = doc.pointer("/metadata/namespace") {
        metadata.insert("namespace".into(), namespace.clone());
    }
    let mut labels = template_meta
        .get("labels")
        .and_then(Value::as_object)
        .cloned()
        .unwrap_or_default();
    if let Some(annotations) = template_meta.get("annotations") {
        metadata.insert("annotations".into(), annotations.clone());
    }
    match kind {
        Kind::StatefulSet => {
            // The first ordinal: the pod that starts first.
            let pod = format!("{name}-0");
            labels.insert("statefulset.kubernetes.io/pod-name".into(), json!(pod));
            labels.insert("apps.kubernetes.io/pod-index".into(), json!("0"));
            metadata.insert("name".into(), json!(pod));
        }
        Kind::Job => {
            for key in ["job-name", "batch.kubernetes.io/job-name"] {
                labels.entry(key).or_insert_with(|| json!(name));
            }
            metadata.insert("generateName".into(), json!(format!("{name}-")));
        }
        // A CronJob's Job is named after the schedule time, unknown here.
        _ => {
            metadata.insert("generateName".into(), json!(format!("{name}-")));
        }
    }
    if !labels.is_empty() {
        metadata.insert("labels".into(), Value::Object(labels));
    }
    let owner_kind = kind.pod_owner();
    let mut owner = json!({
        "apiVersion": owner_kind.api_version(),
        "kind": owner_kind.name(),
        "name": name,
        "controller": true,
        "blockOwnerDeletion": true,
    });
    // Read from the cluster, a workload that owns its pods itself has a uid:
    // keep it, so the pod is exactly what the webhook would see.
    if let Some(uid) = doc.pointer("/metadata/uid").filter(|_| owner_kind == kind) {
        owner["uid"] = uid.clone();
    }
    metadata.insert("ownerReferences".into(), json!([owner]));
    let mut spec = template["spec"].clone();
    if kind == Kind::DaemonSet {
        let host_network = spec.get("hostNetwork").and_then(Value::as_bool) == Some(true);
        let existing = spec
            .get("tolerations")
            .and_then(Value::as_array)
            .cloned()
            .unwrap_or_default();
        let mut tolerations = existing.clone();
        for toleration in daemonset_tolerations(host_network) {
            if !existing.contains(&toleration) {
                tolerations.push(toleration);
            }
        }
        spec["tolerations"] = Value::Array(tolerations);
    }
    let pod = json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": metadata,
        "spec": spec,
    });
    let title = format!("{} ({kind} {name})", pod_name(&pod));
    Ok(Subject { pod, title })
}
