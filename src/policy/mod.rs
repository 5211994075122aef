//! Policy inputs: the `PlacementPolicy` resource, namespace annotations and image
//! patterns, each parsed with precise errors and compiled once for fast decisions.

pub mod annotations;
pub mod compile;
pub mod crd;
pub mod exempt;
pub mod groups;
pub mod image;
pub mod image_cel;
pub mod node_labels;
pub mod opt_in;

pub use annotations::{AnnotationError, NamespaceConfig};
pub use compile::{CompiledPolicy, PolicyError, PolicySet};
pub use crd::{PlacementPolicy, PlacementPolicySpec};
pub use image::{ImagePatterns, ImageRef};
pub use opt_in::OptIn;

/// A compiled set of policies named and specified as given, for tests; every one
/// must compile.
#[cfg(test)]
pub(crate) fn test_policies(specs: &[(&str, serde_json::Value)]) -> PolicySet {
    let list: Vec<PlacementPolicy> = specs
        .iter()
        .map(|(name, spec)| {
            serde_json::from_value(serde_json::json!({"apiVersion": "berth.io/v1alpha1",
                "kind": "PlacementPolicy", "metadata": {"name": name}, "spec": spec}))
            .expect("a PlacementPolicy")
        })
        .collect();
    let (set, errors) = PolicySet::compile(&list);
    assert!(errors.is_empty(), "{errors:?}");
    set
}
