//! The node controller: keeps berth's labels and taints on Nodes so the default
//! scheduler enforces pools and co-location, and releases pods held for exact
//! exclusion.

pub mod context;
pub mod daemonsets;
pub mod error;
pub mod events;
pub mod limit;
pub mod missed;
#[cfg(test)]
mod mock;
pub mod node_writer;
pub mod nodes;
pub mod podgroups;
pub mod policy_writer;
pub mod queues;
pub mod release;
pub mod releaser;
pub mod run;
pub mod static_placement;
pub mod status;
pub mod sweep;
pub mod webhook_path;
pub mod wishes;
pub mod writer;
pub mod writes;

pub use context::ControllerOptions;
pub use error::Error;
pub use run::run;
