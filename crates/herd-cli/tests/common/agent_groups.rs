//! A sharded cluster over `herd agent`s, modelled on loopback (`agent_groups.rs`,
//! `agent_group_add.rs`): one etcd member, the agents given as (name, group), one `herd proxy`
//! with its HTTP API. Ports: node i at base + i, agent i's API at base + n + i, the proxy at
//! base + 2n and its API next to it.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use herd_testkit::etcd::EtcdCluster;
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;

use super::hosts::{copy_dir, HERD};

/// The etcd member, the agents and the proxy of one test (stopped on drop).
pub struct Groups {
    pub etcd: EtcdCluster,
    pub dir: tempfile::TempDir,
    pub base: u16,
    /// The agents: (name, group).
    pub members: &'static [(&'static str, u32)],
    pub agents: Vec<Option<Child>>,
    pub proxy: Option<Child>,
    pub cluster: String,
    /// The pids of proxies started by [`Groups::extra_proxy`]: the test owns their `Child`,
    /// and killing them is its job, but a test that panics first would leave them running
    /// (they would serve on, against a cluster being torn down), so they go with the cluster.
    extra: std::sync::Mutex<Vec<u32>>,
}

impl Groups {
    /// One etcd member and a port block for `members` (none started yet); the cluster is named
    /// `prefix` and the block's first port.
    pub fn new(members: &'static [(&'static str, u32)], prefix: &str) -> Groups {
        // etcd first: its ports are taken before the agents' block is chosen.
        let etcd = EtcdCluster::start(1);
        let base = herd_testkit::free_port_block(2 * members.len() as u16 + 4);
        Groups {
            etcd,
            dir: herd_testkit::scratch_dir(),
            base,
            members,
            agents: (0..members.len()).map(|_| None).collect(),
            proxy: None,
            cluster: format!("{prefix}{base}"),
            extra: std::sync::Mutex::new(Vec::new()),
        }
    }

    pub fn dcs(&self) -> String {
        super::hosts::etcd_url(&self.etcd)
    }

    pub fn agent_dir(&self, i: usize) -> PathBuf {
        self.dir.path().join(self.members[i].0)
    }

    pub fn pg_port(&self, i: usize) -> u16 {
        self.base + i as u16
    }

    pub fn api(&self, i: usize) -> String {
        format!(
            "127.0.0.1:{}",
            self.base + self.members.len() as u16 + i as u16
        )
    }

    pub fn proxy_port(&self) -> u16 {
        self.base + 2 * self.members.len() as u16
    }

    /// The proxy's HTTP API and dashboard (`host:port`).
    pub fn proxy_api(&self) -> String {
        format!(
            "127.0.0.1:{}",
            self.base + 2 * self.members.len() as u16 + 1
        )
    }

    /// `GET path` on the proxy's API: status code and body.
    pub fn api_get(&self, path: &str) -> (u16, String) {
        let agent = ureq::AgentBuilder::new()
            .timeout(Duration::from_secs(10))
            .build();
        match agent
            .get(&format!("http://{}{path}", self.proxy_api()))
            .call()
        {
            Ok(r) => (r.status(), r.into_string().unwrap_or_default()),
            Err(ureq::Error::Status(code, r)) => (code, r.into_string().unwrap_or_default()),
            Err(e) => (0, e.to_string()),
        }
    }

    /// `POST path` on the proxy's API: status code and body (90 s: a switchover waits).
    pub fn api_post(&self, path: &str) -> (u16, String) {
        let agent = ureq::AgentBuilder::new()
            .timeout(Duration::from_secs(90))
            .build();
        match agent
            .post(&format!("http://{}{path}", self.proxy_api()))
            .call()
        {
            Ok(r) => (r.status(), r.into_string().unwrap_or_default()),
            Err(ureq::Error::Status(code, r)) => (code, r.into_string().unwrap_or_default()),
            Err(e) => (0, e.to_string()),
        }
    }

    pub fn password(&self) -> String {
        std::fs::read_to_string(self.agent_dir(0).join("secrets/superuser.password"))
            .expect("password")
            .trim()
            .to_string()
    }

    /// Starts another `herd proxy` of the cluster listening on `port` (its log in `<name>.log`)
    /// and waits (30 s at most) until it serves; the process and a client of it.
    // The child is returned: its caller kills and waits for it.
    #[allow(clippy::zombie_processes)]
    pub async fn extra_proxy(&self, port: u16, name: &str) -> (Child, tokio_postgres::Client) {
        let log =
            std::fs::File::create(self.dir.path().join(format!("{name}.log"))).expect("proxy log");
        let mut child = Command::new(HERD)
            .args(["proxy", "--dcs", &self.dcs(), "--cluster", &self.cluster])
            .args(["--listen", &format!("127.0.0.1:{port}")])
            .arg("--data-dir")
            .arg(self.dir.path().join("proxy"))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("another herd proxy");
        if let Ok(mut pids) = self.extra.lock() {
            pids.push(child.id());
        }
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Some(c) = super::try_connect(&self.url(port)).await {
                return (child, c);
            }
            if Instant::now() >= deadline {
                let _ = child.kill();
                let _ = child.wait();
                panic!("{name} does not serve after 30 s");
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// The superuser's URL of agent `i`'s server itself (not through the proxy).
    pub fn direct_url(&self, i: usize) -> String {
        format!(
            "postgresql://postgres:{}@127.0.0.1:{}/postgres?connect_timeout=5",
            self.password(),
            self.pg_port(i)
        )
    }

    pub fn url(&self, port: u16) -> String {
        format!(
            "postgresql://postgres:{}@127.0.0.1:{port}/postgres?connect_timeout=2",
            self.password()
        )
    }

    /// A session through the proxy, waited for (30 s at most: the proxy may still be
    /// starting, and a connect that never completes must not hang the test).
    pub async fn connect_proxy(&self) -> tokio_postgres::Client {
        let url = self.url(self.proxy_port());
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Some(c) = super::try_connect(&url).await {
                return c;
            }
            assert!(
                Instant::now() < deadline,
                "no session through the proxy within 30 s; logs:\n{}",
                self.logs()
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    pub fn start_agent(&mut self, i: usize) {
        self.start_agent_with(i, &[]);
    }

    /// [`Groups::start_agent`] with more arguments (`--dashboard-listen …`).
    pub fn start_agent_with(&mut self, i: usize, extra: &[&str]) {
        let (name, group) = self.members[i];
        std::fs::create_dir_all(self.agent_dir(i)).expect("agent dir");
        // The first agent's passwords, as an operator's `scp` gives them to the others.
        let secrets = self.agent_dir(i).join("secrets");
        if i > 0 && !secrets.exists() {
            copy_dir(&self.agent_dir(0).join("secrets"), &secrets);
        }
        // Logical WAL: a shard move copies its rows with a logical copy. Written once: a
        // rewrite while another agent starts could be read empty (wal_level replica).
        let config = self.dir.path().join("agent.toml");
        if !config.exists() {
            let partial = self.dir.path().join("agent.toml.part");
            std::fs::write(&partial, "[postgres]\nwal_level = \"logical\"\n").expect("agent.toml");
            std::fs::rename(&partial, &config).expect("agent.toml");
        }
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.path().join(format!("{name}.log")))
            .expect("agent log");
        let child = Command::new(HERD)
            .arg("agent")
            .args(["--dcs", &self.dcs(), "--cluster", &self.cluster])
            .args(["--name", name, "--group", &group.to_string()])
            .args(["--shard-groups", "2"])
            .arg("--data-dir")
            .arg(self.agent_dir(i))
            .args(["--pg-port", &self.pg_port(i).to_string()])
            .args(["--api-listen", &self.api(i)])
            .args(["--ttl-ms", "6000", "--loop-wait-ms", "500"])
            .args(["--safety-margin-ms", "2000", "--etcd-timeout-ms", "1000"])
            .arg("--config")
            .arg(&config)
            .args(extra)
            .env("HERD_LOG", "info")
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("log"))
            .stderr(log)
            .spawn()
            .expect("starting herd agent");
        self.agents[i] = Some(child);
    }

    /// Starts each agent in turn (one per group, each its group's primary within 90 s), then
    /// the proxy; a session through it.
    pub async fn start_primaries_and_proxy(&mut self) -> tokio_postgres::Client {
        for i in 0..self.members.len() {
            self.start_agent(i);
            self.wait_role(i, "primary", Duration::from_secs(90));
        }
        self.start_proxy();
        self.connect_proxy().await
    }

    pub fn start_proxy(&mut self) {
        self.start_proxy_with(&[]);
    }

    /// [`Groups::start_proxy`] with more arguments (`--tls-cert …`).
    pub fn start_proxy_with(&mut self, extra: &[&str]) {
        let secrets = self.dir.path().join("proxy/secrets");
        if !secrets.exists() {
            copy_dir(&self.agent_dir(0).join("secrets"), &secrets);
        }
        let log = std::fs::File::create(self.dir.path().join("proxy.log")).expect("proxy log");
        let child = Command::new(HERD)
            .args(["proxy", "--dcs", &self.dcs(), "--cluster", &self.cluster])
            .args(["--listen", &format!("127.0.0.1:{}", self.proxy_port())])
            .args(["--api-listen", &self.proxy_api()])
            .arg("--data-dir")
            .arg(self.dir.path().join("proxy"))
            .args(extra)
            .env(
                "HERD_LOG",
                std::env::var("HERD_TEST_PROXY_LOG").unwrap_or_else(|_| "info".into()),
            )
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("log"))
            .stderr(log)
            .spawn()
            .expect("starting herd proxy");
        self.proxy = Some(child);
    }

    /// Runs `herd ARGS --dcs … --cluster …`; its standard output (it must succeed).
    pub fn herd_store(&self, args: &[&str]) -> String {
        super::hosts::herd_with_store(&self.dcs(), &self.cluster, args)
    }

    /// `herd ARGS --dcs … --cluster …` within `limit`: its standard output (it must succeed).
    pub fn herd_store_within(&self, args: &[&str], limit: Duration) -> String {
        let mut cmd = Command::new(HERD);
        cmd.args(args)
            .args(["--dcs", &self.dcs(), "--cluster", &self.cluster]);
        let out = herd_testkit::output_within(&mut cmd, limit).expect("herd exits in time");
        assert!(
            out.status.success(),
            "herd {args:?}: {}\nlogs:\n{}",
            herd_testkit::describe(&out),
            self.logs()
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    pub fn role(&self, i: usize) -> Option<String> {
        herd_testkit::agents::member(
            &self.api(i),
            std::fs::read_to_string(self.agent_dir(0).join("secrets/superuser.password"))
                .ok()?
                .trim(),
        )
        .and_then(|m| m["role"].as_str().map(str::to_string))
    }

    pub fn logs(&self) -> String {
        // Extra proxies' logs too, when they ran (`extra_proxy`).
        let extra = ["proxy2", "proxy3"]
            .into_iter()
            .filter(|n| self.dir.path().join(format!("{n}.log")).exists());
        let names: Vec<&str> = self
            .members
            .iter()
            .map(|a| a.0)
            .chain(["proxy"])
            .chain(extra)
            .collect();
        herd_testkit::agents::log_tails(self.dir.path(), &names, 60)
    }

    pub fn wait_role(&self, i: usize, role: &str, timeout: Duration) {
        let deadline = Instant::now() + timeout;
        while self.role(i).as_deref() != Some(role) {
            assert!(
                Instant::now() < deadline,
                "{} is not {role} after {timeout:?} (it is {:?}); logs:\n{}",
                self.members[i].0,
                self.role(i),
                self.logs()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// The primary among `members`, waited for.
    pub fn wait_primary_of(&self, members: &[usize], timeout: Duration) -> usize {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(&p) = members
                .iter()
                .find(|&&i| self.role(i).as_deref() == Some("primary"))
            {
                return p;
            }
            assert!(
                Instant::now() < deadline,
                "no primary among {members:?} after {timeout:?}; logs:\n{}",
                self.logs()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

impl Drop for Groups {
    fn drop(&mut self) {
        if let Some(mut p) = self.proxy.take() {
            let _ = p.kill();
            let _ = p.wait();
        }
        // Extra proxies still running (the test panicked before it stopped them): only a pid
        // whose command line names this cluster's directory, as a pid may have been reused.
        let dir = self.dir.path().to_string_lossy().into_owned();
        for pid in self.extra.lock().map(|p| p.clone()).unwrap_or_default() {
            let ours = std::fs::read(format!("/proc/{pid}/cmdline"))
                .is_ok_and(|c| String::from_utf8_lossy(&c).contains(&dir));
            if ours {
                let _ = kill(Pid::from_raw(pid as i32), Signal::SIGKILL);
            }
        }
        for i in 0..self.members.len() {
            if let Some(mut a) = self.agents[i].take() {
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
