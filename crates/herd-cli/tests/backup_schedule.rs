//! Scheduled backups (`[backup] full_every_s`, `incr_every_s`; real PostgreSQL, real
//! pgBackRest): `herd up`'s supervisor takes a full backup of each shard group at once, then
//! incremental ones at the interval, one backup at a time, with a restore point across the
//! groups after each round; a group added while the cluster runs (`herd group add`) gets its
//! stanza and its backups.

mod common;

use std::time::{Duration, Instant};

use common::{cluster, connect};

/// One row of `herd backup list`: (group, label, type, start, stop), times as printed.
type Row = (String, String, String, String, String);

fn rows(list: &str) -> Vec<Row> {
    list.lines()
        .skip(1)
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            (f.len() >= 7).then(|| {
                (
                    f[0].to_string(),
                    f[1].to_string(),
                    f[2].to_string(),
                    format!("{} {}", f[3], f[4]),
                    format!("{} {}", f[5], f[6]),
                )
            })
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scheduled_backups_of_every_group_one_at_a_time() {
    let c = cluster();
    std::fs::create_dir_all(c.data_dir()).expect("data dir");
    std::fs::write(
        c.data_dir().join("herd.toml"),
        "[backup]\nenabled = true\nfull_every_s = 3600\nincr_every_s = 4\n",
    )
    .expect("herd.toml");
    c.up(&["--replicas", "0"]);
    let db = connect(&c.url(&[])).await;
    db.batch_execute("create table t (id int primary key); insert into t values (1)")
        .await
        .expect("a table");
    // Group 0's first full backup, then a group added while the cluster runs.
    let deadline = Instant::now() + Duration::from_secs(60);
    while !c.herd_ok(&["backup", "list"]).contains(" full ") {
        assert!(
            Instant::now() < deadline,
            "no scheduled full backup after 60 s:\n{}",
            c.log_tails()
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    c.herd_ok(&["group", "add"]);

    // A full backup of each group at once, then incremental ones every 4 s: two of each
    // group's within 120 s (a backup of these small groups takes a few seconds).
    let deadline = Instant::now() + Duration::from_secs(120);
    let list = loop {
        let list = c.herd_ok(&["backup", "list"]);
        let enough = ["0", "1"].iter().all(|g| {
            let of = |kind: &str| {
                rows(&list)
                    .iter()
                    .filter(|r| r.0 == *g && r.2 == kind)
                    .count()
            };
            of("full") == 1 && of("incr") >= 2
        });
        if enough {
            break list;
        }
        assert!(
            Instant::now() < deadline,
            "scheduled backups missing after 120 s:\n{list}\n{}",
            c.log_tails()
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    // Taken one at a time: by start, each begins no earlier than the one before ended (times
    // in whole seconds).
    let mut all = rows(&list);
    all.sort_by(|a, b| a.3.cmp(&b.3).then(a.4.cmp(&b.4)));
    for pair in all.windows(2) {
        assert!(
            pair[1].3 >= pair[0].4,
            "{:?} started before {:?} ended:\n{list}",
            pair[1],
            pair[0]
        );
    }
    // A point across the groups after each round; each recorded on both groups.
    let points = std::fs::read_to_string(c.data_dir().join("backup/restore-points.tsv"))
        .expect("restore-points.tsv");
    let names: Vec<&str> = points
        .lines()
        .filter(|l| l.ends_with("\t0"))
        .filter_map(|l| l.split('\t').next())
        .collect();
    assert!(
        names.len() >= 2 && names.iter().all(|n| n.starts_with("backup-")),
        "{points}"
    );
    for n in &names {
        assert!(
            points
                .lines()
                .any(|l| l.starts_with(&format!("{n}\t")) && l.ends_with("\t1")),
            "{n} on group 1: {points}"
        );
    }
    let log = std::fs::read_to_string(c.data_dir().join("logs/herd.log")).unwrap_or_default();
    assert!(
        log.contains("scheduled full backup of shard group 1"),
        "supervisor log:\n{log}"
    );
}
