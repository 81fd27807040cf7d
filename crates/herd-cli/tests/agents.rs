//! Several hosts, modelled on loopback: a 3-member etcd cluster, three `herd agent`s (each its
//! own PostgreSQL) and a `herd proxy`. A checker writes through the proxy and records every
//! acknowledged write, and probes every node every 100 ms for whether it accepts writes.
//! Faults, 3 times each (`HERD_TEST_FAULT_ROUNDS` for more or fewer): kill -9 of the primary's agent
//! and server; SIGSTOP of the primary's agent for longer than the lease TTL (its watchdog must
//! fence the server before another member takes over).
//! Checks: every acknowledged write is present afterwards, no probe instant saw two writable
//! nodes, the cluster is whole again after each fault. Bad starts fail clearly.

mod common;

use std::process::Command;
use std::time::{Duration, Instant};

use common::hosts::{copy_dir, fault_rounds, finish, start_checker, Hosts, HERD, TTL_MS};
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn agents_fail_over_fence_and_rejoin_without_losing_writes() {
    let mut hosts = Hosts::start();
    let (stop, record, threads) = start_checker(&hosts).await;
    let acked = || record.lock().expect("record").acknowledged.len();
    herd_testkit::wait_until(Duration::from_secs(30), "first writes", || {
        (acked() > 20).then_some(())
    });

    let rounds = fault_rounds(3);
    for round in 1..=rounds {
        kill_primary(&mut hosts, &acked, round);
    }
    for round in 1..=rounds {
        freeze_primary(&hosts, &acked, round);
    }

    // 3. Operator commands through the store, while writes go on: a planned switchover to a
    //    named replica, a commit mode change, the status.
    let leader = hosts.wait_primary("now");
    let target = (0..3).find(|&i| i != leader).expect("a replica");
    hosts.wait_writes(&acked, "before the switchover");
    let errors = || record.lock().expect("record").write_errors.clone();
    let before = errors().len();
    let out = hosts.herd_store(&["switchover", "--to", &Hosts::name(target)]);
    assert!(
        out.contains(&format!("switchover to {} done", Hosts::name(target))),
        "{out}"
    );
    hosts.wait_role(target, "primary", Duration::from_secs(30));
    hosts.wait_writes(&acked, "through the new primary");
    // The proxy held new writes while the leader stepped down: a pause, not errors.
    let during = errors();
    assert_eq!(
        during.len(),
        before,
        "writes failed during the switchover: {:?}",
        &during[before..]
    );
    hosts.wait_role(leader, "replica", Duration::from_secs(90));
    let out = hosts.herd_store(&["config", "set", "commit-mode", "remote_apply"]);
    assert!(out.contains("recorded"), "{out}");
    let direct = common::connect(&hosts.node_url(target)).await;
    common::eventually(
        Duration::from_secs(30),
        "remote_apply on the primary",
        || async {
            direct
                .query_one("show synchronous_commit", &[])
                .await
                .is_ok_and(|r| r.get::<_, String>(0) == "remote_apply")
        },
    )
    .await;
    // wal_compression through the store: every member's agent applies it (a reload).
    let out = hosts.herd_store(&["config", "set", "wal-compression", "lz4"]);
    assert!(out.contains("every member's agent applies it"), "{out}");
    let replica = common::connect(&hosts.node_url(leader)).await;
    for (who, client) in [("the primary", &direct), ("a replica", &replica)] {
        common::eventually(Duration::from_secs(30), who, || async {
            client
                .query_one("show wal_compression", &[])
                .await
                .is_ok_and(|r| r.get::<_, String>(0) == "lz4")
        })
        .await;
    }
    let status: serde_json::Value =
        serde_json::from_str(&hosts.herd_store(&["status", "--json"])).expect("status json");
    assert_eq!(status["leader"], Hosts::name(target).as_str(), "{status}");
    assert_eq!(
        status["members"].as_array().map(Vec::len),
        Some(3),
        "{status}"
    );
    hosts.wait_writes(&acked, "after the switchover");

    // 4. A manual failover to a member behind the one the quorum proof names is refused at
    //    once, in the one-host supervisor's words, and nothing changes.
    let behind = (0..3)
        .find(|&i| i != leader && i != target)
        .expect("third member");
    let frozen = common::connect(&hosts.node_url(behind)).await;
    let receiver: i32 = frozen
        .query_one("select pid from pg_stat_wal_receiver", &[])
        .await
        .expect("walreceiver")
        .get(0);
    let receiver = Pid::from_raw(receiver);
    kill(receiver, Signal::SIGSTOP).expect("SIGSTOP walreceiver");
    let position =
        |i: usize| -> Option<herd_core::Lsn> { hosts.member(i)?["lsn"].as_str()?.parse().ok() };
    herd_testkit::wait_until(Duration::from_secs(30), "a member behind", || {
        hosts.wait_writes(&acked, "while a receiver is frozen");
        (position(behind) < position(leader)).then_some(())
    });
    let mut cmd = std::process::Command::new(HERD);
    cmd.args(["failover", "--to", &Hosts::name(behind)]).args([
        "--dcs",
        &hosts.dcs(),
        "--cluster",
        &hosts.cluster,
    ]);
    let started = std::time::Instant::now();
    let out = herd_testkit::output_within(&mut cmd, Duration::from_secs(90)).expect("herd exits");
    kill(receiver, Signal::SIGCONT).expect("SIGCONT walreceiver");
    let said = herd_testkit::describe(&out);
    assert!(!out.status.success(), "{said}");
    assert!(
        said.contains(&format!(
            "{} may lack acknowledged commits; {} holds them all",
            Hosts::name(behind),
            Hosts::name(leader)
        )),
        "{said}"
    );
    assert!(
        started.elapsed() < Duration::from_secs(30),
        "refused at once: {said}"
    );
    assert_eq!(hosts.primary(), Some(target), "the leader stays");
    hosts.wait_writes(&acked, "after the refused failover");

    finish(&hosts, &stop, threads, &record).await;
}

/// kill -9 of the primary's PostgreSQL postmaster only, its agent alive: the agent no longer
/// restarts the server in place (it did before slice 8 of #39) while a replica can take over.
/// It renews the lease for the failover timeout (3.5 s here, from the agents' herd.toml
/// `[supervisor] failover_timeout_ms`, as `herd up` reads it; 2 s by default), then abdicates
/// (fences, keeps the was-primary marker, releases the lease); a replica takes over at once and
/// the old member rejoins as a replica through pg_rewind. No acknowledged write is lost, never
/// two primaries.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_server_under_live_agent_fails_over() {
    let hosts = Hosts::start_configured("[supervisor]\nfailover_timeout_ms = 3500\n");
    let (stop, record, threads) = start_checker(&hosts).await;
    let acked = || record.lock().expect("record").acknowledged.len();
    hosts.wait_writes(&acked, "at first");
    for round in 1..=fault_rounds(2) {
        let old = hosts.wait_primary("now");
        // Rejoined in the round before: its sync set settles before the next fault.
        hosts.wait_writes(&acked, "before the kill");
        let postmaster = hosts.postmaster(old).expect("postmaster pid");
        let abdicated = |i: usize| {
            herd_testkit::agents::agent_metric(
                &hosts.api(i),
                "herd_ha_decisions_total{group=\"0\",action=\"abdicate\"}",
            )
            .unwrap_or(0)
        };
        let before = abdicated(old);
        kill(Pid::from_raw(postmaster), Signal::SIGKILL).expect("kill the postmaster");
        let killed_at = Instant::now();
        let new = herd_testkit::wait_until(
            Duration::from_secs(60),
            "another member primary after the server's kill -9",
            || hosts.primary().filter(|p| *p != old),
        );
        let took = killed_at.elapsed();
        eprintln!(
            "server kill -9 #{round}: {} primary {:.1} s after the kill of {}'s postmaster",
            Hosts::name(new),
            took.as_secs_f64(),
            Hosts::name(old)
        );
        // The failover timeout (3.5 s) passed first: the server was given that long to be back
        // (less half a round of the agent's probe before the kill was noticed).
        assert!(
            took >= Duration::from_millis(3000),
            "replaced after {took:?}"
        );
        let log =
            std::fs::read_to_string(hosts.dir.path().join(format!("{}.log", Hosts::name(old))))
                .unwrap_or_default();
        assert!(
            log.contains("takes over after 3.5 s (no postmaster)"),
            "the agent's policy is the herd.toml's:\n{}",
            hosts.logs()
        );
        hosts.wait_writes(&acked, "after the failover");
        assert!(
            hosts.agents[old]
                .as_ref()
                .is_some_and(|_| hosts.member(old).is_some()),
            "{}'s agent is alive and answers",
            Hosts::name(old)
        );
        assert_eq!(
            abdicated(old),
            before + 1,
            "{} abdicated once",
            Hosts::name(old)
        );
        // Streaming from the new primary: rewound (it may be started as a standby before, while
        // no member leads yet; it serves no reads then).
        herd_testkit::wait_until(Duration::from_secs(90), "the old primary streaming", || {
            hosts
                .member(old)
                .filter(|m| m["role"] == "replica" && m["streaming_from"].is_string())
        });
        assert!(
            !hosts.agent_dir(old).join("run/was-primary").exists(),
            "rewound: the marker is gone"
        );
    }
    finish(&hosts, &stop, threads, &record).await;
}

/// A steady cluster is quiet: about one round per loop wait on each agent (each woke at every
/// heartbeat of every member before: rounds ~20 ms apart), and nothing logged at WARN or above
/// (every non-waiting step, a renewal included, was a warning before).
#[test]
fn a_steady_cluster_is_quiet() {
    let hosts = Hosts::start();
    // Settled: the sync set recorded, slots made.
    std::thread::sleep(Duration::from_secs(5));
    let logs = |i: usize| {
        std::fs::read_to_string(hosts.dir.path().join(format!("{}.log", Hosts::name(i))))
            .expect("agent log")
    };
    let rounds = |i: usize| {
        herd_testkit::agents::agent_metric(&hosts.api(i), "herd_agent_rounds_total")
            .expect("herd_agent_rounds_total")
    };
    let before: Vec<(usize, u64)> = (0..3).map(|i| (logs(i).len(), rounds(i))).collect();
    let span = Duration::from_secs(10);
    std::thread::sleep(span);
    // --loop-wait-ms 500: 20 rounds in 10 s, a few more for changes that wake a round.
    for (i, (log_len, count)) in before.into_iter().enumerate() {
        let ran = rounds(i) - count;
        eprintln!("{} ran {ran} rounds in {span:?}", Hosts::name(i));
        assert!(
            (10..=40).contains(&ran),
            "{} ran {ran} rounds in {span:?}; logs:\n{}",
            Hosts::name(i),
            hosts.logs()
        );
        let text = logs(i);
        let loud: Vec<&str> = text[log_len..]
            .lines()
            .filter(|l| l.contains(" WARN ") || l.contains(" ERROR "))
            .collect();
        assert!(loud.is_empty(), "{}: {loud:#?}", Hosts::name(i));
    }
}

/// Clocks that disagree by hours between hosts change nothing: leases live in etcd (its own
/// TTLs) and every agent measures durations on its own monotonic clock. Two agents restarted
/// under libfaketime, one hour ahead and one hour behind (their watchdogs and, once restarted,
/// their PostgreSQL servers too), then the primary is killed and later frozen: failover,
/// fencing and rejoin work as with true clocks, no write is lost, never two primaries.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clock_skew_between_hosts_changes_nothing() {
    common::hosts::libfaketime();
    let mut hosts = Hosts::start();
    let (stop, record, threads) = start_checker(&hosts).await;
    let acked = || record.lock().expect("record").acknowledged.len();
    hosts.wait_writes(&acked, "at first");
    let primary = hosts.wait_primary("now");
    let skewed: Vec<usize> = (0..3).filter(|&i| i != primary).collect();
    for (&i, offset) in skewed.iter().zip(["+1h", "-1h"]) {
        hosts.signal_agent(i, Signal::SIGTERM);
        let _ = hosts.agents[i].take().map(|mut c| c.wait());
        hosts.clock[i] = Some(offset.to_string());
        hosts.start_agent(i);
        hosts.wait_role(i, "replica", Duration::from_secs(60));
    }
    // The skew is real: the faked agent restarted its server, whose clock is an hour off.
    let skew = clock_offset(&hosts, skewed[0]).await;
    assert!(
        (3000.0..4200.0).contains(&skew),
        "{} should run an hour ahead, is {skew} s off",
        Hosts::name(skewed[0])
    );
    kill_primary(&mut hosts, &acked, 1);
    let leader = hosts.wait_primary("now");
    assert!(
        skewed.contains(&leader),
        "a skewed member leads after the kill"
    );
    freeze_primary(&hosts, &acked, 1);
    hosts.wait_writes(&acked, "after both faults with skewed clocks");
    finish(&hosts, &stop, threads, &record).await;
}

/// How far (seconds) host `i`'s PostgreSQL clock is from this machine's.
async fn clock_offset(hosts: &Hosts, i: usize) -> f64 {
    let client = common::connect(&hosts.node_url(i)).await;
    let theirs: f64 = client
        .query_one("select extract(epoch from clock_timestamp())::float8", &[])
        .await
        .expect("clock")
        .get(0);
    let ours = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("clock")
        .as_secs_f64();
    theirs - ours
}

/// kill -9 of the primary's agent and its PostgreSQL: another member takes over; the old one
/// comes back as a replica (pg_rewind).
fn kill_primary(hosts: &mut Hosts, acked: &dyn Fn() -> usize, round: u32) {
    let old = hosts.wait_primary("now");
    let postmaster = hosts.postmaster(old).expect("postmaster pid");
    hosts.signal_agent(old, Signal::SIGKILL);
    let _ = kill(Pid::from_raw(postmaster), Signal::SIGKILL);
    let _ = hosts.agents[old].take().map(|mut c| c.wait());
    let killed_at = Instant::now();
    let before = acked();
    herd_testkit::wait_until(
        Duration::from_secs(60),
        "a new primary after kill -9",
        || hosts.primary().filter(|p| *p != old),
    );
    herd_testkit::wait_until(Duration::from_secs(60), "writes after the failover", || {
        (acked() > before + 10).then_some(())
    });
    eprintln!(
        "kill -9 #{round}: writes resumed {:.1} s after the kill",
        killed_at.elapsed().as_secs_f64()
    );
    // The old member comes back as a replica (pg_rewind).
    hosts.start_agent(old);
    hosts.wait_role(old, "replica", Duration::from_secs(90));
}

/// SIGSTOP of the primary's agent for longer than the TTL: the watchdog fences its server
/// before the lease can expire; another member takes over; the agent, continued, rejoins.
fn freeze_primary(hosts: &Hosts, acked: &dyn Fn() -> usize, round: u32) {
    let frozen = hosts.wait_primary("now");
    let port = hosts.pg_port(frozen);
    hosts.signal_agent(frozen, Signal::SIGSTOP);
    let stopped_at = Instant::now();
    // Fenced: the server no longer takes connections (its postmaster is gone; a killed
    // postmaster may linger as a zombie until PID 1 reaps it, so its pid proves nothing).
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_ok() {
        assert!(
            stopped_at.elapsed() < Duration::from_secs(30),
            "the watchdog did not fence the frozen primary {} within 30 s\n{}",
            Hosts::name(frozen),
            hosts.logs()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let fenced_after = stopped_at.elapsed();
    eprintln!(
        "SIGSTOP #{round}: the watchdog fenced the primary {:.1} s after its agent froze",
        fenced_after.as_secs_f64()
    );
    assert!(
        fenced_after < Duration::from_millis(TTL_MS),
        "fenced {fenced_after:?} after the agent froze; the lease lives {TTL_MS} ms"
    );
    herd_testkit::wait_until(
        Duration::from_secs(60),
        "a new primary after SIGSTOP",
        || hosts.primary().filter(|p| *p != frozen),
    );
    hosts.wait_writes(acked, "after the failover of a frozen agent");
    hosts.signal_agent(frozen, Signal::SIGCONT);
    hosts.wait_role(frozen, "replica", Duration::from_secs(90));
}

#[test]
fn bad_starts_fail_clearly() {
    let mut hosts = Hosts::start();
    // A second agent under a name that is in use elsewhere.
    let dup = hosts.dir.path().join("dup");
    std::fs::create_dir_all(&dup).expect("dir");
    copy_dir(&hosts.agent_dir(0).join("secrets"), &dup.join("secrets"));
    let mut cmd = hosts.agent_command_as(1, "h1", &dup, hosts.base + 9, "127.0.0.1:0");
    let out = herd_testkit::output_within(&mut cmd, Duration::from_secs(60)).expect("exits");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(err.contains("another agent named h1 is running"), "{err}");

    // A new host without the cluster's secrets.
    let fresh = hosts.dir.path().join("fresh");
    let mut cmd = hosts.agent_command_as(1, "h9", &fresh, hosts.base + 9, "127.0.0.1:0");
    let out = herd_testkit::output_within(&mut cmd, Duration::from_secs(60)).expect("exits");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(err.contains("copy the secrets directory"), "{err}");

    // A proxy without the cluster's secrets names where it looked and the copy to make.
    let mut cmd = Command::new(HERD);
    cmd.args(["proxy", "--dcs", &hosts.dcs(), "--cluster", &hosts.cluster])
        .arg("--data-dir")
        .arg(&fresh)
        .args(["--listen", "127.0.0.1:0"]);
    let out = herd_testkit::output_within(&mut cmd, Duration::from_secs(60)).expect("exits");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        err.contains(&format!(
            "looked for them in {}",
            fresh.join("secrets").display()
        )) && err.contains("scp -rp"),
        "{err}"
    );

    // A second proxy, with session pooling from a herd.toml, serves the same cluster.
    let toml = hosts.dir.path().join("proxy.toml");
    std::fs::write(&toml, "[proxy]\npool_mode = \"session\"\npool_size = 2\n").expect("toml");
    let port = hosts.base + 9;
    let mut second = Command::new(HERD)
        .args(["proxy", "--dcs", &hosts.dcs(), "--cluster", &hosts.cluster])
        .args(["--listen", &format!("127.0.0.1:{port}")])
        .arg("--data-dir")
        .arg(hosts.dir.path().join("proxy"))
        .arg("--config")
        .arg(&toml)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("second proxy");
    let url = hosts
        .proxy_url()
        .replace(&hosts.proxy_port().to_string(), &port.to_string());
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    let answered = rt.block_on(async {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Some(c) = common::try_connect(&url).await {
                c.batch_execute("set application_name = 'sticky'")
                    .await
                    .expect("set");
                let row = c
                    .query_one("show application_name", &[])
                    .await
                    .expect("show");
                return row.get::<_, String>(0);
            }
            assert!(Instant::now() < deadline, "the second proxy never answered");
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    });
    assert_eq!(answered, "sticky");
    let _ = second.kill();
    let _ = second.wait();
    // The file is read and checked: a bad value stops the proxy with the key named.
    std::fs::write(&toml, "[proxy]\npool_size = 0\n").expect("toml");
    let mut bad = Command::new(HERD);
    bad.args(["proxy", "--dcs", &hosts.dcs(), "--cluster", &hosts.cluster])
        .args(["--listen", &format!("127.0.0.1:{port}")])
        .arg("--data-dir")
        .arg(hosts.dir.path().join("proxy"))
        .arg("--config")
        .arg(&toml);
    let out = herd_testkit::output_within(&mut bad, Duration::from_secs(30)).expect("exits");
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("pool_size"), "{err}");

    // An agent killed while its PostgreSQL runs: restarted, it adopts the running server.
    let replica = (0..3)
        .find(|&i| hosts.role(i).as_deref() == Some("replica"))
        .expect("a replica");
    let postmaster = hosts.postmaster(replica).expect("postmaster pid");
    hosts.signal_agent(replica, Signal::SIGKILL);
    let _ = hosts.agents[replica].take().map(|mut c| c.wait());
    hosts.start_agent(replica);
    hosts.wait_role(replica, "replica", Duration::from_secs(30));
    assert_eq!(
        hosts.postmaster(replica),
        Some(postmaster),
        "the restarted agent adopted its running server"
    );
    assert!(kill(Pid::from_raw(postmaster), None).is_ok());

    // etcd unreachable.
    let port = herd_testkit::free_port_block(1);
    let out = herd_testkit::output_within(
        Command::new(HERD)
            .args([
                "agent",
                "--dcs",
                &format!("etcd://127.0.0.1:{port}"),
                "--cluster",
                "x",
                "--name",
                "a",
                "--data-dir",
            ])
            .arg(hosts.dir.path().join("none")),
        Duration::from_secs(60),
    )
    .expect("exits");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(err.contains("start etcd or check --dcs"), "{err}");
}

/// A replica away while its primary recycles the WAL it would need (its slot invalidated by
/// `max_slot_wal_keep_size`, nothing kept by `wal_keep_size`) can never catch up by
/// streaming: its agent reads "has already been removed" in PostgreSQL's log and clones the
/// primary afresh, where it used to wait (or rewind) forever. The agents read their
/// `[postgres]` settings from a herd.toml (`herd agent --config`), which this also checks.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_whose_wal_is_gone_is_cloned_afresh() {
    let mut hosts = Hosts::start_configured(
        "[postgres]\nwal_keep_size = \"0\"\nmax_slot_wal_keep_size = \"32MB\"\n",
    );
    let p = hosts.wait_primary("now");
    let r = (0..3).find(|&i| i != p).expect("a replica");
    let Some(primary) = common::try_connect(&hosts.node_url(p)).await else {
        panic!(
            "the primary {} does not answer\n{}",
            Hosts::name(p),
            hosts.logs()
        );
    };
    let shown: String = primary
        .query_one("show wal_keep_size", &[])
        .await
        .expect("show")
        .get(0);
    assert_eq!(shown, "0", "the agent applies its herd.toml");
    primary
        .batch_execute("create table kept (id int primary key)")
        .await
        .expect("create");

    // The replica goes away (agent and server), and the primary moves on by 6 segments.
    let postmaster = hosts.postmaster(r).expect("postmaster pid");
    hosts.signal_agent(r, Signal::SIGKILL);
    let _ = kill(Pid::from_raw(postmaster), Signal::SIGKILL);
    let _ = hosts.agents[r].take().map(|mut c| c.wait());
    for i in 0..6 {
        primary
            .batch_execute(&format!(
                "insert into kept values ({i}); select pg_switch_wal(); checkpoint"
            ))
            .await
            .expect("switch");
    }
    let slot = format!(
        "select wal_status from pg_replication_slots where slot_name = '{}'",
        Hosts::name(r)
    );
    let status: Option<String> = primary
        .query_opt(&slot, &[])
        .await
        .expect("slot")
        .map(|row| row.get(0));
    assert_eq!(
        status.as_deref(),
        Some("lost"),
        "the replica's slot was invalidated"
    );

    hosts.start_agent(r);
    herd_testkit::wait_until(
        Duration::from_secs(120),
        "the replica cloned afresh",
        || {
            let log =
                std::fs::read_to_string(hosts.dir.path().join(format!("{}.log", Hosts::name(r))))
                    .unwrap_or_default();
            log.contains("cloning it afresh").then_some(())
        },
    );
    // It streams again and has every row, those written while it was away included (its
    // member record may say "replica" from before the clone: ask the server itself).
    primary
        .batch_execute("insert into kept values (100)")
        .await
        .expect("insert");
    let url = hosts.node_url(r);
    common::eventually(
        Duration::from_secs(120),
        "every row on the re-cloned replica",
        || async {
            match common::try_connect(&url).await {
                Some(c) => c
                    .query_one("select count(*) from kept", &[])
                    .await
                    .is_ok_and(|row| row.get::<_, i64>(0) == 7),
                None => false,
            }
        },
    )
    .await;
    hosts.wait_role(r, "replica", Duration::from_secs(60));
    assert!(
        hosts
            .agent_dir(r)
            .join("pgdata.failed")
            .join("PG_VERSION")
            .exists(),
        "the old data directory is kept aside"
    );
}
