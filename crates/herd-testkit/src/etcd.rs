//! A real etcd cluster for tests: Debian's `etcd` binary, members on loopback ports with their
//! data in a temporary directory, killed and removed when the handle is dropped.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A running etcd cluster of `n` members.
pub struct EtcdCluster {
    members: Vec<Option<Child>>,
    commands: Vec<Command>,
    clients: Vec<(String, u16)>,
    dir: tempfile::TempDir,
}

/// Where one member runs: its address, and the network namespace it runs in (if any).
#[derive(Clone, Debug)]
pub struct Placement {
    /// The address it listens on (client and peer ports).
    pub ip: String,
    /// Run inside this network namespace (`ip netns exec`).
    pub netns: Option<String>,
}

/// Where the etcd server program is: `$HERD_ETCD`, else `etcd` on the PATH.
pub fn etcd_program() -> PathBuf {
    std::env::var_os("HERD_ETCD")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("etcd"))
}

impl EtcdCluster {
    /// Starts `n` members on loopback and waits (at most 30 s) until every one is healthy.
    pub fn start(n: usize) -> EtcdCluster {
        let loopback = Placement {
            ip: "127.0.0.1".into(),
            netns: None,
        };
        Self::start_on(&vec![loopback; n])
    }

    /// Starts one member per placement and waits (at most 30 s) until every one is healthy.
    pub fn start_on(placements: &[Placement]) -> EtcdCluster {
        let n = placements.len();
        let base = crate::free_port_block((2 * n) as u16);
        let dir = crate::scratch_dir();
        let peer = |i: usize| format!("http://{}:{}", placements[i].ip, base + (n + i) as u16);
        let initial: Vec<String> = (0..n).map(|i| format!("m{i}={}", peer(i))).collect();
        let mut cluster = EtcdCluster {
            members: Vec::new(),
            commands: Vec::new(),
            clients: (0..n)
                .map(|i| (placements[i].ip.clone(), base + i as u16))
                .collect(),
            dir,
        };
        for (i, place) in placements.iter().enumerate() {
            let client = format!("http://{}:{}", place.ip, base + i as u16);
            let log = std::fs::File::create(cluster.dir.path().join(format!("m{i}.log")))
                .expect("etcd log file");
            let mut cmd = match &place.netns {
                Some(ns) => {
                    let mut c = Command::new("ip");
                    c.args(["netns", "exec", ns]).arg(etcd_program());
                    c
                }
                None => Command::new(etcd_program()),
            };
            cmd.args(["--name", &format!("m{i}")])
                .arg("--data-dir")
                .arg(cluster.dir.path().join(format!("m{i}")))
                .args(["--listen-client-urls", &client])
                .args(["--advertise-client-urls", &client])
                .args(["--listen-peer-urls", &peer(i)])
                .args(["--initial-advertise-peer-urls", &peer(i)])
                .args(["--initial-cluster", &initial.join(",")])
                .args(["--initial-cluster-state", "new"])
                .args(["--initial-cluster-token", "herd-test"])
                // etcd's own defaults (100 ms heartbeats, 1 s elections; the shortest lease TTL
                // is 1.5 s): with 500 ms elections a loaded 2-core machine (three PostgreSQL
                // servers, agents, fsyncs) missed heartbeats and etcd re-elected its leader
                // every few seconds, which fenced primaries between renewals.
                .args(["--heartbeat-interval", "100", "--election-timeout", "1000"])
                // A member back from a partition must not depose a working leader with the
                // terms it counted up alone (etcd 3.4 leaves pre-vote off; 3.5 turns it on).
                .arg("--pre-vote")
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(log.try_clone().map_or(Stdio::null(), Stdio::from));
            cluster.commands.push(cmd);
            cluster.members.push(None);
            cluster.start_member(i);
        }
        // Generous: a loaded 2-core machine was seen to need more than 30 s for a member in a
        // network namespace to answer its first health check.
        let deadline = Instant::now() + Duration::from_secs(60);
        for i in 0..n {
            while !cluster.healthy(i) {
                assert!(
                    Instant::now() < deadline,
                    "etcd member m{i} not healthy after 60 s: {}",
                    cluster.log_tail(i)
                );
                std::thread::sleep(Duration::from_millis(100));
            }
        }
        cluster
    }

    fn start_member(&mut self, i: usize) {
        let child = self.commands[i].spawn().unwrap_or_else(|e| {
            panic!(
                "starting {} (install etcd-server): {e}",
                etcd_program().display()
            )
        });
        self.members[i] = Some(child);
    }

    /// The directory holding every member's data and log (removed when dropped).
    pub fn dir(&self) -> &std::path::Path {
        self.dir.path()
    }

    /// Client URLs of every member.
    pub fn endpoints(&self) -> Vec<String> {
        self.clients
            .iter()
            .map(|(ip, p)| format!("http://{ip}:{p}"))
            .collect()
    }

    /// Kills member `i` (SIGKILL).
    pub fn kill(&mut self, i: usize) {
        if let Some(mut c) = self.members[i].take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Starts member `i` again with its data, and waits until it is healthy.
    pub fn restart(&mut self, i: usize) {
        self.start_member(i);
        crate::wait_until(Duration::from_secs(30), "a restarted etcd member", || {
            self.healthy(i).then_some(())
        });
    }

    /// Whether member `i` answers `GET /health` with a healthy status.
    pub fn healthy(&self, i: usize) -> bool {
        let (ip, port) = &self.clients[i];
        let Ok(addr) = format!("{ip}:{port}").parse::<std::net::SocketAddr>() else {
            return false;
        };
        let Ok(mut s) = TcpStream::connect_timeout(&addr, Duration::from_secs(1)) else {
            return false;
        };
        let _ = s.set_read_timeout(Some(Duration::from_secs(2)));
        if s.write_all(b"GET /health HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n")
            .is_err()
        {
            return false;
        }
        let mut answer = String::new();
        let _ = s.read_to_string(&mut answer);
        answer.contains("\"health\":\"true\"")
    }

    /// The last lines of member `i`'s log.
    pub fn log_tail(&self, i: usize) -> String {
        let text =
            std::fs::read_to_string(self.dir.path().join(format!("m{i}.log"))).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(20)..].join("\n")
    }
}

impl Drop for EtcdCluster {
    fn drop(&mut self) {
        for i in 0..self.members.len() {
            self.kill(i);
        }
    }
}
