//! The HTTPS server: rustls over tokio, HTTP/1.1 and HTTP/2 by ALPN, and a
//! graceful shutdown that stops accepting, lets in-flight requests finish and
//! closes keep-alive connections.

use std::net::{IpAddr, SocketAddr};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use axum::Router;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use ipnet::IpNet;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpListener;
use tokio_rustls::TlsAcceptor;
use tokio_util::sync::CancellationToken;

use super::share::FairShare;
use crate::telemetry::{KindLabels, Metrics};

/// How long a client may take to finish the TLS handshake (the apiserver takes
/// milliseconds); until then its connection counts against its peer's share.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(5);
/// How long an HTTP/1 client may take to send a request's headers; the body has a
/// bound of its own (`BodyLimits`).
const HEADER_TIMEOUT: Duration = Duration::from_secs(10);
/// HTTP/2 connections are pinged this often, and closed when a ping goes
/// unanswered as long: a peer that vanished does not hold a connection open.
const KEEP_ALIVE: Duration = Duration::from_secs(20);
/// What HTTP/2 may buffer for a stream before berth reads it: an ordinary review
/// (a few kB) arrives in one window.
const STREAM_WINDOW: u32 = 64 * 1024;
/// What HTTP/2 may buffer for a whole connection before berth reads it. berth
/// reads every body as it arrives, and gives up a body it cannot take rather than
/// leave it unread (`BodyLimits::read`), so no stream's bytes sit in the window
/// waiting for another's: this bounds what a connection buffers, not what it
/// carries.
const CONNECTION_WINDOW: u32 = 256 * 1024;
/// Streams a connection may have open at once; the apiserver opens another
/// connection when it needs more.
const MAX_STREAMS: u32 = 32;
/// The largest header block of a request (reviews have a few short headers).
const MAX_HEADER_BYTES: u32 = 16 * 1024;
/// What an HTTP/1 connection buffers of a request before berth reads it.
const HTTP1_BUFFER: usize = 64 * 1024;

/// Who sent a request, set on every request of a connection: the connection's
/// peer address, and whether it presented a certificate of the client CA (the
/// verifier refuses one the CA did not sign).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Caller {
    pub addr: IpAddr,
    pub certified: bool,
}

/// Who may send reviews: with `--client-ca`, only a client with a certificate of
/// that CA; with `--apiserver-cidrs`, only a client from those addresses; with
/// both, only one that is both; with neither, anyone who reaches the port.
#[derive(Debug, Clone, Default)]
pub struct Trust {
    pub client_certificate: bool,
    pub addresses: Vec<IpNet>,
}

impl Trust {
    /// Whether `caller` may send reviews.
    pub fn admits(&self, caller: &Caller) -> bool {
        (!self.client_certificate || caller.certified)
            && (self.addresses.is_empty()
                || self.addresses.iter().any(|n| n.contains(&caller.addr)))
    }

    /// Whether anyone who reaches the port may send reviews.
    pub fn is_open(&self) -> bool {
        !self.client_certificate && self.addresses.is_empty()
    }
}

/// How the server bounds its connections.
#[derive(Clone)]
pub struct Connections {
    /// Connections open at once, shared fairly among peers ([`FairShare`]).
    pub share: Arc<FairShare>,
    /// How long shutdown waits for open connections to finish.
    pub grace: Duration,
    pub metrics: Arc<Metrics>,
    /// Who may send reviews: once a connection's client is seen to be trusted
    /// (the door is locked, and it holds the key), no other peer takes its
    /// connection.
    pub trust: Trust,
}

impl Connections {
    pub fn new(max: usize, grace: Duration, metrics: Arc<Metrics>) -> Self {
        Connections {
            share: FairShare::new(max.max(1) as u64),
            grace,
            metrics,
            trust: Trust::default(),
        }
    }

    /// These connections, whose clients `trust` admits keep their connections.
    pub fn trusting(self, trust: Trust) -> Self {
        Connections { trust, ..self }
    }

    /// Whether `caller`'s connection is kept from other peers: only behind a
    /// locked door (an open one trusts everyone, and then shares fairly).
    fn protects(&self, caller: &Caller) -> bool {
        !self.trust.is_open() && self.trust.admits(caller)
    }
}

/// Serves `app` over TLS on `listener` until `shutdown` is cancelled, then waits
/// up to `connections.grace` for open connections to finish.
///
/// Each connection holds one unit of its peer's share from accept to close: a
/// peer with no share left is closed at once, and a connection whose unit is
/// taken by a peer holding less is closed. Once its handshake shows a client the
/// door trusts, its unit is protected: no peer takes it, however many there are. What a connection may buffer is
/// bounded by its HTTP/2 windows or its HTTP/1 buffer, so what all of them buffer
/// is bounded by the number of connections.
pub async fn serve_tls(
    listener: TcpListener,
    tls: rustls::ServerConfig,
    app: Router,
    shutdown: CancellationToken,
    connections: Connections,
) {
    let acceptor = TlsAcceptor::from(Arc::new(tls));
    let graceful = GracefulShutdown::new();
    let metrics = connections.metrics.clone();
    let dropped = |kind: &str| {
        metrics
            .connections_dropped
            .get_or_create(&KindLabels { kind: kind.into() })
            .inc();
    };
    loop {
        let (tcp, peer) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                Err(e) => {
                    // Out of file descriptors and the like: pause rather than spin.
                    tracing::warn!(error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            () = shutdown.cancelled() => break,
        };
        let Some(hold) = connections.share.take(peer.ip(), 1) else {
            tracing::debug!(%peer, "connection refused: its peer holds its share");
            dropped("refused");
            continue;
        };
        // An answer goes out at once: with Nagle's algorithm a small response can
        // wait for the ACK of the one before, and the apiserver waits on each.
        if let Err(e) = tcp.set_nodelay(true) {
            tracing::debug!(%peer, error = %e, "cannot set TCP_NODELAY");
        }
        let acceptor = acceptor.clone();
        let app = app.clone();
        let watcher = graceful.watcher();
        let metrics = metrics.clone();
        let connections = connections.clone();
        tokio::spawn(async move {
            metrics.connections.inc();
            let serving = async {
                let stream =
                    match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(tcp)).await {
                        Ok(Ok(stream)) => stream,
                        Ok(Err(e)) => {
                            tracing::debug!(%peer, error = %e, "TLS handshake failed");
                            return;
                        }
                        Err(_) => {
                            tracing::debug!(%peer, "TLS handshake timed out");
                            return;
                        }
                    };
                let caller = Caller {
                    addr: peer.ip().to_canonical(),
                    certified: stream.get_ref().1.peer_certificates().is_some(),
                };
                if connections.protects(&caller) {
                    hold.protect();
                }
                let service = TowerToHyperService::new(tower::ServiceExt::map_request(
                    app,
                    move |mut request: axum::http::Request<hyper::body::Incoming>| {
                        request.extensions_mut().insert(caller);
                        request
                    },
                ));
                let mut builder = auto::Builder::new(TokioExecutor::new());
                builder
                    .http1()
                    .timer(TokioTimer::new())
                    .header_read_timeout(HEADER_TIMEOUT)
                    .max_buf_size(HTTP1_BUFFER);
                builder
                    .http2()
                    .timer(TokioTimer::new())
                    .keep_alive_interval(KEEP_ALIVE)
                    .keep_alive_timeout(KEEP_ALIVE)
                    .max_concurrent_streams(MAX_STREAMS)
                    .max_header_list_size(MAX_HEADER_BYTES)
                    .initial_stream_window_size(STREAM_WINDOW)
                    .initial_connection_window_size(CONNECTION_WINDOW);
                let connection = builder
                    .serve_connection(TokioIo::new(Unvectored(stream)), service)
                    .into_owned();
                if let Err(e) = watcher.watch(connection).await {
                    tracing::debug!(%peer, error = %e, "connection ended with an error");
                }
            };
            tokio::select! {
                () = serving => {}
                () = hold.revoked() => {
                    tracing::debug!(%peer, "connection closed: a peer holding less took its share");
                    metrics
                        .connections_dropped
                        .get_or_create(&KindLabels { kind: "revoked".into() })
                        .inc();
                }
            }
            metrics.connections.dec();
        });
    }
    drop(listener);
    tracing::info!("stopped accepting; waiting for open connections");
    let grace = connections.grace;
    if tokio::time::timeout(grace, graceful.shutdown())
        .await
        .is_err()
    {
        tracing::warn!(
            ?grace,
            "connections still open after the grace period; closing"
        );
    }
}

/// The TLS stream as HTTP/2 is given it: one that takes no vectored writes.
///
/// h2 copies a DATA frame into its write buffer, beside the frames of other
/// streams, only up to a threshold: 256 bytes over a transport with vectored
/// writes, 1 KiB over one without. A larger frame is written on its own, and
/// nothing more is buffered until it is: a flush, a TLS record and a write to the
/// socket for each answer. berth's answers carry a patch (765 bytes in all for a
/// typical pod, where the minimal webhook's allowance is about 150), so over a
/// rustls stream, which takes vectored writes, each answer went out alone while
/// the apiserver's other streams waited to be written. Without vectored writes an
/// ordinary answer is copied into h2's buffer, and the answers of many streams
/// leave in one record and one write. An answer over 1 KiB is written as two
/// records (h2's buffer, then the rest of the answer), where a vectored write
/// would make one.
struct Unvectored<S>(S);

impl<S: AsyncRead + Unpin> AsyncRead for Unvectored<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.0).poll_read(cx, buf)
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Unvectored<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.0).poll_write(cx, buf)
    }

    fn is_write_vectored(&self) -> bool {
        false
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.0).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.0).poll_shutdown(cx)
    }
}

/// Connections the metrics port holds at once, shared fairly among addresses:
/// Prometheus needs one or two. The port is plain HTTP that a `hostNetwork` pod
/// reaches whatever the NetworkPolicy says, and each connection is a file
/// descriptor and a task of the process that serves the webhook.
const METRICS_CONNECTIONS: u64 = 16;
/// What a metrics connection buffers of a request (a scrape is a few headers).
const METRICS_BUFFER: usize = 16 * 1024;

/// Serves `app` over plain HTTP/1 (the metrics port) until `shutdown` is
/// cancelled: at most [`METRICS_CONNECTIONS`] at once, shared fairly among
/// addresses, each closed when it sends no request for [`HEADER_TIMEOUT`].
pub async fn serve_plain(listener: TcpListener, app: Router, shutdown: CancellationToken) {
    let share = FairShare::new(METRICS_CONNECTIONS);
    let graceful = GracefulShutdown::new();
    loop {
        let (tcp, peer) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                Err(e) => {
                    tracing::warn!(error = %e, "metrics accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            () = shutdown.cancelled() => break,
        };
        let Some(hold) = share.take(peer.ip(), 1) else {
            tracing::debug!(%peer, "metrics connection refused: its peer holds its share");
            continue;
        };
        let mut builder = hyper::server::conn::http1::Builder::new();
        builder
            .timer(TokioTimer::new())
            .header_read_timeout(HEADER_TIMEOUT)
            .max_buf_size(METRICS_BUFFER);
        let connection = graceful.watch(
            builder.serve_connection(TokioIo::new(tcp), TowerToHyperService::new(app.clone())),
        );
        tokio::spawn(async move {
            tokio::select! {
                result = connection => if let Err(e) = result {
                    tracing::debug!(%peer, error = %e, "metrics connection ended with an error");
                },
                () = hold.revoked() => {}
            }
        });
    }
    drop(listener);
    if tokio::time::timeout(HEADER_TIMEOUT, graceful.shutdown())
        .await
        .is_err()
    {
        tracing::debug!("metrics connections still open at shutdown; closing");
    }
}

/// Binds `addr`, naming it in the error.
pub async fn bind(addr: SocketAddr) -> Result<TcpListener, std::io::Error> {
    TcpListener::bind(addr)
        .await
        .map_err(|e| std::io::Error::new(e.kind(), format!("cannot listen on {addr}: {e}")))
}
