//! The common unit placed without an await: a unit for one group, nothing paused or parked,
//! routed to a node whose pool has an idle connection already at the session's settings.
//!
//! The general path ([`Session::start_unit`]) is an async function behind a box (its future
//! is several kilobytes, kept out of every idle session's task); allocating, filling and
//! polling it for each transaction was a measurable share of the proxy's work per message.
//! A unit whose node's pool is full waits in that pool's queue with everything decided here
//! ([`Session::place_queued`]): with many clients on a small pool that is most units, and the
//! general path cost them an allocation of kilobytes each. Whatever else would have to wait (a
//! pause, a connection to open, settings to replay, a read-your-writes token, no primary known,
//! several groups) goes the general way, with what was found here, so the outcome is the same
//! either way.

use std::sync::Arc;

use bytes::Bytes;
use herd_wire::frontend::tag;

use super::attach::{lone_message, UnitFacts};
use super::Session;
use crate::pool::{Lease, Pool};
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
    /// Its node's pool is full: it waits for a released connection
    /// ([`Session::place_queued`]), everything else already decided.
    Queued(Box<Queued>),
}

/// A unit routed to a node whose pool was full, waiting for one of its connections. Boxed:
/// it is made only when a unit must wait, and keeps [`Placed`] small for the common unit.
pub(super) struct Queued {
    unit: Bytes,
    facts: UnitFacts,
    pool: Arc<Pool>,
    /// The replica's index in the view, or `None` for the primary.
    replica: Option<usize>,
    reason: &'static str,
}

impl Queued {
    /// The pool the unit waits on.
    pub(super) fn pool(&self) -> &Arc<Pool> {
        &self.pool
    }
}

/// What became of a queued unit once its wait ended ([`Session::place_queued`]).
pub(super) enum AfterWait {
    /// Attached and forwarded; `false` when it ended the session.
    Done(bool),
    /// The general path takes it, with its inspection (settings to replay, a connection to
    /// open, another node to try).
    General(Bytes, UnitFacts),
    /// The primary's pool had no connection in time: the client is told (53300).
    Refused(ProxyError, Bytes),
}

impl Session {
    /// Places `unit` (complete, arrived while detached) when nothing needs waiting.
    pub(super) fn place_now(&mut self, unit: Bytes) -> Result<Placed, ProxyError> {
        let only = lone_message(&unit);
        if self.skip_to_sync {
            return self.skip_unit(&unit).map(Placed::Done);
        }
        if only == Some(tag::TERMINATE) && self.parked.is_empty() {
            // The client leaves between transactions (every transaction of a client that
            // connects per transaction ends so): nothing to place, and the general path's
            // future, kilobytes, would be allocated only to say so.
            return Ok(Placed::Done(false));
        }
        let plain = !self.ctx.is_paused()
            && self.parked.is_empty()
            && self.ctx.groups() <= 1
            // A lone Terminate got here only with parked parts, which the general path ends.
            && !matches!(only, Some(tag::SYNC | tag::FLUSH));
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
            let pool = self.pool(ep);
            if pool.is_full() && self.creds.is_some() {
                return Ok(Placed::Queued(Box::new(Queued {
                    unit,
                    facts,
                    pool,
                    replica,
                    reason,
                })));
            }
            return Ok(Placed::Later(unit, Some(facts)));
        };
        self.force_primary = false;
        self.routed(ep, reason);
        self.attach(lease, replica, unit, facts.query)
            .map(Placed::Done)
    }

    /// Attaches the connection a queued unit waited for (`got`: what its pool's
    /// [`Pool::acquire_idle`] gave, awaited by the caller) as [`Session::place_now`] would have,
    /// or says what else must happen. The wait itself is awaited in the session loop, not in a
    /// boxed future of its own: with many clients on a small pool most units wait, and that
    /// future cost each of them an allocation.
    pub(super) fn place_queued(
        &mut self,
        queued: Queued,
        got: Result<Option<Lease>, ProxyError>,
    ) -> Result<AfterWait, ProxyError> {
        let Queued {
            unit,
            facts,
            pool,
            replica,
            reason,
        } = queued;
        let mut lease = match got {
            Ok(Some(lease)) if lease.conn.state_hash == self.state.hash => lease,
            Ok(Some(lease)) => {
                lease.release(); // the general path replays the settings on one
                return Ok(AfterWait::General(unit, facts));
            }
            // No idle connection came with the slot (one was closed): the general path opens one.
            Ok(None) => return Ok(AfterWait::General(unit, facts)),
            // A replica's pool timed out: the general path tries the other nodes, as it would have.
            Err(_) if replica.is_some() => return Ok(AfterWait::General(unit, facts)),
            Err(e) => return Ok(AfterWait::Refused(e, unit)),
        };
        lease.conn.reported.clear();
        self.force_primary = false;
        self.routed(pool.endpoint(), reason);
        self.attach(lease, replica, unit, facts.query)
            .map(AfterWait::Done)
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

    /// A unit after a refused one closed by Flush: discarded up to and including its Sync,
    /// which gets ReadyForQuery (failed inside a transaction), as PostgreSQL skips messages
    /// after an extended-protocol error. `Ok(false)`: the client said Terminate.
    fn skip_unit(&mut self, unit: &[u8]) -> Result<bool, ProxyError> {
        let mut rest = unit;
        while let Some((frame, used)) = herd_wire::split_frame(rest, usize::MAX)? {
            rest = &rest[used..];
            match frame.tag {
                tag::TERMINATE => return Ok(false),
                tag::SYNC => {
                    self.skip_to_sync = false;
                    let status = if self.in_transaction() { b'E' } else { b'I' };
                    herd_wire::encode::ready_for_query(&mut self.out.buf, status)?;
                    return Ok(true);
                }
                _ => {}
            }
        }
        Ok(true)
    }
}
