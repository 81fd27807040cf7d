//! The cluster-wide singleton: work that must happen once per cluster (today the resolution
//! of two-phase work left in doubt) is done by the one agent holding the lease
//! [`COORDINATOR`] at the store's root, whichever group it serves, and moves to another agent
//! within a TTL when that one dies.
//!
//! The work is run in rounds, each bounded well inside the lease's TTL, and only while the
//! lease is held. A holder frozen past its TTL can overlap with the next holder for one round,
//! so every task run here must be idempotent (the in-doubt verdict is read from group 0's
//! decision row, the same for both).

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use herd_dcs::Dcs;
use tokio::sync::watch;

/// The lease's name (key `leases/coordinator` at the root).
pub const COORDINATOR: &str = "coordinator";

/// Who coordinates, and how often.
#[derive(Clone, Debug)]
pub struct Coordinator {
    /// This agent's member name (the lease's holder value).
    pub me: String,
    /// The lease's time to live.
    pub ttl: Duration,
    /// How long between rounds of work while the lease is held.
    pub every: Duration,
    /// Told whether the lease is held (after each renewal): long work started by a round
    /// (a shard move) stops when it is lost.
    pub held: Option<Arc<watch::Sender<bool>>>,
}

impl Coordinator {
    /// Takes or renews the lease; `false` when another agent holds it or the store failed.
    async fn hold(&self, dcs: &Arc<dyn Dcs>) -> bool {
        let (dcs, me, ttl) = (dcs.clone(), self.me.clone(), self.ttl);
        let held =
            tokio::task::spawn_blocking(move || dcs.acquire_lease(COORDINATOR, &me, ttl)).await;
        matches!(held, Ok(Ok(true)))
    }

    /// Until `shutdown`: renews the lease every third of its TTL and, while held, runs
    /// `round` every [`Coordinator::every`], each round cut at half the TTL so that work never
    /// outlives the lease it started under. Gives the lease up on shutdown.
    pub async fn run<F, Fut>(
        self,
        dcs: Arc<dyn Dcs>,
        mut round: F,
        mut shutdown: watch::Receiver<bool>,
    ) where
        F: FnMut() -> Fut,
        Fut: Future<Output = ()>,
    {
        let renew = self.ttl / 3;
        let mut held = false;
        let mut last_round: Option<tokio::time::Instant> = None;
        loop {
            let now_held = self.hold(&dcs).await;
            if now_held != held {
                if now_held {
                    tracing::info!(
                        "{} coordinates the cluster (in-doubt resolution, shard moves)",
                        self.me
                    );
                } else {
                    tracing::info!("{} no longer coordinates the cluster", self.me);
                }
                held = now_held;
            }
            if let Some(tx) = &self.held {
                tx.send_if_modified(|h| std::mem::replace(h, now_held) != now_held);
            }
            let due = last_round.is_none_or(|t| t.elapsed() >= self.every);
            if held && due {
                last_round = Some(tokio::time::Instant::now());
                if tokio::time::timeout(self.ttl / 2, round()).await.is_err() {
                    tracing::warn!("a coordinator round outlasted half the lease; cut short");
                }
            }
            tokio::select! {
                _ = tokio::time::sleep(renew) => {}
                _ = shutdown.changed() => break,
            }
        }
        if let Some(tx) = &self.held {
            tx.send_replace(false);
        }
        if held {
            let (dcs, me) = (dcs.clone(), self.me.clone());
            let _ = tokio::task::spawn_blocking(move || dcs.release_lease(COORDINATOR, &me)).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicU32, Ordering};

    use herd_dcs::MemoryDcs;

    use super::*;

    /// Two agents over one store: only the lease holder works; when it stops, the other
    /// takes over within the TTL.
    #[tokio::test]
    async fn one_holder_works_and_the_other_takes_over() {
        let dcs: Arc<dyn Dcs> = Arc::new(MemoryDcs::default());
        let spawn = |me: &str, count: Arc<AtomicU32>| {
            let (stop_tx, stop_rx) = watch::channel(false);
            let c = Coordinator {
                me: me.into(),
                ttl: Duration::from_millis(600),
                every: Duration::from_millis(50),
                held: None,
            };
            let dcs = dcs.clone();
            let task = tokio::spawn(c.run(
                dcs,
                move || {
                    let count = count.clone();
                    async move {
                        count.fetch_add(1, Ordering::Relaxed);
                    }
                },
                stop_rx,
            ));
            (stop_tx, task)
        };
        let (a, b) = (Arc::new(AtomicU32::new(0)), Arc::new(AtomicU32::new(0)));
        let (stop_a, task_a) = spawn("a", a.clone());
        tokio::time::sleep(Duration::from_millis(100)).await;
        let (stop_b, task_b) = spawn("b", b.clone());
        tokio::time::sleep(Duration::from_millis(700)).await;
        assert!(a.load(Ordering::Relaxed) > 0, "the first holder works");
        assert_eq!(b.load(Ordering::Relaxed), 0, "the other does not");
        // a stops (and gives the lease up): b takes over.
        let _ = stop_a.send(true);
        let _ = task_a.await;
        tokio::time::sleep(Duration::from_millis(700)).await;
        assert!(b.load(Ordering::Relaxed) > 0, "the other takes over");
        let _ = stop_b.send(true);
        let _ = task_b.await;
    }
}
