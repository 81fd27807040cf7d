//! `herd group add` on a running two-group cluster under load: writers by key on a distributed
//! table, reference-table writers (outside and inside transactions), bigserial inserts, and a
//! reader. The new group gets the roles, the databases, the tables, every reference row
//! acknowledged before or during the addition, and the map; no acknowledged write is lost,
//! reference writes outside transactions never fail (they wait), those inside transactions
//! fail only with the retryable 40001; reads never miss an acknowledged reference row; ids stay
//! unique across the three groups; `herd shards rebalance` then gives the group its share.

mod common;

use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::{cluster, connect};

/// Accounts: ids 1..=ACCOUNTS, spread over the shards.
const ACCOUNTS: i64 = 300;

/// What the writers did.
#[derive(Default)]
struct Ledger {
    /// Acknowledged balance updates.
    updates: AtomicI64,
    /// Reference rows acknowledged (ids), in order.
    plans: Mutex<Vec<i32>>,
    /// Failures: (writer, SQLSTATE, message).
    failures: Mutex<Vec<(&'static str, String, String)>>,
}

impl Ledger {
    fn fail(&self, who: &'static str, e: &tokio_postgres::Error) {
        let code = e.code().map(|c| c.code().to_string()).unwrap_or_default();
        let message = e
            .as_db_error()
            .map_or(e.to_string(), |d| d.message().to_string());
        let mut f = self.failures.lock().expect("ledger");
        if f.len() < 1000 {
            f.push((who, code, message));
        }
    }

    fn plans(&self) -> Vec<i32> {
        self.plans.lock().expect("ledger").clone()
    }
}

/// Updates balances by key, one statement each.
async fn balances(url: String, stop: Arc<AtomicBool>, ledger: Arc<Ledger>) {
    let client = connect(&url).await;
    let mut id = 0;
    while !stop.load(Ordering::Relaxed) {
        id = id % ACCOUNTS + 1;
        match client
            .execute(
                "UPDATE accounts SET balance = balance + 1 WHERE id = $1",
                &[&id],
            )
            .await
        {
            Ok(1) => {
                ledger.updates.fetch_add(1, Ordering::Relaxed);
            }
            Ok(n) => ledger.failures.lock().expect("ledger").push((
                "balances",
                String::new(),
                format!("{n} rows updated for account {id}"),
            )),
            Err(e) => {
                ledger.fail("balances", &e);
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
    }
}

/// Inserts reference rows: ids `first`, `first + 2`, …; inside explicit transactions when
/// `in_transaction`.
async fn plans(
    url: String,
    first: i32,
    in_transaction: bool,
    stop: Arc<AtomicBool>,
    ledger: Arc<Ledger>,
) {
    let client = connect(&url).await;
    let who = if in_transaction {
        "plans in transactions"
    } else {
        "plans"
    };
    let mut id = first;
    while !stop.load(Ordering::Relaxed) {
        let insert = "INSERT INTO plans (id, name) VALUES ($1, 'plan')";
        let done = if in_transaction {
            let r = async {
                client.batch_execute("BEGIN").await?;
                client.execute(insert, &[&id]).await?;
                client.batch_execute("COMMIT").await
            }
            .await;
            if r.is_err() {
                let _ = client.batch_execute("ROLLBACK").await;
            }
            r
        } else {
            client.execute(insert, &[&id]).await.map(|_| ())
        };
        match done {
            Ok(()) => {
                ledger.plans.lock().expect("ledger").push(id);
                id += 2;
            }
            Err(e) => {
                ledger.fail(who, &e);
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// Inserts notes (ids from a bigserial) on every shard.
async fn notes(url: String, stop: Arc<AtomicBool>, ledger: Arc<Ledger>) {
    let client = connect(&url).await;
    let mut id = 0;
    while !stop.load(Ordering::Relaxed) {
        id = id % ACCOUNTS + 1;
        if let Err(e) = client
            .execute("INSERT INTO notes (account_id) VALUES ($1)", &[&id])
            .await
        {
            ledger.fail("notes", &e);
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

/// Reads the accounts across groups (exactly ACCOUNTS) and the reference table, which must
/// hold every row acknowledged before the read began. The number of reads.
///
/// It reads at `primary` consistency: the rows were acknowledged to other sessions, and at the
/// default level a replica may serve another session's read before it has replayed them (the
/// default promises a session its own writes; a loaded machine showed it, 2026-11-27). What is
/// checked is that no group serves a reference read without every acknowledged row, the new
/// group included.
async fn reader(
    url: String,
    stop: Arc<AtomicBool>,
    ledger: Arc<Ledger>,
    bad: Arc<Mutex<Vec<String>>>,
) -> u64 {
    let client = connect(&url).await;
    client
        .batch_execute("SET herd.consistency = 'primary'")
        .await
        .expect("consistency");
    let note = |what: String| {
        let mut b = bad.lock().expect("bad");
        if b.len() < 100 {
            b.push(what);
        }
    };
    let mut reads = 0;
    while !stop.load(Ordering::Relaxed) {
        match client.query_one("SELECT count(*) FROM accounts", &[]).await {
            Ok(row) if row.get::<_, i64>(0) == ACCOUNTS => {}
            Ok(row) => note(format!("count(*) = {}", row.get::<_, i64>(0))),
            Err(e) => note(format!("count failed: {e}")),
        }
        let acknowledged = ledger.plans();
        match client.query("SELECT id FROM plans", &[]).await {
            Ok(rows) => {
                let seen: std::collections::HashSet<i32> = rows.iter().map(|r| r.get(0)).collect();
                if let Some(missing) = acknowledged.iter().find(|id| !seen.contains(id)) {
                    note(format!("reference row {missing} acknowledged but not read"));
                }
            }
            Err(e) => note(format!("reference read failed: {e}")),
        }
        reads += 1;
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    reads
}

/// One text of a table's rows on a group's primary, to compare copies.
async fn content(client: &tokio_postgres::Client, sql: &str) -> String {
    client
        .query_one(sql, &[])
        .await
        .expect(sql)
        .get::<_, Option<String>>(0)
        .unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_group_is_added_online_under_load() {
    let c = cluster();
    c.up(&["--shards", "2", "--replicas", "1"]);
    let url = c.url(&[]);
    let admin = connect(&url).await;
    common::run_all(
        &admin,
        &[
            "CREATE TABLE accounts (id bigint PRIMARY KEY, balance bigint NOT NULL)",
            "SELECT herd.create_distributed_table('accounts', 'id')",
            "CREATE TABLE plans (id int PRIMARY KEY, name text NOT NULL)",
            "SELECT herd.create_reference_table('plans')",
            "INSERT INTO plans VALUES (-1, 'free'), (-2, 'pro')",
            "CREATE TABLE notes (id bigserial, account_id bigint, PRIMARY KEY (account_id, id))",
            "SELECT herd.create_distributed_table('notes', 'account_id')",
            "CREATE ROLE app LOGIN PASSWORD 'app-secret'",
            "CREATE DATABASE shop",
        ],
    )
    .await;
    common::seed_accounts(&admin, ACCOUNTS).await;

    let stop = Arc::new(AtomicBool::new(false));
    let ledger = Arc::new(Ledger::default());
    let bad = Arc::new(Mutex::new(Vec::new()));
    let writers = vec![
        tokio::spawn(balances(url.clone(), stop.clone(), ledger.clone())),
        tokio::spawn(plans(url.clone(), 0, false, stop.clone(), ledger.clone())),
        tokio::spawn(plans(url.clone(), 1, true, stop.clone(), ledger.clone())),
        tokio::spawn(notes(url.clone(), stop.clone(), ledger.clone())),
    ];
    let reads = tokio::spawn(reader(
        url.clone(),
        stop.clone(),
        ledger.clone(),
        bad.clone(),
    ));
    common::eventually(Duration::from_secs(30), "writes under way", || async {
        ledger.updates.load(Ordering::Relaxed) > 50 && ledger.plans().len() > 10
    })
    .await;

    let (updates_before, plans_before) =
        (ledger.updates.load(Ordering::Relaxed), ledger.plans().len());
    let out = {
        let c = &c;
        tokio::task::block_in_place(|| c.herd_ok(&["group", "add"]))
    };
    assert!(out.contains("shard group 2 added"), "{out}");
    assert!(out.contains("databases created: shop"), "{out}");
    assert!(out.contains("herd shards rebalance"), "{out}");
    assert!(out.contains("DDL waited"), "{out}");
    // The load went on through the addition and after it, the new group serving its part.
    common::eventually(
        Duration::from_secs(30),
        "writes after the addition",
        || async {
            ledger.updates.load(Ordering::Relaxed) > updates_before + 50
                && ledger.plans().len() > plans_before + 10
        },
    )
    .await;
    common::end_load(&stop, writers, reads, &bad, "the addition").await;
    let failures = ledger.failures.lock().expect("ledger").clone();
    // Only reference writes inside open transactions may be refused, with 40001, and few.
    for (who, code, message) in &failures {
        assert!(
            *who == "plans in transactions" && code == "40001",
            "{who} failed: {code} {message}"
        );
    }
    assert!(failures.len() <= 10, "{failures:?}");

    // Every group holds the same reference rows: every one acknowledged, none more.
    let groups: Vec<_> = group_primaries(&c).await;
    let plans_sql = "SELECT string_agg(id::text, ',' ORDER BY id) FROM plans";
    let want = {
        let mut ids = ledger.plans();
        ids.extend([-2, -1]);
        ids.sort_unstable();
        ids.iter()
            .map(|i| i.to_string())
            .collect::<Vec<_>>()
            .join(",")
    };
    for (g, client) in groups.iter().enumerate() {
        assert_eq!(content(client, plans_sql).await, want, "plans on group {g}");
    }
    // Roles and databases reached the new group; it holds no account yet.
    let g2 = &groups[2];
    let app: i64 = g2
        .query_one("SELECT count(*) FROM pg_roles WHERE rolname = 'app'", &[])
        .await
        .expect("roles")
        .get(0);
    assert_eq!(app, 1);
    let shop: i64 = g2
        .query_one(
            "SELECT count(*) FROM pg_database WHERE datname = 'shop'",
            &[],
        )
        .await
        .expect("databases")
        .get(0);
    assert_eq!(shop, 1);
    assert_eq!(
        content(g2, "SELECT count(*)::text FROM accounts").await,
        "0"
    );
    // Every acknowledged update is there once.
    let sum: i64 = admin
        .query_one("SELECT sum(balance)::bigint FROM accounts", &[])
        .await
        .expect("sum")
        .get(0);
    assert_eq!(sum, ledger.updates.load(Ordering::Relaxed));
    // The cluster records three groups (a restart resumes them) and shows them.
    let toml = std::fs::read_to_string(c.data_dir().join("herd.toml")).expect("herd.toml");
    assert!(toml.contains("shards = 3"), "{toml}");
    let status = c.herd_ok(&["status"]);
    assert!(status.contains("shard group 2"), "{status}");
    let (code, snapshot) = common::api_get(c.port + 100, "/dashboard/snapshot");
    assert_eq!(code, 200);
    assert_eq!(
        snapshot["status"]["groups"].as_array().map(Vec::len),
        Some(2)
    );
    // The timeline reads events as they are recorded (on the agent engine, from the store,
    // a moment after `herd group add` answers): looked for for up to 20 s.
    let added = |snapshot: &serde_json::Value| {
        snapshot["events"]
            .as_array()
            .into_iter()
            .flatten()
            .any(|e| e["kind"] == "group_added" && e["group"] == 2 && e["ok"] == true)
    };
    let mut snapshot = snapshot;
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while !added(&snapshot) && std::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(500)).await;
        snapshot = common::api_get(c.port + 100, "/dashboard/snapshot").1;
    }
    assert!(
        added(&snapshot),
        "no group_added event on the timeline: {}",
        snapshot["events"]
    );

    // DDL reaches the new group; the rebalance gives it a third of the shards; ids unique.
    admin
        .batch_execute("ALTER TABLE accounts ADD COLUMN note text")
        .await
        .expect("DDL after the addition");
    assert_eq!(
        content(
            g2,
            "SELECT count(*)::text FROM information_schema.columns \
             WHERE table_name = 'accounts' AND column_name = 'note'"
        )
        .await,
        "1"
    );
    let out = c.herd_ok(&["shards", "rebalance", "--wait-timeout", "120"]);
    assert_eq!(out.matches("moved from group").count(), 10, "{out}");
    for id in (1..=ACCOUNTS).step_by(3) {
        admin
            .execute("INSERT INTO notes (account_id) VALUES ($1)", &[&id])
            .await
            .expect("note");
    }
    for (sql, want) in [
        ("SELECT count(*) FROM accounts", ACCOUNTS),
        ("SELECT sum(balance)::bigint FROM accounts", sum),
        ("SELECT count(*) - count(DISTINCT id) FROM notes", 0),
    ] {
        let v: i64 = admin.query_one(sql, &[]).await.expect(sql).get(0);
        assert_eq!(v, want, "{sql}");
    }
    let g2 = connect(&c.url(&["--group", "2", "--primary"])).await;
    assert!(content(&g2, "SELECT count(*)::text FROM accounts").await != "0");
    let verify = c.herd_ok(&["shards", "verify"]);
    assert!(!verify.contains("NOT"), "{verify}");
    // No trigger of the addition is left on group 0 (whose primary the moves' restart for
    // logical replication may have changed: a new connection).
    let g0 = connect(&c.url(&["--group", "0", "--primary"])).await;
    let left = content(
        &g0,
        "SELECT ((SELECT count(*) FROM pg_trigger WHERE tgname = 'herd_adding_group') \
              + (SELECT count(*) FROM pg_event_trigger WHERE evtname = 'herd_adding_group'))::text",
    )
    .await;
    assert_eq!(left, "0");

    // Without a supervisor the command says so and fails.
    c.herd_ok(&["down"]);
    let out = c.herd(&["group", "add"]);
    assert!(!out.status.success());
    let text = herd_testkit::describe(&out);
    assert!(text.contains("no Herd cluster runs"), "{text}");
}

/// Connections to every group's primary (group order).
async fn group_primaries(c: &herd_testkit::TestCluster) -> Vec<tokio_postgres::Client> {
    let mut clients = Vec::new();
    for g in 0..3 {
        let g = g.to_string();
        clients.push(connect(&c.url(&["--group", &g, "--primary"])).await);
    }
    clients
}
