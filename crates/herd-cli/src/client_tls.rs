//! The endpoint's client TLS from the `[proxy]` settings (and `herd proxy`'s flags), and the
//! proxy's TLS to the servers (`proxy.server_tls`).

use std::path::Path;

use anyhow::Context;
use herd_config::ProxyConfig;
use herd_pg::{ClientTls, TlsMode};
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

/// TLS from the proxy to the servers: `proxy.server_tls` resolved against the cluster's CA in
/// `secrets` (`auto`: verify-full when `ca.crt` is there, plain without). `verify-full`
/// without the CA is an error, not a quiet downgrade.
pub fn to_servers(proxy: &ProxyConfig, secrets: &Path) -> anyhow::Result<Option<ClientTls>> {
    let ca = secrets.join(herd_certs::CA_CERT);
    let has_ca = ca.exists();
    let Some(mode) = TlsMode::resolve(&proxy.server_tls, has_ca) else {
        anyhow::bail!(
            "proxy.server_tls = {:?}: expected auto, off, require or verify-full",
            proxy.server_tls
        );
    };
    if mode == TlsMode::VerifyFull && !has_ca {
        anyhow::bail!(
            "proxy.server_tls = verify-full needs the cluster's CA, and {} is missing: copy the \
             secrets directory from an agent's host (or `herd certs init` before the first agent \
             starts), or set proxy.server_tls = \"off\"",
            ca.display()
        );
    }
    ClientTls::new(mode, &ca).context("setting up TLS to the servers (proxy.server_tls)")
}

/// TLS for `herd-cli`'s own connections to a multi-host cluster's servers (the coordinator's
/// tasks, copies and shard moves across hosts, the replicas' copy slots): `verify-full` against
/// the cluster's CA in `layout`'s `secrets/ca.crt` when the cluster has one, as the proxies'
/// `auto`; plain without. An unreadable CA is an error, never a plain connection: with a CA the
/// servers take every role from beyond loopback over TLS only.
pub fn to_cluster(layout: &herd_cluster::Layout) -> anyhow::Result<Option<ClientTls>> {
    let ca = layout.secrets().join(herd_certs::CA_CERT);
    let mode = if ca.exists() {
        TlsMode::VerifyFull
    } else {
        TlsMode::Off
    };
    ClientTls::new(mode, &ca).context("setting up TLS to the cluster's servers")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn with(server_tls: &str) -> ProxyConfig {
        ProxyConfig {
            server_tls: server_tls.into(),
            ..ProxyConfig::default()
        }
    }

    #[test]
    fn server_tls_follows_the_cluster_ca_and_never_downgrades() {
        let secrets = tempfile::tempdir().expect("tempdir");
        let mode =
            |setting: &str| to_servers(&with(setting), secrets.path()).map(|t| t.map(|t| t.mode()));
        assert_eq!(mode("auto").expect("no CA"), None);
        assert_eq!(mode("off").expect("off"), None);
        assert_eq!(
            mode("require").expect("no CA needed"),
            Some(TlsMode::Require)
        );
        let e = mode("verify-full").expect_err("no CA").to_string();
        assert!(e.contains("ca.crt is missing"), "{e}");
        assert!(mode("verify-ca").is_err());
        let ca = herd_certs::ClusterCa::generate("t").expect("CA");
        std::fs::write(secrets.path().join(herd_certs::CA_CERT), &ca.cert_pem).expect("ca.crt");
        assert_eq!(mode("auto").expect("CA"), Some(TlsMode::VerifyFull));
        assert_eq!(mode("off").expect("off"), None);
    }

    #[test]
    fn the_cli_follows_the_cluster_ca() {
        let dir = tempfile::tempdir().expect("tempdir");
        let layout = herd_cluster::Layout::new(dir.path());
        std::fs::create_dir_all(layout.secrets()).expect("secrets");
        assert!(to_cluster(&layout).expect("no CA").is_none());
        let ca_file = layout.secrets().join(herd_certs::CA_CERT);
        std::fs::write(&ca_file, "").expect("empty ca.crt");
        let e = to_cluster(&layout).expect_err("an empty CA").to_string();
        assert!(e.contains("TLS to the cluster's servers"), "{e}");
        let ca = herd_certs::ClusterCa::generate("t").expect("CA");
        std::fs::write(&ca_file, &ca.cert_pem).expect("ca.crt");
        let tls = to_cluster(&layout).expect("CA").expect("TLS with a CA");
        assert_eq!(tls.mode(), TlsMode::VerifyFull);
    }
}
