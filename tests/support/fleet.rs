//! berth as a cluster runs it, for the fault suite: two (or more) replicas of
//! `berth serve`, webhook and controller each, behind a Service (a [`Proxy`] that
//! sends the apiserver's connections to a replica whose `/readyz` answers), and
//! reaching the apiserver through a link of their own that the suite can cut.
//!
//! `tests/cluster/berth-up` installs berth first (CRDs, RBAC, admission policies,
//! the placement policy, certificates, webhook configurations); its single process is then stopped and the
//! webhook configurations point at the Service instead. Every replica acts as the
//! ServiceAccount of `manifests/rbac.yaml`, and is recorded in the cluster's `pids`
//! file, so `down` (and the reaper of a test binary that died) stops it too.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use k8s_openapi::api::admissionregistration::v1::{
    MutatingWebhookConfiguration, ValidatingWebhookConfiguration,
};
use kube::Client;
use kube::api::{Api, PostParams};

use super::proxy::{Proxy, readyz};
use super::{Berth, Nodes, eventually, lease_holder};

/// One `berth serve` process.
struct Running {
    child: Child,
    port: u16,
    metrics_port: u16,
}

/// The replicas, their Service and their link to the apiserver.
pub struct Fleet {
    pub berth: &'static Berth,
    /// The Service in front of the webhooks: the webhook configurations' url.
    pub service: Proxy,
    /// berth's only way to the apiserver.
    pub link: Proxy,
    kubeconfig: PathBuf,
    replicas: Mutex<BTreeMap<String, Running>>,
}

/// The berth binary the replicas run: `BERTH_BIN` (as for `berth-up`; `make
/// test-faults` and `make soak` pass the release build, whose latency and memory
/// are what a cluster sees), else the one built with this test binary.
pub fn binary() -> PathBuf {
    std::env::var_os("BERTH_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_BIN_EXE_berth")))
}

/// Two free ports on 127.0.0.1 (both held until both are chosen).
fn free_ports() -> (u16, u16) {
    let a = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let b = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    (
        a.local_addr().unwrap().port(),
        b.local_addr().unwrap().port(),
    )
}

/// Whether `pid` is alive (a zombie is not).
pub fn alive(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| s.rsplit_once(") ").map(|(_, rest)| !rest.starts_with('Z')))
        .unwrap_or(false)
}

/// Resident memory of `pid` in KiB (0 once it is gone).
pub fn rss_kib(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("VmRSS:"))
                .and_then(|v| v.split_whitespace().next()?.parse().ok())
        })
        .unwrap_or(0)
}

/// CPU time `pid` has used, user and system, in seconds (0 once it is gone).
pub fn cpu_seconds(pid: u32) -> f64 {
    // Linux's USER_HZ, the unit of utime and stime, is 100 on every architecture
    // Kubernetes runs on.
    const TICKS: f64 = 100.0;
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| {
            // After the command's `)`: state is the first field, utime the 12th.
            let fields: Vec<&str> = s.rsplit_once(") ")?.1.split_whitespace().collect();
            let ticks = |i: usize| fields.get(i)?.parse::<f64>().ok();
            Some((ticks(11)? + ticks(12)?) / TICKS)
        })
        .unwrap_or(0.0)
}

fn signal(pid: u32, signal: &str) {
    let status = Command::new("kill")
        .args([signal, &pid.to_string()])
        .status()
        .expect("kill");
    assert!(status.success(), "kill {signal} {pid}");
}

impl Fleet {
    /// berth installed beside the cluster of this test binary, run as `replicas`
    /// (identities), each ready behind the Service, and the Service registered in
    /// the webhook configurations.
    pub async fn start(nodes: Nodes, replicas: &[&str]) -> Fleet {
        let berth = Berth::shared(nodes);
        let cluster = berth.cluster;
        // berth-up's own process gives way to the replicas (SIGTERM releases its
        // Lease at once).
        let pid = berth.pid();
        signal(pid, "-TERM");
        eventually(
            "berth-up's berth to exit",
            Duration::from_secs(30),
            || async { (!alive(pid)).then_some(()) },
        )
        .await;

        let admin = std::fs::read_to_string(cluster.kubeconfig()).unwrap();
        let server = admin
            .lines()
            .find_map(|l| l.trim().strip_prefix("server: "))
            .expect("server in the kubeconfig")
            .to_owned();
        let api_port: u16 = server.rsplit(':').next().unwrap().parse().unwrap();
        let link = Proxy::start(&[("kube-apiserver", api_port)], false);
        let account = std::fs::read_to_string(cluster.berth_service_account_kubeconfig()).unwrap();
        let kubeconfig = cluster.dir.join("berth-link.kubeconfig");
        std::fs::write(
            &kubeconfig,
            account.replace(&server, &format!("https://127.0.0.1:{}", link.port)),
        )
        .unwrap();
        let fleet = Fleet {
            berth,
            service: Proxy::start(&[], true),
            link,
            kubeconfig,
            replicas: Mutex::new(BTreeMap::new()),
        };
        for identity in replicas {
            fleet.start_replica(identity);
        }
        for identity in replicas {
            fleet.wait_ready(identity).await;
        }
        let client = cluster.client().await;
        fleet
            .point_webhooks(&client, |url| {
                let path = url.split_once("://").unwrap().1;
                let path = &path[path.find('/').unwrap_or(path.len())..];
                format!("https://127.0.0.1:{}{path}", fleet.service.port)
            })
            .await;
        fleet
    }

    /// Starts `berth serve` as `identity` (a new process on new ports, as a new
    /// container), recorded in the cluster's pids file, and puts it behind the
    /// Service (new connections reach it once its `/readyz` answers).
    pub fn start_replica(&self, identity: &str) {
        let dir = &self.berth.cluster.dir;
        let certs = self.berth.certs_dir();
        let (port, metrics_port) = free_ports();
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(dir.join(format!("logs/{identity}.log")))
            .unwrap();
        let metrics_addr = format!("127.0.0.1:{metrics_port}");
        let child = super::serve_command(&binary(), &certs, port, &metrics_addr, &self.kubeconfig)
            .args(["--cert-check-seconds", "1", "--shutdown-grace-seconds", "5"])
            .args(["--identity", identity])
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("start a berth replica");
        let pid = child.id();
        if let Ok(exe) = std::fs::read_link(format!("/proc/{pid}/exe")) {
            let mut pids = std::fs::OpenOptions::new()
                .append(true)
                .open(dir.join("pids"))
                .unwrap();
            writeln!(pids, "berth-{identity} {pid} {}", exe.display()).unwrap();
        }
        self.service.set_backend(identity, port, false);
        let previous = self.replicas.lock().unwrap().insert(
            identity.into(),
            Running {
                child,
                port,
                metrics_port,
            },
        );
        if let Some(mut old) = previous {
            let _ = old.child.kill();
            let _ = old.child.wait();
        }
    }

    /// Waits until `identity` takes connections behind the Service.
    pub async fn wait_ready(&self, identity: &str) {
        eventually(
            &format!("{identity} ready behind the Service"),
            Duration::from_secs(90),
            || async { self.service.is_ready(identity).then_some(()) },
        )
        .await;
    }

    /// The identities running now.
    pub fn identities(&self) -> Vec<String> {
        self.replicas.lock().unwrap().keys().cloned().collect()
    }

    /// The pid of `identity`.
    pub fn pid(&self, identity: &str) -> u32 {
        self.replicas.lock().unwrap()[identity].child.id()
    }

    /// `identity`'s webhook port.
    pub fn port(&self, identity: &str) -> u16 {
        self.replicas.lock().unwrap()[identity].port
    }

    /// The pids of every replica running now.
    pub fn pids(&self) -> Vec<u32> {
        self.replicas
            .lock()
            .unwrap()
            .values()
            .map(|r| r.child.id())
            .collect()
    }

    /// `identity`'s Prometheus text.
    pub fn metrics(&self, identity: &str) -> String {
        let port = self.replicas.lock().unwrap()[identity].metrics_port;
        let output = Command::new("curl")
            .args(["-s", &format!("http://127.0.0.1:{port}/metrics")])
            .output()
            .expect("curl");
        String::from_utf8_lossy(&output.stdout).into_owned()
    }

    /// SIGKILL: no graceful anything; its endpoint stays until the probe sees it
    /// gone, as a Service's does.
    pub async fn kill(&self, identity: &str) {
        let pid = self.pid(identity);
        signal(pid, "-KILL");
        self.reap(identity, Duration::from_secs(10)).await;
        self.replicas.lock().unwrap().remove(identity);
    }

    /// A graceful stop as a rolling update does it: the endpoint goes first, then
    /// SIGTERM; waits until the process has exited.
    pub async fn terminate(&self, identity: &str) {
        self.service.remove_backend(identity);
        let pid = self.pid(identity);
        signal(pid, "-TERM");
        self.reap(identity, Duration::from_secs(30)).await;
        self.replicas.lock().unwrap().remove(identity);
    }

    async fn reap(&self, identity: &str, limit: Duration) {
        eventually(&format!("{identity} to exit"), limit, || async {
            let mut replicas = self.replicas.lock().unwrap();
            let running = replicas.get_mut(identity)?;
            running.child.try_wait().ok()?.map(|_| ())
        })
        .await;
    }

    /// Who holds the controller Lease now.
    pub async fn leader(&self, client: &Client) -> Option<String> {
        lease_holder(client).await
    }

    /// Rewrites every webhook's url with `url`.
    pub async fn point_webhooks(&self, client: &Client, url: impl Fn(&str) -> String) {
        self.edit_webhooks(client, |config| {
            if let Some(old) = config.url.as_deref() {
                config.url = Some(url(old));
            }
        })
        .await;
    }

    /// Sets every webhook's caBundle to `bundle_pem` (PEM, one CA or several).
    pub async fn set_ca_bundle(&self, client: &Client, bundle_pem: &str) {
        self.edit_webhooks(client, |config| {
            config.ca_bundle = Some(k8s_openapi::ByteString(bundle_pem.as_bytes().to_vec()));
        })
        .await;
    }

    async fn edit_webhooks(
        &self,
        client: &Client,
        edit: impl Fn(&mut k8s_openapi::api::admissionregistration::v1::WebhookClientConfig),
    ) {
        let mutating: Api<MutatingWebhookConfiguration> = Api::all(client.clone());
        let validating: Api<ValidatingWebhookConfiguration> = Api::all(client.clone());
        let mut m = mutating.get("berth").await.expect("mutating configuration");
        for hook in m.webhooks.iter_mut().flatten() {
            edit(&mut hook.client_config);
        }
        mutating
            .replace("berth", &PostParams::default(), &m)
            .await
            .expect("replace the mutating configuration");
        let mut v = validating
            .get("berth")
            .await
            .expect("validating configuration");
        for hook in v.webhooks.iter_mut().flatten() {
            edit(&mut hook.client_config);
        }
        validating
            .replace("berth", &PostParams::default(), &v)
            .await
            .expect("replace the validating configuration");
    }

    /// The serial of the certificate `identity` serves on a new connection.
    pub async fn served_serial(&self, identity: &str) -> String {
        let script = format!(
            "openssl s_client -connect 127.0.0.1:{} </dev/null 2>/dev/null | openssl x509 -noout -serial",
            self.port(identity)
        );
        let out = tokio::process::Command::new("bash")
            .args(["-c", &script])
            .output()
            .await
            .unwrap();
        String::from_utf8_lossy(&out.stdout).trim().to_owned()
    }

    /// Waits until every replica serves the certificate with `serial`.
    pub async fn wait_serving(&self, serial: &str, limit: Duration) {
        for identity in self.identities() {
            eventually(&format!("{identity} serving {serial}"), limit, || async {
                (self.served_serial(&identity).await == serial).then_some(())
            })
            .await;
        }
    }

    /// The serial of the certificate file `tls.crt` now, as openssl prints it.
    pub fn file_serial(&self) -> String {
        let out = Command::new("openssl")
            .args(["x509", "-noout", "-serial", "-in"])
            .arg(self.berth.certs_dir().join("tls.crt"))
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout).trim().to_owned()
    }

    /// Whether `/readyz` of `identity` answers now.
    pub async fn ready_now(&self, identity: &str) -> bool {
        readyz(self.port(identity)).await
    }

    /// The peak RSS of the replicas running now, in KiB.
    pub fn rss_kib(&self) -> Vec<(String, u64)> {
        self.replicas
            .lock()
            .unwrap()
            .iter()
            .map(|(id, r)| (id.clone(), rss_kib(r.child.id())))
            .collect()
    }
}

impl Drop for Fleet {
    fn drop(&mut self) {
        for running in self.replicas.lock().unwrap().values_mut() {
            let _ = running.child.kill();
            let _ = running.child.wait();
        }
    }
}

/// Writes `contents` to `path` through a temporary file and a rename, as a Secret
/// volume is updated: a reader sees the old file or the new one, never half.
pub fn replace_file(path: &std::path::Path, contents: &str) {
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, contents).unwrap();
    std::fs::rename(&tmp, path).unwrap();
}

/// Time since `start`, in seconds with one decimal, for reports.
pub fn secs(start: Instant) -> f64 {
    (start.elapsed().as_secs_f64() * 10.0).round() / 10.0
}

/// Samples a process's resident memory every 50 ms until dropped; the peak.
pub struct PeakRss {
    peak: std::sync::Arc<std::sync::atomic::AtomicU64>,
    task: tokio::task::JoinHandle<()>,
}

impl PeakRss {
    pub fn start(pid: u32) -> PeakRss {
        use std::sync::atomic::{AtomicU64, Ordering};
        let peak = std::sync::Arc::new(AtomicU64::new(rss_kib(pid)));
        let task = tokio::spawn({
            let peak = peak.clone();
            async move {
                loop {
                    peak.fetch_max(rss_kib(pid), Ordering::Relaxed);
                    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                }
            }
        });
        PeakRss { peak, task }
    }

    /// The peak so far, in MiB.
    pub fn mib(&self) -> f64 {
        self.peak.load(std::sync::atomic::Ordering::Relaxed) as f64 / 1024.0
    }
}

impl Drop for PeakRss {
    fn drop(&mut self) {
        self.task.abort();
    }
}
