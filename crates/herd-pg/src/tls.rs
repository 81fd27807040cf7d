//! TLS from Herd to its PostgreSQL servers (the proxies' pooled and administrative connections,
//! the agents' probes), verified against the cluster's CA.
//!
//! The same [`ClientTls`] serves two drivers: tokio-postgres (through its `MakeTlsConnect`
//! hook, implemented here over tokio-rustls) and the proxy's own wire code, which drives a
//! `rustls::ClientConnection` itself ([`ClientTls::connection`]).

use std::future::Future;
use std::path::Path;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::{DigitallySignedStruct, SignatureScheme};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio_postgres::tls::{ChannelBinding, MakeTlsConnect, TlsConnect};

use crate::PgError;

/// How Herd's own connections to its servers use TLS (`[proxy] server_tls`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TlsMode {
    /// Plain TCP (and Unix sockets), as before the cluster had a CA.
    Off,
    /// TLS, the server's certificate not checked (it encrypts but does not stop an impostor).
    Require,
    /// TLS, the server's certificate of the cluster's CA and naming the address dialled.
    VerifyFull,
}

impl TlsMode {
    /// Parses `off`, `require` or `verify-full`.
    pub fn parse(text: &str) -> Option<TlsMode> {
        match text {
            "off" => Some(TlsMode::Off),
            "require" => Some(TlsMode::Require),
            "verify-full" => Some(TlsMode::VerifyFull),
            _ => None,
        }
    }

    /// The mode for `setting` (`auto`, `off`, `require`, `verify-full`) when the cluster
    /// `has_ca`: `auto` is `verify-full` with a CA, `off` without. `None`: not a mode.
    pub fn resolve(setting: &str, has_ca: bool) -> Option<TlsMode> {
        match setting {
            "auto" | "" if has_ca => Some(TlsMode::VerifyFull),
            "auto" | "" => Some(TlsMode::Off),
            other => TlsMode::parse(other),
        }
    }
}

/// TLS settings for connections to the servers; cheap to clone. With `verify-full` the CA
/// file is looked at (one `stat`) before each connection and read again when it changed, so a
/// CA bundle written by `herd certs rotate --stage` (old CA then new) is trusted by running
/// proxies and agents without a restart; an unreadable new file keeps the CA already loaded.
#[derive(Clone)]
pub struct ClientTls {
    config: Arc<Loaded>,
    /// The name the certificate must carry, when it is not the address dialled (an agent
    /// reaches its own server on a listen address, and the certificate names the advertised one).
    expect: Option<ServerName<'static>>,
    mode: TlsMode,
}

/// The same settings: one loaded configuration, the same expected name and mode.
impl PartialEq for ClientTls {
    fn eq(&self, other: &ClientTls) -> bool {
        Arc::ptr_eq(&self.config, &other.config)
            && self.expect == other.expect
            && self.mode == other.mode
    }
}

impl std::fmt::Debug for ClientTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "ClientTls({:?})", self.mode)
    }
}

impl ClientTls {
    /// TLS for `mode` (`None` for [`TlsMode::Off`]); `verify-full` trusts the CA in `ca_file`
    /// (PEM) only. An unreadable or empty CA file is an error, never a fallback to plain TCP.
    pub fn new(mode: TlsMode, ca_file: &Path) -> Result<Option<ClientTls>, PgError> {
        let Some(config) = build(mode, ca_file)? else {
            return Ok(None);
        };
        let watched = (mode == TlsMode::VerifyFull).then(|| ca_file.to_path_buf());
        Ok(Some(ClientTls {
            config: Arc::new(Loaded {
                current: std::sync::Mutex::new((
                    watched.as_deref().and_then(stamp),
                    Arc::new(config),
                )),
                ca_file: watched,
            }),
            expect: None,
            mode,
        }))
    }

    /// The configuration for the next connection: read again when the CA file changed.
    fn current(&self) -> Arc<rustls::ClientConfig> {
        let loaded = &self.config;
        let mut current = match loaded.current.lock() {
            Ok(g) => g,
            Err(poisoned) => poisoned.into_inner(),
        };
        if let Some(file) = &loaded.ca_file {
            let now = stamp(file);
            if now.is_some() && now != current.0 {
                match build(self.mode, file) {
                    Ok(Some(config)) => *current = (now, Arc::new(config)),
                    Ok(None) => {}
                    Err(e) => {
                        tracing::warn!("{e}; the CA loaded before stays in use");
                        current.0 = now;
                    }
                }
            }
        }
        current.1.clone()
    }
}

/// A loaded configuration and the CA file it came from (`verify-full`).
struct Loaded {
    ca_file: Option<std::path::PathBuf>,
    current: std::sync::Mutex<(Option<Stamp>, Arc<rustls::ClientConfig>)>,
}

/// What tells a changed CA file: its inode (a file replaced by a rename), size and time.
type Stamp = (u64, u64, Option<std::time::SystemTime>);

fn stamp(file: &Path) -> Option<Stamp> {
    use std::os::unix::fs::MetadataExt as _;
    let m = std::fs::metadata(file).ok()?;
    Some((m.ino(), m.len(), m.modified().ok()))
}

/// The rustls configuration for `mode` and the CA in `ca_file` (`None` for `off`).
fn build(mode: TlsMode, ca_file: &Path) -> Result<Option<rustls::ClientConfig>, PgError> {
    {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let builder = rustls::ClientConfig::builder_with_provider(provider.clone())
            .with_safe_default_protocol_versions()
            .map_err(|e| tls_setup(ca_file, e.to_string()))?;
        let config = match mode {
            TlsMode::Off => return Ok(None),
            TlsMode::Require => builder
                .dangerous()
                .with_custom_certificate_verifier(Arc::new(AnyCertificate(provider)))
                .with_no_client_auth(),
            TlsMode::VerifyFull => {
                let pem = std::fs::read(ca_file).map_err(|source| PgError::Io {
                    action: "reading the cluster's CA certificate",
                    path: ca_file.to_path_buf(),
                    source,
                })?;
                let mut roots = rustls::RootCertStore::empty();
                for cert in CertificateDer::pem_slice_iter(&pem) {
                    let cert = cert.map_err(|e| tls_setup(ca_file, e.to_string()))?;
                    roots
                        .add(cert)
                        .map_err(|e| tls_setup(ca_file, e.to_string()))?;
                }
                if roots.is_empty() {
                    return Err(tls_setup(ca_file, "no CERTIFICATE block".into()));
                }
                builder.with_root_certificates(roots).with_no_client_auth()
            }
        };
        Ok(Some(config))
    }
}

impl ClientTls {
    /// The same, checking that the certificate names `name` whatever address is dialled.
    pub fn expecting(&self, name: &str) -> Result<ClientTls, PgError> {
        let expect = ServerName::try_from(name.to_string())
            .map_err(|e| PgError::Tls(format!("{name:?} is not a host name: {e}")))?;
        Ok(ClientTls {
            expect: Some(expect),
            ..self.clone()
        })
    }

    /// The same, checking the certificate against the address dialled (for another server
    /// than the one [`ClientTls::expecting`] named).
    pub fn dialled(&self) -> ClientTls {
        ClientTls {
            expect: None,
            ..self.clone()
        }
    }

    /// The mode these settings implement.
    pub fn mode(&self) -> TlsMode {
        self.mode
    }

    /// A client-side TLS state machine for a connection to `host`, for code that drives the
    /// handshake itself.
    pub fn connection(&self, host: &str) -> Result<rustls::ClientConnection, String> {
        let name = self.server_name(host)?;
        rustls::ClientConnection::new(self.current(), name).map_err(|e| e.to_string())
    }

    fn server_name(&self, host: &str) -> Result<ServerName<'static>, String> {
        match &self.expect {
            Some(name) => Ok(name.clone()),
            None => ServerName::try_from(host.to_string())
                .map_err(|e| format!("{host:?} is not a host name or address: {e}")),
        }
    }
}

fn tls_setup(ca_file: &Path, detail: String) -> PgError {
    PgError::Tls(format!(
        "the cluster's CA certificate {}: {detail}",
        ca_file.display()
    ))
}

/// `require`: any certificate is taken, but the handshake's signatures are still checked (the
/// peer holds the key of the certificate it sent).
#[derive(Debug)]
struct AnyCertificate(Arc<rustls::crypto::CryptoProvider>);

impl ServerCertVerifier for AnyCertificate {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

/// tokio-postgres's hook: `config.connect(tls)` with `sslmode=require` set by the caller, so a
/// server that declines TLS is an error, not a plain connection.
impl MakeTlsConnect<tokio_postgres::Socket> for ClientTls {
    type Stream = PgTlsStream;
    type TlsConnect = Connector;
    type Error = String;

    fn make_tls_connect(&mut self, domain: &str) -> Result<Connector, String> {
        Ok(Connector {
            connector: tokio_rustls::TlsConnector::from(self.current()),
            name: self.server_name(domain)?,
        })
    }
}

/// One handshake over tokio-rustls.
pub struct Connector {
    connector: tokio_rustls::TlsConnector,
    name: ServerName<'static>,
}

impl TlsConnect<tokio_postgres::Socket> for Connector {
    type Stream = PgTlsStream;
    type Error = std::io::Error;
    type Future = Pin<Box<dyn Future<Output = std::io::Result<PgTlsStream>> + Send>>;

    fn connect(self, stream: tokio_postgres::Socket) -> Self::Future {
        Box::pin(async move {
            let tls = self.connector.connect(self.name, stream).await?;
            Ok(PgTlsStream(Box::new(tls)))
        })
    }
}

/// A TLS connection of tokio-postgres's.
pub struct PgTlsStream(Box<tokio_rustls::client::TlsStream<tokio_postgres::Socket>>);

impl tokio_postgres::tls::TlsStream for PgTlsStream {
    fn channel_binding(&self) -> ChannelBinding {
        // SCRAM without channel binding, as the servers' pg_hba asks (scram-sha-256).
        ChannelBinding::none()
    }
}

impl AsyncRead for PgTlsStream {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        Pin::new(&mut *self.0).poll_read(cx, buf)
    }
}

impl AsyncWrite for PgTlsStream {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut *self.0).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut *self.0).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut *self.0).poll_shutdown(cx)
    }
}

/// Connects with `config` over `tls` when given (`sslmode=require`: never plain), else plain;
/// the connection runs on its own task until the client is dropped or the server goes away.
pub async fn connect_config(
    config: &mut tokio_postgres::Config,
    tls: Option<&ClientTls>,
) -> Result<tokio_postgres::Client, tokio_postgres::Error> {
    match tls {
        Some(tls) => {
            config.ssl_mode(tokio_postgres::config::SslMode::Require);
            let (client, conn) = config.connect(tls.clone()).await?;
            tokio::spawn(async move {
                let _ = conn.await;
            });
            Ok(client)
        }
        None => {
            let (client, conn) = config.connect(tokio_postgres::NoTls).await?;
            tokio::spawn(async move {
                let _ = conn.await;
            });
            Ok(client)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_changed_ca_file_is_read_again_before_the_next_connection() {
        let dir = tempfile::tempdir().expect("dir");
        let ca = dir.path().join("ca.crt");
        let old = herd_certs::ClusterCa::generate("t").expect("CA");
        let next = herd_certs::ClusterCa::generate("t").expect("CA");
        std::fs::write(&ca, &old.cert_pem).expect("ca");
        let tls = ClientTls::new(TlsMode::VerifyFull, &ca)
            .expect("CA")
            .expect("verify-full");
        let first = tls.current();
        assert!(Arc::ptr_eq(&first, &tls.current()), "unchanged: kept");
        // The bundle `herd certs rotate --stage` writes, through a rename.
        let tmp = dir.path().join("ca.tmp");
        std::fs::write(&tmp, format!("{}{}", old.cert_pem, next.cert_pem)).expect("bundle");
        std::fs::rename(&tmp, &ca).expect("rename");
        let second = tls.current();
        assert!(!Arc::ptr_eq(&first, &second), "the bundle was not read");
        // A clone shares the reload (the proxy's and agents' copies).
        assert!(Arc::ptr_eq(&second, &tls.clone().current()));
        // A broken file keeps the CA loaded before.
        std::fs::write(&ca, "not a certificate").expect("garbage");
        assert!(Arc::ptr_eq(&second, &tls.current()));
    }

    #[test]
    fn modes_resolve_by_the_ca() {
        let cases = [
            ("auto", true, Some(TlsMode::VerifyFull)),
            ("auto", false, Some(TlsMode::Off)),
            ("", true, Some(TlsMode::VerifyFull)),
            ("off", true, Some(TlsMode::Off)),
            ("require", false, Some(TlsMode::Require)),
            ("verify-full", false, Some(TlsMode::VerifyFull)),
            ("verify-ca", true, None),
        ];
        for (setting, has_ca, want) in cases {
            assert_eq!(
                TlsMode::resolve(setting, has_ca),
                want,
                "{setting} {has_ca}"
            );
        }
    }

    #[test]
    fn a_missing_or_empty_ca_is_an_error() {
        let dir = tempfile::tempdir().expect("tempdir");
        let ca = dir.path().join("ca.crt");
        let e = ClientTls::new(TlsMode::VerifyFull, &ca).expect_err("no file");
        assert!(e.to_string().contains("ca.crt"), "{e}");
        std::fs::write(&ca, "nothing").expect("write");
        let e = ClientTls::new(TlsMode::VerifyFull, &ca).expect_err("no PEM");
        assert!(e.to_string().contains("no CERTIFICATE"), "{e}");
        assert!(ClientTls::new(TlsMode::Off, &ca).expect("off").is_none());
        let any = ClientTls::new(TlsMode::Require, &ca)
            .expect("require needs no CA")
            .expect("some");
        assert_eq!(any.mode(), TlsMode::Require);
        assert!(any.connection("10.0.0.1").is_ok());
        assert!(any.connection("not a name!").is_err());
    }
}
