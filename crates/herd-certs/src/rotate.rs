//! `herd certs rotate`: replacing the cluster's CA without a moment where two members distrust
//! each other, in three steps an operator runs in order (see docs/multi-host.md, "`herd certs
//! rotate`"):
//!
//! 1. stage: the next CA is made (`ca.next.crt`, `ca.next.key`) and `ca.crt` becomes a bundle,
//!    this CA then the next, so every reader trusts both;
//! 2. issue: a flag in the store; each agent issues its certificate from the next CA;
//! 3. finish: once every member's record shows a certificate of the next CA, it becomes the
//!    only one (`ca.crt`, `ca.key`), the old pair kept as `ca.old.crt`, `ca.old.key`.
//!
//! [`may_run`] decides which step may run from the files and the member records (pure); the
//! file changes are [`stage`] and [`finish`].

use std::path::Path;

use crate::{io, pem_blocks, write_private, CertError, ClusterCa, CA_CERT, CA_KEY};

/// The next CA's certificate, while a rotation is under way.
pub const CA_NEXT_CERT: &str = "ca.next.crt";
/// The next CA's key.
pub const CA_NEXT_KEY: &str = "ca.next.key";
/// The CA replaced by the last rotation (kept for a rollback).
pub const CA_OLD_CERT: &str = "ca.old.crt";
/// Its key.
pub const CA_OLD_KEY: &str = "ca.old.key";

/// A step of the rotation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    /// Make the next CA and trust both.
    Stage,
    /// Ask every agent to issue its certificate from the next CA.
    Issue,
    /// Make the next CA the only one.
    Finish,
}

/// What the secrets directory holds, as the rotation sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Files {
    /// `ca.crt` is there.
    pub ca: bool,
    /// `ca.key` is there (not with an operator's own CA kept off the hosts).
    pub ca_key: bool,
    /// `ca.next.crt` and `ca.next.key` are there.
    pub next: bool,
    /// `ca.crt` holds the next CA's certificate too.
    pub bundled: bool,
}

impl Files {
    /// Looks at `secrets`.
    pub fn read(secrets: &Path) -> Result<Files, CertError> {
        let ca_path = secrets.join(CA_CERT);
        let next_path = secrets.join(CA_NEXT_CERT);
        let read = |p: &Path| std::fs::read_to_string(p).map_err(|e| io("reading", p, e));
        let ca = ca_path.exists();
        let next = next_path.exists() && secrets.join(CA_NEXT_KEY).exists();
        let bundled = if ca && next {
            let next_pem = read(&next_path)?;
            let blocks = pem_blocks(&read(&ca_path)?);
            pem_blocks(&next_pem)
                .first()
                .is_some_and(|n| blocks.iter().any(|b| b == n))
        } else {
            false
        };
        Ok(Files {
            ca,
            ca_key: secrets.join(CA_KEY).exists(),
            next,
            bundled,
        })
    }
}

/// A member's server certificate as its record in the store shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MemberIssuer {
    /// The member's name (with its shard group when the cluster has several).
    pub name: String,
    /// The fingerprint of the CA that issued its certificate (`None`: not reported).
    pub issuer: Option<String>,
    /// The fingerprints of the CAs its `ca.crt` holds, as its agent last read it.
    pub trusts: Vec<String>,
}

/// Why a step may not run now.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    /// The cluster has no CA.
    #[error("no CA in the secrets directory (ca.crt): `herd certs init` makes one")]
    NoCa,
    /// The CA's key is not on this host.
    #[error(
        "ca.key is not in the secrets directory: run the rotation where the CA's key is (an \
         operator's own CA kept off the hosts is rotated by hand with `herd certs issue`)"
    )]
    NoCaKey,
    /// `--stage` ran already.
    #[error(
        "a rotation is under way (ca.next.crt is there): run `herd certs rotate --issue`, then \
         `--finish`"
    )]
    Underway,
    /// `--issue` or `--finish` before `--stage`.
    #[error("no rotation is under way (no ca.next.crt, ca.next.key): run `herd certs rotate --stage` first")]
    NotStaged,
    /// The next CA is there but `ca.crt` does not trust it.
    #[error(
        "ca.crt does not hold the next CA (ca.next.crt): this secrets directory is not the one \
         `--stage` wrote; copy that one here"
    )]
    NotBundled,
    /// Members whose `ca.crt` does not hold the next CA yet.
    #[error(
        "{} do not trust the next CA yet: copy the secrets directory `--stage` wrote to their \
         hosts (their agents read ca.crt again within a round), then run `--issue` again",
        .0.join(", ")
    )]
    NotTrusted(Vec<String>),
    /// `--finish` before `--issue`.
    #[error("the agents were not asked to issue from the next CA: run `herd certs rotate --issue` first")]
    NotIssued,
    /// Members still serve a certificate of another CA.
    #[error(
        "{} still serve a certificate of the old CA (or report none): wait for their agents to \
         issue from the next CA (they do within a few seconds of `--issue`; `herd status --dcs` \
         shows each one's issuer), then run `--finish` again",
        .0.join(", ")
    )]
    OldCa(Vec<String>),
}

/// Whether `step` may run given the secrets `files`, whether the store's issue flag is set,
/// the members' records and the next CA's fingerprint (`next_fp`, when there is one). `--issue`
/// waits until every member trusts the next CA (else a member still on the old `ca.crt` would
/// refuse the certificates the others issue themselves).
pub fn may_run(
    step: Step,
    files: &Files,
    issuing: bool,
    members: &[MemberIssuer],
    next_fp: Option<&str>,
) -> Result<(), Refusal> {
    if !files.ca {
        return Err(Refusal::NoCa);
    }
    if !files.ca_key {
        return Err(Refusal::NoCaKey);
    }
    match step {
        Step::Stage if files.next => Err(Refusal::Underway),
        Step::Stage => Ok(()),
        Step::Issue | Step::Finish if !files.next => Err(Refusal::NotStaged),
        Step::Issue | Step::Finish if !files.bundled => Err(Refusal::NotBundled),
        Step::Issue => {
            let strangers: Vec<String> = members
                .iter()
                .filter(|m| !next_fp.is_some_and(|fp| m.trusts.iter().any(|t| t == fp)))
                .map(|m| m.name.clone())
                .collect();
            if strangers.is_empty() {
                Ok(())
            } else {
                Err(Refusal::NotTrusted(strangers))
            }
        }
        Step::Finish if !issuing => Err(Refusal::NotIssued),
        Step::Finish => {
            let old: Vec<String> = members
                .iter()
                .filter(|m| next_fp.is_none() || m.issuer.as_deref() != next_fp)
                .map(|m| m.name.clone())
                .collect();
            if old.is_empty() {
                Ok(())
            } else {
                Err(Refusal::OldCa(old))
            }
        }
    }
}

/// `--stage`: makes the next CA in `secrets` (`ca.next.crt`, `ca.next.key`, 0600) and writes
/// `ca.crt` as this CA then the next. Answers the next CA's fingerprint.
pub fn stage(secrets: &Path, cluster: &str) -> Result<String, CertError> {
    let current = ClusterCa::load(secrets)?
        .ok_or_else(|| CertError::Cert("no CA in the secrets directory".into()))?;
    let next = ClusterCa::generate(cluster)?;
    write_private(&secrets.join(CA_NEXT_KEY), &next.key_pem)?;
    write_private(&secrets.join(CA_NEXT_CERT), &next.cert_pem)?;
    write_private(
        &secrets.join(CA_CERT),
        &format!("{}{}", current.cert_pem, next.cert_pem),
    )?;
    crate::fingerprint(&next.cert_pem)
}

/// The next CA's fingerprint, when a rotation is under way.
pub fn next_fingerprint(secrets: &Path) -> Result<Option<String>, CertError> {
    let path = secrets.join(CA_NEXT_CERT);
    if !path.exists() {
        return Ok(None);
    }
    let pem = std::fs::read_to_string(&path).map_err(|e| io("reading", &path, e))?;
    crate::fingerprint(&pem).map(Some)
}

/// The next CA (certificate and key), when a rotation is under way.
pub fn load_next(secrets: &Path) -> Result<Option<ClusterCa>, CertError> {
    let (crt, key) = (secrets.join(CA_NEXT_CERT), secrets.join(CA_NEXT_KEY));
    if !crt.exists() || !key.exists() {
        return Ok(None);
    }
    let read = |p: &Path| std::fs::read_to_string(p).map_err(|e| io("reading", p, e));
    Ok(Some(ClusterCa {
        cert_pem: read(&crt)?,
        key_pem: read(&key)?,
    }))
}

/// `--finish`: the old pair is kept as `ca.old.crt`, `ca.old.key`; the next becomes `ca.crt`,
/// `ca.key` (the only CA trusted); `ca.next.*` are removed.
pub fn finish(secrets: &Path) -> Result<(), CertError> {
    let old = ClusterCa::load(secrets)?
        .ok_or_else(|| CertError::Cert("no CA in the secrets directory".into()))?;
    let next = load_next(secrets)?.ok_or_else(|| CertError::Cert("no ca.next.crt".into()))?;
    write_private(&secrets.join(CA_OLD_KEY), &old.key_pem)?;
    write_private(&secrets.join(CA_OLD_CERT), &old.cert_pem)?;
    // The key first: a crash between the two leaves ca.crt still trusting both.
    write_private(&secrets.join(CA_KEY), &next.key_pem)?;
    write_private(&secrets.join(CA_CERT), &next.cert_pem)?;
    for f in [CA_NEXT_CERT, CA_NEXT_KEY] {
        let p = secrets.join(f);
        std::fs::remove_file(&p).map_err(|e| io("removing", &p, e))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn files(ca: bool, ca_key: bool, next: bool, bundled: bool) -> Files {
        Files {
            ca,
            ca_key,
            next,
            bundled,
        }
    }

    fn member(name: &str, issuer: Option<&str>) -> MemberIssuer {
        MemberIssuer {
            name: name.into(),
            issuer: issuer.map(Into::into),
            trusts: vec!["O".into(), "N".into()],
        }
    }

    /// A step, the files, the issue flag, the member records, and the decision wanted.
    type Case<'a> = (Step, Files, bool, &'a [MemberIssuer], Result<(), Refusal>);

    #[test]
    fn each_step_runs_only_in_its_turn() {
        use Refusal::*;
        use Step::*;
        let on_next = [member("h0", Some("N")), member("h1", Some("N"))];
        let mixed = [
            member("h0", Some("N")),
            member("h1", Some("O")),
            member("h2", None),
        ];
        let mut not_copied = mixed.clone();
        not_copied[1].trusts = vec!["O".into()];
        not_copied[2].trusts = Vec::new();
        let fresh = files(true, true, false, false);
        let staged = files(true, true, true, true);
        let cases: Vec<Case> = vec![
            (
                Stage,
                files(false, false, false, false),
                false,
                &[],
                Err(NoCa),
            ),
            (
                Stage,
                files(true, false, false, false),
                false,
                &[],
                Err(NoCaKey),
            ),
            (Stage, fresh, false, &[], Ok(())),
            (Stage, staged, false, &[], Err(Underway)),
            (Stage, staged, true, &on_next, Err(Underway)),
            (Issue, fresh, false, &[], Err(NotStaged)),
            (
                Issue,
                files(true, true, true, false),
                false,
                &[],
                Err(NotBundled),
            ),
            (Issue, staged, false, &mixed, Ok(())),
            (Issue, staged, true, &mixed, Ok(())),
            (
                Issue,
                staged,
                false,
                &not_copied,
                Err(NotTrusted(vec!["h1".into(), "h2".into()])),
            ),
            (Finish, fresh, false, &on_next, Err(NotStaged)),
            (Finish, staged, false, &on_next, Err(NotIssued)),
            (
                Finish,
                staged,
                true,
                &mixed,
                Err(OldCa(vec!["h1".into(), "h2".into()])),
            ),
            (Finish, staged, true, &on_next, Ok(())),
            (Finish, staged, true, &[], Ok(())),
        ];
        for (step, f, issuing, members, want) in cases {
            assert_eq!(
                may_run(step, &f, issuing, members, Some("N")),
                want,
                "{step:?} {f:?} issuing={issuing} {members:?}"
            );
        }
        let named = may_run(Finish, &staged, true, &mixed, Some("N"))
            .expect_err("refused")
            .to_string();
        assert!(named.starts_with("h1, h2 still serve"), "{named}");
    }

    #[test]
    fn stage_then_finish_leaves_the_next_ca_alone_and_the_old_kept() {
        use std::os::unix::fs::PermissionsExt as _;
        let dir = tempfile::tempdir().expect("dir");
        let secrets = dir.path();
        let old = ClusterCa::load_or_make(secrets, "t").expect("CA");
        let before = Files::read(secrets).expect("files");
        assert_eq!(before, files(true, true, false, false));
        let leaf_old = old.issue("h0", &["10.0.0.1".into()]).expect("old leaf");
        let fp = stage(secrets, "t").expect("stage");
        assert_eq!(
            Files::read(secrets).expect("files"),
            files(true, true, true, true)
        );
        for f in [CA_CERT, CA_NEXT_CERT, CA_NEXT_KEY] {
            let mode = std::fs::metadata(secrets.join(f))
                .expect(f)
                .permissions()
                .mode();
            assert_eq!(mode & 0o777, 0o600, "{f}");
        }
        let bundle = std::fs::read_to_string(secrets.join(CA_CERT)).expect("bundle");
        assert_eq!(pem_blocks(&bundle).len(), 2);
        let next = load_next(secrets).expect("next").expect("there");
        let leaf_new = next.issue("h1", &["10.0.0.2".into()]).expect("new leaf");
        // The bundle trusts both; the loaded CA is still the old (its key is ca.key's).
        assert!(crate::issued_by(&leaf_old.cert_pem, &bundle));
        assert!(crate::issued_by(&leaf_new.cert_pem, &bundle));
        assert_eq!(
            crate::issuer_fingerprint(&leaf_new.cert_pem, &bundle),
            Some(fp.clone())
        );
        let loaded = ClusterCa::load(secrets).expect("load").expect("there");
        assert_eq!(loaded.cert_pem, old.cert_pem);
        finish(secrets).expect("finish");
        assert_eq!(
            Files::read(secrets).expect("files"),
            files(true, true, false, false)
        );
        let only = std::fs::read_to_string(secrets.join(CA_CERT)).expect("ca");
        assert_eq!(pem_blocks(&only).len(), 1);
        assert!(crate::issued_by(&leaf_new.cert_pem, &only));
        assert!(!crate::issued_by(&leaf_old.cert_pem, &only));
        assert_eq!(crate::fingerprint(&only).expect("fp"), fp);
        let kept = std::fs::read_to_string(secrets.join(CA_OLD_CERT)).expect("old");
        assert_eq!(kept, old.cert_pem);
        assert!(secrets.join(CA_OLD_KEY).exists());
    }
}
