//! The namespace of a pod as decisions read it, and the index of namespaces the
//! webhook and the controller keep.

use std::sync::OnceLock;

use k8s_openapi::api::core::v1::Namespace;

use crate::names::NAMESPACE_NAME_LABEL;
use crate::policy::compile::Labels;
use crate::policy::{AnnotationError, NamespaceConfig};

/// The namespace of the pod: its name, labels and annotations.
#[derive(Debug, Default)]
pub struct NamespaceInfo {
    pub name: String,
    pub labels: Labels,
    pub annotations: Labels,
    /// The berth annotations, read on first use and kept: the webhook's copy of a
    /// namespace lives until the namespace changes, so its image globs are compiled
    /// once per change rather than once per pod. Change the annotations before the
    /// first use, or on a clone.
    config: OnceLock<Result<NamespaceConfig, AnnotationError>>,
}

/// A copy reads its annotations again: it is made to be changed.
impl Clone for NamespaceInfo {
    fn clone(&self) -> Self {
        NamespaceInfo::with(&self.name, self.labels.clone(), self.annotations.clone())
    }
}

impl NamespaceInfo {
    /// A namespace with no annotations and only the name label the apiserver
    /// gives every namespace.
    pub fn new(name: &str) -> Self {
        let labels = Labels::from([(NAMESPACE_NAME_LABEL.to_owned(), name.to_owned())]);
        NamespaceInfo::with(name, labels, Labels::new())
    }

    /// A namespace with exactly these labels and annotations.
    pub fn with(name: &str, labels: Labels, annotations: Labels) -> Self {
        NamespaceInfo {
            name: name.to_owned(),
            labels,
            annotations,
            config: OnceLock::new(),
        }
    }

    pub fn from_namespace(namespace: &Namespace) -> Self {
        Self::from_meta(&namespace.metadata)
    }

    /// From a namespace's metadata, all berth reads of it. A namespace read from
    /// a file may lack the name label; the apiserver would have set it.
    pub fn from_meta(meta: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta) -> Self {
        let name = meta.name.clone().unwrap_or_default();
        let mut labels = meta.labels.clone().unwrap_or_default();
        labels
            .entry(NAMESPACE_NAME_LABEL.to_owned())
            .or_insert_with(|| name.clone());
        let annotations = meta.annotations.clone().unwrap_or_default();
        NamespaceInfo::with(&name, labels, annotations)
    }

    /// What its berth annotations say, or why they cannot be read.
    pub fn config(&self) -> Result<&NamespaceConfig, &AnnotationError> {
        self.config
            .get_or_init(|| NamespaceConfig::parse(&self.annotations))
            .as_ref()
    }

    /// Its berth annotations, or none when they cannot be read: what the
    /// controller trusts of a namespace whose annotations are broken.
    pub fn config_or_none(&self) -> &NamespaceConfig {
        static NONE: std::sync::LazyLock<NamespaceConfig> =
            std::sync::LazyLock::new(NamespaceConfig::default);
        self.config().unwrap_or(&NONE)
    }
}

/// Namespaces by name, as decisions read them. A persistent map, as
/// [`NodeIndex`](crate::objects::NodeIndex) is: a change costs O(log n), a
/// reader's snapshot a pointer.
pub type NamespaceIndex = imbl::OrdMap<String, std::sync::Arc<NamespaceInfo>>;

/// The index of these namespaces, each read as decisions read it
/// ([`NamespaceInfo::from_meta`]).
pub fn namespace_index<'a>(
    namespaces: impl IntoIterator<Item = &'a k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta>,
) -> NamespaceIndex {
    namespaces
        .into_iter()
        .map(|meta| {
            let info = NamespaceInfo::from_meta(meta);
            (info.name.clone(), std::sync::Arc::new(info))
        })
        .collect()
}

/// The namespaces as the controller asks of them: each namespace's berth
/// annotations are read once per change of the namespace (and kept in its
/// [`NamespaceInfo`]), not on every pass. Annotations that do not parse opt the
/// namespace into nothing by annotation; its labels may still be selected.
impl crate::policy::OptIn for NamespaceIndex {
    fn opts_in(&self, policy: &crate::policy::CompiledPolicy, namespace: &str) -> bool {
        self.get(namespace)
            .is_some_and(|ns| policy.namespace_opts_in(ns.config_or_none(), &ns.labels))
    }

    fn takes_daemonsets(&self, policy: &crate::policy::CompiledPolicy, namespace: &str) -> bool {
        self.get(namespace).is_some_and(|ns| {
            let opts_in = policy.namespace_opts_in(ns.config_or_none(), &ns.labels);
            policy.takes_daemonsets_from(&ns.labels, opts_in)
        })
    }

    fn named(&self, namespace: &str) -> &[String] {
        self.get(namespace)
            .map(|ns| ns.config_or_none().policies.as_slice())
            .unwrap_or_default()
    }
}
