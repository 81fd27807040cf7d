//! `herd group add` on a multi-host cluster, modelled on loopback: one etcd, two shard groups
//! of two `herd agent`s each and one `herd proxy` (as `agent_groups.rs`). A distributed table
//! has rows; an agent `--group 2` refuses until `herd group add --dcs … --proxy-api …` records
//! group 2; its two agents start, and the proxy — started before the group existed — admits
//! it once a second proxy is gone (refused while it runs, then the command run again finishes
//! the same group): the new group holds the table, empty. `herd shards rebalance --dcs` moves shards there; every row is read
//! back through the proxy exactly once, and new rows by key land on group 2 for its shards.

mod common;

use std::io::Read;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::agent_groups::Groups;
use common::hosts::HERD;
use herd_shard::{shard_sql, KeyType};

/// Agents: (name, group).
const AGENTS: [(&str, u32); 6] = [
    ("a0", 0),
    ("a1", 0),
    ("b0", 1),
    ("b1", 1),
    ("c0", 2),
    ("c1", 2),
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
    proxy
        .batch_execute("create table items (id bigint primary key, v text)")
        .await
        .expect("create through the proxy");
    proxy
        .simple_query("select herd.create_distributed_table('items', 'id')")
        .await
        .expect("distribute");
    write_rows(&proxy, 0, 200).await;

    // An agent of a group not recorded yet refuses, saying what to do.
    let mut early = Command::new(HERD);
    early
        .arg("agent")
        .args(["--dcs", &g.dcs(), "--cluster", &g.cluster])
        .args(["--name", "early", "--group", "2"])
        .arg("--data-dir")
        .arg(g.dir.path().join("early"))
        .args(["--pg-port", &(g.base + 15).to_string()]);
    let out =
        herd_testkit::output_within(&mut early, Duration::from_secs(60)).expect("agent exits");
    let said = herd_testkit::describe(&out);
    assert!(
        !out.status.success() && said.contains("herd group add --dcs"),
        "{said}"
    );

    // A second proxy runs: the admission (a shard map change) is refused while it does.
    let second_port = g.base + 14;
    let (mut second, _) = g.extra_proxy(second_port, "proxy2").await;

    // `herd group add --dcs`: records group 2 and says how to start its agents, waits for its
    // primary, then asks the proxy (started before group 2 existed) to admit it.
    let out_path = g.dir.path().join("group-add.out");
    let (dcs, cluster, api) = (g.dcs(), g.cluster.clone(), g.proxy_api());
    let proxy_dir = g.dir.path().join("proxy");
    let group_add = |out: &std::path::Path| {
        let mut cmd = Command::new(HERD);
        cmd.args(["group", "add", "--dcs", &dcs, "--cluster", &cluster])
            .args(["--proxy-api", &api, "--wait-timeout", "180"])
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
    assert!(
        !status.success() && err.contains("other herd proxy process(es) serve this cluster"),
        "refused while another proxy runs: {status}\n{err}"
    );
    let _ = second.kill();
    let _ = second.wait();

    // Run again once the second proxy's registration expired: it finishes group 2 (it does not
    // record a group 3).
    let deadline = Instant::now() + Duration::from_secs(60);
    let text = loop {
        let out = herd_testkit::output_within(&mut group_add(&out_path), Duration::from_secs(300))
            .expect("herd group add exits");
        // output_within takes the command's output itself.
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        if out.status.success() {
            break text;
        }
        let said = herd_testkit::describe(&out);
        assert!(
            said.contains("other herd proxy process(es) serve this cluster")
                && Instant::now() < deadline,
            "herd group add again: {said}\n{text}\nlogs:\n{}",
            g.logs()
        );
        std::thread::sleep(Duration::from_secs(1));
    };
    assert!(
        text.contains("shard group 2 is recorded") && text.contains("shard group 2 added"),
        "{text}"
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
    assert_eq!(
        (row.get::<_, i64>(0), row.get::<_, i64>(1)),
        (200, 200),
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
        .query_one("select count(*) from items where id >= 1000", &[])
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
    assert_eq!(total, 300, "each row on one group");
    let row = proxy
        .query_one("select count(*), count(distinct id) from items", &[])
        .await
        .expect("final count");
    assert_eq!(
        (row.get::<_, i64>(0), row.get::<_, i64>(1)),
        (300, 300),
        "every row once through the proxy"
    );
}
