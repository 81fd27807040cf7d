//! Sharding through the one endpoint under load and with real clients, each on its own
//! 2-group cluster: a group's primary killed under writes loses no acknowledged write, pgbench
//! and psycopg run against distributed tables, and session pooling refuses (0A000) statements
//! whose rows are on another group instead of answering from group 0 alone. (The routing story
//! itself is in `sharding.rs`.)

mod common;

use common::{cluster, connect};
use herd_shard::{KeyValue, ShardMap, DEFAULT_SHARD_COUNT};

use tokio_postgres::error::SqlState;

/// kill -9 of one group's primary under write load through the endpoint: that group fails over
/// with every acknowledged write kept, while writes to the other group go on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_group_fails_over_under_load_without_losing_writes() {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::{Arc, Mutex};
    use std::time::{Duration, Instant};

    let c = cluster();
    c.up(&["--shards", "2", "--replicas", "1"]);
    let endpoint = c.url(&[]);
    let setup = connect(&endpoint).await;
    setup
        .batch_execute("create table ledger (k bigint primary key)")
        .await
        .expect("table");
    setup
        .simple_query("select herd.create_distributed_table('ledger', 'k')")
        .await
        .expect("distribute");
    let map = ShardMap::new(2, DEFAULT_SHARD_COUNT);
    let stop = Arc::new(AtomicBool::new(false));
    // (key, acknowledged at) of every acknowledged insert.
    let acked: Arc<Mutex<Vec<(i64, Instant)>>> = Arc::default();
    let mut writers = Vec::new();
    // One writer per group (a writer waiting on the failing group must not hide the other).
    for w in 0..2u32 {
        let (stop, acked, endpoint) = (stop.clone(), acked.clone(), endpoint.clone());
        let map = map.clone();
        writers.push(tokio::spawn(async move {
            let mut client = None;
            let mut k = 0i64;
            while !stop.load(Ordering::Relaxed) {
                if client.is_none() {
                    match tokio_postgres::connect(&endpoint, tokio_postgres::NoTls).await {
                        Ok((cl, conn)) => {
                            tokio::spawn(conn);
                            client = Some(cl);
                        }
                        Err(_) => {
                            tokio::time::sleep(Duration::from_millis(100)).await;
                            continue;
                        }
                    }
                }
                let Some(cl) = client.as_ref() else { continue };
                k += 1;
                while map.group_of(Some(&KeyValue::Int8(k))) != w {
                    k += 1;
                }
                let done = tokio::time::timeout(
                    Duration::from_secs(15),
                    cl.execute("insert into ledger (k) values ($1)", &[&k]),
                )
                .await;
                match done {
                    Ok(Ok(_)) => acked.lock().expect("acked").push((k, Instant::now())),
                    // Failed or unknown: never counted as acknowledged.
                    _ => client = None,
                }
            }
        }));
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    let status = c.status();
    let g1 = status["groups"][0]["nodes"][0].clone();
    assert_eq!(g1["role"], "primary");
    let killed_at = Instant::now();
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(g1["pid"].as_i64().expect("pid") as i32),
        nix::sys::signal::Signal::SIGKILL,
    )
    .expect("kill -9 group 1's primary");
    herd_testkit::wait_until(Duration::from_secs(120), "group 1 promoted", || {
        let s = c.status();
        let nodes = s["groups"][0]["nodes"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        nodes
            .iter()
            .any(|n| n["role"] == "primary" && n["state"] == "running" && n["name"] != g1["name"])
            .then_some(())
    });
    tokio::time::sleep(Duration::from_secs(2)).await;
    stop.store(true, Ordering::Relaxed);
    for w in writers {
        w.await.expect("writer");
    }
    let acked = acked.lock().expect("acked").clone();
    let group_of = |k: i64| map.group_of(Some(&KeyValue::Int8(k)));
    // Group 0 kept taking writes while group 1 failed over (within the first seconds).
    let during = acked
        .iter()
        .filter(|(k, at)| {
            group_of(*k) == 0 && *at > killed_at && *at < killed_at + Duration::from_secs(2)
        })
        .count();
    assert!(
        during > 0,
        "no write reached group 0 right after group 1's primary died"
    );
    assert!(
        acked
            .iter()
            .any(|(k, at)| group_of(*k) == 1 && *at > killed_at),
        "group 1 took writes again"
    );
    // Every acknowledged write is on its group's (new) primary.
    let mut stored = std::collections::BTreeSet::new();
    for g in 0..2u32 {
        let direct = connect(&c.url(&["--group", &g.to_string(), "--primary"])).await;
        for r in direct
            .query("select k from ledger", &[])
            .await
            .expect("read")
        {
            stored.insert(r.get::<_, i64>(0));
        }
    }
    let lost: Vec<i64> = acked
        .iter()
        .map(|(k, _)| *k)
        .filter(|k| !stored.contains(k))
        .collect();
    assert!(lost.is_empty(), "acknowledged writes lost: {lost:?}");
    assert!(
        acked.len() > 20,
        "too few writes to mean anything: {}",
        acked.len()
    );
}

fn pgbench(args: &[&str], url: &str) -> String {
    let out = std::process::Command::new("/usr/lib/postgresql/15/bin/pgbench")
        .args(args)
        .arg(url)
        .output()
        .expect("pgbench");
    let text = herd_testkit::describe(&out);
    assert!(out.status.success(), "pgbench {args:?}: {text}");
    text
}

/// pgbench through the endpoint on a 2-group cluster: its tables created, `pgbench_accounts`
/// distributed by `aid` and loaded with psql's `\copy`, then point selects by key in all three
/// protocols with no failed transaction, and every row where the rule says; psql reads by key and
/// copies every group's rows out; psycopg reads by key.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pgbench_and_psycopg_on_a_sharded_cluster() {
    let c = cluster();
    c.up(&["--shards", "2", "--replicas", "1"]);
    let url = c.url(&[]);
    pgbench(&["-i", "-I", "dt", "-s", "1"], &url);
    let client = connect(&url).await;
    client
        .simple_query("select herd.create_distributed_table('pgbench_accounts', 'aid')")
        .await
        .expect("distribute pgbench_accounts");
    // Loaded as pgbench would, outside a transaction (pgbench -i wraps its load in one, and
    // COPY into a distributed table runs alone): the accounts split by key through COPY.
    client
        .batch_execute(
            "insert into pgbench_branches (bid, bbalance) values (1, 0); \
             insert into pgbench_tellers (tid, bid, tbalance) select t, 1, 0 from generate_series(1, 10) t",
        )
        .await
        .expect("branches and tellers on group 0");
    // psql's \copy (COPY in the simple protocol) loads the accounts, split by key.
    let dir = herd_testkit::scratch_dir();
    let file = dir.path().join("accounts.tsv");
    let rows: String = (1..=100_000)
        .map(|aid| format!("{aid}\t1\t0\t\n"))
        .collect();
    std::fs::write(&file, rows).expect("writing accounts");
    let psql = |command: &str| {
        let out = std::process::Command::new("/usr/lib/postgresql/15/bin/psql")
            .args([
                "-X",
                "-q",
                "-A",
                "-t",
                "-v",
                "ON_ERROR_STOP=1",
                "-d",
                &url,
                "-c",
                command,
            ])
            .output()
            .expect("psql");
        assert!(
            out.status.success(),
            "psql {command}: {}",
            herd_testkit::describe(&out)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    psql(&format!(
        "\\copy pgbench_accounts (aid, bid, abalance, filler) from '{}'",
        file.display()
    ));
    client
        .batch_execute("alter table pgbench_accounts add primary key (aid)")
        .await
        .expect("primary key on every group");
    let total = client
        .query_one("select count(*) from pgbench_branches", &[])
        .await
        .expect("branches on group 0");
    assert_eq!(total.get::<_, i64>(0), 1);
    for mode in ["simple", "extended", "prepared"] {
        let out = pgbench(&["-n", "-S", "-T", "3", "-c", "4", "-M", mode], &url);
        assert!(
            out.contains("number of failed transactions: 0 (0.000%)"),
            "{mode}: {out}"
        );
        let processed = out
            .lines()
            .find_map(|l| l.strip_prefix("number of transactions actually processed: "))
            .and_then(|n| n.split('/').next()?.trim().parse::<u64>().ok())
            .unwrap_or(0);
        assert!(processed > 0, "{mode}: {out}");
    }
    let verify = c.herd_ok(&["shards", "verify"]);
    assert!(
        verify.contains("public.pgbench_accounts on group 0: ") && !verify.contains("NOT"),
        "{verify}"
    );
    let rows: u64 = verify
        .lines()
        .filter_map(|l| l.split(": ").nth(1)?.split(' ').next()?.parse::<u64>().ok())
        .sum();
    assert_eq!(rows, 100_000, "{verify}");
    // psql reads by key and copies every group's rows out as one COPY.
    assert_eq!(
        psql("select abalance from pgbench_accounts where aid = 77").trim(),
        "0"
    );
    let copied = psql("\\copy pgbench_accounts (aid) to stdout");
    assert_eq!(copied.lines().count(), 100_000);
    // psql across groups: an aggregate finished by PostgreSQL, an ordered merge with LIMIT.
    assert_eq!(
        psql("select count(*), sum(aid), avg(aid) from pgbench_accounts").trim(),
        "100000|5000050000|50000.500000000000"
    );
    assert_eq!(
        psql("select aid from pgbench_accounts order by aid desc limit 3").trim(),
        "100000\n99999\n99998"
    );
    // psycopg (the system's, over libpq) by key, in its default (extended) protocol.
    // Then across groups, with parameters: an aggregate, a merge, a write on every group; then
    // without autocommit (psycopg opens the transactions): writes by key on both groups, an
    // aggregate inside that transaction, a commit, an ordered read across groups.
    let script = "import psycopg, sys\n\
        with psycopg.connect(sys.argv[1], autocommit=True) as c:\n\
        \x20   print(c.execute('select aid from pgbench_accounts where aid = %s', (4242,)).fetchone()[0])\n\
        \x20   print(c.execute('select count(*) from pgbench_accounts where aid > %s', (1000,)).fetchone()[0])\n\
        \x20   print([r[0] for r in c.execute('select aid from pgbench_accounts where aid < %s order by aid desc limit 2', (500,))])\n\
        \x20   print(c.execute('update pgbench_accounts set abalance = abalance + 1 where aid %% 1000 = %s', (7,)).rowcount)\n\
        \x20   print(c.execute('select sum(abalance) from pgbench_accounts').fetchone()[0])\n\
        with psycopg.connect(sys.argv[1]) as c:\n\
        \x20   for aid, d in ((1, -5), (2, 5), (3, 7), (4, -7)):\n\
        \x20       c.execute('update pgbench_accounts set abalance = abalance + %s where aid = %s', (d, aid))\n\
        \x20   print(c.execute('select sum(abalance), count(*) filter (where abalance <> 0) from pgbench_accounts').fetchone())\n\
        \x20   c.commit()\n\
        \x20   print(c.execute('select abalance from pgbench_accounts where aid in (1, 2, 3, 4) order by aid').fetchall())\n";
    let out = std::process::Command::new("python3")
        .args(["-c", script, &url])
        .output()
        .expect("python3");
    assert!(out.status.success(), "{}", herd_testkit::describe(&out));
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        "4242\n99000\n[499, 498]\n100\n100\n(100, 104)\n[(-5,), (5,), (7,), (-7,)]"
    );
}

/// Session pooling on a sharded cluster: a session lives on group 0's primary, so statements
/// whose rows are on another group (or on every group) are refused with 0A000 — never answered
/// from group 0 alone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn session_pooling_on_a_sharded_cluster_refuses_other_groups() {
    let c = cluster();
    c.up(&["--shards", "2", "--replicas", "0"]);
    let client = connect(&c.url(&[])).await;
    client
        .batch_execute("create table kv (k bigint primary key, v text)")
        .await
        .expect("create");
    client
        .simple_query("select herd.create_distributed_table('kv', 'k')")
        .await
        .expect("distribute");
    let map = ShardMap::new(2, DEFAULT_SHARD_COUNT);
    let key_of = |g: u32| {
        (1..100i64)
            .find(|k| map.group_of(Some(&KeyValue::Int8(*k))) == g)
            .expect("a key of the group")
    };
    let (k0, k1) = (key_of(0), key_of(1));
    for k in [k0, k1] {
        client
            .execute("insert into kv (k, v) values ($1, 'x')", &[&k])
            .await
            .expect("insert by key");
    }
    drop(client);
    c.herd_ok(&["down"]);
    let toml = std::fs::read_to_string(c.data_dir().join("herd.toml")).expect("herd.toml");
    let toml = toml.replace("pool_mode = \"transaction\"", "pool_mode = \"session\"");
    assert!(toml.contains("pool_mode = \"session\""), "{toml}");
    std::fs::write(c.data_dir().join("herd.toml"), toml).expect("herd.toml");
    c.up(&[]);
    let client = connect(&c.url(&[])).await;
    let row = client
        .query_one("select v from kv where k = $1", &[&k0])
        .await
        .expect("a key of group 0");
    assert_eq!(row.get::<_, String>(0), "x");
    for (sql, params) in [
        ("select v from kv where k = $1", vec![k1]),
        ("select count(*) from kv", vec![]),
    ] {
        let params: Vec<&(dyn tokio_postgres::types::ToSql + Sync)> = params
            .iter()
            .map(|k| k as &(dyn tokio_postgres::types::ToSql + Sync))
            .collect();
        let e = client
            .query(sql, &params)
            .await
            .expect_err("refused, not answered from group 0");
        assert_eq!(
            e.code(),
            Some(&SqlState::FEATURE_NOT_SUPPORTED),
            "{sql}: {e}"
        );
    }
}
