use std::os::unix::fs::PermissionsExt;
use std::process::Command;

use super::*;

fn now() -> i64 {
    OffsetDateTime::now_utc().unix_timestamp()
}

/// `openssl verify` of `leaf` against `ca` (an independent check of the chain), when the
/// openssl program is installed.
fn openssl_verifies(dir: &Path, ca: &str, leaf: &str) -> Option<bool> {
    std::fs::write(dir.join("v-ca.crt"), ca).ok()?;
    std::fs::write(dir.join("v-leaf.crt"), leaf).ok()?;
    let out = Command::new("openssl")
        .args(["verify", "-CAfile"])
        .arg(dir.join("v-ca.crt"))
        .arg(dir.join("v-leaf.crt"))
        .output()
        .ok()?;
    Some(out.status.success())
}

#[test]
fn a_ca_issues_certificates_for_the_names_asked() {
    let dir = tempfile::tempdir().expect("dir");
    let ca = ClusterCa::load_or_make(dir.path(), "prod").expect("CA");
    for f in [CA_CERT, CA_KEY] {
        let mode = std::fs::metadata(dir.path().join(f))
            .expect("file")
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600, "{f}");
    }
    // Loaded again, the same CA.
    let again = ClusterCa::load_or_make(dir.path(), "prod").expect("CA");
    assert_eq!(again.cert_pem, ca.cert_pem);
    let ca_info = info(&ca.cert_pem).expect("CA info");
    assert_eq!(ca_info.subject, "Herd cluster CA (prod)");
    assert!(ca_info.days_left(now()) > 3600);

    let names = vec!["db1.example".to_string(), "10.0.0.7".to_string()];
    let issued = ca.issue("h1", &names).expect("issued");
    let got = info(&issued.cert_pem).expect("info");
    assert_eq!(got.subject, "h1");
    assert_eq!(got.names, names);
    assert!((360..=366).contains(&got.days_left(now())), "{got:?}");
    assert!(issued_by(&issued.cert_pem, &ca.cert_pem));
    let other = ClusterCa::generate("other").expect("CA");
    assert!(!issued_by(&issued.cert_pem, &other.cert_pem));
    if let Some(ok) = openssl_verifies(dir.path(), &ca.cert_pem, &issued.cert_pem) {
        assert!(ok, "openssl verify");
        assert_eq!(
            openssl_verifies(dir.path(), &other.cert_pem, &issued.cert_pem),
            Some(false)
        );
    }
    assert!(ca.issue("bad", &["not a name!".to_string()]).is_err());
}

#[test]
fn certificates_are_renewed_when_missing_expiring_renamed_or_from_another_ca() {
    let dir = tempfile::tempdir().expect("dir");
    let ca = ClusterCa::generate("c").expect("CA");
    let (crt, key) = (dir.path().join("server.crt"), dir.path().join("server.key"));
    let names = vec!["127.0.0.1".to_string()];
    let t = now();
    assert_eq!(
        ensure_issued(&ca, &crt, &key, "h", &names, t).expect("first"),
        Some(Renewal::Missing)
    );
    let mode = std::fs::metadata(&key).expect("key").permissions().mode();
    assert_eq!(mode & 0o777, 0o600);
    let first = std::fs::read_to_string(&crt).expect("cert");
    assert_eq!(
        ensure_issued(&ca, &crt, &key, "h", &names, t).expect("again"),
        None
    );
    assert_eq!(std::fs::read_to_string(&crt).expect("cert"), first);
    // 340 days later it is within the renewal window.
    assert_eq!(
        ensure_issued(&ca, &crt, &key, "h", &names, t + 340 * 86_400).expect("later"),
        Some(Renewal::Expiring)
    );
    let more = vec!["127.0.0.1".to_string(), "h.example".to_string()];
    assert_eq!(
        ensure_issued(&ca, &crt, &key, "h", &more, t).expect("renamed"),
        Some(Renewal::Names)
    );
    let replaced = ClusterCa::generate("c").expect("CA");
    assert_eq!(
        ensure_issued(&replaced, &crt, &key, "h", &more, t).expect("new CA"),
        Some(Renewal::OtherCa)
    );
    let pem = std::fs::read_to_string(&crt).expect("cert");
    assert!(issued_by(&pem, &replaced.cert_pem));
}

#[test]
fn bad_files_are_clear_errors() {
    let dir = tempfile::tempdir().expect("dir");
    assert!(ClusterCa::load(dir.path()).expect("none").is_none());
    std::fs::write(dir.path().join(CA_CERT), "not a certificate").expect("write");
    // The key is missing: an error naming the file, not a new CA over the operator's.
    let e = ClusterCa::load(dir.path()).expect_err("missing key");
    assert!(e.to_string().contains(CA_KEY), "{e}");
    assert!(info("garbage").is_err());
    std::fs::write(dir.path().join(CA_KEY), "not a key").expect("write");
    let ca = ClusterCa::load(dir.path()).expect("read").expect("some");
    assert!(ca.issue("h", &[]).is_err());
}

#[test]
fn check_says_why_a_kept_certificate_cannot_serve() {
    let ca = ClusterCa::generate("prod").expect("CA");
    let other = ClusterCa::generate("other").expect("other CA");
    let good = ca.issue("h1", &["10.0.0.1".into()]).expect("issue");
    let stranger = other.issue("h1", &["10.0.0.1".into()]).expect("issue");
    let names = vec!["10.0.0.1".to_string()];
    let more = vec!["10.0.0.1".to_string(), "db1".to_string()];
    let now = now();
    let not_after = info(&good.cert_pem).expect("info").not_after;
    // (certificate, key present, names, at, expected)
    type Case<'a> = (Option<&'a str>, bool, &'a [String], i64, Result<(), Unfit>);
    let cases: Vec<Case> = vec![
        (Some(&good.cert_pem), true, &names, now, Ok(())),
        (None, true, &names, now, Err(Unfit::Missing)),
        (
            Some(&good.cert_pem),
            false,
            &names,
            now,
            Err(Unfit::KeyMissing),
        ),
        (
            Some(&stranger.cert_pem),
            true,
            &names,
            now,
            Err(Unfit::OtherCa),
        ),
        (
            Some(&good.cert_pem),
            true,
            &names,
            not_after,
            Err(Unfit::Expired(0)),
        ),
        (
            Some(&good.cert_pem),
            true,
            &names,
            not_after + 3 * 86_400 + 5,
            Err(Unfit::Expired(3)),
        ),
        (
            Some(&good.cert_pem),
            true,
            &more,
            now,
            Err(Unfit::Names(vec!["db1".into()])),
        ),
    ];
    for (pem, key, names, at, want) in cases {
        let got = check(pem, key, &ca.cert_pem, names, at).map(drop);
        assert_eq!(got, want, "{pem:?} key={key} {names:?} at {at}");
    }
    assert!(matches!(
        check(Some("junk"), true, &ca.cert_pem, &names, now),
        Err(Unfit::Unreadable(_))
    ));
    assert_eq!(Unfit::Expired(3).to_string(), "expired 3 days ago");
}
