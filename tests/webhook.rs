#![cfg(feature = "e2e")]
//! The webhook on a real kube-apiserver: kube-apiserver calls the current berth
//! through the shipped webhook configurations (url clientConfig on 127.0.0.1).

mod support;

use std::sync::OnceLock;
use std::time::Duration;

use berth::names;
use k8s_openapi::api::core::v1::Pod;
use kube::Client;
use kube::api::{Api, PostParams};
use serde_json::json;
use support::fixtures;
use support::{Berth, Nodes, fresh_namespace, kubectl_with_input, samples};

const NODES: Nodes = Nodes {
    count: 4,
    prefix: "node",
};

/// berth with the example cdn policy installed, once per test binary.
fn berth() -> &'static Berth {
    static READY: OnceLock<()> = OnceLock::new();
    let berth = Berth::shared(NODES);
    READY.get_or_init(|| {
        let policy = support::repo_root().join("policies/cdn.yaml");
        let out = berth
            .cluster
            .kubectl(&["apply", "-f", policy.to_str().unwrap()]);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    });
    berth
}

/// A fresh namespace that opts into the cdn policy, once berth's webhook applies
/// it there (its namespace cache may lag the annotation).
async fn cdn_namespace(client: &Client, purpose: &str) -> String {
    let name = fresh_namespace(client, purpose).await;
    let probe = fixtures::pod("probe").image("example/cdn-probe:1").build();
    support::opt_in(client, &name, "cdn", &probe, Duration::from_secs(60)).await;
    name
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

#[tokio::test]
async fn server_side_dry_run_shows_berths_changes_and_writes_nothing() {
    let berth = berth();
    let client = berth.cluster.client().await;
    let ns = cdn_namespace(&client, "dry-run").await;
    let out = kubectl_with_input(
        &berth.cluster.dir,
        &[
            "apply",
            "--dry-run=server",
            "-o",
            "yaml",
            "-n",
            &ns,
            "-f",
            "-",
        ],
        &fixtures::pod("uploader")
            .image("example/cdn-uploader:1.0")
            .json()
            .to_string(),
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
    let shown = text(&out.stdout);
    assert!(
        shown.contains(&format!("{}: cdn", names::APPLIED_ANNOTATION)),
        "{shown}"
    );
    assert!(
        shown.contains(&format!("key: {}", names::POOL_LABEL)),
        "{shown}"
    );
    assert!(
        shown.contains(&format!("key: {}", names::POOL_TAINT)),
        "{shown}"
    );
    let pods: Api<Pod> = Api::namespaced(client, &ns);
    assert!(
        pods.get_opt("uploader").await.unwrap().is_none(),
        "dry-run wrote the pod"
    );
}

#[tokio::test]
async fn a_broken_namespace_annotation_is_refused_with_the_reason() {
    let berth = berth();
    let client = berth.cluster.client().await;
    let ns = fresh_namespace(&client, "broken").await;
    let broken = format!("{}=cdn,,gpu", names::POLICIES_ANNOTATION);
    let out = berth
        .cluster
        .kubectl(&["annotate", "namespace", &ns, &broken]);
    assert!(!out.status.success());
    let error = text(&out.stderr);
    assert!(
        error.contains(&format!(
            "denied the request: annotation {}: entry 2 is empty",
            names::POLICIES_ANNOTATION
        )),
        "{error}"
    );
}

#[tokio::test]
async fn kubectl_prints_berths_warnings() {
    let berth = berth();
    let client = berth.cluster.client().await;
    let ns = cdn_namespace(&client, "warnings").await;
    let forged = fixtures::pod("web")
        .spec(
            json!({"tolerations": [{"key": names::POOL_TAINT, "operator": "Equal",
            "value": "cdn", "effect": "NoSchedule"}]}),
        )
        .json();
    let out = kubectl_with_input(
        &berth.cluster.dir,
        &["apply", "-n", &ns, "-f", "-"],
        &forged.to_string(),
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(
        text(&out.stderr).contains(&format!(
            "Warning: removed toleration {}=cdn: the pod is not entitled to that pool",
            names::POOL_TAINT
        )),
        "{}",
        text(&out.stderr)
    );
    let pods: Api<Pod> = Api::namespaced(client, &ns);
    let pod = pods.get("web").await.unwrap();
    let tolerations = pod.spec.unwrap().tolerations.unwrap_or_default();
    assert!(
        tolerations
            .iter()
            .all(|t| t.key.as_deref() != Some(names::POOL_TAINT))
    );
}

#[tokio::test]
async fn kube_system_and_berths_own_namespace_are_never_sent_to_it() {
    let berth = berth();
    let client = berth.cluster.client().await;
    let forged = |ns: &str| {
        fixtures::pod("forged")
            .image("nginx")
            .metadata(json!({"namespace": ns}))
            .spec(
                json!({"tolerations": [{"key": names::POOL_TAINT, "operator": "Equal",
                "value": "cdn", "effect": "NoSchedule"}]}),
            )
            .build()
    };
    let keeps_toleration = |pod: Pod| {
        let tolerations = pod.spec.unwrap().tolerations.unwrap_or_default();
        tolerations
            .iter()
            .any(|t| t.key.as_deref() == Some(names::POOL_TAINT))
    };
    // The control: a namespace that is sent to berth (and does not opt in, like
    // the two below) gets the forged toleration removed, so one kept below is a
    // pod berth never saw.
    let sent = fresh_namespace(&client, "sent").await;
    let pods: Api<Pod> = Api::namespaced(client.clone(), &sent);
    let created = pods
        .create(&PostParams::default(), &forged(&sent))
        .await
        .expect("created");
    assert!(
        !keeps_toleration(created),
        "berth kept a forged toleration in {sent}"
    );
    for ns in ["kube-system", "berth-system"] {
        let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
        let created = pods
            .create(&PostParams::default(), &forged(ns))
            .await
            .expect("created");
        assert!(keeps_toleration(created), "a pod in {ns} reached berth");
    }
}

/// The serial number of the certificate berth serves on a new connection.
fn served_serial(berth: &Berth) -> String {
    let script = format!(
        "openssl s_client -connect 127.0.0.1:{} </dev/null 2>/dev/null | openssl x509 -noout -serial",
        berth.port
    );
    let out = std::process::Command::new("bash")
        .args(["-c", &script])
        .output()
        .unwrap();
    text(&out.stdout).trim().to_owned()
}

/// The serial number of the certificate in `certs`' `tls.crt`.
fn file_serial(certs: &std::path::Path) -> String {
    let out = std::process::Command::new("openssl")
        .args(["x509", "-noout", "-serial", "-in"])
        .arg(certs.join("tls.crt"))
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", text(&out.stderr));
    text(&out.stdout).trim().to_owned()
}

#[tokio::test]
async fn a_certificate_rotated_during_a_request_stream_loses_no_request() {
    let berth = berth();
    let client = berth.cluster.client().await;
    let ns = cdn_namespace(&client, "rotation").await;
    let first_serial = served_serial(berth);
    assert!(first_serial.starts_with("serial="), "{first_serial}");

    // Four clients create pods (server-side dry-run) as fast as they can until the
    // certificate has been renewed three times and once replaced by a broken pair;
    // each step waits until berth has seen it, so no two coalesce.
    let done = std::sync::atomic::AtomicBool::new(false);
    // Answers so far, of all workers: each step waits for more of them, so
    // requests are in flight across every reload.
    let answered = std::sync::atomic::AtomicUsize::new(0);
    let stream = |worker: usize| {
        let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
        let done = &done;
        let answered = &answered;
        async move {
            let params = PostParams {
                dry_run: true,
                ..Default::default()
            };
            let mut mutated = 0;
            while !done.load(std::sync::atomic::Ordering::Acquire) {
                let pod = fixtures::pod(&format!("w{worker}-{mutated}"))
                    .image("example/cdn-uploader:1")
                    .build();
                let created = pods.create(&params, &pod).await.expect("request answered");
                let applied = created
                    .metadata
                    .annotations
                    .unwrap_or_default()
                    .remove(names::APPLIED_ANNOTATION);
                assert_eq!(
                    applied.as_deref(),
                    Some("cdn"),
                    "request {mutated} of worker {worker} was not mutated"
                );
                mutated += 1;
                answered.fetch_add(1, std::sync::atomic::Ordering::AcqRel);
            }
            mutated
        }
    };
    let certs = berth.certs_dir();
    let certs_arg = certs.to_string_lossy().into_owned();
    let logged = |line: &'static str, count: usize| async move {
        support::eventually(
            &format!("{count} x {line:?} in berth's log"),
            Duration::from_secs(30),
            || async { (berth.log().matches(line).count() >= count).then_some(()) },
        )
        .await
    };
    let reloaded = "serving certificate reloaded";
    let rejected = "new serving certificate rejected; the old one keeps serving";
    let more_answers = || async {
        let mark = answered.load(std::sync::atomic::Ordering::Acquire);
        support::eventually("8 more answers", Duration::from_secs(30), || async {
            (answered.load(std::sync::atomic::Ordering::Acquire) >= mark + 8).then_some(())
        })
        .await
    };
    let rotate = async {
        let before = berth.log().matches(reloaded).count();
        for round in 0..3 {
            more_answers().await;
            if round == 1 {
                // A broken pair: berth must keep serving the old one.
                let rejections = berth.log().matches(rejected).count();
                std::fs::write(
                    certs.join("tls.crt"),
                    "-----BEGIN CERTIFICATE-----\ngarbage\n",
                )
                .unwrap();
                logged(rejected, rejections + 1).await;
            }
            let out = berth.run(&["certs", "--out", &certs_arg]);
            assert!(out.status.success(), "{}", text(&out.stderr));
            logged(reloaded, before + round + 1).await;
        }
        more_answers().await;
        done.store(true, std::sync::atomic::Ordering::Release);
    };
    let (counts, ()) = tokio::join!(futures::future::join_all((0..4).map(stream)), rotate);
    assert!(
        counts.iter().all(|&c| c > 0),
        "every worker got answers: {counts:?}"
    );

    // berth serves the pair `berth certs` wrote last (a failed connection reads
    // as no serial at all).
    let last_serial = served_serial(berth);
    assert_ne!(
        first_serial, last_serial,
        "the served certificate did not change"
    );
    assert_eq!(
        last_serial,
        file_serial(&certs),
        "the newest pair is served"
    );
}

#[tokio::test]
async fn metrics_count_decisions_latency_and_certificate_expiry() {
    let berth = berth();
    let client = berth.cluster.client().await;
    // A policy no other test uses, so its counter moves only with this test.
    berth.cluster.apply_policies(&[fixtures::policy(
        "counted",
        json!({"images": ["*counted*"], "schedulerName": "counted-scheduler"}),
    )]);
    let ns = fresh_namespace(&client, "metrics").await;
    let mut probe = fixtures::pod("probe").image("example/counted:1").build();
    probe.metadata.namespace = Some(ns.clone());
    support::opt_in(&client, &ns, "counted", &probe, Duration::from_secs(60)).await;
    let decided = |metrics: &str| {
        metrics
            .lines()
            .find_map(|l| l.strip_prefix("berth_decisions_total{policy=\"counted\"} "))
            .map(|v| v.trim().parse::<f64>().unwrap())
    };
    // Every answer on /mutate, timed by outcome. The MutatingAdmissionPolicy
    // berth-placement runs first and places these pods as the webhook would, so
    // the webhook finds nothing to change: its answer is `unchanged`.
    let unchanged = |metrics: &str| {
        samples(metrics).find_map(|(sample, value)| {
            (sample
                == r#"berth_admission_duration_seconds_count{path="/mutate",outcome="unchanged"}"#)
                .then_some(value)
        })
    };
    let first = berth.metrics();
    let before = decided(&first).expect("the probes were counted");
    let unchanged_before = unchanged(&first).unwrap_or(0.0);
    for i in 0..3 {
        let out = kubectl_with_input(
            &berth.cluster.dir,
            &["apply", "--dry-run=server", "-n", &ns, "-f", "-"],
            &fixtures::pod(&format!("counted-{i}"))
                .image("example/counted:1")
                .json()
                .to_string(),
        );
        assert!(out.status.success(), "{}", text(&out.stderr));
    }
    let metrics = berth.metrics();
    assert_eq!(decided(&metrics), Some(before + 3.0), "{metrics}");
    // At least these three: the other tests of this file send pods too.
    let timed = unchanged(&metrics).expect("unchanged answers timed");
    assert!(
        timed >= unchanged_before + 3.0,
        "{timed} after {unchanged_before}"
    );
    let bucket =
        r#"berth_admission_duration_seconds_bucket{le="+Inf",path="/mutate",outcome="unchanged"}"#;
    assert!(
        samples(&metrics).any(|(sample, _)| sample == bucket),
        "missing {bucket} in:\n{metrics}"
    );
    // The served pair is berth-up's or a renewal's: `berth certs` makes it valid
    // for 365 days, and none is a day old.
    let day = 86_400.0;
    let expiry = samples(&metrics)
        .find_map(|(sample, value)| (sample == "berth_certificate_expiry_seconds").then_some(value))
        .expect("berth_certificate_expiry_seconds");
    assert!(
        (364.0 * day..=365.0 * day).contains(&expiry),
        "expires in {expiry} s"
    );
}
