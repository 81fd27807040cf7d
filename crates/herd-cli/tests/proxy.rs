//! The cluster endpoint (Herd's proxy) with real clients: pgbench in every protocol mode,
//! read-your-writes, lag-free fallbacks, cancel, pinning, settings, bad input.

mod common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::Command;
use std::time::Duration;

use common::{api_get_text, cluster, connect, count, eventually};
use herd_testkit::describe;
use tokio_postgres::NoTls;

fn pgbench(args: &[&str], url: &str) -> String {
    let out = Command::new("/usr/lib/postgresql/15/bin/pgbench")
        .args(args)
        .arg(url)
        .output()
        .expect("pgbench");
    let text = describe(&out);
    assert!(out.status.success(), "pgbench {args:?}: {text}");
    text
}

/// Sum of `herd_routed_total` samples whose labels contain `filter`.
fn routed(metrics: &str, filter: &str) -> u64 {
    metrics
        .lines()
        .filter(|l| l.starts_with("herd_routed_total{") && l.contains(filter))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<u64>().ok())
        .sum()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pgbench_in_every_protocol_mode() {
    let c = cluster();
    c.up(&[]);
    let url = c.url(&[]);
    pgbench(&["-i", "-s", "1", "-q"], &c.url(&["--primary"]));
    for mode in ["simple", "extended", "prepared"] {
        for select_only in [false, true] {
            let mut args = vec!["-n", "-t", "150", "-c", "4", "-j", "2", "-M", mode];
            if select_only {
                args.push("-S");
            }
            let text = pgbench(&args, &url);
            assert!(
                text.contains("number of failed transactions: 0 (0.000%)"),
                "{mode} -S={select_only}: {text}"
            );
            assert!(
                text.contains("number of transactions actually processed: 600/600"),
                "{text}"
            );
        }
    }
    let metrics = api_get_text(c.api_port(), "/metrics");
    assert!(routed(&metrics, "node=\"node0\"") > 0, "{metrics}");
    assert!(
        routed(&metrics, "reason=\"read\"") > 0,
        "select-only load must reach replicas: {metrics}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn read_your_writes_under_async_commit() {
    let c = cluster();
    c.up(&["--commit-mode", "async"]);
    let url = c.url(&[]);
    let setup = connect(&c.url(&["--primary"])).await;
    setup
        .batch_execute("create table ryw(id int primary key, v text)")
        .await
        .expect("create");
    drop(setup);
    let client = connect(&url).await;
    // The proxy reaches nodes on this host by their Unix sockets (no client address).
    let via_socket = client
        .query_one(
            "select client_addr is null from pg_stat_activity where pid = pg_backend_pid()",
            &[],
        )
        .await
        .expect("own backend");
    assert!(
        via_socket.get::<_, bool>(0),
        "proxy used TCP, not the socket"
    );
    let primary_port = i64::from(c.port + 1);
    let (mut stale, mut on_replicas) = (0, 0);
    for id in 0..1000 {
        // Simple protocol, one round trip each; current_setting('port') (stable) tells who answered, over TCP or the socket.
        client
            .simple_query(&format!("insert into ryw values ({id}, 'x')"))
            .await
            .expect("insert");
        let rows = client
            .query(
                &format!("select v, current_setting('port')::int from ryw where id = {id}"),
                &[],
            )
            .await
            .expect("read");
        match rows.first() {
            None => stale += 1,
            Some(row) if i64::from(row.get::<_, i32>(1)) != primary_port => on_replicas += 1,
            Some(_) => {}
        }
    }
    assert_eq!(stale, 0, "reads must see the session's own writes");
    eprintln!("reads served by replicas: {on_replicas} of 1000");
    assert!(
        on_replicas >= 250,
        "replicas should serve a substantial share of the reads, got {on_replicas}/1000"
    );
    drop(client);

    // With every replica frozen, reads still succeed, through the primary.
    let status = c.status();
    let replica_pids: Vec<i32> = status["nodes"]
        .as_array()
        .expect("nodes")
        .iter()
        .filter(|n| n["role"] == "replica")
        .filter_map(|n| n["pid"].as_i64().map(|p| p as i32))
        .collect();
    // Every process of the replicas (PostgreSQL's children lead process groups of their own).
    let frozen: Vec<i32> = replica_pids
        .iter()
        .flat_map(|p| std::iter::once(*p).chain(common::children(*p)))
        .collect();
    let stop = |sig| {
        for pid in &frozen {
            let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(*pid), sig);
        }
    };
    stop(nix::sys::signal::Signal::SIGSTOP);
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let client = connect(&url).await;
    for id in 0..50i32 {
        let row = tokio::time::timeout(
            Duration::from_secs(10),
            client.query_opt("select v from ryw where id = $1", &[&id]),
        )
        .await
        .expect("a read must not hang while replicas are frozen")
        .expect("read");
        assert!(row.is_some());
    }
    stop(nix::sys::signal::Signal::SIGCONT);
    let metrics = api_get_text(c.api_port(), "/metrics");
    assert!(metrics.contains("reason=\"no_replica\""), "{metrics}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sessions_cancel_pins_settings_and_bad_input() {
    let c = cluster();
    c.up(&[]);
    let url = c.url(&[]);

    // psql, the reference client, through the endpoint.
    let out = Command::new("psql")
        .arg(&url)
        .args([
            "-v",
            "ON_ERROR_STOP=1",
            "-Atc",
            "create table p(i int); insert into p values (1),(2); select count(*) from p",
        ])
        .output()
        .expect("psql");
    assert!(out.status.success(), "{}", describe(&out));
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).lines().last(),
        Some("2")
    );

    // Errors keep their SQLSTATE and leave the session usable.
    let client = connect(&url).await;
    let err = client
        .batch_execute("select 1/0")
        .await
        .expect_err("division by zero");
    assert_eq!(err.code().map(|c| c.code()), Some("22012"));
    assert_eq!(count(&client, "p").await, Some(2));

    // Settings follow the session from server to server.
    client
        .batch_execute("set application_name = 'herd-test'; set work_mem = '7MB'")
        .await
        .expect("set");
    for _ in 0..20 {
        let row = client
            .query_one(
                "select current_setting('work_mem'), current_setting('application_name')",
                &[],
            )
            .await
            .expect("q");
        assert_eq!(
            (row.get::<_, String>(0), row.get::<_, String>(1)),
            ("7MB".to_string(), "herd-test".to_string())
        );
    }

    // A session advisory lock pins the session: unlock works in a later transaction.
    client
        .batch_execute("select pg_advisory_lock(42)")
        .await
        .expect("lock");
    for _ in 0..5 {
        client.batch_execute("select 1").await.expect("q");
    }
    let unlocked: bool = client
        .query_one("select pg_advisory_unlock(42)", &[])
        .await
        .expect("unlock")
        .get(0);
    assert!(
        unlocked,
        "the unlock must reach the backend holding the lock"
    );

    // Cancel reaches the backend running the query.
    let token = client.cancel_token();
    let sleeper = tokio::spawn(async move { client.batch_execute("select pg_sleep(20)").await });
    tokio::time::sleep(Duration::from_millis(500)).await;
    token.cancel_query(NoTls).await.expect("cancel request");
    let result = tokio::time::timeout(Duration::from_secs(10), sleeper)
        .await
        .expect("cancelled in time")
        .expect("join");
    assert_eq!(
        result.expect_err("cancelled").code().map(|c| c.code()),
        Some("57014")
    );

    // Wrong password: 28P01, and the proxy keeps serving.
    let wrong = url.replacen("postgres:", "postgres:wrong", 1);
    let err = tokio_postgres::connect(&wrong, NoTls)
        .await
        .err()
        .expect("must fail");
    assert_eq!(err.code().map(|c| c.code()), Some("28P01"), "{err}");
    let err = tokio_postgres::connect(&url.replacen("postgres:", "nobody:", 1), NoTls)
        .await
        .err()
        .expect("must fail");
    assert_eq!(
        err.code().map(|c| c.code()),
        Some("28P01"),
        "unknown roles fail the same way: {err}"
    );

    // Clients vanishing mid-transaction leak nothing: more of them than the pool holds.
    for i in 0..15 {
        let (cl, conn) = tokio_postgres::connect(&url, NoTls).await.expect("connect");
        let task = tokio::spawn(conn);
        cl.batch_execute(&format!("begin; insert into p values ({})", 100 + i))
            .await
            .expect("begin");
        task.abort(); // the socket closes with the transaction open
    }
    let client = connect(&url).await;
    eventually(
        Duration::from_secs(10),
        "a free server connection",
        || async { count(&client, "p").await == Some(2) },
    )
    .await;

    // Malformed and unsupported input: an ErrorResponse, then the connection closes; a startup
    // packet of impossible length is closed without a word, as PostgreSQL does.
    let port = c.port;
    let answers = tokio::task::spawn_blocking(move || {
        let v2 = raw_exchange(port, &[0, 0, 0, 8, 0, 2, 0, 0]);
        let mut startup = Vec::new();
        let params = b"user\0postgres\0database\0postgres\0\0";
        startup.extend_from_slice(&((8 + params.len()) as u32).to_be_bytes());
        startup.extend_from_slice(&196608u32.to_be_bytes());
        startup.extend_from_slice(params);
        startup.extend_from_slice(&[b'p', 0, 0, 0, 2]); // length below 4
        let bad_len = raw_exchange(port, &startup);
        let huge = raw_exchange(port, &[0, 0x7f, 0xff, 0xff, 0, 3, 0, 0]);
        (v2, bad_len, huge)
    })
    .await
    .expect("join");
    assert!(
        answers.2.is_empty(),
        "huge startup: {:?}",
        String::from_utf8_lossy(&answers.2)
    );
    for (name, reply) in [("protocol 2.0", &answers.0), ("bad length", &answers.1)] {
        assert_eq!(
            reply.first(),
            Some(&b'E'),
            "{name}: {:?}",
            String::from_utf8_lossy(reply)
        );
    }
    assert!(String::from_utf8_lossy(&answers.0).contains("0A000"));
    assert!(String::from_utf8_lossy(&answers.1).contains("08P01"));
    assert_eq!(
        count(&client, "p").await,
        Some(2),
        "the proxy survived the bad input"
    );
}

/// Sends `bytes` on a fresh connection and returns everything received until it closes.
fn raw_exchange(port: u16, bytes: &[u8]) -> Vec<u8> {
    let mut s = TcpStream::connect(("127.0.0.1", port)).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(10)))
        .expect("timeout");
    s.write_all(bytes).expect("write");
    let mut out = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        match s.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => out.extend_from_slice(&buf[..n]),
            Err(e) => panic!(
                "no answer before timeout: {e}; got {:?}",
                String::from_utf8_lossy(&out)
            ),
        }
    }
    // Skip ahead to the ErrorResponse when authentication messages came first.
    match out.iter().position(|b| *b == b'E') {
        Some(i) if out.first() != Some(&b'E') && out.first() == Some(&b'R') => out[i..].to_vec(),
        _ => out,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn consistency_levels_per_connection_transaction_and_statement() {
    let c = cluster();
    c.up(&["--commit-mode", "async"]);
    let url = c.url(&[]);
    let primary_port = i32::from(c.port + 1);
    async fn port(client: &tokio_postgres::Client, sql: &str) -> i32 {
        let rows = client
            .simple_query(sql)
            .await
            .unwrap_or_else(|e| panic!("{sql}: {e}"));
        rows.iter()
            .find_map(|m| match m {
                tokio_postgres::SimpleQueryMessage::Row(r) => r.get(0).and_then(|v| v.parse().ok()),
                _ => None,
            })
            .expect("a row")
    }
    let q = "select current_setting('port')";

    // Per connection: `-c herd.consistency=primary` in the startup options.
    let mut config: tokio_postgres::Config = url.parse().expect("url");
    config.options("-c herd.consistency=primary");
    let (pinned, conn) = config.connect(NoTls).await.expect("connect");
    tokio::spawn(conn);
    for _ in 0..5 {
        assert_eq!(port(&pinned, q).await, primary_port);
    }

    // Per session at run time, answered by the proxy itself.
    let client = connect(&url).await;
    client
        .batch_execute("set herd.consistency = eventual")
        .await
        .expect("set");
    eventually(Duration::from_secs(10), "reads on a replica", || async {
        port(&client, q).await != primary_port
    })
    .await;
    client
        .batch_execute("set herd.consistency = bounded")
        .await
        .expect("set");
    eventually(
        Duration::from_secs(10),
        "bounded reads on a replica",
        || async { port(&client, q).await != primary_port },
    )
    .await;
    client
        .batch_execute("set herd.consistency = 'primary'")
        .await
        .expect("set");
    assert_eq!(port(&client, q).await, primary_port);

    // Per transaction: a READ ONLY transaction is placed by its first statement, with its own level.
    client
        .batch_execute("set herd.consistency = eventual")
        .await
        .expect("set");
    client
        .batch_execute("begin read only")
        .await
        .expect("begin");
    client
        .batch_execute("set local herd.consistency = 'primary'")
        .await
        .expect("set local");
    assert_eq!(port(&client, q).await, primary_port);
    client.batch_execute("commit").await.expect("commit");
    client
        .batch_execute("begin read only")
        .await
        .expect("begin");
    let first = port(&client, q).await;
    assert_ne!(
        first, primary_port,
        "eventual read-only transaction on a replica"
    );
    assert_eq!(
        port(&client, q).await,
        first,
        "a transaction never changes server"
    );
    client.batch_execute("commit").await.expect("commit");
    // A transaction not declared READ ONLY may write: the primary.
    client.batch_execute("begin").await.expect("begin");
    assert_eq!(port(&client, q).await, primary_port);
    client.batch_execute("rollback").await.expect("rollback");
    // BEGIN then COMMIT with nothing between: answered without a server.
    client
        .batch_execute("begin; commit")
        .await
        .expect("empty transaction");
    client.batch_execute("begin").await.expect("begin");
    client.batch_execute("rollback").await.expect("rollback");
    assert!(
        port(&client, q).await != primary_port,
        "session level back in force"
    );
}

/// Sum of the samples of `metric` (a pool counter) for the pools of `node`.
fn pool_counter(metrics: &str, metric: &str, node: &str) -> f64 {
    metrics
        .lines()
        .filter(|l| {
            l.starts_with(&format!("{metric}{{")) && l.contains(&format!("node=\"{node}\""))
        })
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_pool_makes_clients_wait_and_says_so() {
    let c = cluster();
    // Waits for a pooled connection end after 3 s here (30 s by default).
    let data = c.data_dir();
    std::fs::create_dir_all(&data).expect("data dir");
    std::fs::write(data.join("herd.toml"), "[proxy]\npool_wait_ms = 3000\n").expect("herd.toml");
    c.up(&["--replicas", "0"]);
    let url = c.url(&[]);
    let setup = connect(&url).await;
    setup
        .batch_execute("create table w(i int)")
        .await
        .expect("create");
    // Ten open write transactions hold every connection of the primary's pool (pool_size 10).
    let mut holders = Vec::new();
    for i in 0..10 {
        let cl = connect(&url).await;
        cl.batch_execute(&format!("begin; insert into w values ({i})"))
            .await
            .expect("begin");
        holders.push(cl);
    }
    let before = api_get_text(c.api_port(), "/metrics");
    assert_eq!(
        pool_counter(&before, "herd_pool_waits_total", "node0"),
        0.0,
        "{before}"
    );
    // An eleventh writer waits for a connection, and gets one when a holder commits.
    let cl = connect(&url).await;
    let waiter = tokio::spawn(async move { cl.batch_execute("insert into w values (100)").await });
    tokio::time::sleep(Duration::from_millis(700)).await;
    assert!(!waiter.is_finished(), "the pool should have been full");
    holders[0].batch_execute("commit").await.expect("commit");
    waiter
        .await
        .expect("join")
        .expect("the waiting insert succeeds once a connection is free");
    for h in &holders[1..] {
        h.batch_execute("commit").await.expect("commit");
    }
    assert_eq!(count(&setup, "w").await, Some(11));

    // Nobody commits: a waiting writer is told so after pool_wait_ms, with SQLSTATE 53300, and
    // its session goes on. Its slot is not lost: once the holders end, it writes.
    for (i, h) in holders.iter().enumerate() {
        h.batch_execute(&format!("begin; insert into w values ({})", 200 + i))
            .await
            .expect("begin");
    }
    let cl = connect(&url).await;
    let started = std::time::Instant::now();
    let err = cl
        .batch_execute("insert into w values (300)")
        .await
        .expect_err("no connection became free");
    let waited = started.elapsed();
    let said = err
        .as_db_error()
        .map(|d| d.message().to_string())
        .unwrap_or_else(|| err.to_string());
    assert_eq!(err.code().map(|c| c.code()), Some("53300"), "{said}");
    assert!(said.contains("pool_wait_ms"), "{said}");
    assert!(
        waited >= Duration::from_millis(2500) && waited < Duration::from_secs(20),
        "waited {waited:?} for a limit of 3 s"
    );
    for h in &holders {
        h.batch_execute("commit").await.expect("commit");
    }
    cl.batch_execute("insert into w values (301)")
        .await
        .expect("the same session writes once connections are free");
    assert_eq!(count(&setup, "w").await, Some(22));
    let after = api_get_text(c.api_port(), "/metrics");
    assert!(
        pool_counter(&after, "herd_pool_waits_total", "node0") >= 1.0,
        "{after}"
    );
    assert!(
        pool_counter(&after, "herd_pool_wait_seconds_total", "node0") >= 0.3,
        "{after}"
    );
    assert_eq!(
        pool_counter(&after, "herd_pool_timeouts_total", "node0"),
        1.0,
        "{after}"
    );
    assert!(
        pool_counter(&after, "herd_pool_connects_total", "node0") >= 10.0,
        "{after}"
    );
    let status = c.herd_ok(&["status"]);
    assert!(status.contains("waits"), "{status}");
}

/// Clients that connect for one transaction and leave (`pgbench -C`) give their server back:
/// the next client reuses it. A Terminate between transactions must not take a pooled
/// connection only to close it with the session (every such client then cost the server a
/// new backend, which is what a pooler is there to save).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connect_per_transaction_reuses_pooled_connections() {
    let c = cluster();
    c.up(&["--replicas", "0"]);
    pgbench(&["-i", "-s", "1", "-q"], &c.url(&["--primary"]));
    let text = pgbench(&["-n", "-C", "-S", "-c", "1", "-t", "30"], &c.url(&[]));
    assert!(
        text.contains("number of transactions actually processed: 30/30"),
        "{text}"
    );
    let metrics = api_get_text(c.api_port(), "/metrics");
    let connects = pool_counter(&metrics, "herd_pool_connects_total", "node0");
    assert!(
        connects <= 2.0,
        "30 one-transaction clients, one after another, opened {connects} server connections: {metrics}"
    );
    assert!(
        pool_counter(&metrics, "herd_pool_connections", "node0") >= 1.0,
        "the connection should be back in its pool: {metrics}"
    );
    // A driver's COPY FROM STDIN in the extended protocol (Bind, Execute, Sync; the rows;
    // CopyDone, Sync): PostgreSQL answers the second Sync only. The connection serves the
    // next statement at once, and goes back to the pool.
    use futures_util::SinkExt;
    let client = connect(&c.url(&[])).await;
    client
        .batch_execute("create table copied_in (id int, note text)")
        .await
        .expect("table");
    for round in 0..2 {
        let sink = client
            .copy_in("copy copied_in from stdin")
            .await
            .expect("copy in");
        futures_util::pin_mut!(sink);
        let rows: String = (0..5000).map(|k| format!("{k}\tr{round}\n")).collect();
        sink.send(bytes::Bytes::from(rows)).await.expect("rows");
        let n = tokio::time::timeout(Duration::from_secs(30), sink.finish())
            .await
            .expect("the COPY ends")
            .expect("finish");
        assert_eq!(n, 5000);
        let count: i64 = tokio::time::timeout(
            Duration::from_secs(30),
            client.query_one("select count(*) from copied_in", &[]),
        )
        .await
        .expect("the next statement is answered")
        .expect("count")
        .get(0);
        assert_eq!(count, 5000 * (round + 1));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_primary_shares_reads_when_configured() {
    let c = cluster();
    let data = c.data_dir();
    std::fs::create_dir_all(&data).expect("data dir");
    std::fs::write(
        data.join("herd.toml"),
        "[proxy]\nread_from_primary = true\n",
    )
    .expect("herd.toml");
    c.up(&[]);
    let kept = std::fs::read_to_string(data.join("herd.toml")).expect("herd.toml");
    assert!(kept.contains("read_from_primary = true"), "{kept}");
    pgbench(&["-i", "-s", "1", "-q"], &c.url(&["--primary"]));
    let text = pgbench(
        &["-n", "-S", "-t", "300", "-c", "6", "-j", "2"],
        &c.url(&[]),
    );
    assert!(
        text.contains("number of failed transactions: 0 (0.000%)"),
        "{text}"
    );
    let metrics = api_get_text(c.api_port(), "/metrics");
    let primary_reads = routed(&metrics, "reason=\"read_balanced\"");
    assert!(primary_reads > 0, "the primary took no reads: {metrics}");
    assert_eq!(
        primary_reads,
        routed(&metrics, "node=\"node0\",reason=\"read_balanced\""),
        "balanced reads on the primary only: {metrics}"
    );
    for replica in ["node1", "node2"] {
        assert!(
            routed(&metrics, &format!("node=\"{replica}\",reason=\"read\"")) > 0,
            "{replica} took no reads: {metrics}"
        );
    }
}
