//! HTTP handlers: decode the AdmissionReview, look up the namespace, call the
//! service, answer, and count. The decisions themselves live in [`super::service`].

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use axum::Extension;
use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::{DefaultBodyLimit, FromRef, RawQuery, State};
use axum::http::StatusCode;
use axum::http::header::CONTENT_TYPE;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use tokio::sync::Semaphore;
use tokio::time::Instant;
use tracing::Span;
use tracing::field::Empty;

use super::body::{BodyLimits, Charge, Held, ReadBody};
use super::review::{self, AdmissionRequest, AdmissionResponse};
use super::server::{Caller, Trust};
use super::service::{self, ReviewState, Verdict};
use super::state::ClusterView;
use crate::placement::namespace::NamespaceInfo;
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
    /// Who may send reviews.
    pub trust: Trust,
    /// The apiserver's timeout for berth's webhooks (`--review-timeout-seconds`):
    /// a review's own `?timeout=` may shorten it, never lengthen it.
    pub review_timeout: Duration,
}

/// The webhook's routes, with at most `max_in_flight` admission requests handled
/// at once (more wait their turn, until their deadline).
pub fn router(state: Arc<AppState>, max_in_flight: usize) -> Router {
    let turns = Arc::new(Semaphore::new(max_in_flight.max(1)));
    Router::new()
        .route("/mutate", post(mutate))
        .route("/validate", post(validate))
        // Bodies are bounded by `BodyLimits`, which answers a body it cannot read
        // with a denial rather than axum's 413.
        .layer(DefaultBodyLimit::disable())
        // Health probes take no turn: they answer at once under a flood, so the
        // pod is neither restarted nor dropped from the Service.
        .route("/healthz", get(|| async { "ok" }))
        .route("/readyz", get(readyz))
        .with_state(RouteState { state, turns })
}

/// What the routes share: the state, and the turns admission requests take.
#[derive(Clone)]
struct RouteState {
    state: Arc<AppState>,
    turns: Arc<Semaphore>,
}

impl FromRef<RouteState> for Arc<AppState> {
    fn from_ref(shared: &RouteState) -> Self {
        shared.state.clone()
    }
}

/// A review's way in, the first thing its handler does (a handler rather than a
/// middleware: one future less to box and move per review).
///
/// A client berth does not trust ([`Trust`]) is refused here, before anything of
/// its body is read. The others' bodies are read first, charged to their peer's
/// share of the budget as they arrive, and only then do they wait for one of the
/// turns: a client that sends headers and never its body holds no turn. Nothing
/// waits past the review's deadline ([`answer_by`]): one not decided by then is
/// refused by its uid, while the apiserver still listens, rather than left to time
/// out (which would admit the pod without berth).
#[tracing::instrument(
    name = "review",
    skip_all,
    fields(
        path = path,
        peer = Empty,
        uid = Empty,
        kind = Empty,
        operation = Empty,
        namespace = Empty,
        name = Empty
    )
)]
async fn door(
    RouteState { state, turns }: RouteState,
    caller: Option<Extension<Caller>>,
    query: Option<String>,
    path: &str,
    decide: Decide,
    body: Body,
) -> Response {
    let arrived = Instant::now();
    let started = std::time::Instant::now();
    // A request that came on no connection (a test's `oneshot`) has no peer.
    let caller = caller.map_or(
        Caller {
            addr: std::net::Ipv4Addr::UNSPECIFIED.into(),
            certified: false,
        },
        |Extension(c)| c,
    );
    Span::current().record("peer", tracing::field::display(caller.addr));
    if !state.trust.admits(&caller) {
        return refuse_untrusted(&state, body).await;
    }
    let answer_by = answer_by(arrived, query.as_deref(), state.review_timeout);
    let limits = &state.limits;
    // `held` keeps this request's share of the memory budget until it is answered.
    let (body, held) = match limits.read(body, caller.addr, answer_by).await {
        ReadBody::Whole(bytes, held) => (bytes, held),
        ReadBody::TooLarge(prefix) => {
            let reason = format!(
                "berth refuses a request over {} MiB: it cannot check what it does not read",
                limits.max_bytes >> 20
            );
            let why = ("too_large", StatusCode::PAYLOAD_TOO_LARGE, reason);
            return unread(&state, path, started, &prefix, why);
        }
        ReadBody::Busy(prefix) => return busy(&state, path, started, &prefix),
        ReadBody::Incomplete(prefix, reason) => {
            let why = ("incomplete", StatusCode::BAD_REQUEST, reason);
            return unread(&state, path, started, &prefix, why);
        }
    };
    let Ok(Ok(_turn)) = tokio::time::timeout_at(answer_by, turns.acquire_owned()).await else {
        return late(&state, path, started, &body);
    };
    admit(&state, path, decide, (body, held), answer_by, started).await
}

/// The least time berth keeps back from the apiserver's timeout: the apiserver's
/// clock starts before the request reaches berth (connecting, sending the
/// review), the answer must travel back, and an answer that arrives late counts as
/// none (the pod is admitted without berth under `failurePolicy: Ignore`).
const MARGIN: Duration = Duration::from_millis(500);

/// When a request that arrived at `arrived` must be answered by: a third of the
/// apiserver's timeout before it, and at least `MARGIN`. The timeout is berth's own
/// (`--review-timeout-seconds`, the webhook configurations' `timeoutSeconds`); the
/// `?timeout=` the apiserver sends may shorten it, but a client cannot lengthen it
/// to hold a request longer. Every wait and every step of reading and deciding
/// ends by then; what is not decided by then is refused, never left for the
/// apiserver to let through.
fn answer_by(arrived: Instant, query: Option<&str>, ceiling: Duration) -> Instant {
    let asked = query
        .into_iter()
        .flat_map(|q| q.split('&'))
        .find_map(|pair| pair.strip_prefix("timeout="))
        .and_then(parse_go_duration);
    let timeout = asked.map_or(ceiling, |t| t.min(ceiling));
    let kept_back = (timeout / 3).max(MARGIN);
    arrived + timeout.saturating_sub(kept_back).max(MARGIN)
}

/// A duration as Go prints one with whole units (`3s`, `1m30s`, `500ms`).
fn parse_go_duration(text: &str) -> Option<Duration> {
    let mut total = Duration::ZERO;
    let mut rest = text;
    while !rest.is_empty() {
        let digits = rest
            .find(|c: char| !c.is_ascii_digit())
            .unwrap_or(rest.len());
        let number: u64 = rest[..digits].parse().ok()?;
        rest = &rest[digits..];
        let unit = rest
            .find(|c: char| c.is_ascii_digit())
            .unwrap_or(rest.len());
        let part = match &rest[..unit] {
            "ms" => Duration::from_millis(number),
            "s" => Duration::from_secs(number),
            "m" => Duration::from_secs(number.checked_mul(60)?),
            _ => return None,
        };
        total = total.checked_add(part)?;
        rest = &rest[unit..];
    }
    (!text.is_empty()).then_some(total)
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

type Decide = fn(&AdmissionRequest, &ReviewState) -> (AdmissionResponse, Verdict);

async fn mutate(
    State(shared): State<RouteState>,
    caller: Option<Extension<Caller>>,
    RawQuery(query): RawQuery,
    body: Body,
) -> Response {
    door(shared, caller, query, "/mutate", service::mutate, body).await
}

async fn validate(
    State(shared): State<RouteState>,
    caller: Option<Extension<Caller>>,
    RawQuery(query): RawQuery,
    body: Body,
) -> Response {
    door(shared, caller, query, "/validate", service::validate, body).await
}

/// The 403 for a client berth does not trust, the same whatever its review says,
/// so it learns nothing of any namespace. Nothing of the body is looked at or
/// kept: its first 64 KiB are dropped as they come, for at most a second, so that
/// a client still sending gets the answer rather than a reset stream.
async fn refuse_untrusted(state: &AppState, body: Body) -> Response {
    state.metrics.error("unauthenticated");
    let mut frames = body.into_data_stream();
    let mut dropped = 0;
    let _ = tokio::time::timeout(Duration::from_secs(1), async {
        while let Some(Ok(data)) = futures::StreamExt::next(&mut frames).await {
            dropped += data.len();
            if dropped >= 64 * 1024 {
                break;
            }
        }
    })
    .await;
    (
        StatusCode::FORBIDDEN,
        "berth takes reviews only from the apiserver: a client with a certificate of its \
         client CA (--client-ca) or from its addresses (--apiserver-cidrs), as configured",
    )
        .into_response()
}

/// The AdmissionReview carrying `response`, as JSON written into one buffer sized
/// for its patch and warnings (most of it) rather than grown as it is written.
fn answer(response: AdmissionResponse) -> Response {
    let patch = response.patch.as_ref().map(|p| p.get());
    let texts = patch
        .into_iter()
        .chain(response.warnings.iter().map(String::as_str));
    let size = texts.map(|t| t.len() + 8).sum::<usize>() + 256;
    let mut body = Vec::with_capacity(size);
    match serde_json::to_writer(&mut body, &response.into_review()) {
        Ok(()) => ([(CONTENT_TYPE, "application/json")], body).into_response(),
        Err(e) => (StatusCode::INTERNAL_SERVER_ERROR, e.to_string()).into_response(),
    }
}

/// The answer to a body that was not read whole: a denial, when its first bytes
/// hold the uid, else `status` with the reason.
fn unread(
    state: &AppState,
    path: &str,
    started: std::time::Instant,
    prefix: &[u8],
    (kind, status, reason): (&str, StatusCode, String),
) -> Response {
    state.metrics.error(kind);
    tracing::debug!(refused = kind, %reason, "answered unread");
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
    answer(response)
}

/// Reads, decides and answers one review, whose body has arrived, by
/// `answer_by`. A decision is linear in a pod within berth's bounds; the time
/// limit is the backstop.
async fn admit(
    state: &Arc<AppState>,
    path: &str,
    decide: Decide,
    (body, mut held): (Bytes, Held),
    answer_by: Instant,
    started: std::time::Instant,
) -> Response {
    let Some(slot) = state.limits.cpu_slot(body.len(), answer_by).await else {
        return late(state, path, started, &body);
    };
    // Charged before it is read: what reading it holds is at most its read cost,
    // whatever its shape (counted in the review's CPU slot: a pass over its bytes).
    let counted = body.clone();
    let Some(cost) = slot.run(move || review::read_cost(&counted)).await else {
        return late(state, path, started, &body);
    };
    match state.limits.charge(&mut held, cost, answer_by).await {
        Charge::Held => {}
        Charge::Busy => return busy(state, path, started, &body),
        Charge::Never { cost, most } => {
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
    let Some(parsed) = slot.run(move || review::parse(&read)).await else {
        return late(state, path, started, &body);
    };
    let request = match parsed {
        Ok(request) => {
            let span = Span::current();
            span.record("uid", request.uid.as_str());
            span.record("kind", request.kind.kind.as_str());
            span.record("operation", request.operation.as_str());
            span.record(
                "namespace",
                request.namespace.as_deref().unwrap_or_default(),
            );
            span.record("name", request.name.as_deref().unwrap_or_default());
            tracing::debug!(bytes = body.len(), "read");
            request
        }
        Err(reason) => {
            tracing::debug!(%reason, "not a review");
            state.metrics.error("bad_request");
            observe(state, path, "bad_request", started);
            return (StatusCode::BAD_REQUEST, reason).into_response();
        }
    };
    let mut warnings = Vec::new();
    // Pods and DaemonSets are decided in the context of their namespace.
    let in_namespace = request.is_pod() || request.is_kind("apps", "DaemonSet");
    let namespace = match request.namespace.as_deref().filter(|_| in_namespace) {
        Some(name) => match tokio::time::timeout_at(answer_by, state.view.namespace(name)).await {
            Ok(Some(namespace)) => namespace,
            Ok(None) | Err(_) => {
                state.metrics.error("namespace_lookup");
                warnings.push(bounded(format!(
                    "berth could not read namespace {name}; the pod gets no grants"
                )));
                Arc::new(NamespaceInfo::new(name))
            }
        },
        None => Arc::new(NamespaceInfo::new(
            request.namespace.as_deref().unwrap_or_default(),
        )),
    };
    let policies = state.view.policies();
    let nodes = state.view.nodes();
    let groups = state.view.groups();
    let berth_user = state.berth_user.clone();
    let uid = request.uid.clone();
    let deciding = slot.run(move || {
        let snapshot = ReviewState {
            policies: &policies,
            namespace: &namespace,
            nodes: Some(&nodes),
            berth_user: &berth_user,
            groups: &groups,
        };
        decide(&request, &snapshot)
    });
    let Some((mut response, verdict)) = deciding.await else {
        state.metrics.error("deadline");
        let response = AdmissionResponse::deny_uid(&uid, LATE);
        state
            .metrics
            .denials
            .get_or_create(&KindLabels { kind: path.into() })
            .inc();
        observe(state, path, "deadline", started);
        return answer(response);
    };
    drop((held, slot));
    response.warnings.splice(0..0, warnings);
    record(state, path, &response, &verdict, started);
    answer(response)
}

/// Why a review not decided in time is refused.
const LATE: &str =
    "berth could not decide in time for the apiserver: it refuses what it has not checked; retry";

/// The answer to a review not read in time: a denial by the uid in its first
/// bytes, since berth refuses what it has not checked.
fn late(state: &AppState, path: &str, started: std::time::Instant, body: &[u8]) -> Response {
    let why = (
        "deadline",
        StatusCode::SERVICE_UNAVAILABLE,
        LATE.to_string(),
    );
    unread(state, path, started, body, why)
}

/// The answer when the memory budget stays spent by other requests.
fn busy(state: &AppState, path: &str, started: std::time::Instant, body: &[u8]) -> Response {
    let reason = "berth is at its memory bound for requests in flight; retry".to_string();
    let why = ("busy", StatusCode::SERVICE_UNAVAILABLE, reason);
    unread(state, path, started, body, why)
}

fn record(
    state: &AppState,
    path: &str,
    response: &AdmissionResponse,
    verdict: &Verdict,
    started: std::time::Instant,
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
    tracing::debug!(
        outcome = verdict.outcome,
        policies = ?verdict.applied,
        allowed = response.allowed,
        micros = started.elapsed().as_micros() as u64,
        "answered"
    );
    observe(state, path, verdict.outcome, started);
}

fn observe(state: &AppState, path: &str, outcome: &str, started: std::time::Instant) {
    state
        .metrics
        .latency
        .get_or_create(&RequestLabels {
            path: path.into(),
            outcome: outcome.into(),
        })
        .observe(started.elapsed().as_secs_f64());
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_review_is_answered_before_the_apiserver_gives_up() {
        let now = Instant::now();
        let ceiling = Duration::from_secs(3);
        let by = |query| answer_by(now, query, ceiling) - now;
        assert_eq!(by(Some("timeout=3s")), Duration::from_secs(2));
        // A client cannot give itself longer than berth's own timeout: it would
        // hold its request, and what it holds, for as long as it asked.
        assert_eq!(by(Some("a=b&timeout=24s")), Duration::from_secs(2));
        assert_eq!(by(Some("timeout=1m30s")), Duration::from_secs(2));
        assert_eq!(
            by(Some("timeout=18446744073709551615s")),
            Duration::from_secs(2)
        );
        assert_eq!(by(None), Duration::from_secs(2), "berth's own");
        assert_eq!(by(Some("timeout=x")), Duration::from_secs(2));
        assert_eq!(by(Some("timeout=")), Duration::from_secs(2));
        assert_eq!(by(Some("timeout=1s")), MARGIN, "a shorter one is kept");
        assert_eq!(by(Some("timeout=100ms")), MARGIN, "never no time at all");
        let longer = |query| answer_by(now, query, Duration::from_secs(30)) - now;
        assert_eq!(longer(Some("timeout=24s")), Duration::from_secs(16));
        assert_eq!(parse_go_duration("1m0s"), Some(Duration::from_secs(60)));
        assert_eq!(parse_go_duration("3h"), None);
        let overflow = "18446744073709551615s18446744073709551615s";
        assert_eq!(parse_go_duration(overflow), None, "no overflow, no panic");
    }
}
