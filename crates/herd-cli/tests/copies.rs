//! Logical copies (`herd copy`) between two real Herd clusters: a filtered subset of rows and
//! columns copied and streamed under write load, through a switchover and a kill -9 of the
//! source's primary (no row lost, none applied twice, no re-copy), paused and resumed, the
//! target down for a while, status in `herd copy list`, `/status` and `/metrics`, and a copy
//! whose target is gone bounded by `max_slot_wal_keep_size` and reported broken.

mod common;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use common::copies::{
    copy_objects_left, copy_status, fingerprint, node_url, replicas_hold, start_writers,
    startup_process, SOURCE_SUBSET, TARGET_ALL,
};
use common::{api_get, api_get_text, cluster, connect, eventually, groups::wait_healthy};
use herd_testkit::describe;
use tokio_postgres::Client;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn copy_streams_through_switchover_and_primary_crash() {
    let source = cluster();
    let target = cluster();
    source.up(&[]);
    target.up(&["--replicas", "0"]);
    let src = connect(&source.url(&[])).await;
    src.batch_execute(
        "create table orders (id bigint primary key, region text not null, total numeric(12,2), note text); \
         insert into orders select g, case when g % 3 = 0 then 'eu' else 'us' end, g * 1.5, 'seed' from generate_series(1, 5000) g; \
         create table items (id int primary key, name text); \
         insert into items select g, 'item ' || g from generate_series(1, 300) g; \
         create table mismatch (id int primary key, total numeric(10,2))",
    )
    .await
    .expect("source tables");
    let tgt_url = target.url(&[]);
    let tgt = connect(&tgt_url).await;
    tgt.batch_execute("create table mismatch (id int primary key, total integer)")
        .await
        .expect("target's own table");

    // A row filter on a column outside the primary key would make PostgreSQL refuse the
    // source's own updates: refused, and nothing is left behind. (This first create also
    // turns wal_level to logical through a rolling restart.)
    let out = source.herd(&[
        "copy",
        "create",
        "bad",
        "--to",
        &tgt_url,
        "--table",
        "orders",
        "--where",
        "orders=region = 'eu'",
    ]);
    let text = describe(&out);
    assert!(!out.status.success(), "{text}");
    assert!(text.contains("wal_level = logical"), "{text}");
    assert!(text.contains("primary key"), "{text}");
    let src = connect(&source.url(&[])).await;
    let leftovers = copy_objects_left(&src).await;
    assert_eq!(leftovers, 0, "a refused copy leaves nothing on the source");
    let on_target: Option<String> = tgt
        .query_one("select to_regclass('public.orders')::text", &[])
        .await
        .expect("regclass")
        .get(0);
    assert_eq!(
        on_target, None,
        "a refused copy creates no table on the target"
    );
    // A target table whose column types differ: named in the error.
    let out = source.herd(&[
        "copy", "create", "bad", "--to", &tgt_url, "--table", "mismatch",
    ]);
    let text = describe(&out);
    assert!(!out.status.success(), "{text}");
    assert!(
        text.contains("column total is numeric(10,2) at the source but integer on the target"),
        "{text}"
    );

    // The copy: every tenth order, three of its four columns; items whole.
    let out = source.herd_ok(&[
        "copy",
        "create",
        "eu",
        "--to",
        &tgt_url,
        "--table",
        "orders",
        "--table",
        "items",
        "--where",
        "orders=id % 10 = 0",
        "--columns",
        "orders=id,region,total",
    ]);
    assert!(out.contains("copy eu streams"), "{out}");
    assert_eq!(
        fingerprint(&tgt, TARGET_ALL).await,
        fingerprint(&src, SOURCE_SUBSET).await,
        "the initial copy holds exactly the filtered rows"
    );
    let note: Option<String> = tgt
        .query_one("select to_regclass('public.orders')::text || (select count(*) from information_schema.columns where table_name = 'orders' and column_name = 'note')::text", &[])
        .await
        .expect("columns")
        .get(0);
    assert_eq!(
        note.as_deref(),
        Some("orders0"),
        "the note column does not travel"
    );
    // Each table's copy finished at one position; a re-copy would move it.
    let synced_at = |client: Client| async move {
        let rows = client
            .query("select srrelid::regclass::text, srsubstate::text, srsublsn::text from pg_subscription_rel order by 1", &[])
            .await
            .expect("pg_subscription_rel");
        rows.iter()
            .map(|r| {
                format!(
                    "{} {} {:?}",
                    r.get::<_, String>(0),
                    r.get::<_, String>(1),
                    r.get::<_, Option<String>>(2)
                )
            })
            .collect::<Vec<_>>()
    };
    let before = synced_at(connect(&tgt_url).await).await;

    // Every replica holds the slot before anything fails.
    eventually(
        Duration::from_secs(60),
        "slot copies on every replica",
        || replicas_hold(&source, "herd_copy_eu"),
    )
    .await;

    let stop = Arc::new(AtomicBool::new(false));
    let acked = Arc::new(AtomicU64::new(0));
    let writers = start_writers(&source.url(&[]), &stop, &acked);
    tokio::time::sleep(Duration::from_secs(3)).await;
    let first = wait_healthy(&source, 0, None);
    source.herd_ok(&["switchover"]);
    let second = wait_healthy(&source, 0, Some(&first));
    eventually(
        Duration::from_secs(60),
        "slot copies again after the switchover",
        || replicas_hold(&source, "herd_copy_eu"),
    )
    .await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    // kill -9 of the primary in the middle of the writes.
    common::kill_primary(&source);
    wait_healthy(&source, 0, Some(&second));
    tokio::time::sleep(Duration::from_secs(4)).await;
    stop.store(true, Ordering::Relaxed);
    for w in writers {
        let _ = tokio::time::timeout(Duration::from_secs(20), w).await;
    }
    assert!(
        acked.load(Ordering::Relaxed) > 100,
        "the writers made progress"
    );

    // Content equal: no row lost, none applied twice (totals count every increment once).
    let src = connect(&source.url(&[])).await;
    let want = fingerprint(&src, SOURCE_SUBSET).await;
    let tgt = connect(&tgt_url).await;
    eventually(
        Duration::from_secs(90),
        "the target equal to the filtered source",
        || {
            let (tgt, want) = (&tgt, want.clone());
            async move { fingerprint(tgt, TARGET_ALL).await == want }
        },
    )
    .await;
    assert_eq!(
        synced_at(connect(&tgt_url).await).await,
        before,
        "no table was copied again"
    );
    let s = copy_status(&source, "eu");
    assert_eq!(s["state"], "streaming", "{s}");

    // Status everywhere.
    let (code, doc) = api_get(source.api_port(), "/status");
    assert_eq!(code, 200);
    eventually(Duration::from_secs(10), "the copy in /status", || async {
        api_get(source.api_port(), "/status").1["copies"][0]["state"] == "streaming"
    })
    .await;
    let _ = doc;
    let metrics = api_get_text(source.api_port(), "/metrics");
    assert!(
        metrics.contains("herd_copy_state{copy=\"eu\",group=\"0\",state=\"streaming\"} 1"),
        "{metrics}"
    );
    assert!(
        metrics.contains("herd_copy_table_rows{copy=\"eu\",group=\"0\",table=\"public.orders\"}"),
        "{metrics}"
    );
    let text = source.herd_ok(&["status"]);
    assert!(
        text.contains("logical copies:") && text.contains("copy eu"),
        "{text}"
    );

    // Paused: changes wait on the source; resumed: they arrive.
    source.herd_ok(&["copy", "pause", "eu"]);
    assert_eq!(copy_status(&source, "eu")["state"], "paused");
    src.batch_execute("insert into orders values (900000, 'eu', 1, 'p')")
        .await
        .expect("write while paused");
    tokio::time::sleep(Duration::from_secs(3)).await;
    let seen = |id: i64| {
        let tgt_url = tgt_url.clone();
        async move {
            connect(&tgt_url)
                .await
                .query_opt("select 1 from orders where id = $1", &[&id])
                .await
                .expect("lookup")
                .is_some()
        }
    };
    assert!(!seen(900000).await, "a paused copy does not apply changes");
    source.herd_ok(&["copy", "resume", "eu"]);
    eventually(
        Duration::from_secs(30),
        "the paused write after resume",
        || seen(900000),
    )
    .await;

    // The target down for a while: reported, then it catches up.
    target.herd_ok(&["down"]);
    src.batch_execute(
        "insert into orders select g, 'eu', g, 'd' from generate_series(900010, 901000, 10) g",
    )
    .await
    .expect("writes while the target is down");
    let s = copy_status(&source, "eu");
    assert_eq!(s["state"], "broken", "{s}");
    assert!(
        s["reason"]
            .as_str()
            .unwrap_or("")
            .contains("cannot be reached"),
        "{s}"
    );
    target.up(&[]);
    let want = fingerprint(&src, SOURCE_SUBSET).await;
    eventually(
        Duration::from_secs(60),
        "the target caught up after its downtime",
        || {
            let (tgt_url, want) = (tgt_url.clone(), want.clone());
            async move { fingerprint(&connect(&tgt_url).await, TARGET_ALL).await == want }
        },
    )
    .await;

    // Dropped: nothing left on the source (primary and replicas) nor the target's
    // subscription; the target's rows stay.
    source.herd_ok(&["copy", "drop", "eu"]);
    let src = connect(&source.url(&[])).await;
    let left = copy_objects_left(&src).await;
    assert_eq!(left, 0);
    eventually(
        Duration::from_secs(30),
        "slot copies gone from the replicas",
        || async {
            let status = source.status();
            for n in status["nodes"].as_array().expect("nodes") {
                if n["role"] != "replica" {
                    continue;
                }
                let url = node_url(&source, n["name"].as_str().expect("name"));
                let c = connect(&url).await;
                let n: i64 = c
                    .query_one(
                        "select count(*) from pg_replication_slots where slot_type = 'logical'",
                        &[],
                    )
                    .await
                    .expect("slots")
                    .get(0);
                if n > 0 {
                    return false;
                }
            }
            true
        },
    )
    .await;
    let tgt = connect(&tgt_url).await;
    let subs: i64 = tgt
        .query_one("select count(*) from pg_subscription", &[])
        .await
        .expect("subs")
        .get(0);
    assert_eq!(subs, 0);
    assert!(
        fingerprint(&tgt, TARGET_ALL).await.0 > 0,
        "the target keeps its rows"
    );
    assert!(source.herd_ok(&["copy", "list"]).contains("no copies"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn abandoned_copy_is_bounded_and_reported() {
    let source = cluster();
    let target = cluster();
    std::fs::create_dir_all(source.data_dir()).expect("data dir");
    // Small limits, so the test writes tens of megabytes, not gigabytes; wal_keep_size 0 so
    // only the slot holds WAL.
    std::fs::write(
        source.data_dir().join("herd.toml"),
        "[postgres]\nwal_level = \"logical\"\nwal_keep_size = \"0\"\nmax_slot_wal_keep_size = \"32MB\"\n",
    )
    .expect("herd.toml");
    source.up(&["--replicas", "1"]);
    target.up(&["--replicas", "0"]);
    let src = connect(&source.url(&[])).await;
    src.batch_execute("create table big (id bigint primary key, pad text)")
        .await
        .expect("table");
    source.herd_ok(&[
        "copy",
        "create",
        "gone",
        "--to",
        &target.url(&[]),
        "--table",
        "big",
    ]);
    target.herd_ok(&["down"]);
    // About 60 MB of WAL the absent target never confirms.
    for chunk in 0..6 {
        src.batch_execute(&format!(
            "insert into big select g, repeat('x', 900) from generate_series({} + 1, {} + 10000) g",
            chunk * 10_000,
            chunk * 10_000
        ))
        .await
        .expect("writes");
        if chunk == 2 {
            // Above half of the limit: a warning while the slot still holds.
            let s = copy_status(&source, "gone");
            let reason = s["reason"].as_str().unwrap_or("").to_string();
            assert!(
                reason.contains("retains") || reason.contains("invalidated"),
                "{s}"
            );
        }
    }
    eventually(
        Duration::from_secs(60),
        "the slot invalidated by PostgreSQL",
        || async {
            let _ = src.batch_execute("checkpoint").await;
            let s = copy_status(&source, "gone");
            s["state"] == "broken" && s["reason"].as_str().unwrap_or("").contains("invalidated")
        },
    )
    .await;
    let lost: String = src
        .query_one(
            "select wal_status from pg_replication_slots where slot_name = 'herd_copy_gone'",
            &[],
        )
        .await
        .expect("slot")
        .get(0);
    assert_eq!(
        lost, "lost",
        "the WAL kept for the copy stopped at max_slot_wal_keep_size"
    );
    let out = source.herd(&["copy", "drop", "gone"]);
    assert!(
        !out.status.success(),
        "dropping with the target down asks for --force: {}",
        describe(&out)
    );
    source.herd_ok(&["copy", "drop", "gone", "--force"]);
    let left: i64 = src
        .query_one(
            "select count(*) from pg_replication_slots where slot_type = 'logical'",
            &[],
        )
        .await
        .expect("slots")
        .get(0);
    assert_eq!(left, 0);
}

/// What a failover could lose never reaches the target: with replay stopped on the only
/// replica, a commit (async, so the primary acknowledges it at once) waits at the endpoint's
/// replication relay, and arrives once the replica has replayed it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn copies_wait_until_the_replicas_hold_the_commit() {
    use nix::sys::signal::{kill, Signal};
    use nix::unistd::Pid;
    let source = cluster();
    let target = cluster();
    source.up(&["--replicas", "1", "--commit-mode", "async"]);
    target.up(&["--replicas", "0"]);
    let src = connect(&source.url(&[])).await;
    src.batch_execute("create table t (id int primary key)")
        .await
        .expect("table");
    let tgt_url = target.url(&[]);
    source.herd_ok(&["copy", "create", "held", "--to", &tgt_url, "--table", "t"]);
    let tgt = connect(&tgt_url).await;
    let has = |id: i32| {
        let tgt = &tgt;
        async move {
            tgt.query_opt("select 1 from t where id = $1", &[&id])
                .await
                .expect("lookup")
                .is_some()
        }
    };
    src.batch_execute("insert into t values (1)")
        .await
        .expect("insert");
    eventually(
        Duration::from_secs(30),
        "a first row through the relay",
        || has(1),
    )
    .await;

    // The replica gets its copy of the slot (and a restart to load it) first.
    eventually(
        Duration::from_secs(60),
        "the slot copied to the replica",
        || replicas_hold(&source, "herd_copy_held"),
    )
    .await;
    wait_healthy(&source, 0, None);
    let status = source.status();
    let replica = status["nodes"]
        .as_array()
        .and_then(|n| n.iter().find(|n| n["role"] == "replica"))
        .and_then(|n| n["pid"].as_i64())
        .expect("replica pid") as i32;
    let startup = Pid::from_raw(startup_process(replica));
    kill(startup, Signal::SIGSTOP).expect("stop replay");
    let primary = connect(&source.url(&["--primary"])).await;
    primary
        .batch_execute("insert into t values (2)")
        .await
        .expect("async insert");
    tokio::time::sleep(Duration::from_secs(4)).await;
    let arrived_early = has(2).await;
    kill(startup, Signal::SIGCONT).expect("resume replay");
    assert!(
        !arrived_early,
        "a commit no replica held reached the target"
    );
    eventually(
        Duration::from_secs(30),
        "the row once the replica replayed it",
        || has(2),
    )
    .await;
    source.herd_ok(&["copy", "drop", "held"]);

    // A whole schema: every table of it, created on the target with its rows.
    src.batch_execute(
        "create schema audit; \
         create table audit.logins (id int primary key, who text); \
         create table audit.changes (id bigint primary key, what text not null); \
         insert into audit.logins select g, 'u' || g from generate_series(1, 30) g; \
         insert into audit.changes select g, 'c' || g from generate_series(1, 20) g",
    )
    .await
    .expect("schema audit");
    source.herd_ok(&[
        "copy", "create", "audit", "--to", &tgt_url, "--schema", "audit",
    ]);
    src.batch_execute("insert into audit.logins values (31, 'late')")
        .await
        .expect("a later row");
    eventually(
        Duration::from_secs(30),
        "both tables of the schema copied",
        || async {
            let r = tgt
            .query_one(
                "select (select count(*) from audit.logins), (select count(*) from audit.changes)",
                &[],
            )
            .await;
            r.is_ok_and(|r| (r.get::<_, i64>(0), r.get::<_, i64>(1)) == (31, 20))
        },
    )
    .await;
    let tables: Vec<String> = copy_status(&source, "audit")["tables"]
        .as_array()
        .expect("tables")
        .iter()
        .filter_map(|t| t["table"].as_str().map(str::to_string))
        .collect();
    assert_eq!(tables, ["audit.changes", "audit.logins"]);
    // A table created in the schema later joins with `herd copy refresh`.
    src.batch_execute(
        "create table audit.extra (id int primary key); insert into audit.extra values (1), (2)",
    )
    .await
    .expect("a later table");
    let out = source.herd_ok(&["copy", "refresh", "audit"]);
    assert!(out.contains("added audit.extra"), "{out}");
    src.batch_execute("insert into audit.extra values (3)")
        .await
        .expect("a row after the refresh");
    eventually(
        Duration::from_secs(30),
        "the later table copied and streamed",
        || async {
            tgt.query_one("select count(*) from audit.extra", &[])
                .await
                .is_ok_and(|r| r.get::<_, i64>(0) == 3)
        },
    )
    .await;
    assert!(source
        .herd_ok(&["copy", "refresh", "audit"])
        .contains("no table to add"));
    source.herd_ok(&["copy", "drop", "audit"]);

    // Through the endpoint, a logical replication connection reaches the primary (psql's
    // IDENTIFY_SYSTEM answers with the timeline); a physical one is refused, named.
    let endpoint = source.url(&[]);
    let psql = |replication: &str| {
        std::process::Command::new("psql")
            .arg(format!("{endpoint}?replication={replication}"))
            .args(["-Atc", "IDENTIFY_SYSTEM"])
            .output()
            .expect("psql")
    };
    let logical = psql("database");
    assert!(logical.status.success(), "{}", describe(&logical));
    assert!(
        String::from_utf8_lossy(&logical.stdout).contains("|"),
        "{}",
        describe(&logical)
    );
    let physical = psql("true");
    assert!(!physical.status.success());
    assert!(
        String::from_utf8_lossy(&physical.stderr)
            .contains("physical replication connections are not served"),
        "{}",
        describe(&physical)
    );
}

/// A copy of one shard group's rows of a distributed table: the subscription reaches that
/// group's primary through the endpoint (`-c herd.group=1`), and the target holds exactly the
/// rows stored on group 1.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_copy_from_one_shard_group() {
    let source = cluster();
    let target = cluster();
    source.up(&["--shards", "2", "--replicas", "0"]);
    target.up(&["--replicas", "0"]);
    let endpoint = connect(&source.url(&[])).await;
    endpoint
        .batch_execute("create table acct (id bigint primary key, balance bigint not null)")
        .await
        .expect("create");
    endpoint
        .simple_query("select herd.create_distributed_table('acct', 'id')")
        .await
        .expect("distribute");
    let rows: Vec<String> = (1..=400).map(|i| format!("({i}, {})", i * 10)).collect();
    endpoint
        .batch_execute(&format!(
            "insert into acct (id, balance) values {}",
            rows.join(", ")
        ))
        .await
        .expect("rows on both groups");
    let group1 = connect(&source.url(&["--primary", "--group", "1"])).await;
    let on_group1 = "select count(*), coalesce(sum(balance), 0)::bigint from acct";
    let want: (i64, i64) = {
        let r = group1
            .query_one(on_group1, &[])
            .await
            .expect("group 1's rows");
        (r.get(0), r.get(1))
    };
    assert!(
        want.0 > 0 && want.0 < 400,
        "group 1 holds part of the rows: {want:?}"
    );
    let tgt_url = target.url(&[]);
    source.herd_ok(&[
        "copy", "create", "g1", "--group", "1", "--to", &tgt_url, "--table", "acct",
    ]);
    endpoint
        .batch_execute("update acct set balance = balance + 1")
        .await
        .expect("a write on every group");
    // The first copy restarted group 1's primary (wal_level = logical): connect again.
    let group1 = connect(&source.url(&["--primary", "--group", "1"])).await;
    let want: (i64, i64) = {
        let r = group1
            .query_one(on_group1, &[])
            .await
            .expect("group 1's rows");
        (r.get(0), r.get(1))
    };
    let tgt = connect(&tgt_url).await;
    eventually(
        Duration::from_secs(30),
        "the target equal to group 1's rows",
        || async {
            let r = tgt.query_one(on_group1, &[]).await.expect("target rows");
            (r.get::<_, i64>(0), r.get::<_, i64>(1)) == want
        },
    )
    .await;
    let s = copy_status(&source, "g1");
    assert_eq!(
        (s["group"].as_u64(), s["state"].as_str()),
        (Some(1), Some("streaming")),
        "{s}"
    );
    source.herd_ok(&["copy", "drop", "g1"]);
}
