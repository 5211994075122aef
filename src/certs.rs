//! `berth certs`: a CA and a serving certificate for the webhook, made with rcgen.
//!
//! The apiserver trusts the webhook through the caBundle in the webhook
//! configurations, so the CA is kept: run again with the same `--out` and only the
//! serving certificate is renewed, signed by the same CA, and the running webhook
//! picks it up without a restart and without re-registering anything.

use std::net::{IpAddr, Ipv4Addr};
use std::path::{Path, PathBuf};

use base64::Engine;
use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa,
    Issuer, KeyPair, KeyUsagePurpose, SanType,
};

/// Why certificates could not be made or written.
#[derive(Debug, thiserror::Error)]
pub enum CertsError {
    #[error("making the certificate failed: {0}")]
    Generate(#[from] rcgen::Error),
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
}

/// What `berth certs` writes.
#[derive(Debug, Clone)]
pub struct Issued {
    pub ca_pem: String,
    pub ca_key_pem: String,
    pub cert_pem: String,
    pub key_pem: String,
    /// Whether an existing CA was reused.
    pub reused_ca: bool,
}

/// The DNS names a Service `service` in `namespace` is reached by.
pub fn service_names(service: &str, namespace: &str) -> Vec<String> {
    vec![
        format!("{service}.{namespace}.svc"),
        format!("{service}.{namespace}.svc.cluster.local"),
        format!("{service}.{namespace}"),
        service.to_owned(),
    ]
}

fn new_ca() -> Result<(CertificateParams, KeyPair), rcgen::Error> {
    let mut params = CertificateParams::default();
    let mut name = DistinguishedName::new();
    name.push(DnType::CommonName, "berth webhook CA");
    params.distinguished_name = name;
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
    params.not_before = an_hour_ago();
    params.not_after = time_in_days(3650);
    Ok((params, KeyPair::generate()?))
}

fn time_in_days(days: i64) -> time::OffsetDateTime {
    time::OffsetDateTime::now_utc() + time::Duration::days(days)
}

/// Valid from an hour ago, so a peer whose clock runs a little behind accepts it.
fn an_hour_ago() -> time::OffsetDateTime {
    time::OffsetDateTime::now_utc() - time::Duration::hours(1)
}

/// Issues a serving certificate for `dns_names` and 127.0.0.1, with a new CA or
/// the one given as (certificate PEM, key PEM).
pub fn issue(
    dns_names: &[String],
    days: i64,
    existing_ca: Option<(&str, &str)>,
) -> Result<Issued, CertsError> {
    let (ca_pem, ca_key, reused_ca) = match existing_ca {
        Some((cert, key)) => (cert.to_owned(), KeyPair::from_pem(key)?, true),
        None => {
            let (params, key) = new_ca()?;
            (params.self_signed(&key)?.pem(), key, false)
        }
    };
    let issuer = Issuer::from_ca_cert_pem(&ca_pem, &ca_key)?;

    let mut params = CertificateParams::new(dns_names.to_vec())?;
    params
        .subject_alt_names
        .push(SanType::IpAddress(IpAddr::V4(Ipv4Addr::LOCALHOST)));
    let mut name = DistinguishedName::new();
    name.push(
        DnType::CommonName,
        dns_names.first().cloned().unwrap_or_default(),
    );
    params.distinguished_name = name;
    params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    params.key_usages = vec![
        KeyUsagePurpose::DigitalSignature,
        KeyUsagePurpose::KeyEncipherment,
    ];
    params.not_before = an_hour_ago();
    params.not_after = time_in_days(days);
    let key = KeyPair::generate()?;
    let cert = params.signed_by(&key, &issuer)?;
    Ok(Issued {
        ca_pem,
        ca_key_pem: ca_key.serialize_pem(),
        cert_pem: cert.pem(),
        key_pem: key.serialize_pem(),
        reused_ca,
    })
}

/// A client certificate for the apiserver to present to berth's webhook
/// (`berth serve --client-ca ca.crt`), signed by the CA of `issued`: its PEM and
/// its key's.
pub fn issue_apiserver_client(issued: &Issued, days: i64) -> Result<(String, String), CertsError> {
    let ca_key = KeyPair::from_pem(&issued.ca_key_pem)?;
    let issuer = Issuer::from_ca_cert_pem(&issued.ca_pem, &ca_key)?;
    let mut params = CertificateParams::new(Vec::new())?;
    let mut name = DistinguishedName::new();
    name.push(DnType::CommonName, APISERVER_CLIENT_NAME);
    params.distinguished_name = name;
    params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
    params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
    params.not_before = an_hour_ago();
    params.not_after = time_in_days(days);
    let key = KeyPair::generate()?;
    let cert = params.signed_by(&key, &issuer)?;
    Ok((cert.pem(), key.serialize_pem()))
}

/// The common name of the apiserver's client certificate.
const APISERVER_CLIENT_NAME: &str = "kube-apiserver-berth-client";

fn write(path: PathBuf, contents: &str, private: bool) -> Result<(), CertsError> {
    let io = |source| CertsError::Io {
        path: path.clone(),
        source,
    };
    // Write beside and rename, so a reader never sees half a file.
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, contents).map_err(io)?;
    if private {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(0o600)).map_err(io)?;
    }
    std::fs::rename(&tmp, &path).map_err(io)
}

/// `berth certs`: writes `ca.crt`, `ca.key`, `tls.crt`, `tls.key`, `caBundle`
/// (the base64 CA for webhook configurations) and `apiserver-client.crt` and
/// `.key` (for the apiserver to present, where berth runs with `--client-ca`) into
/// `out`, reusing a CA found there.
pub fn write_certs(
    service: &str,
    namespace: &str,
    out: &Path,
    days: i64,
) -> Result<Issued, CertsError> {
    std::fs::create_dir_all(out).map_err(|source| CertsError::Io {
        path: out.to_owned(),
        source,
    })?;
    let ca_cert = std::fs::read_to_string(out.join("ca.crt")).ok();
    let ca_key = std::fs::read_to_string(out.join("ca.key")).ok();
    let existing = ca_cert.as_deref().zip(ca_key.as_deref());
    let issued = issue(&service_names(service, namespace), days, existing)?;
    write(out.join("ca.crt"), &issued.ca_pem, false)?;
    write(out.join("ca.key"), &issued.ca_key_pem, true)?;
    // The key first: until the certificate is renamed in, the old pair still matches.
    write(out.join("tls.key"), &issued.key_pem, true)?;
    write(out.join("tls.crt"), &issued.cert_pem, false)?;
    let bundle = base64::engine::general_purpose::STANDARD.encode(&issued.ca_pem);
    write(out.join("caBundle"), &bundle, false)?;
    let (client_cert, client_key) = issue_apiserver_client(&issued, days)?;
    write(out.join("apiserver-client.key"), &client_key, true)?;
    write(out.join("apiserver-client.crt"), &client_cert, false)?;
    Ok(issued)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_second_run_renews_the_serving_certificate_with_the_same_ca() {
        let dir = std::env::temp_dir().join(format!("berth-certs-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let first = write_certs("berth", "berth-system", &dir, 30).unwrap();
        assert!(!first.reused_ca);
        let second = write_certs("berth", "berth-system", &dir, 30).unwrap();
        assert!(second.reused_ca);
        assert_eq!(first.ca_pem, second.ca_pem);
        assert_ne!(first.cert_pem, second.cert_pem);
        let bundle = std::fs::read_to_string(dir.join("caBundle")).unwrap();
        let decoded = base64::engine::general_purpose::STANDARD
            .decode(bundle)
            .unwrap();
        assert_eq!(decoded, first.ca_pem.as_bytes());
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn the_serving_certificate_names_the_service_and_loopback() {
        let issued = issue(&service_names("berth", "berth-system"), 30, None).unwrap();
        let der = rustls::pki_types::pem::PemObject::from_pem_slice(issued.cert_pem.as_bytes())
            .map(|d: rustls::pki_types::CertificateDer| d.to_vec())
            .unwrap();
        let (_, cert) = x509_parser::parse_x509_certificate(&der).unwrap();
        let sans = cert.subject_alternative_name().unwrap().unwrap().value;
        let text = format!("{:?}", sans.general_names);
        for name in [
            "berth.berth-system.svc",
            "berth.berth-system.svc.cluster.local",
        ] {
            assert!(text.contains(name), "{text}");
        }
        assert!(
            text.contains("127.0.0.1") || text.contains("[127, 0, 0, 1]"),
            "{text}"
        );
    }
}
