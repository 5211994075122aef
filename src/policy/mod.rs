//! Policy inputs: the `PlacementPolicy` resource, namespace annotations and image
//! patterns, each parsed with precise errors and compiled once for fast decisions.

pub mod annotations;
pub mod compile;
pub mod crd;
pub mod groups;
pub mod image;
pub mod opt_in;

pub use annotations::{AnnotationError, NamespaceConfig};
pub use compile::{CompiledPolicy, PolicyError, PolicySet};
pub use crd::{PlacementPolicy, PlacementPolicySpec};
pub use image::{ImagePatterns, ImageRef};
pub use opt_in::{NamespaceOptIn, OptIn};
