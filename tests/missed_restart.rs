#![cfg(feature = "e2e")]
//! berth restarted in the middle of a scale-up, its controller back before its
//! webhook (as when every replica restarts and the leader acts before the Service
//! has a ready endpoint): with `onMissed: Evict`, every pod admitted without berth
//! is re-placed within 120 s of the webhook's return, and none is evicted while
//! the apiserver cannot reach the webhook. Its own cluster: the test kills berth.
//! Without the MutatingAdmissionPolicy `berth-placement`, which would place these
//! pods with berth down (as on a cluster before 1.36; `tests/placement_down.rs`).

mod support;

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::events::v1::Event;
use kube::api::{Api, ListParams};
use serde_json::json;
use support::fixtures::{self, policy};
use support::{Berth, Nodes, eventually, fresh_namespace, kubectl_with_input, opt_in, placed};

const NODES: Nodes = Nodes {
    count: 4,
    prefix: "node",
};
const WAIT: Duration = Duration::from_secs(120);
const REPLICAS: usize = 24;

/// A berth process the test started, killed when dropped.
struct Started(Child);

impl Drop for Started {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn deployment(ns: &str, replicas: usize) -> String {
    json!({"apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": "cdn", "namespace": ns},
        "spec": {"replicas": replicas, "selector": {"matchLabels": {"app": "cdn"}},
            "template": {"metadata": {"labels": {"app": "cdn"}},
                "spec": {"containers": [{"name": "c", "image": "example/cdn-uploader:1"}]}}}})
    .to_string()
}

fn apply(berth: &Berth, manifest: &str) {
    let out = kubectl_with_input(&berth.cluster.dir, &["apply", "-f", "-"], manifest);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The cdn pods not being deleted: how many, and how many carry berth's decision
/// and run on node2.
async fn placed_on_pool(api: &Api<Pod>) -> (usize, usize) {
    let list = api
        .list(&ListParams::default().labels("app=cdn"))
        .await
        .unwrap();
    let live: Vec<Pod> = list
        .items
        .into_iter()
        .filter(|p| p.metadata.deletion_timestamp.is_none())
        .collect();
    let on_pool = live
        .iter()
        .filter(|p| support::has_applied(p, "cdn"))
        .filter(|p| p.spec.as_ref().and_then(|s| s.node_name.as_deref()) == Some("node2"))
        .count();
    (live.len(), on_pool)
}

async fn evictions(client: &kube::Client, ns: &str) -> usize {
    Api::<Event>::namespaced(client.clone(), ns)
        .list(&ListParams::default().fields("reason=EvictedMissed"))
        .await
        .map(|l| l.items.len())
        .unwrap_or(0)
}

/// `args` with the value of `--metrics-addr` replaced by `addr`.
fn with_metrics_addr(args: &[String], addr: &str) -> Vec<String> {
    let mut out = args.to_vec();
    let at = out
        .iter()
        .position(|a| a == "--metrics-addr")
        .expect("berth-up passes --metrics-addr");
    out[at + 1] = addr.to_owned();
    out
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .unwrap()
        .port()
}

#[tokio::test]
async fn a_restart_whose_webhook_comes_back_last_re_places_every_missed_pod() {
    let berth = Berth::shared_without_placement_policy(NODES);
    let client = berth.cluster.client().await;
    berth.cluster.apply_policies(&[policy(
        "cdn",
        json!({"images": ["*cdn*"], "pool": {"nodeNames": ["node2"]}, "onMissed": "Evict"}),
    )]);
    let ns = fresh_namespace(&client, "restart").await;
    let probe = fixtures::pod("probe")
        .image("example/cdn-uploader:1")
        .build();
    opt_in(&client, &ns, "cdn", &probe, WAIT).await;
    let api: Api<Pod> = Api::namespaced(client.clone(), &ns);
    apply(berth, &deployment(&ns, 2));
    placed(&client, &ns, "app=cdn", 2, WAIT).await;

    // berth dies in the middle of the scale-up: what is created now is admitted
    // as written, off the pool.
    let pid = berth.pid();
    let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap();
    let args: Vec<String> = cmdline
        .split(|b| *b == 0)
        .filter(|a| !a.is_empty())
        .map(|a| String::from_utf8_lossy(a).into_owned())
        .collect();
    assert!(
        Command::new("kill")
            .args(["-KILL", &pid.to_string()])
            .status()
            .unwrap()
            .success()
    );
    eventually("berth gone", WAIT, || async {
        (!std::path::Path::new(&format!("/proc/{pid}")).exists()).then_some(())
    })
    .await;
    apply(berth, &deployment(&ns, REPLICAS));
    placed(&client, &ns, "app=cdn", REPLICAS, WAIT).await;
    let (_, on_pool) = placed_on_pool(&api).await;
    let missed = REPLICAS - on_pool;
    assert!(
        missed >= REPLICAS - 2,
        "{missed} pods admitted without berth"
    );

    // The controller comes back first; the webhook is still unreachable.
    let metrics_port = free_port();
    let log = std::fs::File::create(berth.cluster.dir.join("logs/berth-controller.log")).unwrap();
    let _controller = Started(
        Command::new(&args[0])
            .args(&with_metrics_addr(&args, &format!("127.0.0.1:{metrics_port}"))[1..])
            .arg("--no-webhook")
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap(),
    );
    // It leads and has looked at the missed pods (the policy's MissedPods
    // condition, written after the scan): either it probed the webhook path and
    // found it unreachable, or (berth before this test) it evicted a probe pod,
    // whose replacement came back without berth.
    eventually("the cdn policy's MissedPods condition", WAIT, || async {
        let out = berth.cluster.kubectl(&["get", "bpp", "cdn", "-o", "json"]);
        let object: serde_json::Value = serde_json::from_slice(&out.stdout).ok()?;
        object["status"]["conditions"]
            .as_array()?
            .iter()
            .any(|c| c["type"] == "MissedPods" && c["status"] == "True")
            .then_some(())
    })
    .await;
    let metrics = format!("http://127.0.0.1:{metrics_port}/metrics");
    let looked = eventually("the controller looked at the missed pods", WAIT, || async {
        let out = Command::new("curl")
            .args(["-s", "--max-time", "2", &metrics])
            .output()
            .ok()?;
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        let unreachable = support::samples(&text)
            .any(|(name, value)| name == "berth_webhook_reachable" && value == 0.0);
        if unreachable {
            return Some("the webhook path found unreachable");
        }
        let evicted = evictions(&client, &ns).await > 0;
        let (count, _) = placed_on_pool(&api).await;
        (evicted && count == REPLICAS).then_some("a probe evicted and replaced without berth")
    })
    .await;
    eprintln!("before the webhook's return: {looked}");
    let evicted_before = evictions(&client, &ns).await;

    // The webhook comes back.
    let log = std::fs::File::create(berth.cluster.dir.join("logs/berth-webhook.log")).unwrap();
    let _webhook = Started(
        Command::new(&args[0])
            .args(&with_metrics_addr(&args, "127.0.0.1:0")[1..])
            .arg("--no-controller")
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap(),
    );
    let returned = Instant::now();
    loop {
        let (count, on_pool) = placed_on_pool(&api).await;
        if count == REPLICAS && on_pool == REPLICAS {
            break;
        }
        assert!(
            returned.elapsed() < WAIT,
            "{on_pool} of {count} cdn pods on the pool {:?} after the webhook's return",
            returned.elapsed()
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let took = returned.elapsed();
    let evicted = evictions(&client, &ns).await;
    eprintln!(
        "{missed} missed pods re-placed {took:?} after the webhook's return; \
         {evicted_before} evicted before it, {evicted} in all"
    );
    assert_eq!(
        evicted_before, 0,
        "pods evicted while the apiserver could not reach the webhook"
    );
    assert_eq!(evicted, missed, "one eviction per missed pod");
}
