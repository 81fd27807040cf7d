//! What the proxy follows of each shard group: its topology, republished on every poll of the
//! nodes, and its primary's name, which changes only when the primary does.
//!
//! The second exists for sessions: one attached to the primary must notice another node being
//! promoted while it waits (an isolated or frozen old primary goes silent rather than failing).
//! Waiting on the topology itself would wake every such session on every poll; waiting on the
//! name wakes them at a failover only, so a session can stay registered across its waits.

use std::sync::Arc;

use herd_core::NodeName;
use tokio::sync::watch;

use crate::topology::TopologyView;

/// One shard group's feeds.
pub(crate) struct GroupFeed {
    /// The group's topology.
    pub(crate) view: watch::Receiver<Arc<TopologyView>>,
    /// The name of the group's primary (`None` while none is known), sent only when it changes.
    pub(crate) primary: watch::Receiver<Option<NodeName>>,
}

impl GroupFeed {
    /// Follows `view`, deriving the primary's name from it (a task that ends with the view's
    /// sender).
    pub(crate) fn follow(mut view: watch::Receiver<Arc<TopologyView>>) -> GroupFeed {
        let (tx, primary) = watch::channel(primary_of(&view.borrow_and_update()));
        let feed = GroupFeed {
            view: view.clone(),
            primary,
        };
        tokio::spawn(async move {
            while view.changed().await.is_ok() {
                let now = primary_of(&view.borrow_and_update());
                tx.send_if_modified(|name| {
                    let changed = *name != now;
                    *name = now;
                    changed
                });
            }
        });
        feed
    }

    /// A group that is never served (a proxy with no servers).
    pub(crate) fn empty() -> GroupFeed {
        GroupFeed {
            view: watch::channel(Arc::new(TopologyView::default())).1,
            primary: watch::channel(None).1,
        }
    }
}

fn primary_of(view: &TopologyView) -> Option<NodeName> {
    view.primary.as_ref().map(|p| p.name.clone())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::topology::Endpoint;

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

    #[tokio::test]
    async fn the_primary_feed_changes_with_the_primary_only() {
        let (tx, rx) = watch::channel(view(Some("node0"), 1));
        let feed = GroupFeed::follow(rx);
        let mut primary = feed.primary.clone();
        assert_eq!(
            primary.borrow_and_update().as_ref().map(NodeName::as_str),
            Some("node0")
        );
        // New positions of the same primary: the topology changes, the name does not.
        for lsn in 2..10 {
            tx.send(view(Some("node0"), lsn)).expect("send");
        }
        tokio::task::yield_now().await;
        tokio::task::yield_now().await;
        assert!(
            !primary.has_changed().expect("open"),
            "same primary, no change"
        );
        assert_eq!(feed.view.borrow().primary_lsn, herd_core::Lsn(9));
        // None known, then another node: two changes.
        tx.send(view(None, 10)).expect("send");
        tokio::time::timeout(std::time::Duration::from_secs(5), primary.changed())
            .await
            .expect("in time")
            .expect("open");
        assert_eq!(*primary.borrow_and_update(), None);
        tx.send(view(Some("node1"), 11)).expect("send");
        tokio::time::timeout(std::time::Duration::from_secs(5), primary.changed())
            .await
            .expect("in time")
            .expect("open");
        assert_eq!(
            primary.borrow_and_update().as_ref().map(NodeName::as_str),
            Some("node1")
        );
        // The feed ends with the topology's sender.
        drop(tx);
        tokio::time::timeout(std::time::Duration::from_secs(5), primary.changed())
            .await
            .expect("in time")
            .expect_err("closed");
    }
}
