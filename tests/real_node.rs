#![cfg(feature = "e2e")]
//! berth as its users run it: the image built from this checkout, on a node run by
//! a real kubelet and containerd (`tests/cluster/add-real-node`), installed by
//! `helm install` of `charts/berth` with the chart's defaults (two replicas, the
//! client certificate required, the PodDisruptionBudget), called by the apiserver
//! through its Service; then seed 000's CDN scenario, a certificate rotated in the
//! Secret, `helm upgrade` to a new image and the leader's pod deleted, each under a
//! steady load of pod creates, and `helm uninstall`.
//!
//! One test, in stages, because each stage starts from what the last one left, as
//! an operator's cluster does. The figures (install to Ready, each container's
//! memory from its cgroup, a review through the Service against one on the host's
//! `url`) are printed, not asserted.

mod support;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use berth::names;
use k8s_openapi::api::admissionregistration::v1::{
    MutatingWebhookConfiguration, ValidatingAdmissionPolicy, ValidatingWebhookConfiguration,
};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use kube::Client;
use kube::api::{Api, DeleteParams, ListParams, PostParams};
use serde_json::json;
use support::fixtures;
use support::helm::{CHART, helm_command, succeeded};
use support::{
    Nodes, TestCluster, cluster_script, eventually, fresh_namespace, has_applied, lease_holder,
    opt_in, placed, repo_root,
};

const NODES: Nodes = Nodes {
    count: 3,
    prefix: "node",
};
const WAIT: Duration = Duration::from_secs(90);
const NAMESPACE: &str = "berth-system";
const SELECTOR: &str = "app.kubernetes.io/name=berth";

/// The last line a cluster script printed (its answer; logs go to stderr).
fn last_line(out: &str) -> String {
    out.lines().last().unwrap_or_default().trim().to_owned()
}

/// berth's own binary on the host: `berth certs`, and the host-side server of the
/// Service-path comparison.
fn berth_bin() -> PathBuf {
    support::fleet::binary()
}

/// The serving certificate in `certs`, signed by the cluster's webhook client CA,
/// so that berth's `ca.crt` (its client CA, by the chart's default) trusts the
/// client certificate the test apiserver presents to every webhook.
fn make_certs(cluster: &TestCluster, certs: &Path) {
    std::fs::create_dir_all(certs).unwrap();
    for (from, to) in [("crt", "ca.crt"), ("key", "ca.key")] {
        let source = cluster.dir.join(format!("pki/webhook-client-ca.{from}"));
        if !certs.join(to).exists() {
            std::fs::copy(&source, certs.join(to)).expect("copy the client CA");
        }
    }
    let out = Command::new(berth_bin())
        .args(["certs", "--service", "berth", "--namespace", NAMESPACE])
        .arg("--out")
        .arg(certs)
        .output()
        .expect("run berth certs");
    succeeded("berth certs", out);
}

/// The Secret berth-tls from `certs` (tls.crt, tls.key and ca.crt, as
/// certs/README.md makes it), created or replaced in place.
fn apply_secret(cluster: &TestCluster, certs: &Path) {
    let file = |name: &str| format!("--from-file={name}={}", certs.join(name).display());
    let yaml = cluster.kubectl_ok(&[
        "create",
        "secret",
        "generic",
        "berth-tls",
        "-n",
        NAMESPACE,
        "--type",
        "kubernetes.io/tls",
        &file("tls.crt"),
        &file("tls.key"),
        &file("ca.crt"),
        "--dry-run=client",
        "-o",
        "yaml",
    ]);
    let out = support::kubectl_with_input(&cluster.dir, &["apply", "-f", "-"], &yaml);
    assert!(
        out.status.success(),
        "apply the Secret: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The serial of the certificate served at `ip`:8443, as openssl prints it.
fn served_serial(ip: &str) -> Option<String> {
    let mut child = Command::new("openssl")
        .args(["s_client", "-connect", &format!("{ip}:8443")])
        .args(["-servername", "berth.berth-system.svc"])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .ok()?;
    let pem = {
        use std::io::Read;
        let mut text = String::new();
        child.stdout.take()?.read_to_string(&mut text).ok()?;
        let _ = child.wait();
        text
    };
    let mut x509 = Command::new("openssl")
        .args(["x509", "-noout", "-serial"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .ok()?;
    {
        use std::io::Write;
        x509.stdin.take()?.write_all(pem.as_bytes()).ok()?;
    }
    let out = x509.wait_with_output().ok()?;
    let serial = String::from_utf8_lossy(&out.stdout).trim().to_owned();
    serial.starts_with("serial=").then_some(serial)
}

fn file_serial(cert: &Path) -> String {
    let out = Command::new("openssl")
        .args(["x509", "-noout", "-serial", "-in"])
        .arg(cert)
        .output()
        .expect("openssl");
    String::from_utf8_lossy(&out.stdout).trim().to_owned()
}

/// berth's pods, by name.
async fn berth_pods(client: &Client) -> BTreeMap<String, Pod> {
    let pods: Api<Pod> = Api::namespaced(client.clone(), NAMESPACE);
    pods.list(&ListParams::default().labels(SELECTOR))
        .await
        .expect("list berth's pods")
        .items
        .into_iter()
        .filter_map(|p| Some((p.metadata.name.clone()?, p)))
        .collect()
}

fn is_ready(pod: &Pod) -> bool {
    pod.metadata.deletion_timestamp.is_none()
        && pod
            .status
            .as_ref()
            .and_then(|s| s.conditions.as_ref())
            .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

fn restarts(pod: &Pod) -> i32 {
    pod.status
        .as_ref()
        .and_then(|s| s.container_statuses.as_ref())
        .map_or(0, |c| c.iter().map(|c| c.restart_count).sum())
}

fn pod_ip(pod: &Pod) -> String {
    pod.status
        .as_ref()
        .and_then(|s| s.pod_ip.clone())
        .expect("a pod IP")
}

/// `count` berth pods Ready (none terminating), with the image `image`.
async fn ready_pods(client: &Client, count: usize, image: &str) -> BTreeMap<String, Pod> {
    eventually(
        &format!("{count} berth pods Ready with {image}"),
        WAIT,
        || async {
            let pods = berth_pods(client).await;
            let ready = pods.values().filter(|p| is_ready(p)).count();
            let all_new = pods.values().all(|p| {
                p.spec.as_ref().map(|s| s.containers[0].image.as_deref()) == Some(Some(image))
            });
            (pods.len() == count && ready == count && all_new).then_some(pods)
        },
    )
    .await
}

/// The memory a container uses, from its cgroup as the kubelet made it, in MiB:
/// its anonymous memory (berth's heap and stacks), and its working set (usage
/// less inactive file pages, what the kubelet evicts by; it also counts the
/// binary's pages where this container read them first).
fn container_memory_mib(cluster: &TestCluster, pod: &Pod) -> (f64, f64) {
    let env = std::fs::read_to_string(cluster.dir.join("node/env")).expect("node/env");
    let root = env
        .lines()
        .find_map(|l| l.strip_prefix("cgroup_root="))
        .expect("cgroup_root in node/env");
    let status = pod.status.as_ref().unwrap();
    let qos = status.qos_class.as_deref().unwrap_or("BestEffort");
    let uid = pod.metadata.uid.as_deref().unwrap();
    let id = status.container_statuses.as_ref().unwrap()[0]
        .container_id
        .as_deref()
        .and_then(|c| c.strip_prefix("containerd://"))
        .expect("a containerd container id")
        .to_owned();
    let qos_dir = match qos {
        "Guaranteed" => String::new(),
        other => format!("/{}", other.to_lowercase()),
    };
    let path = format!("{root}/kubepods{qos_dir}/pod{uid}/{id}");
    let stat = |file: &str, key: &str| -> f64 {
        std::fs::read_to_string(file)
            .ok()
            .and_then(|t| {
                t.lines()
                    .find_map(|l| l.strip_prefix(&format!("{key} ")).map(str::to_owned))
            })
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(0.0)
    };
    let mib = 1024.0 * 1024.0;
    if Path::new("/sys/fs/cgroup/cgroup.controllers").exists() {
        let dir = format!("/sys/fs/cgroup{path}");
        let current: f64 = std::fs::read_to_string(format!("{dir}/memory.current"))
            .expect("memory.current")
            .trim()
            .parse()
            .unwrap();
        let stat_file = format!("{dir}/memory.stat");
        (
            stat(&stat_file, "anon") / mib,
            (current - stat(&stat_file, "inactive_file")) / mib,
        )
    } else {
        let dir = format!("/sys/fs/cgroup/memory{path}");
        let usage: f64 = std::fs::read_to_string(format!("{dir}/memory.usage_in_bytes"))
            .expect("memory.usage_in_bytes")
            .trim()
            .parse()
            .unwrap();
        let stat_file = format!("{dir}/memory.stat");
        (
            stat(&stat_file, "total_rss") / mib,
            (usage - stat(&stat_file, "total_inactive_file")) / mib,
        )
    }
}

/// The sum of a counter over berth's pods, read from each pod's metrics port.
fn metric_over_pods(pods: &BTreeMap<String, Pod>, name: &str) -> f64 {
    pods.values()
        .map(|pod| {
            let out = Command::new("curl")
                .args(["-s", "--max-time", "3"])
                .arg(format!("http://{}:9090/metrics", pod_ip(pod)))
                .output()
                .expect("curl");
            let text = String::from_utf8_lossy(&out.stdout).into_owned();
            assert!(
                text.contains("# TYPE"),
                "the metrics port of {} answered {text:?}",
                pod.metadata.name.as_deref().unwrap_or_default()
            );
            support::samples(&text)
                .filter(|(sample, _)| *sample == name || sample.starts_with(&format!("{name}{{")))
                .map(|(_, v)| v)
                .sum::<f64>()
        })
        .sum()
}

/// A small cdn pod of stage `stage`.
fn cdn_pod(name: &str, stage: &str) -> Pod {
    fixtures::pod(name)
        .image("example/cdn-uploader:1.0")
        .cpu("10m")
        .memory("8Mi")
        .labels(json!({"test": "real-node", "stage": stage}))
        .build()
}

/// Pod creates at a steady rate in `ns` until stopped: the names it created and
/// the creates that failed.
struct Load {
    stop: Arc<AtomicBool>,
    task: tokio::task::JoinHandle<(Vec<String>, Vec<String>)>,
    stage: String,
}

impl Load {
    fn start(client: &Client, ns: &str, stage: &str, per_second: u32) -> Load {
        let stop = Arc::new(AtomicBool::new(false));
        let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
        let (flag, stage_name) = (stop.clone(), stage.to_owned());
        let task = tokio::spawn(async move {
            let mut ticks =
                tokio::time::interval(Duration::from_millis(1000 / u64::from(per_second)));
            let (mut created, mut failed) = (Vec::new(), Vec::new());
            let mut i = 0;
            while !flag.load(Ordering::Relaxed) {
                ticks.tick().await;
                let name = format!("{stage_name}-{i}");
                i += 1;
                match pods
                    .create(&PostParams::default(), &cdn_pod(&name, &stage_name))
                    .await
                {
                    Ok(_) => created.push(name),
                    Err(e) => failed.push(format!("{name}: {e}")),
                }
            }
            (created, failed)
        });
        Load {
            stop,
            task,
            stage: stage.to_owned(),
        }
    }

    /// Stops the load and checks every create went through and every pod created
    /// carries berth's decision; returns how many there were.
    async fn finish(self, client: &Client, ns: &str) -> usize {
        self.stop.store(true, Ordering::Relaxed);
        let (created, failed) = self.task.await.expect("load task");
        assert!(
            failed.is_empty(),
            "{}: creates refused: {failed:?}",
            self.stage
        );
        let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
        let listed = pods
            .list(&ListParams::default().labels(&format!("stage={}", self.stage)))
            .await
            .expect("list the load's pods");
        let missed: Vec<_> = listed
            .items
            .iter()
            .filter(|p| !has_applied(p, "cdn"))
            .filter_map(|p| p.metadata.name.clone())
            .collect();
        assert_eq!(listed.items.len(), created.len(), "{}", self.stage);
        assert!(
            missed.is_empty(),
            "{}: {} of {} pods admitted without berth's decision: {missed:?}",
            self.stage,
            missed.len(),
            created.len()
        );
        // The load's pods leave, so node2 keeps room for the next stage.
        pods.delete_collection(
            &DeleteParams::default().grace_period(0),
            &ListParams::default().labels(&format!("stage={}", self.stage)),
        )
        .await
        .expect("delete the load's pods");
        created.len()
    }
}

/// node2's labels and taints as the cdn policy says: in the pool, tainted.
async fn node2_in_cdn_pool(client: &Client) -> bool {
    let node = Api::<Node>::all(client.clone()).get("node2").await.unwrap();
    let labelled = node
        .metadata
        .labels
        .as_ref()
        .and_then(|l| l.get(names::POOL_LABEL))
        .is_some_and(|v| v == "cdn");
    let tainted = node
        .spec
        .as_ref()
        .and_then(|s| s.taints.as_ref())
        .is_some_and(|t| t.iter().any(|t| t.key == names::POOL_TAINT));
    labelled && tainted
}

/// Nothing of berth's on node2: no label or taint of berth's.
async fn node2_clean(client: &Client) -> bool {
    let node = Api::<Node>::all(client.clone()).get("node2").await.unwrap();
    let labels_clean = node
        .metadata
        .labels
        .unwrap_or_default()
        .keys()
        .all(|k| !k.starts_with("berth."));
    let taints_clean = node
        .spec
        .and_then(|s| s.taints)
        .unwrap_or_default()
        .iter()
        .all(|t| !t.key.starts_with("berth."));
    labels_clean && taints_clean
}

/// `count` sequential dry-run creates of a cdn pod in `ns`; each one's time in ms,
/// sorted, each checked to carry berth's decision.
async fn review_times(client: &Client, ns: &str, count: usize) -> Vec<f64> {
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    let dry_run = PostParams {
        dry_run: true,
        ..Default::default()
    };
    let mut times = Vec::with_capacity(count);
    for i in 0..count {
        let pod = cdn_pod(&format!("timed-{i}"), "timed");
        let start = Instant::now();
        let created = pods.create(&dry_run, &pod).await.expect("dry-run create");
        times.push(start.elapsed().as_secs_f64() * 1000.0);
        assert!(has_applied(&created, "cdn"), "timed-{i} without berth");
    }
    times.sort_by(f64::total_cmp);
    times
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    sorted[((sorted.len() - 1) as f64 * p).round() as usize]
}

/// Waits until twenty dry-run creates of a cdn pod in a row carry berth's
/// decision (see the caller).
async fn both_replicas_decide(client: &Client, ns: &str) {
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    let dry_run = PostParams {
        dry_run: true,
        ..Default::default()
    };
    let mut in_a_row = 0;
    let deadline = Instant::now() + WAIT;
    while in_a_row < 20 {
        let decided = pods
            .create(&dry_run, &cdn_pod("both", "probe"))
            .await
            .is_ok_and(|p| has_applied(&p, "cdn"));
        in_a_row = if decided { in_a_row + 1 } else { 0 };
        assert!(
            Instant::now() < deadline,
            "berth's replicas never both decided"
        );
    }
}

/// `berth serve` on the host, stopped when dropped.
struct HostBerth(Child);

impl Drop for HostBerth {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_chart_on_a_real_node_installs_upgrades_survives_and_uninstalls() {
    let cluster = TestCluster::shared(NODES);
    let client = cluster.client().await;
    let dir = cluster.dir.to_str().unwrap().to_owned();
    let kubeconfig = cluster.kubeconfig();

    // --- a real node, and berth's image in its runtime, twice (for the upgrade) ---
    let real = last_line(&cluster_script("add-real-node", &[&dir]));
    let image_one = last_line(&cluster_script("load-image", &[&dir, "one"]));
    let image_two = last_line(&cluster_script("load-image", &[&dir, "two"]));
    assert_ne!(image_one, image_two);
    let (repository, tag_one) = image_one.rsplit_once(':').unwrap();
    let tag_two = image_two.rsplit_once(':').unwrap().1;

    // --- helm install: the chart's defaults, our image, the real node ---
    let certs = cluster.dir.join("real-node-certs");
    make_certs(cluster, &certs);
    cluster.kubectl_ok(&["create", "namespace", NAMESPACE]);
    apply_secret(cluster, &certs);
    let values = |tag: &str| {
        vec![
            "--set".to_owned(),
            format!("image.repository={repository}"),
            "--set".to_owned(),
            format!("image.tag={tag}"),
            "--set".to_owned(),
            "image.pullPolicy=Never".to_owned(),
            "--set".to_owned(),
            format!("nodeSelector.{}={real}", r"kubernetes\.io/hostname"),
            "--set-file".to_owned(),
            format!("certificates.caBundle={}", certs.join("caBundle").display()),
        ]
    };
    let started = Instant::now();
    let out = helm_command(Some(&kubeconfig))
        .args(["install", "berth", CHART, "--namespace", NAMESPACE])
        .args(values(tag_one))
        .output()
        .expect("run helm install");
    succeeded("helm install", out);
    let pods = ready_pods(&client, 2, &image_one).await;
    let install_to_ready = started.elapsed();
    for (name, pod) in &pods {
        assert_eq!(
            pod.spec.as_ref().unwrap().node_name.as_deref(),
            Some(real.as_str()),
            "{name} runs on the real node"
        );
        assert_eq!(restarts(pod), 0, "{name} restarted");
        // The client certificate is required, by the chart's default.
        let env = pod.spec.as_ref().unwrap().containers[0]
            .env
            .clone()
            .unwrap();
        assert!(
            env.iter().any(|e| e.name == "BERTH_CLIENT_CA"),
            "{name} runs without --client-ca"
        );
    }
    let leader = eventually("a leader among berth's pods", WAIT, || async {
        lease_holder(&client)
            .await
            .filter(|holder| pods.contains_key(holder))
    })
    .await;
    let mutating: Api<MutatingWebhookConfiguration> = Api::all(client.clone());
    let webhook = mutating.get("berth").await.expect("the mutating webhook");
    for hook in &webhook.webhooks.unwrap() {
        let service = hook.client_config.service.as_ref();
        assert_eq!(
            service.map(|s| (s.name.as_str(), s.namespace.as_str())),
            Some(("berth", NAMESPACE)),
            "{} calls berth through its Service",
            hook.name
        );
    }

    // --- seed 000 through the Service ---
    let policy = repo_root().join("policies/cdn.yaml");
    cluster.kubectl_ok(&["apply", "-f", policy.to_str().unwrap()]);
    let decisions_before = metric_over_pods(&pods, "berth_decisions_total");
    let opted = fresh_namespace(&client, "real-cdn").await;
    opt_in(&client, &opted, "cdn", &cdn_pod("probe", "probe"), WAIT).await;
    // Each replica's caches see the annotation in their own time, and the Service
    // sends each review to either: twenty decided dry runs in a row have reached
    // both (one replica alone would answer all twenty once in 500,000 tries).
    both_replicas_decide(&client, &opted).await;
    let other = fresh_namespace(&client, "real-other").await;
    eventually("node2 in the cdn pool", WAIT, || async {
        node2_in_cdn_pool(&client).await.then_some(())
    })
    .await;
    let measured: Vec<String> = pods.keys().cloned().collect();
    let idle: Vec<_> = pods
        .values()
        .map(|p| container_memory_mib(cluster, p))
        .collect();
    let mut expected = Vec::new();
    let mut peak = vec![(0.0f64, 0.0f64); pods.len()];
    for i in 0..60 {
        let (ns, image, cdn) = match i % 3 {
            0 => (opted.as_str(), "example/cdn-uploader:1.0", true),
            1 => (opted.as_str(), "nginx:1.27", false),
            _ => (other.as_str(), "example/cdn-uploader:1.0", false),
        };
        let name = format!("seed-{i}");
        let pod = fixtures::pod(&name)
            .image(image)
            .cpu("10m")
            .memory("8Mi")
            .labels(json!({"test": "seed"}))
            .build();
        Api::<Pod>::namespaced(client.clone(), ns)
            .create(&PostParams::default(), &pod)
            .await
            .expect("create a seed pod");
        expected.push((ns.to_owned(), name, cdn));
        for (slot, pod) in peak.iter_mut().zip(pods.values()) {
            let (rss, working_set) = container_memory_mib(cluster, pod);
            *slot = (slot.0.max(rss), slot.1.max(working_set));
        }
    }
    let in_opted = placed(&client, &opted, "test=seed", 40, WAIT).await;
    let in_other = placed(&client, &other, "test=seed", 20, WAIT).await;
    for (ns, name, cdn) in &expected {
        let node = if *ns == opted {
            &in_opted[name]
        } else {
            &in_other[name]
        };
        let admitted = Api::<Pod>::namespaced(client.clone(), ns)
            .get(name)
            .await
            .unwrap();
        if *cdn {
            assert_eq!(node, "node2", "cdn pod {ns}/{name}");
            assert!(
                has_applied(&admitted, "cdn"),
                "{ns}/{name} has berth's record"
            );
        } else {
            assert_ne!(node, "node2", "{ns}/{name} is not entitled to node2");
        }
    }
    let decisions = metric_over_pods(&pods, "berth_decisions_total") - decisions_before;
    assert!(
        decisions >= 20.0,
        "berth's pods counted {decisions} cdn decisions for 20 cdn pods and the probes"
    );

    // --- the certificate rotated in the Secret, under load ---
    let load = Load::start(&client, &opted, "rotation", 4);
    let old_serial = file_serial(&certs.join("tls.crt"));
    std::fs::remove_file(certs.join("tls.crt")).unwrap();
    make_certs(cluster, &certs);
    let new_serial = file_serial(&certs.join("tls.crt"));
    assert_ne!(old_serial, new_serial);
    let rotated = Instant::now();
    apply_secret(cluster, &certs);
    for (name, pod) in &pods {
        let ip = pod_ip(pod);
        eventually(
            &format!("{name} serving the new certificate"),
            Duration::from_secs(150),
            || async { (served_serial(&ip).as_deref() == Some(new_serial.as_str())).then_some(()) },
        )
        .await;
    }
    let rotation_time = rotated.elapsed();
    let during_rotation = load.finish(&client, &opted).await;
    for (name, pod) in berth_pods(&client).await {
        assert_eq!(
            restarts(&pod),
            0,
            "{name} restarted to take the new certificate"
        );
    }

    // --- helm upgrade to another image, under load; the PDB holds ---
    let budget = Api::<PodDisruptionBudget>::namespaced(client.clone(), NAMESPACE)
        .get("berth")
        .await
        .expect("the chart's PodDisruptionBudget");
    let min_available = match budget.spec.unwrap().min_available {
        Some(k8s_openapi::apimachinery::pkg::util::intstr::IntOrString::Int(n)) => n as usize,
        other => panic!("minAvailable {other:?}"),
    };
    let load = Load::start(&client, &opted, "upgrade", 4);
    let upgraded = Instant::now();
    let out = helm_command(Some(&kubeconfig))
        .args(["upgrade", "berth", CHART, "--namespace", NAMESPACE])
        .args(values(tag_two))
        .output()
        .expect("run helm upgrade");
    succeeded("helm upgrade", out);
    let mut fewest_ready = usize::MAX;
    let pods = loop {
        let now = berth_pods(&client).await;
        fewest_ready = fewest_ready.min(now.values().filter(|p| is_ready(p)).count());
        let done = now.len() == 2
            && now.values().all(|p| {
                is_ready(p)
                    && p.spec.as_ref().unwrap().containers[0].image.as_deref()
                        == Some(image_two.as_str())
            });
        if done {
            break now;
        }
        assert!(upgraded.elapsed() < WAIT * 2, "the upgrade did not finish");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let upgrade_time = upgraded.elapsed();
    // A few seconds of load on the new replicas alone.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let during_upgrade = load.finish(&client, &opted).await;
    assert!(
        fewest_ready >= min_available,
        "{fewest_ready} berth pods Ready during the upgrade, the budget says {min_available}"
    );
    let deployment = Api::<Deployment>::namespaced(client.clone(), NAMESPACE)
        .get("berth")
        .await
        .unwrap();
    assert_eq!(
        deployment.status.unwrap().ready_replicas,
        Some(2),
        "both replicas Ready after the upgrade"
    );

    // --- the leader's pod deleted, under load ---
    let leader_now = eventually("a leader among the upgraded pods", WAIT, || async {
        lease_holder(&client)
            .await
            .filter(|holder| pods.contains_key(holder))
    })
    .await;
    let leases = Api::<Lease>::namespaced(client.clone(), NAMESPACE);
    let mut last_renewal = leases
        .get("berth-controller")
        .await
        .unwrap()
        .spec
        .and_then(|s| s.renew_time)
        .map(|t| t.0);
    let load = Load::start(&client, &opted, "leader", 4);
    let deleted = Instant::now();
    Api::<Pod>::namespaced(client.clone(), NAMESPACE)
        .delete(&leader_now, &DeleteParams::default())
        .await
        .expect("delete the leader's pod");
    // The Lease's own record: the old leader's last renewal (it renews through
    // its pod's preStop pause, then releases on SIGTERM), and when another replica
    // acquired it. A replica that does not hold the Lease looks again when the
    // term it last saw ends, so another takes it within one term of the last
    // renewal.
    let mut seen = Vec::new();
    let (new_leader, taken, term) = loop {
        let spec = leases.get("berth-controller").await.unwrap().spec.unwrap();
        let state = (
            spec.holder_identity.clone(),
            spec.renew_time.clone().map(|t| t.0.to_string()),
        );
        if seen.last() != Some(&state) {
            seen.push(state);
        }
        let term = i64::from(spec.lease_duration_seconds.unwrap_or(15));
        match spec.holder_identity.as_deref() {
            Some(holder) if holder == leader_now => {
                last_renewal = spec.renew_time.map(|t| t.0).or(last_renewal);
            }
            // The survivor, or the replacement if it looked first: both race for
            // a Lease whose term ended.
            Some(holder) => {
                break (holder.to_owned(), spec.acquire_time.unwrap().0, term);
            }
            None => {}
        }
        assert!(
            deleted.elapsed() < Duration::from_secs(60),
            "no replica took the Lease from {leader_now}: {seen:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let takeover = deleted.elapsed();
    let after_renewal = taken.duration_since(last_renewal.expect("the old leader's renewal"));
    assert!(
        after_renewal.as_secs_f64() <= term as f64 + 2.0,
        "{new_leader} took the Lease {after_renewal:?} after {leader_now}'s last renewal \
         (the term is {term} s)"
    );
    // The Deployment makes up the replica, and it starts on the real node.
    ready_pods(&client, 2, &image_two).await;
    let during_leader_loss = load.finish(&client, &opted).await;
    assert!(
        node2_in_cdn_pool(&client).await,
        "node2's labels and taints as the cdn policy says"
    );

    // The liveness probe, over HTTPS with the client certificate required, never
    // failed (the kubelet records each failure as an Event); nor did readiness
    // once a replica was Ready, or the replica would have left the Service.
    let events = Api::<k8s_openapi::api::core::v1::Event>::namespaced(client.clone(), NAMESPACE);
    let failed_liveness: Vec<_> = events
        .list(&ListParams::default().fields("reason=Unhealthy"))
        .await
        .unwrap()
        .items
        .into_iter()
        .filter_map(|e| e.message)
        .filter(|m| m.starts_with("Liveness probe failed"))
        .collect();
    assert!(failed_liveness.is_empty(), "{failed_liveness:?}");
    for (name, pod) in berth_pods(&client).await {
        assert_eq!(restarts(&pod), 0, "{name} restarted");
    }

    // --- one review through the Service against the same on the host's url ---
    let through_service = review_times(&client, &opted, 100).await;
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .unwrap()
        .port();
    let host_kubeconfig = cluster.kubectl_ok(&[
        "create",
        "token",
        "berth",
        "-n",
        NAMESPACE,
        "--duration",
        "1h",
    ]);
    let berth_kubeconfig = service_account_kubeconfig(cluster, host_kubeconfig.trim());
    let log = std::fs::File::create(cluster.dir.join("logs/real-node-host-berth.log")).unwrap();
    let host = HostBerth(
        support::serve_command(&berth_bin(), &certs, port, "127.0.0.1:0", &berth_kubeconfig)
            .args(["--no-controller", "--client-ca"])
            .arg(certs.join("ca.crt"))
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("start berth on the host"),
    );
    // The same webhooks, called at the host's url rather than through the Service.
    let mut config = mutating.get("berth").await.unwrap();
    for hook in config.webhooks.iter_mut().flatten() {
        let path = hook.client_config.service.take().and_then(|s| s.path);
        let path = path.unwrap_or_default();
        hook.client_config.url = Some(format!("https://127.0.0.1:{port}{path}"));
    }
    mutating
        .replace("berth", &PostParams::default(), &config)
        .await
        .expect("point the webhook at the host");
    let probe = cdn_pod("host-probe", "probe");
    support::wait_admitted(
        &client,
        &opted,
        &probe,
        "berth on the host answering",
        |p| has_applied(p, "cdn"),
        WAIT,
    )
    .await;
    let on_host = review_times(&client, &opted, 100).await;
    drop(host);

    // --- helm uninstall, after the policies, as the chart's README says ---
    cluster.kubectl_ok(&[
        "delete",
        "placementpolicy",
        "cdn",
        "--wait=true",
        "--timeout=90s",
    ]);
    assert!(
        node2_clean(&client).await,
        "berth took its labels and taints off node2 before the policy went"
    );
    let out = helm_command(Some(&kubeconfig))
        .args(["uninstall", "berth", "--namespace", NAMESPACE, "--wait"])
        .output()
        .expect("run helm uninstall");
    succeeded("helm uninstall", out);
    let validating: Api<ValidatingWebhookConfiguration> = Api::all(client.clone());
    assert!(mutating.get_opt("berth").await.unwrap().is_none());
    assert!(validating.get_opt("berth").await.unwrap().is_none());
    let policies: Api<ValidatingAdmissionPolicy> = Api::all(client.clone());
    let left: Vec<_> = policies
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .filter_map(|p| p.metadata.name)
        .filter(|n| n.starts_with("berth"))
        .collect();
    assert!(left.is_empty(), "admission policies left: {left:?}");
    let after = Api::<Pod>::namespaced(client.clone(), &opted)
        .create(&PostParams::default(), &cdn_pod("after-uninstall", "after"))
        .await
        .expect("a pod is admitted with berth gone");
    assert!(!has_applied(&after, "cdn"));
    assert!(node2_clean(&client).await);

    let ms = |d: Duration| d.as_secs_f64();
    println!("real node {real}; berth {image_one} then {image_two}");
    println!(
        "helm install to both replicas Ready: {:.1} s",
        ms(install_to_ready)
    );
    for ((name, idle), peak) in measured.iter().zip(&idle).zip(&peak) {
        println!(
            "container memory {name} (its cgroup's anonymous memory and working set): idle {:.1} / {:.1} MiB, under the CDN load {:.1} / {:.1} MiB",
            idle.0, idle.1, peak.0, peak.1
        );
    }
    println!(
        "certificate rotation: served by both replicas {:.1} s after the Secret changed, {during_rotation} creates meanwhile, none refused, no restart",
        ms(rotation_time)
    );
    println!(
        "helm upgrade: {:.1} s to both new replicas Ready, {during_upgrade} creates meanwhile, all with berth's decision; fewest Ready {fewest_ready} (budget {min_available})",
        ms(upgrade_time)
    );
    println!(
        "leader {leader} then {leader_now}; its pod deleted: {new_leader} took the Lease {:.1} s later, {:.1} s after the last renewal (term {term} s); {during_leader_loss} creates meanwhile, all decided",
        ms(takeover),
        after_renewal.as_secs_f64()
    );
    let (s50, s99) = (
        percentile(&through_service, 0.5),
        percentile(&through_service, 0.99),
    );
    let (h50, h99) = (percentile(&on_host, 0.5), percentile(&on_host, 0.99));
    println!(
        "a dry-run create with berth's review: through the Service p50 {s50:.2} ms p99 {s99:.2} ms; on the host's url p50 {h50:.2} ms p99 {h99:.2} ms; the Service path {:.2}x",
        s50 / h50
    );
}

/// A kubeconfig for the test cluster that acts as `berth-system/berth` by `token`.
fn service_account_kubeconfig(cluster: &TestCluster, token: &str) -> PathBuf {
    let admin = std::fs::read_to_string(cluster.kubeconfig()).expect("kubeconfig");
    let mut config: serde_json::Value = serde_yaml_ng::from_str(&admin).expect("kubeconfig YAML");
    let cluster_name = config["clusters"][0]["name"].clone();
    config["users"] = json!([{"name": "berth", "user": {"token": token}}]);
    config["contexts"] =
        json!([{"name": "berth", "context": {"cluster": cluster_name, "user": "berth"}}]);
    config["current-context"] = json!("berth");
    let path = cluster.dir.join("real-node-berth.kubeconfig");
    std::fs::write(&path, serde_yaml_ng::to_string(&config).unwrap()).unwrap();
    path
}
