//! The floor berth's webhook is measured against: axum over rustls, as berth
//! serves, that reads only the AdmissionReview's uid and allows the object
//! unchanged. Nothing a real webhook needs less than this.

use std::net::SocketAddr;
use std::sync::Arc;

use axum::Json;
use axum::routing::post;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use serde::Deserialize;
use serde_json::{Value, json};

#[derive(Deserialize)]
struct Review {
    request: Request,
}

#[derive(Deserialize)]
struct Request {
    uid: String,
}

async fn allow(Json(review): Json<Review>) -> Json<Value> {
    Json(
        json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
        "response": {"uid": review.request.uid, "allowed": true}}),
    )
}

/// Serves `POST /mutate` on a free 127.0.0.1 port with the PEM pair given, in
/// the background; returns the address.
pub async fn start(cert_pem: &[u8], key_pem: &[u8]) -> SocketAddr {
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
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(tls));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("address");
    let app = axum::Router::new().route("/mutate", post(allow));
    tokio::spawn(async move {
        loop {
            let Ok((tcp, _)) = listener.accept().await else {
                continue;
            };
            let (acceptor, app) = (acceptor.clone(), app.clone());
            tokio::spawn(async move {
                let Ok(stream) = acceptor.accept(tcp).await else {
                    return;
                };
                let service = hyper_util::service::TowerToHyperService::new(app);
                let _ = auto::Builder::new(TokioExecutor::new())
                    .serve_connection(TokioIo::new(stream), service)
                    .await;
            });
        }
    });
    addr
}
