//! Shard moves across hosts are the coordinator's work (`move_requests.rs`), modelled on
//! loopback: one etcd, two shard groups of two `herd agent`s each, one `herd proxy`. A move
//! asked with `herd shards move --dcs` is held in its copy (a lock on the target group's
//! table), the agent holding the coordinator lease is killed (-9) meanwhile, and another agent
//! resumes the move: the command that asked follows it to its end, the shard is on the target
//! group, every row once.

mod common;

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::agent_groups::Groups;
use common::hosts::HERD;
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;

/// Agents: (name, group).
const AGENTS: [(&str, u32); 4] = [("a0", 0), ("a1", 0), ("b0", 1), ("b1", 1)];

/// The agent that holds the coordinator lease now (from `herd status --json`).
fn coordinator(g: &Groups) -> usize {
    let holder = herd_testkit::wait_until(Duration::from_secs(30), "a coordinator", || {
        let status: serde_json::Value =
            serde_json::from_str(&g.herd_store(&["status", "--json"])).ok()?;
        status["coordinator"].as_str().map(str::to_string)
    });
    AGENTS
        .iter()
        .position(|(name, _)| *name == holder)
        .expect("the holder is one of the agents")
}

/// The agent (other than `not`) whose log has `text`, if one has.
fn agent_saying(g: &Groups, text: &str, not: Option<usize>) -> Option<usize> {
    (0..AGENTS.len()).filter(|i| Some(*i) != not).find(|i| {
        std::fs::read_to_string(g.dir.path().join(format!("{}.log", AGENTS[*i].0)))
            .is_ok_and(|log| log.contains(text))
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_move_goes_on_when_the_coordinator_dies() {
    let mut g = Groups::new(&AGENTS, "gm");
    g.start_agent(0);
    g.wait_role(0, "primary", Duration::from_secs(60));
    for i in 1..AGENTS.len() {
        g.start_agent(i);
    }
    g.wait_role(1, "replica", Duration::from_secs(60));
    let g1 = g.wait_primary_of(&[2, 3], Duration::from_secs(90));
    g.wait_role(
        if g1 == 2 { 3 } else { 2 },
        "replica",
        Duration::from_secs(90),
    );
    g.start_proxy();
    let proxy = g.connect_proxy().await;
    common::shards::distributed_table(&proxy, "items", "v text").await;
    proxy
        .batch_execute("insert into items select i, 'x' from generate_series(1, 3000) as s(i)")
        .await
        .expect("rows");

    // The holder of the coordinator lease serves a replica (a switchover when it served its
    // group's primary), so that killing it fails nothing over: what is tested is the move
    // taken over by another holder.
    let holder = coordinator(&g);
    if g.role(holder).as_deref() == Some("primary") {
        let peer = holder ^ 1;
        let out = g.herd_store(&["switchover", "--to", AGENTS[peer].0]);
        assert!(out.contains("done"), "{out}");
        g.wait_role(peer, "primary", Duration::from_secs(60));
        g.wait_role(holder, "replica", Duration::from_secs(90));
    }
    assert_eq!(coordinator(&g), holder, "the lease stays with its holder");
    let (source, target) = (
        g.wait_primary_of(&[0, 1], Duration::from_secs(30)),
        g.wait_primary_of(&[2, 3], Duration::from_secs(30)),
    );

    let shard = common::shards::first_shard_of(&proxy, 0).await;
    // The copy's rows cannot land on group 1 while this transaction holds its lock.
    let blocker = common::connect(&g.url(g.pg_port(target))).await;
    blocker
        .batch_execute("begin; lock table items in share mode")
        .await
        .expect("the lock");

    let out_path = g.dir.path().join("move.out");
    let secrets = g.agent_dir(0);
    let mut mover = Command::new(HERD)
        .args(["shards", "move", &shard.to_string(), "--to", "1"])
        .arg("--data-dir")
        .arg(&secrets)
        .args(["--endpoint", &format!("127.0.0.1:{}", g.proxy_port())])
        .args(["--wait-timeout", "180"])
        .args(["--dcs", &g.dcs(), "--cluster", &g.cluster])
        .stdin(Stdio::null())
        .stdout(std::fs::File::create(&out_path).expect("out"))
        .stderr(Stdio::piped())
        .spawn()
        .expect("herd shards move");

    // The holder takes the move and is stuck in its copy; it is killed there.
    let moving = format!("shard {shard} of postgres: moving");
    herd_testkit::wait_until(
        Duration::from_secs(60),
        "the coordinator takes the move",
        || agent_saying(&g, &moving, None),
    );
    assert_eq!(
        agent_saying(&g, &moving, None),
        Some(holder),
        "the lease holder runs the move"
    );
    tokio::time::sleep(Duration::from_secs(2)).await;
    if let Some(mut a) = g.agents[holder].take() {
        let _ = kill(Pid::from_raw(a.id() as i32), Signal::SIGKILL);
        let _ = a.wait();
    }
    let _ = blocker.batch_execute("rollback").await;
    drop(blocker);

    // Another agent takes the lease and resumes the move; the command follows it to its end.
    let resuming = format!("shard {shard} of postgres: resuming the move");
    herd_testkit::wait_until(
        Duration::from_secs(90),
        "another coordinator resumes",
        || agent_saying(&g, &resuming, Some(holder)),
    );
    let deadline = Instant::now() + Duration::from_secs(300);
    let status = loop {
        if let Some(s) = mover.try_wait().expect("wait") {
            break s;
        }
        if Instant::now() > deadline {
            let _ = mover.kill();
            panic!("herd shards move did not end in 300 s; logs:\n{}", g.logs());
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    let mut err = String::new();
    if let Some(mut e) = mover.stderr.take() {
        use std::io::Read;
        let _ = e.read_to_string(&mut err);
    }
    let text = std::fs::read_to_string(&out_path).unwrap_or_default();
    assert!(
        status.success() && text.contains(&format!("shard {shard} moved from group 0 to group 1")),
        "the move ends though its coordinator died: {status}\n{text}\n{err}\nlogs:\n{}",
        g.logs()
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
        (3000, 3000),
        "every row once after the move"
    );
    let mut total = 0;
    for i in [source, target] {
        total += common::connect(&g.url(g.pg_port(i)))
            .await
            .query_one("select count(*) from items", &[])
            .await
            .expect("rows on a group")
            .get::<_, i64>(0);
    }
    assert_eq!(total, 3000, "each row on one group");
    // Nothing of the move's copy is left.
    let subscriptions: i64 = common::connect(&g.url(g.pg_port(target)))
        .await
        .query_one("select count(*) from pg_subscription", &[])
        .await
        .expect("subscriptions")
        .get(0);
    assert_eq!(subscriptions, 0, "the move's copy is dropped");
}
