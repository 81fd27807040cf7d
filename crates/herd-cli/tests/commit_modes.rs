//! Commit modes set the primary's `synchronous_commit` / `synchronous_standby_names` at run time,
//! remote_apply makes a commit visible on the sync standbys when COMMIT returns, and
//! `SET LOCAL synchronous_commit` changes the wait of one transaction.

mod common;

use std::time::Duration;

use common::{cluster, connect, eventually};
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;

async fn setting(url: &str, name: &str) -> String {
    let c = connect(url).await;
    c.query_one(&format!("select current_setting('{name}')"), &[])
        .await
        .expect("setting")
        .get(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn commit_modes_apply_at_run_time() {
    let c = cluster();
    c.up(&[]);
    let primary_url = c.url(&["--primary"]);
    let replica_urls = [c.url(&["--replica", "1"]), c.url(&["--replica", "2"])];

    for (mode, expected) in [
        ("async", "local"),
        ("remote_write", "remote_write"),
        ("remote_apply", "remote_apply"),
        ("on", "on"),
    ] {
        let out = c.herd_ok(&["config", "set", "commit-mode", mode]);
        assert!(out.contains(expected), "{out}");
        eventually(
            Duration::from_secs(10),
            "synchronous_commit on the primary",
            || async { setting(&primary_url, "synchronous_commit").await == expected },
        )
        .await;
        // Replicas carry the same setting, ready for the day one of them is promoted.
        for url in &replica_urls {
            eventually(
                Duration::from_secs(10),
                "synchronous_commit on a replica",
                || async { setting(url, "synchronous_commit").await == expected },
            )
            .await;
        }
        assert_eq!(c.status()["commit_mode"], mode);
    }
    assert!(std::fs::read_to_string(c.data_dir().join("herd.toml"))
        .expect("herd.toml")
        .contains("commit_mode = \"on\""));

    c.herd_ok(&["config", "set", "sync-standbys", "ANY 2"]);
    eventually(
        Duration::from_secs(10),
        "synchronous_standby_names",
        || async {
            setting(&primary_url, "synchronous_standby_names").await
                == "ANY 2 (\"node1\", \"node2\")"
        },
    )
    .await;

    // remote_apply over ANY 2: every committed row is visible on both replicas at once.
    c.herd_ok(&["config", "set", "commit-mode", "remote_apply"]);
    eventually(Duration::from_secs(10), "remote_apply", || async {
        setting(&primary_url, "synchronous_commit").await == "remote_apply"
    })
    .await;
    let primary = connect(&primary_url).await;
    primary
        .batch_execute("create table ledger(id int primary key)")
        .await
        .expect("create");
    let replicas = [
        connect(&replica_urls[0]).await,
        connect(&replica_urls[1]).await,
    ];
    for id in 0..100i32 {
        primary
            .execute("insert into ledger values ($1)", &[&id])
            .await
            .expect("insert");
        for r in &replicas {
            let seen = r
                .query_opt("select 1 from ledger where id = $1", &[&id])
                .await
                .expect("read");
            assert!(
                seen.is_some(),
                "row {id} not visible on a sync standby right after COMMIT"
            );
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn set_local_synchronous_commit_waits_for_standbys() {
    let c = cluster();
    c.up(&["--commit-mode", "async", "--sync-standbys", "ANY 2"]);
    let primary_url = c.url(&["--primary"]);
    let primary = connect(&primary_url).await;
    primary
        .batch_execute("create table t(id int)")
        .await
        .expect("create");

    // Freeze node2's WAL receiver: it stays up (so the supervisor leaves it alone) but confirms nothing.
    let node2 = connect(&c.url(&["--replica", "node2"])).await;
    let receiver: i32 = node2
        .query_one("select pid from pg_stat_wal_receiver", &[])
        .await
        .expect("walreceiver")
        .get(0);
    let receiver = Pid::from_raw(receiver);
    kill(receiver, Signal::SIGSTOP).expect("SIGSTOP walreceiver");

    // Async: the commit returns although a standby of the quorum is frozen.
    tokio::time::timeout(
        Duration::from_secs(20),
        primary.batch_execute("insert into t values (1)"),
    )
    .await
    .expect("an async commit must not wait for standbys")
    .expect("insert");

    // The same session upgrades one transaction: it waits for both standbys (IPC:SyncRep).
    let upgraded = connect(&primary_url).await;
    let waiting = tokio::spawn(async move {
        upgraded
            .batch_execute(
                "begin; set local synchronous_commit = on; insert into t values (2); commit;",
            )
            .await
    });
    eventually(
        Duration::from_secs(20),
        "a backend waiting in SyncRep",
        || async {
            primary
                .query_opt(
                    "select 1 from pg_stat_activity where wait_event = 'SyncRep'",
                    &[],
                )
                .await
                .expect("pg_stat_activity")
                .is_some()
        },
    )
    .await;
    assert!(
        !waiting.is_finished(),
        "the upgraded commit returned while a quorum member was frozen"
    );

    kill(receiver, Signal::SIGCONT).expect("SIGCONT walreceiver");
    tokio::time::timeout(Duration::from_secs(30), waiting)
        .await
        .expect("commit completes once the standby confirms")
        .expect("join")
        .expect("commit");
}
