//! Notices, while a session waits on its group's primary, that another node was promoted (an
//! isolated or frozen old primary goes silent rather than failing the session).
//!
//! The session registers once with its group's [`PrimaryBell`](crate::feed::PrimaryBell) and
//! stays registered until it ends; a wait updates its waker and compares the bell's count of
//! changes. Queueing a waiter on the topology's watch on every wait cost about 330
//! instructions per transaction (docs/proxy-speed.md, fourth pass).

use std::sync::Arc;
use std::task::{Context, Poll};

use atomic_waker::AtomicWaker;
use herd_core::NodeName;

use crate::feed::PrimaryBell;
use crate::ProxyContext;

/// One session's watch on one group's primary.
pub(super) struct PrimaryWatch {
    group: u32,
    bell: Arc<PrimaryBell>,
    id: u64,
    waker: Arc<AtomicWaker>,
    /// The bell's count when the primary was last compared.
    seen: u64,
}

impl PrimaryWatch {
    /// Watches group `group`'s primary from now on.
    pub(super) fn new(ctx: &ProxyContext, group: u32) -> PrimaryWatch {
        let bell = ctx.primary_bell(group);
        let (id, waker) = bell.listen();
        let seen = bell.epoch();
        PrimaryWatch {
            group,
            bell,
            id,
            waker,
            seen,
        }
    }

    /// The group watched.
    pub(super) fn group(&self) -> u32 {
        self.group
    }

    /// Ready once the group's primary changed to a node other than `node` (in `ctx`'s topology);
    /// never while `node` stays the primary or no primary is known. Registers `cx` for the next
    /// change otherwise.
    pub(super) fn poll_moved(
        &mut self,
        cx: &mut Context<'_>,
        ctx: &ProxyContext,
        node: &NodeName,
    ) -> Poll<()> {
        // Registered before the count is read: a change after the read wakes this waker.
        self.waker.register(cx.waker());
        let epoch = self.bell.epoch();
        if epoch == self.seen {
            return Poll::Pending;
        }
        self.seen = epoch;
        let moved = ctx
            .latest_view(self.group)
            .primary
            .as_ref()
            .is_some_and(|p| p.name != *node);
        if moved {
            Poll::Ready(())
        } else {
            Poll::Pending
        }
    }
}

impl Drop for PrimaryWatch {
    fn drop(&mut self) {
        self.bell.forget(self.id);
    }
}
