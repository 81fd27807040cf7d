//! `herd up` on the agent engine (issue #39 slices 10 and 11): one group with two
//! replicas; writes through the endpoint under synchronous commit while the primary's
//! postmaster is killed (-9); a replica takes over with every acknowledged write, the old
//! primary rejoins through pg_rewind, `herd status` shows the new topology, and `herd down` /
//! `herd up` resume with the same primary and all the data.

mod common;

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::{cluster, connect};
use herd_testkit::{describe, wait_until, TestCluster};
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use tokio_postgres::NoTls;

const ENGINE: (&str, &str) = ("HERD_ENGINE", "agents");
/// The retired engine's value, now refused.
const OLD_ENGINE: (&str, &str) = ("HERD_ENGINE", "supervisor");

/// `herd up --detach` on the agent engine.
fn up(c: &TestCluster, extra: &[&str]) -> String {
    let port = c.port.to_string();
    let mut args = vec!["up", "--detach", "--port", &port];
    args.extend_from_slice(extra);
    let out = c.herd_with_env(&args, &[ENGINE]);
    assert!(
        out.status.success(),
        "herd up (agents) failed: {}\n{}",
        describe(&out),
        c.log_tails()
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The running primary's name and postmaster pid, and how many replicas stream.
fn topology(c: &TestCluster) -> Option<(String, i32, usize)> {
    let s = c.try_status()?;
    let nodes = s["nodes"].as_array()?;
    let primary = nodes
        .iter()
        .find(|n| n["role"] == "primary" && n["state"] == "running")?;
    let streaming = nodes
        .iter()
        .filter(|n| n["role"] == "replica" && n["state"] == "streaming")
        .count();
    Some((
        primary["name"].as_str()?.to_string(),
        primary["pid"].as_i64()? as i32,
        streaming,
    ))
}

/// Acknowledged and sent ids.
#[derive(Default)]
struct Ledger {
    acked: BTreeSet<i64>,
}

/// Inserts ids one by one through the endpoint until `stop`, reconnecting after errors; only
/// writes whose commit was acknowledged are recorded.
async fn writer(url: String, stop: Arc<AtomicBool>, ledger: Arc<Mutex<Ledger>>) {
    let mut id = 0;
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
        let result = tokio::time::timeout(
            Duration::from_secs(15),
            c.simple_query(&format!("insert into ledger values ({id})")),
        )
        .await;
        match result {
            Ok(Ok(_)) => {
                ledger.lock().expect("ledger").acked.insert(id);
            }
            // Failed or unknown: never counted as acknowledged.
            _ => client = None,
        }
    }
}

/// Every id in the table, read through the endpoint.
async fn stored(url: &str) -> BTreeSet<i64> {
    let client = connect(url).await;
    client
        .query("select id from ledger", &[])
        .await
        .expect("reading the ledger")
        .iter()
        .map(|r| r.get::<_, i64>(0))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn agents_fail_over_rejoin_and_resume() {
    let c = cluster();
    up(&c, &["--replicas", "2"]);
    let log =
        std::fs::read_to_string(c.data_dir().join("logs").join("herd.log")).unwrap_or_default();
    assert!(log.contains("on the agent engine"), "{log}");
    let (first, pid, _) = wait_until(
        Duration::from_secs(30),
        "a primary and 2 streaming replicas",
        || topology(&c).filter(|t| t.2 == 2),
    );
    let status = c.status();
    assert_eq!(status["commit_mode"], "on", "{status}");

    let url = c.url(&[]);
    connect(&url)
        .await
        .batch_execute("create table ledger (id bigint primary key)")
        .await
        .expect("create table");
    let stop = Arc::new(AtomicBool::new(false));
    let ledger = Arc::new(Mutex::new(Ledger::default()));
    let task = tokio::spawn(writer(url.clone(), stop.clone(), ledger.clone()));
    wait_until(
        Duration::from_secs(20),
        "writes acknowledged before the kill",
        || (ledger.lock().expect("ledger").acked.len() >= 50).then_some(()),
    );

    kill(Pid::from_raw(pid), Signal::SIGKILL).expect("kill -9 of the primary's postmaster");
    let (second, _, _) = wait_until(Duration::from_secs(45), "another primary", || {
        topology(&c).filter(|t| t.0 != first)
    });
    let before = ledger.lock().expect("ledger").acked.len();
    wait_until(
        Duration::from_secs(30),
        "writes acknowledged by the new primary",
        || (ledger.lock().expect("ledger").acked.len() >= before + 50).then_some(()),
    );
    // The old primary comes back as a replica of the new one, rewound (not cloned afresh).
    wait_until(
        Duration::from_secs(45),
        "the old primary streaming again",
        || {
            let s = c.try_status()?;
            s["nodes"]
                .as_array()?
                .iter()
                .any(|n| {
                    n["name"] == first.as_str()
                        && n["role"] == "replica"
                        && n["state"] == "streaming"
                })
                .then_some(())
        },
    );
    stop.store(true, Ordering::Relaxed);
    tokio::time::timeout(Duration::from_secs(30), task)
        .await
        .expect("the writer stops")
        .expect("writer task");
    let log =
        std::fs::read_to_string(c.data_dir().join("logs").join("herd.log")).unwrap_or_default();
    assert!(
        !log.contains("pg_rewind failed"),
        "the old primary was cloned afresh:\n{log}"
    );
    assert!(
        !c.data_dir()
            .join("nodes")
            .join(&first)
            .with_extension("failed")
            .exists(),
        "the old primary was cloned afresh"
    );

    let acked = ledger.lock().expect("ledger").acked.clone();
    let present = stored(&url).await;
    let lost: Vec<_> = acked.difference(&present).collect();
    assert!(lost.is_empty(), "acknowledged writes lost: {lost:?}");

    // `herd status` shows the new topology: the new primary and both replicas streaming. The
    // other replica may need longer than the old primary: it may have received WAL past the
    // point where the new primary's timeline forks (written by the old primary, never
    // acknowledged), and is then rewound or cloned again by its agent's stuck-standby rule.
    let (now, _, _) = wait_until(Duration::from_secs(60), "both replicas streaming", || {
        topology(&c).filter(|t| t.2 == 2)
    });
    assert_eq!(now, second);
    let state: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(c.data_dir().join("state.json")).expect("state.json"),
    )
    .expect("state.json is JSON");
    assert_eq!(state["primary"], second.as_str(), "{state}");

    // Down and up again: the same primary, every row.
    c.herd_ok(&["down"]);
    assert!(c.try_status().is_some_and(|s| s["nodes"]
        .as_array()
        .is_some_and(|n| n.iter().all(|n| n["state"] == "stopped"))));
    up(&c, &[]);
    let (resumed, _, _) = wait_until(Duration::from_secs(30), "the resumed cluster", || {
        topology(&c).filter(|t| t.2 == 2)
    });
    assert_eq!(resumed, second, "herd up resumed with another primary");
    let url = c.url(&[]);
    let after = stored(&url).await;
    assert!(
        acked.is_subset(&after),
        "rows lost over herd down / herd up"
    );
    connect(&url)
        .await
        .batch_execute("insert into ledger values (-1)")
        .await
        .expect("writes after the restart");
}

/// A data directory as the retired supervisor engine left it — `state.json` with a failover
/// recorded and the former primary still to be rewound, no store — resumes on the agents with
/// the same primary, the former one rewound and every row. Such a directory is made here by
/// the agents themselves, whose `state.json` projections are in the old engine's format: the
/// cluster is killed as soon as its projection records the failover, and its store removed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn migrate_from_state_json() {
    let c = cluster();
    up(&c, &["--replicas", "2"]);
    let url = c.url(&[]);
    connect(&url)
        .await
        .batch_execute(
            "create table ledger (id bigint primary key); \
             insert into ledger select generate_series(1, 1000)",
        )
        .await
        .expect("writing through the old engine");
    let (first, pid, _) = wait_until(Duration::from_secs(30), "the old engine's cluster", || {
        topology(&c).filter(|t| t.2 == 2)
    });
    let supervisor = c.status()["supervisor"]["pid"]
        .as_i64()
        .expect("supervisor pid") as i32;
    // Kill the primary, then `herd up` as soon as state.json records the failover, usually
    // before the former primary was rewound: state.json then names it in needs_rewind (and the
    // recorded primary may not even be promoted yet: the next start promotes it, on a new
    // timeline).
    kill(Pid::from_raw(pid), Signal::SIGKILL).expect("kill -9 of the primary");
    let state_path = c.data_dir().join("state.json");
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    let mut state = loop {
        let text = std::fs::read_to_string(&state_path).unwrap_or_default();
        if let Ok(state) = serde_json::from_str::<serde_json::Value>(&text) {
            if state["primary"].as_str().is_some_and(|p| p != first) {
                kill(Pid::from_raw(supervisor), Signal::SIGKILL).expect("kill -9 of herd up");
                break state;
            }
        }
        assert!(
            std::time::Instant::now() < deadline,
            "state.json never recorded a failover: {text}"
        );
        std::thread::sleep(Duration::from_millis(1));
    };
    let second = state["primary"].as_str().expect("primary").to_string();
    assert_ne!(second, first);
    // Its servers stop as they are (no `herd up`: `herd down` stops them itself), and the
    // store goes: what is left is the old engine's directory.
    c.herd_ok(&["down"]);
    std::fs::remove_file(c.data_dir().join("store.json")).expect("removing the store");
    // The old engine recorded the former primary to rewind with the failover itself. The
    // agents' projection is written on a leader or sync change, so on a loaded machine the
    // former primary may have rejoined before the projection named the new leader (CI saw
    // it): name it as the old engine would have (a rewind onto the same timeline then has
    // nothing to do).
    if state["needs_rewind"]
        .as_array()
        .is_none_or(|a| a.is_empty())
    {
        state["needs_rewind"] = serde_json::json!([first.clone()]);
        std::fs::write(
            &state_path,
            serde_json::to_vec_pretty(&state).expect("json"),
        )
        .expect("state.json as the old engine wrote it");
    }

    up(&c, &[]);
    let log =
        std::fs::read_to_string(c.data_dir().join("logs").join("herd.log")).unwrap_or_default();
    assert!(log.contains("imported state.json"), "{log}");
    let (resumed, _, _) = wait_until(
        Duration::from_secs(60),
        "every replica streaming again",
        || topology(&c).filter(|t| t.2 == 2),
    );
    assert_eq!(resumed, second, "the primary recorded in state.json leads");
    let status = c.status();
    let former = status["nodes"]
        .as_array()
        .expect("nodes")
        .iter()
        .find(|n| n["name"] == first.as_str())
        .expect("the former primary");
    assert_eq!(
        (former["role"].as_str(), former["state"].as_str()),
        (Some("replica"), Some("streaming")),
        "{status}"
    );
    assert!(
        !c.data_dir()
            .join("nodes")
            .join(&first)
            .with_extension("failed")
            .exists(),
        "the former primary was cloned afresh instead of rewound"
    );
    let rows = stored(&c.url(&[])).await;
    assert!(
        (1..=1000).all(|i| rows.contains(&i)),
        "rows lost in the migration"
    );
    connect(&c.url(&[]))
        .await
        .batch_execute("insert into ledger values (-1)")
        .await
        .expect("writes on the agent engine");
    // The retired engine is refused, saying so.
    c.herd_ok(&["down"]);
    let port = c.port.to_string();
    let out = c.herd_with_env(&["up", "--detach", "--port", &port], &[OLD_ENGINE]);
    assert!(!out.status.success(), "{}", describe(&out));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("the supervisor engine was retired"),
        "{}",
        describe(&out)
    );
    // An engine that does not exist is refused, naming the two that do.
    let out = c.herd_with_env(
        &["up", "--detach", "--port", &port],
        &[("HERD_ENGINE", "agent")],
    );
    assert!(!out.status.success(), "{}", describe(&out));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("is not an engine"),
        "{}",
        describe(&out)
    );
}
