//! The floor berth's webhook is measured against: axum over rustls, as berth
//! serves, that reads only the AdmissionReview's uid and allows the object
//! unchanged. Nothing a real webhook needs less than this.
//!
//! Two more servers stand between the floor and berth, to say where berth's time
//! goes under load ([`Stage`]): one that reads each review as berth does, and
//! berth's own router over a fixed state, which does all berth does with a review
//! but runs none of its live process (watches, the controller).
//!
//! Each runs as a process of its own, as berth does (the bench binary started
//! again with [`CERTS_ENV`] set), so that each can be given a core of its own
//! while the load generator has the other.

use std::io::BufRead;
use std::net::SocketAddr;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;

use axum::Json;
use axum::body::Bytes;
use axum::routing::post;
use berth::admission::handlers::router;
use berth::admission::review::parse;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use serde::Deserialize;
use serde_json::{Value, json};

use crate::fixed_state::review_state;

#[derive(Deserialize)]
struct Review {
    request: Request,
}

#[derive(Deserialize)]
struct Request {
    uid: String,
}

async fn allow(Json(review): Json<Review>) -> Json<Value> {
    allowed(review.request.uid)
}

fn allowed(uid: String) -> Json<Value> {
    Json(
        json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
        "response": {"uid": uid, "allowed": true}}),
    )
}

/// Reads the review as berth reads it, then allows it.
async fn read_then_allow(body: Bytes) -> Json<Value> {
    allowed(parse(&body).expect("a review").uid)
}

/// How much of berth's work a floor server does with each review.
#[derive(Debug, Clone)]
pub enum Stage {
    /// Finds the uid and allows: the minimal webhook.
    Uid,
    /// Reads the review as berth does, then allows.
    Read,
    /// berth's own router over [`review_state`]: the cdn policy, the namespace
    /// named and a cache of that many nodes.
    Decide { namespace: String, nodes: usize },
}

impl Stage {
    /// As [`STAGE_ENV`] carries it to the server's process.
    fn to_env(&self) -> String {
        match self {
            Stage::Uid => "uid".to_string(),
            Stage::Read => "read".to_string(),
            Stage::Decide { namespace, nodes } => format!("decide {namespace} {nodes}"),
        }
    }

    /// What [`Stage::to_env`] wrote; a stage it did not write is a bug of the bench.
    fn from_env(text: &str) -> Stage {
        match text.split(' ').collect::<Vec<_>>()[..] {
            ["uid"] => Stage::Uid,
            ["read"] => Stage::Read,
            ["decide", namespace, nodes] => Stage::Decide {
                namespace: namespace.to_string(),
                nodes: nodes.parse().expect("a node count"),
            },
            _ => panic!("{STAGE_ENV}={text:?} names no stage"),
        }
    }

    /// The routes that serve this stage.
    fn app(self) -> axum::Router {
        match self {
            Stage::Uid => axum::Router::new().route("/mutate", post(allow)),
            Stage::Read => axum::Router::new().route("/mutate", post(read_then_allow)),
            Stage::Decide { namespace, nodes } => router(review_state(nodes, &namespace), 256),
        }
    }
}

/// Set to a folder holding `tls.crt` and `tls.key`, the bench binary serves a
/// floor server instead of benchmarking.
const CERTS_ENV: &str = "BENCH_FLOOR_CERTS";
/// Which [`Stage`] it serves: `uid`, `read`, or `decide <namespace> <nodes>`.
const STAGE_ENV: &str = "BENCH_FLOOR_STAGE";

/// The floor in its own process; killed when dropped.
pub struct Floor {
    child: Child,
    pub addr: SocketAddr,
}

impl Floor {
    /// Starts a floor server doing `stage`, with the certificate pair in `certs`.
    pub fn spawn(certs: &Path, stage: &Stage) -> Floor {
        let mut child = Command::new(std::env::current_exe().expect("the bench binary"))
            .arg("--bench")
            .env(CERTS_ENV, certs)
            .env(STAGE_ENV, stage.to_env())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("start the floor");
        let mut line = String::new();
        std::io::BufReader::new(child.stdout.take().expect("stdout"))
            .read_line(&mut line)
            .expect("the floor's address");
        let addr = line.trim().parse().expect("the floor prints its address");
        Floor { child, addr }
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }
}

impl Drop for Floor {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// In the floor's process (see [`Floor::spawn`]): serves until stdin closes, then
/// returns true. Elsewhere returns false at once.
pub async fn serve_if_asked() -> bool {
    let Some(certs) = std::env::var_os(CERTS_ENV) else {
        return false;
    };
    let certs = Path::new(&certs);
    let read = |f: &str| std::fs::read(certs.join(f)).expect("the floor's certificates");
    let stage = Stage::from_env(&std::env::var(STAGE_ENV).expect("the stage to serve"));
    let addr = start(&read("tls.crt"), &read("tls.key"), stage.app()).await;
    println!("{addr}");
    // The parent holds stdin open for as long as the floor should serve.
    let _ =
        tokio::task::spawn_blocking(|| std::io::copy(&mut std::io::stdin(), &mut std::io::sink()))
            .await;
    true
}

/// Serves `app` on a free 127.0.0.1 port with the PEM pair given, in the
/// background; returns the address. The connection is served by berth's own TLS
/// server (`serve_tls`: the same rustls configuration, HTTP/2 settings and
/// timers), so that the floor differs from berth only in what it does with a
/// review.
async fn start(cert_pem: &[u8], key_pem: &[u8], app: axum::Router) -> SocketAddr {
    let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(cert_pem)
        .collect::<Result<_, _>>()
        .expect("certificate");
    let key = PrivateKeyDer::from_pem_slice(key_pem).expect("key");
    let mut tls = rustls::ServerConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .expect("protocols")
    .with_no_client_auth()
    .with_single_cert(chain, key)
    .expect("certificate and key");
    tls.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("address");
    let never = tokio_util::sync::CancellationToken::new();
    tokio::spawn(berth::admission::server::serve_tls(
        listener,
        tls,
        app,
        never,
        berth::admission::server::Connections::new(
            128,
            std::time::Duration::ZERO,
            std::sync::Arc::default(),
        ),
    ));
    addr
}
