//! The endpoint's client TLS from the `[proxy]` settings (and `herd proxy`'s flags).

use std::path::Path;

use anyhow::Context;
use herd_config::ProxyConfig;
use herd_proxy::tls::ServerTls;

/// Loads the certificate and key named by `proxy` (relative paths from `base`, the directory of
/// the herd.toml that named them); `None` when TLS is not configured.
pub fn load(proxy: &ProxyConfig, base: &Path) -> anyhow::Result<Option<ServerTls>> {
    if proxy.tls_cert_file.is_empty() && proxy.tls_key_file.is_empty() {
        if proxy.tls_required {
            anyhow::bail!("TLS is required for clients but no certificate is configured: set proxy.tls_cert_file and proxy.tls_key_file (or --tls-cert and --tls-key)");
        }
        return Ok(None);
    }
    if proxy.tls_cert_file.is_empty() || proxy.tls_key_file.is_empty() {
        anyhow::bail!("TLS for clients needs both a certificate and its key (proxy.tls_cert_file and proxy.tls_key_file, or --tls-cert and --tls-key)");
    }
    let cert = base.join(&proxy.tls_cert_file);
    let key = base.join(&proxy.tls_key_file);
    let tls = ServerTls::load(&cert, &key, proxy.tls_required)
        .context("setting up TLS for the endpoint's clients")?;
    Ok(Some(tls))
}
