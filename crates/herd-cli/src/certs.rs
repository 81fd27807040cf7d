//! `herd certs`: the cluster's certificate authority (issue #42). `init` makes it in the
//! secrets directory (or keeps the one there: an operator's own CA is the same two files),
//! `issue` makes a certificate for a host from it, `show` lists the CA and the certificates
//! under a directory with their names and how long they remain valid (and warns about those
//! that end within 30 days).

use std::path::{Path, PathBuf};

use anyhow::Context as _;
use clap::{Args, Subcommand};
use herd_certs::{ClusterCa, RENEW_BEFORE_DAYS};

use crate::cli::DataDirArg;

/// `herd certs …`.
#[derive(Debug, Subcommand)]
pub enum CertsCommand {
    /// Make the cluster's CA in DATA/secrets (ca.crt, ca.key, mode 0600), unless one is there.
    Init {
        #[command(flatten)]
        dir: DataDirArg,
        /// The cluster's name, written into the CA's subject.
        #[arg(long, default_value = "herd")]
        cluster: String,
    },
    /// Issue a certificate (and its key) from the cluster's CA for a host's names.
    Issue(IssueArgs),
    /// The CA and every certificate under the data directory: names and days left.
    Show {
        #[command(flatten)]
        dir: DataDirArg,
    },
    /// Replace the CA without downtime, in three steps run in order: --stage, --issue, --finish.
    Rotate(crate::certs_rotate::RotateArgs),
}

/// Options of `herd certs issue`.
#[derive(Debug, Args)]
pub struct IssueArgs {
    #[command(flatten)]
    dir: DataDirArg,
    /// The certificate's common name (e.g. the host's member name).
    name: String,
    /// A DNS name or IP address the certificate is valid for; repeat for each.
    #[arg(long = "host", value_name = "NAME|IP", required = true)]
    hosts: Vec<String>,
    /// Where NAME.crt and NAME.key go (created; the key with mode 0600).
    #[arg(long, value_name = "DIR")]
    out: PathBuf,
}

/// Runs a `herd certs` command.
pub fn run(command: CertsCommand) -> anyhow::Result<()> {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs() as i64)
        .unwrap_or(0);
    match command {
        CertsCommand::Init { dir, cluster } => {
            let secrets = dir.layout()?.secrets();
            let existed = ClusterCa::load(&secrets)?.is_some();
            let ca = ClusterCa::load_or_make(&secrets, &cluster)?;
            let info = herd_certs::info(&ca.cert_pem)?;
            crate::output::emitln!(
                "{} {} in {} (valid {} more days)",
                if existed {
                    "kept the CA"
                } else {
                    "made the CA"
                },
                info.subject,
                secrets.display(),
                info.days_left(now)
            );
            Ok(())
        }
        CertsCommand::Issue(a) => {
            let secrets = a.dir.layout()?.secrets();
            let ca = ClusterCa::load(&secrets)?.with_context(|| {
                format!(
                    "no CA in {} (ca.crt, ca.key): run `herd certs init` first, or copy the \
                     cluster's secrets directory here",
                    secrets.display()
                )
            })?;
            std::fs::create_dir_all(&a.out)
                .with_context(|| format!("creating {}", a.out.display()))?;
            let crt = a.out.join(format!("{}.crt", a.name));
            let key = a.out.join(format!("{}.key", a.name));
            herd_certs::ensure_issued(&ca, &crt, &key, &a.name, &a.hosts, now)?;
            let info = herd_certs::info(&std::fs::read_to_string(&crt)?)?;
            crate::output::emitln!(
                "{} for {} (valid {} days): {}, key {}",
                info.subject,
                info.names.join(", "),
                info.days_left(now),
                crt.display(),
                key.display()
            );
            Ok(())
        }
        CertsCommand::Show { dir } => show(dir.layout()?.root(), now),
        CertsCommand::Rotate(_) => anyhow::bail!("`herd certs rotate` runs asynchronously"),
    }
}

/// Lists the CA of `data/secrets` and every `*.crt` under `data`.
fn show(data: &Path, now: i64) -> anyhow::Result<()> {
    let mut found = Vec::new();
    collect(data, &mut found, 0);
    found.sort();
    if found.is_empty() {
        anyhow::bail!(
            "no certificate under {} (`herd certs init` makes the cluster's CA)",
            data.display()
        );
    }
    let mut expiring = 0;
    // Who issued each certificate (during `herd certs rotate`, ca.crt holds two CAs).
    let trusted =
        std::fs::read_to_string(data.join("secrets").join(herd_certs::CA_CERT)).unwrap_or_default();
    for path in found {
        let pem = std::fs::read_to_string(&path)?;
        match herd_certs::info(&pem) {
            Ok(info) => {
                let issuer = issuer_note(&pem, &trusted);
                let days = info.days_left(now);
                let warn = days < RENEW_BEFORE_DAYS;
                expiring += usize::from(warn);
                let expired = info.not_after <= now;
                crate::output::emitln!(
                    "{}{}: {} [{}] {}{issuer}",
                    if warn { "WARNING: " } else { "" },
                    path.display(),
                    info.subject,
                    info.names.join(", "),
                    if expired {
                        "EXPIRED".to_string()
                    } else {
                        format!("{days} days left")
                    }
                );
                if warn {
                    crate::output::emitln!("  fix: {}", renewal(&path, &info));
                }
            }
            Err(e) => crate::output::emitln!("{}: not readable ({e})", path.display()),
        }
    }
    if expiring > 0 {
        anyhow::bail!(
            "{expiring} certificate(s) end within {RENEW_BEFORE_DAYS} days: issue them again \
             (`herd certs issue`)"
        );
    }
    Ok(())
}

/// `pem`'s fingerprint when it is a CA (every CA of a bundle), else the fingerprint of the CA
/// of `trusted` (the cluster's `ca.crt`) that issued it.
fn issuer_note(pem: &str, trusted: &str) -> String {
    let blocks = herd_certs::pem_blocks(pem);
    let own: Vec<String> = blocks
        .iter()
        .filter(|b| herd_certs::issued_by(b, b))
        .filter_map(|b| herd_certs::fingerprint(b).ok())
        .collect();
    if !own.is_empty() {
        return format!(", CA {}", own.join(" + "));
    }
    match herd_certs::issuer_fingerprint(pem, trusted) {
        Some(fp) => format!(", issued by CA {fp}"),
        None if trusted.is_empty() => String::new(),
        None => ", issued by no CA in secrets/ca.crt".into(),
    }
}

/// The command that renews the certificate at `path`.
fn renewal(path: &Path, info: &herd_certs::CertInfo) -> String {
    if path.file_name().is_some_and(|n| n == herd_certs::CA_CERT) {
        return "the CA itself: replace it without downtime with `herd certs rotate --stage`, \
                then `--issue`, then `--finish`"
            .into();
    }
    let name = path.file_stem().map_or_else(
        || info.subject.clone(),
        |s| s.to_string_lossy().into_owned(),
    );
    let hosts: String = info.names.iter().map(|n| format!(" --host {n}")).collect();
    let dir = path.parent().unwrap_or(Path::new("."));
    format!(
        "`herd certs issue {name}{hosts} --out {}` where the CA's key is (an agent whose \
         secrets hold ca.key renews its own at start)",
        dir.display()
    )
}

/// Every `*.crt` under `dir` (a few levels deep; node data directories skipped but for their
/// top level, where PostgreSQL's server certificate lives).
fn collect(dir: &Path, out: &mut Vec<PathBuf>, depth: usize) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        if path.is_dir() && depth < 3 {
            collect(&path, out, depth + 1);
        } else if path.extension().is_some_and(|e| e == "crt") {
            out.push(path);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn issuers_are_told_by_fingerprint() {
        let old = ClusterCa::generate("t").expect("CA");
        let next = ClusterCa::generate("t").expect("CA");
        let fp = |ca: &ClusterCa| herd_certs::fingerprint(&ca.cert_pem).expect("fp");
        let bundle = format!("{}{}", old.cert_pem, next.cert_pem);
        let leaf = next.issue("h0", &["10.0.0.1".into()]).expect("leaf");
        assert_eq!(
            issuer_note(&leaf.cert_pem, &bundle),
            format!(", issued by CA {}", fp(&next))
        );
        assert_eq!(
            issuer_note(&leaf.cert_pem, &old.cert_pem),
            ", issued by no CA in secrets/ca.crt"
        );
        assert_eq!(
            issuer_note(&bundle, &bundle),
            format!(", CA {} + {}", fp(&old), fp(&next))
        );
    }

    #[test]
    fn renewal_names_the_command_with_the_same_names_and_place() {
        let info = herd_certs::CertInfo {
            subject: "h1".into(),
            names: vec!["10.0.0.2".into(), "db2".into()],
            not_after: 0,
        };
        let fix = renewal(Path::new("/var/lib/herd/tls/h1.crt"), &info);
        assert!(
            fix.starts_with(
                "`herd certs issue h1 --host 10.0.0.2 --host db2 --out /var/lib/herd/tls`"
            ),
            "{fix}"
        );
        let ca = renewal(Path::new("/var/lib/herd/secrets/ca.crt"), &info);
        assert!(ca.starts_with("the CA itself"), "{ca}");
    }
}
