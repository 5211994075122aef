//! berth places Kubernetes pods on the right nodes with the unmodified default
//! scheduler: a mutating admission webhook rewrites pods from `PlacementPolicy`
//! objects and namespace annotations, and a controller keeps labels and taints on
//! Nodes so that kube-scheduler enforces the result.
#![forbid(unsafe_code)]

pub mod admission;
pub mod certs;
pub mod cli;
pub mod controller;
pub mod names;
pub mod objects;
pub mod placement;
pub mod policy;
pub mod quantity;
pub mod telemetry;
