//! A load generator for `/mutate`: HTTP/2 connections over TLS, as the
//! apiserver keeps them to a webhook (one per apiserver, more under load), with
//! many reviews in flight on each.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use hyper_util::rt::{TokioExecutor, TokioIo};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName};

/// Reviews answered, and over how long.
#[derive(Debug, Clone, Copy, Default)]
pub struct Answered {
    pub reviews: u64,
    pub seconds: f64,
}

/// Reviews answered at `addr` over `length`, on `connections` connections with
/// `streams` in flight on each, each the same `review`; the server's certificate
/// is checked against `ca_pem`.
/// Every answer must contain `expected` (a patch from berth, an allowance from the
/// floor): a webhook that answered quickly with something else would measure
/// nothing.
pub async fn reviews_answered(
    addr: SocketAddr,
    ca_pem: &[u8],
    review: Bytes,
    connections: usize,
    streams: usize,
    length: Duration,
    expected: &'static str,
) -> Answered {
    let mut roots = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_slice_iter(ca_pem) {
        roots.add(cert.expect("CA")).expect("CA certificate");
    }
    let mut tls = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .expect("protocols")
    .with_root_certificates(roots)
    .with_no_client_auth();
    tls.alpn_protocols = vec![b"h2".to_vec()];
    let tls = Arc::new(tls);
    let mut senders = Vec::new();
    for _ in 0..connections {
        senders.push(connect(addr, tls.clone()).await);
    }

    let answered = Arc::new(AtomicU64::new(0));
    let deadline = Instant::now() + length;
    let in_flight = senders.iter().flat_map(|s| std::iter::repeat_n(s, streams));
    let workers = in_flight.map(|sender| {
        let (mut sender, review, answered) = (sender.clone(), review.clone(), answered.clone());
        tokio::spawn(async move {
            while Instant::now() < deadline {
                let request = hyper::Request::post(format!("https://{addr}/mutate"))
                    .header("content-type", "application/json")
                    .body(Full::new(review.clone()))
                    .expect("request");
                let Ok(response) = sender.send_request(request).await else {
                    return;
                };
                let ok = response.status().is_success();
                let Ok(body) = response.into_body().collect().await else {
                    continue;
                };
                let body = body.to_bytes();
                assert!(
                    ok && body
                        .windows(expected.len())
                        .any(|w| w == expected.as_bytes()),
                    "{addr} answered without {expected}: {}",
                    String::from_utf8_lossy(&body)
                );
                answered.fetch_add(1, Ordering::Relaxed);
            }
        })
    });
    let started = Instant::now();
    futures::future::join_all(workers).await;
    Answered {
        reviews: answered.load(Ordering::Relaxed),
        seconds: started.elapsed().as_secs_f64(),
    }
}

/// One HTTP/2 connection over TLS to `addr`.
async fn connect(
    addr: SocketAddr,
    tls: Arc<rustls::ClientConfig>,
) -> hyper::client::conn::http2::SendRequest<Full<Bytes>> {
    let tcp = tokio::net::TcpStream::connect(addr).await.expect("connect");
    // As the apiserver's Go client does: a small request is sent at once, never
    // held back by Nagle's algorithm waiting for an ACK.
    tcp.set_nodelay(true).expect("TCP_NODELAY");
    let name = ServerName::IpAddress(addr.ip().into());
    let stream = tokio_rustls::TlsConnector::from(tls)
        .connect(name, tcp)
        .await
        .expect("TLS");
    let (sender, connection) =
        hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(stream))
            .await
            .expect("HTTP/2");
    tokio::spawn(connection);
    sender
}
