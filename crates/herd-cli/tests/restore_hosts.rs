//! A multi-host sharded cluster restored to a named restore point from its repository alone,
//! onto one host (`herd restore --to NAME --repository DIR`: a one-host `herd up` layout of as
//! many groups). Modelled on loopback: one etcd, two shard groups of one `herd agent` each, with
//! `[backup]` naming a repository every agent sees, and one `herd proxy` with its HTTP API.
//! Bank transfers spanning the groups run through the proxy while `herd backup --dcs` backs up
//! both groups and takes its restore point across them, and then while `herd backup
//! restore-point NAME --dcs` (no --proxy-api: the proxy is found through its registration) takes
//! another. Both points reach the repository's record (group 0's leading agent copies them).
//! Restored to the second: the balances sum to the start (no half-applied transfer), every
//! transfer acknowledged before the point is there and none begun after it.

mod common;

use std::collections::HashSet;
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::agent_groups::Groups;
use common::hosts::HERD;
use herd_testkit::describe;

const AGENTS: [(&str, u32); 2] = [("a0", 0), ("b0", 1)];
const ACCOUNTS: i64 = 40;
const START: i64 = 1000;

/// One transfer spanning the groups, logged in `done` under `id`: all of it commits or none.
async fn transfer(db: &tokio_postgres::Client, id: i64, from: i64, to: i64, amount: i64) -> bool {
    let sql = [
        "begin".to_string(),
        format!("update accounts set balance = balance - {amount} where id = {from}"),
        format!("update accounts set balance = balance + {amount} where id = {to}"),
        format!("insert into done (id) values ({id})"),
        "commit".to_string(),
    ];
    common::all_or_nothing(db, &sql).await
}

/// `herd ARGS` within `limit`.
fn herd(args: &[&str], limit: Duration) -> std::process::Output {
    let mut cmd = Command::new(HERD);
    cmd.args(args);
    herd_testkit::output_within(&mut cmd, limit).expect("herd exits in time")
}

/// Waits (60 s at most) until each group's primary has archived the WAL segment holding its
/// current position (switched first): the points taken before are in the repository then.
async fn archived(g: &Groups) {
    for i in 0..AGENTS.len() {
        let db = common::connect(&g.direct_url(i)).await;
        let row = db
            .query_one(
                "select pg_walfile_name(pg_current_wal_lsn()), pg_switch_wal()::text",
                &[],
            )
            .await
            .expect("switch WAL");
        let segment: String = row.get(0);
        common::eventually(
            Duration::from_secs(60),
            &format!("group {i}'s segment {segment} archived"),
            || {
                let (db, segment) = (&db, segment.clone());
                async move {
                    let last: Option<String> = db
                        .query_one("select last_archived_wal from pg_stat_archiver", &[])
                        .await
                        .ok()
                        .and_then(|r| r.get(0));
                    last.is_some_and(|l| l.get(..24) >= Some(segment.as_str()))
                }
            },
        )
        .await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_multi_host_cluster_is_restored_to_a_named_point_from_its_repository() {
    let started = Instant::now();
    let mut g = Groups::new(&AGENTS, "rh");
    let repository = g.dir.path().join("repo");
    // The agents' herd.toml (written before the first agent starts, which keeps it).
    std::fs::write(
        g.dir.path().join("agent.toml"),
        format!(
            "[postgres]\nwal_level = \"logical\"\n\n[backup]\nrepository = \"{}\"\n",
            repository.display()
        ),
    )
    .expect("agent.toml");
    let db = g.start_primaries_and_proxy().await;
    for sql in [
        "create table accounts (id bigint primary key, balance bigint not null)",
        "select herd.create_distributed_table('accounts', 'id')",
        "create table done (id bigint primary key)",
        "select herd.create_distributed_table('done', 'id')",
    ] {
        db.simple_query(sql).await.expect(sql);
    }
    common::fill_accounts(&db, ACCOUNTS, START).await;
    // Which group holds each account (group 0's primary is agent 0, group 1's agent 1).
    let on = common::accounts_by_group(&[g.direct_url(0), g.direct_url(1)]).await;
    assert!(on[0].len() >= 2 && on[1].len() >= 2, "{on:?}");

    // Transfers spanning the groups: (id, begun after the point) of each acknowledged one.
    let stop = Arc::new(AtomicBool::new(false));
    let after = Arc::new(AtomicBool::new(false));
    let acked: Arc<Mutex<Vec<(i64, bool)>>> = Arc::default();
    let workers: Vec<_> = (0..3)
        .map(|w| {
            let (stop, after, acked, on) = (stop.clone(), after.clone(), acked.clone(), on.clone());
            let url = g.url(g.proxy_port());
            tokio::spawn(async move {
                let db = common::connect(&url).await;
                let mut i = 0usize;
                while !stop.load(Ordering::Relaxed) {
                    i += 1;
                    let a = on[0][(i + w) % on[0].len()];
                    let b = on[1][(i * 7 + w) % on[1].len()];
                    let (from, to) = if i.is_multiple_of(2) { (a, b) } else { (b, a) };
                    let begun_after = after.load(Ordering::SeqCst);
                    let id = (w * 1_000_000 + i) as i64;
                    if transfer(&db, id, from, to, (i % 9 + 1) as i64).await {
                        if let Ok(mut v) = acked.lock() {
                            v.push((id, begun_after));
                        }
                    }
                }
            })
        })
        .collect();
    let count = |acked: &Arc<Mutex<Vec<(i64, bool)>>>| acked.lock().map_or(0, |v| v.len());
    common::eventually(Duration::from_secs(30), "transfers committing", || {
        let n = count(&acked);
        async move { n >= 10 }
    })
    .await;

    // Both groups backed up, then a point across them (as `herd up`'s `herd backup` does).
    let out = tokio::task::block_in_place(|| {
        herd(
            &["backup", "--dcs", &g.dcs(), "--cluster", &g.cluster],
            Duration::from_secs(180),
        )
    });
    let text = describe(&out);
    assert!(out.status.success(), "{text}\nlogs:\n{}", g.logs());
    assert!(
        text.contains("Shard group 0: backup") && text.contains("Shard group 1: backup"),
        "{text}"
    );
    assert!(
        text.contains("Restore point backup-") && text.contains("on 2 shard groups"),
        "{text}"
    );
    assert!(
        text.contains("Recorded in the repository's herd-restore-points.tsv"),
        "{text}"
    );

    // The named point, through the proxy the store names.
    let before = count(&acked);
    common::eventually(
        Duration::from_secs(30),
        "transfers after the backups",
        || {
            let n = count(&acked);
            async move { n >= before + 10 }
        },
    )
    .await;
    let acked_before: HashSet<i64> = acked
        .lock()
        .map(|v| v.iter().map(|(id, _)| *id).collect())
        .unwrap_or_default();
    let out = tokio::task::block_in_place(|| {
        herd(
            &[
                "backup",
                "restore-point",
                "mid_load",
                "--dcs",
                &g.dcs(),
                "--cluster",
                &g.cluster,
            ],
            Duration::from_secs(60),
        )
    });
    after.store(true, Ordering::SeqCst);
    let text = describe(&out);
    assert!(out.status.success(), "{text}\nlogs:\n{}", g.logs());
    assert!(
        text.contains("Restore point mid_load at") && text.contains("on 2 shard groups"),
        "{text}"
    );
    assert!(
        text.contains("Recorded in the repository's herd-restore-points.tsv"),
        "{text}"
    );
    let record = std::fs::read_to_string(herd_testkit_points(&repository)).expect("record");
    for name in ["mid_load\t", "backup-"] {
        assert_eq!(
            record.lines().filter(|l| l.starts_with(name)).count(),
            2,
            "one line per group of {name}: {record}"
        );
    }
    let at_point = count(&acked);
    common::eventually(Duration::from_secs(30), "transfers after the point", || {
        let n = count(&acked);
        async move { n >= at_point + 10 }
    })
    .await;
    stop.store(true, Ordering::Relaxed);
    for w in workers {
        let _ = tokio::time::timeout(Duration::from_secs(30), w).await;
    }
    let begun_after: Vec<i64> = acked
        .lock()
        .map(|v| v.iter().filter(|(_, a)| *a).map(|(id, _)| *id).collect())
        .unwrap_or_default();
    assert!(!begun_after.is_empty());
    archived(&g).await;

    // Restored onto one host from the repository alone.
    let new = common::cluster();
    let (new_dir, new_port) = (new.data_dir().display().to_string(), new.port.to_string());
    let repo = repository.display().to_string();
    let restore = |to: &str, dir: &str| {
        herd(
            &[
                "restore",
                "--to",
                to,
                "--repository",
                &repo,
                "--data-dir",
                dir,
                "--port",
                &new_port,
            ],
            Duration::from_secs(180),
        )
    };
    // Refused with nothing written: an unknown name, a live agent's directory.
    let out = tokio::task::block_in_place(|| restore("no_such_point", &new_dir));
    assert!(
        !out.status.success() && describe(&out).contains("no restore point named"),
        "{}",
        describe(&out)
    );
    assert!(std::fs::read_dir(new.data_dir()).map_or(true, |mut d| d.next().is_none()));
    let live = g.agent_dir(0).display().to_string();
    let out = tokio::task::block_in_place(|| restore("mid_load", &live));
    assert!(
        !out.status.success()
            && describe(&out).contains("data directory of a running Herd cluster"),
        "{}",
        describe(&out)
    );
    let restoring = Instant::now();
    let out = tokio::task::block_in_place(|| restore("mid_load", &new_dir));
    let text = describe(&out);
    assert!(out.status.success(), "{text}");
    assert!(
        text.contains("shard group 0 from backup") && text.contains("shard group 1 from backup"),
        "{text}"
    );
    eprintln!(
        "restore of 2 groups to mid_load: {:.1} s",
        restoring.elapsed().as_secs_f64()
    );
    new.up(&[]);
    let restored = common::connect(&new.url(&[])).await;
    let sum: i64 = restored
        .query_one("select sum(balance)::int8 from accounts", &[])
        .await
        .expect("sum")
        .get(0);
    assert_eq!(sum, ACCOUNTS * START, "no half-applied transfer");
    let ids: HashSet<i64> = restored
        .query("select id from done", &[])
        .await
        .expect("done")
        .iter()
        .map(|r| r.get(0))
        .collect();
    let missing: Vec<&i64> = acked_before.iter().filter(|id| !ids.contains(id)).collect();
    assert!(
        missing.is_empty(),
        "acknowledged before the point: {missing:?}"
    );
    let present: Vec<&i64> = begun_after.iter().filter(|id| ids.contains(id)).collect();
    assert!(present.is_empty(), "begun after the point: {present:?}");
    eprintln!(
        "restored {} transfers: {} acknowledged before the point, {} begun after it absent; \
         test {:.1} s",
        ids.len(),
        acked_before.len(),
        begun_after.len(),
        started.elapsed().as_secs_f64()
    );
    let _ = new.herd(&["down"]);
}

/// The repository's record of restore points.
fn herd_testkit_points(repository: &std::path::Path) -> std::path::PathBuf {
    repository.join("herd-restore-points.tsv")
}
