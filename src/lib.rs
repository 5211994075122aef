//! berth places Kubernetes pods on the right nodes with the unmodified default
//! scheduler: a mutating admission webhook rewrites pods from `PlacementPolicy`
//! objects and namespace annotations, and a controller keeps labels and taints on
//! Nodes so that kube-scheduler enforces the result.
#![cfg_attr(not(test), forbid(unsafe_code))]
// The unit tests' counting allocator (`admission::review`) is their one unsafe code.
#![cfg_attr(test, deny(unsafe_code))]

pub mod admission;
pub mod bounds;
pub mod certs;
pub mod cli;
pub mod cluster;
pub mod controller;
pub mod names;
pub mod objects;
pub mod placement;
pub mod policy;
pub mod quantity;
pub mod telemetry;

// A review allocates a few thousand small JSON nodes and frees them at once, on
// whichever worker thread: with glibc's malloc that was 40% of its CPU. jemalloc
// serves it from thread caches and keeps resident memory close to what is live
// (mimalloc was as fast, at twice the RSS). In the library, so the benches and
// tests measure the allocator the binary ships with. (berth's own unit tests wrap
// it to count what a review's read holds: `admission::review`'s tests.)
#[cfg(not(test))]
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

/// Lets jemalloc give freed memory back to the system from a thread of its own,
/// within seconds, rather than only when a thread next allocates: after a burst,
/// an idle berth returns what the burst took.
pub fn return_freed_memory_in_background() {
    if let Err(e) = tikv_jemalloc_ctl::background_thread::write(true) {
        tracing::warn!(error = %e, "jemalloc's background purge is not available");
    }
}
