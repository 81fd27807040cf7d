//! Two-phase work left in doubt, and writes on every group through a failover.

use std::time::Duration;

use super::common::{self, cluster, connect};

/// A two-phase write abandoned between its phases (a crash of the session or of Herd) is
/// resolved by the proxy within about a minute, as group 0 decided: committed on the other
/// groups where group 0 committed it, rolled back everywhere where group 0 still holds it — so
/// no prepared transaction keeps its locks.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn writes_left_in_doubt_are_resolved() {
    let c = cluster();
    c.up(&["--shards", "2", "--replicas", "0"]);
    let client = connect(&c.url(&[])).await;
    client
        .batch_execute("create table doubt (k bigint primary key, v text)")
        .await
        .expect("create");
    client
        .simple_query("select herd.create_distributed_table('doubt', 'k')")
        .await
        .expect("distribute");
    let groups = [
        connect(&c.url(&["--group", "0", "--primary"])).await,
        connect(&c.url(&["--group", "1", "--primary"])).await,
    ];
    // Decided: group 0 committed its part, with the decision row; group 1 still prepared.
    // Undecided: both prepared. Rolled back: group 0 rolled its part back (a later group's
    // PREPARE failed as far as the session knew), group 1 prepared all the same.
    for (g, direct) in groups.iter().enumerate() {
        let decision = if g == 0 {
            "insert into herd.txn_decisions (gid) values ('herd_ddl_wtest_decided');"
        } else {
            ""
        };
        direct
            .batch_execute(&format!(
                "begin; insert into doubt values ({}, 'decided'); {decision} prepare transaction 'herd_ddl_wtest_decided'",
                10 + g
            ))
            .await
            .expect("prepare decided");
        direct
            .batch_execute(&format!(
                "begin; insert into doubt values ({}, 'rolled back'); prepare transaction 'herd_ddl_wtest_rolled'",
                30 + g
            ))
            .await
            .expect("prepare rolled back");
        direct
            .batch_execute(&format!(
                "begin; insert into doubt values ({}, 'undecided'); prepare transaction 'herd_ddl_wtest_undecided'",
                20 + g
            ))
            .await
            .expect("prepare undecided");
    }
    for decision in [
        "commit prepared 'herd_ddl_wtest_decided'",
        "rollback prepared 'herd_ddl_wtest_rolled'",
    ] {
        groups[0]
            .batch_execute(decision)
            .await
            .expect("group 0's decision");
    }
    // The proxy resolves them once they are old enough.
    let deadline = std::time::Instant::now() + Duration::from_secs(90);
    loop {
        let mut left = 0;
        for direct in &groups {
            left += direct
                .query_one("select count(*) from pg_prepared_xacts", &[])
                .await
                .expect("pg_prepared_xacts")
                .get::<_, i64>(0);
        }
        if left == 0 {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "{left} prepared transactions still in doubt after 90 s"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    for (g, direct) in groups.iter().enumerate() {
        let rows: Vec<String> = direct
            .query("select v from doubt order by k", &[])
            .await
            .expect("rows")
            .iter()
            .map(|r| r.get(0))
            .collect();
        assert_eq!(rows, vec!["decided".to_string()], "group {g}");
    }
    // Counted: group 1's decided part committed; the undecided one rolled back on both groups,
    // the one group 0 rolled back on group 1.
    let metrics = common::api_get_text(c.api_port(), "/metrics");
    for line in [
        "herd_shard_in_doubt_resolved_total{outcome=\"commit\"} 1",
        "herd_shard_in_doubt_resolved_total{outcome=\"rollback\"} 3",
    ] {
        assert!(metrics.contains(line), "{line} in:\n{metrics}");
    }
    let status = c.herd_ok(&["status"]);
    assert!(
        status.contains("in doubt resolved: 1 committed, 3 rolled back"),
        "{status}"
    );
}

/// Chaos: writes on every group run in a loop while group 1 fails over (its primary fenced and a
/// replica promoted, possibly between a write's phases). Every write stays all or none: once
/// what was left in doubt is resolved, every row has been incremented the same number of times,
/// at least once per acknowledged write and at most once per attempt, and nothing is left
/// prepared.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cross_group_writes_stay_atomic_through_a_failover() {
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
    use std::sync::Arc;

    let c = cluster();
    c.up(&["--shards", "2", "--replicas", "1"]);
    let endpoint = c.url(&[]);
    let client = connect(&endpoint).await;
    client
        .batch_execute("create table tally (k bigint primary key, n bigint not null)")
        .await
        .expect("create");
    client
        .simple_query("select herd.create_distributed_table('tally', 'k')")
        .await
        .expect("distribute");
    let rows: Vec<String> = (1..=12).map(|k| format!("({k}, 0)")).collect();
    client
        .batch_execute(&format!(
            "insert into tally (k, n) values {}",
            rows.join(", ")
        ))
        .await
        .expect("rows on both groups");
    let stop = Arc::new(AtomicBool::new(false));
    let (ok, attempts) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
    let writer = {
        let (stop, ok, attempts, endpoint) =
            (stop.clone(), ok.clone(), attempts.clone(), endpoint.clone());
        tokio::spawn(async move {
            let mut client = connect(&endpoint).await;
            while !stop.load(Ordering::Relaxed) {
                attempts.fetch_add(1, Ordering::Relaxed);
                let write = client.simple_query("update tally set n = n + 1");
                match tokio::time::timeout(Duration::from_secs(10), write).await {
                    Ok(Ok(_)) => {
                        ok.fetch_add(1, Ordering::Relaxed);
                    }
                    _ => {
                        // The session may be gone with the old primary: a new one.
                        tokio::time::sleep(Duration::from_millis(100)).await;
                        if let Some(fresh) = common::try_connect(&endpoint).await {
                            client = fresh;
                        }
                    }
                }
            }
        })
    };
    tokio::time::sleep(Duration::from_secs(1)).await;
    c.herd_ok(&["failover", "--group", "1"]);
    tokio::time::sleep(Duration::from_secs(3)).await;
    stop.store(true, Ordering::Relaxed);
    writer.await.expect("writer");
    let (ok, attempts) = (ok.load(Ordering::Relaxed), attempts.load(Ordering::Relaxed));
    assert!(ok > 0, "no write went through");
    // What a failover left prepared is resolved (after 30 s) on both groups' primaries.
    let deadline = std::time::Instant::now() + Duration::from_secs(120);
    loop {
        let mut left = 0;
        for g in ["0", "1"] {
            if let Some(direct) = common::try_connect(&c.url(&["--group", g, "--primary"])).await {
                left += direct
                    .query_one("select count(*) from pg_prepared_xacts", &[])
                    .await
                    .map(|r| r.get::<_, i64>(0))
                    .unwrap_or(1);
            } else {
                left += 1;
            }
        }
        if left == 0 {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "{left} prepared transactions still in doubt after 120 s"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let client = connect(&endpoint).await;
    let row = client
        .query_one("select min(n), max(n), count(*) from tally", &[])
        .await
        .expect("tally");
    let (min, max, count): (i64, i64, i64) = (row.get(0), row.get(1), row.get(2));
    eprintln!("{ok} of {attempts} writes acknowledged; every row incremented {min}..{max} times");
    assert_eq!(count, 12);
    assert_eq!(
        min, max,
        "a write reached some rows (groups) and not others"
    );
    assert!(
        max as u64 >= ok,
        "an acknowledged write was lost ({max} < {ok})"
    );
    assert!(max as u64 <= attempts, "more increments than attempts");
}
