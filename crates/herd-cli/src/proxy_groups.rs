//! What `herd proxy` follows in a multi-host cluster: one assignment per shard group, each read
//! from that group's view of the store (`herd_agent::groups::scoped`), with the switchover hold
//! of every group. A proxy started before the cluster existed learns its groups when group 0's
//! creator records them.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;

use herd_agent::store::StoreClient;
use herd_core::Assignment;
use herd_proxy::ProxyContext;
use tokio::sync::watch;

/// How long `herd proxy` waits for each first read of the store before it serves.
const FIRST_READ: Duration = Duration::from_secs(1);
/// How often a proxy started before its cluster looks for the cluster's groups.
const LEARN_STEP: Duration = Duration::from_millis(300);

/// One group's store and the sender its follower keeps current.
pub struct Follower {
    store: StoreClient,
    tx: watch::Sender<Option<Assignment>>,
}

/// The cluster's shard groups, if it exists and the store answers within a second: how many
/// are recorded, and how many of them the endpoint serves (a group `herd group add --dcs`
/// recorded is served once a proxy admitted it).
pub async fn groups_at_start(root: &StoreClient) -> Option<(u32, u32)> {
    let both = async {
        let count = herd_agent::groups::count(root).await?;
        let served = herd_agent::groups::served(root).await?;
        Ok::<_, String>(count.zip(served))
    };
    match tokio::time::timeout(FIRST_READ, both).await {
        Ok(Ok(groups)) => groups,
        _ => None,
    }
}

/// Group `group`'s store, read once (bounded) so a proxy started under a running cluster
/// routes from its first poll: the receiver for the proxy and the follower to spawn.
pub async fn group(
    root: &StoreClient,
    group: u32,
) -> (watch::Receiver<Option<Assignment>>, Follower) {
    let store = StoreClient::new(herd_agent::groups::scoped(root.dcs(), group));
    let first = match tokio::time::timeout(FIRST_READ, store.read()).await {
        Ok(Ok(read)) => herd_agent::follow::assignment(&read.store, None),
        _ => None,
    };
    let (tx, rx) = watch::channel(first);
    (rx, Follower { store, tx })
}

/// Holds new work while any group's switchover is pending (each group's follower turns its
/// own hold on and off; the proxy pauses while at least one is on).
pub struct Holds {
    ctx: Arc<ProxyContext>,
    on: AtomicU32,
}

impl Holds {
    /// Holds for the proxy of `ctx`.
    pub fn new(ctx: Arc<ProxyContext>) -> Arc<Holds> {
        Arc::new(Holds {
            ctx,
            on: AtomicU32::new(0),
        })
    }

    fn gate(self: &Arc<Self>) -> herd_agent::follow::HoldGate {
        let holds = self.clone();
        Box::new(move |on| {
            let now = if on {
                holds.on.fetch_add(1, Ordering::SeqCst) + 1
            } else {
                holds
                    .on
                    .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
                    .map_or(0, |n| n - 1)
            };
            holds.ctx.set_paused(now > 0);
        })
    }
}

/// Follows `follower`'s group until `shutdown`.
pub fn spawn(follower: Follower, holds: &Arc<Holds>, shutdown: watch::Receiver<bool>) {
    tokio::spawn(herd_agent::follow::follow(
        follower.store,
        follower.tx,
        Some(holds.gate()),
        shutdown,
    ));
}

/// For a proxy started before its cluster existed (serving group 0 alone): waits until group
/// 0's creator records the groups, then follows and serves the others. Group 0's creator
/// records them before its initdb, so no member leads yet and nothing was written through this
/// proxy; if group 0 already had a leader when the groups are first seen, the proxy cannot know
/// that the groups hold the same databases and roles, and says so (`Err`) instead of serving.
pub async fn learn(
    root: StoreClient,
    ctx: Arc<ProxyContext>,
    group0: watch::Receiver<Option<Assignment>>,
    holds: Arc<Holds>,
    mut shutdown: watch::Receiver<bool>,
) -> Result<(), String> {
    loop {
        let led_before = group0.borrow().is_some();
        // The groups served (a group being added across hosts is admitted later, through
        // `POST /groups`, and followed then).
        match herd_agent::groups::served(&root).await {
            Ok(Some(1)) => return Ok(()),
            Ok(Some(n)) if led_before => {
                return Err(format!(
                    "this cluster has {n} shard groups, but herd proxy started before it was created and \
                     served group 0 alone meanwhile; restart herd proxy (it reads the groups when it starts)"
                ))
            }
            Ok(Some(n)) => {
                for g in 1..n {
                    let (rx, follower) = group(&root, g).await;
                    ctx.add_group(rx, shutdown.clone());
                    spawn(follower, &holds, shutdown.clone());
                }
                ctx.serve_groups_created_with_the_cluster();
                tracing::info!("serving the cluster's {n} shard groups");
                return Ok(());
            }
            Ok(None) => {}
            Err(e) => tracing::debug!("cannot read the cluster's groups yet: {e}"),
        }
        tokio::select! {
            _ = tokio::time::sleep(LEARN_STEP) => {}
            _ = shutdown.changed() => return Ok(()),
        }
    }
}

/// Serves the shard groups another proxy admitted (`proxy_registry::GroupServer`): follows
/// each one this proxy does not follow yet, then counts them.
pub struct Admitted {
    root: StoreClient,
    ctx: Arc<ProxyContext>,
    holds: Arc<Holds>,
    shutdown: watch::Receiver<bool>,
    /// One catch-up at a time (a group is followed once).
    one_at_a_time: tokio::sync::Mutex<()>,
}

impl Admitted {
    /// For the proxy of `ctx`.
    pub fn new(
        root: StoreClient,
        ctx: Arc<ProxyContext>,
        holds: Arc<Holds>,
        shutdown: watch::Receiver<bool>,
    ) -> Arc<Admitted> {
        Arc::new(Admitted {
            root,
            ctx,
            holds,
            shutdown,
            one_at_a_time: tokio::sync::Mutex::new(()),
        })
    }
}

impl crate::proxy_registry::GroupServer for Admitted {
    fn served(&self) -> u32 {
        self.ctx.groups()
    }

    fn serve(
        &self,
        groups: u32,
    ) -> std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send + '_>> {
        Box::pin(async move {
            let _one = self.one_at_a_time.lock().await;
            for g in self.ctx.known_groups()..groups {
                let (rx, follower) = group(&self.root, g).await;
                self.ctx.add_group(rx, self.shutdown.clone());
                spawn(follower, &self.holds, self.shutdown.clone());
            }
            self.ctx.serve_admitted_groups(groups);
            tracing::info!("serving {} shard groups", self.ctx.groups());
        })
    }
}
