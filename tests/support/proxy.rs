//! A TCP proxy on 127.0.0.1 that the fault suite puts where a cluster has a
//! network: in front of berth's replicas (a Service: new connections go to a
//! backend whose `/readyz` answers, as endpoints hold only Ready pods) and between
//! berth and the apiserver (a link the suite can cut).
//!
//! It runs on a runtime of its own, so a test that blocks its own threads (kubectl,
//! openssl) never stalls the traffic it carries. TLS passes through untouched: the
//! apiserver's and berth's certificates name 127.0.0.1, as the proxy does.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::net::{TcpListener, TcpStream};
use tokio_util::sync::CancellationToken;

/// One upstream: a berth replica (by its identity) or the apiserver.
#[derive(Debug, Clone)]
struct Backend {
    name: String,
    port: u16,
    /// Whether new connections may go to it (its `/readyz` answered `ok`).
    ready: bool,
}

#[derive(Debug, Default)]
struct Inner {
    backends: Mutex<Vec<Backend>>,
    next: AtomicUsize,
    /// Cancelled to reset every connection open now; replaced by a fresh one.
    cut: Mutex<CancellationToken>,
    /// Cancelled to stop carrying bytes on every connection open now, while
    /// keeping it open; replaced by a fresh one.
    stall: Mutex<CancellationToken>,
    refuse_until: Mutex<Option<Instant>>,
    accepted: AtomicU64,
    /// Connections the proxy could not carry: no ready backend, the backend
    /// refused, or the link was cut.
    failed: AtomicU64,
}

/// A running proxy; it stops when dropped.
pub struct Proxy {
    pub port: u16,
    inner: Arc<Inner>,
    stop: CancellationToken,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Proxy {
    /// A proxy to the backends `(name, port)`, all taken as ready. With
    /// `probe_readyz`, it asks each backend's `/readyz` (HTTPS, certificate not
    /// checked, as a kubelet probe) every 500 ms and sends new connections only
    /// to those that answer `ok`, as a Service's endpoints do.
    pub fn start(backends: &[(&str, u16)], probe_readyz: bool) -> Proxy {
        let inner = Arc::new(Inner::default());
        *inner.backends.lock().unwrap() = backends
            .iter()
            .map(|(name, port)| Backend {
                name: name.to_string(),
                port: *port,
                ready: true,
            })
            .collect();
        let std_listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind the proxy");
        std_listener.set_nonblocking(true).unwrap();
        let port = std_listener.local_addr().unwrap().port();
        let stop = CancellationToken::new();
        let thread = {
            let (inner, stop) = (inner.clone(), stop.clone());
            std::thread::Builder::new()
                .name(format!("proxy-{port}"))
                .spawn(move || {
                    let runtime = tokio::runtime::Builder::new_multi_thread()
                        .worker_threads(1)
                        .enable_all()
                        .build()
                        .expect("proxy runtime");
                    runtime.block_on(async move {
                        let listener = TcpListener::from_std(std_listener).unwrap();
                        if probe_readyz {
                            tokio::spawn(probe(inner.clone(), stop.clone()));
                        }
                        accept(listener, inner, stop).await;
                    });
                    runtime.shutdown_timeout(Duration::from_secs(1));
                })
                .expect("proxy thread")
        };
        Proxy {
            port,
            inner,
            stop,
            thread: Some(thread),
        }
    }

    /// Adds `name` at `port` (or moves it there), not ready until its probe says
    /// so when the proxy probes, ready at once otherwise.
    pub fn set_backend(&self, name: &str, port: u16, ready: bool) {
        let mut backends = self.inner.backends.lock().unwrap();
        backends.retain(|b| b.name != name);
        backends.push(Backend {
            name: name.into(),
            port,
            ready,
        });
    }

    /// Takes `name` out: no new connection goes to it (its open ones stay, as a
    /// terminating pod's do when its endpoint is removed).
    pub fn remove_backend(&self, name: &str) {
        self.inner
            .backends
            .lock()
            .unwrap()
            .retain(|b| b.name != name);
    }

    /// Whether `name` is a backend that takes new connections now.
    pub fn is_ready(&self, name: &str) -> bool {
        self.inner
            .backends
            .lock()
            .unwrap()
            .iter()
            .any(|b| b.name == name && b.ready)
    }

    /// Resets every connection open now and refuses new ones for `refuse_for`.
    pub fn cut(&self, refuse_for: Duration) {
        *self.inner.refuse_until.lock().unwrap() = Some(Instant::now() + refuse_for);
        let old = std::mem::take(&mut *self.inner.cut.lock().unwrap());
        old.cancel();
    }

    /// Stops carrying bytes on every connection open now, without closing it (a
    /// peer that vanished without a reset, a middlebox that dropped the flow): the
    /// two ends see a silent connection. New connections work. A later
    /// [`Proxy::cut`] resets the stalled ones.
    pub fn stall(&self) {
        let old = std::mem::take(&mut *self.inner.stall.lock().unwrap());
        old.cancel();
    }

    /// Connections accepted so far.
    pub fn accepted(&self) -> u64 {
        self.inner.accepted.load(Ordering::Relaxed)
    }

    /// Connections the proxy could not carry to a backend so far.
    pub fn failed(&self) -> u64 {
        self.inner.failed.load(Ordering::Relaxed)
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.stop.cancel();
        self.inner.cut.lock().unwrap().cancel();
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// Closes `stream` with a reset, as a refused or cut connection looks.
fn reset(stream: TcpStream) {
    let _ = stream.set_zero_linger();
    drop(stream);
}

async fn accept(listener: TcpListener, inner: Arc<Inner>, stop: CancellationToken) {
    loop {
        let client = tokio::select! {
            () = stop.cancelled() => return,
            accepted = listener.accept() => match accepted {
                Ok((client, _)) => client,
                Err(_) => continue,
            },
        };
        inner.accepted.fetch_add(1, Ordering::Relaxed);
        let refusing = inner
            .refuse_until
            .lock()
            .unwrap()
            .is_some_and(|until| Instant::now() < until);
        let backend = {
            let backends = inner.backends.lock().unwrap();
            let ready: Vec<u16> = backends
                .iter()
                .filter(|b| b.ready)
                .map(|b| b.port)
                .collect();
            (!ready.is_empty())
                .then(|| ready[inner.next.fetch_add(1, Ordering::Relaxed) % ready.len()])
        };
        let Some(port) = backend.filter(|_| !refusing) else {
            inner.failed.fetch_add(1, Ordering::Relaxed);
            reset(client);
            continue;
        };
        let cut = inner.cut.lock().unwrap().clone();
        let stall = inner.stall.lock().unwrap().clone();
        let inner = inner.clone();
        tokio::spawn(async move {
            // As kube-proxy does, a connection goes to the endpoint chosen: if that
            // one refuses, the client sees the failure, there is no second try.
            let Ok(mut upstream) = TcpStream::connect(("127.0.0.1", port)).await else {
                inner.failed.fetch_add(1, Ordering::Relaxed);
                reset(client);
                return;
            };
            let mut client = client;
            let _ = client.set_nodelay(true);
            let _ = upstream.set_nodelay(true);
            tokio::select! {
                _ = tokio::io::copy_bidirectional(&mut client, &mut upstream) => return,
                () = cut.cancelled() => {}
                () = stall.cancelled() => cut.cancelled().await,
            }
            reset(client);
            reset(upstream);
        });
    }
}

/// Marks each backend ready while its `/readyz` answers `ok`, every 500 ms.
async fn probe(inner: Arc<Inner>, stop: CancellationToken) {
    loop {
        let targets: Vec<(String, u16)> = inner
            .backends
            .lock()
            .unwrap()
            .iter()
            .map(|b| (b.name.clone(), b.port))
            .collect();
        for (name, port) in targets {
            let ready = readyz(port).await;
            let mut backends = inner.backends.lock().unwrap();
            if let Some(b) = backends
                .iter_mut()
                .find(|b| b.name == name && b.port == port)
            {
                b.ready = ready;
            }
        }
        tokio::select! {
            () = stop.cancelled() => return,
            () = tokio::time::sleep(Duration::from_millis(500)) => {}
        }
    }
}

/// Whether berth's `/readyz` on `port` answers `ok` within a second.
pub async fn readyz(port: u16) -> bool {
    let output = tokio::process::Command::new("curl")
        .args([
            "-sk",
            "--max-time",
            "1",
            &format!("https://127.0.0.1:{port}/readyz"),
        ])
        .output()
        .await;
    output.is_ok_and(|o| o.stdout == b"ok")
}
