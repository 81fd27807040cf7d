//! Backups and point-in-time recovery with pgBackRest (real PostgreSQL, real pgBackRest):
//! writes with known timestamps, a full backup, more writes, `DROP TABLE`, then a restore to a
//! moment before the drop holds the table and exactly the rows committed by then; bad input
//! (a used directory, an unreachable target, no [backup]) fails clearly with nothing destroyed.

mod common;

use std::time::Duration;

use common::{cluster, connect};
use herd_testkit::describe;

/// A `herd` run that must fail: its stderr.
fn refused(out: &std::process::Output) -> String {
    assert!(
        !out.status.success(),
        "should have failed: {}",
        describe(out)
    );
    String::from_utf8_lossy(&out.stderr).into_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restore_to_a_moment_before_a_drop_table() {
    let old = cluster();
    std::fs::create_dir_all(old.data_dir()).expect("data dir");
    std::fs::write(
        old.data_dir().join("herd.toml"),
        "[backup]\nenabled = true\n",
    )
    .expect("herd.toml");
    old.up(&["--replicas", "1"]);
    let db = connect(&old.url(&["--primary"])).await;
    let archiving: String = db
        .query_one("show archive_mode", &[])
        .await
        .expect("archive_mode")
        .get(0);
    assert_eq!(archiving, "on");
    db.batch_execute(
        "create table items(id int primary key, at timestamptz not null default clock_timestamp());
         insert into items(id) select generate_series(1, 100);",
    )
    .await
    .expect("first rows");

    // A repository the servers' user cannot write, or one that is gone: `herd backup` fails
    // clearly and changes nothing (the repository is neither emptied nor created again).
    let repo = old.data_dir().join("backup-repo");
    let set_mode = |m: u32| {
        std::fs::set_permissions(&repo, std::os::unix::fs::PermissionsExt::from_mode(m))
            .expect("chmod the repository")
    };
    set_mode(0o500);
    let err = refused(&old.herd(&["backup"]));
    assert!(
        err.contains("not writable") && err.contains("backup-repo"),
        "{err}"
    );
    set_mode(0o750);
    let aside = old.data_dir().join("backup-repo-aside");
    std::fs::rename(&repo, &aside).expect("move the repository away");
    let err = refused(&old.herd(&["backup"]));
    assert!(err.contains("does not exist"), "{err}");
    assert!(!repo.exists(), "not created again");
    std::fs::rename(&aside, &repo).expect("move it back");
    assert!(
        repo.join("backup/herd-g0/backup.info").exists(),
        "the stanza is intact"
    );

    // The replica streams: its files are copied, the primary is spared.
    let out = old.herd_ok(&["backup", "--type", "full"]);
    assert!(
        out.contains("Backup ") && out.contains("(full, copied from a standby"),
        "{out}"
    );
    let list = old.herd_ok(&["backup", "list"]);
    assert!(
        list.contains("LABEL") && list.lines().filter(|l| l.contains(" full ")).count() == 1,
        "{list}"
    );

    // Rows after the backup, then the moment restored to, then rows and a drop after it. Backup
    // stop times are whole seconds: a moment in the second the backup ended may precede its
    // consistent point, and is refused, so the moment comes over a second later.
    tokio::time::sleep(Duration::from_millis(1100)).await;
    db.batch_execute("insert into items(id) select generate_series(101, 150)")
        .await
        .expect("rows after the backup");
    let moment: String = db
        .query_one(
            "select to_char(clock_timestamp() at time zone 'UTC', 'YYYY-MM-DD HH24:MI:SS.US')",
            &[],
        )
        .await
        .expect("now")
        .get(0);
    tokio::time::sleep(Duration::from_millis(300)).await;
    db.batch_execute("insert into items(id) select generate_series(151, 175)")
        .await
        .expect("rows after the moment");
    // A named restore point after row 175; a bad or a used name is refused.
    let out = old.herd_ok(&["backup", "restore-point", "before-more"]);
    assert!(out.contains("Restore point before-more at "), "{out}");
    for (name, says) in [("9lives", "cannot name"), ("before-more", "exists already")] {
        let err = refused(&old.herd(&["backup", "restore-point", name]));
        assert!(err.contains(says), "{name}: {err}");
    }
    db.batch_execute("insert into items(id) select generate_series(176, 190)")
        .await
        .expect("rows after the point");
    // A WAL position after row 190.
    let lsn: String = db
        .query_one("select pg_current_wal_lsn()::text", &[])
        .await
        .expect("lsn")
        .get(0);
    db.batch_execute("insert into items(id) select generate_series(191, 200)")
        .await
        .expect("rows after the position");
    db.batch_execute("drop table items").await.expect("drop");
    // No WAL switch here: `herd restore` has the running source archive its current segment
    // (holding the drop), as a user restoring right after a mistake needs.

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

    // An existing, non-empty directory is refused and left as it was.
    std::fs::create_dir_all(new.data_dir()).expect("new dir");
    let keep = new.data_dir().join("keep.txt");
    std::fs::write(&keep, "mine").expect("keep");
    let err = refused(&restore(&moment));
    assert!(err.contains("not empty"), "{err}");
    assert_eq!(std::fs::read_to_string(&keep).expect("kept"), "mine");
    std::fs::remove_file(&keep).expect("remove");
    // The source cluster's own, running directory is refused too.
    let err = refused(&old.herd(&["restore", "--to", "latest", "--from-data-dir", &old_dir]));
    assert!(err.contains("running Herd cluster"), "{err}");
    // A repository that does not exist, or holds no backup: nothing is written.
    let scratch = herd_testkit::scratch_dir();
    let empty_repo = scratch.path().join("empty-repo");
    std::fs::create_dir_all(&empty_repo).expect("empty repository");
    for (repository, says) in [
        (scratch.path().join("no-such-repo"), "does not exist"),
        (empty_repo, "holds no backup"),
    ] {
        let err = refused(&new.herd(&[
            "restore",
            "--to",
            "latest",
            "--repository",
            &repository.display().to_string(),
            "--port",
            &new_port,
        ]));
        assert!(err.contains(says), "{}: {err}", repository.display());
        assert_eq!(
            std::fs::read_dir(new.data_dir()).expect("dir").count(),
            0,
            "{}: nothing written",
            repository.display()
        );
    }
    // Targets the repository cannot reach: nothing is written.
    for (to, says) in [
        ("2999-01-01 00:00:00", "in the future"),
        ("2000-01-01 00:00:00", "before the end of the first backup"),
        ("0/10", "before the end of the first backup"),
        ("FFFFFFFF/0", "in the future"),
        ("2026-13-45 10:00", "not a restore target"),
        ("yesterday", "no restore point named 'yesterday'"),
    ] {
        let err = refused(&restore(to));
        assert!(err.contains(says), "{to}: {err}");
        assert_eq!(
            std::fs::read_dir(new.data_dir()).expect("dir").count(),
            0,
            "{to}: nothing written"
        );
    }

    let out = restore(&moment);
    assert!(out.status.success(), "restore: {}", describe(&out));
    new.up(&[]);
    let restored = connect(&new.url(&["--primary"])).await;
    let ids: Vec<i32> = restored
        .query("select id from items order by id", &[])
        .await
        .expect("the dropped table is back")
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert_eq!(
        ids,
        (1..=150).collect::<Vec<i32>>(),
        "exactly the rows committed by then"
    );
    // A complete cluster again: its replica streams, no recovery setting is left behind.
    let status = new.status();
    let replicas = common::nodes_with_role(&status, "replica");
    assert_eq!(replicas.len(), 1, "{status}");
    assert_eq!(replicas[0]["state"], "streaming", "{status}");
    let target: String = restored
        .query_one("show recovery_target_time", &[])
        .await
        .expect("show")
        .get(0);
    assert_eq!(target, "");

    // The restore point and the WAL position: exactly the rows committed before each. The two
    // restores run at once (the first restored cluster stops first).
    drop(restored);
    drop(new);
    let restores: Vec<_> = [("before-more".to_string(), 175), (lsn, 190)]
        .into_iter()
        .map(|(to, last)| {
            let old_dir = old_dir.clone();
            tokio::task::spawn_blocking(move || {
                let c = cluster();
                let out = c.herd(&[
                    "restore",
                    "--to",
                    &to,
                    "--from-data-dir",
                    &old_dir,
                    "--port",
                    &c.port.to_string(),
                ]);
                assert!(out.status.success(), "restore to {to}: {}", describe(&out));
                c.up(&[]);
                let url = c.url(&["--primary"]);
                (c, url, to, last)
            })
        })
        .collect();
    for restore in restores {
        let (_c, url, to, last) = restore.await.expect("a restore");
        let db = connect(&url).await;
        let ids: Vec<i32> = db
            .query("select id from items order by id", &[])
            .await
            .expect("the table is back")
            .iter()
            .map(|r| r.get(0))
            .collect();
        assert_eq!(ids, (1..=last).collect::<Vec<i32>>(), "restored to {to}");
    }
}

#[test]
fn backup_without_a_backup_section_is_a_clear_error() {
    let c = cluster();
    std::fs::create_dir_all(c.data_dir()).expect("data dir");
    std::fs::write(c.data_dir().join("herd.toml"), "[cluster]\nreplicas = 1\n").expect("toml");
    for args in [&["backup"][..], &["backup", "list"]] {
        let err = refused(&c.herd(args));
        assert!(
            err.contains("backups are not configured") && err.contains("[backup]"),
            "{args:?}: {err}"
        );
    }
}

/// Inserts `ids` into `acked(id)` through the endpoint at `url`, one transaction each, retrying
/// (a new connection) while a failover or switchover is under way, at most 60 s in all; returns
/// the acknowledged ones (a retried id already there counts: its first commit was acknowledged
/// by the server even if the answer was lost).
async fn acknowledged(url: &str, ids: std::ops::RangeInclusive<i32>) -> Vec<i32> {
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    let mut client = None;
    let mut done = Vec::new();
    for id in ids {
        loop {
            assert!(
                std::time::Instant::now() < deadline,
                "writes not accepted for 60 s (id {id})"
            );
            if client.is_none() {
                client = common::try_connect(url).await;
            }
            let Some(db) = &client else {
                tokio::time::sleep(Duration::from_millis(200)).await;
                continue;
            };
            match db
                .execute("insert into acked(id) values ($1)", &[&id])
                .await
            {
                Ok(_) => break,
                Err(e) if e.code() == Some(&tokio_postgres::error::SqlState::UNIQUE_VIOLATION) => {
                    break
                }
                Err(_) => {
                    client = None;
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
            }
        }
        done.push(id);
    }
    done
}

/// The running primary's name once it is not `old` and a replica streams again (at most 60 s).
fn new_primary_streaming(c: &herd_testkit::TestCluster, old: &str) -> String {
    herd_testkit::wait_until(
        Duration::from_secs(60),
        "a new primary and a streaming replica",
        || {
            let s = c.try_status()?;
            let primary = common::nodes_with_role(&s, "primary")
                .into_iter()
                .find(|n| n["state"] == "running" && n["name"] != old)?["name"]
                .as_str()?
                .to_string();
            let streaming = common::nodes_with_role(&s, "replica")
                .iter()
                .any(|n| n["state"] == "streaming");
            streaming.then_some(primary)
        },
    )
}

/// Runs `promtool check metrics` on `text`, failing with its complaints; bounded in time.
fn promtool_check(text: &str) {
    let dir = herd_testkit::scratch_dir();
    common::promtool_check(&dir.path().join("metrics.txt"), text);
}

/// The current primary's name.
fn primary_name(c: &herd_testkit::TestCluster) -> String {
    let s = c.status();
    common::nodes_with_role(&s, "primary")[0]["name"]
        .as_str()
        .expect("primary name")
        .to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn archiving_follows_failover_and_switchover() {
    let old = cluster();
    std::fs::create_dir_all(old.data_dir()).expect("data dir");
    // A WAL file waiting over a second counts as behind: the broken archive below shows fast.
    std::fs::write(
        old.data_dir().join("herd.toml"),
        "[backup]\nenabled = true\narchive_lag_warning_s = 1\n",
    )
    .expect("herd.toml");
    old.up(&["--replicas", "1"]);
    let endpoint = old.url(&[]);
    let db = connect(&endpoint).await;
    db.batch_execute("create table acked(id int primary key)")
        .await
        .expect("table");
    drop(db);
    let out = old.herd_ok(&["backup", "--type", "full", "--from-primary"]);
    assert!(out.contains("(full, copied from the primary"), "{out}");
    let mut acked = acknowledged(&endpoint, 1..=50).await;

    // Archiving breaks (the repository's archive is not writable by the servers' user), more
    // WAL is written and completed: the primary's archive lags, those segments exist only in
    // pg_wal. Then its postmaster is killed, and the archive is writable again.
    let archive = old.data_dir().join("backup-repo/archive/herd-g0");
    let mode = |m: u32| {
        std::fs::set_permissions(&archive, std::os::unix::fs::PermissionsExt::from_mode(m))
            .expect("chmod the archive")
    };
    mode(0o000);
    acked.extend(acknowledged(&endpoint, 51..=100).await);
    let primary = connect(&old.url(&["--primary"])).await;
    for _ in 0..2 {
        primary
            .batch_execute("select pg_switch_wal(); insert into acked values (-1); delete from acked where id = -1")
            .await
            .expect("switch WAL");
    }
    drop(primary);
    // Reported, not silent: herd status (JSON and text) and /metrics say the archive is behind.
    let archiving = herd_testkit::wait_until(Duration::from_secs(30), "an archive warning", || {
        let a = old.try_status()?["archiving"].clone();
        a["warning"].is_string().then_some(a)
    });
    assert!(archiving["failed_count"].as_u64() > Some(0), "{archiving}");
    assert!(archiving["last_failed_wal"].is_string(), "{archiving}");
    assert!(archiving["pending"].as_u64() > Some(0), "{archiving}");
    let text = old.herd_ok(&["status"]);
    assert!(text.contains("WARNING: WAL archiving is behind"), "{text}");
    // The supervisor's reading (every probe interval) crosses the bound a moment later.
    let metrics = herd_testkit::wait_until(Duration::from_secs(10), "the metric", || {
        let text = common::api_get_text(old.api_port(), "/metrics");
        text.contains("herd_archive_behind{group=\"0\"} 1")
            .then_some(text)
    });
    assert!(
        metrics.contains("# TYPE herd_archive_failed_total counter"),
        "{metrics}"
    );
    promtool_check(&metrics);
    let first = primary_name(&old);
    common::kill_primary(&old);
    mode(0o750);
    let second = new_primary_streaming(&old, &first);
    // The old primary, rejoined (it is the streaming replica), first pushed the segments it had
    // not archived (already pushed by the new primary here: accepted as duplicates).
    let log = std::fs::read_to_string(old.data_dir().join("logs/herd.log")).unwrap_or_default();
    assert!(
        log.contains("WAL segment(s) the former primary had not"),
        "{}",
        old.log_tails()
    );
    acked.extend(acknowledged(&endpoint, 101..=150).await);

    // A planned switchover: the new primary archives from its first segment on.
    let out = old.herd_ok(&["switchover"]);
    assert!(out.contains("switched over"), "{out}");
    new_primary_streaming(&old, &second);
    acked.extend(acknowledged(&endpoint, 151..=200).await);
    // The archive caught up: no warning left.
    herd_testkit::wait_until(Duration::from_secs(30), "the warning to clear", || {
        let a = old.try_status()?["archiving"].clone();
        (a["pending"] == 0 && a["warning"].is_null()).then_some(())
    });

    let new = cluster();
    let out = new.herd(&[
        "restore",
        "--to",
        "latest",
        "--from-data-dir",
        &old.data_dir().display().to_string(),
        "--port",
        &new.port.to_string(),
    ]);
    assert!(out.status.success(), "restore: {}", describe(&out));
    new.up(&[]);
    let restored = connect(&new.url(&["--primary"])).await;
    let ids: Vec<i32> = restored
        .query("select id from acked order by id", &[])
        .await
        .expect("rows")
        .iter()
        .map(|r| r.get(0))
        .collect();
    let missing: Vec<&i32> = acked.iter().filter(|id| !ids.contains(id)).collect();
    assert!(
        missing.is_empty(),
        "acknowledged writes missing after the restore: {missing:?}"
    );
}

/// `[backup] replicas_from_repository = true`: a new cluster's replica is made with
/// pg_basebackup (no backup exists yet); once one does, a replica whose directory is gone is
/// built again from it (`pgbackrest restore --type=standby`, then the archive and streaming),
/// has every row, the rows written after the backup included, and streams what follows.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_built_from_the_repository_streams_and_has_the_rows() {
    let c = cluster();
    std::fs::create_dir_all(c.data_dir()).expect("data dir");
    std::fs::write(
        c.data_dir().join("herd.toml"),
        "[backup]\nenabled = true\nreplicas_from_repository = true\n",
    )
    .expect("herd.toml");
    c.up(&["--replicas", "1"]);
    let logs = || -> String {
        std::fs::read_dir(c.data_dir().join("logs"))
            .into_iter()
            .flatten()
            .flatten()
            .map(|e| std::fs::read_to_string(e.path()).unwrap_or_default())
            .collect()
    };
    assert!(
        logs().contains("building the replica with pg_basebackup"),
        "no backup yet: pg_basebackup\n{}",
        c.log_tails()
    );
    let db = connect(&c.url(&["--primary"])).await;
    db.batch_execute(
        "create table items(id int primary key);
         insert into items select generate_series(1, 100);",
    )
    .await
    .expect("first rows");
    c.herd_ok(&["backup", "--type", "full"]);
    let label = c
        .herd_ok(&["backup", "list"])
        .lines()
        .find(|l| l.contains(" full "))
        .and_then(|l| l.split_whitespace().next())
        .expect("the backup's label")
        .to_string();
    db.batch_execute("insert into items select generate_series(101, 200)")
        .await
        .expect("rows after the backup");
    // What the agent checks before a restore: pgBackRest names the backup's cluster by the
    // system identifier of the primary.
    let system: String = db
        .query_one(
            "select system_identifier::text from pg_control_system()",
            &[],
        )
        .await
        .expect("system identifier")
        .get(0);
    drop(db);
    let info = std::process::Command::new("pgbackrest")
        .arg(format!(
            "--config={}",
            c.data_dir().join("backup/pgbackrest.conf").display()
        ))
        .args([
            "--stanza=herd-g0",
            "--log-level-file=off",
            "info",
            "--output=json",
        ])
        .output()
        .expect("pgbackrest info");
    let info: serde_json::Value = serde_json::from_slice(&info.stdout).unwrap_or_default();
    let db_id = &info[0]["backup"][0]["database"]["id"];
    let described = info[0]["db"]
        .as_array()
        .and_then(|dbs| dbs.iter().find(|d| &d["id"] == db_id))
        .map(|d| d["system-id"].to_string());
    assert_eq!(described, Some(system), "{info}");

    // The replica's directory is lost (moved away, its server killed): its agent builds it
    // again, from the repository.
    let replica = common::nodes_with_role(&c.status(), "replica")[0]["name"]
        .as_str()
        .expect("replica name")
        .to_string();
    let dir = c.data_dir().join("nodes").join(&replica);
    let aside = c.data_dir().join("lost-replica");
    std::fs::rename(&dir, &aside).expect("move the replica's directory away");
    let pid: i32 = std::fs::read_to_string(aside.join("postmaster.pid"))
        .expect("postmaster.pid")
        .lines()
        .next()
        .and_then(|l| l.trim().parse().ok())
        .expect("the replica's postmaster pid");
    let _ = nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(pid),
        nix::sys::signal::Signal::SIGKILL,
    );
    let wanted = format!("building the replica from backup {label} of the repository");
    let _ = std::fs::remove_dir_all(&aside);
    herd_testkit::wait_until(Duration::from_secs(120), "the replica restored", || {
        logs().contains(&wanted).then_some(())
    });
    let url = c.url(&["--replica", &replica]);
    common::eventually(
        Duration::from_secs(120),
        "the restored replica has the 200 rows",
        || {
            let url = url.clone();
            async move {
                match common::try_connect(&url).await {
                    Some(r) => common::count(&r, "items").await == Some(200),
                    None => false,
                }
            }
        },
    )
    .await;
    // The standby fetches what it lacks from the archive through the cluster's configuration.
    let auto = std::fs::read_to_string(dir.join("postgresql.auto.conf")).unwrap_or_default();
    let config = c.data_dir().join("backup/pgbackrest.conf");
    assert!(
        auto.lines().any(|l| l.starts_with("restore_command")
            && l.contains(&format!("--config={}", config.display()))),
        "pgBackRest's restore_command: {auto}"
    );
    let db = connect(&c.url(&["--primary"])).await;
    db.batch_execute("insert into items select generate_series(201, 210)")
        .await
        .expect("rows after the restore");
    common::eventually(
        Duration::from_secs(60),
        "the restored replica streams",
        || {
            let (db, replica) = (&db, replica.clone());
            async move {
                db.query_opt(
                    "select 1 from pg_stat_replication where application_name = $1 \
                     and state = 'streaming'",
                    &[&replica],
                )
                .await
                .ok()
                .flatten()
                .is_some()
            }
        },
    )
    .await;
    let r = connect(&url).await;
    common::eventually(Duration::from_secs(30), "row 210 on the replica", || {
        let r = &r;
        async move { common::count(r, "items").await == Some(210) }
    })
    .await;
}
