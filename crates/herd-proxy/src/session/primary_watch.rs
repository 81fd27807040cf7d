//! Notices, while a session waits on its group's primary, that another node was promoted (an
//! isolated or frozen old primary goes silent rather than failing the session).
//!
//! The session stays registered for the next change of primary across its waits and
//! transactions, and re-registers only after one: registering on every wait while attached
//! cost about 330 instructions per transaction (docs/benchmarks.md, fourth pass).

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use herd_core::NodeName;
use tokio::sync::watch;

use crate::ProxyContext;

/// The next change of primary, with the receiver to wait for the one after it.
type NextChange = Pin<Box<dyn Future<Output = watch::Receiver<Option<NodeName>>> + Send + Sync>>;

/// One session's watch on one group's primary.
pub(super) struct PrimaryWatch {
    group: u32,
    next: NextChange,
}

impl PrimaryWatch {
    /// Watches group `group`'s primary from now on.
    pub(super) fn new(ctx: &ProxyContext, group: u32) -> PrimaryWatch {
        PrimaryWatch {
            group,
            next: wait_change(ctx.watch_primary(group)),
        }
    }

    /// The group watched.
    pub(super) fn group(&self) -> u32 {
        self.group
    }

    /// Ready once the group's primary is a node other than `node`; never while `node` stays
    /// the primary or no primary is known. Registers `cx` for the next change otherwise.
    pub(super) fn poll_moved(&mut self, cx: &mut Context<'_>, node: &NodeName) -> Poll<()> {
        while let Poll::Ready(mut rx) = self.next.as_mut().poll(cx) {
            let moved = rx.borrow_and_update().as_ref().is_some_and(|p| p != node);
            self.next = wait_change(rx);
            if moved {
                return Poll::Ready(());
            }
        }
        Poll::Pending
    }
}

/// Resolves at `rx`'s next change; never once its sender is gone (the proxy is stopping).
fn wait_change(mut rx: watch::Receiver<Option<NodeName>>) -> NextChange {
    Box::pin(async move {
        if rx.changed().await.is_err() {
            std::future::pending::<()>().await;
        }
        rx
    })
}
