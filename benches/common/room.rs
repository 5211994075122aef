//! What berth's model of the cluster costs (`BENCH_ROWS=room`; `scripts/bench-room`
//! runs it for the previous release and this one and prints both):
//!
//! - watch connections: the apiserver's own count of WATCH requests in flight
//!   (`apiserver_longrunning_requests`), before berth starts and once it is ready;
//! - an idle minute: node passes, release passes and berth's CPU;
//! - unrelated pod events: `BENCH_ROOM_EVENTS` (1,000) annotation changes on bound
//!   pods of a namespace that opts into nothing; node passes, release passes and
//!   CPU while berth takes them in, from right after a resync (which makes a pass
//!   in each loop every `RESYNC`);
//! - berth's RSS with the nodes and `BENCH_ROOM_PODS` (2,000) bound pods cached;
//! - `/mutate` against the minimal webhook, before any pod of the bench exists
//!   (see `mutate_reviews`);
//! - one policy change at a time (a pool moved to another node), until the node
//!   carries the pool's label: p50 and p99 over 40 changes;
//! - last, a dedicated pool over every node, until each is labelled and tainted,
//!   with berth's node writes meanwhile by outcome and their mean time (from its
//!   own metrics), so that a slow run says whether writes failed or took long.
//!
//! The release passes are `-` for a berth that does not count them.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{Api, Patch, PatchParams};
use serde_json::json;

use super::support::{Berth, TestCluster, create_at_once, fresh_namespace, samples};
use super::{
    RESYNC, cpu_seconds, env_number, memory_mib, mutate_reviews, pods, pool_over_every_node,
    print_reviews, until_bound,
};

/// WATCH requests the apiserver serves now, from its own metrics.
fn apiserver_watches(cluster: &TestCluster) -> f64 {
    let metrics = cluster.kubectl_ok(&["get", "--raw", "/metrics"]);
    samples(&metrics)
        .filter(|(sample, _)| {
            sample.starts_with("apiserver_longrunning_requests{")
                && sample.contains("verb=\"WATCH\"")
        })
        .map(|(_, value)| value)
        .sum()
}

/// Waits until the apiserver's count of watches has held still for 5 s.
async fn settled_watches(cluster: &TestCluster) -> f64 {
    let mut last = apiserver_watches(cluster);
    loop {
        tokio::time::sleep(Duration::from_secs(5)).await;
        let now = apiserver_watches(cluster);
        if now == last {
            return now;
        }
        last = now;
    }
}

/// Node passes, release passes (if berth counts them) and CPU seconds so far.
struct Mark {
    nodes: f64,
    releases: Option<f64>,
    cpu: f64,
}

impl Mark {
    fn now(berth: &Berth) -> Mark {
        Mark {
            nodes: berth.metric("berth_reconciles_total").unwrap_or(0.0),
            releases: berth.metric("berth_release_passes_total"),
            cpu: cpu_seconds(berth.pid()),
        }
    }

    /// What happened since `self`, as a table's cells.
    fn since(&self, berth: &Berth) -> String {
        let now = Mark::now(berth);
        let releases = match (self.releases, now.releases) {
            (Some(before), Some(after)) => format!("{:.0}", after - before),
            _ => "-".into(),
        };
        format!(
            "{:.0} | {releases} | {:.2}",
            now.nodes - self.nodes,
            now.cpu - self.cpu
        )
    }
}

/// berth's node writes so far, from its metrics: the count by outcome and the
/// seconds they took. Empty for a berth that does not count them.
#[derive(Default)]
struct NodeWrites {
    by_outcome: BTreeMap<String, f64>,
    seconds: f64,
}

impl NodeWrites {
    fn now(berth: &Berth) -> NodeWrites {
        let mut writes = NodeWrites::default();
        for (sample, value) in samples(&berth.metrics()) {
            if let Some(outcome) = sample
                .strip_prefix("berth_controller_writes_total{kind=\"node\",outcome=\"")
                .and_then(|rest| rest.strip_suffix("\"}"))
            {
                writes.by_outcome.insert(outcome.to_string(), value);
            } else if sample == "berth_controller_write_seconds_sum{kind=\"node\"}" {
                writes.seconds = value;
            }
        }
        writes
    }

    /// The writes since `self`: how many ended each way, and the mean time of one.
    fn since(&self, berth: &Berth) -> String {
        let now = NodeWrites::now(berth);
        let made: Vec<(&String, f64)> = now
            .by_outcome
            .iter()
            .map(|(outcome, n)| (outcome, n - self.by_outcome.get(outcome).unwrap_or(&0.0)))
            .filter(|(_, n)| *n > 0.0)
            .collect();
        let total: f64 = made.iter().map(|(_, n)| n).sum();
        if total == 0.0 {
            return "none counted".into();
        }
        let counts: Vec<String> = made.iter().map(|(o, n)| format!("{n:.0} {o}")).collect();
        format!(
            "{}, {:.0} ms each on average",
            counts.join(", "),
            (now.seconds - self.seconds) / total * 1000.0
        )
    }
}

/// Returns once both of berth's loops have made a pass: on an idle cluster only a
/// resync makes one, so the next is a period away. (A berth that does not count
/// release passes is waited for on its node passes alone.)
async fn after_a_resync(berth: &Berth) {
    let before = Mark::now(berth);
    let deadline = Instant::now() + 2 * RESYNC;
    loop {
        let now = Mark::now(berth);
        if now.nodes > before.nodes
            && now
                .releases
                .zip(before.releases)
                .is_none_or(|(now, was)| now > was)
        {
            return;
        }
        assert!(Instant::now() < deadline, "no resync in {:?}", 2 * RESYNC);
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

pub async fn run(
    cluster: &'static TestCluster,
    node_count: usize,
    start_berth: impl FnOnce() -> &'static Berth,
) {
    let before = settled_watches(cluster).await;
    let berth = start_berth();
    let watches = settled_watches(cluster).await - before;
    let client = cluster.client().await;
    let which = std::env::var("BENCH_LABEL").unwrap_or_else(|_| "this build".into());

    let idle = Mark::now(berth);
    tokio::time::sleep(Duration::from_secs(60)).await;
    let idle = idle.since(berth);
    let reviews = mutate_reviews(berth, &client, node_count).await;

    let count = env_number("BENCH_ROOM_PODS", 2000);
    let ns = fresh_namespace(&client, "bench-room").await;
    // In batches: thousands of creates at once on a control plane sharing two
    // cores with 5,000 fake nodes outlast the apiserver's patience with its
    // webhooks, and a review whose body comes too late is refused.
    let started = Instant::now();
    for batch in pods("room", count, &json!({})).chunks(500) {
        create_at_once(&client, &ns, batch.to_vec()).await;
    }
    let bound = until_bound(&client, &ns, count, started).await;
    tokio::time::sleep(Duration::from_secs(10)).await;
    let rss = memory_mib(berth.pid(), "VmRSS");

    let events = env_number("BENCH_ROOM_EVENTS", 1000);
    let api: Api<Pod> = Api::namespaced(client.clone(), &ns);
    // The passes of a resync are not the events': the window opens right after
    // one, and says so if it outlasts the period.
    after_a_resync(berth).await;
    let touched = Mark::now(berth);
    let started = Instant::now();
    futures::stream::iter(0..events)
        .map(|i| {
            let api = api.clone();
            async move {
                let patch = json!({"metadata": {"annotations": {"bench.example.com/touch": i.to_string()}}});
                let name = format!("room-{}", i % count);
                api.patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
                    .await
                    .expect("annotate a pod");
            }
        })
        .buffer_unordered(8)
        .collect::<()>()
        .await;
    let took = started.elapsed();
    // The last events reach berth moments after the last answer.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let touched = touched.since(berth);
    let window = started.elapsed();
    let window = if window < RESYNC {
        format!("{:.1} s, between two resyncs", window.as_secs_f64())
    } else {
        format!("{:.1} s, a resync included", window.as_secs_f64())
    };

    let changes = policy_changes(berth, &client, cluster.node_names().len()).await;
    let at = |q: usize| changes[(changes.len() * q).div_ceil(100) - 1].as_millis();
    let nodes = cluster.node_names().len();
    let (pool_cpu, pool_writes) = (cpu_seconds(berth.pid()), NodeWrites::now(berth));
    let pool = pool_over_every_node(berth, &client, nodes).await;
    let pool_cpu = cpu_seconds(berth.pid()) - pool_cpu;
    let pool_writes = pool_writes.since(berth);

    println!();
    println!(
        "berth: {which}; {nodes} nodes, {count} bound pods (bound in {:.0} s)",
        bound.as_secs_f64()
    );
    println!("| what | node passes | release passes | berth CPU s |");
    println!("|---|---:|---:|---:|");
    println!("| an idle minute | {idle} |");
    println!(
        "| {events} annotation changes on bound pods nothing selects ({:.1} s; the window {window}) | {touched} |",
        took.as_secs_f64()
    );
    println!("berth's watch connections (the apiserver's WATCH requests): {watches:.0}");
    println!("berth's RSS with the nodes and {count} pods cached: {rss:.0} MiB");
    println!(
        "a policy's pool moved to another node, until that node is labelled ({} changes): p50 {} ms, p99 {} ms",
        changes.len(),
        at(50),
        at(99)
    );
    println!(
        "a dedicated pool over all {nodes} nodes, until each is labelled and tainted: {:.2} s (berth CPU {pool_cpu:.2} s); \
         until its status counted them: {:.2} s; berth's node writes meanwhile: {pool_writes}",
        pool.nodes.as_secs_f64(),
        pool.status.as_secs_f64()
    );
    print_reviews(reviews);
}

/// A pool moved from node to node, one change at a time: how long until the
/// node it moved to carries the pool's label, each time, sorted.
async fn policy_changes(berth: &Berth, client: &kube::Client, nodes: usize) -> Vec<Duration> {
    let api: Api<Node> = Api::all(client.clone());
    let policies = super::support::audit::policy_api(client);
    berth.cluster.apply(
        &json!({"apiVersion": "berth.io/v1alpha1", "kind": "PlacementPolicy",
            "metadata": {"name": "room-moves"},
            "spec": {"podSelector": {"matchLabels": {"app": "room-moves"}},
                "pool": {"nodeNames": ["node1"], "dedicated": false}}})
        .to_string(),
    );
    let mut took = Vec::new();
    for i in 0..40 {
        let node = format!("node{}", nodes - i % nodes.min(40));
        let moved = json!({"spec": {"pool": {"nodeNames": [node]}}});
        let started = Instant::now();
        policies
            .patch("room-moves", &PatchParams::default(), &Patch::Merge(&moved))
            .await
            .expect("move the pool");
        loop {
            let labels = api.get(&node).await.expect("node").metadata.labels;
            let pool = labels
                .as_ref()
                .and_then(|l| l.get(berth::names::POOL_LABEL));
            if pool.map(String::as_str) == Some("room-moves") {
                break;
            }
            assert!(
                started.elapsed() < Duration::from_secs(60),
                "{node} never labelled"
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        took.push(started.elapsed());
    }
    took.sort();
    took
}
