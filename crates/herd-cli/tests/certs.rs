//! `herd certs` (issue #42): the cluster's CA made in the secrets directory (0600), a server
//! certificate issued from it, and a real PostgreSQL 15 server serving TLS with that
//! certificate: psql with `sslmode=verify-full` and the cluster's CA connects over TLS, and
//! with another cluster's CA it is refused. `herd certs show` lists both with their days left;
//! bad input is a clear error.

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use herd_pg::{OsUser, Pg, PgBinaries, StopMode};

const HERD: &str = env!("CARGO_BIN_EXE_herd");

/// Runs `herd ARGS`; (exit code, stdout + stderr).
fn herd(args: &[&str], data: &Path) -> (Option<i32>, String) {
    let mut cmd = Command::new(HERD);
    cmd.args(args).arg("--data-dir").arg(data);
    let out = herd_testkit::output_within(&mut cmd, Duration::from_secs(60)).expect("herd exits");
    (
        out.status.code(),
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ),
    )
}

/// psql's answer to `select ssl from pg_stat_ssl …` over `conninfo`; Err with its message.
fn psql(bins: &PgBinaries, conninfo: &str) -> Result<String, String> {
    let mut cmd = Command::new(bins.program("psql"));
    cmd.args(["-X", "-A", "-t", "-d", conninfo, "-c"])
        .arg("select ssl from pg_stat_ssl where pid = pg_backend_pid()")
        .env("PGPASSWORD", "certs")
        .env("PGCONNECT_TIMEOUT", "10");
    let out = herd_testkit::output_within(&mut cmd, Duration::from_secs(30)).expect("psql exits");
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
    } else {
        Err(String::from_utf8_lossy(&out.stderr).into_owned())
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_certificate_from_the_cluster_ca_serves_verified_tls() {
    let dir = herd_testkit::scratch_dir();
    let data = dir.path().join("herd-data");
    let other = dir.path().join("other-data");

    // Bad input first: no CA yet, a name that is not a host name.
    let tls = data.join("tls");
    let tls_arg = tls.to_str().expect("utf-8 path");
    let (code, out) = herd(
        &[
            "certs",
            "issue",
            "node0",
            "--host",
            "127.0.0.1",
            "--out",
            tls_arg,
        ],
        &data,
    );
    assert_eq!(code, Some(1), "{out}");
    assert!(out.contains("herd certs init"), "{out}");

    let (code, out) = herd(&["certs", "init", "--cluster", "test"], &data);
    assert_eq!(code, Some(0), "{out}");
    assert!(out.contains("made the CA"), "{out}");
    for f in ["ca.crt", "ca.key"] {
        let mode = std::fs::metadata(data.join("secrets").join(f))
            .expect("CA file")
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600, "{f}");
    }
    let (code, out) = herd(&["certs", "init"], &data);
    assert_eq!(code, Some(0), "{out}");
    assert!(out.contains("kept the CA"), "{out}");
    let (code, out) = herd(
        &[
            "certs",
            "issue",
            "node0",
            "--host",
            "no such name!",
            "--out",
            tls_arg,
        ],
        &data,
    );
    assert_eq!(code, Some(1), "{out}");
    let (code, out) = herd(
        &[
            "certs",
            "issue",
            "node0",
            "--host",
            "127.0.0.1",
            "--host",
            "localhost",
            "--out",
            tls_arg,
        ],
        &data,
    );
    assert_eq!(code, Some(0), "{out}");
    let (code, out) = herd(&["certs", "init", "--cluster", "other"], &other);
    assert_eq!(code, Some(0), "{out}");

    // A real server with that certificate.
    let bins = PgBinaries::locate(None).expect("PostgreSQL 15 binaries");
    let pg = Pg::new(
        bins.clone(),
        OsUser::for_servers("postgres").expect("OS user"),
    );
    pg.hand_over(dir.path()).expect("chown");
    let pwfile = dir.path().join("pw");
    std::fs::write(&pwfile, "certs").expect("password file");
    pg.hand_over(&pwfile).expect("chown");
    let pgdata = dir.path().join("pg");
    pg.initdb(&pgdata, "postgres", &pwfile)
        .await
        .expect("initdb");
    for f in ["node0.crt", "node0.key"] {
        std::fs::copy(tls.join(f), pgdata.join(f)).expect("copy");
        std::fs::set_permissions(pgdata.join(f), std::fs::Permissions::from_mode(0o600))
            .expect("mode");
        pg.hand_over(&pgdata.join(f)).expect("chown");
    }
    let port = herd_testkit::free_port_block(1);
    let mut conf = std::fs::read_to_string(pgdata.join("postgresql.conf")).expect("conf");
    conf.push_str(&format!(
        "port = {port}\nlisten_addresses = '127.0.0.1'\nunix_socket_directories = '{}'\n\
         ssl = on\nssl_cert_file = 'node0.crt'\nssl_key_file = 'node0.key'\n",
        dir.path().display()
    ));
    std::fs::write(pgdata.join("postgresql.conf"), conf).expect("conf");
    pg.start(&pgdata, &dir.path().join("pg.log"))
        .await
        .expect("the server starts with the issued certificate");

    let verified = |ca: &Path, host: &str| {
        format!(
            "host={host} port={port} user=postgres dbname=postgres sslmode=verify-full \
             sslrootcert={}",
            ca.display()
        )
    };
    let ca = data.join("secrets/ca.crt");
    let result = psql(&bins, &verified(&ca, "127.0.0.1"));
    let result2 = psql(&bins, &verified(&ca, "localhost"));
    let refused = psql(&bins, &verified(&other.join("secrets/ca.crt"), "127.0.0.1"));
    let (code, shown) = herd(&["certs", "show"], &data);
    let _ = pg.stop(&pgdata, StopMode::Immediate).await;

    assert_eq!(
        result.as_deref(),
        Ok("t"),
        "TLS verified by the cluster's CA"
    );
    assert_eq!(result2.as_deref(), Ok("t"), "by the DNS name too");
    let why = refused.expect_err("another CA is refused");
    assert!(why.contains("certificate verify failed"), "{why}");
    assert_eq!(code, Some(0), "{shown}");
    assert!(shown.contains("Herd cluster CA (test)"), "{shown}");
    assert!(shown.contains("node0 [127.0.0.1, localhost]"), "{shown}");
    assert!(shown.contains("days left"), "{shown}");
}
