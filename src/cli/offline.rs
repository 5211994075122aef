//! `berth mutate` and `berth explain`: the webhook's decision, offline. They run
//! exactly the code the webhook runs ([`decide`] and [`build_patch`]) on files.

use std::io::Write;
use std::path::PathBuf;

use clap::{Args, ValueEnum};
use serde_json::Value;

use super::input::{InputError, read_namespace, read_nodes, read_policies, read_subjects};
use super::workload::Subject;
use crate::names::POLICIES_ANNOTATION;
use crate::objects::NodeIndex;
use crate::placement::explain::explain;
use crate::placement::namespace::NamespaceInfo;
use crate::placement::{Decision, Input, Requester, build_patch, decide};
use crate::policy::PolicySet;

/// What both offline commands read.
#[derive(Debug, Args)]
pub struct PlacementFiles {
    /// Pods to admit: a YAML or JSON file, several documents allowed; `-` reads
    /// stdin. A Deployment, ReplicaSet, StatefulSet, DaemonSet, Job or CronJob
    /// stands for the pod its template makes.
    #[arg(short = 'f', long = "filename", value_name = "POD.yaml")]
    pub filename: PathBuf,
    /// A PlacementPolicy file, or a directory of .yaml/.yml/.json files.
    #[arg(long, value_name = "PATH")]
    pub policies: PathBuf,
    /// The pods' Namespace, with its berth annotations and labels. Without it, the
    /// namespace is taken to opt into every policy given.
    #[arg(long, value_name = "NS.yaml")]
    pub namespace: Option<PathBuf>,
    /// Nodes (YAML or JSON, several documents allowed), with their labels and
    /// taints as they are; berth's pool labels and taints are applied as the
    /// controller keeps them. The webhook knows the cluster's nodes: with them,
    /// `mutate` decides what needs them (which nodes a pool by nodeSelector claims,
    /// for a pod's nodeName and DaemonSet pods) as the webhook does, and `explain`
    /// also says which nodes each pod may land on.
    #[arg(long, value_name = "NODES.yaml")]
    pub nodes: Option<PathBuf>,
}

/// How `berth mutate` prints its result.
#[derive(Debug, Clone, Copy, Default, ValueEnum)]
pub enum Output {
    /// The mutated Pods as YAML documents.
    #[default]
    Yaml,
    /// The mutated Pod as JSON (an array when there are several).
    Json,
    /// The JSON Patch (an array of patches when there are several pods).
    Patch,
}

/// How an offline command ended.
pub enum Ending {
    Done,
    Denied,
}

/// One pod read from the input, decided.
struct Admitted {
    raw: Value,
    name: String,
    namespace: NamespaceInfo,
    decision: Decision,
    patch: json_patch::Patch,
}

struct Loaded {
    subjects: Vec<Subject>,
    policies: PolicySet,
    policy_names: Vec<String>,
    namespace: Option<NamespaceInfo>,
    nodes: Option<NodeIndex>,
}

fn load(files: &PlacementFiles) -> Result<Loaded, InputError> {
    let (policies, policy_names) = read_policies(&files.policies)?;
    let namespace = files.namespace.as_deref().map(read_namespace).transpose()?;
    let nodes = files.nodes.as_deref().map(read_nodes).transpose()?;
    let subjects = read_subjects(&files.filename)?;
    Ok(Loaded {
        subjects,
        policies,
        policy_names,
        namespace,
        nodes,
    })
}

/// The namespace a pod is admitted in: the one given, or one named after the pod's
/// `metadata.namespace` (else `default`) that opts into every policy loaded.
fn namespace_for(pod: &Value, loaded: &Loaded) -> NamespaceInfo {
    if let Some(namespace) = &loaded.namespace {
        return namespace.clone();
    }
    let name = pod
        .pointer("/metadata/namespace")
        .and_then(Value::as_str)
        .unwrap_or("default");
    let mut namespace = NamespaceInfo::new(name);
    namespace
        .annotations
        .insert(POLICIES_ANNOTATION.into(), loaded.policy_names.join(","));
    namespace
}

/// Offline there is no request to say who sends a pod: a pod whose controller
/// ownerReference is an `apps/v1` DaemonSet (a DaemonSet's own pods among them)
/// is taken to come from the DaemonSet controller, as it would in a cluster.
fn offline_requester(pod: &Value) -> Requester {
    let from_daemonset =
        crate::objects::PodObject::read(pod).is_ok_and(|p| p.daemonset_owner().is_some());
    if from_daemonset {
        Requester::DaemonSetController
    } else {
        Requester::Other
    }
}

fn admit_all(loaded: &Loaded) -> Vec<Admitted> {
    loaded
        .subjects
        .iter()
        .map(|subject| {
            let raw = &subject.pod;
            let namespace = namespace_for(raw, loaded);
            let input = Input {
                pod: raw,
                namespace: &namespace,
                policies: &loaded.policies,
                nodes: loaded.nodes.as_ref(),
                requester: offline_requester(raw),
                groups: Default::default(),
            };
            let decision = decide(&input);
            let patch = build_patch(raw, &decision.grants);
            Admitted {
                raw: raw.clone(),
                name: subject.title.clone(),
                namespace,
                decision,
                patch,
            }
        })
        .collect()
}

/// Warnings and denials on stderr; whether any pod was denied.
fn report(admitted: &[Admitted]) -> bool {
    let several = admitted.len() > 1;
    let mut denied = false;
    for pod in admitted {
        let prefix = if several {
            format!("pod {}: ", pod.name)
        } else {
            String::new()
        };
        for warning in &pod.decision.warnings {
            eprintln!("warning: {prefix}{warning}");
        }
        if let Some(reason) = &pod.decision.denial {
            eprintln!("denied: {prefix}{reason}");
            denied = true;
        }
    }
    denied
}

/// `berth mutate`.
pub fn mutate(files: &PlacementFiles, output: Output) -> Result<Ending, InputError> {
    let loaded = load(files)?;
    let admitted = admit_all(&loaded);
    let denied = report(&admitted);
    // A denied pod would not be created, so it is not printed.
    let allowed: Vec<&Admitted> = admitted
        .iter()
        .filter(|a| a.decision.denial.is_none())
        .collect();
    let mutated = |a: &Admitted| -> Value {
        let mut pod = a.raw.clone();
        // The patch was built against this very document; it always applies.
        let _ = json_patch::patch(&mut pod, &a.patch);
        pod
    };
    let text = match output {
        Output::Yaml => allowed
            .iter()
            .map(|a| serde_yaml_ng::to_string(&mutated(a)).unwrap_or_default())
            .collect::<Vec<_>>()
            .join("---\n"),
        Output::Json => json_text(
            allowed.iter().map(|a| mutated(a)).collect(),
            admitted.len() > 1,
        ),
        Output::Patch => json_text(
            allowed
                .iter()
                .map(|a| serde_json::to_value(&a.patch).unwrap_or(Value::Null))
                .collect(),
            admitted.len() > 1,
        ),
    };
    print(&text);
    Ok(if denied { Ending::Denied } else { Ending::Done })
}

fn json_text(mut values: Vec<Value>, as_array: bool) -> String {
    let value = if as_array || values.len() != 1 {
        Value::Array(values)
    } else {
        values.remove(0)
    };
    let mut text = serde_json::to_string_pretty(&value).unwrap_or_default();
    text.push('\n');
    text
}

pub(super) fn print(text: &str) {
    // A closed pipe (`berth mutate ... | head`) is not an error worth a panic.
    let _ = std::io::stdout().lock().write_all(text.as_bytes());
}

/// `berth explain`.
pub fn explain_offline(files: &PlacementFiles) -> Result<Ending, InputError> {
    let loaded = load(files)?;
    let admitted = admit_all(&loaded);
    let texts: Vec<String> = admitted
        .iter()
        .map(|a| {
            let input = Input {
                pod: &a.raw,
                namespace: &a.namespace,
                policies: &loaded.policies,
                nodes: loaded.nodes.as_ref(),
                requester: offline_requester(&a.raw),
                groups: Default::default(),
            };
            explain(&input, &a.name, &a.decision, None)
        })
        .collect();
    print(&texts.join("\n"));
    let denied = admitted.iter().any(|a| a.decision.denial.is_some());
    Ok(if denied { Ending::Denied } else { Ending::Done })
}
