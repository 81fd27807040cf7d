//! The [`ProxyContext`]'s views of each group's topology, the pause of new work, and the
//! choice of the servers a write or a login goes to.

use std::sync::Arc;
use std::time::{Duration, Instant};

use herd_core::NodeName;
use tokio::sync::watch;

use crate::topology::{Assignment, Endpoint, TopologyView};
use crate::{feed, monitor};
use crate::{
    lag_limits, no_leader_yet, ProxyContext, ProxyError, LOGIN_PRIMARY_WAIT, PAUSE_LIMIT,
    PRIMARY_WAIT,
};

impl ProxyContext {
    /// The latest topology of shard group 0, minus replicas that just failed a read.
    pub fn view(&self) -> Arc<TopologyView> {
        self.view_of(0)
    }

    /// How many shard groups the proxy serves.
    pub fn groups(&self) -> u32 {
        self.visible.load(std::sync::atomic::Ordering::Acquire)
    }

    /// Group `group`'s topology receiver (group 0's for an unknown group), counting groups
    /// still being added.
    pub(crate) fn view_rx(&self, group: u32) -> watch::Receiver<Arc<TopologyView>> {
        let views = self.views.read().unwrap_or_else(|e| e.into_inner());
        views
            .get(group as usize)
            .or_else(|| views.first())
            .map_or_else(|| feed::GroupFeed::empty().view, |f| f.view.clone())
    }

    /// Group `group`'s topology now (group 0's for an unknown group).
    pub(crate) fn latest_view(&self, group: u32) -> Arc<TopologyView> {
        let views = self.views.read().unwrap_or_else(|e| e.into_inner());
        views
            .get(group as usize)
            .or_else(|| views.first())
            .map(|f| f.view.borrow().clone())
            .unwrap_or_default()
    }

    /// Starts following a shard group added while the proxy runs (its roles in `assignment`);
    /// its number. Sessions do not use it until [`ProxyContext::admit_group`] made it hold what
    /// every group shares.
    pub fn add_group<A>(
        &self,
        assignment: watch::Receiver<A>,
        shutdown: watch::Receiver<bool>,
    ) -> u32
    where
        A: Clone + Into<Option<Assignment>> + Send + Sync + 'static,
    {
        let (views_tx, views_rx) = watch::channel(Arc::new(TopologyView::default()));
        tokio::spawn(monitor::run(
            assignment,
            self.admin.clone(),
            Duration::from_millis(self.config.poll_interval_ms),
            lag_limits(&self.config),
            views_tx,
            shutdown,
        ));
        let feed = feed::GroupFeed::follow(views_rx);
        let mut views = self.views.write().unwrap_or_else(|e| e.into_inner());
        views.push(feed);
        views.len() as u32 - 1
    }

    /// Serves every group followed, without [`ProxyContext::admit_group`]'s copying: only for
    /// groups created together with the cluster (a multi-host proxy started before the cluster
    /// existed learns its groups once group 0's creator records them, before any member leads,
    /// so no group holds anything the others lack).
    pub fn serve_groups_created_with_the_cluster(&self) {
        self.visible
            .store(self.known_groups(), std::sync::atomic::Ordering::Release);
    }

    /// How many groups the proxy follows, counting those still being added.
    pub fn known_groups(&self) -> u32 {
        self.views.read().map_or(1, |v| v.len() as u32)
    }

    /// Group `group`'s topology as it changes (marked seen: `changed()` waits for the next).
    pub fn watch_view(&self, group: u32) -> watch::Receiver<Arc<TopologyView>> {
        let mut rx = self.view_rx(group);
        rx.mark_unchanged();
        rx
    }

    /// The bell rung when group `group`'s primary changes.
    pub(crate) fn primary_bell(&self, group: u32) -> Arc<feed::PrimaryBell> {
        let views = self.views.read().unwrap_or_else(|e| e.into_inner());
        views
            .get(group as usize)
            .or_else(|| views.first())
            .map_or_else(|| feed::GroupFeed::empty().bell, |f| f.bell.clone())
    }

    /// Group `group`'s topology now, without the nodes to avoid for a while.
    pub fn view_of(&self, group: u32) -> Arc<TopologyView> {
        let view = self.latest_view(group);
        let avoided = match self.avoided.lock() {
            Ok(a) if a.is_empty() => return view,
            Ok(mut a) => {
                a.retain(|_, until| *until > Instant::now());
                a.keys().cloned().collect::<Vec<_>>()
            }
            Err(_) => Vec::new(),
        };
        if avoided.is_empty() {
            return view;
        }
        let mut v = (*view).clone();
        for r in &mut v.replicas {
            if avoided.contains(&r.endpoint.name) {
                r.healthy = false;
            }
        }
        Arc::new(v)
    }

    /// Pauses (`true`) or resumes new units of work, e.g. during a switchover. Work already on a
    /// server goes on.
    pub fn set_paused(&self, paused: bool) {
        self.paused.send_replace(paused);
    }

    /// New units of work are paused now.
    pub fn is_paused(&self) -> bool {
        *self.paused.borrow()
    }

    /// Waits while the proxy is paused (at most `PAUSE_LIMIT`, then work goes on regardless).
    pub async fn wait_unpaused(&self) {
        if !self.is_paused() {
            return; // the usual case, without a receiver of its own
        }
        let mut rx = self.paused.subscribe();
        if !*rx.borrow_and_update() {
            return;
        }
        let _ = tokio::time::timeout(PAUSE_LIMIT, rx.wait_for(|p| !*p)).await;
    }

    /// Keeps reads away from `node` for `how_long`.
    pub fn avoid(&self, node: &NodeName, how_long: Duration) {
        if let Ok(mut a) = self.avoided.lock() {
            a.insert(node.clone(), Instant::now() + how_long);
        }
    }

    /// Group 0's primary, waiting a little for one to appear (restart, failover).
    pub async fn current_primary(&self) -> Result<Endpoint, ProxyError> {
        self.current_primary_of(0).await
    }

    /// Shard group `group`'s primary, waiting a little for one to appear (restart, failover);
    /// at once an error while no member has ever led the group (nothing to wait for yet: an
    /// election takes seconds, longer than a client's connect timeout).
    pub async fn current_primary_of(&self, group: u32) -> Result<Endpoint, ProxyError> {
        let mut views = self.view_rx(group);
        let wait = async {
            loop {
                {
                    let view = views.borrow_and_update();
                    if let Some(p) = view.primary.clone() {
                        return Some(Ok(p));
                    }
                    if view.electing {
                        return Some(Err(no_leader_yet(group)));
                    }
                    if let Some(why) = &view.tls_error {
                        return Some(Err(ProxyError::ServerTls(why.clone())));
                    }
                }
                if views.changed().await.is_err() {
                    return None;
                }
            }
        };
        match tokio::time::timeout(PRIMARY_WAIT, wait).await {
            Ok(Some(found)) => found,
            _ => Err(ProxyError::Unavailable(format!(
                "no primary is available{} (waited {} s); retry shortly",
                if self.known_groups() > 1 {
                    format!(" in shard group {group}")
                } else {
                    String::new()
                },
                PRIMARY_WAIT.as_secs()
            ))),
        }
    }

    /// Where a login's password can be checked: group 0's primary first (waited for up to
    /// [`LOGIN_PRIMARY_WAIT`]: the proxy's first read of the store and first poll, a restart),
    /// then the replicas that answered the last poll. Empty when no server answers; an error
    /// after that wait while no member has ever led (a `herd proxy` started before its agents
    /// elected one).
    pub async fn login_servers(&self) -> Result<Vec<Endpoint>, ProxyError> {
        let mut views = self.view_rx(0);
        let wait = async {
            loop {
                if views.borrow_and_update().primary.is_some() {
                    return;
                }
                if views.changed().await.is_err() {
                    return;
                }
            }
        };
        let _ = tokio::time::timeout(LOGIN_PRIMARY_WAIT, wait).await;
        let view = self.view_of(0);
        if view.electing {
            return Err(no_leader_yet(0));
        }
        let mut servers: Vec<Endpoint> = view.primary.iter().cloned().collect();
        servers.extend(
            view.replicas
                .iter()
                .filter(|r| r.healthy)
                .map(|r| r.endpoint.clone()),
        );
        if let (true, Some(why)) = (servers.is_empty(), &view.tls_error) {
            return Err(ProxyError::ServerTls(why.clone()));
        }
        Ok(servers)
    }
}
