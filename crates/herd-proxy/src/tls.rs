//! TLS for the endpoint's clients: the certificate and key loaded from files, checked the way
//! PostgreSQL checks its own (`ssl_cert_file`, `ssl_key_file`), and the policy for clients that
//! do not ask for it.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};

/// Why the endpoint's TLS could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    /// A file could not be read.
    #[error("cannot read the TLS {what} {path}: {source}")]
    Read {
        /// "certificate" or "private key".
        what: &'static str,
        /// The file.
        path: PathBuf,
        /// The cause.
        source: std::io::Error,
    },
    /// A file holds no usable PEM object.
    #[error("the TLS {what} {path} holds no {expected} in PEM form ({detail})")]
    Pem {
        /// "certificate" or "private key".
        what: &'static str,
        /// The file.
        path: PathBuf,
        /// What was looked for.
        expected: &'static str,
        /// The parser's word.
        detail: String,
    },
    /// The key file may be read by others.
    #[error(
        "the TLS private key {0} has group or world access; run `chmod 600 {0}` (it must be \
         readable by its owner only)"
    )]
    KeyAccess(PathBuf),
    /// The certificate and key do not go together, or rustls refused them.
    #[error("the TLS certificate {cert} and key {key} cannot be used: {detail}")]
    Rejected {
        /// The certificate file.
        cert: PathBuf,
        /// The key file.
        key: PathBuf,
        /// rustls's reason.
        detail: String,
    },
}

/// The endpoint's TLS settings, ready for handshakes.
#[derive(Clone)]
pub struct ServerTls {
    /// What rustls serves.
    pub config: Arc<rustls::ServerConfig>,
    /// Clients that do not ask for TLS are refused (SQLSTATE 28000), as `hostssl` lines do.
    pub required: bool,
}

impl std::fmt::Debug for ServerTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServerTls")
            .field("required", &self.required)
            .finish_non_exhaustive()
    }
}

impl ServerTls {
    /// Loads a PEM certificate chain (leaf first) and its private key (PKCS#8, PKCS#1 or SEC1).
    pub fn load(cert: &Path, key: &Path, required: bool) -> Result<ServerTls, TlsError> {
        let chain = read_chain(cert)?;
        let private = read_key(key)?;
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let rejected = |e: rustls::Error| TlsError::Rejected {
            cert: cert.to_path_buf(),
            key: key.to_path_buf(),
            detail: e.to_string(),
        };
        let mut config = rustls::ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(rejected)?
            .with_no_client_auth()
            .with_single_cert(chain, private)
            .map_err(rejected)?;
        // libpq does not send ALPN before PostgreSQL 17; none is required.
        config.alpn_protocols.clear();
        Ok(ServerTls {
            config: Arc::new(config),
            required,
        })
    }
}

fn read_chain(path: &Path) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let bytes = std::fs::read(path).map_err(|source| TlsError::Read {
        what: "certificate",
        path: path.to_path_buf(),
        source,
    })?;
    let chain: Result<Vec<_>, _> = CertificateDer::pem_slice_iter(&bytes).collect();
    let pem = |detail: String| TlsError::Pem {
        what: "certificate",
        path: path.to_path_buf(),
        expected: "CERTIFICATE",
        detail,
    };
    let chain = chain.map_err(|e| pem(e.to_string()))?;
    if chain.is_empty() {
        return Err(pem("no BEGIN CERTIFICATE block".into()));
    }
    Ok(chain)
}

fn read_key(path: &Path) -> Result<PrivateKeyDer<'static>, TlsError> {
    let meta = std::fs::metadata(path).map_err(|source| TlsError::Read {
        what: "private key",
        path: path.to_path_buf(),
        source,
    })?;
    if group_or_world_access(&meta) {
        return Err(TlsError::KeyAccess(path.to_path_buf()));
    }
    let bytes = std::fs::read(path).map_err(|source| TlsError::Read {
        what: "private key",
        path: path.to_path_buf(),
        source,
    })?;
    PrivateKeyDer::from_pem_slice(&bytes).map_err(|e| TlsError::Pem {
        what: "private key",
        path: path.to_path_buf(),
        expected: "PRIVATE KEY",
        detail: e.to_string(),
    })
}

/// PostgreSQL refuses a key others can read (it allows group read only for root-owned keys,
/// a packaging convention Herd has no need for).
fn group_or_world_access(meta: &std::fs::Metadata) -> bool {
    use std::os::unix::fs::PermissionsExt;
    meta.permissions().mode() & 0o077 != 0
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn missing_files_are_named() {
        let dir = tempfile::tempdir().expect("tempdir");
        let cert = dir.path().join("server.crt");
        let key = dir.path().join("server.key");
        let e = ServerTls::load(&cert, &key, false).expect_err("no files");
        assert!(e.to_string().contains("server.crt"), "{e}");
    }

    #[test]
    fn a_readable_key_is_refused_before_it_is_read() {
        let dir = tempfile::tempdir().expect("tempdir");
        let key = dir.path().join("server.key");
        std::fs::write(&key, "not a key").expect("write");
        std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o644)).expect("chmod");
        assert!(matches!(read_key(&key), Err(TlsError::KeyAccess(_))));
        std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o600)).expect("chmod");
        assert!(matches!(read_key(&key), Err(TlsError::Pem { .. })));
    }

    #[test]
    fn garbage_is_not_a_certificate() {
        let dir = tempfile::tempdir().expect("tempdir");
        let cert = dir.path().join("server.crt");
        std::fs::write(&cert, "hello").expect("write");
        assert!(matches!(read_chain(&cert), Err(TlsError::Pem { .. })));
    }
}
