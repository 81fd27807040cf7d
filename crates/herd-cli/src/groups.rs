//! Wiring of the shard groups inside `herd up`: one supervisor per group (each with its own
//! store, status, roles and operator commands), their statuses combined into the one document
//! the API serves. The set grows when `herd group add` adds a group while the cluster runs.

use std::sync::{Arc, Mutex, OnceLock};

use herd_cluster::{Cluster, Command};
use herd_core::{Assignment, ClusterStatus};
use herd_pg::Pg;
use tokio::sync::{mpsc, watch};

/// The channels between the groups' supervisors and the rest of the process, before the
/// supervisors start.
pub struct GroupLinks {
    /// Each group's roles, for the proxy (index = group).
    pub assignments: Vec<watch::Sender<Assignment>>,
    receivers: Vec<mpsc::Receiver<Command>>,
    statuses: Vec<watch::Sender<ClusterStatus>>,
    /// The running groups (shared with the API, the copies' task and shutdown).
    pub set: Arc<GroupSet>,
}

/// The running shard groups.
pub struct GroupSet {
    groups: Mutex<Vec<Running>>,
    /// Each group's latest status (index = group), combined into one document.
    latest: Mutex<Vec<ClusterStatus>>,
    combined: watch::Sender<ClusterStatus>,
    /// The logical copies' latest status, carried into every combined status.
    pub copies: crate::copies_task::SharedCopies,
    handles: Mutex<Vec<tokio::task::JoinHandle<()>>>,
    /// What starting a supervisor needs; set when the first supervisors start.
    runtime: OnceLock<Runtime>,
    /// One `herd group add` at a time.
    pub adding: tokio::sync::Mutex<()>,
}

/// A running group's cluster and the way to its supervisor.
#[derive(Clone)]
pub struct Running {
    /// Ports, data directories, credentials.
    pub cluster: Cluster,
    /// Operator commands to its supervisor.
    pub commands: mpsc::Sender<Command>,
}

/// Shared by every group's supervisor.
pub struct Runtime {
    /// PostgreSQL's programs.
    pub pg: Pg,
    /// The endpoint.
    pub proxy: Arc<herd_proxy::ProxyContext>,
    events: herd_core::EventSink,
    /// Turns true when the cluster stops.
    pub shutdown: watch::Receiver<bool>,
}

impl GroupLinks {
    /// Channels for `groups`, starting from the first observation `first` (group 0 at the top,
    /// the others in `groups`); `combined` receives every later combined status.
    pub fn new(
        groups: &[Cluster],
        first: &ClusterStatus,
        combined: watch::Sender<ClusterStatus>,
    ) -> GroupLinks {
        let mut top = first.clone();
        top.groups.clear();
        let firsts: Vec<ClusterStatus> = std::iter::once(top)
            .chain(first.groups.iter().cloned())
            .collect();
        let (mut running, mut receivers) = (Vec::new(), Vec::new());
        for cluster in groups {
            let (tx, rx) = mpsc::channel(4);
            running.push(Running {
                cluster: cluster.clone(),
                commands: tx,
            });
            receivers.push(rx);
        }
        GroupLinks {
            assignments: groups
                .iter()
                .map(|g| watch::channel(g.assignment()).0)
                .collect(),
            receivers,
            statuses: firsts.iter().map(|s| watch::channel(s.clone()).0).collect(),
            set: Arc::new(GroupSet {
                groups: Mutex::new(running),
                latest: Mutex::new(firsts),
                combined,
                copies: Arc::default(),
                handles: Mutex::default(),
                runtime: OnceLock::new(),
                adding: tokio::sync::Mutex::default(),
            }),
        }
    }

    /// Starts one supervisor per group and the tasks that combine their statuses (they end
    /// when `runtime.shutdown` turns true).
    pub fn spawn(self, runtime: Runtime) {
        let set = self.set;
        let parts = self
            .receivers
            .into_iter()
            .zip(self.statuses)
            .zip(self.assignments);
        let _ = set.runtime.set(runtime);
        for (g, ((commands, status), assignment)) in parts.enumerate() {
            set.start(g, status, assignment, commands);
        }
    }
}

impl Runtime {
    /// What every group's supervisor shares.
    pub fn new(
        pg: &Pg,
        proxy: &Arc<herd_proxy::ProxyContext>,
        events: &herd_core::EventSink,
        shutdown: &watch::Receiver<bool>,
    ) -> Runtime {
        Runtime {
            pg: pg.clone(),
            proxy: proxy.clone(),
            events: events.clone(),
            shutdown: shutdown.clone(),
        }
    }
}

impl GroupSet {
    /// The running groups now (index = group).
    pub fn running(&self) -> Vec<Running> {
        self.groups.lock().map(|g| g.clone()).unwrap_or_default()
    }

    /// The running groups' clusters (index = group).
    pub fn clusters(&self) -> Vec<Cluster> {
        self.running().into_iter().map(|r| r.cluster).collect()
    }

    /// The operator-command channels of the running groups (index = group).
    pub fn commands(&self) -> Vec<mpsc::Sender<Command>> {
        self.running().into_iter().map(|r| r.commands).collect()
    }

    /// What starting a supervisor needs (once the first supervisors started).
    pub fn runtime(&self) -> Option<&Runtime> {
        self.runtime.get()
    }

    /// Puts an event on the dashboard's timeline.
    pub fn event(&self, event: herd_core::ClusterEvent) {
        if let Some(r) = self.runtime.get() {
            (r.events)(event);
        }
    }

    /// Republishes the combined status with the copies' latest status.
    pub fn publisher(self: &Arc<Self>) -> Arc<dyn Fn() + Send + Sync> {
        let set = self.clone();
        Arc::new(move || {
            let latest = set.copies.lock().map(|c| c.clone()).unwrap_or_default();
            set.combined.send_modify(|s| s.copies = latest);
        })
    }

    /// Adds a group whose servers run (started by the caller), first observed as `first`:
    /// its supervisor starts and the endpoint follows it (without serving it yet:
    /// `ProxyContext::admit_group` does that). Its number.
    pub fn add(self: &Arc<Self>, cluster: Cluster, first: ClusterStatus) -> Option<u32> {
        let runtime = self.runtime.get()?;
        let (tx, rx) = mpsc::channel(4);
        let assignment = watch::channel(cluster.assignment()).0;
        let status = watch::channel(first.clone()).0;
        let g = {
            let mut groups = self.groups.lock().unwrap_or_else(|e| e.into_inner());
            groups.push(Running {
                cluster,
                commands: tx,
            });
            groups.len() - 1
        };
        self.latest
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(first);
        let proxy_group = runtime
            .proxy
            .add_group(assignment.subscribe(), runtime.shutdown.clone());
        debug_assert_eq!(proxy_group as usize, g);
        self.start(g, status, assignment, rx);
        Some(g as u32)
    }

    /// Starts group `g`'s supervisor and the task that combines its status with the others'.
    fn start(
        self: &Arc<Self>,
        g: usize,
        status: watch::Sender<ClusterStatus>,
        assignment: watch::Sender<Assignment>,
        commands: mpsc::Receiver<Command>,
    ) {
        let Some(runtime) = self.runtime.get() else {
            return;
        };
        let Some(cluster) = self.running().get(g).map(|r| r.cluster.clone()) else {
            return;
        };
        let set = self.clone();
        let mut rx = status.subscribe();
        let mut stop = runtime.shutdown.clone();
        let combiner = tokio::spawn(async move {
            loop {
                tokio::select! {
                    changed = rx.changed() => if changed.is_err() { return },
                    _ = stop.changed() => return,
                }
                let all = {
                    let mut latest = set.latest.lock().unwrap_or_else(|e| e.into_inner());
                    if let Some(slot) = latest.get_mut(g) {
                        *slot = rx.borrow_and_update().clone();
                    }
                    latest.clone()
                };
                if let Some(mut s) = herd_cluster::combine(all) {
                    s.copies = set.copies.lock().map(|c| c.clone()).unwrap_or_default();
                    let _ = set.combined.send(s);
                }
            }
        });
        let supervisor = spawn_supervisor(
            cluster,
            runtime,
            Channels {
                status,
                assignment,
                commands,
            },
        );
        if let Ok(mut h) = self.handles.lock() {
            h.push(combiner);
            h.push(supervisor);
        }
    }

    /// Waits for every supervisor (and status task) to end.
    pub async fn join(&self) {
        let handles = self
            .handles
            .lock()
            .map(|mut h| std::mem::take(&mut *h))
            .unwrap_or_default();
        for h in handles {
            let _ = h.await;
        }
    }
}

/// One supervisor's ends of the channels.
struct Channels {
    status: watch::Sender<ClusterStatus>,
    assignment: watch::Sender<Assignment>,
    commands: mpsc::Receiver<Command>,
}

fn spawn_supervisor(
    cluster: Cluster,
    runtime: &Runtime,
    channels: Channels,
) -> tokio::task::JoinHandle<()> {
    let Channels {
        status,
        assignment,
        commands,
    } = channels;
    let group = cluster.group().to_string();
    let count_ctx = runtime.proxy.clone();
    let count: Arc<dyn Fn(&str) + Send + Sync> = Arc::new(move |kind| {
        count_ctx.metrics.inc_labels(
            "herd_ha_decisions_total",
            &[("group", group.as_str()), ("action", kind)],
        )
    });
    let gate_ctx = runtime.proxy.clone();
    // A switchover in any group pauses new transactions at the one endpoint for its moment.
    let gate: herd_cluster::Gate = Arc::new(move |paused| gate_ctx.set_paused(paused));
    let (pg, events, shutdown) = (
        runtime.pg.clone(),
        runtime.events.clone(),
        runtime.shutdown.clone(),
    );
    tokio::spawn(async move {
        // Embedded mode: one supervisor process, so each group's store lives in its memory.
        let dcs = herd_dcs::MemoryDcs::default();
        if let Err(e) = cluster.state.record(&dcs) {
            tracing::warn!("recording the topology failed: {e}");
        }
        let links = herd_cluster::Links {
            status: &status,
            assignment: &assignment,
            dcs: &dcs,
            commands,
            gate,
            shutdown,
            count,
            events,
        };
        herd_cluster::supervise(cluster, &pg, links).await
    })
}
