//! HTTP handlers: decode the AdmissionReview, look up the namespace, call the
//! service, answer, and count. The decisions themselves live in [`super::service`].

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

use axum::Router;
use axum::body::Bytes;
use axum::extract::{DefaultBodyLimit, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};

use super::review::{self, AdmissionRequest, AdmissionResponse};
use super::service::{self, Snapshot, Verdict};
use super::state::ClusterView;
use crate::placement::NamespaceInfo;
use crate::placement::warning::bounded;
use crate::telemetry::{KindLabels, Metrics, PolicyLabels, RequestLabels};

/// Shared by every request.
pub struct AppState {
    pub view: Arc<dyn ClusterView>,
    pub metrics: Arc<Metrics>,
    /// Set once the serving certificate is loaded.
    pub tls_ready: AtomicBool,
}

/// The webhook's routes; bodies above `max_body_bytes` get a 413.
pub fn router(state: Arc<AppState>, max_body_bytes: usize) -> Router {
    Router::new()
        .route("/mutate", post(mutate))
        .route("/validate", post(validate))
        .route("/healthz", get(|| async { "ok" }))
        .route("/readyz", get(readyz))
        .layer(DefaultBodyLimit::max(max_body_bytes))
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

async fn mutate(State(state): State<Arc<AppState>>, body: Bytes) -> Response {
    admit(&state, "/mutate", service::mutate, &body).await
}

async fn validate(State(state): State<Arc<AppState>>, body: Bytes) -> Response {
    admit(&state, "/validate", service::validate, &body).await
}

async fn admit(state: &AppState, path: &str, decide: Decide, body: &[u8]) -> Response {
    let started = Instant::now();
    let request = match review::parse(body) {
        Ok(request) => request,
        Err(reason) => {
            state.metrics.error("bad_request");
            observe(state, path, "bad_request", started);
            return (StatusCode::BAD_REQUEST, reason).into_response();
        }
    };
    let mut warnings = Vec::new();
    // Only pods are decided in the context of their namespace.
    let namespace = match request.namespace.as_deref().filter(|_| request.is_pod()) {
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
    let snapshot = Snapshot {
        policies: &policies,
        namespace: &namespace,
        nodes: Some(&nodes),
    };
    let (mut response, verdict) = decide(&request, &snapshot);
    response.warnings.splice(0..0, warnings);
    record(state, path, &response, &verdict, started);
    axum::Json(response.into_review()).into_response()
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
