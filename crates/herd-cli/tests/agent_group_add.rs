//! `herd group add` on a multi-host cluster, modelled on loopback: one etcd, two shard groups
//! of two `herd agent`s each and one `herd proxy` (as `agent_groups.rs`). A distributed table
//! has rows; an agent `--group 2` refuses until `herd group add --dcs …` (no `--proxy-api`)
//! records group 2; its two agents start, and the cluster's coordinator (an agent) has the
//! proxy with an API — started before the group existed — admit it, and the command returns
//! once it did, while a second proxy runs and writes rows by key all along: the new group holds
//! the table, empty, and the reference table with its rows; the second proxy serves group 2 too
//! (a reference-table row and a column added through it reach group 2). `herd shards
//! rebalance --dcs` moves shards there (group 2's admission first takes over a claim left by a
//! coordinator whose proxy died: a planted `group_admissions/2` naming an unregistered proxy); every row is read back through the proxy exactly once,
//! and new rows by key land on group 2 for its shards. Group 3 is then added with
//! `--proxy-api` (the command asks the proxy itself) and receives the reference rows.

mod common;

use std::io::Read;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::agent_groups::Groups;
use common::hosts::HERD;
use herd_shard::{shard_sql, KeyType};

/// Agents: (name, group).
const AGENTS: [(&str, u32); 8] = [
    ("a0", 0),
    ("a1", 0),
    ("b0", 1),
    ("b1", 1),
    ("c0", 2),
    ("c1", 2),
    ("d0", 3),
    ("d1", 3),
];

/// Writes rows `from..to` through the proxy (each must be acknowledged).
async fn write_rows(client: &tokio_postgres::Client, from: i64, to: i64) {
    for id in from..to {
        let params: [&(dyn tokio_postgres::types::ToSql + Sync); 2] = [&id, &"x"];
        let write = client.execute("insert into items (id, v) values ($1, $2)", &params);
        tokio::time::timeout(Duration::from_secs(10), write)
            .await
            .unwrap_or_else(|_| panic!("insert {id} timed out"))
            .unwrap_or_else(|e| panic!("insert {id}: {e}"));
    }
}

/// Rows of `items` on the server at `url`: all, and those whose shard is not in `shards`.
async fn rows_on(url: &str, shards: &[i32], shard_count: u32) -> (i64, i64) {
    let expr = shard_sql("id", KeyType::Int8, shard_count);
    let row = common::connect(url)
        .await
        .query_one(
            &format!("select count(*), count(*) filter (where not ({expr} = any($1))) from items"),
            &[&shards],
        )
        .await
        .expect("count");
    (row.get(0), row.get(1))
}

/// The shards group `g` holds, read through the proxy.
async fn shards_of(proxy: &tokio_postgres::Client, g: i32) -> Vec<i32> {
    proxy
        .query(
            "select shard from herd.shards where shard_group = $1 and moving_to is null",
            &[&g],
        )
        .await
        .expect("herd.shards")
        .iter()
        .map(|r| r.get(0))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_group_is_added_across_hosts_when_its_agents_join() {
    let mut g = Groups::new(&AGENTS, "ga");
    g.start_agent(0);
    g.wait_role(0, "primary", Duration::from_secs(60));
    for i in 1..4 {
        g.start_agent(i);
    }
    g.wait_role(1, "replica", Duration::from_secs(60));
    let g1 = g.wait_primary_of(&[2, 3], Duration::from_secs(90));
    g.start_proxy();
    let proxy = g.connect_proxy().await;
    common::shards::distributed_table(&proxy, "items", "v text").await;
    write_rows(&proxy, 0, 200).await;
    proxy
        .batch_execute("create table kinds (id int primary key, name text)")
        .await
        .expect("create the reference table");
    proxy
        .simple_query("select herd.create_reference_table('kinds')")
        .await
        .expect("reference table");
    proxy
        .batch_execute("insert into kinds values (1, 'before')")
        .await
        .expect("a reference row");

    // An agent of a group not recorded yet refuses, saying what to do.
    let mut early = Command::new(HERD);
    early
        .arg("agent")
        .args(["--dcs", &g.dcs(), "--cluster", &g.cluster])
        .args(["--name", "early", "--group", "2"])
        .arg("--data-dir")
        .arg(g.dir.path().join("early"))
        .args(["--pg-port", &(g.base + 19).to_string()]);
    let out =
        herd_testkit::output_within(&mut early, Duration::from_secs(60)).expect("agent exits");
    let said = herd_testkit::describe(&out);
    assert!(
        !out.status.success() && said.contains("herd group add --dcs"),
        "{said}"
    );

    // A second proxy runs, and writes rows by key through it all along the admission (they
    // wait while it holds, then go on).
    let second_port = g.base + 18;
    let (mut second, through_second) = g.extra_proxy(second_port, "proxy2").await;
    let through_second = std::sync::Arc::new(through_second);
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let writer = {
        let (client, stop) = (through_second.clone(), stop.clone());
        tokio::spawn(async move {
            let mut written = 0i64;
            while !stop.load(std::sync::atomic::Ordering::SeqCst) && written < 2000 {
                let id = 5000 + written;
                let params: [&(dyn tokio_postgres::types::ToSql + Sync); 2] = [&id, &"p2"];
                let write = client.execute("insert into items (id, v) values ($1, $2)", &params);
                match tokio::time::timeout(Duration::from_secs(60), write).await {
                    Ok(Ok(_)) => written += 1,
                    Ok(Err(e)) => return Err(format!("insert {id} through proxy2: {e}")),
                    Err(_) => return Err(format!("insert {id} through proxy2 timed out")),
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            Ok(written)
        })
    };

    // A coordinator that died with its proxy mid-admission left a claim on group 2 naming a
    // proxy that no longer registers: the live coordinator takes it over after
    // `ABANDONED_AFTER` (10 s) instead of the claim's full life (330 s, beyond the command's
    // 180 s wait below, which would then fail).
    let ghost = serde_json::json!({
        "group": 2, "by": "coordinator ghost", "api": "127.0.0.1:9", "state": "admitting",
        "text": "asking the herd proxy at 127.0.0.1:9 to admit shard group 2",
        "at_s": std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .expect("clock")
            .as_secs(),
    });
    let store = herd_dcs::EtcdDcs::connect(
        &herd_dcs::EtcdConfig::from_url(&g.dcs(), &g.cluster).expect("store URL"),
    )
    .expect("the store");
    herd_dcs::Dcs::compare_and_set(
        &store,
        &format!("{}2", herd_dcs::GROUP_ADMISSIONS),
        0,
        ghost.to_string().into_bytes(),
    )
    .expect("plant an abandoned claim");
    drop(store);

    // `herd group add --dcs`: records group 2 and says how to start its agents, waits for its
    // primary, then follows its admission by the coordinator, which asks the proxy with an
    // API (started before group 2 existed; the second has none) to admit it.
    let out_path = g.dir.path().join("group-add.out");
    let (dcs, cluster) = (g.dcs(), g.cluster.clone());
    let proxy_dir = g.dir.path().join("proxy");
    let group_add = |out: &std::path::Path| {
        let mut cmd = Command::new(HERD);
        cmd.args(["group", "add", "--dcs", &dcs, "--cluster", &cluster])
            .args(["--wait-timeout", "180"])
            .arg("--data-dir")
            .arg(&proxy_dir)
            .stdin(Stdio::null())
            .stdout(std::fs::File::create(out).expect("out"))
            .stderr(Stdio::piped());
        cmd
    };
    let mut add = group_add(&out_path).spawn().expect("herd group add");
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let text = std::fs::read_to_string(&out_path).unwrap_or_default();
        if text.contains("shard group 2 is recorded in the store") {
            assert!(text.contains("--group 2"), "{text}");
            break;
        }
        assert!(
            Instant::now() < deadline && add.try_wait().ok().flatten().is_none(),
            "herd group add did not record group 2: {text}"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    g.start_agent(4);
    g.start_agent(5);
    let deadline = Instant::now() + Duration::from_secs(300);
    let status = loop {
        if let Some(s) = add.try_wait().expect("wait") {
            break s;
        }
        if Instant::now() > deadline {
            let _ = add.kill();
            panic!(
                "herd group add did not finish within 300 s; logs:\n{}",
                g.logs()
            );
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    let mut err = String::new();
    if let Some(mut e) = add.stderr.take() {
        let _ = e.read_to_string(&mut err);
    }
    let text = std::fs::read_to_string(&out_path).unwrap_or_default();
    assert!(
        status.success(),
        "herd group add with a second proxy running: {status}\n{err}\n{text}\nlogs:\n{}",
        g.logs()
    );
    stop.store(true, std::sync::atomic::Ordering::SeqCst);
    let by_second = writer
        .await
        .expect("writer task")
        .unwrap_or_else(|e| panic!("{e}\nlogs:\n{}", g.logs()));
    assert!(by_second > 0, "rows were written through proxy2");
    assert!(
        text.contains("shard group 2 is recorded") && text.contains("shard group 2 added"),
        "{text}"
    );
    let store = herd_dcs::EtcdDcs::connect(
        &herd_dcs::EtcdConfig::from_url(&g.dcs(), &g.cluster).expect("store URL"),
    )
    .expect("the store");
    let record = herd_dcs::Dcs::get(&store, &format!("{}2", herd_dcs::GROUP_ADMISSIONS))
        .expect("read the admission record")
        .expect("group 2's admission record");
    let record: serde_json::Value = serde_json::from_slice(&record.value).expect("json");
    assert!(
        record["state"] == "admitted" && record["by"] != "coordinator ghost",
        "the live coordinator took the abandoned claim over: {record}"
    );
    drop(store);
    // The coordinator (one of the agents) asked the proxy with an API; the command followed.
    let asked = format!(
        "asking the herd proxy at {} to admit shard group 2",
        g.proxy_api()
    );
    let by_coordinator = AGENTS.iter().any(|(name, _)| {
        std::fs::read_to_string(g.dir.path().join(format!("{name}.log")))
            .unwrap_or_default()
            .contains(&asked)
    });
    assert!(
        by_coordinator && err.contains("following it"),
        "the coordinator admitted group 2 and the command followed: {err}\nlogs:\n{}",
        g.logs()
    );
    let g2 = g.wait_primary_of(&[4, 5], Duration::from_secs(30));
    let shard_count: i64 = proxy
        .query_one("select count(*) from herd.shards", &[])
        .await
        .expect("shards")
        .get(0);
    let shard_count = shard_count as u32;
    assert_eq!(
        rows_on(&g.url(g.pg_port(g2)), &[], shard_count).await.0,
        0,
        "the new group holds the table, empty"
    );

    // The second proxy serves group 2 too: a reference row and a column added through it
    // reach group 2 (a proxy still serving two groups would write groups 0 and 1 only).
    for sql in [
        "insert into kinds values (2, 'after')",
        "alter table kinds add column note text",
    ] {
        tokio::time::timeout(Duration::from_secs(60), through_second.batch_execute(sql))
            .await
            .unwrap_or_else(|_| panic!("{sql} through proxy2 timed out"))
            .unwrap_or_else(|e| panic!("{sql} through proxy2: {e:?}\nlogs:\n{}", g.logs()));
    }
    let on_g2 = common::connect(&g.url(g.pg_port(g2))).await;
    let row = on_g2
        .query_one(
            "select count(*), count(*) filter (where name = 'after'), \
             (select count(*) from information_schema.columns \
              where table_name = 'kinds' and column_name = 'note') from kinds",
            &[],
        )
        .await
        .expect("kinds on group 2");
    assert_eq!(
        (
            row.get::<_, i64>(0),
            row.get::<_, i64>(1),
            row.get::<_, i64>(2)
        ),
        (2, 1, 1),
        "group 2 holds the reference row copied at admission, the one written through proxy2, \
         and the column added through it"
    );

    // Shards move there; every row is read back once.
    let secrets = g.agent_dir(0);
    let endpoint = format!("127.0.0.1:{}", g.proxy_port());
    let out = g.herd_store_within(
        &[
            "shards",
            "rebalance",
            "--data-dir",
            secrets.to_str().expect("utf-8 path"),
            "--endpoint",
            &endpoint,
            "--wait-timeout",
            "120",
        ],
        Duration::from_secs(600),
    );
    let on2 = shards_of(&proxy, 2).await;
    assert!(!on2.is_empty(), "rebalance moved shards to group 2: {out}");
    let row = proxy
        .query_one("select count(*), count(distinct id) from items", &[])
        .await
        .expect("count after the rebalance");
    let before = 200 + by_second;
    assert_eq!(
        (row.get::<_, i64>(0), row.get::<_, i64>(1)),
        (before, before),
        "every row once after the rebalance"
    );

    // New rows by key: group 2 holds exactly those of its shards.
    write_rows(&proxy, 1000, 1100).await;
    let expr = shard_sql("id", KeyType::Int8, shard_count);
    let expected: i64 = proxy
        .query_one(
            &format!(
                "select count(*) from generate_series(1000, 1099) as s(id) where {expr} = any($1)"
            ),
            &[&on2],
        )
        .await
        .expect("expected on group 2")
        .get(0);
    assert!(expected > 0, "some new keys belong to group 2's shards");
    let new_on2: i64 = common::connect(&g.url(g.pg_port(g2)))
        .await
        .query_one(
            "select count(*) from items where id >= 1000 and id < 1100",
            &[],
        )
        .await
        .expect("new rows on group 2")
        .get(0);
    assert_eq!(new_on2, expected, "new rows by key land on group 2");
    let mut total = 0;
    for (members, group) in [(vec![0, 1], 0), (vec![2, 3], 1), (vec![4, 5], 2)] {
        let p = if group == 1 {
            g1
        } else {
            g.wait_primary_of(&members, Duration::from_secs(30))
        };
        let shards = shards_of(&proxy, group).await;
        let (all, misplaced) = rows_on(&g.url(g.pg_port(p)), &shards, shard_count).await;
        assert_eq!(misplaced, 0, "group {group} holds only rows of its shards");
        total += all;
    }
    assert_eq!(total, before + 100, "each row on one group");
    let row = proxy
        .query_one("select count(*), count(distinct id) from items", &[])
        .await
        .expect("final count");
    assert_eq!(
        (row.get::<_, i64>(0), row.get::<_, i64>(1)),
        (before + 100, before + 100),
        "every row once through the proxy"
    );

    // `--proxy-api` still works: group 3 admitted through the named proxy (or, should the
    // coordinator take the admission record first, followed to the same end).
    let out3 = g.dir.path().join("group-add-3.out");
    let mut add3 = Command::new(HERD)
        .args(["group", "add", "--dcs", &g.dcs(), "--cluster", &g.cluster])
        .args(["--proxy-api", &g.proxy_api(), "--wait-timeout", "180"])
        .arg("--data-dir")
        .arg(g.dir.path().join("proxy"))
        .stdin(Stdio::null())
        .stdout(std::fs::File::create(&out3).expect("out"))
        .stderr(Stdio::null())
        .spawn()
        .expect("herd group add --proxy-api");
    let deadline = Instant::now() + Duration::from_secs(30);
    while !std::fs::read_to_string(&out3)
        .unwrap_or_default()
        .contains("shard group 3 is recorded in the store")
    {
        if Instant::now() > deadline || add3.try_wait().ok().flatten().is_some() {
            let _ = add3.kill();
            panic!("herd group add --proxy-api did not record group 3");
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    g.start_agent(6);
    g.start_agent(7);
    let deadline = Instant::now() + Duration::from_secs(300);
    let status = loop {
        if let Some(s) = add3.try_wait().expect("wait") {
            break s;
        }
        if Instant::now() > deadline {
            let _ = add3.kill();
            panic!("herd group add --proxy-api did not finish within 300 s");
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    let text = std::fs::read_to_string(&out3).unwrap_or_default();
    assert!(
        status.success() && text.contains("shard group 3 added"),
        "herd group add --proxy-api: {status}\n{text}\nlogs:\n{}",
        g.logs()
    );
    let g3 = g.wait_primary_of(&[6, 7], Duration::from_secs(30));
    let kinds: i64 = common::connect(&g.url(g.pg_port(g3)))
        .await
        .query_one("select count(*) from kinds", &[])
        .await
        .expect("kinds on group 3")
        .get(0);
    assert_eq!(kinds, 2, "group 3 received the reference rows at admission");
    let _ = second.kill();
    let _ = second.wait();
}
