//! The HTTPS server on a real socket: its graceful shutdown, and its HTTP/2 flow
//! control under a large body that waits unread.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::routing::{get, post};
use berth::admission::server::{bind, serve_tls};
use berth::admission::tls::ReloadingCert;
use http_body_util::{BodyExt, Full};
use hyper_util::rt::{TokioExecutor, TokioIo};
use rustls::pki_types::{CertificateDer, ServerName, pem::PemObject};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::Notify;
use tokio::task::JoinHandle;
use tokio_rustls::TlsConnector;
use tokio_rustls::client::TlsStream;
use tokio_util::sync::CancellationToken;

/// berth's server on a loopback port, with a certificate of its own, and a TLS
/// client that trusts it.
struct Served {
    addr: SocketAddr,
    shutdown: CancellationToken,
    server: JoinHandle<()>,
    connector: TlsConnector,
    dir: PathBuf,
}

impl Served {
    /// Serves `app`; the client offers `alpn` (none: HTTP/1.1).
    async fn start(name: &str, app: Router, alpn: &[&[u8]]) -> Served {
        let dir = std::env::temp_dir().join(format!("berth-{name}-{}", std::process::id()));
        let issued = berth::certs::write_certs("berth", "berth-system", &dir, 1).unwrap();
        let cert =
            Arc::new(ReloadingCert::load(&dir.join("tls.crt"), &dir.join("tls.key")).unwrap());
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
        let mut config = rustls::ClientConfig::builder()
            .with_root_certificates(roots)
            .with_no_client_auth();
        config.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
        Served {
            addr,
            shutdown,
            server,
            connector: TlsConnector::from(Arc::new(config)),
            dir,
        }
    }

    /// A new TLS connection to the server.
    async fn connect(&self) -> TlsStream<TcpStream> {
        let tcp = TcpStream::connect(self.addr).await.unwrap();
        // As Go's net package does for every connection the apiserver makes.
        tcp.set_nodelay(true).unwrap();
        self.connector
            .connect(ServerName::try_from("berth.berth-system.svc").unwrap(), tcp)
            .await
            .unwrap()
    }
}

impl Drop for Served {
    fn drop(&mut self) {
        std::fs::remove_dir_all(&self.dir).ok();
    }
}

#[tokio::test]
async fn an_in_flight_request_finishes_and_the_connection_closes() {
    let app = Router::new().route(
        "/slow",
        get(|| async {
            tokio::time::sleep(Duration::from_millis(800)).await;
            "finished"
        }),
    );
    let mut served = Served::start("graceful", app, &[]).await;
    let mut tls = served.connect().await;
    tls.write_all(b"GET /slow HTTP/1.1\r\nhost: berth\r\n\r\n")
        .await
        .unwrap();

    tokio::time::sleep(Duration::from_millis(200)).await;
    served.shutdown.cancel();
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

    tokio::time::timeout(Duration::from_secs(5), &mut served.server)
        .await
        .unwrap()
        .unwrap();
    assert!(
        TcpStream::connect(served.addr).await.is_err(),
        "still accepting after shutdown"
    );
}

/// The large body: bigger than any window, as a flood pod's review is.
const LARGE: usize = 4 << 20;

/// Told when the waiting handler has its request, and tells it when to read.
#[derive(Default)]
struct Gate {
    entered: Notify,
    release: Notify,
}

async fn waits_then_reads(State(gate): State<Arc<Gate>>, body: Body) -> String {
    gate.entered.notify_one();
    gate.release.notified().await;
    let bytes = body.collect().await.expect("the large body").to_bytes();
    bytes.len().to_string()
}

async fn reads(body: Body) -> String {
    let bytes = body.collect().await.expect("the small body").to_bytes();
    bytes.len().to_string()
}

/// The apiserver sends its reviews as streams of one HTTP/2 connection, and a
/// large body that waits unread (berth holds a 2 MB pod until its memory budget
/// has room) must not stall the ordinary reviews beside it. With hyper's default
/// windows it did: the waiting stream took the whole connection window, every
/// small review behind it waited, and the apiserver let those pods through
/// without berth after its 3 s timeout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_large_body_waiting_unread_does_not_stall_small_requests_on_the_connection() {
    let gate = Arc::new(Gate::default());
    let app = Router::new()
        .route("/large", post(waits_then_reads))
        .route("/small", post(reads))
        .with_state(gate.clone());
    let mut served = Served::start("http2", app, &[b"h2"]).await;

    // One HTTP/2 connection, as the apiserver's webhook client keeps.
    let tls = served.connect().await;
    assert_eq!(tls.get_ref().1.alpn_protocol(), Some(&b"h2"[..]));
    let (sender, connection) =
        hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(tls))
            .await
            .unwrap();
    tokio::spawn(connection);

    let request = |path: &str, size: usize| {
        hyper::Request::post(format!("https://berth{path}"))
            .body(Full::new(Bytes::from(vec![b'x'; size])))
            .unwrap()
    };
    let mut large_sender = sender.clone();
    let large_request = request("/large", LARGE);
    let large = tokio::spawn(async move { large_sender.send_request(large_request).await });
    gate.entered.notified().await;
    // Let the client push what the windows allow of the large body: with a window
    // shared by the connection, that is all of it.
    tokio::time::sleep(Duration::from_millis(300)).await;

    let mut small_sender = sender.clone();
    let small = tokio::time::timeout(
        Duration::from_secs(10),
        small_sender.send_request(request("/small", 2048)),
    )
    .await
    .expect("the small request is answered while the large body waits unread")
    .unwrap();
    let text = small.into_body().collect().await.unwrap().to_bytes();
    assert_eq!(text, "2048", "the small body arrived whole");

    gate.release.notify_one();
    let large = large.await.unwrap().expect("the large request");
    let text = large.into_body().collect().await.unwrap().to_bytes();
    assert_eq!(text, LARGE.to_string(), "the large body arrived whole");

    drop((sender, small_sender));
    served.shutdown.cancel();
    (&mut served.server).await.unwrap();
}
