//! The session loop: units while detached, both directions while attached (what happens when
//! a transaction ends or a server fails is in `ending.rs`).
//!
//! Relaying is full duplex: the loop never waits on one socket while another could move. Bytes
//! for the client and for the server wait in outboxes written as their sockets take them, and
//! each direction is read only while the outbox it feeds is below a bound. A client that
//! writes a huge batch without reading, against a server that answers as it reads, makes
//! progress instead of filling both socket buffers and stalling (pgx `TestConnExecBatchHuge`).

use std::time::Duration;

use bytes::{Buf, Bytes};
use herd_wire::backend::{tag as btag, ErrorFields};

use super::attach::unit_len;
use super::outdated::{
    kept_statement_outdated, note_schema_change, outdated_statement, rerun_point,
};
use super::place_now::{AfterWait, Placed};
use super::undo::undo_failed;
use super::Session;
use crate::analysis::Effect;
use crate::ProxyError;

mod wait;

/// Client bytes read ahead of what can be forwarded (a unit or message larger than this is
/// still read whole: the bound only stops reading past a complete one).
const IN_LIMIT: usize = 1 << 20;
/// Bytes for the client not yet written: above it the server is not read.
const OUT_LIMIT: usize = 1 << 20;
/// Bytes for the server not yet written: above it client messages wait.
const SOUT_LIMIT: usize = 1 << 20;
/// How long the start of an extended-protocol batch waits for the rest (its Sync or Flush)
/// while the client sends nothing more. Past it the messages go to the primary as they are, as
/// PostgreSQL would have received them: a driver that pauses between Parse and Describe meets
/// the server's `statement_timeout` as it would directly.
const PARTIAL_WAIT: Duration = Duration::from_millis(50);

/// What one step of work without waiting achieved.
enum Step {
    /// Something moved: look again.
    Progress,
    /// Nothing can move until a socket is ready.
    Blocked,
    /// The client sent Terminate.
    Terminated,
}

// The session's future lives as long as its client, and its size is that of its largest
// state: the rarer and deeper calls below (a unit's start with routing and pools, a failed
// server, a transaction's end) are boxed, so an idle client's task holds the relay loop's
// few hundred bytes rather than the deepest path's kilobytes (memory per idle client); one
// small allocation per transaction is the price.
impl Session {
    /// Serves units until the client terminates or leaves.
    pub(super) async fn run(&mut self) -> Result<(), ProxyError> {
        loop {
            match self.step().await? {
                Step::Progress => continue,
                Step::Terminated => return Ok(()),
                Step::Blocked => {}
            }
            // Write what is ready now, without a round through the event loop first: most
            // answers fit the socket buffer, so the usual transaction costs no extra wake-up.
            if self.write_now()? {
                continue;
            }
            if !self.wait_io().await? {
                return Ok(());
            }
        }
    }

    /// Does whatever needs no waiting: starts a unit, relays complete server messages, or
    /// forwards complete client messages.
    async fn step(&mut self) -> Result<Step, ProxyError> {
        let max = self.ctx.config.max_message_bytes as usize;
        self.hold_partial = false;
        if self.script.is_some() && self.script_turn()? {
            return Ok(Step::Progress);
        }
        if self.out.len() < OUT_LIMIT && self.sql_prepared_turn(max).await? {
            return Ok(Step::Progress);
        }
        let Some(att) = self.attached.as_ref() else {
            if self.out.len() >= OUT_LIMIT {
                return Ok(Step::Blocked);
            }
            return match unit_len(&self.cbuf, max)? {
                Some(n) => {
                    let unit: Bytes = self.cbuf.split_to(n).freeze();
                    let go_on = match self.place_now(unit)? {
                        Placed::Done(go_on) => go_on,
                        Placed::Later(unit, None) => Box::pin(self.start_unit(unit)).await?,
                        Placed::Later(unit, Some(facts)) => {
                            Box::pin(self.place_inspected(unit, facts)).await?
                        }
                        Placed::Queued(queued) => {
                            let got = queued.pool().acquire_idle(self.pool_wait()).await;
                            match self.place_queued(*queued, got)? {
                                AfterWait::Done(go_on) => go_on,
                                AfterWait::General(unit, facts) => {
                                    Box::pin(self.place_inspected(unit, facts)).await?
                                }
                                AfterWait::Refused(e, unit) => {
                                    Box::pin(self.reply_error(&e, &unit)).await?;
                                    true
                                }
                            }
                        }
                    };
                    Ok(if go_on {
                        Step::Progress
                    } else {
                        Step::Terminated
                    })
                }
                None => Ok(Step::Blocked),
            };
        };
        if self.out.len() < OUT_LIMIT && att.lease.conn.frame_at(0)?.is_some() {
            self.relay_server().await?;
            return Ok(Step::Progress);
        }
        // The rows of a COPY … FROM STDIN the server accepted (CopyData, then CopyDone or
        // CopyFail) continue a statement under way: they go on whatever the rules below say
        // about new units (on a sharded cluster those held them back, and a COPY into a table
        // of group 0 hung until the client gave up). Only while the server is in copy-in (the
        // tracker saw its CopyInResponse): other steps pay one flag test, no parsing.
        if att.tracker.in_copy() && self.sout.len() < SOUT_LIMIT {
            let n = copy_frames_len(&self.cbuf, max)?;
            if n > 0 {
                let bytes = self.cbuf.split_to(n).freeze();
                return Ok(if self.forward(&bytes)? {
                    Step::Progress
                } else {
                    Step::Terminated
                });
            }
        }
        // A new batch goes to a replica only once it has answered the previous one: a
        // pipelined write must not follow a read onto a read-only server. Messages that
        // continue an open batch (up to its Sync) always go on, or the server would wait
        // for them forever.
        // On a sharded cluster a new batch outside a transaction also waits: the session then
        // detaches and the batch is planned afresh (its rows may be on another group, or on
        // every group), instead of being refused on this server.
        let transaction_pooling = self.ctx.config.pool_mode != herd_core::PoolMode::Session;
        let sharded = self.map.is_some() && transaction_pooling && att.status == b'I';
        // Inside a transaction on a sharded cluster, at a unit boundary: the unit may end a
        // transaction that spans groups, or move it to another group.
        // Such a unit is forwarded alone: the next one may belong to another group.
        let mut unit_only = None;
        if self.map.is_some() && transaction_pooling && att.status != b'I' && !att.batch_open {
            // The server still owes answers to the previous unit (a ROLLBACK or COMMIT the
            // client pipelined with what follows, tokio-postgres' drop of a transaction): the
            // status that decides where this unit goes is the one after them, so it waits.
            // Planned against the transaction that is ending, a read across groups was
            // refused on this server, or sent to it.
            if !att.tracker.is_idle() && unit_len(&self.cbuf, max)?.is_some() {
                return Ok(Step::Blocked);
            }
            match unit_len(&self.cbuf, max)? {
                Some(n) => {
                    self.partial_expired = false;
                    match Box::pin(self.transaction_boundary(n)).await? {
                        super::spanning::Boundary::Forward => unit_only = Some(n),
                        super::spanning::Boundary::Wait => return Ok(Step::Blocked),
                        super::spanning::Boundary::Done => return Ok(Step::Progress),
                    }
                }
                // The start of a batch: its end is waited for (a while), so the whole batch
                // is planned — a pipeline's later statements may be on another group, and
                // forwarded here as they come they would be refused on this one.
                None if self.cbuf.len() < IN_LIMIT
                    && !self.partial_expired
                    && herd_wire::split_frame(&self.cbuf, max)?.is_some() =>
                {
                    self.hold_partial = true;
                    return Ok(Step::Blocked);
                }
                None => {}
            }
        }
        let Some(att) = self.attached.as_ref() else {
            return Ok(Step::Progress);
        };
        let forward_now =
            (att.replica.is_none() && !sharded) || att.batch_open || att.tracker.is_idle();
        if forward_now && self.sout.len() < SOUT_LIMIT {
            if let Some(n) =
                unit_only.map_or_else(|| complete_frames_len(&self.cbuf, max), |n| Ok(Some(n)))?
            {
                let bytes = self.cbuf.split_to(n).freeze();
                self.partial_expired = false;
                // Session pooling on a sharded cluster: the session's server is on group 0,
                // and a statement whose rows are elsewhere is refused, not answered from there.
                if self.ctx.groups() > 1
                    && self.ctx.config.pool_mode == herd_core::PoolMode::Session
                {
                    if let Err(e) = Box::pin(self.active_map()).await {
                        tracing::warn!(error = %e, "reading the shard map");
                    }
                }
                return Ok(if self.forward(&bytes)? {
                    Step::Progress
                } else {
                    Step::Terminated
                });
            }
        }
        Ok(Step::Blocked)
    }

    /// Writes pending bytes to the client and the server as far as their sockets take them
    /// without waiting. `Ok(true)` when an outbox fell below its bound: work that waited for
    /// room (buffered server messages, a buffered unit, client messages) can go on now, and
    /// no socket will say so.
    fn write_now(&mut self) -> Result<bool, ProxyError> {
        let mut room = false;
        if self.script.is_some() {
            self.filter_script_answers();
        }
        if !self.out.is_empty() {
            let was_full = self.out.len() >= OUT_LIMIT;
            match self.client.try_write(self.out.pending()) {
                Ok(n) => self.out.advance(n),
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
                Err(e) => return Err(ProxyError::io("writing to client", e)),
            }
            room = was_full && self.out.len() < OUT_LIMIT;
        }
        if self.sout.is_empty() {
            return Ok(room);
        }
        let Some(att) = self.attached.as_mut() else {
            return Ok(room);
        };
        let was_full = self.sout.len() >= SOUT_LIMIT;
        match att.lease.conn.try_send(self.sout.pending()) {
            Ok(n) => self.sout.advance(n),
            // Left to wait_io, which reports it through server_failed.
            Err(_) => return Ok(room),
        }
        // Emptied: a unit that waited for the server's outbox to drain (the end of a
        // transaction spanning groups needs its server idle) can go on now. A message the
        // server does not answer (a lone Flush) leaves no socket to say so: psycopg's Flush
        // then COMMIT in one write hung the COMMIT forever.
        Ok(room || (was_full && self.sout.len() < SOUT_LIMIT) || self.sout.is_empty())
    }

    /// One write of the client's outbox (through a running query string's filter first).
    fn write_client_now(&mut self) -> std::io::Result<usize> {
        if self.script.is_some() {
            self.filter_script_answers();
        }
        self.client.try_write(self.out.pending())
    }

    /// Relays complete server messages (while the client's outbox has room), then handles a
    /// finished transaction.
    async fn relay_server(&mut self) -> Result<(), ProxyError> {
        while self.out.len() < OUT_LIMIT {
            let Some(att) = self.attached.as_mut() else {
                return Ok(());
            };
            // Messages that only pass through (rows, descriptions, completions of the client's
            // own requests) are copied together: one copy and one advance for the run instead
            // of a trip through the tracker for each.
            let conn = &mut att.lease.conn;
            let room = OUT_LIMIT.saturating_sub(self.out.len());
            let mut run = 0;
            // The first message that does not pass, with its length (`None`: no complete one
            // left, or no room for more).
            let next = loop {
                if run >= room {
                    break None;
                }
                let Some((frame, used)) = conn.frame_at(run)? else {
                    break None;
                };
                if completes_rollback(frame.raw) || !att.tracker.pass(frame.tag) {
                    break Some((frame.tag, used));
                }
                run += used;
            };
            if run > 0 {
                self.out.buf.extend_from_slice(&conn.rbuf[..run]);
                conn.rbuf.advance(run);
                att.forwarded += run;
            }
            let Some((tag, n)) = next else {
                break;
            };
            if !matches!(tag, btag::ERROR_RESPONSE | btag::PARAMETER_STATUS) {
                // A message the tracker must see (a ReadyForQuery, a completion it waits
                // for) is read where it lies and the buffer advanced past it: splitting it off
                // would cost a reference count (and, the first time, an allocation).
                let raw = &att.lease.conn.rbuf[..n];
                if completes_rollback(raw) {
                    att.rolled_back = true;
                }
                let before = self.out.buf.len();
                let d = att.tracker.on_server_message(raw, &mut self.out.buf);
                att.lease.conn.rbuf.advance(n);
                att.forwarded += self.out.buf.len() - before;
                // Most answers (rows, descriptions, completions) settle nothing.
                if d.ready.is_some() || !d.failed.is_empty() {
                    self.after_server_message(d);
                }
                continue;
            }
            let raw = att.lease.conn.rbuf.split_to(n);
            match tag {
                btag::ERROR_RESPONSE => {
                    att.error_seen = true;
                    let fields = ErrorFields::decode(raw.get(5..).unwrap_or_default()).ok();
                    let code = fields.as_ref().and_then(|f| f.code()).unwrap_or("");
                    let message = fields.as_ref().and_then(|f| f.message()).unwrap_or("");
                    let severity = fields
                        .as_ref()
                        .and_then(|f| f.severity_nonlocalized().or(f.severity()))
                        .unwrap_or("");
                    if matches!(severity, "FATAL" | "PANIC") {
                        // The client hears the server's own last word; the proxy adds none.
                        att.fatal = true;
                    }
                    if refused_by_standby(code, message)
                        && att.replica.is_some()
                        && att.forwarded == 0
                        && att.unit.is_some()
                    {
                        return Box::pin(self.retry_on_primary(code)).await;
                    }
                    if let Some(outdated) = outdated_statement(code, message) {
                        if !att.bound.is_empty() {
                            // Not on a sharded cluster: a rerun there may take other paths.
                            let rerun = (!self.rerunning && self.map.is_none())
                                .then(|| rerun_point(att))
                                .flatten();
                            kept_statement_outdated(&self.ctx, att, outdated);
                            if let Some(given) = rerun {
                                return Box::pin(self.rerun_outdated(given, code)).await;
                            }
                        }
                    }
                }
                btag::PARAMETER_STATUS => {
                    // The connection's reporting baseline moves with what its client is told.
                    if let Ok(p) = herd_wire::backend::ParameterStatus::decode(
                        raw.get(5..).unwrap_or_default(),
                    ) {
                        att.lease.conn.note_parameter(p.name, p.value);
                    }
                }
                _ => {}
            }
            let before = self.out.buf.len();
            let d = att.tracker.on_server_message(&raw, &mut self.out.buf);
            att.forwarded += self.out.buf.len() - before;
            self.after_server_message(d);
        }
        let finished = self
            .attached
            .as_ref()
            .is_some_and(|a| a.ready_idle && a.status == b'I');
        if finished && !self.release_now() {
            Box::pin(self.end_transaction()).await?;
        }
        Ok(())
    }

    /// What a server message relayed to the client settles: the requests it failed, and at
    /// its ReadyForQuery the transaction status and the unit's effects.
    fn after_server_message(&mut self, d: crate::router::track::Disposition) {
        let Some(att) = self.attached.as_mut() else {
            return;
        };
        undo_failed(&d.failed, att, &mut self.state);
        if let Some(status) = d.ready {
            self.rerunning = false;
            // Only the unit that caused the attach may run again (a pinned server's later
            // units are not kept).
            att.retry_unit = None;
            att.status = status;
            if status == b'I' {
                // The block's cursors ended with it.
                att.cursor = None;
            }
            att.undo.clear();
            att.bound.clear();
            note_schema_change(&self.ctx, att, status);
            let effects = std::mem::take(&mut att.effects);
            if !std::mem::take(&mut att.error_seen) {
                apply_effects(
                    &mut self.state,
                    effects,
                    status == b'T',
                    &mut att.lease.conn.prepared,
                );
            }
            att.ready_idle = att.tracker.is_idle();
        }
    }
}

/// Errors with which a hot standby refuses what only a primary can do: a write that was
/// classified as a read (25006), or a read of an unlogged table (0A000 "… during recovery").
fn refused_by_standby(code: &str, message: &str) -> bool {
    code == "25006" || (code == "0A000" && message.contains("during recovery"))
}

/// Applies confirmed session effects; `in_transaction` defers settings to the commit.
fn apply_effects(
    state: &mut super::state::SessionState,
    effects: Vec<Effect>,
    in_transaction: bool,
    prepared: &mut crate::server::PreparedSet,
) {
    for e in effects {
        match e {
            Effect::Set { name, sql } => state.record_set(&name, Some(sql), in_transaction),
            Effect::Reset { name } => state.record_set(&name, None, in_transaction),
            Effect::ResetAll => state.reset_all(),
            Effect::SetLocalPath { sql } if in_transaction => state.set_local_path(&sql),
            Effect::SetLocalPath { .. } => {}
            Effect::PathUnknown => state.path_unknown(),
            Effect::DiscardAll => {
                state.reset_all();
                state.statements.clear();
                state.sql_prepared.clear();
                prepared.clear();
            }
            Effect::Consistency(level) => state.consistency = level,
        }
    }
}

/// Whether the server message `raw` is the CommandComplete of a ROLLBACK (the transaction's
/// settings are then not kept). Such a message ends a run of passing answers, so the relay
/// notes it on its single-message path.
fn completes_rollback(raw: &[u8]) -> bool {
    raw.first() == Some(&btag::COMMAND_COMPLETE) && raw.get(5..13) == Some(b"ROLLBACK")
}

/// Length of all complete messages at the start of `buf`.
/// The length of the complete CopyData, CopyDone and CopyFail messages at the start of `buf`
/// (0: none; a client sends them only while a COPY it started runs).
fn copy_frames_len(buf: &[u8], max: usize) -> Result<usize, ProxyError> {
    use herd_wire::frontend::tag;
    let mut offset = 0;
    while let Some((frame, used)) = herd_wire::split_frame(&buf[offset..], max)? {
        if !matches!(frame.tag, tag::COPY_DATA | tag::COPY_DONE | tag::COPY_FAIL) {
            break;
        }
        offset += used;
        if frame.tag != tag::COPY_DATA {
            break;
        }
    }
    Ok(offset)
}

fn complete_frames_len(buf: &[u8], max: usize) -> Result<Option<usize>, ProxyError> {
    let mut offset = 0;
    while let Some((_, used)) = herd_wire::split_frame(&buf[offset..], max)? {
        offset += used;
    }
    Ok((offset > 0).then_some(offset))
}

#[cfg(test)]
mod tests {
    use super::{completes_rollback, refused_by_standby};

    #[test]
    fn rollback_completions() {
        let complete = |tag: &str| {
            let mut m = vec![b'C'];
            m.extend_from_slice(&(4 + tag.len() as i32 + 1).to_be_bytes());
            m.extend_from_slice(tag.as_bytes());
            m.push(0);
            m
        };
        assert!(completes_rollback(&complete("ROLLBACK")));
        assert!(!completes_rollback(&complete("COMMIT")));
        assert!(!completes_rollback(&complete("SELECT 1")));
        let mut notice = complete("ROLLBACK");
        notice[0] = b'N';
        assert!(!completes_rollback(&notice), "only a CommandComplete");
    }

    #[test]
    fn standby_refusals() {
        assert!(refused_by_standby(
            "25006",
            "cannot execute INSERT in a read-only transaction"
        ));
        assert!(refused_by_standby(
            "0A000",
            "cannot access temporary or unlogged relations during recovery"
        ));
        assert!(!refused_by_standby(
            "0A000",
            "cached plan must not change result type"
        ));
        assert!(!refused_by_standby(
            "42P01",
            "relation \"x\" does not exist"
        ));
    }
}
