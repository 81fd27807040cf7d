//! Several hosts, modelled on loopback: a 3-member etcd cluster, three `herd agent`s (each its
//! own PostgreSQL) and a `herd proxy`. A checker writes through the proxy and records every
//! acknowledged write, and probes every node every 100 ms for whether it accepts writes.
//! Faults: kill -9 of the primary's agent and server; SIGSTOP of the primary's agent for longer
//! than the lease TTL (its watchdog must fence the server before another member takes over).
//! Checks: every acknowledged write is present afterwards, no probe instant saw two writable
//! nodes, the cluster is whole again after each fault. Bad starts fail clearly.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use herd_testkit::etcd::EtcdCluster;
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;

const HERD: &str = env!("CARGO_BIN_EXE_herd");
/// Short timings so the suite stays quick; the defaults are exercised by `herd bench`.
const TTL_MS: u64 = 4000;

struct Hosts {
    etcd: EtcdCluster,
    dir: tempfile::TempDir,
    base: u16,
    agents: Vec<Option<Child>>,
    proxy: Option<Child>,
    cluster: String,
}

impl Hosts {
    fn start() -> Hosts {
        let etcd = EtcdCluster::start(3);
        let base = herd_testkit::free_port_block(10);
        let mut hosts = Hosts {
            etcd,
            dir: herd_testkit::scratch_dir(),
            base,
            agents: vec![None, None, None],
            proxy: None,
            cluster: format!("t{base}"),
        };
        hosts.start_agent(0);
        hosts.wait_role(0, "primary", Duration::from_secs(60));
        for i in 1..3 {
            copy_dir(
                &hosts.agent_dir(0).join("secrets"),
                &hosts.agent_dir(i).join("secrets"),
            );
            hosts.start_agent(i);
        }
        copy_dir(
            &hosts.agent_dir(0).join("secrets"),
            &hosts.dir.path().join("proxy/secrets"),
        );
        for i in 1..3 {
            hosts.wait_role(i, "replica", Duration::from_secs(60));
        }
        hosts.start_proxy();
        let port = hosts.proxy_port();
        herd_testkit::wait_until(Duration::from_secs(30), "herd proxy to listen", || {
            std::net::TcpStream::connect(("127.0.0.1", port))
                .ok()
                .map(drop)
        });
        hosts
    }

    fn dcs(&self) -> String {
        let hosts: Vec<String> = self
            .etcd
            .endpoints()
            .iter()
            .map(|e| e.trim_start_matches("http://").to_string())
            .collect();
        format!("etcd://{}", hosts.join(","))
    }

    fn name(i: usize) -> String {
        format!("h{i}")
    }

    fn agent_dir(&self, i: usize) -> PathBuf {
        self.dir.path().join(Self::name(i))
    }

    fn pg_port(&self, i: usize) -> u16 {
        self.base + i as u16
    }

    fn api(&self, i: usize) -> String {
        format!("127.0.0.1:{}", self.base + 4 + i as u16)
    }

    fn proxy_port(&self) -> u16 {
        self.base + 8
    }

    fn agent_command(&self, i: usize) -> Command {
        self.agent_command_as(
            &Self::name(i),
            &self.agent_dir(i),
            self.pg_port(i),
            &self.api(i),
        )
    }

    fn agent_command_as(&self, name: &str, dir: &Path, pg_port: u16, api: &str) -> Command {
        let mut cmd = Command::new(HERD);
        cmd.args(["agent", "--dcs", &self.dcs(), "--cluster", &self.cluster])
            .args(["--name", name])
            .arg("--data-dir")
            .arg(dir)
            .args(["--pg-port", &pg_port.to_string()])
            .args(["--api-listen", api])
            .args(["--ttl-ms", &TTL_MS.to_string()])
            .args(["--loop-wait-ms", "500", "--safety-margin-ms", "1500"])
            .env("HERD_LOG", "info")
            .stdin(Stdio::null());
        cmd
    }

    fn start_agent(&mut self, i: usize) {
        std::fs::create_dir_all(self.agent_dir(i)).expect("agent dir");
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.path().join(format!("{}.log", Self::name(i))))
            .expect("agent log");
        let child = self
            .agent_command(i)
            .stdout(log.try_clone().expect("log"))
            .stderr(log)
            .spawn()
            .expect("starting herd agent");
        self.agents[i] = Some(child);
    }

    fn start_proxy(&mut self) {
        let log = std::fs::File::create(self.dir.path().join("proxy.log")).expect("proxy log");
        let child = Command::new(HERD)
            .args(["proxy", "--dcs", &self.dcs(), "--cluster", &self.cluster])
            .args(["--listen", &format!("127.0.0.1:{}", self.proxy_port())])
            .arg("--data-dir")
            .arg(self.dir.path().join("proxy"))
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("log"))
            .stderr(log)
            .spawn()
            .expect("starting herd proxy");
        self.proxy = Some(child);
    }

    /// Runs `herd ARGS --dcs … --cluster …` and returns its standard output (it must succeed).
    fn herd_store(&self, args: &[&str]) -> String {
        let mut cmd = Command::new(HERD);
        cmd.args(args)
            .args(["--dcs", &self.dcs(), "--cluster", &self.cluster]);
        let out =
            herd_testkit::output_within(&mut cmd, Duration::from_secs(90)).expect("herd exits");
        assert!(
            out.status.success(),
            "herd {args:?}: {}",
            herd_testkit::describe(&out)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    fn password(&self) -> String {
        std::fs::read_to_string(self.agent_dir(0).join("secrets/superuser.password"))
            .expect("password")
            .trim()
            .to_string()
    }

    fn url(&self, port: u16) -> String {
        format!(
            "postgresql://postgres:{}@127.0.0.1:{port}/postgres?connect_timeout=2",
            self.password()
        )
    }

    /// The member record agent `i` serves, if it answers.
    fn member(&self, i: usize) -> Option<serde_json::Value> {
        let r = ureq::get(&format!("http://{}/member", self.api(i)))
            .timeout(Duration::from_secs(2))
            .call()
            .ok()?;
        r.into_json().ok()
    }

    fn role(&self, i: usize) -> Option<String> {
        self.member(i)
            .and_then(|m| m["role"].as_str().map(str::to_string))
    }

    fn wait_role(&self, i: usize, role: &str, timeout: Duration) {
        let what = format!("{} to be {role}; logs:\n{}", Self::name(i), self.logs());
        herd_testkit::wait_until(timeout, &what, || {
            (self.role(i).as_deref() == Some(role)).then_some(())
        });
    }

    fn primary(&self) -> Option<usize> {
        (0..3).find(|&i| self.role(i).as_deref() == Some("primary"))
    }

    fn logs(&self) -> String {
        let mut out = String::new();
        for name in ["h0", "h1", "h2", "proxy"] {
            let text = std::fs::read_to_string(self.dir.path().join(format!("{name}.log")))
                .unwrap_or_default();
            let lines: Vec<&str> = text.lines().collect();
            out.push_str(&format!(
                "--- {name}\n{}\n",
                lines[lines.len().saturating_sub(15)..].join("\n")
            ));
        }
        out
    }

    fn signal_agent(&self, i: usize, sig: Signal) {
        let pid = self.agents[i].as_ref().expect("agent running").id();
        kill(Pid::from_raw(pid as i32), sig).expect("signal");
    }

    fn postmaster(&self, i: usize) -> Option<i32> {
        let text = std::fs::read_to_string(self.agent_dir(i).join("pgdata/postmaster.pid")).ok()?;
        text.lines().next()?.trim().parse().ok()
    }
}

impl Drop for Hosts {
    fn drop(&mut self) {
        if let Some(mut p) = self.proxy.take() {
            let _ = p.kill();
            let _ = p.wait();
        }
        for i in 0..3 {
            if let Some(mut a) = self.agents[i].take() {
                let _ = kill(Pid::from_raw(a.id() as i32), Signal::SIGCONT);
                let _ = kill(Pid::from_raw(a.id() as i32), Signal::SIGTERM);
                let deadline = Instant::now() + Duration::from_secs(20);
                while a.try_wait().ok().flatten().is_none() && Instant::now() < deadline {
                    std::thread::sleep(Duration::from_millis(100));
                }
                let _ = a.kill();
                let _ = a.wait();
            }
            let _ = herd_pg::kill_server(&self.agent_dir(i).join("pgdata"));
        }
    }
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).expect("mkdir");
    for entry in std::fs::read_dir(from).expect("read dir") {
        let entry = entry.expect("entry");
        std::fs::copy(entry.path(), to.join(entry.file_name())).expect("copy");
    }
}

/// What the checker saw.
#[derive(Default)]
struct Record {
    acknowledged: Vec<i64>,
    two_writable: Vec<String>,
}

/// Writes through the proxy and probes every node until `stop`.
fn checker(
    hosts: &Hosts,
    stop: Arc<AtomicBool>,
) -> (Arc<Mutex<Record>>, Vec<std::thread::JoinHandle<()>>) {
    let record = Arc::new(Mutex::new(Record::default()));
    let mut threads = Vec::new();
    let next = Arc::new(AtomicI64::new(1));
    {
        let (url, stop, record, next) = (
            hosts.url(hosts.proxy_port()),
            stop.clone(),
            record.clone(),
            next,
        );
        threads.push(std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("rt");
            rt.block_on(async move {
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
                    let write = c.execute("insert into acked values ($1)", &params);
                    match tokio::time::timeout(Duration::from_secs(10), write).await {
                        Ok(Ok(_)) => record.lock().expect("record").acknowledged.push(id),
                        // Failed or in doubt: not counted as acknowledged.
                        _ => client = None,
                    }
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
            });
        }));
    }
    let urls: Vec<String> = (0..3).map(|i| hosts.url(hosts.pg_port(i))).collect();
    let probes = record.clone();
    threads.push(std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("rt");
        rt.block_on(async move {
            let mut clients: Vec<Option<tokio_postgres::Client>> = vec![None, None, None];
            while !stop.load(Ordering::SeqCst) {
                let instant = Instant::now();
                let mut writable = Vec::new();
                for (i, url) in urls.iter().enumerate() {
                    if clients[i].is_none() {
                        clients[i] = common::try_connect(url).await;
                    }
                    let Some(c) = &clients[i] else { continue };
                    let probe = c.query_one("select not pg_is_in_recovery()", &[]);
                    match tokio::time::timeout(Duration::from_millis(500), probe).await {
                        Ok(Ok(row)) if row.get::<_, bool>(0) => writable.push(i),
                        Ok(Ok(_)) => {}
                        _ => clients[i] = None,
                    }
                }
                if writable.len() > 1 {
                    probes
                        .lock()
                        .expect("record")
                        .two_writable
                        .push(format!("{writable:?} at {:?}", instant.elapsed()));
                }
                tokio::time::sleep(Duration::from_millis(100).saturating_sub(instant.elapsed()))
                    .await;
            }
        });
    }));
    (record, threads)
}

async fn acknowledged_present(hosts: &Hosts, acknowledged: &[i64]) {
    let client = common::connect(&hosts.url(hosts.proxy_port())).await;
    let rows = client
        .query("select id from acked", &[])
        .await
        .expect("read back");
    let present: std::collections::HashSet<i64> = rows.iter().map(|r| r.get(0)).collect();
    let lost: Vec<&i64> = acknowledged
        .iter()
        .filter(|id| !present.contains(id))
        .collect();
    assert!(
        lost.is_empty(),
        "acknowledged writes lost: {lost:?}\n{}",
        hosts.logs()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn agents_fail_over_fence_and_rejoin_without_losing_writes() {
    let mut hosts = Hosts::start();
    let client = common::connect(&hosts.url(hosts.proxy_port())).await;
    client
        .batch_execute("create table acked (id bigint primary key)")
        .await
        .expect("create through the proxy");
    drop(client);
    let stop = Arc::new(AtomicBool::new(false));
    let (record, threads) = checker(&hosts, stop.clone());
    let acked = || record.lock().expect("record").acknowledged.len();
    herd_testkit::wait_until(Duration::from_secs(30), "first writes", || {
        (acked() > 20).then_some(())
    });

    // 1. kill -9 of the primary's agent and its PostgreSQL: another member takes over.
    let old = hosts.primary().expect("a primary");
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
        "kill -9: writes resumed {:.1} s after the kill",
        killed_at.elapsed().as_secs_f64()
    );
    // The old member comes back as a replica (pg_rewind).
    hosts.start_agent(old);
    hosts.wait_role(old, "replica", Duration::from_secs(90));

    // 2. SIGSTOP of the primary's agent for longer than the TTL: the watchdog fences its
    //    server before the lease can expire; another member takes over.
    let frozen = hosts.primary().expect("a primary");
    let port = hosts.pg_port(frozen);
    hosts.signal_agent(frozen, Signal::SIGSTOP);
    let stopped_at = Instant::now();
    // Fenced: the server no longer takes connections (its postmaster is gone; a killed
    // postmaster may linger as a zombie until PID 1 reaps it, so its pid proves nothing).
    herd_testkit::wait_until(
        Duration::from_secs(30),
        "the watchdog to fence the frozen primary",
        || {
            std::net::TcpStream::connect(("127.0.0.1", port))
                .is_err()
                .then_some(())
        },
    );
    let fenced_after = stopped_at.elapsed();
    eprintln!(
        "SIGSTOP: the watchdog fenced the primary {:.1} s after its agent froze",
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
    let before = acked();
    herd_testkit::wait_until(
        Duration::from_secs(60),
        "writes after the second failover",
        || (acked() > before + 10).then_some(()),
    );
    hosts.signal_agent(frozen, Signal::SIGCONT);
    hosts.wait_role(frozen, "replica", Duration::from_secs(90));

    // 3. Operator commands through the store, while writes go on: a planned switchover to a
    //    named replica, a commit mode change, the status.
    let leader = hosts.primary().expect("a primary");
    let target = (0..3).find(|&i| i != leader).expect("a replica");
    let out = hosts.herd_store(&["switchover", "--to", &Hosts::name(target)]);
    assert!(
        out.contains(&format!("switchover to {} done", Hosts::name(target))),
        "{out}"
    );
    hosts.wait_role(target, "primary", Duration::from_secs(30));
    hosts.wait_role(leader, "replica", Duration::from_secs(90));
    let out = hosts.herd_store(&["config", "set", "commit-mode", "remote_apply"]);
    assert!(out.contains("recorded"), "{out}");
    let direct = common::connect(&hosts.url(hosts.pg_port(target))).await;
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
    let status: serde_json::Value =
        serde_json::from_str(&hosts.herd_store(&["status", "--json"])).expect("status json");
    assert_eq!(status["leader"], Hosts::name(target).as_str(), "{status}");
    assert_eq!(
        status["members"].as_array().map(Vec::len),
        Some(3),
        "{status}"
    );
    let before = acked();
    let deadline = Instant::now() + Duration::from_secs(60);
    while acked() <= before + 10 {
        assert!(
            Instant::now() < deadline,
            "no writes after the switchover; status:\n{}\n{}",
            hosts.herd_store(&["status"]),
            hosts.logs()
        );
        std::thread::sleep(Duration::from_millis(100));
    }

    stop.store(true, Ordering::SeqCst);
    for t in threads {
        t.join().expect("checker thread");
    }
    let record = std::mem::take(&mut *record.lock().expect("record"));
    assert!(
        record.two_writable.is_empty(),
        "two nodes accepted writes at once: {:?}\n{}",
        record.two_writable,
        hosts.logs()
    );
    acknowledged_present(&hosts, &record.acknowledged).await;
    eprintln!(
        "{} acknowledged writes, all present",
        record.acknowledged.len()
    );
}

#[test]
fn bad_starts_fail_clearly() {
    let hosts = Hosts::start();
    // A second agent under a name that is in use elsewhere.
    let dup = hosts.dir.path().join("dup");
    std::fs::create_dir_all(&dup).expect("dir");
    copy_dir(&hosts.agent_dir(0).join("secrets"), &dup.join("secrets"));
    let mut cmd = hosts.agent_command_as("h1", &dup, hosts.base + 9, "127.0.0.1:0");
    let out = herd_testkit::output_within(&mut cmd, Duration::from_secs(60)).expect("exits");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(err.contains("another agent named h1 is running"), "{err}");

    // A new host without the cluster's secrets.
    let fresh = hosts.dir.path().join("fresh");
    let mut cmd = hosts.agent_command_as("h9", &fresh, hosts.base + 9, "127.0.0.1:0");
    let out = herd_testkit::output_within(&mut cmd, Duration::from_secs(60)).expect("exits");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(err.contains("copy the secrets directory"), "{err}");

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
