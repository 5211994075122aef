//! Shared by the end-to-end tests: one real control plane per test binary, started
//! by `tests/cluster/up`, and helpers to reach it.
//!
//! The cluster is started on first use and stops by itself when the test binary
//! exits (the `up` script watches our pid). Tests never read `~/.kube/config`: the
//! client is built from the kubeconfig that `up` writes into the cluster folder.
#![allow(dead_code)] // each test binary uses a different part of this module

pub mod attacks;
pub mod audit;
pub mod fixtures;
pub mod fleet;
pub mod helm;
pub mod load;
pub mod logs;
pub mod proxy;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use berth::names;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Namespace, Pod, ServiceAccount};
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::runtime::wait::{Condition, await_condition};
use kube::{Client, Config, Resource};
use serde_json::{Value, json};

/// How many fake nodes a test binary wants, and their name prefix.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Nodes {
    pub count: u32,
    pub prefix: &'static str,
}

/// A running control plane owned by this test binary.
#[derive(Debug)]
pub struct TestCluster {
    pub dir: PathBuf,
    pub nodes: Nodes,
    /// The extra arguments `up` was started with.
    pub up_args: Vec<String>,
}

static CLUSTER: OnceLock<TestCluster> = OnceLock::new();

/// The repository root, where `tests/cluster/` lives.
pub fn repo_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// Runs one of the `tests/cluster/` scripts and panics with its output if it fails.
pub fn cluster_script(name: &str, args: &[&str]) -> String {
    let script = repo_root().join("tests/cluster").join(name);
    let output = Command::new(&script)
        .args(args)
        .env("BERTH_CLUSTER_OWNER_PID", std::process::id().to_string())
        .output()
        .unwrap_or_else(|e| panic!("cannot run {}: {e}", script.display()));
    assert!(
        output.status.success(),
        "{name} {args:?} failed ({}):\n{}{}",
        output.status,
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8_lossy(&output.stdout).into_owned()
}

impl TestCluster {
    /// The cluster of this test binary, started with `nodes` on first use.
    ///
    /// It never skips: if the control plane cannot be built or started, the test
    /// fails with the script's message.
    pub fn shared(nodes: Nodes) -> &'static TestCluster {
        Self::shared_with(nodes, &[])
    }

    /// [`TestCluster::shared`], started with extra arguments to `up` (such as
    /// `--generic-workload`).
    pub fn shared_with(nodes: Nodes, up_args: &[&str]) -> &'static TestCluster {
        let cluster = CLUSTER.get_or_init(|| Self::start(nodes, up_args));
        assert_eq!(
            cluster.up_args, up_args,
            "one test binary must start one kind of cluster"
        );
        assert_eq!(
            cluster.nodes, nodes,
            "one test binary must ask for one node set"
        );
        cluster
    }

    fn start(nodes: Nodes, up_args: &[&str]) -> TestCluster {
        let binary = std::env::current_exe()
            .ok()
            .and_then(|p| p.file_stem().map(|s| s.to_string_lossy().into_owned()))
            .unwrap_or_else(|| "tests".into());
        let dir = repo_root()
            .join("target/test-clusters")
            .join(format!("{binary}-{}", std::process::id()));
        let dir_arg = dir.to_string_lossy().into_owned();
        let mut args = vec![dir_arg.as_str()];
        args.extend_from_slice(up_args);
        cluster_script("up", &args);
        cluster_script(
            "add-nodes",
            &[&dir_arg, &nodes.count.to_string(), "--prefix", nodes.prefix],
        );
        TestCluster {
            dir,
            nodes,
            up_args: up_args.iter().map(|a| a.to_string()).collect(),
        }
    }

    pub fn kubeconfig(&self) -> PathBuf {
        self.dir.join("kubeconfig")
    }

    /// The pid of the component `name` (`kube-apiserver`, `etcd`, `berth`, ...) as
    /// the cluster scripts recorded it, while it runs.
    pub fn pid(&self, name: &str) -> Option<u32> {
        std::fs::read_to_string(self.dir.join("pids"))
            .ok()?
            .lines()
            .find_map(|line| {
                let mut fields = line.split_whitespace();
                (fields.next()? == name).then_some(())?;
                fields.next()?.parse().ok()
            })
    }

    /// A client for this cluster only, built from its own kubeconfig.
    pub async fn client(&self) -> Client {
        client_for(&self.kubeconfig()).await
    }

    /// A client that acts as `user` in `groups`, through impersonation: the
    /// apiserver authorizes and admits its requests as that identity's.
    pub async fn client_as(&self, user: &str, groups: &[&str]) -> Client {
        let kubeconfig = Kubeconfig::read_from(self.kubeconfig()).expect("kubeconfig");
        let mut config = Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
            .await
            .expect("kubeconfig written by tests/cluster/up is usable");
        config.auth_info.impersonate = Some(user.to_owned());
        config.auth_info.impersonate_groups = Some(groups.iter().map(|g| g.to_string()).collect());
        Client::try_from(config).expect("impersonating client")
    }

    /// A client that acts as the kubelet of `node` (`system:node:<node>` in
    /// `system:nodes`): the Node authorizer and NodeRestriction judge it as they
    /// judge that kubelet.
    pub async fn node_client(&self, node: &str) -> Client {
        let user = format!("system:node:{node}");
        self.client_as(&user, &["system:nodes", "system:authenticated"])
            .await
    }

    /// The node names, `<prefix>1..<prefix>N`.
    pub fn node_names(&self) -> Vec<String> {
        (1..=self.nodes.count)
            .map(|i| format!("{}{i}", self.nodes.prefix))
            .collect()
    }

    /// Our own kubectl, pointed at this cluster.
    pub fn kubectl(&self, args: &[&str]) -> std::process::Output {
        kubectl(&self.dir, args)
    }

    /// kubectl that must succeed; its stdout, or a panic with its stderr.
    pub fn kubectl_ok(&self, args: &[&str]) -> String {
        let out = self.kubectl(args);
        assert!(
            out.status.success(),
            "kubectl {args:?} failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// The value of berth's pool taint on `node` (empty when it has none).
    pub fn pool_taint(&self, node: &str) -> String {
        let path = format!(
            "jsonpath={{.spec.taints[?(@.key==\"{}\")].value}}",
            names::POOL_TAINT
        );
        self.kubectl_ok(&["get", "node", node, "-o", &path])
    }

    /// Waits, up to `limit`, until `policy`'s pool is in place on each of `nodes`:
    /// its status counts the node, and the node carries the pool's taint (written
    /// in one request with its label). A policy has no effect on nodes until its
    /// finalizer is in place, so a pool comes a moment after its policy.
    pub fn wait_for_pool(&self, policy: &str, nodes: &[&str], limit: Duration) {
        let deadline = std::time::Instant::now() + limit;
        for node in nodes {
            loop {
                let counted =
                    self.kubectl_ok(&["get", "bpp", policy, "-o", "jsonpath={.status.nodeNames}"]);
                if counted.contains(node) && self.pool_taint(node) == policy {
                    break;
                }
                assert!(
                    std::time::Instant::now() < deadline,
                    "pool {policy} never set up on {node}"
                );
                std::thread::sleep(Duration::from_millis(200));
            }
        }
    }

    /// The kubeconfig berth-up wrote: it acts as the ServiceAccount
    /// `berth-system/berth` with the shipped `manifests/rbac.yaml`, so berth started
    /// with it has exactly the permissions an installation grants.
    pub fn berth_service_account_kubeconfig(&self) -> PathBuf {
        self.dir.join("berth.kubeconfig")
    }

    /// A PlacementPolicy `name` with `spec`, for the pods labelled `app: <name>`.
    pub fn apply_app_policy(&self, name: &str, spec: Value) {
        let mut spec = spec;
        spec["podSelector"] = json!({"matchLabels": {"app": name}});
        self.apply_policies(&[fixtures::policy(name, spec)]);
    }

    /// `kubectl apply -f -` of `yaml`, which must succeed.
    pub fn apply(&self, yaml: &str) {
        let out = kubectl_with_input(&self.dir, &["apply", "-f", "-"], yaml);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

/// A tenant: a user with the built-in `edit` role in one namespace only, reached
/// through impersonation. Attacks are tried as a tenant, never as cluster-admin.
#[derive(Debug, Clone)]
pub struct Tenant {
    pub user: String,
    pub namespace: String,
}

impl Tenant {
    /// Binds `edit` in `namespace` to `user`, waiting until the apiserver's
    /// authorizer says the tenant may create pods there.
    pub async fn new(cluster: &TestCluster, user: &str, namespace: &str) -> Tenant {
        let binding = format!(
            "apiVersion: rbac.authorization.k8s.io/v1\nkind: RoleBinding\nmetadata: {{name: {user}-edit, namespace: {namespace}}}\n\
             roleRef: {{apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: edit}}\n\
             subjects: [{{apiGroup: rbac.authorization.k8s.io, kind: User, name: {user}}}]\n"
        );
        cluster.apply(&binding);
        let tenant = Tenant {
            user: user.into(),
            namespace: namespace.into(),
        };
        eventually(
            &format!("{user} may create pods in {namespace}"),
            Duration::from_secs(30),
            || async {
                let out = tenant.kubectl(cluster, &["auth", "can-i", "create", "pods"]);
                out.status.success().then_some(())
            },
        )
        .await;
        tenant
    }

    /// A client that acts as the tenant.
    pub async fn client(&self, cluster: &TestCluster) -> Client {
        cluster
            .client_as(&self.user, &["system:authenticated"])
            .await
    }

    /// Our kubectl as the tenant, in its namespace.
    pub fn kubectl(&self, cluster: &TestCluster, args: &[&str]) -> std::process::Output {
        let mut all = vec![
            "--as",
            &self.user,
            "--as-group",
            "system:authenticated",
            "-n",
            &self.namespace,
        ];
        all.extend_from_slice(args);
        cluster.kubectl(&all)
    }

    /// `kubectl create -f -` of `manifest` (YAML or JSON) as the tenant.
    pub fn create(&self, cluster: &TestCluster, manifest: &str) -> std::process::Output {
        let args = [
            "--as",
            &self.user,
            "--as-group",
            "system:authenticated",
            "-n",
            &self.namespace,
            "create",
            "-f",
            "-",
        ];
        kubectl_with_input(&cluster.dir, &args, manifest)
    }
}

/// A client for the cluster whose kubeconfig is at `path`.
pub async fn client_for(path: &Path) -> Client {
    let kubeconfig = Kubeconfig::read_from(path)
        .unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()));
    let config = Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
        .await
        .expect("kubeconfig written by tests/cluster/up is usable");
    Client::try_from(config).expect("client from the test kubeconfig")
}

/// Runs the kubectl built for the test cluster in `dir`.
pub fn kubectl(dir: &Path, args: &[&str]) -> std::process::Output {
    let bin = cluster_script("build", &[]).trim().to_owned();
    Command::new(Path::new(&bin).join("kubectl"))
        .arg("--kubeconfig")
        .arg(dir.join("kubeconfig"))
        .args(args)
        .output()
        .expect("run kubectl")
}

/// Creates a namespace named after `purpose` with a unique suffix and waits until
/// its `default` ServiceAccount exists, so pods can be created in it at once.
pub async fn fresh_namespace(client: &Client, purpose: &str) -> String {
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let name = format!(
        "{purpose}-{}-{}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    );
    let namespaces: Api<Namespace> = Api::all(client.clone());
    let mut ns = Namespace::default();
    ns.meta_mut().name = Some(name.clone());
    namespaces
        .create(&PostParams::default(), &ns)
        .await
        .unwrap_or_else(|e| panic!("create namespace {name}: {e}"));
    let accounts: Api<ServiceAccount> = Api::namespaced(client.clone(), &name);
    wait_for(
        &accounts,
        "default",
        |sa: Option<&ServiceAccount>| sa.is_some(),
        Duration::from_secs(30),
    )
    .await;
    name
}

/// Waits until `condition` holds for the object `name`, or panics after `limit`.
pub async fn wait_for<K, C>(api: &Api<K>, name: &str, condition: C, limit: Duration) -> Option<K>
where
    K: kube::Resource + Clone + std::fmt::Debug + serde::de::DeserializeOwned + Send + 'static,
    C: Condition<K>,
{
    tokio::time::timeout(limit, await_condition(api.clone(), name, condition))
        .await
        .unwrap_or_else(|_| panic!("{name} did not reach the expected state within {limit:?}"))
        .unwrap_or_else(|e| panic!("watching {name}: {e}"))
}

/// Polls `probe` every 200 ms until it returns `Some`, or panics after `limit`
/// with `what`. For conditions over lists, where a single-object watch does not fit.
pub async fn eventually<T, F, Fut>(what: &str, limit: Duration, mut probe: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let deadline = tokio::time::Instant::now() + limit;
    loop {
        if let Some(value) = probe().await {
            return value;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out after {limit:?} waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Waits for berth's `HeldForExclusion` Event about pod `name` in `namespace`
/// whose note says `why`, and returns the note.
pub async fn held_for_exclusion(client: &Client, namespace: &str, name: &str, why: &str) -> String {
    use k8s_openapi::api::events::v1::Event;
    use kube::api::ListParams;
    let events: Api<Event> = Api::namespaced(client.clone(), namespace);
    let what = format!("berth's HeldForExclusion Event on {name} saying {why:?}");
    eventually(&what, Duration::from_secs(60), || async {
        let list = events
            .list(&ListParams::default().fields("reason=HeldForExclusion"))
            .await
            .ok()?;
        list.items
            .into_iter()
            .filter(|e| e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(name))
            .filter_map(|e| e.note)
            .find(|note| note.contains(why))
    })
    .await
}

/// A wait condition: the pod exists and the scheduler has bound it to a node.
pub fn is_bound(pod: Option<&Pod>) -> bool {
    pod.and_then(|p| p.spec.as_ref())
        .and_then(|s| s.node_name.as_ref())
        .is_some()
}

/// berth running against a [`TestCluster`], started by `tests/cluster/berth-up`.
#[derive(Debug)]
pub struct Berth {
    pub cluster: &'static TestCluster,
    pub port: u16,
    pub metrics_port: u16,
    /// The extra `berth serve` arguments it was started with.
    pub serve_args: Vec<String>,
}

static BERTH: OnceLock<Berth> = OnceLock::new();

impl Berth {
    /// berth beside the cluster of this test binary, started on first use.
    pub fn shared(nodes: Nodes) -> &'static Berth {
        Self::shared_with(nodes, &[], &[])
    }

    /// [`Berth::shared`] beside a cluster started with extra `up` arguments, and
    /// with extra `berth serve` arguments (such as `--no-controller`); `{cluster}`
    /// in them stands for the cluster's folder.
    pub fn shared_with(nodes: Nodes, up_args: &[&str], serve_args: &[&str]) -> &'static Berth {
        Self::shared_as(nodes, up_args, serve_args, true)
    }

    /// [`Berth::shared`] without the MutatingAdmissionPolicy `berth-placement`, as
    /// on a cluster before 1.36: what the validating policies, the taints and the
    /// missed scan do alone with berth down.
    pub fn shared_without_placement_policy(nodes: Nodes) -> &'static Berth {
        Self::shared_as(nodes, &[], &[], false)
    }

    fn shared_as(
        nodes: Nodes,
        up_args: &[&str],
        serve_args: &[&str],
        placement_policy: bool,
    ) -> &'static Berth {
        let berth = BERTH.get_or_init(|| {
            let cluster = TestCluster::shared_with(nodes, up_args);
            let dir = cluster.dir.to_string_lossy().into_owned();
            // The test binary was built with the same sources: use its berth, unless
            // BERTH_BIN names another (the static release build, in `make test`; a
            // bench's earlier release).
            let bin = std::env::var("BERTH_BIN")
                .unwrap_or_else(|_| env!("CARGO_BIN_EXE_berth").to_owned());
            let output = Command::new(repo_root().join("tests/cluster/berth-up"))
                .arg(&dir)
                .args(serve_args.iter().map(|a| a.replace("{cluster}", &dir)))
                .env("BERTH_BIN", bin)
                .env(
                    "BERTH_PLACEMENT_POLICY",
                    if placement_policy { "on" } else { "off" },
                )
                .output()
                .expect("run berth-up");
            assert!(
                output.status.success(),
                "berth-up failed:\n{}",
                String::from_utf8_lossy(&output.stderr)
            );
            let ports = std::fs::read_to_string(cluster.dir.join("berth.ports")).expect("ports");
            let mut ports = ports.split_whitespace().map(|p| p.parse().expect("port"));
            Berth {
                cluster,
                port: ports.next().expect("webhook port"),
                metrics_port: ports.next().expect("metrics port"),
                serve_args: serve_args.iter().map(|a| a.to_string()).collect(),
            }
        });
        assert_eq!(
            berth.serve_args, serve_args,
            "one test binary must start one kind of berth"
        );
        berth
    }

    pub fn certs_dir(&self) -> PathBuf {
        self.cluster.dir.join("berth-certs")
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(self.cluster.dir.join("logs/berth.log")).unwrap_or_default()
    }

    /// The pid berth-up recorded.
    pub fn pid(&self) -> u32 {
        self.cluster.pid("berth").expect("berth pid")
    }

    /// The Prometheus text from berth's metrics port.
    pub fn metrics(&self) -> String {
        let output = Command::new("curl")
            .args([
                "-s",
                &format!("http://127.0.0.1:{}/metrics", self.metrics_port),
            ])
            .output()
            .expect("curl");
        String::from_utf8_lossy(&output.stdout).into_owned()
    }

    /// The value of one sample (`name` with its labels, as printed) on berth's
    /// metrics port, if berth reports it.
    pub fn metric(&self, name: &str) -> Option<f64> {
        samples(&self.metrics()).find_map(|(sample, value)| (sample == name).then_some(value))
    }

    /// Runs the berth binary under test.
    pub fn run(&self, args: &[&str]) -> std::process::Output {
        Command::new(env!("CARGO_BIN_EXE_berth"))
            .args(args)
            .output()
            .expect("run berth")
    }
}

/// The samples of a Prometheus text page: each with its labels, as printed, and
/// its value. Comments and lines without a number are left out.
pub fn samples(text: &str) -> impl Iterator<Item = (&str, f64)> {
    text.lines().filter_map(|line| {
        let (sample, value) = line.rsplit_once(' ')?;
        Some((sample, value.parse().ok()?))
    })
}

/// Runs our kubectl with `stdin`, returning the output.
pub fn kubectl_with_input(dir: &Path, args: &[&str], stdin: &str) -> std::process::Output {
    use std::io::Write;
    let bin = cluster_script("build", &[]).trim().to_owned();
    let mut child = Command::new(Path::new(&bin).join("kubectl"))
        .arg("--kubeconfig")
        .arg(dir.join("kubeconfig"))
        .args(args)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("run kubectl");
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(stdin.as_bytes())
        .expect("write stdin");
    child.wait_with_output().expect("kubectl output")
}

/// Pod name to node, once `count` pods in `ns` matching `selector` are all bound.
pub async fn placed(
    client: &Client,
    ns: &str,
    selector: &str,
    count: usize,
    limit: Duration,
) -> std::collections::BTreeMap<String, String> {
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    eventually(
        &format!("{count} bound pods {selector} in {ns}"),
        limit,
        || async {
            let list = pods
                .list(&kube::api::ListParams::default().labels(selector))
                .await
                .ok()?;
            let bound: std::collections::BTreeMap<String, String> = list
                .items
                .into_iter()
                .filter_map(|p| Some((p.metadata.name?, p.spec?.node_name?)))
                .collect();
            (bound.len() == count).then_some(bound)
        },
    )
    .await
}

/// `berth serve` (webhook and controller) from `binary`, serving the pair in
/// `certs` on 127.0.0.1:`port` and its metrics on `metrics_addr`, reaching the
/// cluster through `kubeconfig`; the caller adds its own flags and output.
pub fn serve_command(
    binary: &Path,
    certs: &Path,
    port: u16,
    metrics_addr: &str,
    kubeconfig: &Path,
) -> Command {
    let mut command = Command::new(binary);
    command
        .arg("serve")
        .arg("--tls-cert")
        .arg(certs.join("tls.crt"))
        .arg("--tls-key")
        .arg(certs.join("tls.key"))
        .args(["--addr", &format!("127.0.0.1:{port}")])
        .args(["--metrics-addr", metrics_addr])
        .arg("--kubeconfig")
        .arg(kubeconfig);
    command
}

/// A controller-only replica, killed when dropped.
pub struct Replica(Child);

impl Replica {
    /// A controller-only berth named `identity`, reaching the cluster through
    /// `kubeconfig`.
    pub fn start(berth: &Berth, identity: &str, kubeconfig: &Path) -> Replica {
        let log =
            std::fs::File::create(berth.cluster.dir.join(format!("logs/{identity}.log"))).unwrap();
        let child = Command::new(env!("CARGO_BIN_EXE_berth"))
            .args([
                "serve",
                "--no-webhook",
                "--metrics-addr",
                "127.0.0.1:0",
                "--identity",
                identity,
            ])
            .arg("--kubeconfig")
            .arg(kubeconfig)
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("start a replica");
        Replica(child)
    }

    pub fn signal(&self, signal: &str) {
        let status = Command::new("kill")
            .args([signal, &self.0.id().to_string()])
            .status()
            .unwrap();
        assert!(status.success());
    }
}

impl Drop for Replica {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Sets the annotation `key` to `value` on namespace `ns`.
pub async fn annotate(client: &Client, ns: &str, key: &str, value: &str) {
    let namespaces: Api<Namespace> = Api::all(client.clone());
    let patch = json!({"metadata": {"annotations": {key: value}}});
    namespaces
        .patch(ns, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .expect("annotate");
}

/// Opts `ns` into `policies` (the `berth.io/policies` annotation) and waits until
/// berth's webhook applies the first of them to `probe`, a dry run: berth's caches
/// are eventually consistent, and a pod created the same instant as the annotation
/// may be admitted by a cache that has not seen it yet.
pub async fn opt_in(client: &Client, ns: &str, policies: &str, probe: &Pod, limit: Duration) {
    annotate(client, ns, names::POLICIES_ANNOTATION, policies).await;
    let wanted = policies.split(',').next().unwrap_or_default().trim();
    wait_admitted(
        client,
        ns,
        probe,
        &format!("berth applies {wanted} in {ns}"),
        |p| has_applied(p, wanted),
        limit,
    )
    .await;
}

/// A fresh namespace that [`opt_in`]s to `policies`, probed with a
/// [`test_pod`] labelled `probe_labels`.
pub async fn opted_in(
    client: &Client,
    purpose: &str,
    policies: &str,
    probe_labels: Value,
    limit: Duration,
) -> String {
    let ns = fresh_namespace(client, purpose).await;
    let probe = test_pod("probe", probe_labels, json!({}));
    opt_in(client, &ns, policies, &probe, limit).await;
    ns
}

/// Waits until berth's webhook admits `probe` in `ns` (a dry run) so that
/// `admitted` holds. berth's caches of policies and namespaces are eventually
/// consistent: a pod created the instant a policy or an annotation appears may be
/// admitted by a cache that has not seen it yet.
pub async fn wait_admitted(
    client: &Client,
    ns: &str,
    probe: &Pod,
    what: &str,
    admitted: impl Fn(&Pod) -> bool,
    limit: Duration,
) {
    let api: Api<Pod> = Api::namespaced(client.clone(), ns);
    let dry_run = PostParams {
        dry_run: true,
        ..Default::default()
    };
    eventually(what, limit, || async {
        let created = api.create(&dry_run, probe).await.ok()?;
        admitted(&created).then_some(())
    })
    .await;
}

/// Whether berth's `berth.io/applied` on `pod` names `policy`.
pub fn has_applied(pod: &Pod, policy: &str) -> bool {
    pod.metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(names::APPLIED_ANNOTATION))
        .is_some_and(|applied| applied.split(',').any(|p| p == policy))
}

/// How many pods a DaemonSet's controller means to make, once it has made every
/// one: it has seen the DaemonSet's latest spec and `currentNumberScheduled` is
/// `desiredNumberScheduled`. `None` until then (a DaemonSet it has not looked at
/// yet reports 0 of 0).
pub fn daemonset_made_all(daemonset: &k8s_openapi::api::apps::v1::DaemonSet) -> Option<i32> {
    let status = daemonset.status.as_ref()?;
    let seen = status.observed_generation.is_some()
        && status.observed_generation == daemonset.metadata.generation;
    (seen && status.current_number_scheduled == status.desired_number_scheduled)
        .then_some(status.desired_number_scheduled)
}

/// A pod with one small container (`redis:7`, 100m CPU) and `labels`;
/// `extra_spec` is merged into its spec.
pub fn test_pod(name: &str, labels: Value, extra_spec: Value) -> Pod {
    fixtures::pod(name)
        .container("redis", "redis:7")
        .cpu("100m")
        .labels(labels)
        .spec(extra_spec)
        .build()
}

/// Gang member `name` of group `group` of `size` under the policy that selects
/// `app: <policy>` (the default `podGroup`/`minAvailable` labels), requesting `cpu`.
pub fn gang_member(policy: &str, name: &str, group: &str, size: u32, cpu: &str) -> Pod {
    fixtures::pod(name)
        .container("redis", "redis:7")
        .cpu(cpu)
        .labels(json!({"app": policy, "podGroup": group, "minAvailable": size.to_string()}))
        .build()
}

/// Creates all pods concurrently, as a StatefulSet or a burst of Jobs would.
pub async fn create_at_once(client: &Client, ns: &str, pods: Vec<Pod>) {
    let api: Api<Pod> = Api::namespaced(client.clone(), ns);
    let params = PostParams::default();
    let creates = pods.iter().map(|p| api.create(&params, p));
    for result in futures::future::join_all(creates).await {
        result.expect("create pod");
    }
}

/// Who holds the controller Lease `berth-system/berth-controller` now.
pub async fn lease_holder(client: &Client) -> Option<String> {
    let leases: Api<Lease> = Api::namespaced(client.clone(), "berth-system");
    leases
        .get_opt("berth-controller")
        .await
        .ok()??
        .spec?
        .holder_identity
}

/// Whether `pid` is a live process; a zombie waiting for its parent to reap it
/// has already stopped.
pub fn running(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|stat| {
            let state = stat.rsplit_once(") ")?.1.chars().next()?;
            Some(state != 'Z')
        })
        .unwrap_or(false)
}
