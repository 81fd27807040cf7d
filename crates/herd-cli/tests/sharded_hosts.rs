//! A sharded cluster over hosts (issue #39's proof, first part): three network namespaces, each
//! with an etcd member and two `herd agent`s (one per shard group, so each group has a member
//! on every host), and two `herd proxy` outside serving the sharded endpoint from etcd. Writes
//! of two kinds run through the proxies all along: rows by key (spread over both groups) and
//! bank transfers between accounts of both groups (two-phase commit when they span groups).
//! Faults, one after the other: every process of the host holding group 1's primary killed
//! with -9 (agents, servers, watchdogs, its etcd member), then the host restarted; group 0's
//! primary host cut off for two lease TTLs (group 1's primary elsewhere; `HERD_TEST_CUT_BOTH=1`
//! puts it there too, a known open problem), then healed; a proxy killed with -9 while
//! transfers run through it, then restarted. Checks: the bank's total never changes, every
//! acknowledged row is present exactly once, no prepared transaction stays on any group (the
//! agents' coordinator resolves what the killed proxy left), and no probe instant sees two
//! writable nodes in one group (each node probed from inside its host). Last, a table is
//! distributed through one proxy while writes run through both: the other proxy's rows land by
//! the new map. Then a shard move under the same writes, the agent holding the coordinator
//! lease (which runs it) killed with -9 as soon as it takes it: another agent resumes the
//! move and the command that asked it follows it to its end. Needs root (`ip netns`), as CI
//! has. The proxies listen on the database network's bridge (the hosts reach them: the
//! move's subscription and its coordinator go through one).

mod common;

use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::hosts::{copy_dir, etcd_url, thread_runtime};
use common::sharded_hosts::{group_of, host_of, members, Sharded, GROUPS, HOSTS, TTL_MS};
use herd_testkit::etcd::{EtcdCluster, Placement};
use herd_testkit::netns::{Lab, Link};

const ACCOUNTS: i64 = 20;
const BALANCE: i64 = 1000;

/// What the writers and probers saw.
#[derive(Default)]
struct Record {
    rows_acked: Vec<i64>,
    transfers_acked: u64,
    transfers_failed: u64,
    two_writable: Vec<String>,
    /// The last error each writer saw (rows, transfers), for a stall's message.
    last_errors: [Option<String>; 2],
}

/// What a failed or timed-out statement was told.
fn told<T>(
    outcome: &Result<Result<T, tokio_postgres::Error>, tokio::time::error::Elapsed>,
) -> String {
    match outcome {
        Ok(Err(e)) => e.as_db_error().map_or_else(
            || e.to_string(),
            |d| format!("{}: {}", d.code().code(), d.message()),
        ),
        Err(_) => "timed out".into(),
        Ok(Ok(_)) => String::new(),
    }
}

/// Inserts rows by key through proxy 0 (ids spread over both groups), one statement each.
fn row_writer(
    url: String,
    stop: Arc<AtomicBool>,
    record: Arc<Mutex<Record>>,
) -> std::thread::JoinHandle<()> {
    let next = AtomicI64::new(1);
    std::thread::spawn(move || {
        thread_runtime(None).block_on(async move {
            let mut client = None;
            while !stop.load(Ordering::SeqCst) {
                if client.is_none() {
                    client = common::try_connect(&url).await;
                }
                let Some(c) = &client else {
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                };
                let id = next.fetch_add(1, Ordering::SeqCst);
                let params: [&(dyn tokio_postgres::types::ToSql + Sync); 1] = [&id];
                let write = c.execute("insert into items values ($1, 'x')", &params);
                let outcome = tokio::time::timeout(Duration::from_secs(10), write).await;
                match outcome {
                    Ok(Ok(_)) => record.lock().expect("record").rows_acked.push(id),
                    _ => {
                        record.lock().expect("record").last_errors[0] = Some(told(&outcome));
                        client = None;
                    }
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        })
    })
}

/// Bank transfers of 1 between two accounts, through proxy 0 and proxy 1 in turn.
fn transfer_writer(
    urls: [String; 2],
    stop: Arc<AtomicBool>,
    record: Arc<Mutex<Record>>,
) -> std::thread::JoinHandle<()> {
    std::thread::spawn(move || {
        thread_runtime(None).block_on(async move {
            let mut clients: [Option<tokio_postgres::Client>; 2] = [None, None];
            let mut n: i64 = 0;
            while !stop.load(Ordering::SeqCst) {
                n += 1;
                let p = (n % 2) as usize;
                if clients[p].is_none() {
                    clients[p] = common::try_connect(&urls[p]).await;
                }
                let Some(c) = clients[p].as_mut() else {
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                };
                // Accounts 1..=ACCOUNTS: consecutive ids land on both groups.
                let from = 1 + (n * 7) % ACCOUNTS;
                let to = 1 + (n * 13 + 5) % ACCOUNTS;
                let transfer = async {
                    let tx = c.transaction().await?;
                    tx.execute(
                        "update accounts set balance = balance - 1 where id = $1",
                        &[&from],
                    )
                    .await?;
                    tx.execute(
                        "update accounts set balance = balance + 1 where id = $1",
                        &[&to],
                    )
                    .await?;
                    tx.commit().await
                };
                let done = tokio::time::timeout(Duration::from_secs(10), transfer).await;
                let ok = matches!(done, Ok(Ok(())));
                {
                    let mut r = record.lock().expect("record");
                    if ok {
                        r.transfers_acked += 1;
                    } else {
                        r.transfers_failed += 1;
                        r.last_errors[1] = Some(told(&done));
                    }
                }
                if !ok {
                    clients[p] = None;
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        })
    })
}

/// Probes every node of every group from inside its host (100 ms apart) and records any
/// instant at which two nodes of one group accepted writes.
fn probers(
    s: &Sharded,
    stop: Arc<AtomicBool>,
    record: Arc<Mutex<Record>>,
) -> Vec<std::thread::JoinHandle<()>> {
    type Seen = Vec<Option<(Instant, bool)>>;
    let seen: Arc<Mutex<Seen>> = Arc::new(Mutex::new(vec![None; HOSTS * GROUPS]));
    (0..HOSTS * GROUPS)
        .map(|k| {
            let url = format!(
                "postgresql://postgres:{}@127.0.0.1:{}/postgres?connect_timeout=1",
                s.password(),
                s.pg_port(k)
            );
            let netns = s.lab.netns(host_of(k));
            let (stop, seen, record) = (stop.clone(), seen.clone(), record.clone());
            std::thread::spawn(move || {
                thread_runtime(Some(&netns)).block_on(async move {
                    let mut client = None;
                    while !stop.load(Ordering::SeqCst) {
                        let started = Instant::now();
                        let writable =
                            herd_testkit::agents::accepts_writes(&url, &mut client).await;
                        let now = Instant::now();
                        {
                            let mut seen = seen.lock().expect("seen");
                            seen[k] = Some((now, writable));
                            let others: Vec<String> = members(group_of(k))
                                .into_iter()
                                .filter(|&j| j != k)
                                .filter(|&j| {
                                    seen[j].is_some_and(|(t, w)| {
                                        w && now.duration_since(t) < Duration::from_millis(100)
                                    })
                                })
                                .map(Sharded::name)
                                .collect();
                            if writable && !others.is_empty() {
                                record.lock().expect("record").two_writable.push(format!(
                                    "{} and {others:?} writable together",
                                    Sharded::name(k)
                                ));
                            }
                        }
                        tokio::time::sleep(
                            Duration::from_millis(100).saturating_sub(started.elapsed()),
                        )
                        .await;
                    }
                })
            })
        })
        .collect()
}

/// Waits (60 s at most) until both writers acknowledged more than they had.
async fn wait_progress(s: &Sharded, record: &Mutex<Record>, what: &str) {
    let count = |r: &Record| (r.rows_acked.len(), r.transfers_acked);
    let before = count(&record.lock().expect("record"));
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let now = count(&record.lock().expect("record"));
        if now.0 > before.0 + 5 && now.1 > before.1 + 5 {
            return;
        }
        if Instant::now() >= deadline {
            let errors = record.lock().expect("record").last_errors.clone();
            panic!(
                "writes stalled {what} ({before:?} → {now:?}); last errors (rows, transfers): \
                 {errors:?}; sessions:\n{}\nlogs:\n{}",
                sessions(s).await,
                s.logs()
            );
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// What each group's primary is doing: its client sessions and prepared transactions (for a
/// failure's message).
async fn sessions(s: &Sharded) -> String {
    let mut out = String::new();
    for g in 0..GROUPS {
        let Some(k) = members(g)
            .into_iter()
            .find(|&k| s.role(k).as_deref() == Some("primary"))
        else {
            out.push_str(&format!("group {g}: no primary\n"));
            continue;
        };
        let Some(c) = common::try_connect(&s.node_url(k)).await else {
            out.push_str(&format!("group {g}: {} unreachable\n", Sharded::name(k)));
            continue;
        };
        let rows = c
            .query(
                "select format('%s %s %s/%s %s', application_name, state, wait_event_type, \
                 wait_event, left(query, 60)) from pg_stat_activity \
                 where backend_type = 'client backend' and pid <> pg_backend_pid() \
                 union all select format('prepared %s at %s', gid, prepared) from pg_prepared_xacts",
                &[],
            )
            .await
            .map(|rows| rows.iter().map(|r| r.get::<_, String>(0)).collect::<Vec<_>>())
            .unwrap_or_default();
        out.push_str(&format!(
            "group {g} on {}:\n  {}\n",
            Sharded::name(k),
            rows.join("\n  ")
        ));
    }
    out
}

/// Step 5: a shard of group 0 moved to group 1 by the coordinator, whose agent is killed
/// during the move (made a replica's agent first, so that its death fails nothing over: the
/// host faults above cover that), then started again.
async fn move_with_the_coordinator_killed(s: &mut Sharded) {
    let store =
        |args: &[&str]| common::hosts::herd_with_store(&etcd_url(&s.etcd), &s.cluster, args);
    let status: serde_json::Value =
        serde_json::from_str(&store(&["status", "--json"])).expect("status json");
    let name = status["coordinator"]
        .as_str()
        .expect("a coordinator")
        .to_string();
    let holder = (0..HOSTS * GROUPS)
        .find(|&k| Sharded::name(k) == name)
        .expect("the holder is an agent");
    if s.role(holder).as_deref() == Some("primary") {
        let peer = members(group_of(holder))
            .into_iter()
            .find(|&k| k != holder && s.role(k).as_deref() == Some("replica"))
            .expect("a replica to switch over to");
        let out = store(&["switchover", "--to", &Sharded::name(peer)]);
        assert!(out.contains("done"), "{out}");
        s.wait_role(holder, "replica", Duration::from_secs(120));
    }
    let client = common::connect(&s.proxy_url(0)).await;
    let shard = common::shards::first_shard_of(&client, 0).await;
    let out_path = s.dir.path().join("move.out");
    let mut mover = std::process::Command::new(common::hosts::HERD)
        .args(["shards", "move", &shard.to_string(), "--to", "1"])
        .arg("--data-dir")
        .arg(s.agent_dir(0))
        .args(["--endpoint", &s.proxy_addr(0), "--wait-timeout", "180"])
        .args(["--dcs", &etcd_url(&s.etcd), "--cluster", &s.cluster])
        .stdin(std::process::Stdio::null())
        .stdout(std::fs::File::create(&out_path).expect("out"))
        .stderr(std::fs::File::create(s.dir.path().join("move.err")).expect("err"))
        .spawn()
        .expect("herd shards move");
    let dir = s.dir.path().to_path_buf();
    let log_of = |k: usize| {
        std::fs::read_to_string(dir.join(format!("{}.log", Sharded::name(k)))).unwrap_or_default()
    };
    let moving = format!("shard {shard} of postgres: moving");
    let deadline = Instant::now() + Duration::from_secs(60);
    let runner = loop {
        if let Some(k) = (0..HOSTS * GROUPS).find(|&k| log_of(k).contains(&moving)) {
            break k;
        }
        assert!(
            Instant::now() < deadline,
            "no agent took the move; logs:\n{}",
            s.logs()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(runner, holder, "the lease holder runs the move");
    s.kill_agent(holder);
    let deadline = Instant::now() + Duration::from_secs(300);
    let status = loop {
        if let Some(st) = mover.try_wait().expect("wait") {
            break st;
        }
        if Instant::now() > deadline {
            let _ = mover.kill();
            panic!("herd shards move did not end in 300 s; logs:\n{}", s.logs());
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    let text = std::fs::read_to_string(&out_path).unwrap_or_default();
    let err = std::fs::read_to_string(s.dir.path().join("move.err")).unwrap_or_default();
    assert!(
        status.success() && text.contains(&format!("shard {shard} moved from group 0 to group 1")),
        "the move ends though its coordinator died: {status}\n{text}\n{err}\nlogs:\n{}",
        s.logs()
    );
    let resumed = format!("shard {shard} of postgres: resuming the move");
    let finisher = (0..HOSTS * GROUPS).find(|&k| k != holder && log_of(k).contains(&resumed));
    eprintln!(
        "shard {shard} moved with the coordinator {} killed: {}",
        Sharded::name(holder),
        finisher.map_or(
            "finished by the first holder before it died?".to_string(),
            |k| { format!("resumed by {}", Sharded::name(k)) }
        )
    );
    assert!(
        finisher.is_some(),
        "another agent resumed the move:\n{text}"
    );
    assert_eq!(
        common::shards::placement(&client, shard).await,
        (1, None),
        "the shard is on group 1, no move under way"
    );
    s.start_agent(holder);
    s.wait_role(holder, "replica", Duration::from_secs(120));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sharded_cluster_over_hosts_survives_host_loss_cuts_and_proxy_kills() {
    let lab = match Lab::build(HOSTS) {
        Ok(lab) => lab,
        Err(e) if !Lab::available() => {
            eprintln!("SKIPPED: network namespaces need root and `ip netns` ({e})");
            return;
        }
        Err(e) => panic!("building the network namespaces: {e}"),
    };
    let placements: Vec<Placement> = (0..HOSTS)
        .map(|i| Placement {
            ip: lab.host_ip(i, Link::Store),
            netns: Some(lab.netns(i)),
        })
        .collect();
    let etcd = EtcdCluster::start_on(&placements);
    let base = herd_testkit::free_port_block(14);
    let mut s = Sharded {
        etcd,
        dir: herd_testkit::scratch_dir(),
        base,
        agents: (0..HOSTS * GROUPS).map(|_| None).collect(),
        proxies: vec![None, None],
        cluster: format!("s{base}"),
        lab,
    };
    // The first agent creates the cluster (and its passwords); every other agent, and the
    // proxies, get a copy of its secrets, as an operator's `scp` would give them.
    s.start_agent(0);
    s.wait_role(0, "primary", Duration::from_secs(90));
    for k in 1..HOSTS * GROUPS {
        copy_dir(
            &s.agent_dir(0).join("secrets"),
            &s.agent_dir(k).join("secrets"),
        );
        s.start_agent(k);
    }
    copy_dir(
        &s.agent_dir(0).join("secrets"),
        &s.dir.path().join("proxy/secrets"),
    );
    for g in 0..GROUPS {
        let p = s.wait_primary(g, None, Duration::from_secs(120));
        for k in members(g).into_iter().filter(|&k| k != p) {
            s.wait_role(k, "replica", Duration::from_secs(120));
        }
    }
    // The tables are distributed through the first proxy before the second one runs (a map
    // change is refused while another proxy is registered).
    s.start_proxy(0);
    let setup = loop {
        if let Some(c) = common::try_connect(&s.proxy_url(0)).await {
            break c;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    setup
        .batch_execute(
            "create table items (id bigint primary key, v text); \
             create table accounts (id bigint primary key, balance bigint not null)",
        )
        .await
        .expect("create through the proxy");
    for t in ["items", "accounts"] {
        setup
            .simple_query(&format!(
                "select herd.create_distributed_table('{t}', 'id')"
            ))
            .await
            .expect("distribute");
    }
    setup
        .execute(
            "insert into accounts select i, $1 from generate_series(1, $2::bigint) i",
            &[&BALANCE, &ACCOUNTS],
        )
        .await
        .expect("accounts");
    // Each group holds some accounts (the transfers span groups).
    for g in 0..GROUPS {
        let k = s.wait_primary(g, None, Duration::from_secs(10));
        let n = common::connect(&s.node_url(k))
            .await
            .query_one("select count(*) from accounts", &[])
            .await
            .expect("count")
            .get::<_, i64>(0);
        assert!(n > 0 && n < ACCOUNTS, "group {g} holds {n} of the accounts");
    }
    drop(setup);
    s.start_proxy(1);

    let stop = Arc::new(AtomicBool::new(false));
    let record = Arc::new(Mutex::new(Record::default()));
    let mut threads = vec![
        row_writer(s.proxy_url(0), stop.clone(), record.clone()),
        transfer_writer(
            [s.proxy_url(0), s.proxy_url(1)],
            stop.clone(),
            record.clone(),
        ),
    ];
    threads.extend(probers(&s, stop.clone(), record.clone()));
    wait_progress(&s, &record, "at first").await;

    // 1. Every process of group 1's primary host killed with -9, then the host back.
    let p1 = s.wait_primary(1, None, Duration::from_secs(10));
    let lost = host_of(p1);
    s.kill_host(lost);
    // Group 1 is led from another host (waited for: the test fails when none takes over).
    s.wait_primary(1, Some(lost), Duration::from_secs(60));
    s.wait_primary(0, Some(lost), Duration::from_secs(60));
    wait_progress(&s, &record, "after the host was lost").await;
    s.etcd.restart(lost);
    for k in (0..HOSTS * GROUPS).filter(|&k| host_of(k) == lost) {
        s.start_agent(k);
    }
    for k in (0..HOSTS * GROUPS).filter(|&k| host_of(k) == lost) {
        s.wait_role(k, "replica", Duration::from_secs(120));
    }

    // 2. Group 0's primary host cut off for two TTLs, then healed, while group 1's primary
    //    runs on another host (switched over there when it was on the same one). With
    //    HERD_TEST_CUT_BOTH=1 group 1's primary is moved onto that host instead, so both
    //    groups fail over at once: a known open problem (docs/multi-host.md "Not done yet":
    //    writes through the proxies then timed out for over 60 s in 4 of about 12 runs,
    //    nothing reaching the new primaries).
    let p0 = s.wait_primary(0, None, Duration::from_secs(10));
    let cut = host_of(p0);
    let both = std::env::var_os("HERD_TEST_CUT_BOTH").is_some();
    let p1 = s.wait_primary(1, None, Duration::from_secs(10));
    let target = if both {
        (host_of(p1) != cut).then_some(HOSTS + cut)
    } else {
        (host_of(p1) == cut).then_some(HOSTS + (cut + 1) % HOSTS)
    };
    if let Some(target) = target {
        let out = common::hosts::herd_with_store(
            &etcd_url(&s.etcd),
            &s.cluster,
            &["switchover", "--to", &Sharded::name(target)],
        );
        assert!(out.contains("done"), "{out}");
        s.wait_role(target, "primary", Duration::from_secs(30));
    }
    s.lab.set_host(cut, false);
    s.wait_primary(0, Some(cut), Duration::from_secs(60));
    wait_progress(&s, &record, "while a host was cut off").await;
    std::thread::sleep(Duration::from_millis(TTL_MS));
    s.lab.set_host(cut, true);
    for k in (0..HOSTS * GROUPS).filter(|&k| host_of(k) == cut) {
        s.wait_role(k, "replica", Duration::from_secs(120));
    }

    // 3. A proxy killed with -9 while transfers run through it (some may be between the
    //    phases of their two-phase commit), then started again.
    std::thread::sleep(Duration::from_millis(500));
    if let Some(mut p) = s.proxies[1].take() {
        let _ = p.kill();
        let _ = p.wait();
    }
    wait_progress(&s, &record, "after a proxy was killed").await;
    s.start_proxy(1);
    wait_progress(&s, &record, "after the proxy came back").await;

    // 4. A shard map change through one proxy while writes run through both: the other one
    //    holds (acknowledged in its registration) and then routes by the new map.
    let changer = common::connect(&s.proxy_url(1)).await;
    changer
        .batch_execute("create table late (id bigint primary key)")
        .await
        .expect("create late");
    let began = Instant::now();
    changer
        .simple_query("select herd.create_distributed_table('late', 'id')")
        .await
        .expect("a map change with writes running through both proxies");
    eprintln!(
        "table distributed under load with two proxies: {} ms",
        began.elapsed().as_millis()
    );
    let values: Vec<String> = (1..=40).map(|i| format!("({i})")).collect();
    let insert = format!("insert into late values {}", values.join(", "));
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        // As the writers do, a failed attempt is tried again (it wrote nothing: one
        // statement, all or none); what it was told is printed.
        let outcome = match common::try_connect(&s.proxy_url(0)).await {
            Some(c) => tokio::time::timeout(Duration::from_secs(10), c.batch_execute(&insert))
                .await
                .map_err(|_| "timed out".to_string())
                .and_then(|r| r.map_err(|e| format!("{e:?}"))),
            None => Err("no connection".into()),
        };
        match outcome {
            Ok(()) => break,
            // A refusal is no passing fault: the proxy planned with something stale (its
            // catalog names from before the other proxy made the table, once).
            Err(e) if e.contains("E0A000") => panic!("rows through the other proxy: {e}"),
            Err(e) => {
                eprintln!("rows through the other proxy after the change: {e}");
                assert!(
                    Instant::now() < deadline,
                    "rows through the other proxy: {e}\n{}",
                    s.logs()
                );
            }
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    for g in 0..GROUPS {
        let k = s.wait_primary(g, None, Duration::from_secs(30));
        let n: i64 = common::connect(&s.node_url(k))
            .await
            .query_one("select count(*) from late", &[])
            .await
            .expect("late on a group")
            .get(0);
        assert!(
            n > 0 && n < 40,
            "group {g} holds {n} of the 40 rows the other proxy wrote after the change"
        );
    }
    wait_progress(&s, &record, "after the map change").await;

    // 5. A shard move while writes run: the agent holding the coordinator lease, which runs
    //    the move, is killed (-9) as soon as it takes it; another agent resumes it and the
    //    command that asked follows it to its end.
    move_with_the_coordinator_killed(&mut s).await;
    wait_progress(&s, &record, "after the shard move").await;

    stop.store(true, Ordering::SeqCst);
    for t in threads {
        t.join().expect("writer or prober thread");
    }
    let record = std::mem::take(&mut *record.lock().expect("record"));
    assert!(
        record.two_writable.is_empty(),
        "two nodes of one group accepted writes at once: {:?}\n{}",
        record.two_writable,
        s.logs()
    );
    // Nothing stays prepared: what the killed proxy left is resolved by the agents'
    // coordinator once it is old enough (30 s), within a generous bound.
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let mut left = Vec::new();
        for g in 0..GROUPS {
            let k = s.wait_primary(g, None, Duration::from_secs(30));
            let n = common::connect(&s.node_url(k))
                .await
                .query_one("select count(*) from pg_prepared_xacts", &[])
                .await
                .expect("prepared")
                .get::<_, i64>(0);
            if n > 0 {
                left.push((g, n));
            }
        }
        if left.is_empty() {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "prepared transactions left (group, count): {left:?}\n{}",
            s.logs()
        );
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    let client = common::connect(&s.proxy_url(0)).await;
    let row = client
        .query_one("select sum(balance)::bigint, count(*) from accounts", &[])
        .await
        .expect("the bank's total");
    assert_eq!(
        (row.get::<_, i64>(0), row.get::<_, i64>(1)),
        (ACCOUNTS * BALANCE, ACCOUNTS),
        "the bank's total changed ({} transfers acknowledged, {} failed)",
        record.transfers_acked,
        record.transfers_failed
    );
    let rows = client
        .query("select id, count(*) from items group by id", &[])
        .await
        .expect("read back");
    let mut present = std::collections::HashMap::new();
    for r in rows {
        present.insert(r.get::<_, i64>(0), r.get::<_, i64>(1));
    }
    let lost: Vec<&i64> = record
        .rows_acked
        .iter()
        .filter(|id| present.get(*id) != Some(&1))
        .collect();
    assert!(
        lost.is_empty(),
        "acknowledged rows lost or doubled: {lost:?}"
    );
    eprintln!(
        "{} rows and {} transfers acknowledged ({} transfers failed), all kept",
        record.rows_acked.len(),
        record.transfers_acked,
        record.transfers_failed
    );
}
