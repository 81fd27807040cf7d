//! `POST /groups` on a multi-host `herd proxy`: admits the next shard group that `herd group
//! add --dcs` recorded in the store and whose agents lead. The proxy follows the group (it may
//! have started before the group was recorded), waits (bounded) until it reaches the group's
//! primary, then admits it as `herd up` does (`ProxyContext::admit_group`: roles, databases,
//! tables, reference rows, map). Admission changes the shard maps, so it goes through the
//! proxy's `MapGate` (`proxy_registry.rs`): the other proxies hold meanwhile, and the gate
//! records the admission in the store (`herd_agent::groups::record_admitted`) and waits until
//! they serve the group before the hold ends; proxies started from then on serve it at once.
//! The record here again after admission only finishes one whose record failed before.

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use herd_agent::store::StoreClient;
use herd_core::{ClusterEvent, EventKind};
use herd_proxy::ProxyContext;
use tokio::sync::watch;

use crate::proxy_api::AddGroup;
use crate::proxy_groups::Holds;

/// How long admission waits for this proxy to reach the new group's primary.
const PRIMARY_WAIT: Duration = Duration::from_secs(30);
/// Attempts at recording the admission in the store.
const RECORD_TRIES: u32 = 5;

/// What admitting a group needs from the running proxy.
struct Proxy {
    root: StoreClient,
    ctx: Arc<ProxyContext>,
    holds: Arc<Holds>,
    shutdown: watch::Receiver<bool>,
    one_at_a_time: tokio::sync::Mutex<()>,
}

/// The proxy API's `POST /groups` for a multi-host proxy.
pub fn adder(
    root: StoreClient,
    ctx: Arc<ProxyContext>,
    holds: Arc<Holds>,
    shutdown: watch::Receiver<bool>,
) -> AddGroup {
    let proxy = Arc::new(Proxy {
        root,
        ctx,
        holds,
        shutdown,
        one_at_a_time: tokio::sync::Mutex::new(()),
    });
    Arc::new(move || {
        let proxy = proxy.clone();
        Box::pin(async move { proxy.admit_next().await.map_err(|e| format!("{e:#}")) })
    })
}

impl Proxy {
    async fn admit_next(&self) -> anyhow::Result<String> {
        let _one = self.one_at_a_time.lock().await;
        let g = self.ctx.groups();
        let recorded = herd_agent::groups::count(&self.root)
            .await
            .map_err(anyhow::Error::msg)
            .context("reading the cluster's shard groups")?
            .unwrap_or(1);
        let served = herd_agent::groups::served(&self.root)
            .await
            .map_err(anyhow::Error::msg)?
            .unwrap_or(1);
        if g >= recorded && served < g {
            // Admitted here before, but the record failed then.
            self.record(g - 1).await?;
            return Ok(format!(
                "shard group {} was admitted by this proxy before; recorded in the store now",
                g - 1
            ));
        }
        if g >= recorded {
            bail!(
                "this proxy serves all {recorded} shard group(s) recorded in the store; `herd group \
                 add --dcs URL --cluster NAME` records the next one and asks a proxy to admit it \
                 once its agents lead"
            );
        }
        if self.ctx.known_groups() <= g {
            // Recorded after this proxy started: follow it from now on.
            let (rx, follower) = crate::proxy_groups::group(&self.root, g).await;
            self.ctx.add_group(rx, self.shutdown.clone());
            crate::proxy_groups::spawn(follower, &self.holds, self.shutdown.clone());
        }
        let deadline = Instant::now() + PRIMARY_WAIT;
        while self.ctx.view_of(g).primary.is_none() {
            if Instant::now() >= deadline {
                bail!(
                    "shard group {g} has no primary this proxy reaches (waited {} s): start its \
                     agents (`herd agent --group {g} ...`) and try again",
                    PRIMARY_WAIT.as_secs()
                );
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        let outcome = self.ctx.admit_group(g).await.with_context(|| {
            format!(
                "shard group {g} runs but the endpoint does not use it yet: run `herd group \
                     add --dcs ...` again to finish"
            )
        });
        let store = StoreClient::new(herd_agent::groups::scoped(self.root.dcs(), g));
        let text = match &outcome {
            Ok(_) => format!("shard group {g} added"),
            Err(e) => format!("adding a shard group failed: {e:#}"),
        };
        let event = ClusterEvent::now(g, EventKind::GroupAdded, None, text, outcome.is_ok());
        herd_agent::events::record(&store, "herd-proxy", event);
        let admitted = outcome?;
        self.record(g).await?;
        Ok(crate::group_add::summary(g, None, &admitted))
    }

    /// Records the admission, retried: a proxy started later reads it to serve the group.
    async fn record(&self, g: u32) -> anyhow::Result<()> {
        let mut last = String::new();
        for _ in 0..RECORD_TRIES {
            let dcs = self.root.dcs();
            match tokio::task::spawn_blocking(move || herd_agent::groups::record_admitted(&dcs, g))
                .await
            {
                Ok(Ok(())) => return Ok(()),
                Ok(Err(e)) => last = e,
                Err(e) => last = e.to_string(),
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
        bail!(
            "shard group {g} was admitted by this proxy, but recording it in the store failed \
             ({last}); proxies started later do not serve it until `herd group add --dcs ...` is \
             run again (it records it)"
        )
    }
}
