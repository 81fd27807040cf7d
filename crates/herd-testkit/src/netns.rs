//! "Hosts" as Linux network namespaces (root only), for partition tests. Each host has two
//! links, each to its own bridge in the test's (root) namespace:
//!
//! ```text
//!   host i:  eth0 10.<n>.1.(i+1)  ── bridge <p>e ── 10.<n>.1.254 (this process)   store traffic (etcd)
//!            eth1 10.<n>.2.(i+1)  ── bridge <p>p ── 10.<n>.2.254 (this process)   database traffic (PostgreSQL, agent APIs)
//! ```
//!
//! so a host can be cut off entirely (both links down) or asymmetrically: from the store but
//! not its peers, or the reverse. Everything the lab creates is removed when it is dropped
//! (deleting a namespace deletes its links; the bridges are deleted explicitly).

use std::process::Command;

/// The network of a partition test.
pub struct Lab {
    prefix: String,
    subnet: u8,
    hosts: usize,
}

fn ip(args: &[&str]) -> Result<(), String> {
    let out = Command::new("ip")
        .args(args)
        .output()
        .map_err(|e| format!("ip {}: {e}", args.join(" ")))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "ip {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

/// Which of a host's links a fault takes down.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Link {
    /// The store network (etcd).
    Store,
    /// The database network (PostgreSQL, agent APIs, the proxy's traffic).
    Database,
}

impl Lab {
    /// Whether this process may build a lab (root, with `ip netns`).
    pub fn available() -> bool {
        nix::unistd::Uid::effective().is_root()
            && Command::new("ip")
                .args(["netns", "list"])
                .output()
                .is_ok_and(|o| o.status.success())
    }

    /// Builds `hosts` namespaces and both networks; `Err` says why it could not.
    pub fn build(hosts: usize) -> Result<Lab, String> {
        let lab = Lab::planned(hosts);
        lab.create()?;
        Ok(lab)
    }

    /// The lab of `hosts` namespaces this process would build, named but not created yet (so
    /// its names can be recorded first); dropping it removes whatever [`Lab::create`] made.
    pub fn planned(hosts: usize) -> Lab {
        // Short, unique names (interface names are at most 15 bytes).
        let id = std::process::id() % 10_000;
        Lab {
            prefix: format!("hd{id}"),
            subnet: 64 + (id % 128) as u8,
            hosts,
        }
    }

    /// Creates the planned namespaces and both networks (removing leftovers of the same names
    /// first); `Err` says why it could not, with what was made left for `Drop` to remove.
    pub fn create(&self) -> Result<(), String> {
        let lab = self;
        lab.clean();
        for (net, bridge) in [
            (1, lab.bridge(Link::Store)),
            (2, lab.bridge(Link::Database)),
        ] {
            ip(&["link", "add", &bridge, "type", "bridge"])?;
            ip(&[
                "addr",
                "add",
                &format!("10.{}.{net}.254/24", lab.subnet),
                "dev",
                &bridge,
            ])?;
            ip(&["link", "set", &bridge, "up"])?;
        }
        for i in 0..lab.hosts {
            let ns = lab.netns(i);
            ip(&["netns", "add", &ns])?;
            ip(&["-n", &ns, "link", "set", "lo", "up"])?;
            for (net, link) in [(1, Link::Store), (2, Link::Database)] {
                let outside = lab.veth(i, link);
                let inside = format!("eth{}", net - 1);
                ip(&[
                    "link", "add", &outside, "type", "veth", "peer", "name", &inside, "netns", &ns,
                ])?;
                ip(&["link", "set", &outside, "master", &lab.bridge(link)])?;
                ip(&["link", "set", &outside, "up"])?;
                ip(&[
                    "-n",
                    &ns,
                    "addr",
                    "add",
                    &format!("{}/24", lab.host_ip(i, link)),
                    "dev",
                    &inside,
                ])?;
                ip(&["-n", &ns, "link", "set", &inside, "up"])?;
            }
        }
        Ok(())
    }

    fn bridge(&self, link: Link) -> String {
        match link {
            Link::Store => format!("{}e", self.prefix),
            Link::Database => format!("{}p", self.prefix),
        }
    }

    fn veth(&self, host: usize, link: Link) -> String {
        match link {
            Link::Store => format!("{}e{host}", self.prefix),
            Link::Database => format!("{}p{host}", self.prefix),
        }
    }

    /// Every namespace of the lab (deleting one deletes its links).
    pub fn namespaces(&self) -> Vec<String> {
        (0..self.hosts).map(|i| self.netns(i)).collect()
    }

    /// The bridges of the lab (in the namespace that built it).
    pub fn bridges(&self) -> Vec<String> {
        vec![self.bridge(Link::Store), self.bridge(Link::Database)]
    }

    /// The namespace of host `i`.
    pub fn netns(&self, i: usize) -> String {
        format!("{}h{i}", self.prefix)
    }

    /// Host `i`'s address on a network.
    pub fn host_ip(&self, i: usize, link: Link) -> String {
        let net = if link == Link::Store { 1 } else { 2 };
        format!("10.{}.{net}.{}", self.subnet, i + 1)
    }

    /// This process's address on a network (the bridge's side in the namespace that built the
    /// lab): what the hosts reach a service started here at.
    pub fn outside_ip(&self, link: Link) -> String {
        let net = if link == Link::Store { 1 } else { 2 };
        format!("10.{}.{net}.254", self.subnet)
    }

    /// A command that runs `program` inside host `i`.
    pub fn command(&self, i: usize, program: &std::path::Path) -> Command {
        let mut cmd = Command::new("ip");
        cmd.args(["netns", "exec", &self.netns(i)]).arg(program);
        cmd
    }

    /// Takes one of host `i`'s links down (`up == false`) or brings it back.
    pub fn set_link(&self, i: usize, link: Link, up: bool) {
        let state = if up { "up" } else { "down" };
        if let Err(e) = ip(&["link", "set", &self.veth(i, link), state]) {
            panic!("{e}");
        }
    }

    /// Cuts host `i` off (both links down) or heals it.
    pub fn set_host(&self, i: usize, up: bool) {
        self.set_link(i, Link::Store, up);
        self.set_link(i, Link::Database, up);
    }

    /// Every process running inside host `i` (`ip netns pids`), to take the whole host down.
    pub fn pids(&self, i: usize) -> Vec<i32> {
        Command::new("ip")
            .args(["netns", "pids", &self.netns(i)])
            .output()
            .map(|o| {
                String::from_utf8_lossy(&o.stdout)
                    .split_whitespace()
                    .filter_map(|p| p.parse().ok())
                    .collect()
            })
            .unwrap_or_default()
    }

    fn clean(&self) {
        for i in 0..self.hosts {
            let _ = ip(&["netns", "del", &self.netns(i)]);
        }
        let _ = ip(&["link", "del", &self.bridge(Link::Store)]);
        let _ = ip(&["link", "del", &self.bridge(Link::Database)]);
    }
}

impl Drop for Lab {
    fn drop(&mut self) {
        self.clean();
    }
}

/// Moves the calling thread (only it) into network namespace `netns`: its sockets then live
/// inside that host.
pub fn enter(netns: &str) -> Result<(), String> {
    let path = format!("/var/run/netns/{netns}");
    let file = std::fs::File::open(&path).map_err(|e| format!("opening {path}: {e}"))?;
    nix::sched::setns(file, nix::sched::CloneFlags::CLONE_NEWNET)
        .map_err(|e| format!("entering network namespace {netns}: {e}"))
}
