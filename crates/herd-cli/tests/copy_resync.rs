//! A failover of the source while a table's initial copy catches up (state `f`): PostgreSQL's
//! table-copy slot is not on the new primary, so the table's copy would retry forever; Herd
//! copies that table again and the copy streams, equal to the source.
//!
//! The catch-up is held open on purpose: the target's table has a trigger (enabled for
//! replication) that sleeps on every replicated UPDATE, and a writer keeps updating the source,
//! so the table stays in state `f` until the test lets it go.

mod common;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use common::copies::{fingerprint, replicas_hold};
use common::groups::wait_healthy;
use common::{cluster, connect, eventually};

const CONTENT: &str =
    "select count(*), coalesce(md5(string_agg(id || ':' || v, ',' order by id)), '') from t";

/// The table's state letter on the target.
async fn table_state(target: &tokio_postgres::Client) -> Option<String> {
    target
        .query_opt(
            "select srsubstate::text from pg_subscription_rel where srrelid = 't'::regclass",
            &[],
        )
        .await
        .ok()
        .flatten()
        .map(|r| r.get(0))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_table_copy_cut_by_a_failover_is_copied_again() {
    let source = cluster();
    let target = cluster();
    source.up(&[]);
    target.up(&["--replicas", "0"]);
    let src = connect(&source.url(&[])).await;
    src.batch_execute(
        "create table t (id int primary key, v bigint not null); \
         insert into t select g, 0 from generate_series(1, 200000) g",
    )
    .await
    .expect("source table");
    let tgt_url = target.url(&[]);
    let tgt = connect(&tgt_url).await;
    tgt.batch_execute(
        "create table t (id int primary key, v bigint not null); \
         create function slow() returns trigger language plpgsql as \
           $$ begin perform pg_sleep(0.2); return new; end $$; \
         create trigger slow before update on t for each row execute function slow(); \
         alter table t enable always trigger slow",
    )
    .await
    .expect("target table with a slow trigger");

    // A writer on the source, reconnecting through the failover.
    let stop = Arc::new(AtomicBool::new(false));
    let writer = {
        let (url, stop) = (source.url(&[]), stop.clone());
        tokio::spawn(async move {
            let mut n: i64 = 0;
            while !stop.load(Ordering::Relaxed) {
                let Ok((client, conn)) = tokio_postgres::connect(&url, tokio_postgres::NoTls).await
                else {
                    tokio::time::sleep(Duration::from_millis(200)).await;
                    continue;
                };
                tokio::spawn(conn);
                while !stop.load(Ordering::Relaxed) {
                    n += 1;
                    let id = (n * 7919) % 200_000 + 1;
                    if client
                        .execute("update t set v = v + 1 where id = $1::int", &[&(id as i32)])
                        .await
                        .is_err()
                    {
                        break;
                    }
                    tokio::time::sleep(Duration::from_millis(5)).await;
                }
            }
        })
    };
    // Not waiting for the initial copy (the command says it goes on in the background).
    let out = source.herd(&[
        "copy",
        "create",
        "cut",
        "--to",
        &tgt_url,
        "--table",
        "t",
        "--wait-timeout",
        "0",
    ]);
    let text = herd_testkit::describe(&out);
    assert!(text.contains("goes on in the background"), "{text}");
    // The rows are in, the catch-up is under way (held by the trigger), the copy's own slot
    // is on every replica: now the source's primary dies.
    let tgt = connect(&tgt_url).await;
    eventually(Duration::from_secs(90), "the table in state f", || async {
        table_state(&tgt).await.as_deref() == Some("f")
    })
    .await;
    eventually(
        Duration::from_secs(60),
        "slot copies on every replica",
        || replicas_hold(&source, "herd_copy_cut"),
    )
    .await;
    assert_eq!(table_state(&tgt).await.as_deref(), Some("f"));
    let first = wait_healthy(&source, 0, None);
    common::kill_primary(&source);
    wait_healthy(&source, 0, Some(&first));
    tokio::time::sleep(Duration::from_secs(3)).await;
    stop.store(true, Ordering::Relaxed);
    let _ = tokio::time::timeout(Duration::from_secs(20), writer).await;
    tgt.batch_execute("drop trigger slow on t")
        .await
        .expect("drop the trigger");

    // The table is copied again from the new primary and streams; the target equals the
    // source (its acknowledged updates included).
    let src = connect(&source.url(&[])).await;
    let want = fingerprint(&src, CONTENT).await;
    eventually(
        Duration::from_secs(120),
        "the target equal to the source",
        || async {
            table_state(&tgt).await.as_deref() == Some("r")
                && fingerprint(&tgt, CONTENT).await == want
        },
    )
    .await;
    let s = common::copies::copy_status(&source, "cut");
    assert_eq!(s["state"], "streaming", "{s}");
    let log = std::fs::read_to_string(source.data_dir().join("logs/herd.log")).unwrap_or_default();
    assert!(
        log.contains("copying the table again"),
        "the table was not copied again by Herd"
    );
    source.herd_ok(&["copy", "drop", "cut"]);
}
