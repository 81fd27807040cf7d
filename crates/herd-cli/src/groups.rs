//! Wiring of the shard groups inside `herd up`: one supervisor per group (each with its own
//! store, status, roles and operator commands), their statuses combined into the one document
//! the API serves.

use std::sync::{Arc, Mutex};

use herd_cluster::{Cluster, Command};
use herd_core::{Assignment, ClusterStatus};
use herd_pg::Pg;
use tokio::sync::{mpsc, watch};

/// The channels between the groups' supervisors and the rest of the process.
pub struct GroupLinks {
    /// Each group's roles, for the proxy (index = group).
    pub assignments: Vec<watch::Sender<Assignment>>,
    /// Operator commands to each group's supervisor (index = group).
    pub commands: Vec<mpsc::Sender<Command>>,
    receivers: Vec<mpsc::Receiver<Command>>,
    statuses: Vec<watch::Sender<ClusterStatus>>,
    combined: Arc<watch::Sender<ClusterStatus>>,
    /// The logical copies' latest status, carried into every combined status.
    pub copies: crate::copies_task::SharedCopies,
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
        let (mut commands, mut receivers) = (Vec::new(), Vec::new());
        for _ in groups {
            let (tx, rx) = mpsc::channel(4);
            commands.push(tx);
            receivers.push(rx);
        }
        GroupLinks {
            assignments: groups
                .iter()
                .map(|g| watch::channel(g.assignment()).0)
                .collect(),
            commands,
            receivers,
            statuses: firsts.into_iter().map(|s| watch::channel(s).0).collect(),
            combined: Arc::new(combined),
            copies: Arc::default(),
        }
    }

    /// Republishes the combined status with the copies' latest status.
    pub fn publisher(&self) -> Arc<dyn Fn() + Send + Sync> {
        let combined = self.combined.clone();
        let copies = self.copies.clone();
        Arc::new(move || {
            let latest = copies.lock().map(|c| c.clone()).unwrap_or_default();
            combined.send_modify(|s| s.copies = latest);
        })
    }

    /// Starts one supervisor per group and the task that combines their statuses; returns the
    /// supervisors' handles (they end when `shutdown` turns true).
    pub fn spawn(
        self,
        groups: &[Cluster],
        pg: &Pg,
        proxy: &Arc<herd_proxy::ProxyContext>,
        events: &herd_core::EventSink,
        shutdown: &watch::Receiver<bool>,
    ) -> Vec<tokio::task::JoinHandle<()>> {
        let latest = Arc::new(Mutex::new(
            self.statuses
                .iter()
                .map(|s| s.borrow().clone())
                .collect::<Vec<_>>(),
        ));
        let mut handles = Vec::new();
        let parts = self
            .receivers
            .into_iter()
            .zip(self.statuses)
            .zip(self.assignments);
        for (g, ((commands, status), assignment)) in parts.enumerate() {
            let combined = self.combined.clone();
            let copies = self.copies.clone();
            let latest = latest.clone();
            let mut rx = status.subscribe();
            let mut stop = shutdown.clone();
            tokio::spawn(async move {
                loop {
                    tokio::select! {
                        changed = rx.changed() => if changed.is_err() { return },
                        _ = stop.changed() => return,
                    }
                    let all = {
                        let mut latest = latest.lock().unwrap_or_else(|e| e.into_inner());
                        latest[g] = rx.borrow_and_update().clone();
                        latest.clone()
                    };
                    if let Some(mut s) = herd_cluster::combine(all) {
                        s.copies = copies.lock().map(|c| c.clone()).unwrap_or_default();
                        let _ = combined.send(s);
                    }
                }
            });
            handles.push(spawn_supervisor(
                groups[g].clone(),
                pg.clone(),
                proxy,
                Channels {
                    status,
                    assignment,
                    commands,
                    events: events.clone(),
                    shutdown: shutdown.clone(),
                },
            ));
        }
        handles
    }
}

/// One supervisor's ends of the channels.
struct Channels {
    status: watch::Sender<ClusterStatus>,
    assignment: watch::Sender<Assignment>,
    commands: mpsc::Receiver<Command>,
    events: herd_core::EventSink,
    shutdown: watch::Receiver<bool>,
}

fn spawn_supervisor(
    cluster: Cluster,
    pg: Pg,
    proxy: &Arc<herd_proxy::ProxyContext>,
    channels: Channels,
) -> tokio::task::JoinHandle<()> {
    let Channels {
        status,
        assignment,
        commands,
        events,
        shutdown,
    } = channels;
    let group = cluster.group().to_string();
    let count_ctx = proxy.clone();
    let count: Arc<dyn Fn(&str) + Send + Sync> = Arc::new(move |kind| {
        count_ctx.metrics.inc_labels(
            "herd_ha_decisions_total",
            &[("group", group.as_str()), ("action", kind)],
        )
    });
    let gate_ctx = proxy.clone();
    // A switchover in any group pauses new transactions at the one endpoint for its moment.
    let gate: herd_cluster::Gate = Arc::new(move |paused| gate_ctx.set_paused(paused));
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
