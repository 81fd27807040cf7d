//! What the proxy follows of each shard group: its topology, republished on every poll of the
//! nodes, and a bell rung only when the topology names another primary (or none).
//!
//! The bell exists for sessions: one attached to the primary must notice another node being
//! promoted while it waits (an isolated or frozen old primary goes silent rather than failing).
//! Waiting on the topology itself would wake every such session on every poll. Sessions
//! instead listen on the group's [`PrimaryBell`]: each keeps one registration for its whole
//! life, a wait costs an atomic waker update and a load, and after a ring the session reads the
//! primary from the topology.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use atomic_waker::AtomicWaker;
use herd_core::NodeName;
use tokio::sync::watch;

use crate::topology::TopologyView;

/// One shard group's feeds.
pub(crate) struct GroupFeed {
    /// The group's topology.
    pub(crate) view: watch::Receiver<Arc<TopologyView>>,
    /// Rung after every change of the topology's primary.
    pub(crate) bell: Arc<PrimaryBell>,
}

impl GroupFeed {
    /// Follows `view`, ringing the bell when its primary changes (a task that ends with the
    /// view's sender).
    pub(crate) fn follow(mut view: watch::Receiver<Arc<TopologyView>>) -> GroupFeed {
        let mut primary = primary_of(&view.borrow_and_update());
        let bell = Arc::new(PrimaryBell::default());
        let feed = GroupFeed {
            view: view.clone(),
            bell: bell.clone(),
        };
        tokio::spawn(async move {
            while view.changed().await.is_ok() {
                let now = primary_of(&view.borrow_and_update());
                if now != primary {
                    primary = now;
                    bell.ring();
                }
            }
        });
        feed
    }

    /// A group that is never served (a proxy with no servers).
    pub(crate) fn empty() -> GroupFeed {
        GroupFeed {
            view: watch::channel(Arc::new(TopologyView::default())).1,
            bell: Arc::new(PrimaryBell::default()),
        }
    }
}

fn primary_of(view: &TopologyView) -> Option<NodeName> {
    view.primary.as_ref().map(|p| p.name.clone())
}

/// Wakes the sessions listening on one group when its primary changes.
#[derive(Default)]
pub(crate) struct PrimaryBell {
    /// How many times it rang.
    epoch: AtomicU64,
    /// The listeners, by id (each removes itself when its session ends).
    listeners: Mutex<HashMap<u64, Arc<AtomicWaker>>>,
    next_id: AtomicU64,
}

impl PrimaryBell {
    /// How many times the bell rang so far.
    pub(crate) fn epoch(&self) -> u64 {
        self.epoch.load(Ordering::Acquire)
    }

    /// Registers a listener: its id (for [`PrimaryBell::forget`]) and the waker slot a ring
    /// wakes.
    pub(crate) fn listen(&self) -> (u64, Arc<AtomicWaker>) {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let waker = Arc::new(AtomicWaker::new());
        self.lock().insert(id, waker.clone());
        (id, waker)
    }

    /// Removes listener `id`.
    pub(crate) fn forget(&self, id: u64) {
        self.lock().remove(&id);
    }

    /// Counts a change and wakes every listener (the epoch is bumped first: a listener that
    /// registers its waker and then reads the epoch never misses a ring).
    fn ring(&self) {
        self.epoch.fetch_add(1, Ordering::AcqRel);
        for waker in self.lock().values() {
            waker.wake();
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<u64, Arc<AtomicWaker>>> {
        self.listeners.lock().unwrap_or_else(|e| e.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::topology::Endpoint;
    use std::time::Duration;

    fn view(primary: Option<&str>, lsn: u64) -> Arc<TopologyView> {
        Arc::new(TopologyView {
            primary: primary.map(|n| Endpoint {
                name: NodeName::from_text(n),
                host: "127.0.0.1".into(),
                port: 5432,
                socket: None,
            }),
            primary_lsn: herd_core::Lsn(lsn),
            ..TopologyView::default()
        })
    }

    /// Waits until the bell has rung `n` times.
    async fn rung(bell: &PrimaryBell, n: u64) {
        tokio::time::timeout(Duration::from_secs(5), async {
            while bell.epoch() < n {
                tokio::task::yield_now().await;
            }
        })
        .await
        .expect("the bell rang in time");
    }

    #[tokio::test]
    async fn the_bell_rings_when_the_primary_changes_only() {
        let (tx, rx) = watch::channel(view(Some("node0"), 1));
        let feed = GroupFeed::follow(rx);
        // New positions of the same primary: the topology changes, the bell stays silent.
        for lsn in 2..10 {
            tx.send(view(Some("node0"), lsn)).expect("send");
            tokio::task::yield_now().await; // the task sees each view
        }
        // A marker after them: once the bell rang for it, the task saw every view before.
        tx.send(view(None, 10)).expect("send");
        rung(&feed.bell, 1).await;
        assert_eq!(feed.bell.epoch(), 1, "no ring for the same primary");
        assert_eq!(feed.view.borrow().primary_lsn, herd_core::Lsn(10));
        // Another node, then the same one again: one more ring.
        tx.send(view(Some("node1"), 11)).expect("send");
        rung(&feed.bell, 2).await;
        tx.send(view(Some("node1"), 12)).expect("send");
        tokio::task::yield_now().await;
        tx.send(view(Some("node2"), 13)).expect("send");
        rung(&feed.bell, 3).await;
        assert_eq!(feed.bell.epoch(), 3);
    }

    /// Counts its wake-ups.
    struct Counter(std::sync::atomic::AtomicUsize);
    impl std::task::Wake for Counter {
        fn wake(self: Arc<Self>) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }

    #[test]
    fn a_ring_wakes_listeners_until_they_leave() {
        let bell = PrimaryBell::default();
        let counters: Vec<Arc<Counter>> = (0..3)
            .map(|_| Arc::new(Counter(Default::default())))
            .collect();
        let ids: Vec<u64> = counters
            .iter()
            .map(|c| {
                let (id, slot) = bell.listen();
                slot.register(&std::task::Waker::from(c.clone()));
                id
            })
            .collect();
        bell.ring();
        assert_eq!(bell.epoch(), 1);
        let woken = |c: &Arc<Counter>| c.0.load(Ordering::SeqCst);
        assert!(counters.iter().all(|c| woken(c) == 1));
        // An AtomicWaker gives its waker up when woken: registered again, woken again.
        bell.forget(ids[1]);
        for (i, c) in counters.iter().enumerate() {
            if i != 1 {
                bell.lock()[&ids[i]].register(&std::task::Waker::from(c.clone()));
            }
        }
        bell.ring();
        assert_eq!(
            counters.iter().map(woken).collect::<Vec<_>>(),
            vec![2, 1, 2],
            "the listener that left is not woken"
        );
        assert_eq!(bell.lock().len(), 2);
    }
}
