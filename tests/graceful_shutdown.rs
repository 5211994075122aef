//! The HTTPS server's graceful shutdown, on a real socket: a request in flight when
//! shutdown starts is answered in full, its keep-alive connection is closed, and
//! new connections are refused.

use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::routing::get;
use berth::admission::server::{bind, serve_tls};
use berth::admission::tls::ReloadingCert;
use rustls::pki_types::{CertificateDer, ServerName, pem::PemObject};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio_util::sync::CancellationToken;

#[tokio::test]
async fn an_in_flight_request_finishes_and_the_connection_closes() {
    let dir = std::env::temp_dir().join(format!("berth-graceful-{}", std::process::id()));
    let issued = berth::certs::write_certs("berth", "berth-system", &dir, 1).unwrap();
    let cert = Arc::new(ReloadingCert::load(&dir.join("tls.crt"), &dir.join("tls.key")).unwrap());
    let app = Router::new().route(
        "/slow",
        get(|| async {
            tokio::time::sleep(Duration::from_millis(800)).await;
            "finished"
        }),
    );
    let listener = bind("127.0.0.1:0".parse().unwrap()).await.unwrap();
    let addr = listener.local_addr().unwrap();
    let shutdown = CancellationToken::new();
    let server = tokio::spawn(serve_tls(
        listener,
        cert.server_config().unwrap(),
        app,
        shutdown.clone(),
        Duration::from_secs(5),
    ));

    let mut roots = rustls::RootCertStore::empty();
    roots
        .add(CertificateDer::from_pem_slice(issued.ca_pem.as_bytes()).unwrap())
        .unwrap();
    let config = rustls::ClientConfig::builder()
        .with_root_certificates(roots)
        .with_no_client_auth();
    let connector = tokio_rustls::TlsConnector::from(Arc::new(config));
    let tcp = TcpStream::connect(addr).await.unwrap();
    let mut tls = connector
        .connect(ServerName::try_from("berth.berth-system.svc").unwrap(), tcp)
        .await
        .unwrap();
    tls.write_all(b"GET /slow HTTP/1.1\r\nhost: berth\r\n\r\n")
        .await
        .unwrap();

    tokio::time::sleep(Duration::from_millis(200)).await;
    shutdown.cancel();
    let mut response = String::new();
    tokio::time::timeout(Duration::from_secs(5), tls.read_to_string(&mut response))
        .await
        .expect("the connection is closed after the response")
        .ok();
    assert!(response.starts_with("HTTP/1.1 200"), "{response}");
    assert!(response.ends_with("finished"), "{response}");
    assert!(
        response.to_ascii_lowercase().contains("connection: close"),
        "{response}"
    );

    tokio::time::timeout(Duration::from_secs(5), server)
        .await
        .unwrap()
        .unwrap();
    assert!(
        TcpStream::connect(addr).await.is_err(),
        "still accepting after shutdown"
    );
    let _ = std::fs::remove_dir_all(&dir);
}
