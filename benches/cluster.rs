//! berth beside the native constructs it replaces, in one run on the real control
//! plane with N fake nodes (`make bench-cluster`; `BENCH_NODES`, default 1,000):
//!
//! - first, while the cluster holds none of the rows' pods: `/mutate` reviews per
//!   second, berth against the minimal webhook
//!   (`floor/minimal_webhook.rs`: axum + rustls, reads the uid, allows), on one
//!   HTTP/2 connection (no apiserver in between);
//! - exclusion: pods that must avoid each other, created at once, until all are
//!   bound: an `avoid` policy, required podAntiAffinity, no constraint;
//! - ordinary pods in a cluster that holds berth's exclusion pods, the native ones,
//!   or neither;
//! - co-location: pods that must sit beside one of ten `a` pods: `colocateWith`,
//!   required podAffinity, no constraint;
//! - one change at a time: a pod bound to a node or deleted, until the node's
//!   anchor label follows (p99 over 80 changes);
//! - pod creates per second through the apiserver with berth's webhook
//!   registered, with the minimal webhook registered in its place, and with none;
//! - a dedicated pool over every node, until each has berth's label and taint;
//!   then an idle resync, which must write nothing.
//!
//! `BENCH_ROWS=room` runs only what berth's model of the cluster costs (see
//! `common/room.rs`). `BENCH_ROWS=mutate` runs only the `/mutate` row, in a few minutes rather than
//! many (the cluster still has its `BENCH_NODES` nodes, but is otherwise idle);
//! `BENCH_ROWS=exclusion` only the exclusion row.
//!
//! The side-by-side rows and the creates run `BENCH_ROUNDS` rounds (default 3),
//! berth, the alternative and no constraint taking turns in an order rotated each
//! round, and report the median of each (creates: the rate over all rounds). Each
//! row prints its times and the ratio of berth to the alternative beside the
//! target of issue 12, berth's CPU seconds (per round in the side-by-side rows) and
//! its peak RSS so far; the run begins and ends with berth's RSS with only the
//! nodes cached. Ratios are what to compare: absolute times on a shared 2-core
//! machine are noise.

#[path = "common/mod.rs"]
mod common;
#[path = "common/fixed_state.rs"]
mod fixed_state;
#[path = "floor/load.rs"]
mod load;
#[path = "floor/minimal_webhook.rs"]
mod minimal_webhook;
#[path = "common/room.rs"]
mod room;
#[path = "../tests/support/mod.rs"]
mod support;
#[path = "common/typical_pod.rs"]
mod typical_pod;

use std::collections::HashSet;
use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::Client;
use kube::api::{Api, DeleteParams, ListParams};
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher::{self, watcher};
use minimal_webhook::{Floor, Stage};
use serde_json::{Value, json};
use support::fleet::cpu_seconds;
use support::{Berth, Nodes, create_at_once, fresh_namespace, opt_in, test_pod};

/// How many `a` pods the co-location rows place `pods` beside: at least ten, and
/// room for every pod twice over (a node takes 80 of these pods by CPU).
fn anchors_for(pods: usize) -> usize {
    (pods / 40).max(10)
}

/// berth's resync period in this bench: short, so that an idle resync fits in the run.
const RESYNC: Duration = Duration::from_secs(15);

/// How long any one row may take before the bench gives up on it.
const LIMIT: Duration = Duration::from_secs(600);

fn env_number(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// The number in a `field: number ...` line of the process's /proc file `file`
/// (`status`, `io`); 0 when it cannot be read.
fn proc_figure(pid: u32, file: &str, field: &str) -> f64 {
    std::fs::read_to_string(format!("/proc/{pid}/{file}"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))
                .and_then(|v| v.split_whitespace().next()?.parse::<f64>().ok())
        })
        .unwrap_or(0.0)
}

/// A memory figure of berth's, in MiB, from /proc: `VmRSS` (resident now) or
/// `VmHWM` (its peak so far).
fn memory_mib(pid: u32, field: &str) -> f64 {
    proc_figure(pid, "status", field) / 1024.0
}

/// How many write calls (`write`, `writev`) a process has made, from /proc: each
/// is at least one TLS record and one trip into the kernel for a webhook.
fn write_calls(pid: u32) -> u64 {
    proc_figure(pid, "io", "syscw") as u64
}

/// berth's peak resident memory in MiB.
fn peak_rss_mib(pid: u32) -> f64 {
    memory_mib(pid, "VmHWM")
}

/// `count` pods labelled `app: <app>` with `extra` merged into their spec.
fn pods(app: &str, count: usize, extra: &Value) -> Vec<Pod> {
    (0..count)
        .map(|i| test_pod(&format!("{app}-{i}"), json!({"app": app}), extra.clone()))
        .collect()
}

/// Creates `pods` in `ns` at once; the time until every one is bound.
async fn time_to_bind(client: &Client, ns: &str, pods: Vec<Pod>) -> Duration {
    let count = pods.len();
    let started = Instant::now();
    create_at_once(client, ns, pods).await;
    until_bound(client, ns, count, started).await
}

/// Waits until no pod in `ns` is unbound; the time since `started`.
async fn until_bound(client: &Client, ns: &str, count: usize, started: Instant) -> Duration {
    let api: Api<Pod> = Api::namespaced(client.clone(), ns);
    // Only the pods not bound yet are listed: listing thousands of bound pods ten
    // times a second would load the apiserver being measured.
    let unbound = ListParams::default().fields("spec.nodeName=");
    loop {
        let left = api.list(&unbound).await.expect("list pods").items.len();
        if left == 0 {
            return started.elapsed();
        }
        assert!(
            started.elapsed() < LIMIT,
            "{left} of {count} not bound in {ns} after {LIMIT:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

async fn delete_pods(client: &Client, ns: &str) {
    let api: Api<Pod> = Api::namespaced(client.clone(), ns);
    let now = DeleteParams {
        grace_period_seconds: Some(0),
        ..DeleteParams::default()
    };
    let started = Instant::now();
    // Thousands of pods can outlast the apiserver's request timeout: ask again
    // until none is left.
    loop {
        if let Err(e) = api.delete_collection(&now, &ListParams::default()).await {
            eprintln!("deleting the pods of {ns}: {e}; asking again");
        }
        let left = api
            .list(&ListParams::default())
            .await
            .map(|l| l.items.len());
        if left.as_ref().is_ok_and(|n| *n == 0) {
            return;
        }
        assert!(
            started.elapsed() < LIMIT,
            "pods of {ns} not deleted: {left:?}"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// How many rounds each side-by-side row runs (`BENCH_ROUNDS`, default 3).
fn rounds() -> usize {
    env_number("BENCH_ROUNDS", 3).max(1)
}

/// One way of doing a side-by-side row's job: pods placed first and not timed
/// (`setup`), then the pods whose binding is timed, each list in its namespace.
struct Contender {
    setup: Vec<(String, Vec<Pod>)>,
    timed: (String, Vec<Pod>),
}

impl Contender {
    /// Only timed pods, in `ns`.
    fn timed(ns: &str, pods: Vec<Pod>) -> Contender {
        Contender {
            setup: Vec::new(),
            timed: (ns.to_owned(), pods),
        }
    }

    /// One round: the setup placed, the timed pods created at once until bound,
    /// then every pod of the round deleted, so that the next round starts from
    /// the same cluster.
    async fn round(&self, client: &Client) -> Duration {
        for (ns, pods) in &self.setup {
            time_to_bind(client, ns, pods.clone()).await;
        }
        let (ns, pods) = &self.timed;
        let time = time_to_bind(client, ns, pods.clone()).await;
        delete_pods(client, ns).await;
        for (ns, _) in &self.setup {
            delete_pods(client, ns).await;
        }
        time
    }
}

/// Runs berth, the alternative and no constraint (in that order) [`rounds`] times,
/// taking turns in an order rotated each round, so that a slow spell of the machine
/// or a cluster warmed by the turn before falls on each alike. Returns the median
/// time of each and berth's CPU seconds per round (its deletes included).
async fn side_by_side(
    client: &Client,
    pid: u32,
    contenders: [&Contender; 3],
) -> ([Duration; 3], f64) {
    let rounds = rounds();
    let mut times: [Vec<Duration>; 3] = Default::default();
    let mut berth_cpu = 0.0;
    for round in 0..rounds {
        for turn in 0..contenders.len() {
            let which = (round + turn) % contenders.len();
            let cpu = cpu_seconds(pid);
            times[which].push(contenders[which].round(client).await);
            if which == 0 {
                berth_cpu += cpu_seconds(pid) - cpu;
            }
        }
    }
    for (name, times) in ["berth", "alternative", "none"].iter().zip(&times) {
        let each: Vec<String> = times
            .iter()
            .map(|t| format!("{:.2}", t.as_secs_f64()))
            .collect();
        println!("  rounds, {name}: {} s", each.join(", "));
    }
    let median = |times: &mut Vec<Duration>| {
        times.sort();
        times[times.len() / 2]
    };
    let [a, b, c] = &mut times;
    ([median(a), median(b), median(c)], berth_cpu / rounds as f64)
}

/// How long a dedicated pool over every node took: until the policy's status
/// counted every node, and until each node carried its label and taint.
pub struct PoolTimes {
    pub status: Duration,
    pub nodes: Duration,
}

/// A dedicated pool over every node (see [`PoolTimes`]). The policies before it go
/// first (a node in an older policy's pool would never be this one's). The nodes
/// are watched, not listed: listing 5,000 nodes five times a second would load the
/// apiserver that makes berth's writes.
async fn pool_over_every_node(berth: &Berth, client: &Client, node_count: usize) -> PoolTimes {
    berth
        .cluster
        .kubectl_ok(&["delete", "placementpolicies", "--all", "--wait=true"]);
    let policies = support::audit::policy_api(client);
    let mut nodes = watcher(Api::<Node>::all(client.clone()), watcher::Config::default())
        .default_backoff()
        .boxed();
    let mut in_pool: HashSet<String> = HashSet::new();
    // The first list is taken before the clock starts.
    loop {
        match nodes.next().await.expect("the node watch ends not") {
            Ok(watcher::Event::InitDone) => break,
            _ => continue,
        }
    }
    let started = Instant::now();
    apply_policy(
        berth,
        "everywhere",
        // Every node by a label its kubelet sets: a pool takes nodes by such a
        // label only when it trusts it.
        json!({"pool": {"trustSelfSetLabels": true,
            "nodeSelector": {"matchLabels": {"kubernetes.io/os": "linux"}}}}),
    );
    let (mut status, mut labelled) = (None, None);
    let mut every = tokio::time::interval(Duration::from_millis(200));
    loop {
        tokio::select! {
            event = nodes.next() => match event.expect("the node watch ends not") {
                Ok(watcher::Event::Apply(node) | watcher::Event::InitApply(node)) => {
                    let name = node.metadata.name.clone().unwrap_or_default();
                    if in_the_pool(&node, "everywhere") {
                        in_pool.insert(name);
                    } else {
                        in_pool.remove(&name);
                    }
                }
                Ok(watcher::Event::Delete(node)) => {
                    in_pool.remove(&node.metadata.name.unwrap_or_default());
                }
                Ok(watcher::Event::Init | watcher::Event::InitDone) | Err(_) => {}
            },
            _ = every.tick(), if status.is_none() => {
                let policy = policies.get("everywhere").await.expect("the policy");
                if policy.data["status"]["nodes"].as_u64() >= Some(node_count as u64) {
                    status = Some(started.elapsed());
                }
            }
        }
        if labelled.is_none() && in_pool.len() >= node_count {
            labelled = Some(started.elapsed());
        }
        if let (Some(status), Some(nodes)) = (status, labelled) {
            return PoolTimes { status, nodes };
        }
        assert!(
            started.elapsed() < LIMIT,
            "{} of {node_count} nodes in the pool",
            in_pool.len()
        );
    }
}

/// Whether `node` carries `pool`'s label and taint.
fn in_the_pool(node: &Node, pool: &str) -> bool {
    let labelled = node
        .metadata
        .labels
        .as_ref()
        .is_some_and(|l| l.get(berth::names::POOL_LABEL).map(String::as_str) == Some(pool));
    let tainted = node
        .spec
        .as_ref()
        .and_then(|s| s.taints.as_ref())
        .is_some_and(|t| {
            t.iter()
                .any(|t| t.key == berth::names::POOL_TAINT && t.value.as_deref() == Some(pool))
        });
    labelled && tainted
}

fn apply_policy(berth: &Berth, name: &str, spec: Value) {
    let policy = json!({"apiVersion": "berth.io/v1alpha1", "kind": "PlacementPolicy",
        "metadata": {"name": name}, "spec": spec});
    berth.cluster.apply(&policy.to_string());
}

/// A namespace opted into `policy`, probed with a pod labelled `app: <app>`.
async fn opted(client: &Client, purpose: &str, policy: &str, app: &str) -> String {
    let ns = fresh_namespace(client, purpose).await;
    let probe = test_pod("probe", json!({"app": app}), json!({}));
    opt_in(client, &ns, policy, &probe, LIMIT).await;
    ns
}

/// The apiserver's connections to a webhook under load, and reviews in flight
/// on each.
const REVIEW_CONNECTIONS: usize = 16;
const REVIEW_STREAMS: usize = 8;
const REVIEW_ROUND: Duration = Duration::from_secs(20);
/// Each server's time is taken in this many turns, the servers in turn, so that a
/// busy spell of the machine (kwok keeping 1,000 nodes shares the cores) falls on
/// each alike.
const REVIEW_TURNS: u32 = 4;

/// What one server did at `/mutate` over all its turns.
#[derive(Debug, Clone, Copy, Default)]
struct Served {
    reviews: u64,
    /// Wall time under load.
    seconds: f64,
    /// The server's own CPU time meanwhile.
    cpu: f64,
    /// Its write calls meanwhile.
    writes: u64,
}

impl Served {
    fn per_second(&self) -> f64 {
        self.reviews as f64 / self.seconds
    }

    /// How much of its core the server used while under load: near 1 when the
    /// load generator kept it busy.
    fn core_use(&self) -> f64 {
        self.cpu / self.seconds
    }

    /// The server's CPU time per review, in µs: its own cost, whatever else ran
    /// on its core meanwhile (the cluster's apiserver and kwok are not pinned).
    fn cpu_micros(&self) -> f64 {
        self.cpu * 1e6 / self.reviews as f64
    }

    /// Write calls per review: under 1 when the answers of several streams leave
    /// together.
    fn writes_per_review(&self) -> f64 {
        self.writes as f64 / self.reviews as f64
    }
}

/// `/mutate` under load, each server given the same review (a typical Deployment
/// pod with a cdn image, in a namespace opted into the cdn policy).
struct Reviews {
    /// The review's size.
    bytes: usize,
    /// berth, as it runs.
    berth: Served,
    /// The minimal webhook.
    floor: Served,
    /// The minimal webhook reading each review as berth does.
    read: Served,
    /// berth's own router over a fixed state: all berth does with a review,
    /// none of its live process.
    decide: Served,
}

/// Measures [`Reviews`] with `nodes` nodes in the fixed state's cache (as berth's).
async fn mutate_reviews(berth: &Berth, client: &Client, nodes: usize) -> Reviews {
    berth
        .cluster
        .apply(&std::fs::read_to_string(support::repo_root().join("policies/cdn.yaml")).unwrap());
    let ns = fresh_namespace(client, "bench-reviews").await;
    let probe = common::pod("probe", "example/cdn-uploader:1");
    opt_in(client, &ns, "cdn", &probe, LIMIT).await;
    let review = typical_pod::typical_review(&ns);
    let body = hyper::body::Bytes::from(review.to_string());
    let certs = berth.certs_dir();
    let floor = Floor::spawn(&certs, &Stage::Uid);
    let reader = Floor::spawn(&certs, &Stage::Read);
    let namespace = ns.clone();
    let decider = Floor::spawn(&certs, &Stage::Decide { namespace, nodes });
    let at_berth = std::net::SocketAddr::from(([127, 0, 0, 1], berth.port));
    let ca = std::fs::read(certs.join("ca.crt")).expect("berth's CA");
    // One core for the webhook under test, the other for the load generator. The
    // cluster stays on both: on the generator's core alone, it leaves the
    // generator too little to keep even the floor busy.
    let (servers, generator) = (berth.pid(), std::process::id());
    pin(&[servers, floor.pid(), reader.pid(), decider.pid()], "0");
    pin(&[generator], "1");
    let turn = REVIEW_ROUND / REVIEW_TURNS;
    let mut served = [Served::default(); 4];
    const PATCHED: &str = r#""patchType":"JSONPatch""#;
    const ALLOWED: &str = r#""allowed":true"#;
    let servers_in_turn = [
        (at_berth, servers, PATCHED),
        (floor.addr, floor.pid(), ALLOWED),
        (reader.addr, reader.pid(), ALLOWED),
        (decider.addr, decider.pid(), PATCHED),
    ];
    for _ in 0..REVIEW_TURNS {
        for (served, (addr, pid, expected)) in served.iter_mut().zip(servers_in_turn) {
            let (cpu, writes) = (cpu_seconds(pid), write_calls(pid));
            let answered = load::reviews_answered(
                addr,
                &ca,
                body.clone(),
                REVIEW_CONNECTIONS,
                REVIEW_STREAMS,
                turn,
                expected,
            )
            .await;
            served.cpu += cpu_seconds(pid) - cpu;
            served.writes += write_calls(pid) - writes;
            served.reviews += answered.reviews;
            served.seconds += answered.seconds;
        }
    }
    pin(&[servers, generator], "0,1");
    let [berth, floor, read, decide] = served;
    Reviews {
        bytes: body.len(),
        berth,
        floor,
        read,
        decide,
    }
}

/// Runs every thread of the processes `pids` on the CPUs `cpus` (taskset's list).
fn pin(pids: &[u32], cpus: &str) {
    for pid in pids {
        let status = std::process::Command::new("taskset")
            .args(["-a", "-p", "-c", cpus, &pid.to_string()])
            .stdout(std::process::Stdio::null())
            .status()
            .expect("taskset (util-linux)");
        assert!(status.success(), "taskset -a -p -c {cpus} {pid}");
    }
}

/// Prints the `/mutate` row from [`mutate_reviews`]' answer, and where berth's
/// CPU time per review goes beyond the floor's: reading the review, deciding and
/// answering it, and berth's live process around that.
fn print_reviews(reviews: Reviews) {
    let Reviews {
        bytes,
        berth,
        floor,
        read,
        decide,
    } = reviews;
    println!(
        "/mutate, a {} kB Deployment pod, {REVIEW_CONNECTIONS} HTTP/2 connections with {REVIEW_STREAMS} in flight on each for {} s \
         in {REVIEW_TURNS} turns, each webhook on one core, the load generator on the other:",
        bytes / 1000,
        REVIEW_ROUND.as_secs()
    );
    println!(
        "berth {:.0} reviews/s, the minimal webhook {:.0}/s: {:.2}x (target ≥ 0.6x)",
        berth.per_second(),
        floor.per_second(),
        berth.per_second() / floor.per_second()
    );
    let cpu = |served: &Served| served.cpu_micros();
    println!(
        "between them: the floor reading each review as berth does {:.0}/s ({:.2}x), \
         berth's router over a fixed state {:.0}/s ({:.2}x)",
        read.per_second(),
        read.per_second() / floor.per_second(),
        decide.per_second(),
        decide.per_second() / floor.per_second(),
    );
    println!(
        "CPU per review: the floor {:.1} µs, berth {:.1} µs ({:.2}x of berth's); beyond the \
         floor's: reading {:+.1} µs, deciding and answering {:+.1} µs, berth's live process \
         {:+.1} µs",
        cpu(&floor),
        cpu(&berth),
        cpu(&floor) / cpu(&berth),
        cpu(&read) - cpu(&floor),
        cpu(&decide) - cpu(&read),
        cpu(&berth) - cpu(&decide),
    );
    println!(
        "each server's use of its core under load: the floor {:.2}, berth {:.2}, the reading \
         floor {:.2}, berth's router {:.2}",
        floor.core_use(),
        berth.core_use(),
        read.core_use(),
        decide.core_use(),
    );
    println!(
        "write calls per review (each a TLS record and a trip into the kernel): the floor \
         {:.2}, berth {:.2}, the reading floor {:.2}, berth's router {:.2}",
        floor.writes_per_review(),
        berth.writes_per_review(),
        read.writes_per_review(),
        decide.writes_per_review(),
    );
}

/// How long each round of pod creates runs.
const CREATE_ROUND: Duration = Duration::from_secs(15);

/// Pod creates per second, in two namespaces (one opted into berth's cdn policy),
/// with: berth as shipped (its mutating webhook and admission policies); its
/// mutating webhook alone; the minimal webhook registered the same way in its
/// place; nothing. `BENCH_ROUNDS` rounds of each, rotated; the rate is over all
/// of a configuration's rounds. Puts berth's configuration back afterwards.
async fn creates_per_second(berth: &Berth, client: &Client) -> Vec<(String, f64)> {
    berth
        .cluster
        .apply(&std::fs::read_to_string(support::repo_root().join("policies/cdn.yaml")).unwrap());
    let opted = fresh_namespace(client, "bench-creates-opted").await;
    let probe = common::pod("probe", "example/cdn-uploader:1");
    opt_in(client, &opted, "cdn", &probe, LIMIT).await;
    let plain = fresh_namespace(client, "bench-creates").await;
    let namespaces = vec![opted, plain];

    let mutating = common::saved(berth, "mutatingwebhookconfiguration");
    let bindings = common::saved(berth, "validatingadmissionpolicybinding");
    // Serves until the end of this function.
    let floor = Floor::spawn(&berth.certs_dir(), &Stage::Uid);
    // berth's own configuration with the floor's url: the same rules, selectors,
    // conditions and timeout.
    let mut floor_config = mutating["items"][0].clone();
    floor_config["metadata"] = json!({"name": "bench-floor"});
    for (i, hook) in floor_config["webhooks"]
        .as_array_mut()
        .unwrap()
        .iter_mut()
        .enumerate()
    {
        hook["name"] = json!(format!("hook{i}.floor.bench.berth.io"));
        hook["clientConfig"]["url"] = json!(format!("https://{}/mutate", floor.addr));
    }
    // Each configuration whole, so that rounds can come in any order: which of
    // berth's mutating webhook, its policy bindings and the floor are registered.
    let configurations = [
        (
            "berth as shipped: mutating webhook + admission policies",
            (true, true, false),
        ),
        ("berth's mutating webhook alone", (true, false, false)),
        ("the minimal webhook in its place", (false, false, true)),
        ("nothing", (false, false, false)),
    ];
    let configure = |(berth_hook, policies, floor_hook): (bool, bool, bool)| {
        let delete = |kind: &str, name: &str| {
            berth
                .cluster
                .kubectl_ok(&["delete", kind, name, "--ignore-not-found"]);
        };
        if berth_hook {
            common::put_back(berth, &mutating);
        } else {
            delete("mutatingwebhookconfiguration", "berth");
        }
        if policies {
            common::put_back(berth, &bindings);
        } else {
            for binding in ["berth-pools", "berth-bindings", "berth-records"] {
                delete("validatingadmissionpolicybinding", binding);
            }
        }
        if floor_hook {
            berth.cluster.apply(&floor_config.to_string());
        } else {
            delete("mutatingwebhookconfiguration", "bench-floor");
        }
    };
    // Rounds rotated as in the side-by-side rows: whatever the apiserver is still
    // doing from the round before (deleting its pods) falls on each in turn.
    let mut created = [0u64; 4];
    for round in 0..rounds() {
        for turn in 0..configurations.len() {
            let which = (round + turn) % configurations.len();
            configure(configurations[which].1);
            // Configuration reaches the apiserver's admission chain within a moment.
            tokio::time::sleep(Duration::from_secs(3)).await;
            let tag = format!("{round}-{which}");
            common::create_for(
                client,
                &namespaces,
                &format!("warm{tag}"),
                Duration::from_secs(2),
            )
            .await;
            let (count, _) =
                common::create_for(client, &namespaces, &format!("r{tag}"), CREATE_ROUND).await;
            created[which] += count;
            common::clear(client, &namespaces).await;
        }
    }
    let seconds = CREATE_ROUND.as_secs_f64() * rounds() as f64;
    let rates: Vec<(String, f64)> = configurations
        .iter()
        .zip(created)
        .map(|((name, _), count)| (name.to_string(), count as f64 / seconds))
        .collect();
    configure(configurations[0].1);
    // The cdn pool would share node2 with the pool row's.
    berth
        .cluster
        .kubectl_ok(&["delete", "placementpolicy", "cdn"]);
    tokio::time::sleep(Duration::from_secs(3)).await;
    rates
}

struct Row {
    what: String,
    berth: Duration,
    other: Option<(String, Duration)>,
    plain: Option<Duration>,
    target: String,
    cpu: f64,
    /// berth's peak RSS once the row is done (MiB): which row raised it.
    peak_rss: f64,
}

impl Row {
    fn print(&self) {
        let secs = |d: &Duration| format!("{:.2} s", d.as_secs_f64());
        let (other, ratio) = match &self.other {
            Some((name, t)) => (
                format!("{} ({name})", secs(t)),
                format!("{:.2}x", self.berth.as_secs_f64() / t.as_secs_f64()),
            ),
            None => ("-".into(), "-".into()),
        };
        let plain = self.plain.as_ref().map(secs).unwrap_or_else(|| "-".into());
        println!(
            "| {} | {} | {} | {} | {} | {} | {:.1} | {:.0} |",
            self.what,
            secs(&self.berth),
            other,
            plain,
            ratio,
            self.target,
            self.cpu,
            self.peak_rss
        );
    }
}

/// How many single changes the latency row makes (each a pod bound, then deleted).
const CHANGES: usize = 40;

/// The time from one change to its node to berth's label on that node, `CHANGES`
/// times each way: an `a` pod created already bound to a node (nodeName: no
/// scheduler in the way) until the node carries the `beside` anchor label, then
/// the pod deleted until the label is gone. `ns` opts into `beside`.
async fn change_latencies(client: &Client, ns: &str, node_count: usize) -> Vec<Duration> {
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    let nodes: Api<Node> = Api::all(client.clone());
    let label = berth::names::anchor_label("beside");
    let has_label = |node: Node| node.metadata.labels.is_some_and(|l| l.contains_key(&label));
    let mut latencies = Vec::new();
    for i in 0..CHANGES {
        let node = format!("node{}", node_count - i);
        let mut pod = test_pod(&format!("change-{i}"), json!({"app": "a"}), json!({}));
        pod.spec.as_mut().expect("spec").node_name = Some(node.clone());
        for wanted in [true, false] {
            let started = Instant::now();
            if wanted {
                pods.create(&Default::default(), &pod)
                    .await
                    .expect("create");
            } else {
                let now = DeleteParams {
                    grace_period_seconds: Some(0),
                    ..DeleteParams::default()
                };
                pods.delete(&format!("change-{i}"), &now)
                    .await
                    .expect("delete");
            }
            loop {
                let labelled = nodes.get(&node).await.map(has_label).unwrap_or(!wanted);
                if labelled == wanted {
                    break;
                }
                assert!(started.elapsed() < LIMIT, "{node}: label never {wanted}");
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            latencies.push(started.elapsed());
        }
    }
    latencies.sort();
    latencies
}

/// berth's node writes so far (labels and taints).
fn node_writes(berth: &Berth) -> f64 {
    ["labels", "taints"]
        .iter()
        .filter_map(|kind| berth.metric(&format!("berth_node_writes_total{{kind=\"{kind}\"}}")))
        .sum()
}

/// Prints a row as soon as it is measured (a later row that fails keeps it), and
/// keeps it for the table at the end.
fn record(rows: &mut Vec<Row>, row: Row) {
    row.print();
    rows.push(row);
}

#[tokio::main]
async fn main() {
    // `cargo test --all-targets` builds benches and runs them as tests; this one
    // needs minutes and 1,000 nodes, so it runs only under `cargo bench`.
    if !std::env::args().any(|a| a == "--bench") {
        return;
    }
    if minimal_webhook::serve_if_asked().await {
        return;
    }
    let node_count = env_number("BENCH_NODES", 1000);
    let exclusion = env_number("BENCH_EXCLUSION_PODS", 200);
    let ordinary = env_number("BENCH_ORDINARY_PODS", 800);
    let nodes = Nodes {
        count: node_count as u32,
        prefix: "node",
    };
    let started = Instant::now();
    let resync = RESYNC.as_secs().to_string();
    // Node Leases renewed at a kubelet's pace would take the 2 cores from 2,000
    // nodes on: the same 200 renewals a second at most.
    let lease = (node_count / 25).max(40).to_string();
    if std::env::var("BENCH_ROWS").as_deref() == Ok("room") {
        let up = ["--node-lease-seconds", lease.as_str()];
        let cluster = support::TestCluster::shared_with(nodes, &up);
        room::run(cluster, node_count, || {
            Berth::shared_with(nodes, &up, &["--resync-seconds", &resync])
        })
        .await;
        return;
    }
    let berth = Berth::shared_with(
        nodes,
        &["--node-lease-seconds", &lease],
        &["--resync-seconds", &resync],
    );
    println!(
        "cluster with {node_count} nodes and berth up in {:.0} s",
        started.elapsed().as_secs_f64()
    );
    let pid = berth.pid();
    let client = berth.cluster.client().await;
    // Ten seconds for the first lists' garbage to go back to the system.
    tokio::time::sleep(Duration::from_secs(10)).await;
    let cached_rss = format!(
        "berth's RSS with {node_count} nodes cached, idle before the first row: {:.0} MiB (target ≤ 64 MiB)",
        memory_mib(pid, "VmRSS")
    );
    println!("{cached_rss}");
    let mut rows = Vec::new();
    if std::env::var("BENCH_ROWS").as_deref() == Ok("mutate") {
        print_reviews(mutate_reviews(berth, &client, node_count).await);
        println!("berth's peak RSS: {:.0} MiB", peak_rss_mib(pid));
        return;
    }
    // First, while the cluster holds none of the rows' pods (whose status kwok
    // keeps up, on the webhooks' core too): /mutate itself, no apiserver (a
    // Deployment's pod in a namespace opted into cdn, against berth and against the
    // minimal webhook).
    let only_exclusion = std::env::var("BENCH_ROWS").as_deref() == Ok("exclusion");
    let quiet = if only_exclusion {
        None
    } else {
        let reviews = mutate_reviews(berth, &client, node_count).await;
        println!();
        Some((reviews, peak_rss_mib(pid)))
    };
    let mut cpu_mark = cpu_seconds(pid);
    let mut cpu_since = || {
        let now = cpu_seconds(pid);
        let spent = now - cpu_mark;
        cpu_mark = now;
        spent
    };

    // Exclusion: pods that must avoid each other, created at once.
    let selector = |app: &str| json!({"matchLabels": {"app": app}});
    apply_policy(
        berth,
        "apart",
        json!({"podSelector": selector("apart"), "avoid": selector("apart")}),
    );
    let apart_ns = opted(&client, "bench-apart", "apart", "apart").await;
    let anti_ns = fresh_namespace(&client, "bench-anti").await;
    let plain_ns = fresh_namespace(&client, "bench-plain").await;
    let anti = json!({"affinity": {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
        {"labelSelector": selector("anti"), "topologyKey": "kubernetes.io/hostname"}]}}});
    let apart = Contender::timed(&apart_ns, pods("apart", exclusion, &json!({})));
    let native = Contender::timed(&anti_ns, pods("anti", exclusion, &anti));
    let plain = Contender::timed(&plain_ns, pods("plain", exclusion, &json!({})));
    let ([berth_time, native_time, plain_time], cpu) =
        side_by_side(&client, pid, [&apart, &native, &plain]).await;
    record(
        &mut rows,
        Row {
            what: format!("{exclusion} pods that must avoid each other, at once"),
            berth: berth_time,
            other: Some(("required podAntiAffinity".into(), native_time)),
            plain: Some(plain_time),
            target: "≤ 1.0x".into(),
            cpu,
            peak_rss: peak_rss_mib(pid),
        },
    );
    let Some((reviews, after_reviews)) = quiet else {
        println!("berth's peak RSS: {:.0} MiB", peak_rss_mib(pid));
        return;
    };

    // Ordinary pods in a cluster holding berth's exclusion pods, the native ones,
    // or neither.
    let ordinary_ns = fresh_namespace(&client, "bench-ordinary").await;
    let ordinary_pods = pods("o", ordinary, &json!({}));
    let beside = |first: &Contender| Contender {
        setup: vec![first.timed.clone()],
        timed: (ordinary_ns.clone(), ordinary_pods.clone()),
    };
    let alone = Contender::timed(&ordinary_ns, ordinary_pods.clone());
    let ([beside_berth, beside_native, alone], cpu) =
        side_by_side(&client, pid, [&beside(&apart), &beside(&native), &alone]).await;
    record(
        &mut rows,
        Row {
            what: format!("{ordinary} ordinary pods beside {exclusion} exclusion pods"),
            berth: beside_berth,
            other: Some(("beside native anti-affinity pods".into(), beside_native)),
            plain: Some(alone),
            target: format!(
                "≤ 1.05x of none ({:.2}x)",
                beside_berth.as_secs_f64() / alone.as_secs_f64()
            ),
            cpu,
            peak_rss: peak_rss_mib(pid),
        },
    );

    // Co-location: pods that must sit beside one of the `a` pods (see `anchors_for`),
    // placed before each round.
    apply_policy(
        berth,
        "beside",
        json!({"podSelector": selector("beside"), "colocateWith": selector("a")}),
    );
    let anchors = anchors_for(exclusion);
    let beside_ns = opted(&client, "bench-beside", "beside", "beside").await;
    let affinity_ns = fresh_namespace(&client, "bench-affinity").await;
    let affinity = json!({"affinity": {"podAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
        {"labelSelector": selector("a"), "topologyKey": "kubernetes.io/hostname"}]}}});
    let near = |ns: &str, app: &str, extra: &Value| Contender {
        setup: vec![(ns.to_owned(), pods("a", anchors, &json!({})))],
        timed: (ns.to_owned(), pods(app, exclusion, extra)),
    };
    let ([berth_time, native_time, plain_time], cpu) = side_by_side(
        &client,
        pid,
        [
            &near(&beside_ns, "beside", &json!({})),
            &near(&affinity_ns, "near", &affinity),
            &plain,
        ],
    )
    .await;
    record(
        &mut rows,
        Row {
            what: format!("{exclusion} pods beside one of {anchors} `a` pods"),
            berth: berth_time,
            other: Some(("required podAffinity".into(), native_time)),
            plain: Some(plain_time),
            target: "≤ 1.0x".into(),
            cpu,
            peak_rss: peak_rss_mib(pid),
        },
    );

    // One change at a time: a pod bound or deleted, until its node shows it.
    cpu_since();
    let latencies = change_latencies(&client, &beside_ns, node_count).await;
    let p99 = latencies[(latencies.len() * 99).div_ceil(100) - 1];
    let p50 = latencies[latencies.len() / 2];
    record(
        &mut rows,
        Row {
            what: format!(
                "one pod bound or deleted, until its node's label follows ({} changes, p50 {} ms)",
                latencies.len(),
                p50.as_millis()
            ),
            berth: p99,
            other: None,
            plain: None,
            target: "p99 ≤ 1 s".into(),
            cpu: cpu_since(),
            peak_rss: peak_rss_mib(pid),
        },
    );

    // Pod creates through the apiserver (berth's webhook, the floor, none), last of
    // the timed rows: their rounds create and delete tens of thousands of pods, and
    // the apiserver is still busy with them for minutes (the first exclusion round
    // after them took 292 s once).
    let creates = creates_per_second(berth, &client).await;
    println!();

    // A dedicated pool over every node.
    cpu_since();
    let pool_time = pool_over_every_node(berth, &client, node_count).await.nodes;
    let pool_cpu = cpu_since();

    // Nothing changes for longer than a resync: berth must write nothing.
    let writes = node_writes(berth);
    let passes = berth.metric("berth_reconciles_total").unwrap_or(0.0);
    tokio::time::sleep(RESYNC + Duration::from_secs(3)).await;
    let idle_writes = node_writes(berth) - writes;
    let idle_passes = berth.metric("berth_reconciles_total").unwrap_or(0.0) - passes;
    record(
        &mut rows,
        Row {
            what: format!(
                "a dedicated pool over all {node_count} nodes, until labelled and tainted"
            ),
            berth: pool_time,
            other: None,
            plain: None,
            target: "≤ 10 s".into(),
            cpu: pool_cpu,
            peak_rss: peak_rss_mib(pid),
        },
    );

    println!();
    println!("{node_count} nodes; berth: the release build `cargo bench` makes");
    println!(
        "| what | berth | the alternative | no constraint | ratio | target | berth CPU s | berth peak RSS MiB |"
    );
    println!("|---|---|---|---|---|---|---|---|");
    for row in &rows {
        row.print();
    }
    println!();
    print_reviews(reviews);
    println!("berth's peak RSS once the /mutate row was done: {after_reviews:.0} MiB");
    println!();
    println!(
        "Pod creates through the apiserver, {} at a time, {} rotated rounds of {} s each:",
        common::CONCURRENCY,
        rounds(),
        CREATE_ROUND.as_secs()
    );
    println!("| admission | creates/s |");
    println!("|---|---:|");
    for (name, rate) in &creates {
        println!("| {name} | {rate:.0} |");
    }
    let ratio = creates[1].1 / creates[2].1;
    println!(
        "berth's webhook / the minimal webhook: {ratio:.2}x (target ≥ 0.95x); with nothing: {:.2}x",
        creates[1].1 / creates[3].1
    );
    println!();
    println!(
        "An idle {} s with every node in the pool: {idle_passes:.0} controller passes, {idle_writes:.0} node writes (target 0)",
        (RESYNC + Duration::from_secs(3)).as_secs()
    );
    println!("{cached_rss}");
    println!(
        "berth's peak RSS over the run, with every pod of the rows cached: {:.0} MiB",
        peak_rss_mib(pid)
    );
}
