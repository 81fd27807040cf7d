//! `herd up` → writes replicate → status and API → a killed replica comes back → down → up
//! keeps the data.

mod common;

use std::time::Duration;

use common::{api_get, cluster, connect, count, eventually, nodes_with_role};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn up_replicate_status_restart_down_up() {
    let c = cluster();
    let summary = c.up(&[]);
    assert!(
        summary.contains("node0") && summary.contains("streaming"),
        "{summary}"
    );

    // One primary, two streaming replicas, the default commit mode.
    let status = c.status();
    assert_eq!(status["version"], 1);
    assert_eq!(status["commit_mode"], "on");
    assert_eq!(status["sync_standbys"], "ANY 1");
    assert_eq!(
        status["synchronous_standby_names"],
        "ANY 1 (\"node1\", \"node2\")"
    );
    let primaries = nodes_with_role(&status, "primary");
    assert_eq!(primaries.len(), 1);
    assert_eq!(primaries[0]["state"], "running");
    assert!(primaries[0]["current_lsn"].is_string());
    assert!(primaries[0]["pid"].as_u64().is_some());
    let replicas = nodes_with_role(&status, "replica");
    assert_eq!(replicas.len(), 2);
    for r in &replicas {
        assert_eq!(r["state"], "streaming", "{r}");
        assert_eq!(r["sync_state"], "quorum", "{r}");
        for key in ["write_bytes", "flush_bytes", "replay_bytes"] {
            assert!(r["lag"][key].as_u64().is_some(), "{key} in {r}");
        }
        assert!(r["replayed_lsn"].is_string() && r["received_lsn"].is_string());
    }
    assert!(status["supervisor"]["pid"].as_u64().is_some());

    // Writes on the primary reach every replica.
    let primary = connect(&c.url(&["--primary"])).await;
    primary
        .batch_execute("create table items(id int primary key, note text)")
        .await
        .expect("create");
    primary
        .batch_execute("insert into items select g, 'row ' || g from generate_series(1, 500) g")
        .await
        .expect("insert");
    for i in 1..=2 {
        let replica = connect(&c.url(&["--replica", &i.to_string()])).await;
        let in_recovery: bool = replica
            .query_one("select pg_is_in_recovery()", &[])
            .await
            .expect("q")
            .get(0);
        assert!(in_recovery, "replica {i} must be a hot standby");
        // Connections die within seconds of a dead link, both ends of replication included.
        for (name, value) in [
            ("tcp_keepalives_idle", "5"),
            ("tcp_user_timeout", "10000"),
            ("wal_sender_timeout", "10s"),
            ("wal_receiver_timeout", "10s"),
        ] {
            let shown: String = replica
                .query_one(&format!("show {name}"), &[])
                .await
                .expect("show")
                .get(0);
            assert_eq!(shown, value, "{name} on replica {i}");
        }
        let conninfo: String = replica
            .query_one("show primary_conninfo", &[])
            .await
            .expect("show primary_conninfo")
            .get(0);
        assert!(
            conninfo.contains("keepalives=1") && conninfo.contains("tcp_user_timeout=10000"),
            "{conninfo}"
        );
        eventually(Duration::from_secs(30), "rows on the replica", || async {
            count(&replica, "items").await == Some(500)
        })
        .await;
        let err = replica
            .batch_execute("insert into items values (9999, 'x')")
            .await
            .expect_err("read-only");
        assert_eq!(
            err.code().map(|c| c.code()),
            Some("25006"),
            "read_only_sql_transaction"
        );
    }
    // `herd url` without a flag is the endpoint, which reaches the primary.
    let endpoint = connect(&c.url(&[])).await;
    assert_eq!(count(&endpoint, "items").await, Some(500));

    // The HTTP API serves the same document and health checks.
    let (code, doc) = api_get(c.api_port(), "/status");
    assert_eq!(code, 200);
    assert_eq!(doc["nodes"].as_array().map(Vec::len), Some(3));
    assert_eq!(api_get(c.api_port(), "/primary").0, 200);
    assert_eq!(api_get(c.api_port(), "/primary/node0").0, 200);
    assert_eq!(api_get(c.api_port(), "/primary/node1").0, 503);
    assert_eq!(api_get(c.api_port(), "/replica/node1").0, 200);
    assert_eq!(api_get(c.api_port(), "/replica/node0").0, 503);
    assert_eq!(api_get(c.api_port(), "/replica/nodeX").0, 404);

    // The supervisor probes each node over one kept connection, not a login per round.
    probe_connection_is_kept(&c.url(&["--primary"])).await;

    // SIGKILL a replica's postmaster: the supervisor restarts it and it catches up.
    let victim = replicas[0]["name"].as_str().expect("name").to_string();
    let old_pid = replicas[0]["pid"].as_u64().expect("pid") as i32;
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(old_pid),
        nix::sys::signal::Signal::SIGKILL,
    )
    .expect("kill");
    primary
        .batch_execute("insert into items select g, 'late' from generate_series(501, 600) g")
        .await
        .expect("insert while a replica is down");
    let restarted = streaming_again(&c, &victim, Some(old_pid as u64), "the killed replica");
    assert_ne!(restarted["pid"].as_u64(), Some(old_pid as u64));
    let index = if victim == "node1" { "1" } else { "2" };
    let replica = connect(&c.url(&["--replica", index])).await;
    eventually(
        Duration::from_secs(30),
        "the restarted replica to catch up",
        || async { count(&replica, "items").await == Some(600) },
    )
    .await;
    // Its probe connection died with it; the supervisor logged in again and kept that one.
    probe_connection_is_kept(&c.url(&["--replica", index])).await;
    drop((replica, primary, endpoint));

    // `herd restart --node` restarts a replica on an operator's request (a new postmaster,
    // streaming again); the primary is refused.
    let before = restarted["pid"].as_u64();
    c.herd_ok(&["restart", "--node", &victim]);
    streaming_again(&c, &victim, before, "the replica restarted by herd restart");
    let refused = c.herd(&["restart", "--node", "node0"]);
    assert!(
        !refused.status.success(),
        "the primary restarts through a switchover only"
    );

    // down stops everything; up resumes the same cluster with its data.
    c.herd_ok(&["down"]);
    let stopped = c.status();
    assert!(stopped["supervisor"].is_null());
    for n in stopped["nodes"].as_array().expect("nodes") {
        assert_eq!(n["state"], "stopped", "{n}");
    }
    c.up(&[]);
    let primary = connect(&c.url(&["--primary"])).await;
    assert_eq!(count(&primary, "items").await, Some(600));
    let replica = connect(&c.url(&["--replica", "2"])).await;
    eventually(
        Duration::from_secs(30),
        "data on a replica after resume",
        || async { count(&replica, "items").await == Some(600) },
    )
    .await;
}

/// Waits (60 s) until node `name` streams with another postmaster than `old_pid`; its status.
fn streaming_again(
    c: &herd_testkit::TestCluster,
    name: &str,
    old_pid: Option<u64>,
    what: &str,
) -> serde_json::Value {
    herd_testkit::wait_until(
        Duration::from_secs(60),
        &format!("{what} to stream again"),
        || {
            let s = c.status();
            let n = s["nodes"]
                .as_array()?
                .iter()
                .find(|n| n["name"] == name)?
                .clone();
            (n["state"] == "streaming" && n["pid"].as_u64() != old_pid).then_some(n)
        },
    )
}

/// The supervisor's probe backend on `url`'s server outlives several probe rounds (500 ms
/// each): with a login per round no backend of it would be there twice.
async fn probe_connection_is_kept(url: &str) {
    let client = connect(url).await;
    let probes = || async {
        client
            .query(
                "select pid from pg_stat_activity where application_name = $1",
                &[&herd_pg::PROBE_APPLICATION],
            )
            .await
            .expect("pg_stat_activity")
            .iter()
            .map(|r| r.get::<_, i32>(0))
            .collect::<Vec<i32>>()
    };
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    let first = loop {
        let found = probes().await;
        if !found.is_empty() {
            break found;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "no probe backend within 10 s"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    tokio::time::sleep(Duration::from_secs(2)).await;
    let later = probes().await;
    assert!(
        first.iter().any(|pid| later.contains(pid)),
        "no probe backend lasted 2 s: {first:?} then {later:?}"
    );
}
