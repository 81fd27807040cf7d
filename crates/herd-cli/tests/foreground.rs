//! The foreground supervisor: servers outlive a killed supervisor and are adopted by the next
//! `herd up`; SIGTERM stops everything cleanly.

mod common;

use std::process::{Child, Command, Stdio};
use std::time::Duration;

use common::{cluster, connect, count};
use herd_testkit::{wait_until, TestCluster};
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;

fn spawn_foreground(c: &TestCluster) -> Child {
    let log = std::fs::File::create(c.data_dir().with_extension("fg.log")).expect("log file");
    Command::new(env!("CARGO_BIN_EXE_herd"))
        .args(["up", "--port", &c.port.to_string(), "--data-dir"])
        .arg(c.data_dir())
        .stdin(Stdio::null())
        .stdout(log.try_clone().expect("clone"))
        .stderr(log)
        .spawn()
        .expect("spawn herd up")
}

/// Waits until `child` is the ready supervisor; returns the node pids.
fn wait_ready(c: &TestCluster, child: &mut Child) -> Vec<u64> {
    wait_until(
        Duration::from_secs(120),
        "the foreground supervisor to be ready",
        || {
            if let Ok(Some(status)) = child.try_wait() {
                let log = std::fs::read_to_string(c.data_dir().with_extension("fg.log"))
                    .unwrap_or_default();
                panic!("herd up exited early ({status}):\n{log}");
            }
            let s = c.try_status()?;
            let ready = s["supervisor"]["pid"].as_u64() == Some(u64::from(child.id()))
                && s["nodes"]
                    .as_array()?
                    .iter()
                    .all(|n| n["state"] == "running" || n["state"] == "streaming");
            ready.then(|| {
                s["nodes"]
                    .as_array()
                    .map(|n| n.iter().filter_map(|n| n["pid"].as_u64()).collect())
            })?
        },
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_supervisor_is_adopted_and_sigterm_stops_cleanly() {
    let c = cluster();
    std::fs::create_dir_all(c.data_dir().parent().expect("parent")).expect("mkdir");
    let mut first = spawn_foreground(&c);
    let pids = wait_ready(&c, &mut first);
    assert_eq!(pids.len(), 3);

    // The supervisor dies; PostgreSQL keeps serving.
    first.kill().expect("SIGKILL supervisor");
    first.wait().expect("reap");
    let primary = connect(&c.url(&["--primary"])).await;
    primary
        .batch_execute("create table kept(i int); insert into kept values (1)")
        .await
        .expect("write without a supervisor");
    drop(primary);

    // The next `herd up` adopts the running servers instead of starting new ones.
    let mut second = spawn_foreground(&c);
    let adopted = wait_ready(&c, &mut second);
    assert_eq!(adopted, pids, "servers must be adopted, not restarted");

    // SIGTERM: clean shutdown of everything, exit status 0.
    kill(Pid::from_raw(second.id() as i32), Signal::SIGTERM).expect("SIGTERM");
    let status = wait_until(Duration::from_secs(120), "the supervisor to exit", || {
        second.try_wait().ok().flatten()
    });
    assert!(status.success(), "herd up exited with {status}");
    let s = c.status();
    for n in s["nodes"].as_array().expect("nodes") {
        assert_eq!(n["state"], "stopped", "{n}");
    }
    // A clean shutdown leaves no crash recovery to do; the data is there after `up`.
    let control = std::process::Command::new("/usr/lib/postgresql/15/bin/pg_controldata")
        .arg(c.data_dir().join("nodes/node0"))
        .output()
        .expect("pg_controldata");
    assert!(
        String::from_utf8_lossy(&control.stdout).contains("shut down"),
        "{}",
        String::from_utf8_lossy(&control.stdout)
    );
    c.up(&[]);
    let primary = connect(&c.url(&["--primary"])).await;
    assert_eq!(count(&primary, "kept").await, Some(1));
}
