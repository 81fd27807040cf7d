//! Shard groups (`herd up --shards N`): each group is a primary with its own replicas, sync set
//! and failover; a failover in one group leaves the others serving; `herd status`, `herd url
//! --group` and `herd switchover --group` name a group; the groups survive `herd down`/`up`.

mod common;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use common::groups::{group, roles, wait_healthy};
use common::{cluster, connect};
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn groups_fail_over_on_their_own_and_survive_a_restart() {
    let c = cluster();
    c.up(&["--shards", "2", "--replicas", "1"]);
    let status = c.status();
    assert_eq!(status["group"], 0);
    let g1 = group(&status, 1);
    let names: Vec<&str> = g1["nodes"]
        .as_array()
        .expect("nodes")
        .iter()
        .map(|n| n["name"].as_str().expect("name"))
        .collect();
    assert_eq!(names, ["g1_node0", "g1_node1"], "{status}");
    assert_eq!(wait_healthy(&c, 1, None), "g1_node0");
    assert_eq!(wait_healthy(&c, 0, None), "node0");
    let text = c.herd_ok(&["status"]);
    assert!(
        text.contains("shard group 0:") && text.contains("shard group 1:"),
        "{text}"
    );

    // Each group is its own database cluster: a table made on group 1 is not on group 0.
    let g1_primary = c.url(&["--group", "1", "--primary"]);
    let g1_client = connect(&g1_primary).await;
    g1_client
        .batch_execute("create table kept (id int primary key); insert into kept select generate_series(1, 100)")
        .await
        .expect("writing on group 1");
    let g0_client = connect(&c.url(&["--primary"])).await;
    let missing = g0_client.simple_query("select 1 from kept").await;
    assert!(missing.is_err(), "group 0 sees group 1's table");
    assert!(!c.herd(&["url", "--group", "2"]).status.success());

    // Writes through the endpoint (group 0) go on while group 1's primary is killed.
    let endpoint = c.url(&[]);
    connect(&endpoint)
        .await
        .batch_execute("create table beat (id bigint)")
        .await
        .expect("creating beat");
    let stop = Arc::new(AtomicBool::new(false));
    let (ok, failed) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
    let writer = {
        let (stop, ok, failed) = (stop.clone(), ok.clone(), failed.clone());
        tokio::spawn(async move {
            let client = connect(&endpoint).await;
            let mut i = 0i64;
            while !stop.load(Ordering::Relaxed) {
                i += 1;
                let q = format!("insert into beat values ({i})");
                match tokio::time::timeout(Duration::from_secs(10), client.simple_query(&q)).await {
                    Ok(Ok(_)) => ok.fetch_add(1, Ordering::Relaxed),
                    _ => failed.fetch_add(1, Ordering::Relaxed),
                };
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        })
    };
    let pid = group(&c.status(), 1)["nodes"][0]["pid"]
        .as_i64()
        .expect("g1 primary pid") as i32;
    kill(Pid::from_raw(pid), Signal::SIGKILL).expect("kill -9 group 1's primary");
    let promoted = wait_healthy(&c, 1, Some("g1_node0"));
    assert_eq!(promoted, "g1_node1");
    stop.store(true, Ordering::Relaxed);
    writer.await.expect("writer");
    assert!(ok.load(Ordering::Relaxed) > 0, "no write went through");
    assert_eq!(
        failed.load(Ordering::Relaxed),
        0,
        "group 0 stopped serving during group 1's failover"
    );
    assert_eq!(roles(&c, 0).0, ["node0"], "group 0's primary changed");
    // Synchronous commit (the default, ANY 1): every acknowledged row survived the failover.
    let g1_client = connect(&c.url(&["--group", "1", "--primary"])).await;
    let rows = g1_client
        .query_one("select count(*) from kept", &[])
        .await
        .expect("count");
    assert_eq!(rows.get::<_, i64>(0), 100);

    // A switchover names its group; a node of another group is refused.
    let wrong = c.herd(&["switchover", "--group", "0", "--to", "g1_node0"]);
    assert!(!wrong.status.success());
    c.herd_ok(&["switchover", "--group", "1"]);
    assert_eq!(wait_healthy(&c, 1, Some("g1_node1")), "g1_node0");
    assert_eq!(roles(&c, 0).0, ["node0"]);

    // Each group has its own commit mode: group 1 to remote_apply, group 0 unchanged; the
    // setting is kept in herd.toml as [group.1] and survives the restart below.
    let out = c.herd_ok(&[
        "config",
        "set",
        "--group",
        "1",
        "commit-mode",
        "remote_apply",
    ]);
    assert!(
        out.contains("shard group 1: commit mode remote_apply"),
        "{out}"
    );
    assert!(!out.contains("shard group 0"), "{out}");
    let setting = |url: String| async move {
        connect(&url)
            .await
            .query_one("show synchronous_commit", &[])
            .await
            .expect("show")
            .get::<_, String>(0)
    };
    assert_eq!(
        setting(c.url(&["--group", "1", "--primary"])).await,
        "remote_apply"
    );
    assert_eq!(setting(c.url(&["--primary"])).await, "on");
    let status = c.status();
    assert_eq!(group(&status, 1)["commit_mode"], "remote_apply", "{status}");
    assert_eq!(status["commit_mode"], "on", "{status}");
    assert!(!c
        .herd(&["config", "set", "--group", "2", "commit-mode", "async"])
        .status
        .success());

    // Down and up again: both groups come back with their data and roles.
    c.herd_ok(&["down"]);
    let out = c.herd(&["up", "--detach", "--shards", "1"]);
    assert!(!out.status.success(), "removing a group must be refused");
    c.up(&[]);
    assert_eq!(wait_healthy(&c, 1, None), "g1_node0");
    let g1_client = connect(&c.url(&["--group", "1", "--primary"])).await;
    let rows = g1_client
        .query_one("select count(*) from kept", &[])
        .await
        .expect("count after restart");
    assert_eq!(rows.get::<_, i64>(0), 100);
    assert_eq!(
        setting(c.url(&["--group", "1", "--primary"])).await,
        "remote_apply"
    );
    assert_eq!(setting(c.url(&["--primary"])).await, "on");
}
