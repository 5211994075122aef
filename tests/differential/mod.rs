//! The differential tests' parts: the oracle process, the world generator, and
//! the contract's expectations.

pub mod expect;
pub mod oracle;
pub mod world;
