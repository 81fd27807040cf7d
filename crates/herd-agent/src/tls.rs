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
    /// When [`NodeTls::renew_if_due`] looks next.
    pub next_check: std::time::Instant,
    /// The agent's own connections to its server (probes, administration): verify-full
    /// against the CA, the certificate naming the advertised address whichever local address
    /// is dialled.
    pub client: herd_pg::ClientTls,
    /// The fingerprint of the CA that issued the certificate (the member record shows it, so
    /// `herd certs rotate --finish` knows who is still on the old CA).
    pub issuer: Option<String>,
    /// The store asks every agent to issue from the next CA (`herd certs rotate --issue`).
    pub issue_from_next: bool,
    /// `ca.crt` as last seen (inode, size, time): a change makes the agent reload its server,
    /// which reads `ssl_ca_file` again on reload.
    pub ca_stamp: Option<CaStamp>,
    /// The fingerprints of the CAs in `ca.crt` (the member record shows them).
    pub trusts: Vec<String>,
}

/// What tells a changed CA file: inode (replaced by a rename), size, modification time.
pub type CaStamp = (u64, u64, Option<std::time::SystemTime>);

/// `path`'s [`CaStamp`], `None` when it cannot be read.
pub fn ca_stamp(path: &Path) -> Option<CaStamp> {
    use std::os::unix::fs::MetadataExt as _;
    let m = std::fs::metadata(path).ok()?;
    Some((m.ino(), m.len(), m.modified().ok()))
}

/// The CA this member's certificate comes from now: the next CA of a rotation under way once
/// the store asks for it (`from_next`) or once the certificate there is already the next's
/// (an agent restarted mid-rotation keeps it); else the cluster's CA when its key is here;
/// `None` without a key (the operator issues).
fn issuing_ca(
    secrets: &Path,
    cert_file: &Path,
    from_next: bool,
) -> Result<Option<ClusterCa>, herd_certs::CertError> {
    if let Some(next) = herd_certs::rotate::load_next(secrets)? {
        let on_next = std::fs::read_to_string(cert_file)
            .ok()
            .is_some_and(|pem| herd_certs::issued_by(&pem, &next.cert_pem));
        if from_next || on_next {
            return Ok(Some(next));
        }
    }
    if !secrets.join(CA_KEY).exists() {
        return Ok(None);
    }
    ClusterCa::load(secrets)
}

/// The fingerprints of the CAs in `ca_file` (empty when it cannot be read).
pub fn trusted(ca_file: &Path) -> Vec<String> {
    let text = std::fs::read_to_string(ca_file).unwrap_or_default();
    herd_certs::pem_blocks(&text)
        .iter()
        .filter_map(|pem| herd_certs::fingerprint(pem).ok())
        .collect()
}

/// The fingerprint of the CA in `ca_file` (a bundle during a rotation) that issued `cert_file`.
pub fn issuer_of(cert_file: &Path, ca_file: &Path) -> Option<String> {
    let pem = std::fs::read_to_string(cert_file).ok()?;
    let ca = std::fs::read_to_string(ca_file).ok()?;
    herd_certs::issuer_fingerprint(&pem, &ca)
}

/// How often a running agent looks whether its certificate is due for renewal.
pub const RENEWAL_CHECK: std::time::Duration = std::time::Duration::from_secs(3600);

impl NodeTls {
    /// While the agent runs, with the CA's key in `secrets`: issues the certificate again for
    /// `common_name` and `names` when [`herd_certs::ensure_issued`] says so (within
    /// [`herd_certs::RENEW_BEFORE_DAYS`] of its end at `now`, or replaced by one that does not
    /// fit), as at start. `true`: new files were written (the caller hands them to the
    /// servers' OS user and reloads PostgreSQL, which reads them again on reload). Without
    /// the CA's key, nothing (the operator renews it; `herd status --dcs` warns).
    pub fn renew_if_due(
        &mut self,
        secrets: &Path,
        common_name: &str,
        names: &[String],
        now: i64,
    ) -> Result<bool, AgentError> {
        let setup = |e: herd_certs::CertError| AgentError::Io(e.to_string());
        let Some(ca) =
            issuing_ca(secrets, &self.server.cert_file, self.issue_from_next).map_err(setup)?
        else {
            return Ok(false);
        };
        let why = herd_certs::ensure_issued(
            &ca,
            &self.server.cert_file,
            &self.server.key_file,
            common_name,
            names,
            now,
        )
        .map_err(setup)?;
        let Some(why) = why else { return Ok(false) };
        let pem = std::fs::read_to_string(&self.server.cert_file).map_err(|e| {
            AgentError::Io(format!("reading {}: {e}", self.server.cert_file.display()))
        })?;
        self.not_after = herd_certs::info(&pem).map_err(setup)?.not_after;
        self.issuer = issuer_of(&self.server.cert_file, &self.ca_file);
        tracing::info!(
            "renewed {} from the cluster's CA ({why:?})",
            self.server.cert_file.display()
        );
        Ok(true)
    }

    /// Whether the store asks for the next CA's certificate and this one is not yet (checked
    /// every round while the flag is set: one file read and a signature check).
    pub fn rotation_due(&self, secrets: &Path) -> bool {
        if !self.issue_from_next {
            return false;
        }
        let Ok(Some(next)) = herd_certs::rotate::load_next(secrets) else {
            return false;
        };
        !std::fs::read_to_string(&self.server.cert_file)
            .is_ok_and(|pem| herd_certs::issued_by(&pem, &next.cert_pem))
    }

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
    if let Some(ca) = issuing_ca(&secrets, &server.cert_file, false).map_err(setup)? {
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
    let client = herd_pg::ClientTls::new(herd_pg::TlsMode::VerifyFull, &ca_file)
        .and_then(|t| match t {
            Some(t) => t.expecting(&cfg.pg_advertise),
            None => Err(herd_pg::PgError::Tls("verify-full gave no settings".into())),
        })
        .map_err(|e| AgentError::Setup(e.to_string()))?;
    Ok(Some(NodeTls {
        issuer: issuer_of(&server.cert_file, &ca_file),
        trusts: trusted(&ca_file),
        ca_stamp: ca_stamp(&ca_file),
        issue_from_next: false,
        ca_file,
        server,
        not_after,
        client,
        next_check: std::time::Instant::now() + RENEWAL_CHECK,
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_running_agent_renews_a_certificate_near_its_end_with_the_ca_key_only() {
        let dir = tempfile::tempdir().expect("dir");
        let secrets = dir.path().join("secrets");
        let ca = ClusterCa::load_or_make(&secrets, "t").expect("CA");
        let server = ServerTls {
            cert_file: dir.path().join("h1.crt"),
            key_file: dir.path().join("h1.key"),
            ca_file: secrets.join(CA_CERT),
        };
        let names = vec!["10.0.0.1".to_string()];
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs() as i64);
        herd_certs::ensure_issued(&ca, &server.cert_file, &server.key_file, "h1", &names, now)
            .expect("issued");
        let first = std::fs::read_to_string(&server.cert_file).expect("cert");
        let mut tls = NodeTls {
            ca_file: secrets.join(CA_CERT),
            server,
            not_after: 0,
            next_check: std::time::Instant::now(),
            client: herd_pg::ClientTls::new(herd_pg::TlsMode::VerifyFull, &secrets.join(CA_CERT))
                .expect("CA")
                .expect("verify-full"),
            issuer: None,
            issue_from_next: false,
            ca_stamp: None,
            trusts: Vec::new(),
        };
        assert!(!tls
            .renew_if_due(&secrets, "h1", &names, now)
            .expect("check"));
        assert_eq!(tls.not_after, 0, "nothing renewed, nothing read");
        // 340 days on: within 30 days of the end.
        let later = now + 340 * 86_400;
        assert!(tls
            .renew_if_due(&secrets, "h1", &names, later)
            .expect("renew"));
        let second = std::fs::read_to_string(&tls.server.cert_file).expect("cert");
        assert_ne!(first, second);
        assert!(tls.not_after > now + 360 * 86_400, "a new year from today");
        // Without the CA's key the agent leaves it to the operator.
        std::fs::remove_file(secrets.join(CA_KEY)).expect("remove key");
        assert!(!tls
            .renew_if_due(&secrets, "h1", &names, later)
            .expect("no key"));
    }
}
