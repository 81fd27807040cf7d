//! Three "hosts" for `herd bench failover --hosts 3`: Linux network namespaces (the testkit's
//! lab), each running an etcd member, a `herd agent` with its default settings and that
//! agent's PostgreSQL; `herd proxy` runs outside them. With shard groups (`--shards 2`) each
//! host runs one agent per group, so every group has a member on every host: agent `k` serves
//! group `k / HOSTS` on host `k % HOSTS`. Faults take a whole host down (every
//! process in its namespace killed, as a power loss) or cut it off the network. The lab is
//! listed in the run's [`Scratches`] from before its namespaces are built, so an interrupted
//! run removes it too; dropping the handle removes it otherwise, the same way (both run
//! [`lab_teardown`](super::lab_teardown)).

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use herd_testkit::etcd::{EtcdCluster, Placement};
use herd_testkit::netns::{Lab, Link};

use super::lab_teardown::{self, LabNames};
use crate::scratches::{Scratches, Stage};
use crate::BenchError;

/// The hosts of the lab.
pub const HOSTS: usize = 3;
/// The most shard groups the lab runs (its port block is sized for them).
pub const MAX_GROUPS: usize = 2;
/// The longest wait for the cluster to be whole (a primary, every replica streaming from it).
const WHOLE_LIMIT: Duration = Duration::from_secs(120);
/// How long dropping the lab may take: the agents get 20 s together to stop their PostgreSQL,
/// killing what is left and deleting the namespaces take seconds; the rest is margin for a
/// loaded machine (an interrupt's whole teardown has 90 s).
const TEARDOWN_LIMIT: Duration = Duration::from_secs(60);

/// The running lab. The parts that remove themselves when dropped are options: `Drop` forgets
/// them, since the lab is removed from its names (by `Drop` or an interrupt that took it over).
pub struct LabHosts {
    herd: PathBuf,
    /// Agents' data and logs (removed when dropped); names the lab in the run's [`Scratches`].
    path: PathBuf,
    dir: Option<tempfile::TempDir>,
    base: u16,
    /// Shard groups: 1 for an unsharded cluster.
    groups: usize,
    /// Agent `k` serves group `k / HOSTS` on host `k % HOSTS`.
    agents: Vec<Option<Child>>,
    proxy: Option<Child>,
    cluster: String,
    /// `--ttl-ms` for the agents, when not their default.
    ttl_ms: Option<u64>,
    /// Started after the lab is registered, so an interrupt during its start removes it too.
    etcd: Option<EtcdCluster>,
    /// Dropped last: deleting the namespaces removes the links.
    lab: Option<Lab>,
    /// What the teardown removes; its gate says whether the lab was torn down (see [`open`]).
    names: LabNames,
    scratches: Scratches,
}

fn failed(what: &str, detail: impl Into<String>) -> BenchError {
    BenchError::Failed {
        what: what.into(),
        status: "failed".into(),
        output: detail.into(),
    }
}

impl LabHosts {
    /// Builds the namespaces, starts etcd, the agents (three per shard group; the first
    /// creates the cluster) and the proxy, and waits until every group is whole.
    /// Listed in `scratches` from before the namespaces are built, until dropped.
    pub fn start(
        herd: &Path,
        ttl_ms: Option<u64>,
        groups: usize,
        scratches: &Scratches,
        progress: &dyn Fn(&str),
    ) -> Result<LabHosts, BenchError> {
        if !Lab::available() {
            return Err(BenchError::Missing(
                "herd bench failover --hosts 3: the hosts are Linux network namespaces; run it \
                 as root on a machine with `ip netns` (iproute2)"
                    .into(),
            ));
        }
        let etcd = Command::new(herd_testkit::etcd::etcd_program())
            .arg("--version")
            .output();
        if !etcd.is_ok_and(|o| o.status.success()) {
            return Err(BenchError::Missing(
                "herd bench failover --hosts 3 needs etcd: run scripts/install-deps (Debian's \
                 etcd-server)"
                    .into(),
            ));
        }
        // Named and registered before anything is made, so an interrupt while the namespaces
        // are built removes them too (it waits for the build to finish first).
        let lab = Lab::planned(HOSTS);
        let dir = herd_testkit::scratch_dir();
        let path = dir.path().to_path_buf();
        let names = LabNames {
            namespaces: lab.namespaces(),
            bridges: lab.bridges(),
            dirs: Arc::new(Mutex::new(vec![path.clone()])),
            torn_down: Arc::new(Mutex::new(false)),
        };
        let stop = {
            let names = names.clone();
            Box::new(move |deadline| lab_teardown::tear_down(&names, deadline))
        };
        // Refused once interrupted: nothing is built yet, and `dir`, dropped, removes itself.
        scratches.add_extra(&path, Stage::WithClusters, names.remove_by_hand(), stop)?;
        let groups = groups.clamp(1, MAX_GROUPS);
        // PostgreSQL at base + k, APIs at base + 6 + k, the proxy at base + 12.
        let base = herd_testkit::free_port_block(14);
        // From here on, dropping `hosts` (also on an error below) removes the lab.
        let hosts = LabHosts {
            herd: herd.to_path_buf(),
            path,
            dir: Some(dir),
            base,
            groups,
            agents: (0..HOSTS * groups).map(|_| None).collect(),
            proxy: None,
            cluster: format!("bench{base}"),
            ttl_ms,
            etcd: None,
            lab: Some(lab),
            names: names.clone(),
            scratches: scratches.clone(),
        };
        // Where to look if something is left behind; tests read this line to find the lab.
        scratches.say(&format!(
            "herd bench: lab hosts in {} (network namespaces {})",
            hosts.path.display(),
            names.namespaces.join(" ")
        ));
        progress("building 3 network namespaces");
        let gate = Arc::clone(&names.torn_down);
        {
            let _gate = open(&gate)?;
            hosts
                .lab()
                .create()
                .map_err(|e| failed("building the network namespaces", e))?;
        }
        let mut hosts = hosts;
        progress("starting etcd (one member per host)");
        let placements: Vec<Placement> = (0..HOSTS)
            .map(|i| Placement {
                ip: hosts.lab().host_ip(i, Link::Store),
                netns: Some(hosts.lab().netns(i)),
            })
            .collect();
        {
            // Through the gate, so an interrupt's teardown waits for etcd's directory to be
            // known (a few seconds) and then removes it too.
            let _gate = open(&gate)?;
            let etcd = EtcdCluster::start_on(&placements);
            names
                .dirs
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .push(etcd.dir().to_path_buf());
            hosts.etcd = Some(etcd);
        }
        scratches.set_remove(&hosts.path, names.remove_by_hand());
        progress("starting the first agent (initdb)");
        hosts.start_agent(0)?;
        hosts.wait_until("h0 to lead", WHOLE_LIMIT, |h| {
            h.role(0).as_deref() == Some("primary")
        })?;
        for i in 1..HOSTS * groups {
            copy_dir(
                &hosts.agent_dir(0).join("secrets"),
                &hosts.agent_dir(i).join("secrets"),
            )?;
            hosts.start_agent(i)?;
        }
        copy_dir(
            &hosts.agent_dir(0).join("secrets"),
            &hosts.path.join("proxy/secrets"),
        )?;
        progress("cloning the replicas");
        hosts.wait_whole()?;
        progress("starting herd proxy");
        hosts.start_proxy()?;
        let port = hosts.proxy_port();
        hosts.wait_until("herd proxy to listen", Duration::from_secs(30), |_| {
            std::net::TcpStream::connect(("127.0.0.1", port)).is_ok()
        })?;
        Ok(hosts)
    }

    /// The network namespaces (present until the lab is dropped).
    pub fn lab(&self) -> &Lab {
        self.lab
            .as_ref()
            .expect("the lab lives until LabHosts is dropped")
    }

    fn etcd(&self) -> &EtcdCluster {
        self.etcd
            .as_ref()
            .expect("etcd runs once LabHosts::start returns")
    }

    fn etcd_mut(&mut self) -> &mut EtcdCluster {
        self.etcd
            .as_mut()
            .expect("etcd runs once LabHosts::start returns")
    }

    /// Host `i`'s name (also its member name without shard groups).
    pub fn name(i: usize) -> String {
        format!("h{i}")
    }

    /// Agent `k`'s member name: its host's name, with its group's when sharded.
    pub fn agent_name(&self, k: usize) -> String {
        if self.groups == 1 {
            Self::name(k)
        } else {
            format!("h{}g{}", host_of(k), k / HOSTS)
        }
    }

    /// Shard groups of the cluster (1 when unsharded).
    pub fn groups(&self) -> usize {
        self.groups
    }

    fn agent_dir(&self, k: usize) -> PathBuf {
        self.path.join(self.agent_name(k))
    }

    /// Agent `k`'s host's address on the database network.
    pub fn pg_host(&self, k: usize) -> String {
        self.lab().host_ip(host_of(k), Link::Database)
    }

    /// Agent `k`'s PostgreSQL port (each its own, so an acknowledgement names its server).
    pub fn pg_port(&self, k: usize) -> u16 {
        self.base + k as u16
    }

    fn api(&self, k: usize) -> String {
        format!("{}:{}", self.pg_host(k), self.base + 6 + k as u16)
    }

    fn proxy_port(&self) -> u16 {
        self.base + 12
    }

    fn dcs(&self) -> String {
        let hosts: Vec<String> = self
            .etcd()
            .endpoints()
            .iter()
            .map(|e| e.trim_start_matches("http://").to_string())
            .collect();
        format!("etcd://{}", hosts.join(","))
    }

    /// The cluster's superuser password.
    pub fn password(&self) -> Result<String, BenchError> {
        let path = self.agent_dir(0).join("secrets/superuser.password");
        std::fs::read_to_string(&path)
            .map(|p| p.trim().to_string())
            .map_err(|e| BenchError::io("reading", &path, e))
    }

    /// The proxy's URL.
    pub fn proxy_url(&self) -> Result<String, BenchError> {
        Ok(self.url_at("127.0.0.1", self.proxy_port(), &self.password()?))
    }

    /// Agent `i`'s PostgreSQL over the database network.
    pub fn node_url(&self, i: usize) -> Result<String, BenchError> {
        Ok(self.url_at(&self.pg_host(i), self.pg_port(i), &self.password()?))
    }

    /// Agent `i`'s PostgreSQL over its host's own loopback (for a prober inside the host).
    pub fn local_url(&self, i: usize) -> Result<String, BenchError> {
        Ok(self.url_at("127.0.0.1", self.pg_port(i), &self.password()?))
    }

    fn url_at(&self, host: &str, port: u16, password: &str) -> String {
        format!("postgresql://postgres:{password}@{host}:{port}/postgres?connect_timeout=2")
    }

    fn log(&self, name: &str) -> Result<std::fs::File, BenchError> {
        let path = self.path.join(format!("{name}.log"));
        std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&path)
            .map_err(|e| BenchError::io("opening", &path, e))
    }

    /// Starts agent `i` with its default timings (TTL 10 s unless `--ttl-ms`, loop 1 s,
    /// margin 2.5 s), in its group when sharded.
    pub fn start_agent(&mut self, i: usize) -> Result<(), BenchError> {
        let gate = Arc::clone(&self.names.torn_down);
        let _gate = open(&gate)?;
        let dir = self.agent_dir(i);
        std::fs::create_dir_all(&dir).map_err(|e| BenchError::io("creating", &dir, e))?;
        let log = self.log(&self.agent_name(i))?;
        let err = log
            .try_clone()
            .map_err(|e| BenchError::io("opening", &self.path, e))?;
        let mut cmd = self.lab().command(host_of(i), &self.herd);
        cmd.args(["agent", "--pg-listen", "0.0.0.0"])
            .args(["--pg-advertise", &self.pg_host(i)])
            .args(["--dcs", &self.dcs(), "--cluster", &self.cluster])
            .args(["--name", &self.agent_name(i)])
            .arg("--data-dir")
            .arg(&dir)
            .args(["--pg-port", &self.pg_port(i).to_string()])
            .args(["--api-listen", &self.api(i)])
            .args(self.ttl_ms.map(|t| format!("--ttl-ms={t}")))
            .args(
                (self.groups > 1)
                    .then(|| {
                        [
                            format!("--group={}", i / HOSTS),
                            format!("--shard-groups={}", self.groups),
                        ]
                    })
                    .into_iter()
                    .flatten(),
            )
            .stdin(Stdio::null())
            .stdout(log)
            .stderr(err);
        let child = cmd.spawn().map_err(|source| BenchError::Spawn {
            program: "herd agent".into(),
            source,
        })?;
        self.agents[i] = Some(child);
        Ok(())
    }

    fn start_proxy(&mut self) -> Result<(), BenchError> {
        let gate = Arc::clone(&self.names.torn_down);
        let _gate = open(&gate)?;
        let log = self.log("proxy")?;
        let err = log
            .try_clone()
            .map_err(|e| BenchError::io("opening", &self.path, e))?;
        let child = Command::new(&self.herd)
            .args(["proxy", "--dcs", &self.dcs(), "--cluster", &self.cluster])
            .args(["--listen", &format!("127.0.0.1:{}", self.proxy_port())])
            .arg("--data-dir")
            .arg(self.path.join("proxy"))
            .stdin(Stdio::null())
            .stdout(log)
            .stderr(err)
            .spawn()
            .map_err(|source| BenchError::Spawn {
                program: "herd proxy".into(),
                source,
            })?;
        self.proxy = Some(child);
        Ok(())
    }

    /// The member record agent `i` serves, if it answers.
    pub fn member(&self, i: usize) -> Option<serde_json::Value> {
        herd_testkit::agents::member(&self.api(i), &self.password().ok()?)
    }

    /// Agent `i`'s role, if it answers.
    pub fn role(&self, i: usize) -> Option<String> {
        self.member(i)
            .and_then(|m| m["role"].as_str().map(str::to_string))
    }

    /// In group `g`, a primary and every other member a replica streaming from it: the
    /// primary (an agent index).
    fn whole(&self, g: usize) -> Option<usize> {
        let ks: Vec<usize> = (g * HOSTS..(g + 1) * HOSTS).collect();
        let members: Vec<serde_json::Value> =
            ks.iter().map(|&k| self.member(k)).collect::<Option<_>>()?;
        let p = members.iter().position(|m| m["role"] == "primary")?;
        let leader = self.agent_name(ks[p]);
        members
            .iter()
            .enumerate()
            .all(|(i, m)| {
                i == p || (m["role"] == "replica" && m["streaming_from"] == leader.as_str())
            })
            .then_some(ks[p])
    }

    /// Waits until the cluster is whole; its primary (group 0's when sharded; the agent index
    /// is the host's then).
    pub fn wait_whole(&self) -> Result<usize, BenchError> {
        Ok(self.wait_whole_groups()?[0])
    }

    /// Waits until every group is whole; each group's primary (an agent index).
    pub fn wait_whole_groups(&self) -> Result<Vec<usize>, BenchError> {
        let deadline = Instant::now() + WHOLE_LIMIT;
        loop {
            if let Some(p) = (0..self.groups).map(|g| self.whole(g)).collect() {
                return Ok(p);
            }
            if Instant::now() > deadline {
                return Err(self.failure(&format!(
                    "the cluster was not whole again (a primary, every replica streaming) \
                     within {} s",
                    WHOLE_LIMIT.as_secs()
                )));
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    fn wait_until(
        &self,
        what: &str,
        limit: Duration,
        f: impl Fn(&Self) -> bool,
    ) -> Result<(), BenchError> {
        let deadline = Instant::now() + limit;
        while !f(self) {
            if Instant::now() > deadline {
                return Err(self.failure(&format!("timed out after {limit:?} waiting for {what}")));
            }
            std::thread::sleep(Duration::from_millis(200));
        }
        Ok(())
    }

    /// Power loss of host `i`: every process in its namespace (etcd member, agent, watchdog,
    /// PostgreSQL) gets SIGKILL.
    pub fn kill_host(&mut self, i: usize) {
        let me = std::process::id() as i32;
        for pid in self.lab().pids(i).into_iter().filter(|p| *p != me) {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(pid),
                nix::sys::signal::Signal::SIGKILL,
            );
        }
        for k in (i..self.agents.len()).step_by(HOSTS) {
            if let Some(mut a) = self.agents[k].take() {
                let _ = a.wait();
            }
        }
        self.etcd_mut().kill(i);
    }

    /// Host `i` back after a power loss: its etcd member, then its agents (which restart
    /// their PostgreSQL and rejoin).
    pub fn boot_host(&mut self, i: usize) -> Result<(), BenchError> {
        self.etcd_mut().restart(i);
        for k in (i..self.agents.len()).step_by(HOSTS) {
            self.start_agent(k)?;
        }
        Ok(())
    }

    /// `herd switchover --to` agent `k` (in its group), through the store.
    pub fn switchover(&self, k: usize) -> Result<(), BenchError> {
        let mut cmd = Command::new(&self.herd);
        cmd.args(["switchover", "--to", &self.agent_name(k)]).args([
            "--dcs",
            &self.dcs(),
            "--cluster",
            &self.cluster,
        ]);
        match herd_testkit::output_within(&mut cmd, Duration::from_secs(90)) {
            Some(out) if out.status.success() => Ok(()),
            Some(out) => Err(self.failure(&format!(
                "herd switchover --to {}: {}",
                self.agent_name(k),
                herd_testkit::describe(&out)
            ))),
            None => Err(self.failure("herd switchover did not finish within 90 s")),
        }
    }

    /// The logs' names: every agent's, then the proxy's.
    fn log_names(&self) -> Vec<String> {
        (0..self.agents.len())
            .map(|k| self.agent_name(k))
            .chain(["proxy".to_string()])
            .collect()
    }

    /// The last lines of every agent's and the proxy's log.
    pub fn logs(&self) -> String {
        let names = self.log_names();
        let names: Vec<&str> = names.iter().map(String::as_str).collect();
        herd_testkit::agents::log_tails(&self.path, &names, 30)
    }

    /// A failure with the logs attached.
    pub fn failure(&self, detail: &str) -> BenchError {
        BenchError::Failed {
            what: "herd bench failover --hosts 3".into(),
            status: detail.into(),
            output: self.logs(),
        }
    }

    /// Copies every log next to the report.
    pub fn keep_logs(&self, out: &Path) {
        for name in self.log_names() {
            let from = self.path.join(format!("{name}.log"));
            let _ = std::fs::copy(&from, out.join(format!("hosts-{name}.log")));
        }
    }
}

impl Drop for LabHosts {
    fn drop(&mut self) {
        // The parts must not remove themselves: the teardown removes the lab from its names,
        // and keeps the directories while anything of the lab is left, so that it is reported.
        std::mem::forget(self.lab.take());
        let _ = self.dir.take().map(tempfile::TempDir::keep);
        let etcd = self.etcd.take();
        // Not ours to remove when an interrupt already took the lab over.
        if !self.scratches.claim(&self.path) {
            std::mem::forget(etcd);
            return;
        }
        // The interrupt's teardown, so that both remove the lab the same way: the agents asked
        // to stop together within one bound, then what is left in the hosts or names the lab's
        // directories (etcd, the proxy, PostgreSQL) killed, the namespaces, bridges and
        // directories removed.
        let stopped = lab_teardown::tear_down(&self.names, Instant::now() + TEARDOWN_LIMIT);
        // The children it killed by pid stay zombies until this process waits for them.
        let children = self.proxy.take().into_iter();
        let children = children.chain(self.agents.iter_mut().filter_map(Option::take));
        match &stopped {
            Ok(()) => {
                for mut child in children {
                    let _ = child.kill();
                    let _ = child.wait();
                }
                // Its members are gone (waited for here) and so is its directory.
                drop(etcd);
            }
            Err(e) => {
                // Something may still run, stuck: waiting for it could block without bound.
                for mut child in children {
                    let _ = child.kill();
                    let _ = child.try_wait();
                }
                std::mem::forget(etcd);
                self.scratches.say(&format!(
                    "herd bench: the lab of failover --hosts 3 in {} is not fully removed: {e}\n  \
                     remove it with: {}",
                    self.path.display(),
                    self.names.remove_by_hand()
                ));
            }
        }
        self.scratches.release(&self.path);
    }
}

/// The host agent `k` runs on.
pub fn host_of(k: usize) -> usize {
    k % HOSTS
}

fn copy_dir(from: &Path, to: &Path) -> Result<(), BenchError> {
    std::fs::create_dir_all(to).map_err(|e| BenchError::io("creating", to, e))?;
    let entries = std::fs::read_dir(from).map_err(|e| BenchError::io("reading", from, e))?;
    for entry in entries.flatten() {
        let target = to.join(entry.file_name());
        std::fs::copy(entry.path(), &target).map_err(|e| BenchError::io("writing", &target, e))?;
    }
    Ok(())
}

/// The lab's gate, held for a step that makes something (namespaces, etcd, an agent, the
/// proxy) so an interrupt's teardown waits for the step; refused once the teardown has run,
/// since what the step made would be left.
fn open(gate: &Mutex<bool>) -> Result<std::sync::MutexGuard<'_, bool>, BenchError> {
    // A panicked holder left nothing half-done that the flag describes.
    let held = gate.lock().unwrap_or_else(|e| e.into_inner());
    if *held {
        return Err(BenchError::Interrupted);
    }
    Ok(held)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_gate_refuses_every_step_once_the_lab_is_torn_down() {
        let gate = Mutex::new(false);
        assert!(
            open(&gate).is_ok(),
            "a step before any interrupt goes through"
        );
        // What the interrupt's teardown does under the gate.
        *gate.lock().expect("gate") = true;
        assert!(matches!(open(&gate), Err(BenchError::Interrupted)));
    }
}
