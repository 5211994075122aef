//! The admission path on a real control plane, side by side in one run:
//!
//! 1. pod creates per second through the apiserver with berth's admission as
//!    shipped (the mutating webhook and the MutatingAdmissionPolicy
//!    berth-placement; the ValidatingAdmissionPolicies check pods), without
//!    berth-placement, with a validating webhook entry for pods added (what berth
//!    shipped before the policies), with the policies only, with berth-placement
//!    and the policies (berth down), and with nothing; ratios to the shipped
//!    set-up;
//! 2. berth's resident memory under a flood of 2 MB dry-run pods whose reviews
//!    are 12 MB each (the apiserver escapes every `<` to six bytes), and the
//!    latency of ordinary creates beside the flood.
//!
//! `make bench-admission`. Absolute figures depend on the machine; the ratios are
//! what to compare.

#[path = "common/mod.rs"]
mod common;
#[path = "../tests/support/mod.rs"]
mod support;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use common::{CONCURRENCY, clear, create_for, percentile, pod, put_back, saved};
use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, PostParams};
use serde_json::json;
use support::fleet::rss_kib;
use support::{Berth, Nodes};

const NODES: Nodes = Nodes {
    count: 20,
    prefix: "node",
};
const ROUND: Duration = Duration::from_secs(15);
const FLOOD: Duration = Duration::from_secs(20);

#[tokio::main]
async fn main() {
    let berth = Berth::shared(NODES);
    let client = berth.cluster.client().await;
    berth
        .cluster
        .apply(&std::fs::read_to_string(support::repo_root().join("policies/cdn.yaml")).unwrap());
    let opted = support::fresh_namespace(&client, "bench-opted").await;
    let probe = pod("probe", "example/cdn-uploader:1");
    support::opt_in(&client, &opted, "cdn", &probe, Duration::from_secs(60)).await;
    let plain = support::fresh_namespace(&client, "bench-plain").await;
    let namespaces = vec![opted, plain];

    let webhooks = [
        (
            "mutatingwebhookconfiguration",
            saved(berth, "mutatingwebhookconfiguration"),
        ),
        (
            "validatingwebhookconfiguration",
            saved(berth, "validatingwebhookconfiguration"),
        ),
    ];
    let policies = saved(berth, "validatingadmissionpolicybinding");
    let placement = saved(berth, "mutatingadmissionpolicybinding");
    // The pods entry berth's validating configuration had: the namespaces entry's
    // client config, for pods.
    let add_pods_entry = || {
        let mut entry = webhooks[1].1["items"][0]["webhooks"][0].clone();
        entry["name"] = json!("pods.validate.berth.io");
        entry["rules"] = json!([{"apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE", "UPDATE"],
            "resources": ["pods"], "scope": "Namespaced"}]);
        entry["matchConditions"] = json!([{"name": "not-from-nodes",
            "expression": "!('system:nodes' in request.userInfo.groups)"}]);
        let patch = json!([{"op": "add", "path": "/webhooks/0", "value": entry}]).to_string();
        berth.cluster.kubectl_ok(&[
            "patch",
            "validatingwebhookconfiguration",
            "berth",
            "--type=json",
            "-p",
            &patch,
        ]);
    };
    let delete = |kind: &str, name: &str| {
        berth.cluster.kubectl_ok(&["delete", kind, name]);
    };

    type Step<'a> = Box<dyn Fn() + 'a>;
    let rounds: Vec<(&str, Step)> = vec![
        (
            "mutating webhook + berth-placement + admission policies (shipped)",
            Box::new(|| {}),
        ),
        (
            "mutating webhook + admission policies (no berth-placement)",
            Box::new(|| delete("mutatingadmissionpolicybinding", "berth-placement")),
        ),
        (
            "the same + a validating webhook entry for pods",
            Box::new(add_pods_entry),
        ),
        (
            "admission policies only",
            Box::new(|| {
                delete("mutatingwebhookconfiguration", "berth");
                delete("validatingwebhookconfiguration", "berth");
            }),
        ),
        (
            "berth-placement + admission policies (berth down)",
            Box::new(|| put_back(berth, &placement)),
        ),
        (
            "nothing (no webhook, no policy)",
            Box::new(|| {
                delete("mutatingadmissionpolicybinding", "berth-placement");
                for binding in admission_policy_bindings() {
                    delete("validatingadmissionpolicybinding", &binding);
                }
            }),
        ),
    ];
    let mut rates = Vec::new();
    for (i, (name, step)) in rounds.iter().enumerate() {
        step();
        // Configuration reaches the apiserver's admission chain within a moment.
        tokio::time::sleep(Duration::from_secs(3)).await;
        create_for(
            &client,
            &namespaces,
            &format!("warm{i}"),
            Duration::from_secs(2),
        )
        .await;
        let (created, mut latencies) =
            create_for(&client, &namespaces, &format!("r{i}"), ROUND).await;
        latencies.sort_by(f64::total_cmp);
        let rate = created as f64 / ROUND.as_secs_f64();
        eprintln!("{name}: {rate:.0} creates/s");
        rates.push((
            name.to_string(),
            rate,
            percentile(&latencies, 0.5),
            percentile(&latencies, 0.99),
        ));
        clear(&client, &namespaces).await;
    }
    for (_, list) in &webhooks {
        put_back(berth, list);
    }
    put_back(berth, &policies);
    put_back(berth, &placement);
    tokio::time::sleep(Duration::from_secs(3)).await;

    // Two floods of dry-run pods, 32 at a time, beside ordinary creates: 2 MB of
    // '<' in an env var (12 MB reviews, which berth skips unread), and 1 MB of
    // one-letter node-affinity values (250,000 values berth must read).
    let big = {
        let mut p = pod("flood", "nginx:1.27");
        let env = json!([{"name": "X", "value": "<".repeat(2_000_000)}]);
        p.spec.as_mut().unwrap().containers[0].env = Some(serde_json::from_value(env).unwrap());
        p
    };
    let values = {
        let mut p = pod("flood", "nginx:1.27");
        let affinity = json!({"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
            "nodeSelectorTerms": [{"matchExpressions": [
                {"key": "example.com/x", "operator": "In", "values": vec!["a"; 250_000]}]}]}}});
        p.spec.as_mut().unwrap().affinity = Some(serde_json::from_value(affinity).unwrap());
        p
    };
    let floods = [
        (
            "2 MB of '<' (12 MB reviews)",
            flood(berth, &client, &namespaces, &big).await,
        ),
        (
            "1 MB of small values (250,000 to read)",
            flood(berth, &client, &namespaces, &values).await,
        ),
    ];

    let shipped = rates[0].1;
    println!(
        "\nPod creates through the apiserver, {CONCURRENCY} at a time for {}s each (berth release build):",
        ROUND.as_secs()
    );
    println!("| admission | creates/s | vs shipped | p50 ms | p99 ms |");
    println!("|---|---:|---:|---:|---:|");
    for (name, rate, p50, p99) in &rates {
        println!(
            "| {name} | {rate:.0} | {:.2}x | {p50:.1} | {p99:.1} |",
            rate / shipped
        );
    }
    let (shipped_p50, shipped_p99) = (rates[0].2, rates[0].3);
    let workers = std::env::var("BERTH_WORKER_THREADS").unwrap_or_else(|_| {
        format!(
            "{} (the cores)",
            std::thread::available_parallelism().map_or(1, |n| n.get())
        )
    });
    for (what, result) in &floods {
        println!(
            "\nFlood of dry-run pods with {what}, 32 at a time for {}s, berth with {workers} workers:",
            FLOOD.as_secs()
        );
        result.print(shipped_p50, shipped_p99);
    }
}

/// What one flood did.
struct Flood {
    answered: u64,
    busy: u64,
    failed: BTreeMap<String, u64>,
    baseline_kib: u64,
    peak_kib: u64,
    created: u64,
    latencies: Vec<f64>,
}

impl Flood {
    fn print(&self, shipped_p50: f64, shipped_p99: f64) {
        let mib = |kib: u64| kib as f64 / 1024.0;
        println!("| what | figure |");
        println!("|---|---:|");
        println!(
            "| dry-run pods checked and allowed by berth | {} |",
            self.answered
        );
        println!(
            "| denied by berth at its memory bound or out of time (fail closed) | {} |",
            self.busy
        );
        println!(
            "| failed otherwise | {} |",
            self.failed.values().sum::<u64>()
        );
        println!("| berth RSS before | {:.1} MiB |", mib(self.baseline_kib));
        println!(
            "| berth RSS peak during the flood | {:.1} MiB |",
            mib(self.peak_kib)
        );
        println!(
            "| ordinary creates beside the flood | {:.0}/s |",
            self.created as f64 / FLOOD.as_secs_f64()
        );
        println!(
            "| their p50 / p99 latency | {:.1} / {:.1} ms (without the flood {:.1} / {:.1} ms) |",
            percentile(&self.latencies, 0.5),
            percentile(&self.latencies, 0.99),
            shipped_p50,
            shipped_p99
        );
        for (reason, count) in &self.failed {
            println!("failed {count}x: {reason}");
        }
    }
}

/// Floods berth with dry-run copies of `big`, 32 at a time for `FLOOD`, beside
/// ordinary creates, sampling berth's RSS.
async fn flood(berth: &Berth, client: &kube::Client, namespaces: &[String], big: &Pod) -> Flood {
    let pid = berth.pid();
    let baseline = rss_kib(pid);
    let peak = Arc::new(AtomicU64::new(baseline));
    let done = Arc::new(AtomicBool::new(false));
    let sampler = {
        let (peak, done) = (peak.clone(), done.clone());
        tokio::spawn(async move {
            while !done.load(Ordering::Relaxed) {
                peak.fetch_max(rss_kib(pid), Ordering::Relaxed);
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        })
    };
    let flood_api: Api<Pod> = Api::namespaced(client.clone(), &namespaces[1]);
    let dry = PostParams {
        dry_run: true,
        ..PostParams::default()
    };
    let deadline = Instant::now() + FLOOD;
    let answered = Arc::new(AtomicU64::new(0));
    let busy = Arc::new(AtomicU64::new(0));
    let failed = Arc::new(std::sync::Mutex::new(BTreeMap::<String, u64>::new()));
    let flooding = futures::stream::iter(0u64..)
        .take_while(|_| futures::future::ready(Instant::now() < deadline))
        .map(|i| {
            let (api, dry, answered, busy, failed) = (
                flood_api.clone(),
                dry.clone(),
                answered.clone(),
                busy.clone(),
                failed.clone(),
            );
            let mut pod = big.clone();
            pod.metadata.name = Some(format!("flood-{i}"));
            async move {
                match api.create(&dry, &pod).await {
                    Ok(_) => {
                        answered.fetch_add(1, Ordering::Relaxed);
                    }
                    Err(e)
                        if e.to_string().contains("memory bound")
                            || e.to_string().contains("in time") =>
                    {
                        busy.fetch_add(1, Ordering::Relaxed);
                    }
                    Err(e) => {
                        // Counted by the first 100 characters, so that a reason
                        // repeated with different names is one row.
                        let reason: String = e.to_string().chars().take(100).collect();
                        *failed.lock().unwrap().entry(reason).or_default() += 1;
                    }
                }
            }
        })
        .buffer_unordered(32)
        .collect::<Vec<()>>();
    let (_, (created, mut latencies)) =
        tokio::join!(flooding, create_for(client, namespaces, "beside", FLOOD));
    done.store(true, Ordering::Relaxed);
    let _ = sampler.await;
    latencies.sort_by(f64::total_cmp);
    clear(client, namespaces).await;
    let failed = failed.lock().unwrap().clone();
    Flood {
        answered: answered.load(Ordering::Relaxed),
        busy: busy.load(Ordering::Relaxed),
        failed,
        baseline_kib: baseline,
        peak_kib: peak.load(Ordering::Relaxed),
        created,
        latencies,
    }
}

/// The names of the shipped ValidatingAdmissionPolicyBindings.
fn admission_policy_bindings() -> Vec<String> {
    berth::admission::cel::manifests(berth::names::BERTH_SERVICE_ACCOUNT)
        .split("---\n")
        .filter_map(|d| serde_yaml_ng::from_str::<serde_json::Value>(d).ok())
        .filter(|d| d["kind"] == "ValidatingAdmissionPolicyBinding")
        .filter_map(|d| d["metadata"]["name"].as_str().map(str::to_owned))
        .collect()
}
