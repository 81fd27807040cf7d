//! Online shard moves (`herd shards move`) on a real two-group cluster with replicas: one
//! virtual shard of two co-located distributed tables moves to the other group while clients
//! write (transactions of two statements by key, on the moved shard and on others) and read
//! (by key, and across groups); every acknowledged write is there afterwards, once; reads
//! across groups never see a row twice or miss one; only the moved shard's writes may fail,
//! with the retryable 40001, and only inside the switch; `herd shards verify` is clean. Then a
//! move stopped before its switch survives a change of the target group's primary, and another
//! is cancelled, leaving everything as it was. Then a third group is added at a restart
//! (`herd up --shards 3`, which adds it as `herd group add` does): it gets the tables, a reference table's rows and the map, and
//! `herd shards rebalance` gives it a third of the shards; sums, counts and unique ids hold.

mod common;

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::{cluster, connect};
use herd_shard::{KeyValue, ShardMap};

/// Accounts: ids 1..=ACCOUNTS, spread over 32 shards.
const ACCOUNTS: i64 = 600;

/// The virtual shard of an account id (the map of a two-group cluster has 32 shards).
fn shard_of(id: i64) -> u32 {
    ShardMap::new(2, 32).shard_of(Some(&KeyValue::Int8(id)))
}

/// What the writers did, per account: acknowledged transactions.
#[derive(Default)]
struct Ledger {
    acknowledged: Mutex<HashMap<i64, i64>>,
    /// Failures: (account's shard, SQLSTATE, message).
    failures: Mutex<Vec<(u32, String, String)>>,
}

/// A writer: transactions of two statements on one account (its balance, an event row),
/// retried like an application does on 40001.
async fn writer(url: String, n: usize, ids: Vec<i64>, stop: Arc<AtomicBool>, ledger: Arc<Ledger>) {
    let client = connect(&url).await;
    // Event numbers of each writer are its own.
    let mut seq = n * 1_000_000_000;
    while !stop.load(Ordering::Relaxed) {
        let id = ids[seq % ids.len()];
        seq += 1;
        let sql = format!(
            "BEGIN; UPDATE accounts SET balance = balance + 1 WHERE id = {id}; \
             INSERT INTO events (account_id, seq) VALUES ({id}, {seq}); COMMIT"
        );
        match client.batch_execute(&sql).await {
            Ok(()) => {
                *ledger
                    .acknowledged
                    .lock()
                    .expect("ledger")
                    .entry(id)
                    .or_default() += 1;
            }
            Err(e) => {
                let _ = client.batch_execute("ROLLBACK").await;
                let code = e.code().map(|c| c.code().to_string()).unwrap_or_default();
                let message = e
                    .as_db_error()
                    .map_or(e.to_string(), |d| d.message().to_string());
                {
                    let mut failures = ledger.failures.lock().expect("ledger");
                    if failures.len() < 1000 {
                        failures.push((shard_of(id), code, message));
                    }
                }
                // As an application would: not in a tight loop against a failing server.
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
    }
}

/// Notes a bad read (bounded: a failing server must not fill memory).
fn note(bad: &Mutex<Vec<String>>, what: String) {
    let mut bad = bad.lock().expect("bad");
    if bad.len() < 100 {
        bad.push(what);
    }
}

/// A reader: the accounts across groups (never a row twice or missing), and an account of the
/// moving shard by key (always there). The number of reads.
async fn reader(
    url: String,
    moved: i64,
    stop: Arc<AtomicBool>,
    bad: Arc<Mutex<Vec<String>>>,
) -> u64 {
    let client = connect(&url).await;
    let mut reads = 0;
    while !stop.load(Ordering::Relaxed) {
        match client.query_one("SELECT count(*) FROM accounts", &[]).await {
            Ok(row) if row.get::<_, i64>(0) == ACCOUNTS => {}
            Ok(row) => note(
                &bad,
                format!("count(*) across groups = {}", row.get::<_, i64>(0)),
            ),
            Err(e) => note(&bad, format!("count failed: {e}")),
        }
        match client
            .query_opt("SELECT balance FROM accounts WHERE id = $1", &[&moved])
            .await
        {
            Ok(Some(_)) => {}
            Ok(None) => note(&bad, format!("account {moved} missing")),
            Err(e) => note(&bad, format!("read of {moved} failed: {e}")),
        }
        reads += 1;
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    reads
}

/// How many of the accounts `ids` a group's primary holds.
async fn rows_of(client: &tokio_postgres::Client, ids: &[i64]) -> i64 {
    client
        .query_one("SELECT count(*) FROM accounts WHERE id = ANY($1)", &[&ids])
        .await
        .expect("count")
        .get(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shard_moves_under_load_and_a_move_can_be_cancelled() {
    let c = cluster();
    c.up(&["--shards", "2", "--replicas", "1"]);
    let url = c.url(&[]);
    let admin = connect(&url).await;
    common::run_all(
        &admin,
        &[
            "CREATE TABLE accounts (id bigint PRIMARY KEY, balance bigint NOT NULL)",
            "CREATE TABLE events (account_id bigint, seq bigint, PRIMARY KEY (account_id, seq))",
            "SELECT herd.create_distributed_table('accounts', 'id')",
            "SELECT herd.create_distributed_table('events', 'account_id')",
            "CREATE TABLE plans (id int PRIMARY KEY, name text NOT NULL)",
            "SELECT herd.create_reference_table('plans')",
            "INSERT INTO plans VALUES (1, 'free'), (2, 'pro'), (3, 'team')",
            "CREATE TABLE notes (id bigserial, account_id bigint, PRIMARY KEY (account_id, id))",
            "SELECT herd.create_distributed_table('notes', 'account_id')",
        ],
    )
    .await;
    common::seed_accounts(&admin, ACCOUNTS).await;

    // Shard 2 is on group 0 (shard s starts on group s % 2); it moves to group 1.
    let moving: Vec<i64> = (1..=ACCOUNTS).filter(|i| shard_of(*i) == 2).collect();
    let staying: Vec<i64> = (1..=ACCOUNTS).filter(|i| shard_of(*i) == 4).collect();
    assert!(moving.len() > 5 && staying.len() > 5);
    let stop = Arc::new(AtomicBool::new(false));
    let ledger = Arc::new(Ledger::default());
    let bad = Arc::new(Mutex::new(Vec::new()));
    let mut tasks = Vec::new();
    for (n, ids) in [moving.clone(), moving.clone(), staying.clone()]
        .into_iter()
        .enumerate()
    {
        tasks.push(tokio::spawn(writer(
            url.clone(),
            n,
            ids,
            stop.clone(),
            ledger.clone(),
        )));
    }
    let reads = tokio::spawn(reader(url.clone(), moving[0], stop.clone(), bad.clone()));
    let acknowledged = || -> i64 { ledger.acknowledged.lock().expect("ledger").values().sum() };
    common::eventually(Duration::from_secs(30), "writes under way", || async {
        acknowledged() > 50
    })
    .await;

    let before_move = acknowledged();
    let out = {
        let c = &c;
        tokio::task::block_in_place(|| {
            c.herd_ok(&["shards", "move", "2", "--to", "1", "--wait-timeout", "120"])
        })
    };
    assert!(
        out.contains("shard 2 moved from group 0 to group 1"),
        "{out}"
    );
    assert!(out.contains("its statements waited"), "{out}");
    // Writes went on during the move, on both shards.
    let during = acknowledged() - before_move;
    assert!(during > 20, "only {during} transactions during the move");
    tokio::time::sleep(Duration::from_millis(500)).await;
    common::end_load(&stop, tasks, reads, &bad, "the move").await;
    let failures = ledger.failures.lock().expect("ledger").clone();
    // Only the moved shard's transactions may fail, with the guard's retryable error, and few.
    for (shard, code, message) in &failures {
        assert!(
            *shard == 2 && code == "40001",
            "a transaction failed: shard {shard}, {code} {message}"
        );
    }
    assert!(
        failures.len() <= 10,
        "{} failures: {failures:?}",
        failures.len()
    );

    // Every acknowledged transaction is there once: balances and events match the ledger.
    let ledger_rows = ledger.acknowledged.lock().expect("ledger").clone();
    for (id, n) in &ledger_rows {
        let balance: i64 = admin
            .query_one("SELECT balance FROM accounts WHERE id = $1", &[id])
            .await
            .expect("account")
            .get(0);
        let events: i64 = admin
            .query_one("SELECT count(*) FROM events WHERE account_id = $1", &[id])
            .await
            .expect("events")
            .get(0);
        assert_eq!(
            (balance, events),
            (*n, *n),
            "account {id} (shard {})",
            shard_of(*id)
        );
    }
    let mut totals = Vec::new();
    for sql in [
        "SELECT count(*) FROM accounts",
        "SELECT sum(balance)::bigint FROM accounts",
        "SELECT count(*) FROM events",
    ] {
        totals.push(admin.query_one(sql, &[]).await.expect(sql).get::<_, i64>(0));
    }
    let all: i64 = ledger_rows.values().sum();
    assert_eq!(totals, [ACCOUNTS, all, all]);
    // The rows are where the map says: group 1 has them, group 0 none.
    let g0 = connect(&c.url(&["--group", "0", "--primary"])).await;
    let g1 = connect(&c.url(&["--group", "1", "--primary"])).await;
    assert_eq!(
        rows_of(&g0, &moving).await,
        0,
        "rows of shard 2 left on group 0"
    );
    assert_eq!(rows_of(&g1, &moving).await, moving.len() as i64);
    let shards = admin
        .query_one(
            "SELECT shard_group, moving_to FROM herd.shards WHERE shard = 2",
            &[],
        )
        .await
        .expect("herd.shards");
    assert_eq!(
        (shards.get::<_, i32>(0), shards.get::<_, Option<i32>>(1)),
        (1, None)
    );
    let verify = c.herd_ok(&["shards", "verify"]);
    assert!(verify.contains("all in place"), "{verify}");
    // The move's copy is gone everywhere (publication, slot, subscription).
    for client in [&g0, &g1] {
        let left = client
            .query_one(
                "SELECT (SELECT count(*) FROM pg_publication WHERE pubname LIKE 'herd_copy_move%') \
                      + (SELECT count(*) FROM pg_replication_slots WHERE slot_name LIKE 'herd_copy_move%') \
                      + (SELECT count(*) FROM pg_subscription WHERE subname LIKE 'herd_copy_move%') \
                      + (SELECT count(*) FROM pg_trigger WHERE tgname LIKE 'herd_move%')",
                &[],
            )
            .await
            .expect("leftovers");
        assert_eq!(left.get::<_, i64>(0), 0);
    }

    // A move stopped before its switch (no time to copy) stays under way: the copied rows
    // are hidden (reads see each row once) and DDL waits; --cancel takes it back.
    let out = c.herd(&["shards", "move", "3", "--to", "0", "--wait-timeout", "0"]);
    assert!(!out.status.success(), "{}", herd_testkit::describe(&out));
    let row = admin
        .query_one("SELECT moving_to FROM herd.shards WHERE shard = 3", &[])
        .await
        .expect("herd.shards");
    assert_eq!(row.get::<_, Option<i32>>(0), Some(0));
    common::eventually(
        Duration::from_secs(60),
        "the copy of shard 3 on group 0",
        || {
            let g0 = &g0;
            async move {
                let Ok(row) = g0.query_one("SELECT count(*) FROM accounts", &[]).await else {
                    return false;
                };
                let n: i64 = row.get(0);
                // Group 0 holds its own shards' rows plus shard 3's copies.
                let own = (1..=ACCOUNTS)
                    .filter(|i| {
                        let s = shard_of(*i);
                        s.is_multiple_of(2) && s != 2
                    })
                    .count() as i64;
                n > own
            }
        },
    )
    .await;
    let count: i64 = admin
        .query_one("SELECT count(*) FROM accounts", &[])
        .await
        .expect("count")
        .get(0);
    assert_eq!(count, ACCOUNTS, "a copied row is seen twice");
    let e = admin
        .simple_query("ALTER TABLE accounts ADD COLUMN note text")
        .await
        .expect_err("DDL during a move");
    assert_eq!(e.code().map(|c| c.code()), Some("55000"), "{e}");
    // The target group changes primary while the move is under way (a switchover; a failover
    // leaves the same state): run again, the copy starts over on the new primary (which may
    // lack rows the source counts as delivered) and the move finishes.
    let first = common::groups::wait_healthy(&c, 0, None);
    c.herd_ok(&["switchover", "--group", "0"]);
    common::groups::wait_healthy(&c, 0, Some(&first));
    let out = c.herd_ok(&["shards", "move", "3", "--to", "0", "--wait-timeout", "120"]);
    assert!(
        out.contains("shard 3 moved from group 1 to group 0"),
        "{out}"
    );
    assert!(out.contains("the copy started over"), "{out}");
    all_in_place(&c, &admin).await;
    // Another move stopped before its switch: --cancel takes it back.
    let out = c.herd(&["shards", "move", "5", "--to", "0", "--wait-timeout", "0"]);
    assert!(!out.status.success(), "{}", herd_testkit::describe(&out));
    let out = c.herd_ok(&["shards", "move", "5", "--cancel"]);
    assert!(out.contains("cancelled"), "{out}");
    all_in_place(&c, &admin).await;
    admin
        .batch_execute("ALTER TABLE accounts ADD COLUMN note text")
        .await
        .expect("DDL after the move");
    add_a_group_and_rebalance(&c, all).await;
}

/// Every account is there once, and every row where the map says.
async fn all_in_place(c: &herd_testkit::TestCluster, admin: &tokio_postgres::Client) {
    let count: i64 = admin
        .query_one("SELECT count(*) FROM accounts", &[])
        .await
        .expect("count")
        .get(0);
    assert_eq!(count, ACCOUNTS);
    let verify = c.herd_ok(&["shards", "verify"]);
    assert!(!verify.contains("NOT"), "{verify}");
}

/// Notes on accounts of every shard through the endpoint (ids from the table's bigserial).
async fn write_notes(client: &tokio_postgres::Client) {
    for id in (1..=ACCOUNTS).step_by(7) {
        client
            .execute("INSERT INTO notes (account_id) VALUES ($1)", &[&id])
            .await
            .expect("note");
    }
}

/// A third group (`herd up --shards 3` after `herd down`) gets the tables, the reference rows
/// and the map; `herd shards rebalance` gives it a third of the shards online; ids stay unique.
async fn add_a_group_and_rebalance(c: &herd_testkit::TestCluster, balances: i64) {
    let admin = connect(&c.url(&[])).await;
    write_notes(&admin).await;
    drop(admin);
    c.herd_ok(&["down"]);
    c.up(&["--shards", "3", "--replicas", "1"]);
    // The third group was added once the other two ran, as `herd group add` does.
    let log = std::fs::read_to_string(c.data_dir().join("logs/herd.log")).unwrap_or_default();
    assert!(log.contains("shard group 2 added"), "{log}");
    let admin = connect(&c.url(&[])).await;
    let total: i64 = admin
        .query_one("SELECT sum(balance)::bigint FROM accounts", &[])
        .await
        .expect("sum across three groups")
        .get(0);
    assert_eq!(total, balances);
    let g2 = connect(&c.url(&["--group", "2", "--primary"])).await;
    let plans: i64 = g2
        .query_one("SELECT count(*) FROM plans", &[])
        .await
        .expect("the reference table on the new group")
        .get(0);
    assert_eq!(plans, 3);
    write_notes(&admin).await;
    let plan = c.herd_ok(&["shards", "rebalance", "--dry-run"]);
    assert!(plan.contains("10 move(s)"), "{plan}");
    let out = c.herd_ok(&["shards", "rebalance", "--wait-timeout", "120"]);
    assert_eq!(out.matches("moved from group").count(), 10, "{out}");
    let per_group = admin
        .query("SELECT count(*) FROM herd.shards GROUP BY shard_group", &[])
        .await
        .expect("herd.shards");
    assert_eq!(per_group.len(), 3);
    for row in per_group {
        assert!((10..=11).contains(&row.get::<_, i64>(0)));
    }
    assert!(rows_of(&g2, &(1..=ACCOUNTS).collect::<Vec<_>>()).await > 100);
    write_notes(&admin).await;
    for sql in [
        "SELECT count(*) FROM accounts",
        "SELECT sum(balance)::bigint FROM accounts",
        "SELECT count(*) - count(DISTINCT id) FROM notes",
    ] {
        let v: i64 = admin.query_one(sql, &[]).await.expect(sql).get(0);
        let want = match sql {
            s if s.contains("DISTINCT") => 0,
            s if s.contains("sum") => balances,
            _ => ACCOUNTS,
        };
        assert_eq!(v, want, "{sql}");
    }
    let verify = c.herd_ok(&["shards", "verify"]);
    assert!(!verify.contains("NOT"), "{verify}");
}
