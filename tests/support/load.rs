//! A bounded, self-stopping load of pod creates for the fault suite: a fixed rate
//! for a fixed time, spread over streams (a namespace and a pod shape each), each
//! stream keeping at most `window` of its pods (the oldest is deleted as a new one
//! is created, so exclusion pods never outnumber the nodes they need). Every
//! create's outcome is kept: the apiserver's answer, its latency, and, from the pod
//! the apiserver returns (what it stored), whether berth's decision is in it.
//!
//! A create that gets no answer at all (the apiserver is down or restarting) is
//! retried, as every controller retries, until a minute after the load ends; one
//! that is answered with an error is a failed create, with the answer kept.

use std::collections::{BTreeMap, VecDeque};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use berth::names;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::Pod;
use kube::Client;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use serde_json::{Value, json};

use super::fixtures;

/// The label every pod of the load carries, with the stream's name as value.
pub const STREAM_LABEL: &str = "berth.test/stream";
/// The label of every pod the suite makes (load, Deployment, anchors).
pub const LOAD_LABEL: &str = "berth.test/load";

/// One kind of pod in one namespace.
#[derive(Debug, Clone)]
pub struct Stream {
    pub name: &'static str,
    pub namespace: String,
    /// Share of the rate, against the other streams' weights.
    pub weight: u32,
    /// Live pods of this stream kept at most; the oldest goes as a new one comes.
    pub window: usize,
    /// The images the stream's pods take in turn.
    pub images: Vec<&'static str>,
    pub labels: Vec<(&'static str, &'static str)>,
    /// The policies berth must apply to every pod of the stream while they are in
    /// force (see [`InForce`]); in a namespace that opts into nothing, none.
    pub expects: Vec<&'static str>,
}

/// A Deployment the load scales between `low` and `high` replicas every `every`:
/// its pods are created by the ReplicaSet controller, as most pods are.
#[derive(Debug, Clone)]
pub struct Scale {
    pub namespace: String,
    pub deployment: String,
    pub low: i32,
    pub high: i32,
    pub every: Duration,
}

/// What to run.
#[derive(Debug, Clone)]
pub struct Load {
    /// Pod names start with it.
    pub tag: String,
    /// Creates per second.
    pub rate: f64,
    pub duration: Duration,
    pub streams: Vec<Stream>,
    pub scale: Option<Scale>,
}

/// When policies stopped being in force, as the test changed them: a pod whose
/// create was answered before then must carry the policy's decision.
#[derive(Debug, Clone, Default)]
pub struct InForce(Arc<Mutex<BTreeMap<String, Instant>>>);

impl InForce {
    /// `policy` is no longer in force from now on (deleted).
    pub fn ended(&self, policy: &str) {
        self.0
            .lock()
            .unwrap()
            .insert(policy.to_owned(), Instant::now());
    }

    /// `policy` is in force again (made again).
    pub fn restored(&self, policy: &str) {
        self.0.lock().unwrap().remove(policy);
    }

    /// Whether a pod admitted at `at` must carry `policy`.
    pub fn at(&self, policy: &str, at: Instant) -> bool {
        self.0
            .lock()
            .unwrap()
            .get(policy)
            .is_none_or(|end| at < *end)
    }
}

/// What happened to one load.
#[derive(Debug, Default, Clone)]
pub struct LoadReport {
    pub issued: u64,
    pub created: u64,
    /// Creates the apiserver answered with an error: (pod, the answer, seconds
    /// into the load when it was answered).
    pub failed: Vec<(String, String, f64)>,
    /// Creates that got no answer at first (the apiserver unreachable) and were
    /// sent again; each ended as counted in `created` or `failed`.
    pub retried: u64,
    /// Each create answered at its first attempt: (seconds into the load when it
    /// was sent, its latency in ms).
    pub latencies: Vec<(f64, f64)>,
    /// Pods stored without berth's decision though a policy in force applied to
    /// them: (namespace/name, seconds into the load when the create was answered).
    pub missed: Vec<(String, f64)>,
    /// Pods that carry a decision they must not: a policy named in a namespace
    /// that does not opt in, or a policy, toleration or affinity expression twice.
    pub wrong: Vec<String>,
    /// Creates issued more than a second after their slot (the generator fell behind).
    pub late: u64,
    pub deletes_failed: u64,
}

impl LoadReport {
    /// The `p` quantile (0..1) of the first-attempt latencies, ms.
    pub fn latency(&self, p: f64) -> f64 {
        self.latency_between(p, f64::NEG_INFINITY, f64::INFINITY)
    }

    /// The `p` quantile of the latencies of the creates sent between `from` and
    /// `to` seconds into the load, ms.
    pub fn latency_between(&self, p: f64, from: f64, to: f64) -> f64 {
        let mut sorted: Vec<f64> = self
            .latencies
            .iter()
            .filter(|(at, _)| (from..to).contains(at))
            .map(|(_, ms)| *ms)
            .collect();
        sorted.sort_by(f64::total_cmp);
        if sorted.is_empty() {
            return f64::NAN;
        }
        sorted[((sorted.len() - 1) as f64 * p).round() as usize]
    }

    /// The seconds into the load of the first and last missed pod.
    pub fn missed_span(&self) -> Option<(f64, f64)> {
        span(self.missed.iter().map(|m| m.1))
    }

    /// The seconds into the load of the first and last failed create.
    pub fn failed_span(&self) -> Option<(f64, f64)> {
        span(self.failed.iter().map(|f| f.2))
    }
}

fn span(times: impl Iterator<Item = f64> + Clone) -> Option<(f64, f64)> {
    Some((times.clone().reduce(f64::min)?, times.reduce(f64::max)?))
}

/// The pod a stream makes.
pub fn stream_pod(stream: &Stream, name: &str, i: u64) -> Pod {
    let mut labels = serde_json::Map::new();
    labels.insert(LOAD_LABEL.into(), json!("churn"));
    labels.insert(STREAM_LABEL.into(), json!(stream.name));
    for (k, v) in &stream.labels {
        labels.insert(k.to_string(), json!(v));
    }
    let image = stream.images[i as usize % stream.images.len()];
    fixtures::pod(name)
        .image(image)
        .cpu("1m")
        .memory("1Mi")
        .labels(Value::Object(labels))
        .build()
}

/// The streams in the order their creates go out: smooth weighted round robin, so
/// each stream's creates are spread evenly over the load.
fn schedule(streams: &[Stream], total: u64) -> Vec<usize> {
    let sum: i64 = streams.iter().map(|s| i64::from(s.weight)).sum();
    let mut current = vec![0i64; streams.len()];
    (0..total)
        .map(|_| {
            for (c, s) in current.iter_mut().zip(streams) {
                *c += i64::from(s.weight);
            }
            let (best, _) = current
                .iter()
                .enumerate()
                .max_by_key(|(i, c)| (**c, std::cmp::Reverse(*i)))
                .unwrap();
            current[best] -= sum;
            best
        })
        .collect()
}

/// Whether `pod` as stored carries a decision it must not, and which.
fn wrongly_decided(pod: &Pod, expects_none: bool) -> Option<String> {
    let applied = pod
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(names::APPLIED_ANNOTATION))
        .cloned()
        .unwrap_or_default();
    let names: Vec<&str> = applied.split(',').filter(|s| !s.is_empty()).collect();
    let mut seen = std::collections::BTreeSet::new();
    if names.iter().any(|n| !seen.insert(*n)) {
        return Some(format!("applied twice: {applied}"));
    }
    if expects_none && !names.is_empty() {
        return Some(format!(
            "applied {applied} in a namespace that opts into none"
        ));
    }
    let spec = pod.spec.as_ref()?;
    if twice(spec.tolerations.iter().flatten()) {
        return Some("a toleration twice".into());
    }
    let terms = spec
        .affinity
        .as_ref()
        .and_then(|a| a.node_affinity.as_ref())
        .and_then(|n| {
            n.required_during_scheduling_ignored_during_execution
                .as_ref()
        })
        .map(|r| r.node_selector_terms.clone())
        .unwrap_or_default();
    for term in terms {
        if twice(term.match_expressions.iter().flatten()) {
            return Some("a node affinity expression twice".into());
        }
    }
    None
}

/// Whether some item comes twice, as JSON.
fn twice<T: serde::Serialize>(items: impl Iterator<Item = T>) -> bool {
    let mut seen = std::collections::BTreeSet::new();
    items
        .map(|item| serde_json::to_string(&item).unwrap())
        .any(|json| !seen.insert(json))
}

fn applied_names(pod: &Pod) -> Vec<String> {
    pod.metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(names::APPLIED_ANNOTATION))
        .map(|a| a.split(',').map(|p| p.trim().to_owned()).collect())
        .unwrap_or_default()
}

/// Whether an error is the apiserver's answer (as opposed to no answer at all).
fn answered(error: &kube::Error) -> Option<String> {
    match error {
        kube::Error::Api(status) => Some(format!(
            "{} {}: {}",
            status.code, status.reason, status.message
        )),
        _ => None,
    }
}

/// Runs `load` to its end and returns what happened; `stop` ends it early.
pub async fn run(
    client: &Client,
    load: &Load,
    in_force: &InForce,
    stop: &AtomicBool,
) -> LoadReport {
    let total = (load.rate * load.duration.as_secs_f64()).round() as u64;
    let order = schedule(&load.streams, total);
    let report = Arc::new(Mutex::new(LoadReport::default()));
    let windows: Vec<Arc<Mutex<VecDeque<String>>>> = load
        .streams
        .iter()
        .map(|_| Arc::new(Mutex::new(VecDeque::new())))
        .collect();
    let start = Instant::now();
    let give_up = start + load.duration + Duration::from_secs(60);
    let scaler = load.scale.clone().map(|scale| {
        let client = client.clone();
        let until = start + load.duration;
        tokio::spawn(async move { scale_deployment(&client, &scale, until).await })
    });
    let mut tasks = Vec::with_capacity(total as usize);
    let mut counters = vec![0u64; load.streams.len()];
    for (i, stream_index) in order.into_iter().enumerate() {
        if stop.load(Ordering::Relaxed) {
            break;
        }
        let slot = start + Duration::from_secs_f64(i as f64 / load.rate);
        tokio::time::sleep_until(slot.into()).await;
        let stream = load.streams[stream_index].clone();
        let n = counters[stream_index];
        counters[stream_index] += 1;
        let name = format!("{}-{}-{n}", load.tag, stream.name);
        let pod = stream_pod(&stream, &name, n);
        let (client, report, window, in_force) = (
            client.clone(),
            report.clone(),
            windows[stream_index].clone(),
            in_force.clone(),
        );
        if slot.elapsed() > Duration::from_secs(1) {
            report.lock().unwrap().late += 1;
        }
        report.lock().unwrap().issued += 1;
        tasks.push(tokio::spawn(async move {
            let api: Api<Pod> = Api::namespaced(client.clone(), &stream.namespace);
            let sent = Instant::now();
            let mut attempt = 0;
            let stored = loop {
                match api.create(&PostParams::default(), &pod).await {
                    Ok(stored) => break Ok(stored),
                    // A create that got no answer may have been stored before the
                    // connection went: the pod is there, and it is the one sent.
                    Err(kube::Error::Api(s)) if attempt > 0 && s.code == 409 => {
                        match api.get(&name).await {
                            Ok(stored) => break Ok(stored),
                            Err(e) => break Err(format!("{e}")),
                        }
                    }
                    Err(e) => match answered(&e) {
                        Some(answer) => break Err(answer),
                        None if Instant::now() < give_up => {
                            attempt += 1;
                            tokio::time::sleep(Duration::from_millis(250)).await;
                        }
                        None => break Err(format!("no answer until the load gave up: {e}")),
                    },
                }
            };
            let answered_at = Instant::now();
            let created = {
                let mut r = report.lock().unwrap();
                if attempt > 0 {
                    r.retried += 1;
                }
                match stored {
                    Ok(stored) => {
                        r.created += 1;
                        if attempt == 0 {
                            r.latencies.push((
                                (sent - start).as_secs_f64(),
                                sent.elapsed().as_secs_f64() * 1000.0,
                            ));
                        }
                        let applied = applied_names(&stored);
                        let missing = stream.expects.iter().any(|p| {
                            in_force.at(p, answered_at) && !applied.iter().any(|a| a == p)
                        });
                        if missing {
                            r.missed.push((
                                format!("{}/{name}", stream.namespace),
                                (answered_at - start).as_secs_f64(),
                            ));
                        }
                        if let Some(why) = wrongly_decided(&stored, stream.expects.is_empty()) {
                            r.wrong.push(format!("{}/{name}: {why}", stream.namespace));
                        }
                        true
                    }
                    Err(answer) => {
                        r.failed.push((
                            format!("{}/{name}", stream.namespace),
                            answer,
                            (answered_at - start).as_secs_f64(),
                        ));
                        false
                    }
                }
            };
            if !created {
                return;
            }
            let oldest = {
                let mut w = window.lock().unwrap();
                w.push_back(name);
                (w.len() > stream.window).then(|| w.pop_front()).flatten()
            };
            if let Some(oldest) = oldest
                && !delete_now(&api, &oldest, give_up).await
            {
                report.lock().unwrap().deletes_failed += 1;
            }
        }));
    }
    for task in tasks {
        let _ = task.await;
    }
    if let Some(scaler) = scaler {
        let _ = scaler.await;
    }
    Arc::try_unwrap(report).unwrap().into_inner().unwrap()
}

/// Deletes `name` at once (no grace), retrying while the apiserver gives no
/// answer; whether it is gone.
pub async fn delete_now(api: &Api<Pod>, name: &str, give_up: Instant) -> bool {
    let now = DeleteParams {
        grace_period_seconds: Some(0),
        ..DeleteParams::default()
    };
    loop {
        match api.delete(name, &now).await {
            Ok(_) => return true,
            Err(kube::Error::Api(s)) => return s.code == 404,
            Err(_) if Instant::now() < give_up => {
                tokio::time::sleep(Duration::from_millis(250)).await
            }
            Err(_) => return false,
        }
    }
}

async fn scale_deployment(client: &Client, scale: &Scale, until: Instant) {
    let api: Api<Deployment> = Api::namespaced(client.clone(), &scale.namespace);
    let mut high = true;
    while Instant::now() < until {
        let replicas = if high { scale.high } else { scale.low };
        let patch = json!({"spec": {"replicas": replicas}});
        // An error (the apiserver restarting) is tried again at the next turn.
        let _ = api
            .patch(
                &scale.deployment,
                &PatchParams::default(),
                &Patch::Merge(&patch),
            )
            .await;
        high = !high;
        tokio::time::sleep(
            scale
                .every
                .min(until.saturating_duration_since(Instant::now())),
        )
        .await;
    }
}

/// A Deployment of `replicas` pods of `image` named `name`, labelled for the
/// suite.
pub fn deployment(name: &str, image: &str, replicas: i32) -> Deployment {
    serde_json::from_value(json!({
        "metadata": {"name": name},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": {"app": name}},
            "template": {
                "metadata": {"labels": {"app": name, LOAD_LABEL: "deployment", STREAM_LABEL: name}},
                "spec": {"terminationGracePeriodSeconds": 0,
                    "containers": [{"name": "c", "image": image,
                    "resources": {"requests": {"cpu": "1m", "memory": "1Mi"}}}]}
            }
        }
    }))
    .unwrap()
}

/// What a flood of large dry-run pods got.
#[derive(Debug, Default, Clone)]
pub struct FloodReport {
    pub answered: u64,
    /// Denied by berth at its memory bound (it fails closed there).
    pub busy: u64,
    /// Otherwise failed, by the first 100 characters of the answer.
    pub failed: BTreeMap<String, u64>,
}

/// Dry-run creates of 2 MB pods of `<` (12 MB reviews once the apiserver escapes
/// them), `concurrency` at a time in `namespace`, until `stop` is set.
pub async fn flood(
    client: &Client,
    namespace: &str,
    concurrency: usize,
    stop: &AtomicBool,
) -> FloodReport {
    use futures::StreamExt;
    let api: Api<Pod> = Api::namespaced(client.clone(), namespace);
    let mut big = fixtures::pod("flood").json();
    big["spec"]["containers"][0]["env"] = json!([{"name": "X", "value": "<".repeat(2_000_000)}]);
    let big: Pod = serde_json::from_value(big).unwrap();
    let dry = PostParams {
        dry_run: true,
        ..PostParams::default()
    };
    let report = Mutex::new(FloodReport::default());
    futures::stream::iter(0u64..)
        .take_while(|_| futures::future::ready(!stop.load(Ordering::Relaxed)))
        .for_each_concurrent(concurrency, |i| {
            let (api, dry, report) = (&api, &dry, &report);
            let mut pod = big.clone();
            pod.metadata.name = Some(format!("flood-{i}"));
            async move {
                let result = api.create(dry, &pod).await;
                let mut r = report.lock().unwrap();
                match result {
                    Ok(_) => r.answered += 1,
                    Err(e) if e.to_string().contains("memory bound") => r.busy += 1,
                    Err(e) => {
                        let reason: String = e.to_string().chars().take(100).collect();
                        *r.failed.entry(reason).or_default() += 1;
                    }
                }
            }
        })
        .await;
    report.into_inner().unwrap()
}
