//! TLS between clients and the endpoint: certificates made by `openssl` for a throwaway CA,
//! psql with `sslmode=verify-full` (and a wrong CA refused), a plain client refused when TLS is
//! required, psycopg 3 and node-postgres running their whole check suites over TLS, session
//! pooling over TLS, and a key file others can read refused before anything starts.

mod common;

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use common::cluster;
use common::process::{node_checks, psycopg_checks, require, run_bounded};
use herd_testkit::TestCluster;

/// How long one psql run may take.
const PSQL_TIMEOUT: Duration = Duration::from_secs(60);

/// Files of a throwaway certificate authority and a server certificate it signed for
/// `localhost` and `127.0.0.1`.
struct Certs {
    ca: PathBuf,
    /// A CA that signed nothing here (verify-full must refuse the server with it).
    other_ca: PathBuf,
}

fn openssl(dir: &Path, args: &[&str]) {
    let out = Command::new("openssl")
        .args(args)
        .current_dir(dir)
        .output()
        .unwrap_or_else(|e| panic!("running openssl {args:?}: {e}"));
    assert!(
        out.status.success(),
        "openssl {args:?}: {}",
        herd_testkit::describe(&out)
    );
}

/// Writes `tls/server.crt` and `tls/server.key` (0600) into `data_dir`, CA files beside.
fn make_certs(data_dir: &Path) -> Certs {
    require(
        Command::new("openssl").arg("version").output().is_ok(),
        "openssl",
    );
    let dir = data_dir.join("tls");
    std::fs::create_dir_all(&dir).expect("tls dir");
    let ec = [
        "-newkey",
        "ec",
        "-pkeyopt",
        "ec_paramgen_curve:prime256v1",
        "-nodes",
    ];
    for ca in ["ca", "other-ca"] {
        let (key, crt) = (format!("{ca}.key"), format!("{ca}.crt"));
        let mut args = vec!["req", "-x509"];
        args.extend_from_slice(&ec);
        args.extend_from_slice(&["-keyout", &key, "-out", &crt, "-days", "2"]);
        args.extend_from_slice(&[
            "-subj",
            "/CN=Herd test CA",
            "-addext",
            "basicConstraints=critical,CA:TRUE",
        ]);
        openssl(&dir, &args);
    }
    let mut args = vec!["req"];
    args.extend_from_slice(&ec);
    args.extend_from_slice(&[
        "-keyout",
        "server.key",
        "-out",
        "server.csr",
        "-subj",
        "/CN=localhost",
    ]);
    openssl(&dir, &args);
    std::fs::write(
        dir.join("server.ext"),
        "subjectAltName=DNS:localhost,IP:127.0.0.1\n",
    )
    .expect("ext file");
    openssl(
        &dir,
        &[
            "x509",
            "-req",
            "-in",
            "server.csr",
            "-CA",
            "ca.crt",
            "-CAkey",
            "ca.key",
            "-CAcreateserial",
            "-out",
            "server.crt",
            "-days",
            "2",
            "-extfile",
            "server.ext",
        ],
    );
    std::fs::set_permissions(
        dir.join("server.key"),
        std::fs::Permissions::from_mode(0o600),
    )
    .expect("chmod key");
    Certs {
        ca: dir.join("ca.crt"),
        other_ca: dir.join("other-ca.crt"),
    }
}

/// A herd.toml naming the certificate, relative to the data directory.
fn write_config(c: &TestCluster, extra: &str) {
    std::fs::write(
        c.data_dir().join("herd.toml"),
        format!(
            "[proxy]\ntls_cert_file = \"tls/server.crt\"\ntls_key_file = \"tls/server.key\"\n{extra}"
        ),
    )
    .expect("herd.toml");
}

/// `url` (as `herd url` prints it, `?sslmode=require`) with full verification against `ca`.
fn verify_full(url: &str, ca: &Path) -> String {
    assert!(
        url.ends_with("?sslmode=require"),
        "herd url should ask for TLS when the endpoint has it: {url}"
    );
    url.replace(
        "sslmode=require",
        &format!("sslmode=verify-full&sslrootcert={}", ca.display()),
    )
}

/// psql `-c` for each command, `-X -A -t`; returns (success, output).
fn psql(url: &str, commands: &[&str]) -> (bool, String) {
    let mut cmd = Command::new("psql");
    cmd.args(["-X", "-A", "-t", "-v", "ON_ERROR_STOP=1", "-d", url]);
    for c in commands {
        cmd.args(["-c", c]);
    }
    cmd.env("PGCONNECT_TIMEOUT", "10");
    run_bounded(cmd, PSQL_TIMEOUT)
}

#[test]
fn tls_required_endpoint_serves_psql_and_drivers_with_verify_full() {
    let c = cluster();
    let certs = make_certs(&c.data_dir());
    write_config(&c, "tls_required = true\n");
    c.up(&["--commit-mode", "async"]);
    let url = c.url(&[]);
    let verified = verify_full(&url, &certs.ca);

    // libpq with full verification: encrypted, writes and reads, a result far larger than
    // one TLS record (relayed through the encrypted backlog), COPY in.
    let (ok, out) = psql(
        &verified,
        &[
            "\\conninfo",
            "create table tls_t (id int primary key, pad text)",
            "insert into tls_t select g, repeat('x', 100) from generate_series(1, 20000) g",
            "select count(*), sum(length(pad)) from tls_t",
            "select string_agg(pad, '') from tls_t",
            "\\copy tls_t from program 'seq 20001 40000 | sed s/$/,y/' csv",
            "select count(*) from tls_t",
        ],
    );
    assert!(ok, "psql over TLS failed: {out}\n{}", c.log_tails());
    assert!(out.contains("SSL connection (protocol: TLSv1.3"), "{out}");
    assert!(out.contains("20000|2000000"), "{out}");
    assert!(out.contains("\n40000\n"), "{out}");
    assert!(
        out.lines().any(|l| l.len() == 2_000_000),
        "the 2 MB row did not arrive whole"
    );

    // The wrong CA: libpq refuses the server (verification is real).
    let (ok, out) = psql(&verify_full(&url, &certs.other_ca), &["select 1"]);
    assert!(
        !ok,
        "verify-full accepted a server its CA did not sign: {out}"
    );
    assert!(out.contains("certificate verify failed"), "{out}");

    // A plain client is refused with a reason it can act on.
    let plain = url.replace("sslmode=require", "sslmode=disable");
    let (ok, out) = psql(&plain, &["select 1"]);
    assert!(
        !ok,
        "a plain client was served though TLS is required: {out}"
    );
    assert!(out.contains("accepts only TLS"), "{out}");

    // Two whole driver suites (transactions, COPY, cancel, pipelining, errors…) over TLS.
    let primary = c.url(&["--primary"]);
    let (ok, out) = psycopg_checks(&verified, &primary);
    assert!(ok, "psycopg over TLS failed: {out}\n{}", c.log_tails());
    // libpq 17+ cancels over TLS and expects a clean TLS close after it.
    assert!(!out.contains("SSL error"), "{out}");
    println!("{out}");
    let (ok, out) = node_checks(&verified, &primary);
    assert!(
        ok,
        "node-postgres over TLS failed: {out}\n{}",
        c.log_tails()
    );
    println!("{out}");

    let metrics = common::api_get_text(c.api_port(), "/metrics");
    assert!(
        !metrics.contains("herd_tls_handshake_failures_total")
            || metrics.contains("herd_tls_handshake_failures_total 1\n"),
        "handshakes failed beyond the wrong-CA one:\n{metrics}"
    );
}

#[test]
fn tls_offered_with_session_pooling_and_a_readable_key_refused() {
    let c = cluster();
    let certs = make_certs(&c.data_dir());
    write_config(&c, "pool_mode = \"session\"\n");
    let key = c.data_dir().join("tls/server.key");
    std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o644)).expect("chmod");
    let port = c.port.to_string();
    let out = c.herd(&["up", "--detach", "--port", &port, "--replicas", "1"]);
    let text = herd_testkit::describe(&out);
    assert!(
        !out.status.success(),
        "herd up started with a readable key: {text}"
    );
    assert!(text.contains("chmod 600"), "{text}");
    assert!(
        !c.data_dir().join("state.json").exists(),
        "a cluster was created before the key was checked"
    );

    std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o600)).expect("chmod");
    c.up(&["--replicas", "1"]);
    let url = c.url(&[]);
    let verified = verify_full(&url, &certs.ca);
    // Session pooling: the session's server keeps its state across transactions.
    let (ok, out) = psql(
        &verified,
        &[
            "\\conninfo",
            "set application_name = 'tls-session'",
            "create temp table tmp_tls (v int)",
            "insert into tmp_tls values (1), (2)",
            "select sum(v), current_setting('application_name') from tmp_tls",
        ],
    );
    assert!(
        ok,
        "psql over TLS in session pooling failed: {out}\n{}",
        c.log_tails()
    );
    assert!(out.contains("SSL connection"), "{out}");
    assert!(out.contains("3|tls-session"), "{out}");
    // TLS offered, not required: libpq's default (prefer) gets TLS, sslmode=disable plain text.
    let prefer = url.replace("?sslmode=require", "");
    let (ok, out) = psql(&prefer, &["\\conninfo"]);
    assert!(ok && out.contains("SSL connection"), "{out}");
    let (ok, out) = psql(
        &url.replace("sslmode=require", "sslmode=disable"),
        &["\\conninfo", "select 41 + 1"],
    );
    assert!(ok, "{out}");
    assert!(
        !out.contains("SSL connection") && out.contains("42"),
        "{out}"
    );
}
