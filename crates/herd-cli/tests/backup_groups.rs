//! Backups of a cluster of two shard groups (real PostgreSQL, real pgBackRest): `herd backup`
//! of every group, a restore point taken across the groups while bank transfers spanning them
//! run through the endpoint, and `herd restore --to` that point: the restored cluster's
//! balances sum to the start and every transfer has both legs or neither. Bad input (a used,
//! empty or too long point name; a restore to an unknown name, `latest` or a time before any
//! point) fails clearly with nothing written.

mod common;

use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use common::groups::group;
use common::{cluster, connect};
use herd_testkit::describe;

/// Accounts, each starting with this balance.
const ACCOUNTS: i64 = 40;
const START: i64 = 1000;

/// A `herd` run that must fail: its stderr.
fn refused(out: &std::process::Output) -> String {
    assert!(
        !out.status.success(),
        "should have failed: {}",
        describe(out)
    );
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// One transfer spanning the groups, `amount` from `from` to `to`, each leg logged with the
/// transfer's id: both legs commit or neither.
async fn transfer(db: &tokio_postgres::Client, id: i64, from: i64, to: i64, amount: i64) -> bool {
    let sql = [
        "begin".to_string(),
        format!("update accounts set balance = balance - {amount} where id = {from}"),
        format!("insert into legs (transfer, account, delta) values ({id}, {from}, -{amount})"),
        format!("update accounts set balance = balance + {amount} where id = {to}"),
        format!("insert into legs (transfer, account, delta) values ({id}, {to}, {amount})"),
        "commit".to_string(),
    ];
    common::all_or_nothing(db, &sql).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restore_point_across_groups_never_holds_half_a_transfer() {
    let old = cluster();
    std::fs::create_dir_all(old.data_dir()).expect("data dir");
    std::fs::write(
        old.data_dir().join("herd.toml"),
        "[backup]\nenabled = true\n",
    )
    .expect("herd.toml");
    old.up(&["--shards", "2", "--replicas", "1"]);
    let endpoint = old.url(&[]);
    let db = connect(&endpoint).await;
    db.batch_execute(
        "create table accounts (id bigint primary key, balance bigint not null);
         create table legs (transfer bigint not null, account bigint not null,
                            delta bigint not null, primary key (transfer, account));",
    )
    .await
    .expect("tables");
    for (table, key) in [("accounts", "id"), ("legs", "account")] {
        db.simple_query(&format!(
            "select herd.create_distributed_table('{table}', '{key}')"
        ))
        .await
        .expect("distribute");
    }
    common::fill_accounts(&db, ACCOUNTS, START).await;
    let direct: Vec<String> = (0..2)
        .map(|g| old.url(&["--group", &g.to_string(), "--primary"]))
        .collect();
    let on = common::accounts_by_group(&direct).await;
    assert!(
        on[0].len() >= 2 && on[1].len() >= 2,
        "both groups hold accounts: {on:?}"
    );

    // Every group backed up, and a point across them taken with the backups.
    let out = old.herd_ok(&["backup"]);
    for g in 0..2 {
        assert!(
            out.contains(&format!("Shard group {g}: backup ")),
            "group {g}: {out}"
        );
    }
    assert_eq!(
        out.matches("copied from a standby").count(),
        2,
        "each group's from its standby: {out}"
    );
    assert!(out.contains("Restore point backup-"), "{out}");
    let list = old.herd_ok(&["backup", "list"]);
    assert!(list.starts_with("GROUP"), "{list}");
    for g in ['0', '1'] {
        assert_eq!(
            list.lines()
                .filter(|l| l.starts_with(g) && l.contains(" full "))
                .count(),
            1,
            "group {g}: {list}"
        );
    }

    // A moment after the backups' point and before the load: a restore to it uses that point.
    let before_load: String = db
        .query_one(
            "select to_char(clock_timestamp() at time zone 'UTC', 'YYYY-MM-DD HH24:MI:SS.US')",
            &[],
        )
        .await
        .expect("now")
        .get(0);

    // Transfers spanning the groups, from three sessions, while the point is taken.
    let stop = Arc::new(AtomicBool::new(false));
    let next_id = Arc::new(AtomicI64::new(0));
    let acked = Arc::new(AtomicI64::new(0));
    let workers: Vec<_> = (0..3)
        .map(|w| {
            let (stop, next_id, acked) = (stop.clone(), next_id.clone(), acked.clone());
            let (endpoint, on) = (endpoint.clone(), on.clone());
            tokio::spawn(async move {
                let db = connect(&endpoint).await;
                let mut i = w;
                while !stop.load(Ordering::Relaxed) {
                    i += 1;
                    let a = on[0][i % on[0].len()];
                    let b = on[1][(i * 7) % on[1].len()];
                    let (from, to) = if i % 2 == 0 { (a, b) } else { (b, a) };
                    let id = next_id.fetch_add(1, Ordering::SeqCst) + 1;
                    if transfer(&db, id, from, to, (i % 9 + 1) as i64).await {
                        acked.fetch_add(1, Ordering::SeqCst);
                    }
                }
            })
        })
        .collect();
    common::eventually(Duration::from_secs(30), "transfers committing", || {
        let n = acked.load(Ordering::SeqCst);
        async move { n >= 20 }
    })
    .await;
    let acked_before = acked.load(Ordering::SeqCst);
    let out = tokio::task::block_in_place(|| old.herd(&["backup", "restore-point", "mid-load"]));
    let issued_after = next_id.load(Ordering::SeqCst);
    assert!(out.status.success(), "restore point: {}", describe(&out));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("Restore point mid-load at ")
            && text.contains("two-phase commits held for ")
            && text.contains("shard group 1: "),
        "{text}"
    );
    eprintln!("{text}");
    // Counted: the backups' point and this one.
    let metrics = common::api_get_text(old.api_port(), "/metrics");
    assert!(
        metrics.contains("herd_restore_points_total{outcome=\"taken\"} 2"),
        "{metrics}"
    );
    // The load goes on after the point.
    common::eventually(Duration::from_secs(30), "transfers after the point", || {
        let n = acked.load(Ordering::SeqCst);
        async move { n >= acked_before + 20 }
    })
    .await;
    stop.store(true, Ordering::Relaxed);
    for w in workers {
        w.await.expect("worker");
    }
    let points = std::fs::read_to_string(old.data_dir().join("backup/restore-points.tsv"))
        .expect("restore-points.tsv");
    for g in 0..2 {
        assert_eq!(
            points
                .lines()
                .filter(|l| l.starts_with("mid-load\t") && l.ends_with(&format!("\t{g}")))
                .count(),
            1,
            "group {g}'s record: {points}"
        );
    }

    // Names refused: used, empty, too long (64 characters).
    let long = "p".repeat(64);
    for (name, says) in [
        ("mid-load", "exists already"),
        ("", "cannot name"),
        (long.as_str(), "cannot name"),
    ] {
        let err = refused(&old.herd(&["backup", "restore-point", name]));
        assert!(err.contains(says), "{name:?}: {err}");
    }

    let new = cluster();
    let old_dir = old.data_dir().display().to_string();
    let new_port = new.port.to_string();
    let restore = |to: &str| {
        new.herd(&[
            "restore",
            "--to",
            to,
            "--from-data-dir",
            &old_dir,
            "--port",
            &new_port,
        ])
    };
    let repository = old.data_dir().join("backup-repo").display().to_string();
    let from_repository = |to: &str| {
        new.herd(&[
            "restore",
            "--to",
            to,
            "--repository",
            &repository,
            "--port",
            &new_port,
        ])
    };
    // The repository alone knows the groups (its stanzas) and the points (its copy of the
    // record).
    for (to, says) in [
        ("no-such-point", "backup-repo: no restore point named"),
        ("latest", "not one moment across them"),
    ] {
        let err = refused(&from_repository(to));
        assert!(err.contains(says), "--repository, {to}: {err}");
    }
    for (to, says) in [
        ("no-such-point", "no restore point named 'no-such-point'"),
        ("latest", "not one moment across them"),
        ("0/3000060", "not one moment across them"),
        ("2000-01-01 00:00:00", "none was taken at or before"),
    ] {
        let err = refused(&restore(to));
        assert!(err.contains(says), "{to}: {err}");
        assert!(
            std::fs::read_dir(new.data_dir()).map_or(true, |mut d| d.next().is_none()),
            "{to}: nothing written"
        );
    }

    // A time maps to the newest point at or before it (said so): here the backups' point, with
    // no transfer yet. From the repository alone (the data directory lost: default settings,
    // the groups counted from its stanzas, the points from its copy of the record), at the same
    // time as the restore to the point (a cluster of its own, not started).
    let by_time = {
        let (repository, before_load) = (repository.clone(), before_load.clone());
        tokio::task::spawn_blocking(move || {
            let c = cluster();
            let port = c.port.to_string();
            let args = [
                "restore",
                "--to",
                &before_load,
                "--repository",
                &repository,
                "--port",
                &port,
            ];
            (c.herd(&args), c)
        })
    };
    let out = tokio::task::block_in_place(|| restore("mid-load"));
    assert!(out.status.success(), "restore: {}", describe(&out));
    let (by_time, time_cluster) = by_time.await.expect("restore by time");
    assert!(
        by_time.status.success(),
        "restore by time: {}",
        describe(&by_time)
    );
    let said = String::from_utf8_lossy(&by_time.stderr);
    assert!(
        said.contains("restoring to the restore point 'backup-"),
        "{said}"
    );
    let said = String::from_utf8_lossy(&by_time.stdout);
    assert!(said.contains("shard group 1 from backup"), "{said}");
    let toml = std::fs::read_to_string(time_cluster.data_dir().join("herd.toml")).expect("toml");
    assert!(toml.contains("shards = 2"), "{toml}");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("shard group 0 from backup") && text.contains("shard group 1 from backup"),
        "{text}"
    );
    new.up(&[]);
    // The same topology: two groups, each with its replica streaming from its restored primary.
    let status = new.status();
    assert_eq!(
        status["groups"].as_array().map(Vec::len),
        Some(1),
        "a second group: {status}"
    );
    for g in 0..2 {
        herd_testkit::wait_until(
            Duration::from_secs(30),
            &format!("group {g}'s replica streaming"),
            || {
                let nodes = group(&new.status(), g)["nodes"].clone();
                nodes
                    .as_array()?
                    .iter()
                    .any(|n| n["role"] == "replica" && n["state"] == "streaming")
                    .then_some(())
            },
        );
    }
    let restored = connect(&new.url(&[])).await;
    let sum: i64 = restored
        .query_one("select sum(balance)::bigint from accounts", &[])
        .await
        .expect("sum")
        .get(0);
    assert_eq!(sum, ACCOUNTS * START, "balances sum to the start");
    let legs: Vec<(i64, i64, i64)> = restored
        .query(
            "select transfer, count(*), sum(delta)::bigint from legs group by transfer",
            &[],
        )
        .await
        .expect("legs")
        .iter()
        .map(|r| (r.get(0), r.get(1), r.get(2)))
        .collect();
    let half: Vec<_> = legs.iter().filter(|(_, n, s)| *n != 2 || *s != 0).collect();
    assert!(half.is_empty(), "transfers half applied: {half:?}");
    let transfers = legs.len() as i64;
    eprintln!(
        "restored {transfers} transfers: {acked_before} acknowledged before the point, \
         {issued_after} begun by its end"
    );
    assert!(
        transfers >= acked_before && transfers <= issued_after,
        "{transfers} transfers restored: at least the {acked_before} acknowledged before the \
         point, at most the {issued_after} begun by its end"
    );
    // Each account's balance is its start plus its legs, on whichever group it lives.
    let mut expected = std::collections::BTreeMap::new();
    for r in restored
        .query("select account, delta from legs", &[])
        .await
        .expect("every leg")
    {
        *expected.entry(r.get::<_, i64>(0)).or_insert(START) += r.get::<_, i64>(1);
    }
    let wrong: Vec<(i64, i64)> = restored
        .query("select id, balance from accounts", &[])
        .await
        .expect("balances")
        .iter()
        .map(|r| (r.get::<_, i64>(0), r.get::<_, i64>(1)))
        .filter(|(id, balance)| *balance != *expected.get(id).unwrap_or(&START))
        .collect();
    assert!(
        wrong.is_empty(),
        "balances not matching their legs: {wrong:?}"
    );
}
