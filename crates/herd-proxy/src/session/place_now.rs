//! The common unit placed without an await: a unit for one group, nothing paused or parked,
//! routed to a node whose pool has an idle connection already at the session's settings.
//!
//! The general path ([`Session::start_unit`]) is an async function behind a box (its future
//! is several kilobytes, kept out of every idle session's task); allocating, filling and
//! polling it for each transaction was a measurable share of the proxy's work per message.
//! Whatever would have to wait (a pause, a full pool, a connection to open, settings to
//! replay, a read-your-writes token, no primary known, several groups) goes that way instead,
//! with what was found here, so the outcome is the same either way.

use bytes::Bytes;
use herd_wire::frontend::tag;

use super::attach::{lone_message, UnitFacts};
use super::Session;
use crate::pool::Lease;
use crate::router::choose::{PrimaryReason, Target};
use crate::topology::Endpoint;
use crate::ProxyError;

/// How [`Session::place_now`] left a unit.
pub(super) enum Placed {
    /// Forwarded to its server or answered by the proxy; `false` when it ended with the
    /// client's Terminate.
    Done(bool),
    /// It needs waiting: the general path takes it, with its inspection when one was made
    /// (nothing else was changed).
    Later(Bytes, Option<UnitFacts>),
}

impl Session {
    /// Places `unit` (complete, arrived while detached) when nothing needs waiting.
    pub(super) fn place_now(&mut self, unit: Bytes) -> Result<Placed, ProxyError> {
        let plain = !self.ctx.is_paused()
            && self.parked.is_empty()
            && self.ctx.groups() <= 1
            && !matches!(
                lone_message(&unit),
                Some(tag::TERMINATE | tag::SYNC | tag::FLUSH)
            );
        if !plain {
            return Ok(Placed::Later(unit, None));
        }
        let mut facts = self.inspect(&unit)?;
        if let Some(answer) = facts.local.take() {
            if self.answer_locally(answer, facts.sql.as_deref())? {
                return Ok(Placed::Done(true));
            }
        }
        let view = self.ctx.view_of(self.group);
        let target = self.target(facts.read_only, &view);
        // The node the general path would lease from first, and the reason it would count.
        let chosen = match &target {
            Target::Primary(PrimaryReason::Write) => {
                view.primary.as_ref().map(|p| (p, None, facts.reason))
            }
            Target::Primary(why) => view.primary.as_ref().map(|p| (p, None, why.as_str())),
            Target::Replica {
                candidates,
                confirm: None,
            } if !self.ctx.config.read_from_primary => self
                .least_busy(&view.replicas, candidates)
                .map(|i| (&view.replicas[i].endpoint, Some(i), facts.reason)),
            Target::Replica { .. } => None,
        };
        let Some((ep, replica, reason)) = chosen else {
            return Ok(Placed::Later(unit, Some(facts)));
        };
        let Some(lease) = self.try_lease(ep) else {
            return Ok(Placed::Later(unit, Some(facts)));
        };
        self.force_primary = false;
        self.routed(ep, reason);
        self.attach(lease, replica, unit, facts.query)
            .map(Placed::Done)
    }

    /// The candidate with the fewest outstanding leases (the lowest index among equals): the
    /// one the general path tries first.
    fn least_busy(
        &mut self,
        replicas: &[crate::topology::ReplicaView],
        candidates: &[usize],
    ) -> Option<usize> {
        let mut best: Option<(usize, usize)> = None;
        for &i in candidates {
            let busy = self.pool(&replicas.get(i)?.endpoint).outstanding();
            if best.is_none_or(|b| (busy, i) < b) {
                best = Some((busy, i));
            }
        }
        best.map(|(_, i)| i)
    }

    /// [`Session::lease`] when it needs no waiting: an idle connection of `ep`'s pool, already
    /// at the session's settings.
    fn try_lease(&mut self, ep: &Endpoint) -> Option<Lease> {
        if self.creds.is_none() {
            // A new session's first unit: a client that connects per transaction has no other.
            self.credentials()?;
        }
        let mut lease = self.pool(ep).try_acquire()?;
        if lease.conn.state_hash != self.state.hash {
            lease.release(); // the general path replays the settings on it
            return None;
        }
        lease.conn.reported.clear();
        Some(lease)
    }
}
