//! TLS between the hosts (issue #42): when the cluster's secrets directory holds its CA
//! (`herd certs init`), the agent's PostgreSQL serves TLS with a certificate of that CA for
//! the address other hosts reach it by (`--pg-advertise`), and replication (`primary_conninfo`,
//! `pg_basebackup`, `pg_rewind`) verifies the other member's certificate (`verify-full`).
//!
//! The certificate is `DATA/tls/<name>.crt` and its key `DATA/tls/<name>.key` (mode 0600,
//! handed to the servers' OS user), outside the PostgreSQL data directory so a clone never
//! copies another host's key. With the CA's key in `secrets/` the agent issues (or renews)
//! it at start; without it (the CA key kept off the hosts) the operator issues it with
//! `herd certs issue` and the agent refuses to start with a certificate that cannot serve,
//! naming the file and the command. Without a CA nothing changes; `herd up`'s nodes
//! (loopback only) never use it.

use std::path::{Path, PathBuf};

use herd_certs::{ClusterCa, Unfit, CA_CERT, CA_KEY};
use herd_cluster::Layout;
use herd_pg::{PeerTls, ServerTls};

use crate::{AgentConfig, AgentError};

/// The node's TLS: its server's files and the CA peers are verified with.
#[derive(Clone, Debug, PartialEq)]
pub struct NodeTls {
    /// The cluster's CA certificate (`secrets/ca.crt`).
    pub ca_file: PathBuf,
    /// The server's certificate and key.
    pub server: ServerTls,
    /// The certificate's last valid moment, Unix seconds.
    pub not_after: i64,
}

impl NodeTls {
    /// How this member connects to another: the CA, and its certificate as a client's.
    pub fn peer(&self) -> PeerTls {
        PeerTls {
            ca_file: self.ca_file.clone(),
            cert_file: self.server.cert_file.clone(),
            key_file: self.server.key_file.clone(),
        }
    }
}

/// The certificate's directory under the agent's data directory.
pub fn tls_dir(data_dir: &Path) -> PathBuf {
    data_dir.join("tls")
}

/// The node's TLS set-up at start (`now`: Unix seconds): `None` without a CA (or for `herd
/// up`'s nodes); the certificate issued or renewed when the CA's key is here; else the one
/// kept checked.
pub fn prepare(
    cfg: &AgentConfig,
    layout: &Layout,
    now: i64,
) -> Result<Option<NodeTls>, AgentError> {
    if cfg.paths.is_some() {
        return Ok(None);
    }
    let secrets = layout.secrets();
    let ca_file = secrets.join(CA_CERT);
    let has_key = secrets.join(CA_KEY).exists();
    if !ca_file.exists() {
        if has_key {
            return Err(AgentError::Setup(format!(
                "{} is there but {} is not: copy the cluster's CA certificate beside its key",
                secrets.join(CA_KEY).display(),
                ca_file.display()
            )));
        }
        return Ok(None);
    }
    let dir = tls_dir(&cfg.data_dir);
    std::fs::create_dir_all(&dir)
        .map_err(|e| AgentError::Setup(format!("cannot create {}: {e}", dir.display())))?;
    let server = ServerTls {
        cert_file: dir.join(format!("{}.crt", cfg.name)),
        key_file: dir.join(format!("{}.key", cfg.name)),
        ca_file: ca_file.clone(),
    };
    let names = vec![cfg.pg_advertise.clone()];
    let setup = |e: herd_certs::CertError| AgentError::Setup(e.to_string());
    if has_key {
        let ca = ClusterCa::load(&secrets)
            .map_err(setup)?
            .ok_or_else(|| AgentError::Setup(format!("cannot read {}", ca_file.display())))?;
        if let Some(why) = herd_certs::ensure_issued(
            &ca,
            &server.cert_file,
            &server.key_file,
            &cfg.name,
            &names,
            now,
        )
        .map_err(setup)?
        {
            tracing::info!(
                "issued {} for {} from the cluster's CA ({why:?})",
                server.cert_file.display(),
                names.join(", ")
            );
        }
    } else {
        let read = |p: &Path| std::fs::read_to_string(p).ok();
        let ca_pem = read(&ca_file)
            .ok_or_else(|| AgentError::Setup(format!("cannot read {}", ca_file.display())))?;
        let cert = read(&server.cert_file);
        let unfit = herd_certs::check(
            cert.as_deref(),
            server.key_file.exists(),
            &ca_pem,
            &names,
            now,
        )
        .err();
        if let Some(why) = unfit {
            return Err(AgentError::Setup(unfit_message(cfg, &server, &why)));
        }
    }
    // PostgreSQL refuses a key others may read; an operator's copy may have lost its mode.
    restrict(&server.key_file)?;
    restrict(&server.cert_file)?;
    let not_after = std::fs::read_to_string(&server.cert_file)
        .map_err(|e| AgentError::Setup(format!("reading {}: {e}", server.cert_file.display())))
        .and_then(|pem| herd_certs::info(&pem).map_err(setup))?
        .not_after;
    Ok(Some(NodeTls {
        ca_file,
        server,
        not_after,
    }))
}

/// Why the kept certificate cannot serve, the file, and the command that fixes it.
fn unfit_message(cfg: &AgentConfig, server: &ServerTls, why: &Unfit) -> String {
    let file = match why {
        Unfit::KeyMissing => &server.key_file,
        _ => &server.cert_file,
    };
    format!(
        "{}: {why}; the cluster has a CA (secrets/{CA_CERT}) but its key is not on this host, so \
         issue this host's certificate where the key is: `herd certs issue {} --host {} --out DIR \
         --data-dir DATA_WITH_CA_KEY`, then copy {}.crt and {}.key into {}",
        file.display(),
        cfg.name,
        cfg.pg_advertise,
        cfg.name,
        cfg.name,
        tls_dir(&cfg.data_dir).display()
    )
}

fn restrict(path: &Path) -> Result<(), AgentError> {
    use std::os::unix::fs::PermissionsExt as _;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))
        .map_err(|e| AgentError::Setup(format!("cannot restrict {}: {e}", path.display())))
}
