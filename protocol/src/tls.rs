//! TLS to the broker and the database, shared by the worker SDK and the scheduler (feature `amqp`).
//!
//! **RabbitMQ.** An `amqps://` URL always connects over TLS (rustls), verifying the broker's
//! certificate and host name against the system's roots plus [`AmqpTls::ca_file`]; a
//! connection is never downgraded to plaintext, so `amqps://` against a plaintext port fails.
//! With [`AmqpTls::cert_file`] and [`AmqpTls::key_file`] the client presents a certificate (for
//! brokers set to `verify_peer` with `fail_if_no_peer_cert`). TLS options with an `amqp://`
//! URL are a mistake, reported rather than ignored. Every connection goes through [`connect`],
//! which reads the files again, so renewed certificates are picked up at the next reconnect.
//!
//! **PostgreSQL.** libpq's URL parameters, which sqlx reads: `sslmode=verify-full` (TLS, the
//! server's certificate chains to `sslrootcert` and names the URL's host), `sslrootcert=`,
//! `sslcert=` and `sslkey=` (client certificate). [`check_database_url`] reads the files those
//! parameters name, so that a missing or invalid one is reported when the settings are loaded
//! or the worker is built, naming the parameter, not at the first connection.

use std::fmt;
use std::io;
use std::path::{Path, PathBuf};

use lapin::tcp::{OwnedIdentity, OwnedTLSConfig};
use lapin::{Connection, ConnectionProperties};
use rustls::pki_types::pem::PemObject as _;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};

use crate::redact::redact_url;

/// Largest certificate or key file read, 1 MiB: a PEM bundle of every public root CA is about
/// 250 KiB; anything larger is not a certificate file.
pub const MAX_PEM_FILE_BYTES: u64 = 1024 * 1024;

/// TLS options of the broker connection: what an `amqps://` connection trusts beyond the
/// system's roots, and the client certificate it presents. All paths are PEM files.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct AmqpTls {
    /// CA certificates (PEM) trusted for the broker's certificate, in addition to the system's.
    pub ca_file: Option<PathBuf>,
    /// Client certificate chain (PEM), presented to the broker; needs `key_file`.
    pub cert_file: Option<PathBuf>,
    /// The client certificate's private key (PEM, PKCS#8, PKCS#1 or SEC1, unencrypted).
    pub key_file: Option<PathBuf>,
}

impl fmt::Debug for AmqpTls {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AmqpTls")
            .field("ca_file", &self.ca_file)
            .field("cert_file", &self.cert_file)
            .field("key_file", &self.key_file)
            .finish()
    }
}

/// Why TLS options cannot be used. Each message names the setting, the value and the fix.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TlsError {
    /// A certificate or key file cannot be read.
    #[error("{setting} = {path:?}: {}", self.problem())]
    Read {
        /// The setting, such as `amqp_tls.ca_file` or `database_url sslrootcert`.
        setting: String,
        /// The path as given.
        path: PathBuf,
        /// Why it cannot be read.
        #[source]
        source: io::Error,
    },
    /// A file holds no usable certificate or key.
    #[error("{setting} = {path:?}: {}", self.problem())]
    Invalid {
        /// The setting.
        setting: String,
        /// The path as given.
        path: PathBuf,
        /// What is wrong with its content.
        problem: String,
        /// What to give instead.
        fix: &'static str,
    },
    /// A client certificate without its key, or the other way round.
    #[error("{given} {}", self.problem())]
    Incomplete {
        /// The one that is set.
        given: String,
        /// The one that is missing.
        missing: String,
    },
    /// TLS options with a URL that does not use TLS.
    #[error("{}", self.problem())]
    NotAmqps {
        /// The URL, password hidden.
        url: String,
    },
}

impl TlsError {
    /// The setting the mistake is about (`amqp_tls.ca_file`, `database_url sslrootcert`, …).
    pub fn setting(&self) -> &str {
        match self {
            TlsError::Read { setting, .. } | TlsError::Invalid { setting, .. } => setting,
            TlsError::Incomplete { given, .. } => given,
            TlsError::NotAmqps { .. } => "amqp_url",
        }
    }

    /// What is wrong and how to fix it, without the setting and value the message starts with,
    /// for callers that name those themselves.
    pub fn problem(&self) -> String {
        match self {
            TlsError::Read { source, .. } => {
                format!("cannot read the file ({source}); give the path of a readable PEM file")
            }
            TlsError::Invalid { problem, fix, .. } => format!("{problem}; {fix}"),
            TlsError::Incomplete { given, missing } => format!(
                "is set without {missing}: a client certificate needs both its certificate and \
                 its key; set {missing}, or remove {given}"
            ),
            TlsError::NotAmqps { url } => format!(
                "amqp_tls is set but amqp_url {url} does not use TLS; write it as amqps:// \
                 (RabbitMQ's TLS listener is usually on port 5671), or remove amqp_tls"
            ),
        }
    }
}

impl AmqpTls {
    /// No options: `amqps://` trusts the system's roots and presents no certificate.
    pub fn new() -> AmqpTls {
        AmqpTls::default()
    }

    /// Trusts the CA certificates in `path` (PEM) for the broker's certificate.
    #[must_use]
    pub fn ca_file(mut self, path: impl Into<PathBuf>) -> AmqpTls {
        self.ca_file = Some(path.into());
        self
    }

    /// Presents the certificate chain in `cert` with the private key in `key` (both PEM).
    #[must_use]
    pub fn client_cert(mut self, cert: impl Into<PathBuf>, key: impl Into<PathBuf>) -> AmqpTls {
        self.cert_file = Some(cert.into());
        self.key_file = Some(key.into());
        self
    }

    /// Whether any option is set.
    pub fn is_set(&self) -> bool {
        self.ca_file.is_some() || self.cert_file.is_some() || self.key_file.is_some()
    }

    /// Checks the options against `url` and reads every file they name: what settings and
    /// `WorkerBuilder::build` (chime-worker) call, so mistakes show before any connection.
    pub fn check(&self, url: &str) -> Result<(), TlsError> {
        self.check_scheme(url)?;
        self.load().map(drop)
    }

    fn check_scheme(&self, url: &str) -> Result<(), TlsError> {
        if self.is_set() && !is_amqps(url) {
            return Err(TlsError::NotAmqps {
                url: redact_url(url),
            });
        }
        Ok(())
    }

    /// The options as lapin takes them, with every file read and checked.
    pub fn load(&self) -> Result<OwnedTLSConfig, TlsError> {
        let mut config = OwnedTLSConfig::default();
        if let Some(path) = &self.ca_file {
            let pem = read_pem("amqp_tls.ca_file", path)?;
            check_roots("amqp_tls.ca_file", path, &pem)?;
            config.cert_chain = Some(String::from_utf8_lossy(&pem).into_owned());
        }
        match (&self.cert_file, &self.key_file) {
            (None, None) => {}
            (Some(_), None) => return Err(incomplete("amqp_tls.cert_file", "amqp_tls.key_file")),
            (None, Some(_)) => return Err(incomplete("amqp_tls.key_file", "amqp_tls.cert_file")),
            (Some(cert), Some(key)) => {
                let pem = read_pem("amqp_tls.cert_file", cert)?;
                let key_pem = read_pem("amqp_tls.key_file", key)?;
                check_identity(
                    ("amqp_tls.cert_file", cert, &pem),
                    ("amqp_tls.key_file", key, &key_pem),
                )?;
                config.identity = Some(OwnedIdentity::PKCS8 { pem, key: key_pem });
            }
        }
        Ok(config)
    }
}

/// Opens a connection to the broker at `url` with the TLS options `tls` (read again now). An
/// `amqps://` URL connects over TLS or not at all. Errors never show the URL's password.
pub async fn connect(
    url: &str,
    tls: &AmqpTls,
    properties: ConnectionProperties,
) -> Result<Connection, lapin::Error> {
    let config = tls
        .check_scheme(url)
        .and_then(|()| tls.load())
        .map_err(|e| lapin::Error::from(io::Error::other(e)))?;
    let runtime = lapin::runtime::default_runtime()?;
    Connection::connect_with_config(url, properties, config, runtime)
        .await
        .map_err(|e| explain(url, e))
}

/// lapin's error, with a hint when a TLS handshake failed (usually: a plaintext port).
fn explain(url: &str, error: lapin::Error) -> lapin::Error {
    match error.kind() {
        lapin::ErrorKind::IOError(io) if is_amqps(url) && is_tls_failure(io) => {
            lapin::Error::from(io::Error::new(
                io.kind(),
                format!(
                    "TLS handshake with {} failed: {io}; check that the port is the broker's \
                     TLS listener (usually 5671, not 5672) and that amqp_tls.ca_file holds the \
                     CA that signed its certificate",
                    redact_url(url)
                ),
            ))
        }
        _ => error,
    }
}

fn is_tls_failure(error: &io::Error) -> bool {
    // rustls reports handshake failures as InvalidData; a peer that hangs up during the
    // handshake (a plaintext listener rejecting the ClientHello) as an unexpected EOF or reset.
    matches!(
        error.kind(),
        io::ErrorKind::InvalidData
            | io::ErrorKind::UnexpectedEof
            | io::ErrorKind::ConnectionReset
            | io::ErrorKind::ConnectionAborted
    )
}

fn is_amqps(url: &str) -> bool {
    url.trim_start()
        .get(..8)
        .is_some_and(|scheme| scheme.eq_ignore_ascii_case("amqps://"))
}

/// Checks the files a PostgreSQL URL's `sslrootcert`, `sslcert` and `sslkey` parameters name.
pub fn check_database_url(url: &str) -> Result<(), TlsError> {
    let Some((_, query)) = url.split_once('?') else {
        return Ok(());
    };
    let query = query.split('#').next().unwrap_or_default();
    let mut root = None;
    let mut cert = None;
    let mut key = None;
    for param in query.split('&') {
        let Some((name, value)) = param.split_once('=') else {
            continue;
        };
        let value = percent_decode(value);
        match name {
            "sslrootcert" if value != "system" => root = Some(PathBuf::from(value)),
            "sslcert" => cert = Some(PathBuf::from(value)),
            "sslkey" => key = Some(PathBuf::from(value)),
            _ => {}
        }
    }
    if let Some(path) = &root {
        let pem = read_pem("database_url sslrootcert", path)?;
        check_roots("database_url sslrootcert", path, &pem)?;
    }
    match (&cert, &key) {
        (None, None) => Ok(()),
        (Some(_), None) => Err(incomplete("database_url sslcert", "database_url sslkey")),
        (None, Some(_)) => Err(incomplete("database_url sslkey", "database_url sslcert")),
        (Some(cert), Some(key)) => {
            let pem = read_pem("database_url sslcert", cert)?;
            let key_pem = read_pem("database_url sslkey", key)?;
            check_identity(
                ("database_url sslcert", cert, &pem),
                ("database_url sslkey", key, &key_pem),
            )
        }
    }
}

fn incomplete(given: &str, missing: &str) -> TlsError {
    TlsError::Incomplete {
        given: given.to_owned(),
        missing: missing.to_owned(),
    }
}

fn invalid(setting: &str, path: &Path, problem: impl Into<String>, fix: &'static str) -> TlsError {
    TlsError::Invalid {
        setting: setting.to_owned(),
        path: path.to_owned(),
        problem: problem.into(),
        fix,
    }
}

const CERT_FIX: &str = "give a PEM file of certificates (-----BEGIN CERTIFICATE-----)";
const KEY_FIX: &str = "give the certificate's private key as an unencrypted PEM file \
                       (-----BEGIN PRIVATE KEY-----)";

/// The file's bytes, at most [`MAX_PEM_FILE_BYTES`].
fn read_pem(setting: &str, path: &Path) -> Result<Vec<u8>, TlsError> {
    let read_error = |source| TlsError::Read {
        setting: setting.to_owned(),
        path: path.to_owned(),
        source,
    };
    let size = std::fs::metadata(path).map_err(read_error)?.len();
    if size > MAX_PEM_FILE_BYTES {
        return Err(invalid(
            setting,
            path,
            format!("{size} bytes, more than the {MAX_PEM_FILE_BYTES} a certificate file may have"),
            CERT_FIX,
        ));
    }
    std::fs::read(path).map_err(read_error)
}

fn certificates(
    setting: &str,
    path: &Path,
    pem: &[u8],
) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let certs = CertificateDer::pem_slice_iter(pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| invalid(setting, path, format!("not PEM ({e})"), CERT_FIX))?;
    if certs.is_empty() {
        return Err(invalid(setting, path, "holds no certificate", CERT_FIX));
    }
    Ok(certs)
}

/// Every certificate in `pem` must be usable as a trust anchor.
fn check_roots(setting: &str, path: &Path, pem: &[u8]) -> Result<(), TlsError> {
    let mut roots = rustls::RootCertStore::empty();
    for (n, cert) in certificates(setting, path, pem)?.into_iter().enumerate() {
        roots.add(cert).map_err(|e| {
            invalid(
                setting,
                path,
                format!("certificate {} is not a valid CA certificate ({e})", n + 1),
                CERT_FIX,
            )
        })?;
    }
    Ok(())
}

/// The certificate chain and the key must parse, and the key must be the certificate's.
fn check_identity(
    (cert_setting, cert_path, cert_pem): (&str, &Path, &[u8]),
    (key_setting, key_path, key_pem): (&str, &Path, &[u8]),
) -> Result<(), TlsError> {
    let certs = certificates(cert_setting, cert_path, cert_pem)?;
    let key = PrivateKeyDer::from_pem_slice(key_pem).map_err(|e| {
        invalid(
            key_setting,
            key_path,
            format!("no private key ({e})"),
            KEY_FIX,
        )
    })?;
    let provider = rustls::crypto::aws_lc_rs::default_provider();
    rustls::sign::CertifiedKey::from_der(certs, key, &provider).map_err(|e| {
        invalid(
            key_setting,
            key_path,
            format!("not the key of the certificate in {cert_setting} ({e})"),
            KEY_FIX,
        )
    })?;
    Ok(())
}

/// `%2F` → `/`; invalid escapes are kept as written.
fn percent_decode(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = |b: u8| (b as char).to_digit(16);
        if bytes[i] == b'%'
            && let (Some(hi), Some(lo)) = (
                bytes.get(i + 1).copied().and_then(hex),
                bytes.get(i + 2).copied().and_then(hex),
            )
        {
            out.push((hi * 16 + lo) as u8);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn options_with_a_plain_url_are_refused() {
        let tls = AmqpTls::new().ca_file("/nonexistent/ca.pem");
        let error = tls
            .check("amqp://u:secret@mq:5672/%2f")
            .unwrap_err()
            .to_string();
        assert!(error.contains("write it as amqps://"), "{error}");
        assert!(!error.contains("secret"), "{error}");
        // No options: nothing to check, whatever the scheme.
        AmqpTls::new().check("amqp://mq").unwrap();
    }

    #[test]
    fn missing_and_invalid_files_name_the_setting() {
        let dir = std::env::temp_dir().join(format!("chime-tls-unit-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let garbage = dir.join("garbage.pem");
        std::fs::write(&garbage, "not a certificate\n").unwrap();

        let missing = AmqpTls::new().ca_file(dir.join("missing.pem"));
        let error = missing.check("amqps://mq").unwrap_err().to_string();
        assert!(error.starts_with("amqp_tls.ca_file = "), "{error}");
        assert!(error.contains("cannot read the file"), "{error}");

        let error = AmqpTls::new()
            .ca_file(&garbage)
            .check("amqps://mq")
            .unwrap_err()
            .to_string();
        assert!(error.contains("holds no certificate"), "{error}");
        assert!(error.contains("BEGIN CERTIFICATE"), "{error}");

        let half = AmqpTls {
            cert_file: Some(garbage.clone()),
            ..AmqpTls::default()
        };
        let error = half.check("amqps://mq").unwrap_err().to_string();
        assert!(
            error.starts_with("amqp_tls.cert_file is set without amqp_tls.key_file"),
            "{error}"
        );

        let url = format!(
            "postgres://u:secret@db/chime?sslmode=verify-full&sslrootcert={}",
            garbage.display()
        );
        let error = check_database_url(&url).unwrap_err().to_string();
        assert!(error.starts_with("database_url sslrootcert = "), "{error}");
        assert!(!error.contains("secret"), "{error}");
        check_database_url("postgres://db/chime?sslmode=require").unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn percent_escapes_in_paths_are_decoded() {
        assert_eq!(percent_decode("%2Fetc%2fca.pem"), "/etc/ca.pem");
        assert_eq!(percent_decode("100%"), "100%");
        assert_eq!(percent_decode("%zz"), "%zz");
    }
}
