//! Decision + patch for a typical Deployment pod (5–8 KB of JSON, read into
//! berth's view of it) against 1, 20 and 200 policies; with 20 policies and 1,000
//! or 5,000 nodes passed, as the webhook passes its node cache; and 20 plus a
//! group policy (gang, ranks, queue) that applies: what the webhook spends per
//! admission, TLS and HTTP aside. Then the
//! whole `/mutate` review as the handler runs it, from the request body's bytes to
//! the response's, with 0, 1,000 and 5,000 nodes in the webhook's node cache.

use std::hint::black_box;

use axum::Router;
use axum::body::{Body, Bytes};
use axum::http::Request;
use berth::admission::handlers::router;
use berth::names::IMAGES_ANNOTATION_PREFIX;
use berth::objects::NodeIndex;
use berth::objects::PodObject;
use berth::placement::namespace::NamespaceInfo;
use berth::placement::{Input, Requester, build_patch, decide};
use berth::policy::{PlacementPolicy, PolicySet};
use criterion::{BenchmarkId, Criterion, criterion_group, criterion_main};
#[path = "common/fixed_state.rs"]
mod fixed_state;
#[path = "common/typical_pod.rs"]
mod typical_pod;
use fixed_state::{node_cache, review_state};
use serde_json::json;
use tower::ServiceExt;
use typical_pod::{typical_pod, typical_review};

/// `n` policies of every kind; the namespace opts into the first three, and every
/// tenth selects namespaces by label, so matching has real work to do.
fn policies(n: usize) -> Vec<PlacementPolicy> {
    (0..n)
        .map(|i| {
            let mut spec = match i % 4 {
                0 => json!({"images": ["*cdn*", "registry.example.com/cdn/*"], "pool": {"nodeNames": [format!("node{i}")]}}),
                1 => json!({"images": ["*cuda*"], "nodeAffinity": {"required": [{"key": "gpu", "operator": "In", "values": ["A100"]}]}}),
                2 => json!({"podSelector": {"matchLabels": {"app": "uploader"}}, "avoid": {"matchLabels": {"app": "uploader"}}}),
                _ => json!({"images": ["docker.io/library/nginx:*"], "pool": {"nodeSelector": {"matchLabels": {"pool": format!("p{i}")}}, "placement": "Preferred", "weight": 40}}),
            };
            if i % 10 == 9 {
                spec["namespaceSelector"] = json!({"matchLabels": {"team": "edge"}});
            }
            serde_json::from_value(json!({
                "apiVersion": "berth.io/v1alpha1", "kind": "PlacementPolicy",
                "metadata": {"name": format!("policy-{i}")}, "spec": spec
            }))
            .expect("bench policy")
        })
        .collect()
}

/// One admission as the webhook makes it, once the pod is read into its view:
/// decide, then build the patch.
fn admit(pod: &PodObject, namespace: &NamespaceInfo, set: &PolicySet, nodes: Option<&NodeIndex>) {
    let input = Input {
        pod,
        namespace,
        policies: set,
        nodes,
        requester: Requester::Other,
        groups: Default::default(),
    };
    let decision = decide(black_box(&input));
    black_box(build_patch(pod, &decision.grants));
}

/// Rounds each summary line times.
const ROUNDS: u32 = 20_000;

/// Seconds per call of `f`, over [`ROUNDS`] calls.
fn seconds_per_round(mut f: impl FnMut()) -> f64 {
    let start = std::time::Instant::now();
    for _ in 0..ROUNDS {
        f();
    }
    (start.elapsed() / ROUNDS).as_secs_f64()
}

fn bench(c: &mut Criterion) {
    let pod = typical_pod();
    let size = serde_json::to_vec(&pod).unwrap().len();
    assert!(
        (5_000..=8_192).contains(&size),
        "the typical pod is {size} bytes"
    );
    println!("typical pod: {size} bytes of JSON");
    let json = pod;
    let pod = PodObject::read(&json).expect("the typical pod reads");

    let mut namespace = NamespaceInfo::new("default");
    namespace.labels.insert("team".into(), "edge".into());
    namespace.annotations.insert(
        "berth.io/policies".into(),
        "policy-0, policy-1, policy-2".into(),
    );

    let sets: Vec<(usize, PolicySet)> = [1, 20, 200]
        .into_iter()
        .map(|n| {
            let (set, errors) = PolicySet::compile(&policies(n));
            assert!(errors.is_empty());
            (n, set)
        })
        .collect();

    let mut group = c.benchmark_group("decide_and_patch");
    for (n, set) in &sets {
        group.bench_with_input(BenchmarkId::from_parameter(n), set, |b, set| {
            b.iter(|| admit(&pod, &namespace, set, None))
        });
    }
    group.finish();

    // A plain summary with ratios to the one-policy case, so the cost of more
    // policies reads at a glance. Only under `cargo bench`: `cargo test` runs each
    // benchmark once as a smoke test, and this loop would only slow it down.
    if !std::env::args().any(|a| a == "--bench") {
        return;
    }
    admit(&pod, &namespace, &sets[0].1, None); // warm the caches before the first timing
    let times: Vec<(usize, f64)> = sets
        .iter()
        .map(|(n, set)| (*n, seconds_per_round(|| admit(&pod, &namespace, set, None))))
        .collect();
    for (n, t) in &times {
        println!(
            "summary: {n:>3} policies: {:>6.1} µs per admission, {:.2}x of 1 policy",
            t * 1e6,
            t / times[0].1
        );
    }

    // A namespace that names image patterns of its own for a policy: the webhook
    // keeps each namespace until it changes, its annotations read (the globs
    // compiled) once; a fresh copy per pod reads them per pod, as berth did before.
    let mut patterned = namespace.clone();
    patterned.annotations.insert(
        format!("{IMAGES_ANNOTATION_PREFIX}policy-0"),
        "*cdn*, registry.example.com/**, ghcr.io/*/uploader".into(),
    );
    let kept = seconds_per_round(|| admit(&pod, &patterned, &sets[1].1, None));
    let fresh = seconds_per_round(|| admit(&pod, &patterned.clone(), &sets[1].1, None));
    println!(
        "summary:  20 policies, a namespace with image patterns: {:>6.1} µs per admission read once, \
         {:>6.1} µs read per pod ({:.2}x)",
        kept * 1e6,
        fresh * 1e6,
        fresh / kept
    );

    // Nodes passed as the webhook passes them: its whole node cache. The typical
    // pod's image matches policy-0's pool (node0), so the decision also checks that
    // some node of the pool fits the pod. The other nodes' names sort before node0,
    // so a scan of the cache in order would meet the pool's node last.
    for count in [1_000usize, 5_000] {
        let nodes = node_cache(count, "node0");
        let t = seconds_per_round(|| admit(&pod, &namespace, &sets[1].1, Some(&nodes)));
        println!(
            "summary:  20 policies, {count} nodes passed (a pool pod): {:>6.1} µs per admission, {:.2}x of no nodes",
            t * 1e6,
            t / times[1].1
        );
    }

    // Groups: the same 20 policies, the namespace also opted into one with a gang,
    // ranks and a queue that applies to this pod (gate, rank gate, PriorityClass
    // and priority in the patch).
    let mut list = policies(20);
    list.push(
        serde_json::from_value(json!({
            "apiVersion": "berth.io/v1alpha1", "kind": "PlacementPolicy",
            "metadata": {"name": "training"},
            "spec": {"podSelector": {"matchLabels": {"app": "uploader"}},
                     "gang": {}, "startOrder": {}, "queue": {}}
        }))
        .expect("group policy"),
    );
    let (with_groups, errors) = PolicySet::compile(&list);
    assert!(errors.is_empty());
    let mut grouped = json.clone();
    grouped["metadata"]["labels"]["podGroup"] = json!("resnet");
    grouped["metadata"]["labels"]["minAvailable"] = json!("8");
    grouped["metadata"]["labels"]["berth.io/rank"] = json!("1");
    grouped["metadata"]["labels"]["groupPriority"] = json!("5");
    let grouped = PodObject::read(&grouped).expect("the grouped pod reads");
    let mut opted = namespace.clone();
    opted.annotations.insert(
        "berth.io/policies".into(),
        "policy-0, policy-1, policy-2, training".into(),
    );
    let t = seconds_per_round(|| admit(&grouped, &opted, &with_groups, None));
    println!(
        "summary:  20 policies + a gang/rank/queue policy that applies: {:>6.1} µs per admission, {:.2}x of 20 policies",
        t * 1e6,
        t / times[1].1
    );
}

/// How many nodes the webhook's cache holds in the review bench.
const CACHED_NODES: [usize; 3] = [0, 1_000, 5_000];

/// One review through the router: the response body's bytes.
async fn post_review(app: &Router, body: &Bytes) -> Bytes {
    let request = Request::post("/mutate")
        .header("content-type", "application/json")
        .body(Body::from(body.clone()))
        .expect("request");
    let response = app.clone().oneshot(request).await.expect("infallible");
    axum::body::to_bytes(response.into_body(), usize::MAX)
        .await
        .expect("response body")
}

/// The whole `/mutate` review, body bytes in, response bytes out (TLS and HTTP/2
/// framing aside), with 0, 1,000 and 5,000 nodes cached: a review should cost the
/// same whatever the size of the cluster.
fn review(c: &mut Criterion) {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .expect("runtime");
    let body = Bytes::from(typical_review("bench").to_string());
    let apps: Vec<(usize, Router)> = CACHED_NODES
        .into_iter()
        .map(|n| (n, router(review_state(n, "bench"), 256)))
        .collect();
    // The review bench measures a pod that is patched, not one turned away early.
    let answer: serde_json::Value =
        serde_json::from_slice(&runtime.block_on(post_review(&apps[0].1, &body))).unwrap();
    assert_eq!(answer["response"]["allowed"], true, "{answer}");
    assert_eq!(answer["response"]["patchType"], "JSONPatch", "{answer}");

    let mut group = c.benchmark_group("mutate_review");
    for (n, app) in &apps {
        group.bench_with_input(BenchmarkId::new("nodes", n), app, |b, app| {
            b.iter(|| runtime.block_on(post_review(app, black_box(&body))))
        });
    }
    group.finish();

    if !std::env::args().any(|a| a == "--bench") {
        return;
    }
    let times: Vec<(usize, f64)> = apps
        .iter()
        .map(|(n, app)| {
            let t = seconds_per_round(|| {
                runtime.block_on(post_review(app, &body));
            });
            (*n, t)
        })
        .collect();
    for (n, t) in &times {
        println!(
            "summary: /mutate review ({} B), {n:>5} nodes cached: {:>6.1} µs, {:.2}x of no nodes",
            body.len(),
            t * 1e6,
            t / times[0].1
        );
    }
    // Where a review's time goes, first: reading it, against what any webhook
    // pays to find the uid in the same bytes (the minimal webhook's read).
    let read = seconds_per_round(|| {
        let read = berth::admission::review::parse(black_box(&body));
        black_box(read.expect("a review"));
    });
    let step = seconds_per_round(|| {
        let skipped: serde::de::IgnoredAny = serde_json::from_slice(black_box(&body)).unwrap();
        black_box(skipped);
    });
    // Its charge to the memory budget: one pass counting its items.
    let count = seconds_per_round(|| {
        black_box(berth::admission::review::read_cost(black_box(&body)));
    });
    println!(
        "summary: of that review, reading it: {:>6.1} µs; serde_json stepping through it, as \
         the minimal webhook does for its uid: {:>6.1} µs ({:.2}x); counting its items for \
         its charge: {:>6.2} µs; deciding and answering: {:>6.1} µs",
        read * 1e6,
        step * 1e6,
        read / step,
        count * 1e6,
        (times[0].1 - read - count) * 1e6
    );
}

criterion_group!(benches, bench, review);
criterion_main!(benches);
