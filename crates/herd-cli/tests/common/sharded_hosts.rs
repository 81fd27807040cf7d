//! The lab of `sharded_hosts.rs`: three network-namespace hosts, each with an etcd member and
//! one `herd agent` per shard group (agent `k` serves group `k / HOSTS` on host `k % HOSTS`),
//! and two `herd proxy` outside.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use herd_testkit::etcd::EtcdCluster;
use herd_testkit::netns::{Lab, Link};
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;

use super::hosts::{etcd_url, HERD};

pub const HOSTS: usize = 3;
pub const GROUPS: usize = 2;
pub const TTL_MS: u64 = 6000;

/// The lab: agent `k` serves group `k / HOSTS` on host `k % HOSTS`.
pub struct Sharded {
    pub etcd: EtcdCluster,
    pub dir: tempfile::TempDir,
    pub base: u16,
    pub agents: Vec<Option<Child>>,
    pub proxies: Vec<Option<Child>>,
    pub cluster: String,
    /// Dropped last: the namespaces go once every process in them is gone.
    pub lab: Lab,
}

pub fn host_of(k: usize) -> usize {
    k % HOSTS
}

pub fn group_of(k: usize) -> usize {
    k / HOSTS
}

pub fn members(g: usize) -> Vec<usize> {
    (g * HOSTS..(g + 1) * HOSTS).collect()
}

impl Sharded {
    pub fn name(k: usize) -> String {
        format!("h{}g{}", host_of(k), group_of(k))
    }

    pub fn agent_dir(&self, k: usize) -> PathBuf {
        self.dir.path().join(Self::name(k))
    }

    pub fn pg_host(&self, k: usize) -> String {
        self.lab.host_ip(host_of(k), Link::Database)
    }

    pub fn pg_port(&self, k: usize) -> u16 {
        self.base + k as u16
    }

    pub fn api(&self, k: usize) -> String {
        format!("{}:{}", self.pg_host(k), self.base + 6 + k as u16)
    }

    pub fn proxy_port(&self, p: usize) -> u16 {
        self.base + 12 + p as u16
    }

    pub fn password(&self) -> String {
        std::fs::read_to_string(self.agent_dir(0).join("secrets/superuser.password"))
            .expect("password")
            .trim()
            .to_string()
    }

    /// Where proxy `p` listens: on the database network's bridge, so that the hosts reach it
    /// too (a shard move's subscription and the coordinator that runs the move go through it).
    pub fn proxy_addr(&self, p: usize) -> String {
        format!(
            "{}:{}",
            self.lab.outside_ip(Link::Database),
            self.proxy_port(p)
        )
    }

    pub fn proxy_url(&self, p: usize) -> String {
        format!(
            "postgresql://postgres:{}@{}/postgres?connect_timeout=2",
            self.password(),
            self.proxy_addr(p)
        )
    }

    pub fn node_url(&self, k: usize) -> String {
        format!(
            "postgresql://postgres:{}@{}:{}/postgres?connect_timeout=2",
            self.password(),
            self.pg_host(k),
            self.pg_port(k)
        )
    }

    pub fn start_agent(&mut self, k: usize) {
        std::fs::create_dir_all(self.agent_dir(k)).expect("agent dir");
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.path().join(format!("{}.log", Self::name(k))))
            .expect("agent log");
        // Logical WAL: a shard move copies its rows with a logical copy.
        let config = self.dir.path().join("agent.toml");
        if !config.exists() {
            std::fs::write(&config, "[postgres]\nwal_level = \"logical\"\n").expect("agent.toml");
        }
        let mut cmd = self.lab.command(host_of(k), std::path::Path::new(HERD));
        cmd.args(["agent", "--pg-listen", "0.0.0.0"])
            .arg("--config")
            .arg(&config)
            .args(["--pg-advertise", &self.pg_host(k)])
            .args(["--dcs", &etcd_url(&self.etcd), "--cluster", &self.cluster])
            .args(["--name", &Self::name(k)])
            .args(["--group", &group_of(k).to_string()])
            .args(["--shard-groups", &GROUPS.to_string()])
            .arg("--data-dir")
            .arg(self.agent_dir(k))
            .args(["--pg-port", &self.pg_port(k).to_string()])
            .args(["--api-listen", &self.api(k)])
            .args(["--ttl-ms", &TTL_MS.to_string(), "--loop-wait-ms", "500"])
            .args(["--safety-margin-ms", "2000", "--etcd-timeout-ms", "1000"])
            .env("HERD_LOG", "info")
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("log"))
            .stderr(log);
        self.agents[k] = Some(cmd.spawn().expect("starting herd agent"));
    }

    pub fn start_proxy(&mut self, p: usize) {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.path().join(format!("proxy{p}.log")))
            .expect("proxy log");
        let child = Command::new(HERD)
            .args([
                "proxy",
                "--dcs",
                &etcd_url(&self.etcd),
                "--cluster",
                &self.cluster,
            ])
            .args(["--listen", &self.proxy_addr(p)])
            .arg("--data-dir")
            .arg(self.dir.path().join("proxy"))
            .env(
                "HERD_LOG",
                std::env::var("HERD_TEST_PROXY_LOG").unwrap_or_else(|_| "info".into()),
            )
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("log"))
            .stderr(log)
            .spawn()
            .expect("starting herd proxy");
        self.proxies[p] = Some(child);
    }

    pub fn role(&self, k: usize) -> Option<String> {
        // No password before the first agent created the cluster.
        let password =
            std::fs::read_to_string(self.agent_dir(0).join("secrets/superuser.password")).ok()?;
        herd_testkit::agents::member(&self.api(k), password.trim())
            .and_then(|m| m["role"].as_str().map(str::to_string))
    }

    pub fn logs(&self) -> String {
        let names: Vec<String> = (0..HOSTS * GROUPS)
            .map(Self::name)
            .chain(["proxy0".into(), "proxy1".into()])
            .collect();
        let names: Vec<&str> = names.iter().map(String::as_str).collect();
        herd_testkit::agents::log_tails(self.dir.path(), &names, 40)
    }

    /// Group `g`'s primary other than on host `not_on`, waited for (`timeout`).
    pub fn wait_primary(&self, g: usize, not_on: Option<usize>, timeout: Duration) -> usize {
        let deadline = Instant::now() + timeout;
        loop {
            let found = members(g)
                .into_iter()
                .filter(|&k| Some(host_of(k)) != not_on)
                .find(|&k| self.role(k).as_deref() == Some("primary"));
            if let Some(k) = found {
                return k;
            }
            assert!(
                Instant::now() < deadline,
                "no primary of group {g} (not on host {not_on:?}) after {timeout:?}; logs:\n{}",
                self.logs()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    pub fn wait_role(&self, k: usize, role: &str, timeout: Duration) {
        let deadline = Instant::now() + timeout;
        while self.role(k).as_deref() != Some(role) {
            assert!(
                Instant::now() < deadline,
                "{} is not {role} after {timeout:?} (it is {:?}); logs:\n{}",
                Self::name(k),
                self.role(k),
                self.logs()
            );
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// Kills agent `k`'s process with -9 (its server and watchdog left to themselves).
    pub fn kill_agent(&mut self, k: usize) {
        if let Some(mut a) = self.agents[k].take() {
            let _ = kill(Pid::from_raw(a.id() as i32), Signal::SIGKILL);
            let _ = a.wait();
        }
    }

    /// Kills every process of host `h` with -9 (its etcd member included) and reaps the
    /// agents' handles.
    pub fn kill_host(&mut self, h: usize) {
        self.etcd.kill(h);
        for pid in self.lab.pids(h) {
            let _ = kill(Pid::from_raw(pid), Signal::SIGKILL);
        }
        for k in (0..HOSTS * GROUPS).filter(|&k| host_of(k) == h) {
            if let Some(mut a) = self.agents[k].take() {
                let _ = a.kill();
                let _ = a.wait();
            }
        }
    }
}

impl Drop for Sharded {
    fn drop(&mut self) {
        // HERD_TEST_KEEP_LOGS=DIR keeps every log of a failed run there (the scratch
        // directory goes with the test).
        if let (true, Some(keep)) = (
            std::thread::panicking(),
            std::env::var_os("HERD_TEST_KEEP_LOGS"),
        ) {
            let _ = std::fs::create_dir_all(&keep);
            for entry in std::fs::read_dir(self.dir.path())
                .into_iter()
                .flatten()
                .flatten()
            {
                let path = entry.path();
                if path.extension().is_some_and(|e| e == "log") {
                    let _ = std::fs::copy(&path, PathBuf::from(&keep).join(entry.file_name()));
                }
            }
        }
        for p in self.proxies.iter_mut().filter_map(Option::take) {
            let mut p = p;
            let _ = p.kill();
            let _ = p.wait();
        }
        for k in 0..self.agents.len() {
            if let Some(mut a) = self.agents[k].take() {
                let _ = a.kill();
                let _ = a.wait();
            }
        }
        for h in 0..HOSTS {
            for pid in self.lab.pids(h) {
                let _ = kill(Pid::from_raw(pid), Signal::SIGKILL);
            }
        }
        for k in 0..HOSTS * GROUPS {
            let _ = herd_pg::kill_server(&self.agent_dir(k).join("pgdata"));
        }
    }
}
