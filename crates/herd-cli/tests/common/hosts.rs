//! Several "hosts" for the multi-host tests: a 3-member etcd cluster, three `herd agent`s
//! (each its own PostgreSQL) and a `herd proxy` — on loopback, or each host in its own network
//! namespace ([`herd_testkit::netns::Lab`]) so links can be cut. A checker writes through the
//! proxy, records every acknowledged write, and probes every node every 100 ms (from inside
//! its host) for whether it accepts writes.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use herd_testkit::etcd::{EtcdCluster, Placement};
use herd_testkit::netns::{Lab, Link};
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;

pub const HERD: &str = env!("CARGO_BIN_EXE_herd");
/// Short timings so the suite stays quick (TTL 6 s, margin 2 s: a failsafe confirmation, which
/// takes a store timeout of 1 s plus a live check, covers 4 s).
pub const TTL_MS: u64 = 6000;

/// How many times each fault is injected: `HERD_TEST_FAULT_ROUNDS`, else `default`.
pub fn fault_rounds(default: u32) -> u32 {
    std::env::var("HERD_TEST_FAULT_ROUNDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
        .max(1)
}

pub struct Hosts {
    pub etcd: EtcdCluster,
    pub dir: tempfile::TempDir,
    pub base: u16,
    pub agents: Vec<Option<Child>>,
    pub proxy: Option<Child>,
    pub cluster: String,
    /// Per host: a clock offset for libfaketime (`faketime -f OFFSET`, e.g. `+1h`) its agent
    /// (and so its watchdog and PostgreSQL) runs under from its next start.
    pub clock: Vec<Option<String>>,
    /// A herd.toml every agent reads its `[postgres]` settings from (`--config`).
    pub agent_config: Option<PathBuf>,
    /// The namespaces, when each host has its own (dropped last).
    pub lab: Option<Lab>,
}

impl Hosts {
    /// Three hosts on loopback.
    pub fn start() -> Hosts {
        Self::start_with(None, None)
    }

    /// Three hosts on loopback whose agents read `herd_toml` (`herd agent --config`).
    pub fn start_configured(herd_toml: &str) -> Hosts {
        Self::start_with(None, Some(herd_toml))
    }

    /// Three hosts, each in its own network namespace of `lab`.
    pub fn start_in(lab: Lab) -> Hosts {
        Self::start_with(Some(lab), None)
    }

    /// Three hosts, each in its own network namespace of `lab`, whose agents read `herd_toml`
    /// (`@DIR@` in it: the test's directory, which every namespace sees).
    pub fn start_in_configured(lab: Lab, herd_toml: &str) -> Hosts {
        Self::start_with(Some(lab), Some(herd_toml))
    }

    fn start_with(lab: Option<Lab>, herd_toml: Option<&str>) -> Hosts {
        let mut hosts = Self::prepare(lab, herd_toml);
        hosts.start_members();
        hosts.start_proxy();
        hosts.wait_proxy_listening();
        hosts
    }

    /// The etcd cluster and the directories, with no agent nor proxy running yet.
    pub fn prepare(lab: Option<Lab>, herd_toml: Option<&str>) -> Hosts {
        let placements: Vec<Placement> = (0..3)
            .map(|i| match &lab {
                Some(lab) => Placement {
                    ip: lab.host_ip(i, Link::Store),
                    netns: Some(lab.netns(i)),
                },
                None => Placement {
                    ip: "127.0.0.1".into(),
                    netns: None,
                },
            })
            .collect();
        let etcd = EtcdCluster::start_on(&placements);
        let base = herd_testkit::free_port_block(10);
        let dir = herd_testkit::scratch_dir();
        let agent_config = herd_toml.map(|text| {
            let path = dir.path().join("agent.toml");
            let text = text.replace("@DIR@", &dir.path().display().to_string());
            std::fs::write(&path, text).expect("agent.toml");
            path
        });
        Hosts {
            etcd,
            dir,
            base,
            agents: vec![None, None, None],
            proxy: None,
            cluster: format!("t{base}"),
            clock: vec![None, None, None],
            agent_config,
            lab,
        }
    }

    /// Starts the first agent (it creates the cluster), then the others with its secrets
    /// (also copied for the proxy), and waits until they replicate.
    pub fn start_members(&mut self) {
        self.start_agent(0);
        self.wait_role(0, "primary", Duration::from_secs(60));
        for i in 1..3 {
            copy_dir(
                &self.agent_dir(0).join("secrets"),
                &self.agent_dir(i).join("secrets"),
            );
            self.start_agent(i);
        }
        copy_dir(
            &self.agent_dir(0).join("secrets"),
            &self.dir.path().join("proxy/secrets"),
        );
        for i in 1..3 {
            self.wait_role(i, "replica", Duration::from_secs(60));
        }
    }

    /// Waits (30 s at most) until the proxy accepts TCP connections.
    pub fn wait_proxy_listening(&self) {
        let port = self.proxy_port();
        herd_testkit::wait_until(Duration::from_secs(30), "herd proxy to listen", || {
            std::net::TcpStream::connect(("127.0.0.1", port))
                .ok()
                .map(drop)
        });
    }

    pub fn dcs(&self) -> String {
        etcd_url(&self.etcd)
    }

    pub fn name(i: usize) -> String {
        format!("h{i}")
    }

    pub fn agent_dir(&self, i: usize) -> PathBuf {
        self.dir.path().join(Self::name(i))
    }

    /// The address of host `i`'s PostgreSQL and agent API.
    pub fn pg_host(&self, i: usize) -> String {
        match &self.lab {
            Some(lab) => lab.host_ip(i, Link::Database),
            None => "127.0.0.1".into(),
        }
    }

    pub fn pg_port(&self, i: usize) -> u16 {
        self.base + i as u16
    }

    pub fn api(&self, i: usize) -> String {
        format!("{}:{}", self.pg_host(i), self.base + 4 + i as u16)
    }

    pub fn proxy_port(&self) -> u16 {
        self.base + 8
    }

    pub fn agent_command(&self, i: usize) -> Command {
        self.agent_command_as(
            i,
            &Self::name(i),
            &self.agent_dir(i),
            self.pg_port(i),
            &self.api(i),
        )
    }

    /// `herd agent` on host `host` under `name`.
    pub fn agent_command_as(
        &self,
        host: usize,
        name: &str,
        dir: &Path,
        pg_port: u16,
        api: &str,
    ) -> Command {
        let mut cmd = match &self.lab {
            Some(lab) => {
                // All addresses of its namespace (the probes come in over its loopback), and
                // the database network's address for everyone else.
                let mut c = lab.command(host, Path::new(HERD));
                c.args([
                    "agent",
                    "--pg-listen",
                    "0.0.0.0",
                    "--pg-advertise",
                    &self.pg_host(host),
                ]);
                c
            }
            None => match &self.clock[host] {
                Some(offset) => {
                    // libfaketime preloaded into the agent itself (the `faketime` wrapper would
                    // fork, and signals meant for the agent would reach the wrapper), inherited
                    // by its watchdog and PostgreSQL. The wall clock only, as between real
                    // hosts: each host's monotonic clock is its own anyway.
                    let mut c = Command::new(HERD);
                    c.arg("agent")
                        .env("LD_PRELOAD", libfaketime())
                        .env("FAKETIME", offset)
                        .env("FAKETIME_DONT_FAKE_MONOTONIC", "1");
                    c
                }
                None => {
                    let mut c = Command::new(HERD);
                    c.arg("agent");
                    c
                }
            },
        };
        cmd.args(["--dcs", &self.dcs(), "--cluster", &self.cluster])
            .args(["--name", name])
            .arg("--data-dir")
            .arg(dir)
            .args(["--pg-port", &pg_port.to_string()])
            .args(["--api-listen", api])
            .args(["--ttl-ms", &TTL_MS.to_string()])
            .args(["--loop-wait-ms", "500", "--safety-margin-ms", "2000"])
            // A store call must fail well within the lease's slack for failsafe to be asked.
            .args(["--etcd-timeout-ms", "1000"])
            .env(
                "HERD_LOG",
                std::env::var("HERD_TEST_AGENT_LOG").unwrap_or_else(|_| "info".into()),
            )
            .stdin(Stdio::null());
        if let Some(path) = &self.agent_config {
            cmd.arg("--config").arg(path);
        }
        cmd
    }

    pub fn start_agent(&mut self, i: usize) {
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

    pub fn start_proxy(&mut self) {
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
    pub fn herd_store(&self, args: &[&str]) -> String {
        herd_with_store(&self.dcs(), &self.cluster, args)
    }

    pub fn password(&self) -> String {
        std::fs::read_to_string(self.agent_dir(0).join("secrets/superuser.password"))
            .expect("password")
            .trim()
            .to_string()
    }

    /// The proxy's URL.
    pub fn proxy_url(&self) -> String {
        self.url_at("127.0.0.1", self.proxy_port())
    }

    /// Host `i`'s PostgreSQL, directly.
    pub fn node_url(&self, i: usize) -> String {
        self.url_at(&self.pg_host(i), self.pg_port(i))
    }

    fn url_at(&self, host: &str, port: u16) -> String {
        format!(
            "postgresql://postgres:{}@{host}:{port}/postgres?connect_timeout=2",
            self.password()
        )
    }

    /// The member record agent `i` serves, if it answers.
    pub fn member(&self, i: usize) -> Option<serde_json::Value> {
        herd_testkit::agents::member(
            &self.api(i),
            std::fs::read_to_string(self.agent_dir(0).join("secrets/superuser.password"))
                .ok()?
                .trim(),
        )
    }

    pub fn role(&self, i: usize) -> Option<String> {
        self.member(i)
            .and_then(|m| m["role"].as_str().map(str::to_string))
    }

    pub fn wait_role(&self, i: usize, role: &str, timeout: Duration) {
        let deadline = Instant::now() + timeout;
        while self.role(i).as_deref() != Some(role) {
            // The logs as they are when the wait fails, not when it began.
            assert!(
                Instant::now() < deadline,
                "timed out after {timeout:?} waiting for {} to be {role} (it is {:?}); logs:\n{}",
                Self::name(i),
                self.role(i),
                self.logs()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Waits (60 s at most) until more than 10 further writes were acknowledged.
    pub fn wait_writes(&self, acked: &dyn Fn() -> usize, what: &str) {
        let before = acked();
        let deadline = Instant::now() + Duration::from_secs(60);
        while acked() <= before + 10 {
            assert!(
                Instant::now() < deadline,
                "no writes {what}; status:\n{}\n{}",
                self.herd_store(&["status"]),
                self.logs()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    pub fn primary(&self) -> Option<usize> {
        (0..3).find(|&i| self.role(i).as_deref() == Some("primary"))
    }

    /// The host that is primary, waiting (60 s at most) while none says so: an agent whose API
    /// is slow to answer for a moment reports no role, which is not a cluster without primary.
    pub fn wait_primary(&self, what: &str) -> usize {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            if let Some(p) = self.primary() {
                return p;
            }
            assert!(
                Instant::now() < deadline,
                "no primary {what} after 60 s; logs:\n{}",
                self.logs()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    pub fn logs(&self) -> String {
        let lines = if std::env::var_os("HERD_TEST_VERBOSE").is_some() {
            400
        } else {
            40
        };
        herd_testkit::agents::log_tails(self.dir.path(), &["h0", "h1", "h2", "proxy"], lines)
    }

    pub fn signal_agent(&self, i: usize, sig: Signal) {
        let pid = self.agents[i].as_ref().expect("agent running").id();
        kill(Pid::from_raw(pid as i32), sig).expect("signal");
    }

    pub fn postmaster(&self, i: usize) -> Option<i32> {
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

/// The `--dcs` URL of `etcd`'s members.
pub fn etcd_url(etcd: &EtcdCluster) -> String {
    let hosts: Vec<String> = etcd
        .endpoints()
        .iter()
        .map(|e| e.trim_start_matches("http://").to_string())
        .collect();
    format!("etcd://{}", hosts.join(","))
}

/// Runs `herd ARGS --dcs DCS --cluster CLUSTER` (90 s at most) and returns its standard
/// output; it must succeed.
pub fn herd_with_store(dcs: &str, cluster: &str, args: &[&str]) -> String {
    let mut cmd = Command::new(HERD);
    cmd.args(args).args(["--dcs", dcs, "--cluster", cluster]);
    let out = herd_testkit::output_within(&mut cmd, Duration::from_secs(90)).expect("herd exits");
    assert!(
        out.status.success(),
        "herd {args:?}: {}",
        herd_testkit::describe(&out)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// libfaketime's thread-safe library (Debian's `faketime` package), for the clock-skew test.
pub fn libfaketime() -> PathBuf {
    let found = std::fs::read_dir("/usr/lib")
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.path().join("faketime/libfaketimeMT.so.1"))
        .find(|p| p.exists());
    found.unwrap_or_else(|| {
        panic!("libfaketime is not installed: run scripts/install-deps (Debian's faketime)")
    })
}

pub fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).expect("mkdir");
    for entry in std::fs::read_dir(from).expect("read dir") {
        let entry = entry.expect("entry");
        std::fs::copy(entry.path(), to.join(entry.file_name())).expect("copy");
    }
}

/// What the checker saw.
#[derive(Default)]
pub struct Record {
    pub acknowledged: Vec<i64>,
    pub two_writable: Vec<String>,
    /// What each failed write was told ("timed out" when the checker gave up on it).
    pub write_errors: Vec<String>,
}

/// A runtime for the calling thread, which first moves into network namespace `netns` (only
/// this thread: its sockets then live inside that host).
pub fn thread_runtime(netns: Option<&str>) -> tokio::runtime::Runtime {
    if let Some(ns) = netns {
        herd_testkit::netns::enter(ns).expect("entering the host's namespace");
    }
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime")
}

/// Stops the checker and asserts what every multi-host test asserts at its end: no two nodes
/// ever accepted writes at once, and every acknowledged write is present.
pub async fn finish(
    hosts: &Hosts,
    stop: &AtomicBool,
    threads: Vec<std::thread::JoinHandle<()>>,
    record: &Mutex<Record>,
) {
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
    acknowledged_present(hosts, &record.acknowledged).await;
    eprintln!(
        "{} acknowledged writes, all present",
        record.acknowledged.len()
    );
}

/// When a node was last probed, and whether it accepted writes then.
type Probe = (Instant, bool);

/// Creates the checker's table through the proxy and starts the checker: the stop flag, its
/// record, its threads.
pub async fn start_checker(
    hosts: &Hosts,
) -> (
    Arc<AtomicBool>,
    Arc<Mutex<Record>>,
    Vec<std::thread::JoinHandle<()>>,
) {
    // The proxy listens before it has followed the first leader from the store: until then it
    // refuses logins with 57P03 ("retry in a few seconds"), which a loaded machine can stretch.
    let deadline = Instant::now() + Duration::from_secs(60);
    let client = loop {
        match tokio_postgres::connect(&hosts.proxy_url(), tokio_postgres::NoTls).await {
            Ok((client, conn)) => {
                tokio::spawn(conn);
                break client;
            }
            Err(e)
                if e.code() == Some(&tokio_postgres::error::SqlState::CANNOT_CONNECT_NOW)
                    && Instant::now() < deadline =>
            {
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            Err(e) => panic!("connecting to the proxy: {e} ({:?})", e.as_db_error()),
        }
    };
    client
        .batch_execute("create table acked (id bigint primary key)")
        .await
        .expect("create through the proxy");
    drop(client);
    let stop = Arc::new(AtomicBool::new(false));
    let (record, threads) = checker(hosts, stop.clone());
    (stop, record, threads)
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
        let (url, stop, record, next) = (hosts.proxy_url(), stop.clone(), record.clone(), next);
        threads.push(std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("rt");
            rt.block_on(async move {
                let mut client = None;
                while !stop.load(Ordering::SeqCst) {
                    if client.is_none() {
                        client = super::try_connect(&url).await;
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
                        failed => {
                            let told = match failed {
                                Ok(Err(e)) => e
                                    .as_db_error()
                                    .map_or_else(|| e.to_string(), |d| d.message().to_string()),
                                _ => "timed out".to_string(),
                            };
                            record.lock().expect("record").write_errors.push(told);
                            client = None;
                        }
                    }
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
            });
        }));
    }
    // One prober per host, from inside the host (its own network namespace, over its
    // loopback): a host cut off from the others is still observed.
    let last: Arc<Mutex<Vec<Option<Probe>>>> = Arc::new(Mutex::new(vec![None; 3]));
    for i in 0..3 {
        let url = format!(
            "postgresql://postgres:{}@127.0.0.1:{}/postgres?connect_timeout=1",
            hosts.password(),
            hosts.pg_port(i)
        );
        let netns = hosts.lab.as_ref().map(|l| l.netns(i));
        let (stop, last, probes) = (stop.clone(), last.clone(), record.clone());
        threads.push(std::thread::spawn(move || {
            thread_runtime(netns.as_deref()).block_on(async move {
                let mut client: Option<tokio_postgres::Client> = None;
                while !stop.load(Ordering::SeqCst) {
                    let started = Instant::now();
                    let writable = herd_testkit::agents::accepts_writes(&url, &mut client).await;
                    let now = Instant::now();
                    {
                        let mut seen = last.lock().expect("probes");
                        seen[i] = Some((now, writable));
                        // Another node seen writable within one probe period of this one.
                        let others: Vec<usize> = (0..3)
                            .filter(|&j| j != i)
                            .filter(|&j| {
                                seen[j].is_some_and(|(t, w)| {
                                    w && now.duration_since(t) < Duration::from_millis(100)
                                })
                            })
                            .collect();
                        if writable && !others.is_empty() {
                            probes
                                .lock()
                                .expect("record")
                                .two_writable
                                .push(format!("h{i} and {others:?} writable together"));
                        }
                    }
                    tokio::time::sleep(
                        Duration::from_millis(100).saturating_sub(started.elapsed()),
                    )
                    .await;
                }
            });
        }));
    }
    (record, threads)
}

pub async fn acknowledged_present(hosts: &Hosts, acknowledged: &[i64]) {
    let client = super::connect(&hosts.proxy_url()).await;
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
