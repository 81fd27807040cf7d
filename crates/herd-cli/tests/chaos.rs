//! Chaos: faults under write load through the endpoint. Every write is logged as acknowledged,
//! failed or unknown; after recovery every acknowledged write must be on the current primary,
//! nothing never sent may exist, and the cluster must be back to full strength.

mod common;

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::{cluster, connect};
use herd_testkit::{wait_until, TestCluster};
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use tokio_postgres::NoTls;

/// Outcome of each write, by id.
#[derive(Default)]
struct Ledger {
    acked: BTreeSet<i64>,
    sent: BTreeSet<i64>,
}

/// Inserts ids one by one through the endpoint until `stop`, reconnecting after errors.
async fn writer(url: String, first_id: i64, stop: Arc<AtomicBool>, ledger: Arc<Mutex<Ledger>>) {
    let mut id = first_id;
    let mut client = None;
    while !stop.load(Ordering::Relaxed) {
        if client.is_none() {
            match tokio::time::timeout(Duration::from_secs(5), tokio_postgres::connect(&url, NoTls))
                .await
            {
                Ok(Ok((c, conn))) => {
                    tokio::spawn(conn);
                    client = Some(c);
                }
                _ => {
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            }
        }
        let Some(c) = client.as_ref() else { continue };
        id += 1;
        ledger.lock().expect("ledger").sent.insert(id);
        let result = tokio::time::timeout(
            Duration::from_secs(15),
            c.simple_query(&format!("insert into chaos values ({id})")),
        )
        .await;
        match result {
            Ok(Ok(_)) => {
                ledger.lock().expect("ledger").acked.insert(id);
            }
            // Failed or unknown: may or may not exist; never counted as acknowledged.
            _ => client = None,
        }
    }
}

fn postmaster_pid(c: &TestCluster, role: &str) -> (String, i32) {
    let s = c.status();
    let n = s["nodes"]
        .as_array()
        .expect("nodes")
        .iter()
        .find(|n| n["role"] == role && n["pid"].is_u64())
        .expect("node")
        .clone();
    (
        n["name"].as_str().expect("name").to_string(),
        n["pid"].as_i64().expect("pid") as i32,
    )
}

/// The running primary's name when it is not `old` (`herd status --json`, at most 30 s), from
/// a thread of its own.
fn primary_other_than(data_dir: &std::path::Path, old: &str) -> Option<String> {
    let mut status = std::process::Command::new(env!("CARGO_BIN_EXE_herd"));
    status
        .args(["status", "--json", "--data-dir"])
        .arg(data_dir);
    let out = herd_testkit::output_within(&mut status, Duration::from_secs(30))?;
    let s: serde_json::Value = serde_json::from_slice(&out.stdout).ok()?;
    s["nodes"]
        .as_array()?
        .iter()
        .find(|n| n["role"] == "primary" && n["state"] == "running" && n["name"] != old)
        .and_then(|n| n["name"].as_str().map(str::to_string))
}

/// Waits until there is one running primary other than `old` and every other node streams.
fn wait_full_strength(c: &TestCluster, old_primary: Option<&str>) -> String {
    wait_until(
        Duration::from_secs(120),
        "the cluster back to full strength",
        || {
            let s = c.try_status()?;
            let nodes = s["nodes"].as_array()?;
            let primary = nodes
                .iter()
                .find(|n| n["role"] == "primary" && n["state"] == "running")?;
            let name = primary["name"].as_str()?.to_string();
            let others_stream = nodes
                .iter()
                .filter(|n| n["role"] == "replica")
                .all(|n| n["state"] == "streaming");
            (others_stream && old_primary.is_none_or(|o| o != name)).then_some(name)
        },
    )
}

/// A default cluster with the writers' table.
async fn chaos_cluster() -> TestCluster {
    let c = cluster();
    c.up(&[]);
    let primary = connect(&c.url(&["--primary"])).await;
    primary
        .batch_execute("create table chaos(id bigint primary key)")
        .await
        .expect("create");
    c
}

async fn check_ledger(c: &TestCluster, ledger: &Ledger, ids: std::ops::Range<i64>) {
    let primary = connect(&c.url(&["--primary"])).await;
    let rows = primary
        .query(
            "select id from chaos where id >= $1 and id < $2",
            &[&ids.start, &ids.end],
        )
        .await
        .expect("read back");
    let present: BTreeSet<i64> = rows.iter().map(|r| r.get::<_, i64>(0)).collect();
    let lost: Vec<_> = ledger.acked.difference(&present).collect();
    assert!(lost.is_empty(), "acknowledged writes lost: {lost:?}");
    let phantom: Vec<_> = present.difference(&ledger.sent).collect();
    assert!(
        phantom.is_empty(),
        "writes that were never sent exist: {phantom:?}"
    );
}

async fn run_fault(
    c: &TestCluster,
    base: usize,
    iterations: usize,
    fault: impl Fn(&TestCluster) -> Option<String>,
) {
    for round in base..base + iterations {
        let stop = Arc::new(AtomicBool::new(false));
        let ledger = Arc::new(Mutex::new(Ledger::default()));
        let first_id = (round as i64 + 1) * 1_000_000;
        let task = tokio::spawn(writer(c.url(&[]), first_id, stop.clone(), ledger.clone()));
        // Writes must be flowing before the fault (bounded: the machine may be busy).
        let warm = Instant::now();
        while ledger.lock().expect("ledger").acked.len() < 10
            && warm.elapsed() < Duration::from_secs(60)
        {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let acked_before = ledger.lock().expect("ledger").acked.len();
        assert!(
            acked_before >= 10,
            "round {round}: writes did not get going before the fault\n{}",
            c.log_tails()
        );
        let old = fault(c);
        // Keep writing until writes succeed again after the fault.
        let started = Instant::now();
        loop {
            let n = ledger.lock().expect("ledger").acked.len();
            if n > acked_before + 20 || started.elapsed() > Duration::from_secs(90) {
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        stop.store(true, Ordering::Relaxed);
        let _ = task.await;
        let recovered = ledger.lock().expect("ledger").acked.len() > acked_before + 20;
        assert!(
            recovered,
            "round {round}: writes did not resume within 90 s\n{}",
            c.log_tails()
        );
        wait_full_strength(c, old.as_deref());
        let ledger = std::mem::take(&mut *ledger.lock().expect("ledger"));
        check_ledger(c, &ledger, first_id..first_id + 1_000_000).await;
        eprintln!(
            "round {round}: {} acknowledged, {} sent, recovered in {:.1} s",
            ledger.acked.len(),
            ledger.sent.len(),
            started.elapsed().as_secs_f64()
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_primary_and_replica_under_load() {
    let c = chaos_cluster().await;
    // kill -9 of the primary's postmaster: failover, then the old primary rejoins.
    run_fault(&c, 0, 5, |c| {
        let (name, pid) = postmaster_pid(c, "primary");
        kill(Pid::from_raw(pid), Signal::SIGKILL).expect("kill primary");
        Some(name)
    })
    .await;
    // kill -9 of a replica: restarted, no write lost.
    run_fault(&c, 5, 5, |c| {
        let (_, pid) = postmaster_pid(c, "replica");
        kill(Pid::from_raw(pid), Signal::SIGKILL).expect("kill replica");
        None
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn frozen_primary_and_killed_supervisor() {
    let c = chaos_cluster().await;
    // SIGSTOP of the whole primary (postmaster and backends) beyond the failover timeout, then
    // SIGCONT: the zombie must not accept writes after another node was promoted.
    run_fault(&c, 0, 5, |c| {
        let (name, pid) = postmaster_pid(c, "primary");
        let frozen: Vec<i32> = std::iter::once(pid).chain(common::children(pid)).collect();
        for p in &frozen {
            let _ = kill(Pid::from_raw(*p), Signal::SIGSTOP);
        }
        let (data_dir, old) = (c.data_dir(), name.clone());
        // Thawed once another node is primary, at least 12 s (the hung timeout is 8 s).
        std::thread::spawn(move || {
            common::thaw_once_replaced(&frozen, Duration::from_secs(12), || {
                primary_other_than(&data_dir, &old).is_some()
            })
        });
        Some(name)
    })
    .await;
    // kill -9 of Herd's supervisor: PostgreSQL keeps running; `herd up` adopts it again.
    run_fault(&c, 5, 5, |c| {
        let s = c.status();
        let pid = s["supervisor"]["pid"].as_i64().expect("supervisor pid") as i32;
        let before: Vec<_> = s["nodes"]
            .as_array()
            .expect("nodes")
            .iter()
            .map(|n| n["pid"].clone())
            .collect();
        kill(Pid::from_raw(pid), Signal::SIGKILL).expect("kill supervisor");
        wait_until(Duration::from_secs(10), "the supervisor to be gone", || {
            c.status()["supervisor"].is_null().then_some(())
        });
        c.up(&[]);
        let after: Vec<_> = c.status()["nodes"]
            .as_array()
            .expect("nodes")
            .iter()
            .map(|n| n["pid"].clone())
            .collect();
        assert_eq!(before, after, "servers are adopted, not restarted");
        None
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn switchover_and_manual_failover_under_load() {
    let c = chaos_cluster().await;
    let out = c.herd(&["switchover", "--to", "node9"]);
    assert!(!out.status.success(), "an unknown target is refused");
    // Planned switchovers to each replica in turn, then a manual failover: nothing acknowledged lost.
    let admin = |command: &'static str, expect: &'static str| {
        move |c: &TestCluster| {
            let (old, _) = postmaster_pid(c, "primary");
            let out = c.herd_ok(&[command]);
            assert!(out.contains(expect), "{out}");
            Some(old)
        }
    };
    run_fault(&c, 0, 2, admin("switchover", "switched over")).await;
    run_fault(&c, 2, 1, admin("failover", "failed over")).await;
}
