//! `berth serve`: the admission webhook over HTTPS, and metrics over plain HTTP.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use clap::Args;
use tokio_util::sync::CancellationToken;

use crate::admission::body::BodyLimits;
use crate::admission::handlers::{AppState, router};
use crate::admission::server::{Connections, Trust, bind, serve_plain, serve_tls};
use crate::admission::tls::ReloadingCert;
use crate::cluster::Cluster;
use crate::controller::{self, ControllerOptions};
use crate::policy::exempt::Exempt;
use crate::telemetry::Metrics;

/// Flags of `berth serve`; each can also be set by its `BERTH_*` variable.
#[derive(Debug, Args)]
pub struct ServeArgs {
    /// PEM serving certificate; re-read when it changes.
    #[arg(long, env = "BERTH_TLS_CERT", default_value = "/certs/tls.crt")]
    pub tls_cert: PathBuf,
    /// PEM private key of the serving certificate; re-read when it changes.
    #[arg(long, env = "BERTH_TLS_KEY", default_value = "/certs/tls.key")]
    pub tls_key: PathBuf,
    /// PEM CA whose client certificates alone may send reviews: configure the
    /// apiserver to present one (its admission configuration's kubeConfigFile).
    /// Anyone else gets a 403 before any of its review is read; /healthz and
    /// /readyz need no certificate.
    #[arg(long, env = "BERTH_CLIENT_CA")]
    pub client_ca: Option<PathBuf>,
    /// Addresses (CIDRs, comma-separated) the apiserver calls the webhook from;
    /// reviews from anywhere else get a 403 before any of it is read. For a
    /// cluster whose apiserver cannot present a client certificate.
    #[arg(long, env = "BERTH_APISERVER_CIDRS", value_delimiter = ',')]
    pub apiserver_cidrs: Vec<ipnet::IpNet>,
    /// Address of the HTTPS webhook (/mutate, /validate, /healthz, /readyz).
    #[arg(long, env = "BERTH_ADDR", default_value = "0.0.0.0:8443")]
    pub addr: SocketAddr,
    /// Address of the plain-HTTP Prometheus endpoint (/metrics).
    #[arg(long, env = "BERTH_METRICS_ADDR", default_value = "0.0.0.0:9090")]
    pub metrics_addr: SocketAddr,
    /// Largest request body read. The default covers the largest review the
    /// apiserver sends: two objects at etcd's 1.5 MiB limit, each byte escaped to
    /// six (`<` becomes `\u003c`). A larger one is denied by its uid.
    #[arg(long, env = "BERTH_MAX_BODY_BYTES", default_value_t = MAX_REVIEW_BYTES)]
    pub max_body_bytes: usize,
    /// Memory, in MiB, that the request bodies being decided at once may take,
    /// each charged 48 times its length; a request that finds no room within a
    /// second is denied, so memory stays bounded under a flood of large pods.
    #[arg(long, env = "BERTH_REQUEST_MEMORY_MIB", default_value_t = 128)]
    pub request_memory_mib: usize,
    /// Threads that serve requests and run the controller; defaults to the
    /// machine's cores. Memory does not follow it: reading and deciding reviews is
    /// charged to --request-memory-mib however many threads run.
    #[arg(long, env = "BERTH_WORKER_THREADS")]
    pub worker_threads: Option<std::num::NonZeroUsize>,
    /// Admission requests read and decided at once, once their body has arrived;
    /// more wait their turn, until their deadline (then they are refused).
    #[arg(long, env = "BERTH_MAX_IN_FLIGHT", default_value_t = 256)]
    pub max_in_flight: usize,
    /// Webhook connections open at once, shared fairly among client addresses:
    /// when none is left, an address with fewer than an equal share takes one
    /// from the address with the most.
    #[arg(long, env = "BERTH_MAX_CONNECTIONS", default_value_t = 128)]
    pub max_connections: usize,
    /// The apiserver's timeout for berth's webhooks (their timeoutSeconds), in
    /// seconds: every review is answered a third of it before it ends. A review's
    /// own ?timeout= may shorten it, never lengthen it.
    #[arg(
        long,
        env = "BERTH_REVIEW_TIMEOUT_SECONDS",
        default_value_t = crate::admission::webhooks::TIMEOUT_SECONDS,
        value_parser = clap::value_parser!(u64).range(1..=30)
    )]
    pub review_timeout_seconds: u64,
    /// How long a request body may take to arrive, in seconds.
    #[arg(long, env = "BERTH_READ_TIMEOUT_SECONDS", default_value_t = 10)]
    pub read_timeout_seconds: u64,
    /// How often the certificate files are checked for changes, in seconds.
    #[arg(long, env = "BERTH_CERT_CHECK_SECONDS", default_value_t = 2)]
    pub cert_check_seconds: u64,
    /// How long shutdown waits for in-flight requests, in seconds.
    #[arg(long, env = "BERTH_SHUTDOWN_GRACE_SECONDS", default_value_t = 20)]
    pub shutdown_grace_seconds: u64,
    /// Kubeconfig to use; without it, the in-cluster service account (or the
    /// usual kubeconfig lookup) is used.
    #[arg(long, env = "BERTH_KUBECONFIG")]
    pub kubeconfig: Option<PathBuf>,
    /// Run only the webhook, not the node controller.
    #[arg(long, env = "BERTH_NO_CONTROLLER", conflicts_with = "no_webhook")]
    pub no_controller: bool,
    /// Run only the node controller (and metrics), not the webhook.
    #[arg(long, env = "BERTH_NO_WEBHOOK")]
    pub no_webhook: bool,
    /// Namespace of the controller's leader-election Lease `berth-controller`.
    #[arg(long, env = "BERTH_LEASE_NAMESPACE", default_value = "berth-system")]
    pub lease_namespace: String,
    /// This replica's name in the Lease; defaults to the host name (the pod name).
    #[arg(long, env = "BERTH_IDENTITY")]
    pub identity: Option<String>,
    /// A full controller pass at least this often, in seconds, even without changes.
    #[arg(long, env = "BERTH_RESYNC_SECONDS", default_value_t = 60)]
    pub resync_seconds: u64,
    /// Controller writes of each kind but node writes (DaemonSet, release,
    /// eviction, ...) per second on average, each kind its own budget (bursts of
    /// twice that).
    #[arg(long, env = "BERTH_CONTROLLER_QPS", default_value_t = 100)]
    pub controller_qps: u32,
    /// Node label and taint writes per second on average (bursts of twice that): a
    /// new pool over N nodes is N writes, and until a node carries the pool's taint
    /// other pods may still land on it.
    #[arg(long, env = "BERTH_NODE_QPS", default_value_t = 300)]
    pub node_qps: u32,
    /// How long, in seconds, a released pod of an avoid policy that no scheduler
    /// has bound (counted from its release, whatever its conditions) may hold the
    /// pods behind it: then berth evicts it if a ReplicaSet, StatefulSet or
    /// ReplicationController makes it again (behind them), and sets any other
    /// aside (it stops holding them). 0: never.
    #[arg(
        long,
        env = "BERTH_REQUEUE_UNSCHEDULABLE_SECONDS",
        default_value_t = 120
    )]
    pub requeue_unschedulable_seconds: u64,
    /// Namespaces the webhook configurations leave out (comma-separated; berth's
    /// own, --lease-namespace, is added): the webhook never sees their pods, so the
    /// controller never reports or evicts them as missed.
    #[arg(
        long,
        env = "BERTH_EXEMPT_NAMESPACES",
        value_delimiter = ',',
        default_values = crate::policy::exempt::SYSTEM_NAMESPACES
    )]
    pub exempt_namespaces: Vec<String>,
}

/// etcd's default request limit: no stored object is larger.
const ETCD_LIMIT: usize = 1536 * 1024;
/// The largest AdmissionReview the apiserver sends: an object and an old object at
/// etcd's limit, each byte JSON-escaped to six, and room for the envelope.
const MAX_REVIEW_BYTES: usize = 2 * 6 * ETCD_LIMIT + 1024 * 1024;

/// Why `berth serve` could not start.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    #[error("serving certificate: {0}")]
    Tls(#[from] crate::admission::tls::TlsError),
    #[error("TLS configuration: {0}")]
    Rustls(#[from] rustls::Error),
    #[error("kubeconfig: {0}")]
    Kubeconfig(String),
    #[error("{0}")]
    Io(#[from] std::io::Error),
}

/// Resolves on SIGTERM or Ctrl-C.
async fn termination() {
    let ctrl_c = tokio::signal::ctrl_c();
    match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
        Ok(mut term) => {
            tokio::select! {
                _ = ctrl_c => {}
                _ = term.recv() => {}
            }
        }
        Err(_) => {
            let _ = ctrl_c.await;
        }
    }
}

pub async fn serve(args: ServeArgs) -> Result<(), ServeError> {
    let ServeArgs {
        tls_cert,
        tls_key,
        client_ca,
        apiserver_cidrs,
        addr,
        metrics_addr,
        max_body_bytes,
        request_memory_mib,
        max_in_flight,
        max_connections,
        review_timeout_seconds,
        // Used before the runtime starts (cli::run_serve).
        worker_threads: _,
        read_timeout_seconds,
        cert_check_seconds,
        shutdown_grace_seconds,
        kubeconfig,
        no_controller,
        no_webhook,
        lease_namespace,
        identity,
        resync_seconds,
        requeue_unschedulable_seconds,
        exempt_namespaces,
        controller_qps,
        node_qps,
    } = args;
    crate::return_freed_memory_in_background();
    let metrics = Arc::new(Metrics::default());
    let client = super::client::kube_client(kubeconfig.as_deref())
        .await
        .map_err(ServeError::Kubeconfig)?;
    let shutdown = CancellationToken::new();
    let metrics_listener = bind(metrics_addr).await?;
    // One model of the cluster for the webhook and the controller alike.
    let cluster = Cluster::start(client.clone(), metrics.clone(), !no_controller);

    let controller_task = (!no_controller).then(|| {
        let options = ControllerOptions {
            exempt: Exempt::new(&exempt_namespaces, &lease_namespace),
            lease_namespace,
            identity: identity.unwrap_or_else(default_identity),
            resync: Duration::from_secs(resync_seconds.max(1)),
            write_rates: controller::writes::Rates {
                nodes: node_qps,
                others: controller_qps,
            },
            requeue_unschedulable: (requeue_unschedulable_seconds > 0)
                .then(|| Duration::from_secs(requeue_unschedulable_seconds)),
        };
        tokio::spawn(controller::run(
            cluster.clone(),
            metrics.clone(),
            options,
            shutdown.clone(),
        ))
    });
    let state_metrics = metrics.clone();
    let metrics_app = axum::Router::new().route(
        "/metrics",
        axum::routing::get(move || {
            let metrics = metrics.clone();
            async move { metrics.encode() }
        }),
    );
    let metrics_task = tokio::spawn(serve_plain(metrics_listener, metrics_app, shutdown.clone()));
    let stopper = shutdown.clone();
    tokio::spawn(async move {
        termination().await;
        tracing::info!("shutting down");
        stopper.cancel();
    });

    if no_webhook {
        tracing::info!(%metrics_addr, "berth controller running (no webhook)");
        shutdown.cancelled().await;
    } else {
        let cert = Arc::new(ReloadingCert::load(&tls_cert, &tls_key)?);
        let tls = cert.clone().server_config(client_ca.as_deref())?;
        let berth_user = whoami(&client).await;
        let state = Arc::new(AppState {
            view: cluster,
            metrics: state_metrics.clone(),
            tls_ready: Default::default(),
            limits: BodyLimits::new(
                max_body_bytes,
                request_memory_mib << 20,
                Duration::from_secs(read_timeout_seconds.max(1)),
            ),
            berth_user,
            trust: Trust {
                client_certificate: client_ca.is_some(),
                addresses: apiserver_cidrs,
            },
            review_timeout: Duration::from_secs(review_timeout_seconds),
        });
        if state.trust.is_open() {
            tracing::warn!(
                "berth answers reviews from anyone who reaches its port: set --client-ca \
                 (the apiserver's client certificate) or --apiserver-cidrs"
            );
        }
        state.tls_ready.store(true, Ordering::Release);
        tokio::spawn(cert.clone().watch(
            Duration::from_secs(cert_check_seconds.max(1)),
            state_metrics.clone(),
        ));
        let webhook = bind(addr).await?;
        tracing::info!(%addr, %metrics_addr, "berth webhook serving");
        serve_tls(
            webhook,
            tls,
            router(state.clone(), max_in_flight),
            shutdown.clone(),
            Connections::new(
                max_connections,
                Duration::from_secs(shutdown_grace_seconds),
                state_metrics.clone(),
            )
            .trusting(state.trust.clone()),
        )
        .await;
    }
    // The controller releases its Lease as it stops.
    if let Some(task) = controller_task {
        let _ = task.await;
    }
    let _ = metrics_task.await;
    Ok(())
}

/// berth's own identity as the apiserver sees it (a SelfSubjectReview): the
/// webhook lets only that identity remove berth's gates and change its records.
/// Without an answer, the ServiceAccount `manifests/` installs.
async fn whoami(client: &kube::Client) -> String {
    use k8s_openapi::api::authentication::v1::SelfSubjectReview;
    let api: kube::Api<SelfSubjectReview> = kube::Api::all(client.clone());
    let review = api
        .create(
            &kube::api::PostParams::default(),
            &SelfSubjectReview::default(),
        )
        .await;
    match review.map(|r| r.status?.user_info?.username) {
        Ok(Some(username)) => {
            tracing::info!(%username, "berth acts as");
            username
        }
        other => {
            let fallback = crate::names::BERTH_SERVICE_ACCOUNT;
            tracing::warn!(?other, fallback, "cannot tell berth's own identity");
            fallback.to_owned()
        }
    }
}

/// The host name: in a pod, the pod's name, which tells replicas apart.
fn default_identity() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_owned())
        .ok()
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| format!("berth-{}", std::process::id()))
}
