//! Logging set-up and the Prometheus metrics berth exports on its metrics port.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;
use std::sync::atomic::AtomicU64;

/// Logs to stderr; `RUST_LOG` picks the level (default `info`).
pub fn init_logging() {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_writer(std::io::stderr)
        .try_init();
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RequestLabels {
    pub path: String,
    pub outcome: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct GateLabels {
    pub gate: String,
}

impl GateLabels {
    pub fn new(gate: &str) -> Self {
        GateLabels { gate: gate.into() }
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PolicyLabels {
    pub policy: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct KindLabels {
    pub kind: String,
}

/// Every metric of the webhook, registered once.
pub struct Metrics {
    registry: Registry,
    /// Admission latency by path and outcome.
    pub latency: Family<RequestLabels, Histogram>,
    /// Pods a policy applied to.
    pub decisions: Family<PolicyLabels, Counter>,
    /// Warnings returned to users.
    pub warnings: Counter,
    /// Admissions refused, by path.
    pub denials: Family<KindLabels, Counter>,
    /// Errors by kind: bad_request, too_large, busy, incomplete, namespace_lookup,
    /// broken_annotation, certificate_reload, invalid_policy.
    pub errors: Family<KindLabels, Counter>,
    /// Seconds until the serving certificate expires.
    pub certificate_expiry_seconds: Gauge<f64, AtomicU64>,
    /// Controller passes over every node.
    pub reconciles: Counter,
    /// Node writes by kind: labels, taints.
    pub node_writes: Family<KindLabels, Counter>,
    /// 409 conflicts met while writing taints (each retried).
    pub write_conflicts: Counter,
    /// Pods on a dedicated pool node without entitlement, by pool.
    pub unentitled_pods: Family<PolicyLabels, Gauge>,
    /// 1 while this replica holds the controller Lease.
    pub leader: Gauge,
    /// Pods held by each of berth's scheduling gates now.
    pub gated_pods: Family<GateLabels, Gauge>,
    /// Seconds from creation to release, by the gate released.
    pub gated_seconds: Family<GateLabels, Histogram>,
    /// DaemonSet templates the controller brought in line with the pools.
    pub daemonset_updates: Counter,
}

impl Default for Metrics {
    fn default() -> Self {
        let mut registry = Registry::with_prefix("berth");
        let latency = Family::<RequestLabels, Histogram>::new_with_constructor(|| {
            Histogram::new(exponential_buckets(0.000_25, 2.0, 16))
        });
        let decisions = Family::<PolicyLabels, Counter>::default();
        let warnings = Counter::default();
        let denials = Family::<KindLabels, Counter>::default();
        let errors = Family::<KindLabels, Counter>::default();
        let certificate_expiry_seconds = Gauge::<f64, AtomicU64>::default();
        let reconciles = Counter::default();
        let node_writes = Family::<KindLabels, Counter>::default();
        let write_conflicts = Counter::default();
        let unentitled_pods = Family::<PolicyLabels, Gauge>::default();
        let leader = Gauge::default();
        registry.register(
            "reconciles",
            "Controller passes over every node",
            reconciles.clone(),
        );
        registry.register("node_writes", "Node writes, by kind", node_writes.clone());
        registry.register(
            "write_conflicts",
            "Taint writes that met a 409 and were retried",
            write_conflicts.clone(),
        );
        registry.register(
            "unentitled_pods",
            "Pods on a dedicated pool node without entitlement, by pool",
            unentitled_pods.clone(),
        );
        registry.register(
            "leader",
            "1 while this replica holds the controller Lease",
            leader.clone(),
        );
        let gated_pods = Family::<GateLabels, Gauge>::default();
        let gated_seconds = Family::<GateLabels, Histogram>::new_with_constructor(
            (|| Histogram::new(exponential_buckets(0.05, 2.0, 16))) as fn() -> Histogram,
        );
        registry.register(
            "gated_pods",
            "Pods held by each of berth's scheduling gates",
            gated_pods.clone(),
        );
        registry.register(
            "gated_seconds",
            "Seconds from creation to release, by the gate released",
            gated_seconds.clone(),
        );
        let daemonset_updates = Counter::default();
        registry.register(
            "daemonset_updates",
            "DaemonSet templates brought in line with the pools (each rolls the DaemonSet)",
            daemonset_updates.clone(),
        );
        registry.register(
            "admission_duration_seconds",
            "Time to answer an admission request, by path and outcome",
            latency.clone(),
        );
        registry.register("decisions", "Pods a policy applied to", decisions.clone());
        registry.register("warnings", "Warnings returned to users", warnings.clone());
        registry.register(
            "denials",
            "Admission requests refused, by path",
            denials.clone(),
        );
        registry.register("errors", "Errors, by kind", errors.clone());
        registry.register(
            "certificate_expiry_seconds",
            "Seconds until the serving certificate expires",
            certificate_expiry_seconds.clone(),
        );
        Metrics {
            registry,
            latency,
            decisions,
            warnings,
            denials,
            errors,
            certificate_expiry_seconds,
            reconciles,
            node_writes,
            write_conflicts,
            unentitled_pods,
            leader,
            gated_pods,
            gated_seconds,
            daemonset_updates,
        }
    }
}

impl Metrics {
    pub fn error(&self, kind: &str) {
        self.errors
            .get_or_create(&KindLabels { kind: kind.into() })
            .inc();
    }

    /// The Prometheus text exposition of every metric.
    pub fn encode(&self) -> String {
        let mut out = String::new();
        // Writing into a String cannot fail.
        let _ = prometheus_client::encoding::text::encode(&mut out, &self.registry);
        out
    }
}
