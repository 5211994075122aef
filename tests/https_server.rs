//! The HTTPS server on a real socket: its graceful shutdown, and its HTTP/2 flow
//! control under a large body that waits unread.

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::routing::{get, post};
use berth::admission::server::{Connections, bind, serve_plain, serve_tls};
use berth::admission::tls::ReloadingCert;
use http_body_util::{BodyExt, Full};
use hyper_util::rt::{TokioExecutor, TokioIo};
use rustls::pki_types::{CertificateDer, ServerName, pem::PemObject};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::net::TcpStream;
use tokio::sync::{Notify, watch};
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
    /// A client that trusts the server and presents no certificate.
    anonymous: TlsConnector,
    dir: PathBuf,
    metrics: Arc<berth::telemetry::Metrics>,
}

impl Served {
    /// Serves `app`; the client offers `alpn` (none: HTTP/1.1).
    async fn start(name: &str, app: Router, alpn: &[&[u8]]) -> Served {
        Served::start_with(name, app, alpn, None, None).await
    }

    /// Serves `app` with `client_ca` (PEM) when given, to a client that presents
    /// `client` (certificate and key, PEM) when given.
    async fn start_with(
        name: &str,
        app: Router,
        alpn: &[&[u8]],
        client_ca: Option<&str>,
        client: Option<(&str, &str)>,
    ) -> Served {
        Served::start_limited(name, app, alpn, client_ca, client, 128).await
    }

    /// Serves `app` with at most `max_connections` open at once, asking clients
    /// for a certificate of `client_ca` when given; the client presents `client`
    /// (certificate and key, PEM) when given.
    async fn start_limited(
        name: &str,
        app: Router,
        alpn: &[&[u8]],
        client_ca: Option<&str>,
        client: Option<(&str, &str)>,
        max_connections: usize,
    ) -> Served {
        let dir = std::env::temp_dir().join(format!("berth-{name}-{}", std::process::id()));
        let issued = berth::certs::write_certs("berth", "berth-system", &dir, 1).unwrap();
        let cert =
            Arc::new(ReloadingCert::load(&dir.join("tls.crt"), &dir.join("tls.key")).unwrap());
        let client_ca_path = client_ca.map(|pem| {
            let path = dir.join("client-ca.crt");
            std::fs::write(&path, pem).unwrap();
            path
        });
        let listener = bind("127.0.0.1:0".parse().unwrap()).await.unwrap();
        let addr = listener.local_addr().unwrap();
        let shutdown = CancellationToken::new();
        let metrics = Arc::new(berth::telemetry::Metrics::default());
        let server = tokio::spawn(serve_tls(
            listener,
            cert.server_config(client_ca_path.as_deref()).unwrap(),
            app,
            shutdown.clone(),
            Connections::new(max_connections, Duration::from_secs(5), metrics.clone()).trusting(
                berth::admission::server::Trust {
                    client_certificate: client_ca.is_some(),
                    addresses: Vec::new(),
                },
            ),
        ));
        let mut roots = rustls::RootCertStore::empty();
        roots
            .add(CertificateDer::from_pem_slice(issued.ca_pem.as_bytes()).unwrap())
            .unwrap();
        let builder = rustls::ClientConfig::builder().with_root_certificates(roots.clone());
        let anonymous = rustls::ClientConfig::builder()
            .with_root_certificates(roots)
            .with_no_client_auth();
        let mut config = match client {
            None => builder.with_no_client_auth(),
            Some((cert, key)) => builder
                .with_client_auth_cert(
                    vec![CertificateDer::from_pem_slice(cert.as_bytes()).unwrap()],
                    rustls::pki_types::PrivateKeyDer::from_pem_slice(key.as_bytes()).unwrap(),
                )
                .unwrap(),
        };
        config.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
        Served {
            addr,
            shutdown,
            server,
            connector: TlsConnector::from(Arc::new(config)),
            anonymous: TlsConnector::from(Arc::new(anonymous)),
            dir,
            metrics,
        }
    }

    /// A new TLS connection to the server from the local address `from`, or why
    /// it failed.
    async fn connect_from(&self, from: [u8; 4]) -> std::io::Result<TlsStream<TcpStream>> {
        self.connect_with(&self.connector, from).await
    }

    /// [`Served::connect_from`] by a client that presents no certificate.
    async fn connect_anonymous_from(&self, from: [u8; 4]) -> std::io::Result<TlsStream<TcpStream>> {
        self.connect_with(&self.anonymous, from).await
    }

    async fn connect_with(
        &self,
        connector: &TlsConnector,
        from: [u8; 4],
    ) -> std::io::Result<TlsStream<TcpStream>> {
        let socket = tokio::net::TcpSocket::new_v4()?;
        socket.bind(SocketAddr::from((from, 0)))?;
        let tcp = socket.connect(self.addr).await?;
        connector
            .connect(ServerName::try_from("berth.berth-system.svc").unwrap(), tcp)
            .await
    }

    /// A new TLS connection to the server.
    async fn connect(&self) -> TlsStream<TcpStream> {
        self.try_connect().await.unwrap()
    }

    /// A new TLS connection to the server, or why the handshake failed.
    async fn try_connect(&self) -> std::io::Result<TlsStream<TcpStream>> {
        let tcp = TcpStream::connect(self.addr).await.unwrap();
        // As Go's net package does for every connection the apiserver makes.
        tcp.set_nodelay(true).unwrap();
        self.connector
            .connect(ServerName::try_from("berth.berth-system.svc").unwrap(), tcp)
            .await
    }

    /// The status and body of `GET`/`POST path` on a new connection, HTTP/1.1.
    async fn ask(&self, method: &str, path: &str) -> std::io::Result<String> {
        let mut tls = self.try_connect().await?;
        let request = format!(
            "{method} {path} HTTP/1.1\r\nhost: berth\r\ncontent-length: 2\r\nconnection: close\r\n\r\n{{}}"
        );
        tls.write_all(request.as_bytes()).await?;
        let mut response = String::new();
        tls.read_to_string(&mut response).await.ok();
        Ok(response)
    }
}

impl Drop for Served {
    fn drop(&mut self) {
        std::fs::remove_dir_all(&self.dir).ok();
    }
}

#[tokio::test]
async fn an_in_flight_request_finishes_and_the_connection_closes() {
    // The handler says when it has the request, so the shutdown comes while it is
    // in flight, however busy the machine.
    let started = Arc::new(Notify::new());
    let handler_started = started.clone();
    let app = Router::new().route(
        "/slow",
        get(move || {
            let started = handler_started.clone();
            async move {
                started.notify_one();
                tokio::time::sleep(Duration::from_millis(800)).await;
                "finished"
            }
        }),
    );
    let mut served = Served::start("graceful", app, &[]).await;
    let mut tls = served.connect().await;
    tls.write_all(b"GET /slow HTTP/1.1\r\nhost: berth\r\n\r\n")
        .await
        .unwrap();

    started.notified().await;
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

/// HTTP/2's frame types and flags that flow control turns on (RFC 9113, 6).
const DATA: u8 = 0x0;
const HEADERS: u8 = 0x1;
const SETTINGS: u8 = 0x4;
const WINDOW_UPDATE: u8 = 0x8;
const END_STREAM: u8 = 0x1;
const ACK: u8 = 0x1;
const SETTINGS_INITIAL_WINDOW_SIZE: u16 = 0x4;
/// Every window before the peer's SETTINGS or WINDOW_UPDATE says otherwise.
const DEFAULT_WINDOW: u64 = 65_535;

/// One HTTP/2 frame.
struct Frame {
    kind: u8,
    flags: u8,
    stream: u32,
    payload: Vec<u8>,
}

/// Cuts one direction of a connection's bytes into frames, however they were
/// split into writes or reads.
struct Frames {
    /// The bytes of the client's connection preface still to pass.
    preface: usize,
    pending: Vec<u8>,
}

impl Frames {
    fn new(preface: usize) -> Frames {
        Frames {
            preface,
            pending: Vec::new(),
        }
    }

    /// The frames that `bytes` completes.
    fn feed(&mut self, mut bytes: &[u8]) -> Vec<Frame> {
        let skip = self.preface.min(bytes.len());
        self.preface -= skip;
        bytes = &bytes[skip..];
        self.pending.extend_from_slice(bytes);
        let mut frames = Vec::new();
        while self.pending.len() >= 9 {
            let header = &self.pending[..9];
            let length = u32::from_be_bytes([0, header[0], header[1], header[2]]) as usize;
            if self.pending.len() < 9 + length {
                break;
            }
            let stream = u32::from_be_bytes([header[5], header[6], header[7], header[8]]);
            frames.push(Frame {
                kind: header[3],
                flags: header[4],
                stream: stream & 0x7fff_ffff,
                payload: self.pending[9..9 + length].to_vec(),
            });
            self.pending.drain(..9 + length);
        }
        frames
    }
}

/// What the client's HTTP/2 connection has said and heard so far, from its own
/// frames: the windows the server gave it, and the body bytes it sent.
#[derive(Debug)]
struct Wire {
    /// The server's SETTINGS have come (the first frame a server sends).
    settings: bool,
    /// Each stream's window as the server set it (SETTINGS_INITIAL_WINDOW_SIZE).
    stream_window: u64,
    /// The WINDOW_UPDATE increments the server sent, by stream (0: the connection).
    updates: BTreeMap<u32, u64>,
    /// The stream of the first request the client sent.
    first: Option<u32>,
    /// The DATA bytes the client sent, by stream, and the streams it ended.
    sent: BTreeMap<u32, u64>,
    ended: BTreeSet<u32>,
}

impl Wire {
    fn new() -> Wire {
        Wire {
            settings: false,
            stream_window: DEFAULT_WINDOW,
            updates: BTreeMap::new(),
            first: None,
            sent: BTreeMap::new(),
            ended: BTreeSet::new(),
        }
    }

    fn client_sent(&mut self, frame: &Frame) {
        match frame.kind {
            HEADERS => {
                self.first.get_or_insert(frame.stream);
            }
            // Flow control counts the whole payload, padding included.
            DATA => {
                *self.sent.entry(frame.stream).or_default() += frame.payload.len() as u64;
                if frame.flags & END_STREAM != 0 {
                    self.ended.insert(frame.stream);
                }
            }
            _ => {}
        }
    }

    fn server_sent(&mut self, frame: &Frame) {
        match frame.kind {
            SETTINGS if frame.flags & ACK == 0 => {
                self.settings = true;
                for setting in frame.payload.chunks_exact(6) {
                    let id = u16::from_be_bytes([setting[0], setting[1]]);
                    let value =
                        u32::from_be_bytes([setting[2], setting[3], setting[4], setting[5]]);
                    if id == SETTINGS_INITIAL_WINDOW_SIZE {
                        self.stream_window = u64::from(value);
                    }
                }
            }
            WINDOW_UPDATE => {
                let p = &frame.payload;
                let increment = u32::from_be_bytes([p[0], p[1], p[2], p[3]]) & 0x7fff_ffff;
                *self.updates.entry(frame.stream).or_default() += u64::from(increment);
            }
            _ => {}
        }
    }

    /// The DATA bytes the client sent on `stream`.
    fn sent_on(&self, stream: u32) -> u64 {
        self.sent.get(&stream).copied().unwrap_or_default()
    }

    /// The window the server gave `stream`: its initial window and its updates.
    fn window_of(&self, stream: u32) -> u64 {
        self.stream_window + self.updates.get(&stream).copied().unwrap_or_default()
    }

    /// The first request's stream and the body bytes sent on it, once the client
    /// has sent as much of that body as the windows let it: the whole window the
    /// server gave the stream (it releases none of it while the body waits
    /// unread), or the whole body.
    fn first_body_held(&self) -> Option<(u32, u64)> {
        let stream = self.first?;
        let sent = self.sent_on(stream);
        (self.settings && (sent >= self.window_of(stream) || self.ended.contains(&stream)))
            .then_some((stream, sent))
    }
}

/// The client's side of a connection, under TLS: tells `wire` of every HTTP/2
/// frame the client writes and reads.
struct Tap<T> {
    inner: T,
    written: Frames,
    read: Frames,
    wire: watch::Sender<Wire>,
}

impl<T> Tap<T> {
    fn new(inner: T) -> (Tap<T>, watch::Receiver<Wire>) {
        let (wire, seen) = watch::channel(Wire::new());
        let tap = Tap {
            inner,
            // "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
            written: Frames::new(24),
            read: Frames::new(0),
            wire,
        };
        (tap, seen)
    }
}

impl<T: AsyncRead + Unpin> AsyncRead for Tap<T> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let this = self.get_mut();
        let before = buf.filled().len();
        let polled = Pin::new(&mut this.inner).poll_read(cx, buf);
        if let Poll::Ready(Ok(())) = polled {
            let frames = this.read.feed(&buf.filled()[before..]);
            if !frames.is_empty() {
                this.wire
                    .send_modify(|wire| frames.iter().for_each(|f| wire.server_sent(f)));
            }
        }
        polled
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for Tap<T> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        let this = self.get_mut();
        let polled = Pin::new(&mut this.inner).poll_write(cx, buf);
        if let Poll::Ready(Ok(written)) = polled {
            let frames = this.written.feed(&buf[..written]);
            if !frames.is_empty() {
                this.wire
                    .send_modify(|wire| frames.iter().for_each(|f| wire.client_sent(f)));
            }
        }
        polled
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_shutdown(cx)
    }
}

/// The apiserver sends its reviews as streams of one HTTP/2 connection, and a
/// large body not read yet (its handler not run yet on a busy machine) must not
/// stall the ordinary reviews beside it. With hyper's default windows it did: a
/// waiting stream took the whole connection window, every small review behind it
/// waited, and the apiserver let those pods through without berth after its 3 s
/// timeout. Each stream's window is now a quarter of the connection's, and berth
/// reads every body as it arrives or gives it up (`BodyLimits::read`).
///
/// The small request goes only once the client's own frames show the large body
/// sent as far as the server's windows let it; had the connection's window run
/// out first, that never comes and the test fails there.
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
    let (tls, mut wire) = Tap::new(tls);
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
    // The client has pushed what the windows allow of the large body, by its own
    // frames: the stream's whole window. A connection window that ran out first
    // would stop it short of that, the stall this test is about.
    let held = tokio::time::timeout(Duration::from_secs(10), async {
        let held = wire.wait_for(|w| w.first_body_held().is_some()).await?;
        Ok::<_, watch::error::RecvError>(held.first_body_held().unwrap())
    })
    .await;
    let (stream, pushed) = match held {
        Ok(Ok(held)) => held,
        Ok(Err(_)) => panic!("the connection closed before the large body was pushed"),
        Err(_) => panic!(
            "within 10 s the client did not push the large body as far as its stream's \
             window: the connection's window ran out first? {:?}",
            *wire.borrow()
        ),
    };

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
    assert_eq!(
        wire.borrow().sent_on(stream),
        pushed,
        "the large body waited, holding its window, while the small one was answered"
    );

    gate.release.notify_one();
    let large = large.await.unwrap().expect("the large request");
    let text = large.into_body().collect().await.unwrap().to_bytes();
    assert_eq!(text, LARGE.to_string(), "the large body arrived whole");

    drop((sender, small_sender));
    served.shutdown.cancel();
    (&mut served.server).await.unwrap();
}

/// berth's own router behind the real server, with `--client-ca`.
fn berth_app(require_client_cert: bool) -> Router {
    use berth::admission::body::BodyLimits;
    use berth::admission::handlers::{AppState, router};
    use berth::admission::server::Trust;
    use berth::admission::state::FixedView;
    let state = Arc::new(AppState {
        view: Arc::new(FixedView::default()),
        metrics: Arc::default(),
        tls_ready: true.into(),
        limits: BodyLimits::new(1 << 20, 8 << 20, Duration::from_secs(5)),
        berth_user: berth::names::BERTH_SERVICE_ACCOUNT.into(),
        trust: Trust {
            client_certificate: require_client_cert,
            addresses: Vec::new(),
        },
        review_timeout: Duration::from_secs(3),
    });
    router(state, 8)
}

/// A CA, and a client certificate (clientAuth) it signs: PEMs of the CA, the
/// certificate and its key.
fn client_pki(name: &str) -> (String, String, String) {
    use rcgen::{
        BasicConstraints, CertificateParams, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    };
    let ca_key = KeyPair::generate().unwrap();
    let mut ca = CertificateParams::new(Vec::new()).unwrap();
    ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    let ca_pem = ca.self_signed(&ca_key).unwrap().pem();
    let issuer = Issuer::from_ca_cert_pem(&ca_pem, &ca_key).unwrap();
    let mut params = CertificateParams::new(vec![name.to_string()]).unwrap();
    params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
    let key = KeyPair::generate().unwrap();
    let cert = params.signed_by(&key, &issuer).unwrap();
    (ca_pem, cert.pem(), key.serialize_pem())
}

/// With `--client-ca`, only a client with a certificate of that CA (the
/// apiserver) has its reviews read; anyone else, a tenant's pod included, gets a
/// 403 on the admission paths, and the probes still answer.
#[tokio::test]
async fn with_a_client_ca_only_its_clients_send_reviews() {
    let (ca, cert, key) = client_pki("kube-apiserver");
    let tenant = Served::start_with("no-client-cert", berth_app(true), &[], Some(&ca), None).await;
    let refused = tenant.ask("POST", "/mutate").await.unwrap();
    assert!(refused.starts_with("HTTP/1.1 403"), "{refused}");
    assert!(refused.contains("client CA"), "{refused}");
    let probe = tenant.ask("GET", "/healthz").await.unwrap();
    assert!(probe.starts_with("HTTP/1.1 200"), "{probe}");

    let apiserver = Served::start_with(
        "client-cert",
        berth_app(true),
        &[],
        Some(&ca),
        Some((&cert, &key)),
    )
    .await;
    let read = apiserver.ask("POST", "/mutate").await.unwrap();
    assert!(
        read.starts_with("HTTP/1.1 400"),
        "the body is read (and is no review): {read}"
    );

    // A certificate of another CA fails the handshake itself.
    let (_, other_cert, other_key) = client_pki("impostor");
    let impostor = Served::start_with(
        "other-client-cert",
        berth_app(true),
        &[],
        Some(&ca),
        Some((&other_cert, &other_key)),
    )
    .await;
    let handshake = impostor.ask("POST", "/mutate").await;
    assert!(
        handshake.is_err() || handshake.as_ref().unwrap().is_empty(),
        "{handshake:?}"
    );
}

/// The answer to `GET /healthz` on `tls`, HTTP/1.1 with keep-alive, or why none
/// came.
async fn healthz(tls: &mut TlsStream<TcpStream>) -> std::io::Result<String> {
    tls.write_all(b"GET /healthz HTTP/1.1\r\nhost: berth\r\n\r\n")
        .await?;
    let mut buffer = vec![0; 4096];
    let read = tokio::time::timeout(Duration::from_secs(5), tls.read(&mut buffer))
        .await
        .map_err(|_| std::io::Error::other("no answer in 5 s"))??;
    Ok(String::from_utf8_lossy(&buffer[..read]).into_owned())
}

/// Anyone who reaches the port can open connections; one address that takes
/// them all keeps none from the apiserver: a new connection from an address
/// holding less than an equal share closes the newest of the address holding the
/// most, and the address at its share gets no more. Counted in berth's metrics.
#[tokio::test]
async fn connections_are_shared_fairly_among_the_addresses_that_open_them() {
    let served = Served::start_limited("fair", berth_app(false), &[], None, None, 4).await;
    let mut attacker = Vec::new();
    for _ in 0..4 {
        let mut tls = served.connect_from([127, 0, 0, 2]).await.unwrap();
        assert!(healthz(&mut tls).await.unwrap().starts_with("HTTP/1.1 200"));
        attacker.push(tls);
    }
    // The address holds every connection: its next one is closed at once.
    let refused = match served.connect_from([127, 0, 0, 2]).await {
        Err(e) => e.to_string(),
        Ok(mut tls) => format!("{:?}", healthz(&mut tls).await),
    };
    assert!(
        !refused.contains("200"),
        "a fifth connection served: {refused}"
    );
    // The apiserver's address holds none: it takes one of the attacker's.
    let mut apiserver = served.connect_from([127, 0, 0, 1]).await.unwrap();
    assert!(
        healthz(&mut apiserver)
            .await
            .unwrap()
            .starts_with("HTTP/1.1 200")
    );
    let newest = attacker.last_mut().unwrap();
    let closed = healthz(newest).await;
    assert!(
        closed.as_ref().map_or(true, |answer| answer.is_empty()),
        "the attacker's newest connection still serves: {closed:?}"
    );
    for tls in &mut attacker[..3] {
        assert!(healthz(tls).await.unwrap().starts_with("HTTP/1.1 200"));
    }
    let metrics = served.metrics.encode();
    for line in [
        "berth_connections_dropped_total{kind=\"refused\"} 1",
        "berth_connections_dropped_total{kind=\"revoked\"} 1",
        "berth_connections 4",
    ] {
        assert!(metrics.contains(line), "{line} in\n{metrics}");
    }
}

/// A tenant with more addresses than berth has connections (its pods, or a
/// `hostNetwork` DaemonSet on every node), each holding one connection it opened
/// without a certificate: the apiserver, holding none, still gets one, and no
/// number of new addresses takes it back once its certificate is seen.
#[tokio::test]
async fn more_addresses_than_connections_keep_none_from_the_apiserver() {
    let (ca, cert, key) = client_pki("kube-apiserver");
    let served = Served::start_limited(
        "many-addresses",
        berth_app(true),
        &[],
        Some(&ca),
        Some((&cert, &key)),
        4,
    )
    .await;
    let mut tenant = Vec::new();
    for last in 2..6 {
        let mut tls = served
            .connect_anonymous_from([127, 0, 0, last])
            .await
            .unwrap();
        assert!(healthz(&mut tls).await.unwrap().starts_with("HTTP/1.1 200"));
        tenant.push(tls);
    }
    let answer = match served.connect_from([127, 0, 0, 1]).await {
        Ok(mut apiserver) => {
            let answer = healthz(&mut apiserver).await;
            tenant.push(apiserver);
            answer
        }
        Err(e) => Err(e),
    };
    let mut apiserver = tenant.pop().unwrap();
    assert!(
        answer.as_ref().is_ok_and(|a| a.starts_with("HTTP/1.1 200")),
        "the apiserver's connection is refused: {answer:?}"
    );
    // More of the tenant's addresses, each holding less than the others: they
    // take the tenant's connections, never the apiserver's.
    for last in 6..20 {
        if let Ok(mut tls) = served.connect_anonymous_from([127, 0, 0, last]).await {
            healthz(&mut tls).await.ok();
            tenant.push(tls);
        }
    }
    let answer = healthz(&mut apiserver).await;
    assert!(
        answer.as_ref().is_ok_and(|a| a.starts_with("HTTP/1.1 200")),
        "the apiserver's connection was taken: {answer:?}"
    );
    let metrics = served.metrics.encode();
    assert!(
        metrics.contains("berth_connections 4"),
        "never more than the bound:\n{metrics}"
    );
}

/// The metrics port is plain HTTP that a `hostNetwork` pod reaches whatever the
/// NetworkPolicy says. A tenant opening connections there and sending nothing
/// holds a bounded number of them (each is a file descriptor and a task of
/// berth's, whose webhook and controller need theirs), and Prometheus, on an
/// address of its own, still scrapes.
#[tokio::test]
async fn the_metrics_port_holds_a_bounded_number_of_idle_connections() {
    let listener = bind("127.0.0.1:0".parse().unwrap()).await.unwrap();
    let addr = listener.local_addr().unwrap();
    let app = Router::new().route("/metrics", get(|| async { "berth_up 1\n" }));
    let shutdown = CancellationToken::new();
    let server = tokio::spawn(serve_plain(listener, app, shutdown.clone()));
    let connect_from = |from: [u8; 4]| async move {
        let socket = tokio::net::TcpSocket::new_v4().unwrap();
        socket.bind(SocketAddr::from((from, 0))).unwrap();
        socket.connect(addr).await.unwrap()
    };
    let mut idle = Vec::new();
    for _ in 0..200 {
        idle.push(connect_from([127, 0, 0, 2]).await);
    }
    let mut prometheus = connect_from([127, 0, 0, 1]).await;
    prometheus
        .write_all(b"GET /metrics HTTP/1.1\r\nhost: berth\r\nconnection: close\r\n\r\n")
        .await
        .unwrap();
    let mut scraped = String::new();
    tokio::time::timeout(
        Duration::from_secs(5),
        prometheus.read_to_string(&mut scraped),
    )
    .await
    .expect("scraped in time")
    .unwrap();
    assert!(scraped.contains("berth_up 1"), "{scraped}");
    // A connection berth closed reads its end; one it holds has nothing to read.
    let mut open = 0;
    for tcp in &mut idle {
        let mut byte = [0; 1];
        match tokio::time::timeout(Duration::from_millis(20), tcp.read(&mut byte)).await {
            Err(_) => open += 1,
            Ok(Ok(0)) | Ok(Err(_)) => {}
            Ok(Ok(_)) => panic!("an answer to nothing"),
        }
    }
    assert!(open <= 16, "{open} of 200 idle connections held open");
    shutdown.cancel();
    tokio::time::timeout(Duration::from_secs(10), server)
        .await
        .expect("the metrics server stops")
        .unwrap();
}
