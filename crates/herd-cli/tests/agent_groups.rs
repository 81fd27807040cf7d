//! Shard groups over hosts, modelled on loopback: one etcd, two shard groups of two `herd
//! agent`s each (`--group 0|1`, the cluster created with `--shard-groups 2`) and one `herd
//! proxy` serving both. A distributed table written through the proxy has rows on both
//! groups; kill -9 of group 1's primary (agent and server) fails group 1 over while group 0
//! keeps its primary and serves writes; the killed member rejoins group 1, and every
//! acknowledged row is read back through the proxy.

mod common;

use std::process::Command;
use std::time::{Duration, Instant};

use common::agent_groups::Groups;
use common::hosts::{copy_dir, HERD};
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;

/// Agents: (name, group).
const AGENTS: [(&str, u32); 4] = [("a0", 0), ("a1", 0), ("b0", 1), ("b1", 1)];

/// Writes rows `from..to` through the proxy, one statement each: the ids acknowledged, and
/// what the failed ones were told.
async fn write_rows(
    client: &tokio_postgres::Client,
    from: i64,
    to: i64,
) -> (Vec<i64>, Vec<String>) {
    let mut acked = Vec::new();
    let mut errors = Vec::new();
    for id in from..to {
        let params: [&(dyn tokio_postgres::types::ToSql + Sync); 2] = [&id, &"x"];
        let write = client.execute("insert into items (id, v) values ($1, $2)", &params);
        match tokio::time::timeout(Duration::from_secs(10), write).await {
            Ok(Ok(_)) => acked.push(id),
            Ok(Err(e)) => errors.push(
                e.as_db_error()
                    .map_or_else(|| e.to_string(), |d| d.message().to_string()),
            ),
            Err(_) => errors.push("timed out".into()),
        }
    }
    (acked, errors)
}

/// Rows of `items` on the server at `url`.
async fn count_on(url: &str) -> i64 {
    common::connect(url)
        .await
        .query_one("select count(*) from items", &[])
        .await
        .expect("count")
        .get(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_shard_groups_over_agents_fail_over_apart() {
    let mut g = Groups::new(&AGENTS, "g");
    g.start_agent(0);
    g.wait_role(0, "primary", Duration::from_secs(60));
    for i in 1..AGENTS.len() {
        copy_dir(
            &g.agent_dir(0).join("secrets"),
            &g.agent_dir(i).join("secrets"),
        );
        g.start_agent(i);
    }
    copy_dir(
        &g.agent_dir(0).join("secrets"),
        &g.dir.path().join("proxy/secrets"),
    );
    g.wait_role(1, "replica", Duration::from_secs(60));
    let first = g.wait_primary_of(&[2, 3], Duration::from_secs(90));
    let other = if first == 2 { 3 } else { 2 };
    g.wait_role(other, "replica", Duration::from_secs(90));
    // Each group is its own PostgreSQL cluster.
    let sysid = |i: usize| {
        let url = g.url(g.pg_port(i));
        async move {
            let c = common::connect(&url).await;
            c.query_one(
                "select system_identifier::text from pg_control_system()",
                &[],
            )
            .await
            .expect("sysid")
            .get::<_, String>(0)
        }
    };
    assert_ne!(
        sysid(0).await,
        sysid(first).await,
        "two groups, two clusters"
    );

    g.start_proxy();
    let proxy = g.connect_proxy().await;
    common::shards::distributed_table(&proxy, "items", "v text").await;
    // Two-phase DDL left in doubt on group 1 (as a proxy that died between the phases leaves
    // it): one whose decision row group 0 holds (to be committed), one without (rolled back).
    // The agents' coordinator resolves them once they are old enough (checked at the end).
    let group1 = common::connect(&g.url(g.pg_port(first))).await;
    for (table, gid) in [
        ("doubt_committed", "herd_ddl_test_commit"),
        ("doubt_rolled_back", "herd_ddl_test_rollback"),
    ] {
        group1
            .batch_execute(&format!(
                "BEGIN; CREATE TABLE {table} (x int); PREPARE TRANSACTION '{gid}'"
            ))
            .await
            .expect("prepare");
    }
    common::connect(&g.url(g.pg_port(0)))
        .await
        .batch_execute(&format!(
            "{}; INSERT INTO herd.txn_decisions (gid) VALUES ('herd_ddl_test_commit')",
            herd_proxy::shards::TXN_DECISIONS_DDL
        ))
        .await
        .expect("decision row");
    let prepared_at = Instant::now();
    let (mut acked, errors) = write_rows(&proxy, 0, 200).await;
    assert_eq!(
        acked.len(),
        200,
        "every write before the fault: {:?}",
        &errors[..errors.len().min(3)]
    );
    // Two proxies: both route by the map; a map change through one goes through while the
    // other runs (it acknowledges the hold, forgets its maps and reads the new one after), and
    // while the other is frozen (its registration expires, then it reads the map again).
    let second_port = g.base + 10;
    let (mut second, through_second) = g.extra_proxy(second_port, "proxy2").await;
    let status: serde_json::Value =
        serde_json::from_str(&g.herd_store(&["status", "--json"])).expect("status json");
    let listens: Vec<&str> = status["proxies"]
        .as_array()
        .map(|a| a.iter().filter_map(|p| p["listen"].as_str()).collect())
        .unwrap_or_default();
    assert!(
        listens.contains(&format!("127.0.0.1:{second_port}").as_str())
            && listens.contains(&format!("127.0.0.1:{}", g.proxy_port()).as_str()),
        "both proxies in the status: {status}"
    );
    let counted: i64 = through_second
        .query_one("select count(*) from items", &[])
        .await
        .expect("a read through the second proxy")
        .get(0);
    assert_eq!(counted, 200, "the second proxy reads every group");
    // The second proxy has read the map (it knows `items`): a reference table made through
    // the first must reach its routing, or its INSERT lands on group 0 only.
    proxy
        .batch_execute("create table refs (id int primary key)")
        .await
        .expect("create refs");
    let started = Instant::now();
    proxy
        .simple_query("select herd.create_reference_table('refs')")
        .await
        .expect("a map change while another proxy runs");
    eprintln!(
        "reference table made with a second proxy running: {} ms",
        started.elapsed().as_millis()
    );
    through_second
        .batch_execute("insert into refs values (1)")
        .await
        .expect("an insert through the second proxy");
    for port in [g.pg_port(0), g.pg_port(first)] {
        let n: i64 = common::connect(&g.url(port))
            .await
            .query_one("select count(*) from refs", &[])
            .await
            .expect("refs on a group")
            .get(0);
        assert_eq!(
            n, 1,
            "the second proxy wrote the reference row to every group ({port})"
        );
    }
    // A third proxy, frozen, acknowledges nothing: the change waits until its registration
    // expires (about 5 s), then goes ahead; thawed, it routes by the new map. Meanwhile the
    // second proxy is held: a transaction under way there goes on by the map it started with
    // (it may hold locks a change waits for) instead of waiting for the change's end.
    let third_port = g.base + 11;
    let (mut third, through_third) = g.extra_proxy(third_port, "proxy3").await;
    let in_transaction = common::connect(&g.url(second_port)).await;
    in_transaction
        .batch_execute("begin; select v from items where id = 1")
        .await
        .expect("a transaction under way through the second proxy");
    kill(Pid::from_raw(third.id() as i32), Signal::SIGSTOP).expect("freeze the third proxy");
    proxy
        .batch_execute("create table more (id int primary key)")
        .await
        .expect("create more");
    let started = Instant::now();
    let changing = async {
        let changed = proxy
            .simple_query("select herd.create_distributed_table('more', 'id')")
            .await;
        (changed, Instant::now())
    };
    let during = async {
        // By then the second proxy has acknowledged the hold (it looks every 200 ms).
        tokio::time::sleep(Duration::from_millis(1500)).await;
        let read = in_transaction
            .query("select v from items where id = 2", &[])
            .await;
        (read, Instant::now())
    };
    let ((changed, changed_at), (read, read_at)) = tokio::join!(changing, during);
    changed.expect("a map change while another proxy is frozen");
    read.expect("a statement of a transaction under way during the hold");
    eprintln!(
        "table distributed with a frozen third proxy: {} ms; the held proxy's transaction went \
         on after {} ms",
        (changed_at - started).as_millis(),
        (read_at - started).as_millis()
    );
    assert!(
        read_at < changed_at,
        "the transaction under way waited for the change ({} ms after it)",
        (read_at - changed_at).as_millis()
    );
    in_transaction
        .batch_execute("commit")
        .await
        .expect("its commit");
    kill(Pid::from_raw(third.id() as i32), Signal::SIGCONT).expect("thaw the third proxy");
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        // Refused (57P03) until its registration is fresh again; then by the new map.
        let rows: Vec<String> = (1..=40).map(|i| format!("({i})")).collect();
        let sql = format!("insert into more values {}", rows.join(", "));
        match through_third.batch_execute(&sql).await {
            Ok(()) => break,
            Err(e) => assert!(
                Instant::now() < deadline,
                "the thawed proxy writes again: {e}"
            ),
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let mut on_groups = Vec::new();
    for port in [g.pg_port(0), g.pg_port(first)] {
        let n: i64 = common::connect(&g.url(port))
            .await
            .query_one("select count(*) from more", &[])
            .await
            .expect("more on a group")
            .get(0);
        on_groups.push(n);
    }
    assert!(
        on_groups.iter().all(|n| *n > 0) && on_groups.iter().sum::<i64>() == 40,
        "the thawed proxy spread the rows by the new map: {on_groups:?}"
    );
    drop(through_third);
    let _ = third.kill();
    let _ = third.wait();
    drop(through_second);
    let _ = second.kill();
    let _ = second.wait();

    // Rows on both groups, none on both.
    let (on0, on1) = (
        count_on(&g.url(g.pg_port(0))).await,
        count_on(&g.url(g.pg_port(first))).await,
    );
    assert!(on0 > 0 && on1 > 0, "rows on both groups: {on0} and {on1}");
    assert_eq!(on0 + on1, 200, "each row on one group");

    // kill -9 of group 1's primary, agent and server: group 1 fails over, group 0 stays.
    let pid = g.agents[first].as_ref().expect("agent").id();
    kill(Pid::from_raw(pid as i32), Signal::SIGKILL).expect("kill agent");
    let _ = herd_pg::kill_server(&g.agent_dir(first).join("pgdata"));
    if let Some(mut a) = g.agents[first].take() {
        let _ = a.wait();
    }
    g.wait_role(other, "primary", Duration::from_secs(60));
    assert_eq!(g.role(0).as_deref(), Some("primary"), "group 0 untouched");
    // Group 0 serves writes while group 1 has no standby (group 1's commits wait for one: the
    // commit mode is synchronous, and a commit no standby confirmed is never acknowledged).
    let on_group0: i64 = common::connect(&g.url(g.pg_port(0)))
        .await
        .query_one("select min(id) from items", &[])
        .await
        .expect("a row on group 0")
        .get(0);
    let proxy = g.connect_proxy().await;
    let params: [&(dyn tokio_postgres::types::ToSql + Sync); 1] = [&on_group0];
    let update = proxy.execute("update items set v = 'during' where id = $1", &params);
    let updated = tokio::time::timeout(Duration::from_secs(20), update).await;
    assert!(
        matches!(updated, Ok(Ok(1))),
        "a write to group 0 during group 1's failover: {updated:?}"
    );
    // The killed member comes back as group 1's replica (rewound or cloned), and writes to
    // both groups go on.
    g.start_agent(first);
    g.wait_role(first, "replica", Duration::from_secs(90));
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut next = 200;
    let mut told = Vec::new();
    while acked.len() < 300 {
        assert!(
            Instant::now() < deadline,
            "writes after group 1's failover: {} acknowledged, last errors {:?}; logs:\n{}",
            acked.len(),
            &told[told.len().saturating_sub(3)..],
            g.logs()
        );
        let (ok, errors) = write_rows(&proxy, next, next + 20).await;
        acked.extend(ok);
        told.extend(errors);
        next += 20;
    }
    let rows = proxy
        .query("select id from items", &[])
        .await
        .expect("read back");
    let present: std::collections::HashSet<i64> = rows.iter().map(|r| r.get(0)).collect();
    let lost: Vec<&i64> = acked.iter().filter(|id| !present.contains(id)).collect();
    assert!(lost.is_empty(), "acknowledged rows lost: {lost:?}");
    let (on0, on1) = (
        count_on(&g.url(g.pg_port(0))).await,
        count_on(&g.url(g.pg_port(other))).await,
    );
    assert_eq!(on0 + on1, present.len() as i64, "each row on one group");

    // Operator verbs per group: the status shows both groups; a switchover named by a group 1
    // member moves group 1's primary only.
    let status: serde_json::Value =
        serde_json::from_str(&g.herd_store(&["status", "--json"])).expect("status json");
    assert_eq!(status["leader"], "a0", "group 0 at the top: {status}");
    assert_eq!(status["groups"][1]["leader"], AGENTS[other].0, "{status}");
    let out = g.herd_store(&["switchover", "--to", AGENTS[first].0]);
    assert!(
        out.contains(&format!("switchover to {} done", AGENTS[first].0)),
        "{out}"
    );
    g.wait_role(first, "primary", Duration::from_secs(30));
    assert_eq!(g.role(0).as_deref(), Some("primary"), "group 0 untouched");
    let (ok, errors) = write_rows(&proxy, 10_000, 10_020).await;
    assert_eq!(
        ok.len(),
        20,
        "writes after group 1's switchover: {errors:?}\n{}",
        g.logs()
    );

    // An online shard move across hosts, through the proxy: a shard of group 0 goes to group
    // 1 (a logical copy, the switch, the source's rows deleted); every row stays readable once.
    let shard = common::shards::first_shard_of(&proxy, 0).await;
    let before: i64 = proxy
        .query_one("select count(*) from items", &[])
        .await
        .expect("count")
        .get(0);
    let secrets = g.agent_dir(0);
    let endpoint = format!("127.0.0.1:{}", g.proxy_port());
    let out = g.herd_store(&[
        "shards",
        "move",
        &shard.to_string(),
        "--to",
        "1",
        "--data-dir",
        secrets.to_str().expect("utf-8 path"),
        "--endpoint",
        &endpoint,
        "--wait-timeout",
        "120",
    ]);
    assert!(
        out.contains(&format!("shard {shard} moved from group 0 to group 1")),
        "{out}"
    );
    assert_eq!(
        common::shards::placement(&proxy, shard).await,
        (1, None),
        "the shard is on group 1, no move under way"
    );
    let row = proxy
        .query_one("select count(*), count(distinct id) from items", &[])
        .await
        .expect("count after the move");
    assert_eq!(
        (row.get::<_, i64>(0), row.get::<_, i64>(1)),
        (before, before),
        "every row once after the move"
    );
    let (on0, on1) = (
        count_on(&g.url(g.pg_port(0))).await,
        count_on(&g.url(g.pg_port(first))).await,
    );
    assert_eq!(on0 + on1, before, "each row on one group after the move");

    // The proxy's HTTP API and dashboard: both groups' topology from the store, the switchover
    // on the timeline, the proxy's counters, and a switchover asked over HTTP.
    // The timeline is the agents' events in the store: the failover of group 1, the killed
    // member's rejoin and the switchover, each said by the member it concerns.
    let has = |events: &[serde_json::Value], kind: &str, text: &str| {
        events.iter().any(|e| {
            e["kind"] == kind
                && e["group"] == 1
                && e["text"].as_str().is_some_and(|t| t.starts_with(text))
        })
    };
    let promoted = |i: usize| format!("{}: promoted to primary of shard group 1", AGENTS[i].0);
    herd_testkit::wait_until(
        Duration::from_secs(10),
        "the failover, the rejoin and the switchover on the timeline",
        || {
            let (code, body) = g.api_get("/dashboard/snapshot");
            let doc: serde_json::Value = serde_json::from_str(&body).ok()?;
            let events = doc["events"].as_array()?;
            let rejoined = events.iter().any(|e| {
                e["kind"] == "rejoin"
                    && e["text"]
                        .as_str()
                        .is_some_and(|t| t.starts_with(&format!("{}: rejoined", AGENTS[first].0)))
            });
            (code == 200
                && has(events, "failover", &promoted(other))
                && has(
                    events,
                    "switchover",
                    &format!("{}; switched over to {}", promoted(first), AGENTS[first].0),
                )
                && rejoined)
                .then_some(())
        },
    );
    // The document is rebuilt from the store every second: wait for the new primary in it.
    let status: serde_json::Value = herd_testkit::wait_until(
        Duration::from_secs(10),
        "the new primary in /status",
        || {
            let (code, body) = g.api_get("/status");
            let doc: serde_json::Value = serde_json::from_str(&body).ok()?;
            let top = &doc["groups"][0]["nodes"][0];
            (code == 200 && top["name"] == AGENTS[first].0 && top["role"] == "primary")
                .then_some(doc)
        },
    );
    assert_eq!(
        status["nodes"][0]["name"], "a0",
        "group 0's primary first: {status}"
    );
    assert_eq!(status["nodes"][0]["role"], "primary", "{status}");
    assert_eq!(status["groups"][0]["group"], 1, "{status}");
    assert_eq!(
        status["groups"][0]["nodes"][0]["name"], AGENTS[first].0,
        "{status}"
    );
    let (code, body) = g.api_get("/metrics");
    assert!(
        code == 200 && body.contains("herd_routed_total"),
        "{code}: {body}"
    );
    let (code, body) = g.api_get("/");
    assert!(
        code == 200 && body.contains("<html"),
        "the dashboard page: {code}"
    );
    let (code, body) = g.api_post(&format!("/switchover?to={}", AGENTS[other].0));
    assert_eq!(code, 200, "switchover over HTTP: {body}");
    g.wait_role(other, "primary", Duration::from_secs(30));
    // Restarts through the store: one replica out of the read pool (a new postmaster), then
    // the whole group over HTTP (replicas first, the primary last through a switchover).
    let pid = |i: usize| {
        std::fs::read_to_string(g.agent_dir(i).join("pgdata/postmaster.pid"))
            .ok()
            .and_then(|t| t.lines().next().map(str::to_string))
    };
    // The former primary rewinds after the switchover first (its record may say replica a
    // moment before the rewind starts: a restart is refused until it runs again).
    g.wait_role(first, "replica", Duration::from_secs(60));
    let before = pid(first);
    let deadline = Instant::now() + Duration::from_secs(90);
    let out = loop {
        let mut cmd = Command::new(HERD);
        cmd.args(["restart", "--node", AGENTS[first].0]).args([
            "--dcs",
            &g.dcs(),
            "--cluster",
            &g.cluster,
        ]);
        let out = herd_testkit::output_within(&mut cmd, Duration::from_secs(90))
            .expect("herd restart exits");
        let said = String::from_utf8_lossy(&out.stderr).into_owned();
        if out.status.success() || !said.contains("only a running replica restarts") {
            break out;
        }
        assert!(Instant::now() < deadline, "{said}");
        std::thread::sleep(Duration::from_millis(500));
    };
    let said = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success() && said.contains(&format!("{} restarted", AGENTS[first].0)),
        "{}",
        herd_testkit::describe(&out)
    );
    assert_ne!(pid(first), before, "a new postmaster");
    g.wait_role(first, "replica", Duration::from_secs(30));
    let refused = Command::new(HERD)
        .args(["restart", "--node", AGENTS[other].0])
        .args(["--dcs", &g.dcs(), "--cluster", &g.cluster])
        .output()
        .expect("herd restart");
    assert!(
        !refused.status.success()
            && String::from_utf8_lossy(&refused.stderr).contains("is the primary"),
        "the primary is not restarted in place: {}",
        herd_testkit::describe(&refused)
    );
    let (before_first, before_other) = (pid(first), pid(other));
    let (code, body) = g.api_post("/restart?group=1");
    assert_eq!(code, 200, "restart of group 1 over HTTP: {body}");
    assert!(
        pid(first) != before_first && pid(other) != before_other,
        "{body}"
    );
    g.wait_role(first, "primary", Duration::from_secs(30));
    assert_eq!(g.role(0).as_deref(), Some("primary"), "group 0 untouched");
    let (ok, errors) = write_rows(&proxy, 20_000, 20_020).await;
    assert_eq!(ok.len(), 20, "writes after the restarts: {errors:?}");

    // The work left in doubt was resolved by the coordinator (the proxy leaves it to the
    // agents): committed where group 0 decided so, rolled back elsewhere. Prepared parts count
    // as abandoned after 30 s; the coordinator looks every 10 s.
    let group1 = common::connect(&g.url(g.pg_port(first))).await;
    let deadline = Instant::now() + Duration::from_secs(90);
    let resolved = loop {
        let row = group1
            .query_one(
                "select (select count(*) from pg_prepared_xacts where gid like 'herd_ddl_test_%'), \
                 to_regclass('doubt_committed') is not null, \
                 to_regclass('doubt_rolled_back') is not null",
                &[],
            )
            .await
            .expect("group 1's primary answers");
        let (left, committed, rolled_back): (i64, bool, bool) =
            (row.get(0), row.get(1), row.get(2));
        if left == 0 {
            break (committed, rolled_back);
        }
        assert!(
            Instant::now() < deadline,
            "the work in doubt is still prepared after {:?}; logs:\n{}",
            prepared_at.elapsed(),
            g.logs()
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    assert!(
        prepared_at.elapsed() >= Duration::from_secs(30),
        "resolved only once abandoned"
    );
    assert_eq!(
        resolved,
        (true, false),
        "committed as decided, else rolled back"
    );
    // One coordinator for the cluster, shown by the status; another agent takes the lease
    // over when its agent dies.
    let status: serde_json::Value =
        serde_json::from_str(&g.herd_store(&["status", "--json"])).expect("status json");
    let holder = status["coordinator"]
        .as_str()
        .expect("a coordinator")
        .to_string();
    let i = AGENTS
        .iter()
        .position(|(name, _)| *name == holder)
        .expect("an agent");
    if let Some(mut a) = g.agents[i].take() {
        let _ = kill(Pid::from_raw(a.id() as i32), Signal::SIGKILL);
        let _ = a.wait();
    }
    herd_testkit::wait_until(Duration::from_secs(30), "another coordinator", || {
        let status: serde_json::Value =
            serde_json::from_str(&g.herd_store(&["status", "--json"])).ok()?;
        let now = status["coordinator"].as_str()?.to_string();
        (now != holder).then_some(())
    });
}
