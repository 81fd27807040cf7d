//! A Herd cluster's certificate authority (issue #42, "TLS everywhere between machines").
//!
//! The CA is made once per cluster, beside its passwords: `secrets/ca.crt` and
//! `secrets/ca.key` (mode 0600), so the secrets directory an operator copies to a new host
//! carries it. Each host then issues its own certificates from it — a PostgreSQL server's,
//! an agent's — for the names other machines reach it by, and renews them before they expire;
//! anything that verifies a peer trusts `ca.crt` only. An operator's own CA can take its place:
//! the same two files.
//!
//! Keys are ECDSA P-256 (fast handshakes; every PostgreSQL 15 build and rustls accept them).
//! Validity: 10 years for the CA, 1 year for what it issues (renewed 30 days before the end by
//! [`ensure_issued`]).

use std::path::{Path, PathBuf};

use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa,
    Issuer, KeyPair, KeyUsagePurpose, SanType,
};
use time::{Duration, OffsetDateTime};

/// The CA certificate's file name in the secrets directory.
pub const CA_CERT: &str = "ca.crt";
/// The CA key's file name in the secrets directory.
pub const CA_KEY: &str = "ca.key";
/// How long the CA is valid.
const CA_DAYS: i64 = 3650;
/// How long an issued certificate is valid.
const ISSUED_DAYS: i64 = 365;
/// An issued certificate this close to its end is renewed.
pub const RENEW_BEFORE_DAYS: i64 = 30;

/// What went wrong.
#[derive(Debug, thiserror::Error)]
pub enum CertError {
    /// Reading or writing a file.
    #[error("{action} {path}: {source}")]
    Io {
        /// What was done.
        action: &'static str,
        /// The file.
        path: PathBuf,
        /// The cause.
        source: std::io::Error,
    },
    /// Making or reading a certificate or key.
    #[error("{0}")]
    Cert(String),
}

fn io(action: &'static str, path: &Path, source: std::io::Error) -> CertError {
    CertError::Io {
        action,
        path: path.to_path_buf(),
        source,
    }
}

fn cert(what: &str, e: impl std::fmt::Display) -> CertError {
    CertError::Cert(format!("{what}: {e}"))
}

/// A cluster's CA: its certificate and key, PEM.
pub struct ClusterCa {
    /// The certificate.
    pub cert_pem: String,
    key_pem: String,
}

impl std::fmt::Debug for ClusterCa {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ClusterCa(..)")
    }
}

/// A certificate issued by the CA, and its key (PEM).
pub struct Issued {
    /// The certificate.
    pub cert_pem: String,
    /// Its private key.
    pub key_pem: String,
}

/// What a certificate says about itself.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CertInfo {
    /// The subject's common name.
    pub subject: String,
    /// DNS names and IP addresses it is valid for.
    pub names: Vec<String>,
    /// Its last valid moment, seconds since the Unix epoch.
    pub not_after: i64,
}

impl CertInfo {
    /// Whole days from `now` (Unix seconds) to its end; negative once expired.
    pub fn days_left(&self, now: i64) -> i64 {
        (self.not_after - now).div_euclid(86_400)
    }
}

impl ClusterCa {
    /// A new CA for the cluster called `cluster`.
    pub fn generate(cluster: &str) -> Result<ClusterCa, CertError> {
        let key = KeyPair::generate().map_err(|e| cert("making the CA key", e))?;
        let mut params = CertificateParams::new(Vec::<String>::new())
            .map_err(|e| cert("the CA's parameters", e))?;
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.distinguished_name = name(&format!("Herd cluster CA ({cluster})"));
        params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
        let now = OffsetDateTime::now_utc();
        params.not_before = now - Duration::hours(1);
        params.not_after = now + Duration::days(CA_DAYS);
        let certificate = params
            .self_signed(&key)
            .map_err(|e| cert("signing the CA", e))?;
        Ok(ClusterCa {
            cert_pem: certificate.pem(),
            key_pem: key.serialize_pem(),
        })
    }

    /// The CA kept in `secrets` (`ca.crt`, `ca.key`), if there is one.
    pub fn load(secrets: &Path) -> Result<Option<ClusterCa>, CertError> {
        let (crt, key) = (secrets.join(CA_CERT), secrets.join(CA_KEY));
        if !crt.exists() && !key.exists() {
            return Ok(None);
        }
        let read = |p: &Path| std::fs::read_to_string(p).map_err(|e| io("reading", p, e));
        // During a rotation ca.crt is a bundle (this CA, then the next): the key is the first's.
        let bundle = read(&crt)?;
        let cert_pem = pem_blocks(&bundle).into_iter().next().unwrap_or(bundle);
        Ok(Some(ClusterCa {
            cert_pem,
            key_pem: read(&key)?,
        }))
    }

    /// Writes the CA into `secrets` (each file mode 0600).
    pub fn save(&self, secrets: &Path) -> Result<(), CertError> {
        std::fs::create_dir_all(secrets).map_err(|e| io("creating", secrets, e))?;
        write_private(&secrets.join(CA_CERT), &self.cert_pem)?;
        write_private(&secrets.join(CA_KEY), &self.key_pem)
    }

    /// The CA kept in `secrets`, made (and saved) first when there is none.
    pub fn load_or_make(secrets: &Path, cluster: &str) -> Result<ClusterCa, CertError> {
        if let Some(ca) = Self::load(secrets)? {
            return Ok(ca);
        }
        let ca = Self::generate(cluster)?;
        ca.save(secrets)?;
        Ok(ca)
    }

    /// A certificate for `common_name`, valid for `names` (DNS names or IP addresses), usable
    /// by a server and as a client certificate.
    pub fn issue(&self, common_name: &str, names: &[String]) -> Result<Issued, CertError> {
        let ca_key = KeyPair::from_pem(&self.key_pem).map_err(|e| cert("reading the CA key", e))?;
        let issuer = Issuer::from_ca_cert_pem(&self.cert_pem, ca_key)
            .map_err(|e| cert("reading the CA certificate", e))?;
        let key = KeyPair::generate().map_err(|e| cert("making a key", e))?;
        let mut params = CertificateParams::new(Vec::<String>::new())
            .map_err(|e| cert("the certificate's parameters", e))?;
        params.distinguished_name = name(common_name);
        for n in names {
            params.subject_alt_names.push(match n.parse() {
                Ok(ip) => SanType::IpAddress(ip),
                Err(_) if !dns_name(n) => {
                    return Err(CertError::Cert(format!(
                        "{n:?} is neither an IP address nor a DNS name (letters, digits, '-' \
                         and '.')"
                    )))
                }
                Err(_) => SanType::DnsName(
                    n.clone()
                        .try_into()
                        .map_err(|e| cert(&format!("the name {n:?}"), e))?,
                ),
            });
        }
        params.key_usages = vec![
            KeyUsagePurpose::DigitalSignature,
            KeyUsagePurpose::KeyEncipherment,
        ];
        params.extended_key_usages = vec![
            ExtendedKeyUsagePurpose::ServerAuth,
            ExtendedKeyUsagePurpose::ClientAuth,
        ];
        let now = OffsetDateTime::now_utc();
        params.not_before = now - Duration::hours(1);
        params.not_after = now + Duration::days(ISSUED_DAYS);
        let certificate = params
            .signed_by(&key, &issuer)
            .map_err(|e| cert("signing the certificate", e))?;
        Ok(Issued {
            cert_pem: certificate.pem(),
            key_pem: key.serialize_pem(),
        })
    }
}

/// Why [`ensure_issued`] wrote a certificate.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Renewal {
    /// There was none.
    Missing,
    /// The one there expires within [`RENEW_BEFORE_DAYS`].
    Expiring,
    /// The one there does not name every name asked for (the host's address changed).
    Names,
    /// The one there was issued by another CA (the CA was replaced).
    OtherCa,
}

/// Makes sure `cert_path` holds a certificate of `ca` for `common_name` and every one of
/// `names`, valid for more than [`RENEW_BEFORE_DAYS`]; issues one (and its key at `key_path`,
/// mode 0600) when not. `None`: the one there is good.
pub fn ensure_issued(
    ca: &ClusterCa,
    cert_path: &Path,
    key_path: &Path,
    common_name: &str,
    names: &[String],
    now: i64,
) -> Result<Option<Renewal>, CertError> {
    let why = match std::fs::read_to_string(cert_path) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Some(Renewal::Missing),
        Err(e) => return Err(io("reading", cert_path, e)),
        Ok(_) if !key_path.exists() => Some(Renewal::Missing),
        Ok(pem) if !issued_by(&pem, &ca.cert_pem) => Some(Renewal::OtherCa),
        Ok(pem) => {
            let info = info(&pem)?;
            if info.days_left(now) < RENEW_BEFORE_DAYS {
                Some(Renewal::Expiring)
            } else if names.iter().any(|n| !info.names.contains(n)) {
                Some(Renewal::Names)
            } else {
                None
            }
        }
    };
    if why.is_some() {
        let issued = ca.issue(common_name, names)?;
        write_private(key_path, &issued.key_pem)?;
        write_private(cert_path, &issued.cert_pem)?;
    }
    Ok(why)
}

/// Why a certificate kept on a host cannot serve (see [`check`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Unfit {
    /// There is no certificate.
    Missing,
    /// There is a certificate but no key beside it.
    KeyMissing,
    /// The file is not a certificate.
    Unreadable(String),
    /// It was not issued by the cluster's CA.
    OtherCa,
    /// Its validity ended this many whole days ago (0: today).
    Expired(i64),
    /// It is not valid for these names, which peers reach the host by.
    Names(Vec<String>),
}

impl std::fmt::Display for Unfit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Unfit::Missing => f.write_str("no certificate"),
            Unfit::KeyMissing => f.write_str("its key is missing"),
            Unfit::Unreadable(e) => write!(f, "not a readable certificate ({e})"),
            Unfit::OtherCa => f.write_str("not issued by the cluster's CA (ca.crt)"),
            Unfit::Expired(0) => f.write_str("expired today"),
            Unfit::Expired(days) => write!(f, "expired {days} days ago"),
            Unfit::Names(names) => write!(f, "not valid for {}", names.join(", ")),
        }
    }
}

/// Whether the certificate `cert_pem` (`None`: no file), whose key is present or not, can
/// serve as a host's certificate of the CA `ca_pem` for every one of `names` at `now` (Unix
/// seconds): its facts, or why not. Pure: the caller reads the files.
pub fn check(
    cert_pem: Option<&str>,
    key_present: bool,
    ca_pem: &str,
    names: &[String],
    now: i64,
) -> Result<CertInfo, Unfit> {
    let pem = cert_pem.ok_or(Unfit::Missing)?;
    let info = info(pem).map_err(|e| Unfit::Unreadable(e.to_string()))?;
    if !key_present {
        return Err(Unfit::KeyMissing);
    }
    if !issued_by(pem, ca_pem) {
        return Err(Unfit::OtherCa);
    }
    if info.not_after <= now {
        return Err(Unfit::Expired((now - info.not_after).div_euclid(86_400)));
    }
    let missing: Vec<String> = names
        .iter()
        .filter(|n| !info.names.contains(n))
        .cloned()
        .collect();
    if !missing.is_empty() {
        return Err(Unfit::Names(missing));
    }
    Ok(info)
}

/// Whether `pem` was signed by the CA certificate `ca_pem`, or by any of a bundle's (its
/// signature checks out).
pub fn issued_by(pem: &str, ca_pem: &str) -> bool {
    pem_blocks(ca_pem).iter().any(|ca| issued_by_one(pem, ca))
}

/// The fingerprint of the CA of the bundle `ca_pem` that signed `pem` (see [`fingerprint`]).
pub fn issuer_fingerprint(pem: &str, ca_pem: &str) -> Option<String> {
    pem_blocks(ca_pem)
        .iter()
        .find(|ca| issued_by_one(pem, ca))
        .and_then(|ca| fingerprint(ca).ok())
}

/// A certificate's short fingerprint: `sha256:` and the first 16 hex digits of the SHA-256 of
/// its DER (enough to tell a cluster's CAs apart in member records and messages).
pub fn fingerprint(pem: &str) -> Result<String, CertError> {
    use sha2::Digest as _;
    let digest = sha2::Sha256::digest(der(pem)?);
    let hex: String = digest.iter().take(8).map(|b| format!("{b:02x}")).collect();
    Ok(format!("sha256:{hex}"))
}

/// Every `CERTIFICATE` block of `text`, each as its own PEM text.
pub fn pem_blocks(text: &str) -> Vec<String> {
    const BEGIN: &str = "-----BEGIN CERTIFICATE-----";
    const END: &str = "-----END CERTIFICATE-----";
    let mut out = Vec::new();
    let mut rest = text;
    while let Some(start) = rest.find(BEGIN) {
        let Some(len) = rest[start..].find(END) else {
            break;
        };
        let end = start + len + END.len();
        out.push(format!("{}\n", &rest[start..end]));
        rest = &rest[end..];
    }
    out
}

fn issued_by_one(pem: &str, ca_pem: &str) -> bool {
    let (Ok(leaf), Ok(ca)) = (der(pem), der(ca_pem)) else {
        return false;
    };
    let (Ok((_, leaf)), Ok((_, ca))) = (
        x509_parser::parse_x509_certificate(&leaf),
        x509_parser::parse_x509_certificate(&ca),
    ) else {
        return false;
    };
    leaf.verify_signature(Some(ca.public_key())).is_ok()
}

/// The subject, names and end of validity of the certificate `pem`.
pub fn info(pem: &str) -> Result<CertInfo, CertError> {
    let bytes = der(pem)?;
    let (_, x509) = x509_parser::parse_x509_certificate(&bytes)
        .map_err(|e| cert("reading a certificate", e))?;
    let subject = x509
        .subject()
        .iter_common_name()
        .next()
        .and_then(|cn| cn.as_str().ok())
        .unwrap_or_default()
        .to_string();
    let mut names = Vec::new();
    if let Ok(Some(san)) = x509.subject_alternative_name() {
        for n in &san.value.general_names {
            match n {
                x509_parser::extensions::GeneralName::DNSName(d) => names.push(d.to_string()),
                x509_parser::extensions::GeneralName::IPAddress(ip) => {
                    if let Some(addr) = ip_of(ip) {
                        names.push(addr.to_string());
                    }
                }
                _ => {}
            }
        }
    }
    Ok(CertInfo {
        subject,
        names,
        not_after: x509.validity().not_after.timestamp(),
    })
}

/// Whether `n` is a host name a certificate may carry: labels of letters, digits and '-'
/// (not at either end), separated by dots.
fn dns_name(n: &str) -> bool {
    !n.is_empty()
        && n.len() <= 253
        && n.split('.').all(|label| {
            !label.is_empty()
                && label.len() <= 63
                && !label.starts_with('-')
                && !label.ends_with('-')
                && label
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'-')
        })
}

fn ip_of(bytes: &[u8]) -> Option<std::net::IpAddr> {
    match bytes.len() {
        4 => <[u8; 4]>::try_from(bytes).ok().map(std::net::IpAddr::from),
        16 => <[u8; 16]>::try_from(bytes).ok().map(std::net::IpAddr::from),
        _ => None,
    }
}

/// The DER bytes of the first certificate in `pem`.
fn der(pem: &str) -> Result<Vec<u8>, CertError> {
    let (_, parsed) =
        x509_parser::pem::parse_x509_pem(pem.as_bytes()).map_err(|e| cert("reading PEM", e))?;
    Ok(parsed.contents)
}

fn name(common_name: &str) -> DistinguishedName {
    let mut dn = DistinguishedName::new();
    dn.push(DnType::CommonName, common_name);
    dn.push(DnType::OrganizationName, "Herd");
    dn
}

/// Writes `text` to `path` with mode 0600 (created so; an existing file is replaced through a
/// temporary one, so a reader never sees half a key, and keeps its owner when the writer may
/// give it: a `ca.crt` the servers' OS user reads stays readable to it across
/// `herd certs rotate`).
pub fn write_private(path: &Path, text: &str) -> Result<(), CertError> {
    use std::io::Write as _;
    use std::os::unix::fs::MetadataExt as _;
    use std::os::unix::fs::OpenOptionsExt as _;
    let owner = std::fs::metadata(path).ok().map(|m| (m.uid(), m.gid()));
    let tmp = path.with_extension("tmp");
    let _ = std::fs::remove_file(&tmp);
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&tmp)
        .map_err(|e| io("creating", &tmp, e))?;
    f.write_all(text.as_bytes())
        .and_then(|()| f.sync_all())
        .map_err(|e| io("writing", &tmp, e))?;
    if let Some((uid, gid)) = owner {
        // Only root may give a file away; others write files that are theirs already.
        let _ = std::os::unix::fs::fchown(&f, Some(uid), Some(gid));
    }
    std::fs::rename(&tmp, path).map_err(|e| io("renaming into", path, e))
}

pub mod rotate;

#[cfg(test)]
mod tests;
