//! The node controller: keeps berth's labels and taints on Nodes so the default
//! scheduler enforces pools and co-location, and releases pods held for exact
//! exclusion.

pub mod desired;
pub mod exclusion;
pub mod run;
pub mod writer;

pub use run::run;
