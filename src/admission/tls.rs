//! The serving certificate: loaded from PEM files and re-read when they change
//! (cert-manager or a Secret update swaps them in place). A bad new pair is logged
//! and counted, and the old one keeps serving: a half-written file must never take
//! the webhook down.

use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use rustls::ServerConfig;
use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;

use crate::telemetry::Metrics;

/// Why a certificate/key pair cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("cannot read {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path} holds no usable PEM {what}: {reason}")]
    Pem {
        path: PathBuf,
        what: &'static str,
        reason: String,
    },
    #[error("the key does not fit the certificate: {0}")]
    Mismatch(rustls::Error),
    #[error("{path} is no usable client CA: {reason}")]
    ClientCa { path: PathBuf, reason: String },
}

/// A loaded pair, with the bytes it came from, to notice changes.
struct Loaded {
    key: Arc<CertifiedKey>,
    source: (Vec<u8>, Vec<u8>),
}

/// Serves the current certificate and swaps in a new one when the files change.
pub struct ReloadingCert {
    cert_path: PathBuf,
    key_path: PathBuf,
    current: RwLock<Loaded>,
}

impl std::fmt::Debug for ReloadingCert {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ReloadingCert")
            .field("cert_path", &self.cert_path)
            .finish()
    }
}

fn provider() -> Arc<CryptoProvider> {
    CryptoProvider::get_default()
        .cloned()
        .unwrap_or_else(|| Arc::new(rustls::crypto::ring::default_provider()))
}

fn read(path: &Path) -> Result<Vec<u8>, TlsError> {
    std::fs::read(path).map_err(|source| TlsError::Read {
        path: path.to_owned(),
        source,
    })
}

fn parse(
    cert_path: &Path,
    key_path: &Path,
    cert: &[u8],
    key: &[u8],
) -> Result<CertifiedKey, TlsError> {
    let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(cert)
        .collect::<Result<_, _>>()
        .map_err(|e| TlsError::Pem {
            path: cert_path.to_owned(),
            what: "certificate",
            reason: e.to_string(),
        })?;
    if chain.is_empty() {
        return Err(TlsError::Pem {
            path: cert_path.to_owned(),
            what: "certificate",
            reason: "no CERTIFICATE block".into(),
        });
    }
    let key = PrivateKeyDer::from_pem_slice(key).map_err(|e| TlsError::Pem {
        path: key_path.to_owned(),
        what: "private key",
        reason: e.to_string(),
    })?;
    CertifiedKey::from_der(chain, key, &provider()).map_err(TlsError::Mismatch)
}

/// Seconds from now until the leaf certificate of `key` expires.
pub fn seconds_until_expiry(key: &CertifiedKey) -> Option<f64> {
    let leaf = key.cert.first()?;
    let (_, cert) = x509_parser::parse_x509_certificate(leaf.as_ref()).ok()?;
    let not_after = cert.validity().not_after.timestamp();
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .ok()?
        .as_secs() as i64;
    Some((not_after - now) as f64)
}

impl ReloadingCert {
    /// Loads the pair; fails when the first pair is unusable.
    pub fn load(cert_path: &Path, key_path: &Path) -> Result<Self, TlsError> {
        let source = (read(cert_path)?, read(key_path)?);
        let key = parse(cert_path, key_path, &source.0, &source.1)?;
        Ok(ReloadingCert {
            cert_path: cert_path.to_owned(),
            key_path: key_path.to_owned(),
            current: RwLock::new(Loaded {
                key: Arc::new(key),
                source,
            }),
        })
    }

    pub fn current(&self) -> Arc<CertifiedKey> {
        match self.current.read() {
            Ok(loaded) => loaded.key.clone(),
            Err(poisoned) => poisoned.into_inner().key.clone(),
        }
    }

    /// Re-reads the files; swaps in the new pair if they changed and it is good.
    /// `Ok(true)` when a new pair now serves.
    pub fn reload(&self) -> Result<bool, TlsError> {
        let source = (read(&self.cert_path)?, read(&self.key_path)?);
        let unchanged = self
            .current
            .read()
            .map(|l| l.source == source)
            .unwrap_or(false);
        if unchanged {
            return Ok(false);
        }
        let key = parse(&self.cert_path, &self.key_path, &source.0, &source.1)?;
        if let Ok(mut loaded) = self.current.write() {
            *loaded = Loaded {
                key: Arc::new(key),
                source,
            };
        }
        Ok(true)
    }

    /// Checks the files every `interval` until the process ends.
    pub async fn watch(self: Arc<Self>, interval: Duration, metrics: Arc<Metrics>) {
        loop {
            if let Some(seconds) = seconds_until_expiry(&self.current()) {
                metrics.certificate_expiry_seconds.set(seconds);
            }
            tokio::time::sleep(interval).await;
            match self.reload() {
                Ok(true) => {
                    tracing::info!(cert = %self.cert_path.display(), "serving certificate reloaded")
                }
                Ok(false) => {}
                Err(e) => {
                    metrics.error("certificate_reload");
                    tracing::warn!(error = %e, "new serving certificate rejected; the old one keeps serving");
                }
            }
        }
    }

    /// A rustls server config that serves whatever pair is current: TLS 1.2 and
    /// 1.3, ALPN h2 and http/1.1. With `client_ca`, a client certificate is asked
    /// for, and one that CA did not sign fails the handshake; a client may still
    /// come without one (the kubelet's probes of `/healthz` do), and the handlers
    /// then refuse it the admission paths ([`super::server::Caller`]).
    pub fn server_config(
        self: Arc<Self>,
        client_ca: Option<&Path>,
    ) -> Result<ServerConfig, TlsError> {
        let builder = ServerConfig::builder_with_provider(provider())
            .with_protocol_versions(&[&rustls::version::TLS13, &rustls::version::TLS12])
            .map_err(TlsError::Mismatch)?;
        let builder = match client_ca {
            None => builder.with_no_client_auth(),
            Some(path) => builder.with_client_cert_verifier(client_verifier(path)?),
        };
        let mut config = builder.with_cert_resolver(self);
        config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
        Ok(config)
    }
}

/// A verifier that accepts only client certificates signed by the CA in `path`.
fn client_verifier(
    path: &Path,
) -> Result<Arc<dyn rustls::server::danger::ClientCertVerifier>, TlsError> {
    let problem = |reason: String| TlsError::ClientCa {
        path: path.to_owned(),
        reason,
    };
    let pem = read(path)?;
    let mut roots = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_slice_iter(&pem) {
        let cert = cert.map_err(|e| problem(e.to_string()))?;
        roots.add(cert).map_err(|e| problem(e.to_string()))?;
    }
    if roots.is_empty() {
        return Err(problem("it holds no certificate".into()));
    }
    rustls::server::WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider())
        .allow_unauthenticated()
        .build()
        .map_err(|e| problem(e.to_string()))
}

impl ResolvesServerCert for ReloadingCert {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(self.current())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bad_new_pair_is_rejected_and_the_old_one_keeps_serving() {
        let dir = std::env::temp_dir().join(format!("berth-tls-{}", std::process::id()));
        crate::certs::write_certs("berth", "ns", &dir, 1).unwrap();
        let (cert, key) = (dir.join("tls.crt"), dir.join("tls.key"));
        let reloading = ReloadingCert::load(&cert, &key).unwrap();
        let first = reloading.current();
        assert!(!reloading.reload().unwrap(), "nothing changed");

        std::fs::write(&cert, "-----BEGIN CERTIFICATE-----\nnot base64\n").unwrap();
        assert!(reloading.reload().is_err());
        assert!(
            Arc::ptr_eq(&first, &reloading.current()),
            "the old pair still serves"
        );

        // A new certificate with the old key: a mismatch, also rejected.
        let other = crate::certs::issue(&["x".into()], 1, None).unwrap();
        std::fs::write(&cert, &other.cert_pem).unwrap();
        let error = reloading.reload().unwrap_err();
        assert!(error.to_string().contains("does not fit"), "{error}");

        crate::certs::write_certs("berth", "ns", &dir, 1).unwrap();
        assert!(reloading.reload().unwrap(), "a good new pair is taken");
        assert!(!Arc::ptr_eq(&first, &reloading.current()));
        assert!(seconds_until_expiry(&reloading.current()).unwrap() > 3600.0);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
