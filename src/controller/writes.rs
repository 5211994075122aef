//! Every write the controller makes passes through [`Writes::make`]:
//!
//! - each kind of write has its own rate limit (bursts of two seconds' worth):
//!   node writes at `--node-qps`, every other kind at `--controller-qps`, so a new
//!   pool over a thousand nodes never delays a release, and a burst of releases
//!   never delays a node;
//! - the Lease is checked before each write (after its turn), not once per pass: a
//!   replica that lost it mid-pass makes no further write;
//! - each call is bounded by [`WRITE_TIMEOUT`], so one stuck connection cannot
//!   hold a loop;
//! - each is counted by kind and outcome (`berth_controller_writes_total`) with
//!   its latency (`berth_controller_write_seconds`), so the alert on the failure
//!   rate sees a loop whose every write fails, which the stall alert cannot.
//!
//! A failed write is logged by its caller, which knows what it was for. What
//! comes after it is [`Error::retry`]'s to say, for every kind (the one retry
//! policy, in [`super::error`]): a writer task hands the object back to its loop,
//! and a loop that writes itself looks at [`Writes::failures`] of the kinds it
//! writes after a pass to schedule the retry.

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use tokio::sync::watch;

use super::error::Error;
use super::error::Retry;
use super::limit::RateLimit;
use crate::telemetry::{KindLabels, Metrics, WriteLabels};

/// The longest a single write may take.
pub const WRITE_TIMEOUT: Duration = Duration::from_secs(10);

/// What a write is for: the `kind` label of its metrics.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(usize)]
pub enum Kind {
    /// A node's berth labels and taints (and the read after a conflict).
    Node,
    /// A policy's finalizer, added or removed.
    Finalizer,
    /// A policy's status.
    PolicyStatus,
    /// A DaemonSet template brought in line with the pools.
    DaemonSet,
    /// A held pod's gate removed (and its affinity narrowed).
    Release,
    /// A pod evicted: missed by its policies, or blocking those behind it.
    Eviction,
    /// A gang's PodGroup made, changed or deleted.
    PodGroup,
    /// A `berth-queue-` PriorityClass made.
    PriorityClass,
    /// An object berth made and no longer needs, deleted.
    Sweep,
    /// `StaticPlacement/berth`, the params of the admission policies that place
    /// pods with berth down.
    StaticPlacement,
}

/// How many kinds there are: one rate limit and one failure count each, indexed
/// by `kind as usize`.
const KINDS: usize = Kind::StaticPlacement as usize + 1;

impl Kind {
    pub fn as_str(self) -> &'static str {
        match self {
            Kind::Node => "node",
            Kind::Finalizer => "finalizer",
            Kind::PolicyStatus => "policy_status",
            Kind::DaemonSet => "daemonset",
            Kind::Release => "release",
            Kind::Eviction => "eviction",
            Kind::PodGroup => "pod_group",
            Kind::PriorityClass => "priority_class",
            Kind::Sweep => "sweep",
            Kind::StaticPlacement => "static_placement",
        }
    }
}

/// Writes a second on average, by kind.
#[derive(Debug, Clone, Copy)]
pub struct Rates {
    /// Node label and taint writes: a pool's nodes are written in one pass, and
    /// until each carries the pool's taint, other pods may still land on it.
    pub nodes: u32,
    /// Each other kind.
    pub others: u32,
}

impl Rates {
    /// The same rate for every kind.
    pub const fn all(per_second: u32) -> Rates {
        Rates {
            nodes: per_second,
            others: per_second,
        }
    }
}

/// The one way the controller writes to the apiserver; cheap to clone.
#[derive(Clone)]
pub struct Writes {
    metrics: Arc<Metrics>,
    leading: watch::Receiver<bool>,
    /// Failed writes so far, by kind.
    failures: Arc<[AtomicU64; KINDS]>,
    limits: Arc<[RateLimit; KINDS]>,
}

impl Writes {
    /// Writes of each kind at its rate in `rates`.
    pub fn new(metrics: Arc<Metrics>, leading: watch::Receiver<bool>, rates: Rates) -> Writes {
        let rate = |kind| {
            if kind == Kind::Node as usize {
                rates.nodes
            } else {
                rates.others
            }
        };
        Writes {
            metrics,
            leading,
            failures: Arc::default(),
            limits: Arc::new(std::array::from_fn(|kind| RateLimit::new(rate(kind)))),
        }
    }

    /// Makes the write `call` of `kind` if this replica leads; see the module.
    /// Each write is a span of its own (inside the pass or the writer that asked
    /// for it), ending with its outcome at debug level.
    #[tracing::instrument(name = "write", skip_all, fields(kind = kind.as_str()))]
    pub async fn make<T>(
        &self,
        kind: Kind,
        call: impl Future<Output = kube::Result<T>>,
    ) -> Result<T, Error> {
        self.limits[kind as usize].acquire().await;
        let result = if *self.leading.borrow() {
            let started = Instant::now();
            let result = match tokio::time::timeout(WRITE_TIMEOUT, call).await {
                Ok(result) => result.map_err(Error::from),
                Err(_) => Err(Error::Timeout(WRITE_TIMEOUT)),
            };
            self.metrics
                .controller_write_seconds
                .get_or_create(&KindLabels {
                    kind: kind.as_str().into(),
                })
                .observe(started.elapsed().as_secs_f64());
            result
        } else {
            Err(Error::NotLeader)
        };
        let outcome = match &result {
            Ok(_) => "ok",
            Err(e) => {
                if e.retry() != Retry::Never {
                    self.failures[kind as usize].fetch_add(1, Ordering::Relaxed);
                }
                e.outcome()
            }
        };
        self.metrics
            .controller_writes
            .get_or_create(&WriteLabels {
                kind: kind.as_str().into(),
                outcome: outcome.into(),
            })
            .inc();
        tracing::debug!(outcome, "written");
        result
    }

    /// How many writes of `kinds` have failed so far and are to be retried (by
    /// [`Error::retry`]): a loop compares it before and after a pass to schedule a
    /// retry of what it writes, and of nothing the other loop does.
    pub fn failures(&self, kinds: &[Kind]) -> u64 {
        kinds
            .iter()
            .map(|kind| self.failures[*kind as usize].load(Ordering::Relaxed))
            .sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(metrics: &Metrics, kind: &str, outcome: &str) -> u64 {
        metrics
            .controller_writes
            .get_or_create(&WriteLabels {
                kind: kind.into(),
                outcome: outcome.into(),
            })
            .get()
    }

    use crate::controller::error::api_error;

    #[tokio::test]
    async fn writes_are_counted_by_kind_and_outcome_and_only_a_leader_writes() {
        let metrics = Arc::new(Metrics::default());
        let (leading, receiver) = watch::channel(true);
        let writes = Writes::new(metrics.clone(), receiver, Rates::all(100));
        assert_eq!(writes.make(Kind::Node, async { Ok(1) }).await.unwrap(), 1);
        let conflict = writes.make(Kind::Node, async { Err::<(), _>(api_error(409)) });
        assert_eq!(conflict.await.unwrap_err().outcome(), "conflict");
        let refused = writes.make(Kind::Release, async { Err::<(), _>(api_error(500)) });
        assert_eq!(refused.await.unwrap_err().outcome(), "error");
        assert_eq!(sample(&metrics, "node", "ok"), 1);
        assert_eq!(sample(&metrics, "node", "conflict"), 1);
        assert_eq!(sample(&metrics, "release", "error"), 1);
        assert_eq!(
            writes.failures(&[Kind::Node]),
            1,
            "a conflict is computed again too"
        );
        assert_eq!(writes.failures(&[Kind::Node, Kind::Release]), 2);

        leading.send_replace(false);
        let sent = std::sync::atomic::AtomicBool::new(false);
        let result = writes
            .make(Kind::Eviction, async {
                sent.store(true, Ordering::Relaxed);
                Ok(())
            })
            .await;
        assert!(matches!(result, Err(Error::NotLeader)));
        assert!(
            !sent.load(Ordering::Relaxed),
            "nothing sent without the Lease"
        );
        assert_eq!(sample(&metrics, "eviction", "not_leader"), 1);
        assert_eq!(
            writes.failures(&[Kind::Eviction]),
            0,
            "a write not made for want of the Lease is no failure to retry"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn each_kind_waits_for_its_own_turns_only() {
        let (_leading, receiver) = watch::channel(true);
        let writes = Writes::new(Arc::default(), receiver, Rates::all(10));
        let start = tokio::time::Instant::now();
        for _ in 0..25 {
            writes.make(Kind::Node, async { Ok(()) }).await.unwrap();
        }
        assert!(
            start.elapsed() >= Duration::from_millis(500),
            "past the burst of 20"
        );
        let before = tokio::time::Instant::now();
        writes.make(Kind::Release, async { Ok(()) }).await.unwrap();
        assert_eq!(
            before.elapsed(),
            Duration::ZERO,
            "a release does not queue behind nodes"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn node_writes_go_at_their_own_rate() {
        let (_leading, receiver) = watch::channel(true);
        let rates = Rates {
            nodes: 100,
            others: 10,
        };
        let writes = Writes::new(Arc::default(), receiver, rates);
        let start = tokio::time::Instant::now();
        for _ in 0..300 {
            writes.make(Kind::Node, async { Ok(()) }).await.unwrap();
        }
        // A burst of 200, then 100 at 100 a second.
        assert_eq!(start.elapsed(), Duration::from_secs(1));
        let start = tokio::time::Instant::now();
        for _ in 0..30 {
            writes.make(Kind::Sweep, async { Ok(()) }).await.unwrap();
        }
        assert_eq!(
            start.elapsed(),
            Duration::from_secs(1),
            "20, then 10 at 10/s"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_write_with_no_answer_times_out() {
        let metrics = Arc::new(Metrics::default());
        let (_leading, receiver) = watch::channel(true);
        let writes = Writes::new(metrics.clone(), receiver, Rates::all(100));
        let stuck = writes.make(
            Kind::PolicyStatus,
            std::future::pending::<kube::Result<()>>(),
        );
        assert!(matches!(stuck.await, Err(Error::Timeout(_))));
        assert_eq!(sample(&metrics, "policy_status", "timeout"), 1);
    }
}
