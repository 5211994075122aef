//! Reading the files `berth mutate` and `berth explain` take: pods, policies,
//! a namespace and nodes, as YAML or JSON, several documents to a file, `-` for
//! stdin. Every problem becomes one line that names the file.

use std::io::Read;
use std::path::{Path, PathBuf};

use k8s_openapi::api::core::v1::{Namespace, Node};
use serde::Deserialize;
use serde::de::DeserializeOwned;
use serde_json::Value;

use super::workload::Subject;
use crate::objects::{NodeIndex, NodeInfo};
use crate::placement::namespace::NamespaceInfo;
use crate::policy::{PlacementPolicy, PolicySet};

/// Bad input: which file, and what is wrong with it.
#[derive(Debug, thiserror::Error)]
#[error("{file}: {problem}")]
pub struct InputError {
    pub file: String,
    pub problem: String,
}

impl InputError {
    pub fn new(file: &Path, problem: impl Into<String>) -> Self {
        InputError {
            file: display(file),
            problem: problem.into(),
        }
    }
}

fn display(path: &Path) -> String {
    if path == Path::new("-") {
        "<stdin>".into()
    } else {
        path.display().to_string()
    }
}

fn read_text(path: &Path) -> Result<String, InputError> {
    let mut text = String::new();
    let result = if path == Path::new("-") {
        std::io::stdin().read_to_string(&mut text).map(|_| ())
    } else {
        std::fs::read_to_string(path).map(|t| text = t)
    };
    result.map_err(|e| InputError::new(path, format!("cannot read: {e}")))?;
    Ok(text)
}

/// Every document in `text`, as JSON values; `kind: List` documents are expanded
/// into their items and empty documents skipped.
fn documents(path: &Path, text: &str) -> Result<Vec<Value>, InputError> {
    let mut out = Vec::new();
    for (i, document) in serde_yaml_ng::Deserializer::from_str(text).enumerate() {
        let value = Value::deserialize(document).map_err(|e| {
            InputError::new(path, format!("document {} is not valid YAML: {e}", i + 1))
        })?;
        match value {
            Value::Null => {}
            Value::Object(ref map) if map.get("kind").and_then(Value::as_str) == Some("List") => {
                let items = map.get("items").and_then(Value::as_array);
                out.extend(items.into_iter().flatten().cloned());
            }
            Value::Object(_) => out.push(value),
            _ => {
                return Err(InputError::new(
                    path,
                    format!("document {} is not an object", i + 1),
                ));
            }
        }
    }
    Ok(out)
}

/// Checks each document is of `kind` and converts it.
fn typed<T: DeserializeOwned>(
    path: &Path,
    docs: Vec<Value>,
    kind: &str,
) -> Result<Vec<T>, InputError> {
    docs.into_iter()
        .enumerate()
        .map(|(i, doc)| {
            let found = doc
                .get("kind")
                .and_then(Value::as_str)
                .unwrap_or("<no kind>");
            if found != kind {
                return Err(InputError::new(
                    path,
                    format!("document {} is a {found}, not a {kind}", i + 1),
                ));
            }
            T::deserialize(&doc).map_err(|e| {
                InputError::new(
                    path,
                    format!("document {} is not a valid {kind}: {e}", i + 1),
                )
            })
        })
        .collect()
}

/// What `path` holds to admit: Pods as written and the pods of workloads
/// ([`Subject`]), as the webhook would receive them.
pub fn read_subjects(path: &Path) -> Result<Vec<Subject>, InputError> {
    let docs = documents(path, &read_text(path)?)?;
    if docs.is_empty() {
        return Err(InputError::new(path, "holds no Pod or workload"));
    }
    docs.into_iter()
        .enumerate()
        .map(|(i, doc)| {
            Subject::from_document(doc)
                .map_err(|e| InputError::new(path, format!("document {} {e}", i + 1)))
        })
        .collect()
}

/// The policies in `path`, a file or a directory of `.yaml`, `.yml` and `.json`
/// files, compiled. Any policy that cannot be used is an error naming its file.
pub fn read_policies(path: &Path) -> Result<(PolicySet, Vec<String>), InputError> {
    let files: Vec<PathBuf> = if path.is_dir() {
        let entries = std::fs::read_dir(path)
            .map_err(|e| InputError::new(path, format!("cannot read directory: {e}")))?;
        let mut files: Vec<PathBuf> = entries
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| {
                p.extension()
                    .and_then(|e| e.to_str())
                    .is_some_and(|e| matches!(e, "yaml" | "yml" | "json"))
            })
            .collect();
        files.sort();
        files
    } else {
        vec![path.to_owned()]
    };
    let mut policies: Vec<(PathBuf, PlacementPolicy)> = Vec::new();
    for file in files {
        let docs = documents(&file, &read_text(&file)?)?;
        for policy in typed::<PlacementPolicy>(&file, docs, "PlacementPolicy")? {
            let name = policy.metadata.name.clone().unwrap_or_default();
            if let Some((other, _)) = policies
                .iter()
                .find(|(_, p)| p.metadata.name.as_deref() == Some(&name))
            {
                return Err(InputError::new(
                    &file,
                    format!("policy {name} is also defined in {}", other.display()),
                ));
            }
            policies.push((file.clone(), policy));
        }
    }
    let (set, errors) = PolicySet::compile(policies.iter().map(|(_, p)| p));
    if let Some(error) = errors.first() {
        let file = policies
            .iter()
            .find(|(_, p)| p.metadata.name.as_deref() == Some(&error.policy))
            .map(|(f, _)| f.clone())
            .unwrap_or_else(|| path.to_owned());
        return Err(InputError::new(&file, error.to_string()));
    }
    let names = policies
        .iter()
        .filter_map(|(_, p)| p.metadata.name.clone())
        .collect();
    Ok((set, names))
}

/// The one Namespace in `path`.
pub fn read_namespace(path: &Path) -> Result<NamespaceInfo, InputError> {
    let docs = documents(path, &read_text(path)?)?;
    let mut namespaces = typed::<Namespace>(path, docs, "Namespace")?;
    if namespaces.len() != 1 {
        return Err(InputError::new(
            path,
            format!("holds {} Namespaces; give exactly one", namespaces.len()),
        ));
    }
    let namespace = namespaces.remove(0);
    Ok(NamespaceInfo::from_namespace(&namespace))
}

/// The Nodes in `path`, by name.
pub fn read_nodes(path: &Path) -> Result<NodeIndex, InputError> {
    let docs = documents(path, &read_text(path)?)?;
    let nodes = typed::<Node>(path, docs, "Node")?;
    nodes
        .into_iter()
        .map(|node| {
            let name = node
                .metadata
                .name
                .clone()
                .ok_or_else(|| InputError::new(path, "a Node has no metadata.name"))?;
            Ok((name, NodeInfo::from_node(&node)))
        })
        .collect()
}
