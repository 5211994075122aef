//! Logging set-up and the Prometheus metrics berth exports on its metrics port.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
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
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
    // try_init also routes the `log` crate's records (rustls') into it.
    let _ = tracing_subscriber::util::SubscriberInitExt::try_init(log_format(
        filter,
        ansi,
        std::io::stderr,
    ));
}

/// berth's log lines: each prefixed by the spans it happened in (a review with
/// its uid, a controller pass, a write with its kind), so that one review or one
/// pass can be followed by its span. Public so that tests read the same lines.
pub fn log_format<W>(
    filter: tracing_subscriber::EnvFilter,
    ansi: bool,
    writer: W,
) -> impl tracing::Subscriber + Send + Sync + 'static
where
    W: for<'w> tracing_subscriber::fmt::MakeWriter<'w> + Send + Sync + 'static,
{
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(ansi)
        .with_writer(writer)
        .finish()
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
    pub unentitled_pods: PolicyGauge,
    /// Pods a policy applies to that lack its decision, by policy.
    pub missed_pods: PolicyGauge,
    /// Pairs of pods an `avoid` policy keeps apart that share a node, by policy.
    pub exclusion_clashes: PolicyGauge,
    /// Missed pods evicted so that their owner recreates them through the webhook.
    pub missed_evictions: Family<PolicyLabels, Counter>,
    /// 1 while this replica holds the controller Lease.
    pub leader: Gauge,
    /// 1 when the leader's last probe found the apiserver reaching the webhook
    /// (the missed scan evicts only then), 0 when it did not.
    pub webhook_reachable: Gauge,
    /// Pods held by each of berth's scheduling gates now.
    pub gated_pods: Family<GateLabels, Gauge>,
    /// Seconds from creation to release, by the gate released.
    pub gated_seconds: Family<GateLabels, Histogram>,
    /// Age of the oldest pod each gate holds now, in seconds (0 when it holds none).
    pub gated_oldest_age_seconds: Family<GateLabels, Gauge>,
    /// DaemonSet templates the controller brought in line with the pools.
    pub daemonset_updates: Counter,
    /// Passes of the releases loop.
    pub release_passes: Counter,
    /// Times the policies in force were compiled (once per change of a policy's
    /// spec or finalizers, never for a status write).
    pub policy_compiles: Counter,
    /// The controller's writes, by kind and outcome.
    pub controller_writes: Family<WriteLabels, Counter>,
    /// How long each of the controller's writes took, by kind.
    pub controller_write_seconds: Family<KindLabels, Histogram>,
    /// Webhook connections open now.
    pub connections: Gauge,
    /// Webhook connections closed by berth for their peer's share: `refused` at
    /// once (the peer held its share), `revoked` (given to a peer holding less).
    pub connections_dropped: Family<KindLabels, Counter>,
}

/// A controller write: what it wrote (`node`, `policy_status`, `finalizer`,
/// `daemonset`, `release`, `eviction`, `pod_group`, `priority_class`, `sweep`,
/// `static_placement`)
/// and how it ended (`ok`, `conflict`, `not_found`, `error`, `timeout`,
/// `not_leader`).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct WriteLabels {
    pub kind: String,
    pub outcome: String,
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
        let unentitled_pods = PolicyGauge::default();
        let missed_pods = PolicyGauge::default();
        let exclusion_clashes = PolicyGauge::default();
        let missed_evictions = Family::<PolicyLabels, Counter>::default();
        let leader = Gauge::default();
        let webhook_reachable = Gauge::default();
        registry.register(
            "webhook_reachable",
            "1 when the leader's last probe (a dry-run create through the apiserver) reached berth's webhook, 0 when not",
            webhook_reachable.clone(),
        );
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
            unentitled_pods.family.clone(),
        );
        registry.register(
            "missed_pods",
            "Pods a policy applies to that lack its decision (admitted while berth was unreachable, or older than the policy), by policy",
            missed_pods.family.clone(),
        );
        registry.register(
            "exclusion_clashes",
            "Pairs of pods an avoid policy keeps apart that share a node anyway (one created while berth was down, say), by policy",
            exclusion_clashes.family.clone(),
        );
        registry.register(
            "missed_evictions",
            "Missed pods evicted (onMissed: Evict) so that their owner recreates them through the webhook",
            missed_evictions.clone(),
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
        // gated_seconds is observed only at release, so a pod that is never
        // released would never show in it; this gauge is what alerts on a stuck hold.
        let gated_oldest_age_seconds = Family::<GateLabels, Gauge>::default();
        registry.register(
            "gated_oldest_age_seconds",
            "Age of the oldest pod each of berth's scheduling gates holds now (0 when none)",
            gated_oldest_age_seconds.clone(),
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
        let release_passes = Counter::default();
        registry.register(
            "release_passes",
            "Passes of the controller's releases loop",
            release_passes.clone(),
        );
        let policy_compiles = Counter::default();
        registry.register(
            "policy_compiles",
            "Times the policies in force were compiled (a change of a policy's spec or finalizers)",
            policy_compiles.clone(),
        );
        let controller_writes = Family::<WriteLabels, Counter>::default();
        registry.register(
            "controller_writes",
            "The controller's writes to the apiserver, by kind and outcome",
            controller_writes.clone(),
        );
        let controller_write_seconds = Family::<KindLabels, Histogram>::new_with_constructor(
            (|| Histogram::new(exponential_buckets(0.001, 2.0, 14))) as fn() -> Histogram,
        );
        registry.register(
            "controller_write_seconds",
            "How long the controller's writes took, by kind",
            controller_write_seconds.clone(),
        );
        let connections = Gauge::default();
        registry.register(
            "connections",
            "Webhook connections open now",
            connections.clone(),
        );
        let connections_dropped = Family::<KindLabels, Counter>::default();
        registry.register(
            "connections_dropped",
            "Webhook connections berth closed for their peer's share, by kind (refused, revoked)",
            connections_dropped.clone(),
        );
        Metrics {
            registry,
            connections,
            connections_dropped,
            release_passes,
            policy_compiles,
            controller_writes,
            controller_write_seconds,
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
            missed_pods,
            exclusion_clashes,
            missed_evictions,
            leader,
            webhook_reachable,
            gated_pods,
            gated_seconds,
            gated_oldest_age_seconds,
            daemonset_updates,
        }
    }
}

/// A gauge per policy that forgets the policies it is no longer given: a deleted
/// policy's series left at its last value would keep an alert firing for
/// something that no longer exists.
#[derive(Debug, Default)]
pub struct PolicyGauge {
    family: Family<PolicyLabels, Gauge>,
    known: std::sync::Mutex<std::collections::BTreeSet<String>>,
}

impl PolicyGauge {
    /// Sets one series per policy in `counts`, and removes the others.
    pub fn set_all(&self, counts: &std::collections::BTreeMap<String, i64>) {
        let mut known = self.known.lock().unwrap_or_else(|e| e.into_inner());
        for gone in known.iter().filter(|p| !counts.contains_key(*p)) {
            self.family.remove(&PolicyLabels {
                policy: gone.clone(),
            });
        }
        for (policy, count) in counts {
            self.family
                .get_or_create(&PolicyLabels {
                    policy: policy.clone(),
                })
                .set(*count);
        }
        *known = counts.keys().cloned().collect();
    }
}

impl Metrics {
    pub fn error(&self, kind: &str) {
        self.errors
            .get_or_create(&KindLabels { kind: kind.into() })
            .inc();
    }

    /// Records what `gate` holds now: one entry per held pod, its creation time if
    /// known. Sets both the count and the age of the oldest at `now`.
    pub fn set_held<'t>(
        &self,
        gate: &str,
        created: impl IntoIterator<Item = Option<&'t Time>>,
        now: Timestamp,
    ) {
        let (mut count, mut oldest) = (0, 0);
        for time in created {
            count += 1;
            if let Some(time) = time {
                oldest = oldest.max(now.as_second() - time.0.as_second());
            }
        }
        let labels = GateLabels::new(gate);
        self.gated_pods.get_or_create(&labels).set(count);
        // A creation time ahead of our clock (skew) is not a negative age.
        self.gated_oldest_age_seconds
            .get_or_create(&labels)
            .set(oldest.max(0));
    }

    /// The Prometheus text exposition of every metric.
    pub fn encode(&self) -> String {
        let mut out = String::new();
        // Writing into a String cannot fail.
        let _ = prometheus_client::encoding::text::encode(&mut out, &self.registry);
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(second: i64) -> Time {
        Time(Timestamp::from_second(second).unwrap())
    }

    #[test]
    fn a_deleted_policy_loses_its_unentitled_series() {
        let metrics = Metrics::default();
        let counts = |pairs: &[(&str, i64)]| {
            pairs
                .iter()
                .map(|(p, n)| (p.to_string(), *n))
                .collect::<std::collections::BTreeMap<_, _>>()
        };
        metrics
            .unentitled_pods
            .set_all(&counts(&[("cdn", 2), ("gpu", 0)]));
        let text = metrics.encode();
        assert!(
            text.contains("berth_unentitled_pods{policy=\"cdn\"} 2"),
            "{text}"
        );
        metrics.unentitled_pods.set_all(&counts(&[("gpu", 1)]));
        let text = metrics.encode();
        assert!(!text.contains("policy=\"cdn\""), "{text}");
        assert!(
            text.contains("berth_unentitled_pods{policy=\"gpu\"} 1"),
            "{text}"
        );
    }

    #[test]
    fn set_held_exports_the_count_and_the_age_of_the_oldest_pod() {
        let metrics = Metrics::default();
        let now = Timestamp::from_second(1_000_000).unwrap();
        let (recent, old) = (at(1_000_000 - 30), at(1_000_000 - 900));
        // A pod without a creation time counts, but has no age to report.
        metrics.set_held("berth.io/avoid", [Some(&recent), Some(&old), None], now);
        // Clock skew: a pod "created" after now is held for 0 s, not -5 s.
        let ahead = at(1_000_005);
        metrics.set_held("berth.io/rank", [Some(&ahead)], now);
        let text = metrics.encode();
        for line in [
            "berth_gated_pods{gate=\"berth.io/avoid\"} 3",
            "berth_gated_oldest_age_seconds{gate=\"berth.io/avoid\"} 900",
            "berth_gated_pods{gate=\"berth.io/rank\"} 1",
            "berth_gated_oldest_age_seconds{gate=\"berth.io/rank\"} 0",
        ] {
            assert!(text.lines().any(|l| l == line), "no {line:?} in:\n{text}");
        }

        // Once nothing is held, both go back to 0 (an alert on the age resolves).
        metrics.set_held("berth.io/avoid", std::iter::empty(), now);
        let text = metrics.encode();
        for line in [
            "berth_gated_pods{gate=\"berth.io/avoid\"} 0",
            "berth_gated_oldest_age_seconds{gate=\"berth.io/avoid\"} 0",
        ] {
            assert!(text.lines().any(|l| l == line), "no {line:?} in:\n{text}");
        }
    }
}
