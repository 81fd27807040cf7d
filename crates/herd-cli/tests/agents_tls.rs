//! TLS between the hosts (issue #42, part 2): three `herd agent`s on loopback whose secrets
//! directory holds the cluster's CA (`herd certs init`). Each agent issues its server's
//! certificate at start; the primary sees every standby stream over TLS (`pg_stat_ssl`), the
//! standbys verify it (`sslmode=verify-full` in `primary_conninfo`); a member whose CA is
//! another cluster's cannot clone nor stream, and its log says why; an agent with the CA's
//! certificate but neither its key nor an issued certificate refuses to start, naming the file
//! and the `herd certs issue` command.

mod common;

use std::os::unix::fs::{MetadataExt as _, PermissionsExt as _};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::hosts::{copy_dir, Hosts, HERD};
use herd_testkit::netns::Lab;
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;

/// Runs `herd ARGS` (60 s at most); (exit code, stdout + stderr).
fn herd(args: &[&str]) -> (Option<i32>, String) {
    let mut cmd = Command::new(HERD);
    cmd.args(args);
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

/// Stops an agent started by the test (SIGTERM, then SIGKILL after 20 s).
fn stop(mut child: std::process::Child) {
    let _ = kill(Pid::from_raw(child.id() as i32), Signal::SIGTERM);
    let deadline = Instant::now() + Duration::from_secs(20);
    while child.try_wait().ok().flatten().is_none() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(100));
    }
    let _ = child.kill();
    let _ = child.wait();
}

/// Three hosts (on loopback, or in `lab`'s namespaces) whose first host's secrets hold the
/// cluster's CA (copied to the others, CA key included, so each agent issues its own
/// certificate), and a proxy; returns once the primary sees both standbys stream over TLS.
async fn with_a_ca(lab: Option<Lab>) -> Hosts {
    let mut hosts = Hosts::prepare(lab, None);
    let first = hosts.agent_dir(0);
    let layout = herd_cluster::Layout::new(&first);
    herd_cluster::Secrets::generate()
        .save(&layout, herd_cluster::REPLICATION_USER)
        .expect("secrets");
    let first_arg = first.to_str().expect("utf-8 path").to_string();
    let (code, out) = herd(&[
        "certs",
        "init",
        "--cluster",
        "tls",
        "--data-dir",
        &first_arg,
    ]);
    assert_eq!(code, Some(0), "{out}");
    hosts.start_members();
    hosts.start_proxy();
    hosts.wait_proxy_listening();
    let primary = hosts.wait_primary("with TLS on");
    // Every standby streams over TLS, as the primary sees it.
    let client = superuser_over_tls(&hosts, primary).await;
    let over_tls = "select count(*) filter (where ssl), count(*) \
                    from pg_stat_ssl join pg_stat_replication using (pid)";
    let mut seen = (0, 0);
    let deadline = Instant::now() + Duration::from_secs(60);
    while seen != (2, 2) {
        assert!(
            Instant::now() < deadline,
            "standbys streaming over TLS / all: {seen:?}\n{}",
            hosts.logs()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
        let row = client.query_one(over_tls, &[]).await.expect("pg_stat_ssl");
        seen = (row.get::<_, i64>(0), row.get::<_, i64>(1));
    }
    hosts
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replication_runs_over_verified_tls_and_a_stranger_cannot_join() {
    let mut hosts = with_a_ca(None).await;
    let over_tls = "select count(*) filter (where ssl), count(*) \
                    from pg_stat_ssl join pg_stat_replication using (pid)";
    let first = hosts.agent_dir(0);
    let primary = hosts.wait_primary("with TLS on");
    let client = common::try_connect(&hosts.node_url(primary))
        .await
        .expect("the primary answers");
    // Run as root, the agents give the files to the servers' OS user, whose PostgreSQL reads
    // them (it refuses a key others may read).
    let server_uid = herd_pg::OsUser::for_servers("postgres")
        .expect("OS user")
        .map(|u| u.uid());
    for i in 0..3 {
        let dir = hosts.agent_dir(i).join("tls");
        for f in [format!("h{i}.crt"), format!("h{i}.key")] {
            let meta = std::fs::metadata(dir.join(&f)).expect("the agent issued its certificate");
            assert_eq!(meta.permissions().mode() & 0o777, 0o600, "{f}");
            if let Some(uid) = server_uid {
                assert_eq!(meta.uid(), uid, "{f} belongs to the servers' OS user");
            }
        }
        let conf = std::fs::read_to_string(hosts.agent_dir(i).join("pgdata/herd.conf"))
            .expect("herd.conf");
        assert!(conf.contains("ssl = 'on'"), "{conf}");
        if i != primary {
            assert!(conf.contains("sslmode=verify-full"), "{conf}");
        }
    }
    // `herd status --dcs` shows each member's certificate's days left.
    let status = hosts.herd_store(&["status"]);
    assert!(
        status.contains("server certificates: ") && status.contains("h1 364 days"),
        "{status}"
    );
    // Clients through the proxy are served as before.
    let through = common::try_connect(&hosts.proxy_url())
        .await
        .expect("the proxy serves");
    through
        .batch_execute("create table t (x int); insert into t values (1)")
        .await
        .expect("a write through the proxy");
    // The proxy's pooled connection serving this session runs over TLS (the server's view of
    // its own backend), and so do the proxy's monitoring sessions and the agents' probes.
    let proxied_ssl = through
        .query_one(
            "select ssl from pg_stat_ssl where pid = pg_backend_pid()",
            &[],
        )
        .await
        .expect("pg_stat_ssl through the proxy");
    assert!(
        proxied_ssl.get::<_, bool>(0),
        "a proxied session reached the server without TLS"
    );
    // Messages larger than the sockets' buffers both ways over the proxy's TLS to the server
    // (its writes then wait with encrypted bytes held back, its reads span many records).
    let big = "x".repeat(8 << 20);
    through
        .execute("insert into t values (length($1::text))", &[&big])
        .await
        .expect("8 MiB to the server over TLS");
    let back = through
        .query_one("select repeat('y', 8 << 20)", &[])
        .await
        .expect("8 MiB from the server over TLS");
    assert_eq!(back.get::<_, String>(0).len(), 8 << 20);
    let own = "select application_name, bool_and(ssl), count(*) \
               from pg_stat_ssl join pg_stat_activity using (pid) \
               where application_name in ('herd-probe', 'herd-proxy-monitor') \
               group by 1 order by 1";
    let deadline = Instant::now() + Duration::from_secs(30);
    let sessions = loop {
        let rows = client.query(own, &[]).await.expect("pg_stat_activity");
        let seen: Vec<(String, bool, i64)> = rows
            .iter()
            .map(|r| (r.get(0), r.get(1), r.get(2)))
            .collect();
        if seen.len() == 2 || Instant::now() > deadline {
            break seen;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    eprintln!("Herd's own sessions on the primary (name, all over TLS, count): {sessions:?}");
    assert_eq!(
        sessions
            .iter()
            .map(|s| (s.0.as_str(), s.1))
            .collect::<Vec<_>>(),
        [("herd-probe", true), ("herd-proxy-monitor", true)],
        "{sessions:?}"
    );

    // A member whose secrets carry another cluster's CA: it issues itself a certificate of
    // that CA and verifies the primary's with it, which fails.
    let other = hosts.dir.path().join("other");
    let other_arg = other.to_str().expect("utf-8 path").to_string();
    let (code, out) = herd(&[
        "certs",
        "init",
        "--cluster",
        "other",
        "--data-dir",
        &other_arg,
    ]);
    assert_eq!(code, Some(0), "{out}");
    let stranger = hosts.dir.path().join("h3");
    copy_dir(&first.join("secrets"), &stranger.join("secrets"));
    for f in ["ca.crt", "ca.key"] {
        std::fs::copy(
            other.join("secrets").join(f),
            stranger.join("secrets").join(f),
        )
        .expect("the other CA");
    }
    let log_path = hosts.dir.path().join("h3.log");
    let log = std::fs::File::create(&log_path).expect("h3 log");
    let api = format!("127.0.0.1:{}", hosts.base + 7);
    let child = hosts
        .agent_command_as(0, "h3", &stranger, hosts.base + 3, &api)
        .stdout(log.try_clone().expect("log"))
        .stderr(log)
        .spawn()
        .expect("starting the stranger");
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut said = String::new();
    while !said.contains("certificate verify failed") && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(500));
        said = std::fs::read_to_string(&log_path).unwrap_or_default();
    }
    let streaming = client
        .query_one(
            "select count(*) from pg_stat_replication where application_name = 'h3'",
            &[],
        )
        .await
        .expect("pg_stat_replication")
        .get::<_, i64>(0);
    stop(child);
    let _ = herd_pg::kill_server(&stranger.join("pgdata"));
    assert!(
        said.contains("certificate verify failed"),
        "the stranger's log does not say why it cannot join:\n{said}"
    );
    if let Some(line) = said
        .lines()
        .find(|l| l.contains("certificate verify failed"))
    {
        eprintln!("the stranger says: {line}");
    }
    assert_eq!(streaming, 0, "a member of another CA streams");
    assert!(
        !stranger.join("pgdata/PG_VERSION").exists(),
        "a member of another CA cloned the primary"
    );
    a_proxy_of_another_ca_refuses_the_servers(&hosts, &other).await;

    // A change of primary over TLS, after the stranger above came and went (a member that
    // never streams stays out of the recorded sync set while another streams, so the
    // failover's quorum proof does not wait for it): the primary's agent stops (its server with it), a standby takes over, and the former
    // primary, started again, rejoins (pg_rewind, else a clone, both verifying the new
    // primary's certificate) and streams over TLS.
    drop((client, through));
    let child = hosts.agents[primary].take().expect("the primary's agent");
    stop(child);
    let deadline = Instant::now() + Duration::from_secs(60);
    let leader = loop {
        if let Some(p) = hosts.primary().filter(|p| *p != primary) {
            break p;
        }
        assert!(
            Instant::now() < deadline,
            "no new primary\n{}",
            hosts.logs()
        );
        std::thread::sleep(Duration::from_millis(200));
    };
    hosts.start_agent(primary);
    hosts.wait_role(primary, "replica", Duration::from_secs(90));
    let client = common::try_connect(&hosts.node_url(leader))
        .await
        .expect("the new primary answers");
    let mut seen = (0, 0);
    let deadline = Instant::now() + Duration::from_secs(60);
    while seen != (2, 2) {
        assert!(
            Instant::now() < deadline,
            "after the change of primary, standbys over TLS / all: {seen:?}\n{}",
            hosts.logs()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
        let row = client.query_one(over_tls, &[]).await.expect("pg_stat_ssl");
        seen = (row.get::<_, i64>(0), row.get::<_, i64>(1));
    }
    let rows = client
        .query("select x from t order by x", &[])
        .await
        .expect("the rows written before");
    let xs: Vec<i32> = rows.iter().map(|r| r.get(0)).collect();
    assert_eq!(xs, [1, 8 << 20]);
    let rejoin = std::fs::read_to_string(hosts.dir.path().join(format!("h{primary}.log")))
        .unwrap_or_default();
    for line in rejoin
        .lines()
        .filter(|l| l.contains("ewind") || l.contains("Rejoin") || l.contains("Clone"))
    {
        eprintln!("h{primary} rejoining: {line}");
    }

    // The CA's certificate without its key and no issued certificate: a clear refusal.
    let keyless = hosts.dir.path().join("h4");
    copy_dir(&first.join("secrets"), &keyless.join("secrets"));
    std::fs::remove_file(keyless.join("secrets/ca.key")).expect("remove the CA key");
    let api = format!("127.0.0.1:{}", hosts.base + 9);
    let mut cmd = hosts.agent_command_as(0, "h4", &keyless, hosts.base + 3, &api);
    cmd.stdout(Stdio::piped()).stderr(Stdio::piped());
    let out =
        herd_testkit::output_within(&mut cmd, Duration::from_secs(60)).expect("the agent exits");
    let said = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(!out.status.success(), "{said}");
    eprintln!("without the CA key nor a certificate: {}", said.trim());
    assert!(said.contains("h4.crt: no certificate"), "{said}");
    assert!(
        said.contains("herd certs issue h4 --host 127.0.0.1"),
        "{said}"
    );
}

/// A proxy whose secrets carry another cluster's CA: the servers' certificates do not verify,
/// so it never talks to them in plain, and a client is told why (SQLSTATE 08001, the node and
/// rustls's reason).
async fn a_proxy_of_another_ca_refuses_the_servers(hosts: &Hosts, other: &std::path::Path) {
    let dir = hosts.dir.path().join("proxy-other-ca");
    copy_dir(
        &hosts.dir.path().join("proxy/secrets"),
        &dir.join("secrets"),
    );
    std::fs::copy(other.join("secrets/ca.crt"), dir.join("secrets/ca.crt")).expect("the other CA");
    let port = herd_testkit::free_port_block(1);
    let log_path = hosts.dir.path().join("proxy-other-ca.log");
    let log = std::fs::File::create(&log_path).expect("log");
    let child = Command::new(HERD)
        .args(["proxy", "--dcs", &hosts.dcs(), "--cluster", &hosts.cluster])
        .args(["--listen", &format!("127.0.0.1:{port}")])
        .arg("--data-dir")
        .arg(&dir)
        .stdin(Stdio::null())
        .stdout(log.try_clone().expect("log"))
        .stderr(log)
        .spawn()
        .expect("starting the proxy of another CA");
    let url = format!(
        "postgresql://postgres:{}@127.0.0.1:{port}/postgres?connect_timeout=5",
        hosts.password()
    );
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut last = String::new();
    let refusal = loop {
        match tokio_postgres::connect(&url, tokio_postgres::NoTls).await {
            Ok((c, conn)) => {
                tokio::spawn(conn);
                match c.simple_query("select 1").await {
                    Ok(_) => last = "served a query".into(),
                    Err(e) => last = format!("{e:?}"),
                }
            }
            Err(e) => match e.as_db_error() {
                Some(db) if db.code().code() == "08001" => break db.message().to_string(),
                _ => last = format!("{e:?}"),
            },
        }
        if Instant::now() > deadline {
            break String::new();
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
    };
    stop(child);
    let log = std::fs::read_to_string(&log_path).unwrap_or_default();
    assert!(
        !refusal.is_empty(),
        "no 08001 from a proxy of another CA within 30 s (last: {last})\n{log}"
    );
    eprintln!("a proxy of another CA says: {refusal}");
    assert!(
        refusal.contains("TLS to node h") && refusal.contains("invalid peer certificate"),
        "{refusal}"
    );
}

/// The superuser on host `i`'s server over verified TLS (the cluster's CA, the certificate for
/// the address dialled), as `herd-cli`'s tasks connect: with a CA the servers take no plain
/// login from other hosts, the superuser's included. Retried for 30 s at most.
async fn superuser_over_tls(hosts: &Hosts, i: usize) -> tokio_postgres::Client {
    let ca = hosts.agent_dir(0).join("secrets").join(herd_certs::CA_CERT);
    let tls = herd_pg::ClientTls::new(herd_pg::TlsMode::VerifyFull, &ca)
        .expect("the cluster's CA")
        .expect("TLS settings");
    let mut config: tokio_postgres::Config = hosts.node_url(i).parse().expect("node URL");
    config.application_name("herd-test");
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        match herd_pg::connect_config(&mut config, Some(&tls)).await {
            Ok(client) => return client,
            Err(e) => assert!(
                Instant::now() < deadline,
                "the superuser over TLS to {}: {e}\n{}",
                hosts.pg_host(i),
                hosts.logs()
            ),
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// psql from this process (another host than the primary's, in the namespaces' set-up) over
/// a replication connection (`IDENTIFY_SYSTEM`) with `conninfo`; Err with its message.
fn replication_psql(hosts: &Hosts, conninfo: &str) -> Result<String, String> {
    let bins = herd_pg::PgBinaries::locate(None).expect("PostgreSQL 15 binaries");
    let password = std::fs::read_to_string(hosts.agent_dir(0).join("secrets/replication.password"))
        .expect("replication password");
    let mut cmd = Command::new(bins.program("psql"));
    cmd.args(["-X", "-A", "-t", "-d", conninfo, "-c", "IDENTIFY_SYSTEM"])
        .env("PGPASSWORD", password.trim())
        .env("PGCONNECT_TIMEOUT", "10");
    let out = herd_testkit::output_within(&mut cmd, Duration::from_secs(30)).expect("psql exits");
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
    } else {
        Err(String::from_utf8_lossy(&out.stderr).into_owned())
    }
}

/// Each host in its own network namespace, so replication comes from other addresses than
/// loopback and meets the `hostssl … clientcert=verify-ca` rule: the standbys stream over TLS
/// with their certificates (`pg_stat_ssl.client_dn`); a replication login from another host
/// without TLS, over TLS without a client certificate, or with one of another CA, is refused
/// with the right password; with the cluster's CA and a member's certificate it is let in.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn across_namespaces_replication_takes_tls_with_a_cluster_certificate_only() {
    let lab = match Lab::build(3) {
        Ok(lab) => lab,
        Err(e) if !Lab::available() => {
            eprintln!("SKIPPED: network namespaces need root and `ip netns` ({e})");
            return;
        }
        Err(e) => panic!("building the network namespaces: {e}"),
    };
    let hosts = with_a_ca(Some(lab)).await;
    let primary = hosts.wait_primary("with TLS on");
    let client = superuser_over_tls(&hosts, primary).await;
    // The superuser too takes TLS from other hosts (no `host all postgres` line any more):
    // plain from this host's address, with the right password, is refused.
    let plain = tokio::time::timeout(
        Duration::from_secs(10),
        tokio_postgres::connect(&hosts.node_url(primary), tokio_postgres::NoTls),
    )
    .await
    .expect("the server answers within 10 s");
    let refused = match plain {
        Ok(_) => panic!("the superuser logged in without TLS from another host"),
        Err(e) => format!("{e:?}"),
    };
    eprintln!("the superuser in plain from another host: {refused}");
    assert!(refused.contains("no encryption"), "{refused}");
    // herd-cli's own tasks reach the servers over verified TLS: each replica's agent keeps its
    // copy slots in line (`agent_slots.rs`) through a superuser session on the primary from
    // its own host, which the primary sees encrypted.
    let tasks = "select host(client_addr), ssl from pg_stat_ssl join pg_stat_activity using (pid) \
                 where application_name = 'herd' and usename = 'postgres' \
                 and host(client_addr) not like '127.%' order by 1";
    let deadline = Instant::now() + Duration::from_secs(60);
    let sessions = loop {
        let rows = client.query(tasks, &[]).await.expect("pg_stat_activity");
        let seen: Vec<(String, bool)> = rows.iter().map(|r| (r.get(0), r.get(1))).collect();
        if seen.len() >= 2 || Instant::now() > deadline {
            break seen;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    eprintln!("herd-cli's sessions on the primary from other hosts (address, ssl): {sessions:?}");
    let others: Vec<String> = (0..3)
        .filter(|&i| i != primary)
        .map(|i| hosts.pg_host(i))
        .collect();
    assert_eq!(
        sessions.iter().map(|s| s.0.clone()).collect::<Vec<_>>(),
        others,
        "one copy-slot keeper per replica: {sessions:?}\n{}",
        hosts.logs()
    );
    assert!(sessions.iter().all(|s| s.1), "{sessions:?}");
    let rows = client
        .query(
            "select application_name, client_addr::text, coalesce(client_dn, '') \
             from pg_stat_ssl join pg_stat_replication using (pid) where ssl",
            &[],
        )
        .await
        .expect("pg_stat_ssl");
    let seen: Vec<(String, String, String)> = rows
        .iter()
        .map(|r| (r.get(0), r.get(1), r.get(2)))
        .collect();
    eprintln!("standbys over TLS (name, address, client certificate): {seen:?}");
    assert_eq!(seen.len(), 2, "{seen:?}");
    for (name, addr, dn) in &seen {
        assert!(
            !addr.starts_with("127."),
            "{name} came over loopback: {seen:?}"
        );
        assert!(
            dn.contains(&format!("CN={name}")),
            "{name}'s certificate: {seen:?}"
        );
    }
    // The proxy (this process's namespace) reaches the primary at its own address over TLS,
    // the certificate verified for that address.
    let through = common::try_connect(&hosts.proxy_url())
        .await
        .expect("the proxy serves");
    let row = through
        .query_one(
            "select ssl, host(client_addr) from pg_stat_ssl join pg_stat_activity using (pid) \
             where pid = pg_backend_pid()",
            &[],
        )
        .await
        .expect("pg_stat_ssl through the proxy");
    let (ssl, from): (bool, String) = (row.get(0), row.get(1));
    eprintln!("a proxied session: ssl {ssl}, from {from}");
    assert!(ssl && !from.starts_with("127."), "ssl {ssl}, from {from}");
    // Other roles take TLS from other hosts (`hostssl`) as well: an application's role is
    // refused in plain straight to the server, and served through the proxy.
    client
        .batch_execute("create role app login password 'app-secret'")
        .await
        .expect("create role");
    let plain = tokio_postgres::connect(
        &format!(
            "host={} port={} user=app password=app-secret dbname=postgres connect_timeout=5",
            hosts.pg_host(primary),
            hosts.pg_port(primary)
        ),
        tokio_postgres::NoTls,
    )
    .await;
    let refused = match plain {
        Ok(_) => panic!("an application role logged in without TLS from another host"),
        Err(e) => format!("{e:?}"),
    };
    assert!(refused.contains("no encryption"), "{refused}");
    let app = common::try_connect(&format!(
        "postgresql://app:app-secret@127.0.0.1:{}/postgres?connect_timeout=5",
        hosts.proxy_port()
    ))
    .await
    .expect("the application's role through the proxy");
    let row = app
        .query_one(
            "select ssl from pg_stat_ssl where pid = pg_backend_pid()",
            &[],
        )
        .await
        .expect("pg_stat_ssl as app");
    assert!(
        row.get::<_, bool>(0),
        "the app's pooled session is not over TLS"
    );

    let at = format!(
        "host={} port={} user=replicator replication=true",
        hosts.pg_host(primary),
        hosts.pg_port(primary)
    );
    let plain = replication_psql(&hosts, &format!("{at} sslmode=disable"));
    let no_cert = replication_psql(
        &hosts,
        &format!("{at} sslmode=require sslcert=/nonexistent sslkey=/nonexistent"),
    );
    let other = (primary + 1) % 3;
    let tls = hosts.agent_dir(other).join("tls");
    let member = replication_psql(
        &hosts,
        &format!(
            "{at} sslmode=verify-full sslrootcert={} sslcert={} sslkey={}",
            hosts.agent_dir(0).join("secrets/ca.crt").display(),
            tls.join(format!("h{other}.crt")).display(),
            tls.join(format!("h{other}.key")).display()
        ),
    );
    // A certificate of another CA, with the cluster's CA to verify the server: the server
    // refuses the client's certificate.
    let other = hosts.dir.path().join("other");
    let other_arg = other.to_str().expect("utf-8 path").to_string();
    let (code, out) = herd(&[
        "certs",
        "init",
        "--cluster",
        "other",
        "--data-dir",
        &other_arg,
    ]);
    assert_eq!(code, Some(0), "{out}");
    let out_dir = other.join("tls");
    let out_arg = out_dir.to_str().expect("utf-8 path").to_string();
    let (code, out) = herd(&[
        "certs",
        "issue",
        "h9",
        "--host",
        "127.0.0.1",
        "--out",
        &out_arg,
        "--data-dir",
        &other_arg,
    ]);
    assert_eq!(code, Some(0), "{out}");
    let stranger = replication_psql(
        &hosts,
        &format!(
            "{at} sslmode=verify-full sslrootcert={} sslcert={} sslkey={}",
            hosts.agent_dir(0).join("secrets/ca.crt").display(),
            out_dir.join("h9.crt").display(),
            out_dir.join("h9.key").display()
        ),
    );
    eprintln!(
        "without TLS: {plain:?}\nwithout a certificate: {no_cert:?}\nas a member: {member:?}\n\
         with another CA's certificate: {stranger:?}"
    );
    let why = stranger.expect_err("a certificate of another CA is refused");
    assert!(why.contains("unknown ca"), "{why}");
    let why = plain.expect_err("replication without TLS from another host is refused");
    assert!(why.contains("no encryption"), "{why}");
    let why = no_cert.expect_err("replication without a client certificate is refused");
    assert!(why.contains("certificate"), "{why}");
    member.expect("a member's certificate and the cluster's CA let it in");
}
