//! HTTP handlers: decode the AdmissionReview, look up the namespace, call the
//! service, answer, and count. The decisions themselves live in [`super::service`].

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

use axum::Extension;
use axum::Router;
use axum::body::Body;
use axum::extract::{DefaultBodyLimit, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use tower::limit::GlobalConcurrencyLimitLayer;

use super::body::{BodyLimits, Charge, ReadBody};
use super::cost;
use super::review::{self, AdmissionRequest, AdmissionResponse};
use super::service::{self, Snapshot, Verdict};
use super::state::ClusterView;
use super::tls::PeerCertificate;
use crate::placement::NamespaceInfo;
use crate::placement::warning::bounded;
use crate::telemetry::{KindLabels, Metrics, PolicyLabels, RequestLabels};

/// Shared by every request.
pub struct AppState {
    pub view: Arc<dyn ClusterView>,
    pub metrics: Arc<Metrics>,
    /// Set once the serving certificate is loaded.
    pub tls_ready: AtomicBool,
    /// The bounds request bodies are read within.
    pub limits: BodyLimits,
    /// berth's own identity (`request.userInfo.username` of its controller).
    pub berth_user: String,
    /// Whether only a client with a certificate of the client CA (the apiserver)
    /// may send reviews (`--client-ca`).
    pub require_client_cert: bool,
}

/// The webhook's routes, with at most `max_in_flight` admission requests handled
/// at once (more wait their turn).
pub fn router(state: Arc<AppState>, max_in_flight: usize) -> Router {
    Router::new()
        .route("/mutate", post(mutate))
        .route("/validate", post(validate))
        // Bodies are bounded by `BodyLimits`, which answers a body it cannot read
        // with a denial rather than axum's 413.
        .layer(DefaultBodyLimit::disable())
        // Only admission waits its turn: health probes answer at once under a
        // flood, so the pod is neither restarted nor dropped from the Service.
        .route_layer(GlobalConcurrencyLimitLayer::new(max_in_flight.max(1)))
        .route("/healthz", get(|| async { "ok" }))
        .route("/readyz", get(readyz))
        .with_state(state)
}

async fn readyz(State(state): State<Arc<AppState>>) -> Response {
    let tls = state.tls_ready.load(Ordering::Acquire);
    let synced = state.view.synced();
    match (tls, synced) {
        (true, true) => "ok".into_response(),
        _ => (
            StatusCode::SERVICE_UNAVAILABLE,
            format!("not ready: tls loaded {tls}, caches synced {synced}"),
        )
            .into_response(),
    }
}

type Decide = fn(&AdmissionRequest, &Snapshot) -> (AdmissionResponse, Verdict);

async fn mutate(
    State(state): State<Arc<AppState>>,
    peer: Option<Extension<PeerCertificate>>,
    body: Body,
) -> Response {
    if let Some(refusal) = unauthenticated(&state, peer) {
        return refusal;
    }
    admit(&state, "/mutate", service::mutate, body).await
}

async fn validate(
    State(state): State<Arc<AppState>>,
    peer: Option<Extension<PeerCertificate>>,
    body: Body,
) -> Response {
    if let Some(refusal) = unauthenticated(&state, peer) {
        return refusal;
    }
    admit(&state, "/validate", service::validate, body).await
}

/// With `--client-ca`, a 403 for a client that presented no certificate of the
/// client CA: only the apiserver sends reviews, and nothing a review says is taken
/// from anyone else.
fn unauthenticated(state: &AppState, peer: Option<Extension<PeerCertificate>>) -> Option<Response> {
    let verified = peer.is_some_and(|Extension(PeerCertificate(v))| v);
    (state.require_client_cert && !verified).then(|| {
        state.metrics.error("unauthenticated");
        (
            StatusCode::FORBIDDEN,
            "berth takes reviews only from a client with a certificate of its client CA (the apiserver)",
        )
            .into_response()
    })
}

/// The answer to a body that was not read whole: a denial, when its first bytes
/// hold the uid, else `status` with the reason.
fn unread(
    state: &AppState,
    path: &str,
    started: Instant,
    prefix: &[u8],
    (kind, status, reason): (&str, StatusCode, String),
) -> Response {
    state.metrics.error(kind);
    let Some(uid) = review::uid_from_prefix(prefix) else {
        observe(state, path, kind, started);
        return (status, reason).into_response();
    };
    let response = AdmissionResponse::deny_uid(&uid, &bounded(reason));
    state
        .metrics
        .denials
        .get_or_create(&KindLabels { kind: path.into() })
        .inc();
    observe(state, path, kind, started);
    axum::Json(response.into_review()).into_response()
}

/// How long a decision may take once the review is read: well inside the
/// apiserver's 3 s timeout for berth's webhooks, past which the pod would be
/// admitted without berth. A decision is linear in a pod within berth's bounds;
/// this deadline is the backstop.
const DECISION_DEADLINE: std::time::Duration = std::time::Duration::from_secs(2);

/// Runs `work` on a thread for blocking work: reading and deciding a review is
/// CPU work, and on the async workers a large one would stall every other
/// request and `/healthz` with it.
async fn blocking<T: Send + 'static>(work: impl FnOnce() -> T + Send + 'static) -> Option<T> {
    tokio::task::spawn_blocking(work).await.ok()
}

async fn admit(state: &Arc<AppState>, path: &str, decide: Decide, body: Body) -> Response {
    let started = Instant::now();
    let limits = &state.limits;
    // `held` keeps this request's share of the memory budget until it is answered.
    let (body, mut held) = match limits.read(body).await {
        ReadBody::Whole(bytes, held) => (bytes, held),
        ReadBody::TooLarge(prefix) => {
            let reason = format!(
                "berth refuses a request over {} MiB: it cannot check what it does not read",
                limits.max_bytes >> 20
            );
            let why = ("too_large", StatusCode::PAYLOAD_TOO_LARGE, reason);
            return unread(state, path, started, &prefix, why);
        }
        ReadBody::Busy(prefix) => return busy(state, path, started, &prefix),
        ReadBody::Incomplete(prefix, reason) => {
            let why = ("incomplete", StatusCode::BAD_REQUEST, reason);
            return unread(state, path, started, &prefix, why);
        }
    };
    // What reading it into JSON costs is charged before it is read.
    let scanned = body.clone();
    let cost = blocking(move || cost::parse_cost(&scanned))
        .await
        .unwrap_or(usize::MAX);
    match limits
        .charge(&mut held, body.len().saturating_add(cost))
        .await
    {
        Charge::Held => {}
        Charge::Busy => return busy(state, path, started, &body),
        Charge::Never(most) => {
            let reason = format!(
                "berth refuses a review whose JSON takes about {} MiB to read: all requests \
                 being decided share {} MiB",
                cost >> 20,
                most >> 20
            );
            let why = ("too_large", StatusCode::PAYLOAD_TOO_LARGE, reason);
            return unread(state, path, started, &body, why);
        }
    }
    let read = body.clone();
    let request = match blocking(move || review::parse(&read)).await {
        Some(Ok(request)) => request,
        Some(Err(reason)) => {
            state.metrics.error("bad_request");
            observe(state, path, "bad_request", started);
            return (StatusCode::BAD_REQUEST, reason).into_response();
        }
        None => return busy(state, path, started, &body),
    };
    let mut warnings = Vec::new();
    // Pods and DaemonSets are decided in the context of their namespace.
    let in_namespace = request.is_pod() || request.is_kind("apps", "DaemonSet");
    let namespace = match request.namespace.as_deref().filter(|_| in_namespace) {
        Some(name) => match state.view.namespace(name).await {
            Some(namespace) => namespace,
            None => {
                state.metrics.error("namespace_lookup");
                warnings.push(bounded(format!(
                    "berth could not read namespace {name}; the pod gets no grants"
                )));
                NamespaceInfo::new(name)
            }
        },
        None => NamespaceInfo::new(request.namespace.as_deref().unwrap_or_default()),
    };
    let policies = state.view.policies();
    let nodes = state.view.nodes();
    let groups = state.view.groups();
    let berth_user = state.berth_user.clone();
    let uid = request.uid.clone();
    let deciding = blocking(move || {
        let snapshot = Snapshot {
            policies: &policies,
            namespace: &namespace,
            nodes: Some(&nodes),
            berth_user: &berth_user,
            groups: &groups,
        };
        decide(&request, &snapshot)
    });
    let (mut response, verdict) = match tokio::time::timeout(DECISION_DEADLINE, deciding).await {
        Ok(Some(decided)) => decided,
        _ => {
            state.metrics.error("deadline");
            let reason = format!(
                "berth could not decide within {} s: it refuses what it has not checked",
                DECISION_DEADLINE.as_secs()
            );
            let response = AdmissionResponse::deny_uid(&uid, &reason);
            state
                .metrics
                .denials
                .get_or_create(&KindLabels { kind: path.into() })
                .inc();
            observe(state, path, "deadline", started);
            return axum::Json(response.into_review()).into_response();
        }
    };
    drop(held);
    response.warnings.splice(0..0, warnings);
    record(state, path, &response, &verdict, started);
    axum::Json(response.into_review()).into_response()
}

/// The answer when the memory budget stays spent by other requests.
fn busy(state: &AppState, path: &str, started: Instant, body: &[u8]) -> Response {
    let reason = "berth is at its memory bound for requests in flight; retry".to_string();
    let why = ("busy", StatusCode::SERVICE_UNAVAILABLE, reason);
    unread(state, path, started, body, why)
}

fn record(
    state: &AppState,
    path: &str,
    response: &AdmissionResponse,
    verdict: &Verdict,
    started: Instant,
) {
    let metrics = &state.metrics;
    for policy in &verdict.applied {
        metrics
            .decisions
            .get_or_create(&PolicyLabels {
                policy: policy.clone(),
            })
            .inc();
    }
    metrics.warnings.inc_by(response.warnings.len() as u64);
    if !response.allowed {
        metrics
            .denials
            .get_or_create(&KindLabels { kind: path.into() })
            .inc();
    }
    if verdict.broken_annotation {
        metrics.error("broken_annotation");
    }
    observe(state, path, verdict.outcome, started);
}

fn observe(state: &AppState, path: &str, outcome: &str, started: Instant) {
    state
        .metrics
        .latency
        .get_or_create(&RequestLabels {
            path: path.into(),
            outcome: outcome.into(),
        })
        .observe(started.elapsed().as_secs_f64());
}
