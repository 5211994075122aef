//! Decision + patch for a typical Deployment pod (5–8 KB of JSON) against 1, 20 and
//! 200 policies; with 20 policies and 1,000 or 5,000 nodes passed, as the webhook
//! passes its node cache; and 20 plus a group policy (gang, ranks, queue) that
//! applies: what the webhook spends per admission, TLS and HTTP aside.

use std::hint::black_box;

use berth::placement::{Input, NamespaceInfo, NodeIndex, NodeInfo, Requester, build_patch, decide};
use berth::policy::{PlacementPolicy, PolicySet};
use criterion::{BenchmarkId, Criterion, criterion_group, criterion_main};
#[path = "common/typical_pod.rs"]
mod typical_pod;
use serde_json::json;
use typical_pod::typical_pod;

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

fn bench(c: &mut Criterion) {
    let pod = typical_pod();
    let size = serde_json::to_vec(&pod).unwrap().len();
    assert!(
        (5_000..=8_192).contains(&size),
        "the typical pod is {size} bytes"
    );
    println!("typical pod: {size} bytes of JSON");

    let mut namespace = NamespaceInfo::new("default");
    namespace.labels.insert("team".into(), "edge".into());
    namespace.annotations.insert(
        "berth.io/policies".into(),
        "policy-0, policy-1, policy-2".into(),
    );

    let admit = |set: &PolicySet| {
        let input = Input {
            pod: &pod,
            namespace: &namespace,
            policies: set,
            nodes: None,
            requester: Requester::Other,
            groups: Default::default(),
        };
        let decision = decide(black_box(&input));
        black_box(build_patch(&pod, &decision.grants))
    };
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
            b.iter(|| admit(set))
        });
    }
    group.finish();

    // A plain summary with ratios to the one-policy case, so the cost of more
    // policies reads at a glance. Only under `cargo bench`: `cargo test` runs each
    // benchmark once as a smoke test, and this loop would only slow it down.
    if !std::env::args().any(|a| a == "--bench") {
        return;
    }
    const ROUNDS: u32 = 20_000;
    let per_admission = |set: &PolicySet| {
        let start = std::time::Instant::now();
        for _ in 0..ROUNDS {
            admit(set);
        }
        start.elapsed() / ROUNDS
    };
    admit(&sets[0].1); // warm the caches before the first timing
    let times: Vec<(usize, f64)> = sets
        .iter()
        .map(|(n, set)| (*n, per_admission(set).as_secs_f64()))
        .collect();
    for (n, t) in &times {
        println!(
            "summary: {n:>3} policies: {:>6.1} µs per admission, {:.2}x of 1 policy",
            t * 1e6,
            t / times[0].1
        );
    }

    // Nodes passed as the webhook passes them: its whole node cache. The typical
    // pod's image matches policy-0's pool (node0), so the decision also checks that
    // some node of the pool fits the pod. The other nodes' names sort before node0,
    // so a scan of the cache in order would meet the pool's node last.
    for count in [1_000usize, 5_000] {
        let nodes: NodeIndex = (0..count)
            .map(|i| {
                let name = if i == 0 {
                    "node0".to_string()
                } else {
                    format!("n-{i:05}")
                };
                let labels = [
                    ("kubernetes.io/hostname", name.as_str()),
                    ("kubernetes.io/os", "linux"),
                    (
                        "topology.kubernetes.io/zone",
                        if i % 2 == 0 { "a" } else { "b" },
                    ),
                ]
                .into_iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect();
                let info = NodeInfo {
                    labels,
                    taints: Vec::new(),
                };
                (name, info)
            })
            .collect();
        let start = std::time::Instant::now();
        for _ in 0..ROUNDS {
            let input = Input {
                pod: &pod,
                namespace: &namespace,
                policies: &sets[1].1,
                nodes: Some(&nodes),
                requester: Requester::Other,
                groups: Default::default(),
            };
            let decision = decide(black_box(&input));
            black_box(build_patch(&pod, &decision.grants));
        }
        let t = (start.elapsed() / ROUNDS).as_secs_f64();
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
    let mut grouped = pod.clone();
    grouped["metadata"]["labels"]["podGroup"] = json!("resnet");
    grouped["metadata"]["labels"]["minAvailable"] = json!("8");
    grouped["metadata"]["labels"]["berth.io/rank"] = json!("1");
    grouped["metadata"]["labels"]["groupPriority"] = json!("5");
    let mut opted = namespace.clone();
    opted.annotations.insert(
        "berth.io/policies".into(),
        "policy-0, policy-1, policy-2, training".into(),
    );
    let start = std::time::Instant::now();
    for _ in 0..ROUNDS {
        let input = Input {
            pod: &grouped,
            namespace: &opted,
            policies: &with_groups,
            nodes: None,
            requester: Requester::Other,
            groups: Default::default(),
        };
        let decision = decide(black_box(&input));
        black_box(build_patch(&grouped, &decision.grants));
    }
    let t = (start.elapsed() / ROUNDS).as_secs_f64();
    println!(
        "summary:  20 policies + a gang/rank/queue policy that applies: {:>6.1} µs per admission, {:.2}x of 20 policies",
        t * 1e6,
        t / times[1].1
    );
}

criterion_group!(benches, bench);
criterion_main!(benches);
