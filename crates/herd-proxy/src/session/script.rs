//! A simple-query string of several statements whose rows are on different shard groups
//! (transaction pooling): its statements are sent one after the other as queries of their own
//! (`herd_shard::script` says which strings and what is sent), each through the usual path
//! inside the transaction — the client's open transaction block, the client's `BEGIN` …
//! [`COMMIT`], or a `BEGIN` … `COMMIT` of the proxy's around the whole string, PostgreSQL's
//! implicit transaction — so transactions across groups (`spanning.rs`, two-phase commit when
//! several groups wrote) do the work. The client sees one answer, as from one server: each
//! statement's results, no completion of the proxy's own `BEGIN`/`COMMIT`, one ReadyForQuery.
//! A failed statement ends the string: the rest is not sent; an implicit transaction is rolled
//! back (ReadyForQuery idle), the client's own is left failed (ReadyForQuery `E`), as
//! PostgreSQL does. The client's later messages wait until the string is answered.

use std::collections::VecDeque;

use bytes::BytesMut;
use herd_shard::Plan;
use herd_wire::backend::tag as btag;
use herd_wire::encode;

use super::Session;
use crate::ProxyError;

/// What the proxy sends for one statement of a string or pipeline.
pub(super) enum Send {
    /// A unit taken as if the client had sent it (a simple query, or a pipeline's piece with
    /// its Sync).
    Unit(Vec<u8>),
    /// A pipeline's leading BEGIN: its messages and statement, answered by the proxy
    /// (`pipeline.rs`).
    Begin { piece: Vec<u8>, sql: String },
}

/// One statement the proxy sends, in order.
pub(super) struct Sent {
    pub(super) send: Send,
    /// The proxy's own `BEGIN`/`COMMIT`/`ROLLBACK`: its command completion is not the
    /// client's.
    pub(super) hidden: bool,
}

impl Sent {
    /// A simple query.
    pub(super) fn query(sql: &str, hidden: bool) -> Sent {
        let mut unit = Vec::new();
        // A statement the client sent (or a short literal) encodes; an empty unit is skipped.
        let _ = encode::query(&mut unit, sql.as_bytes());
        Sent {
            send: Send::Unit(unit),
            hidden,
        }
    }
}

/// What the proxy sends for a string or pipeline, in order.
pub(super) struct Steps {
    pub(super) sends: Vec<Sent>,
    /// The client is owed a ReadyForQuery at the end (not for a pipeline ended by Flush:
    /// its Sync, later, gets it).
    pub(super) ready: bool,
}

/// A string (or pipeline) being run statement by statement.
pub(super) struct Script {
    /// Statements not sent yet.
    steps: VecDeque<Sent>,
    /// The statement sent whose ReadyForQuery has not come yet: whether it is hidden.
    current: Option<bool>,
    /// That statement was answered with an error.
    failed: bool,
    /// The proxy began the transaction (no BEGIN in the string): a failure rolls it back.
    implicit: bool,
    /// The last ReadyForQuery is the client's (see [`Steps::ready`]).
    ready: bool,
    /// The client's bytes that followed the string, read once it is answered.
    held: BytesMut,
}

impl Session {
    /// Starts running `steps` for the string just taken from the client buffer.
    pub(super) fn start_script(&mut self, steps: Steps) {
        let Steps {
            sends: steps,
            ready,
        } = steps;
        let implicit = steps.first().is_some_and(|s| s.hidden);
        let held = self.cbuf.split();
        self.out.held = Some(self.out.buf.len());
        self.script = Some(Box::new(Script {
            steps: steps.into(),
            current: None,
            failed: false,
            implicit,
            ready,
            held,
        }));
    }

    /// The script's turn at each step of the session loop: filters what was answered, sends
    /// the next statement once the previous one is answered, and ends the script after the
    /// last. `true` when it moved something.
    pub(super) fn script_turn(&mut self) -> Result<bool, ProxyError> {
        self.filter_script_answers();
        let Some(script) = self.script.as_mut() else {
            return Ok(false);
        };
        if script.current.is_some() || !self.cbuf.is_empty() {
            return Ok(false);
        }
        let Some(step) = script.steps.pop_front() else {
            // Answered: the client's own bytes are read again, in order.
            let held = std::mem::take(&mut script.held);
            self.script = None;
            self.out.held = None;
            let newer = self.cbuf.split();
            self.cbuf = held;
            self.cbuf.unsplit(newer);
            return Ok(true);
        };
        script.current = Some(step.hidden);
        match step.send {
            Send::Unit(unit) => self.cbuf.extend_from_slice(&unit),
            Send::Begin { piece, sql } => self.begin_in_pipeline(&piece, &sql)?,
        }
        Ok(true)
    }

    /// Goes through the answers added for the client since last time: drops the command
    /// completions of the proxy's own statements and every ReadyForQuery but the string's
    /// last, and after a failed statement replaces what was left of the string (nothing, or
    /// the rollback of the implicit transaction).
    pub(super) fn filter_script_answers(&mut self) {
        let Some(script) = self.script.as_mut() else {
            return;
        };
        let Some(from) = self.out.held else {
            return;
        };
        let buf = &mut self.out.buf;
        if from >= buf.len() {
            return;
        }
        let tail = buf.split_off(from);
        let mut at = 0;
        while let Some(len) = frame_len(&tail[at..]) {
            let frame = &tail[at..at + len];
            at += len;
            let keep = match (frame[0], script.current.as_ref()) {
                (btag::COMMAND_COMPLETE, Some(hidden)) => !hidden,
                (btag::ERROR_RESPONSE, Some(_)) => {
                    script.failed = true;
                    true
                }
                (btag::READY_FOR_QUERY, Some(_)) => {
                    script.current = None;
                    let status = frame.get(5).copied().unwrap_or(b'I');
                    let failed = std::mem::take(&mut script.failed);
                    next_after(script, status, failed) && script.ready
                }
                _ => true,
            };
            if keep {
                buf.extend_from_slice(frame);
            }
        }
        let done = buf.len();
        buf.extend_from_slice(&tail[at..]);
        self.out.held = Some(done);
    }
}

/// The statements to send for `sql` when it is a string of several statements that can run
/// one after the other in its transaction (`herd_shard::script`), `Err` why not; `None` when
/// it is not several statements.
pub(super) fn script_of(
    ctx: &crate::ProxyContext,
    map: &herd_shard::ShardMap,
    names: &super::shard::Resolver<'_>,
    sql: &[u8],
    in_transaction: bool,
) -> Option<Result<Steps, String>> {
    let text = String::from_utf8_lossy(sql);
    if ctx.classifier.get_or_classify(&text).statements.len() < 2 {
        return None;
    }
    let parts = herd_sql::statements(&text).filter(|p| p.len() > 1)?;
    let statements = parts
        .into_iter()
        .map(|part| {
            let control = control(ctx, &part);
            // COPY waits for the client's data or sends its own stream: not while the string's
            // later statements wait and the client is not read.
            let copy = herd_sql::key_facts(&part)
                .and_then(|f| f.utility)
                .is_some_and(|u| u == "CopyStmt");
            let plan = if copy {
                Plan::Refuse(
                    "COPY in a query string whose statements belong to different shard groups: \
                     send it alone"
                        .into(),
                )
            } else {
                super::shard::plan_sql(ctx, map, Some(names), part.as_bytes(), &[])
            };
            (part, control, plan)
        })
        .collect::<Vec<_>>();
    Some(
        herd_shard::script(&statements, in_transaction).map(|steps| Steps {
            sends: steps
                .iter()
                .map(|s| Sent::query(&s.sql, s.hidden))
                .collect(),
            ready: true,
        }),
    )
}

/// What statement `sql` does to its transaction.
pub(super) fn control(ctx: &crate::ProxyContext, sql: &str) -> herd_shard::Control {
    use herd_shard::Control;
    let classified = ctx.classifier.get_or_classify(sql);
    match classified.statements.first().map(|s| &s.tx) {
        None | Some(herd_sql::TxEffect::None) => Control::None,
        Some(herd_sql::TxEffect::Begin { .. }) => Control::Begin,
        Some(herd_sql::TxEffect::Commit) if !chains(sql) => Control::Commit,
        Some(_) => Control::Other,
    }
}

/// `COMMIT AND CHAIN` (or `END AND CHAIN`): it begins another transaction.
fn chains(sql: &str) -> bool {
    let words: Vec<String> = sql
        .split_whitespace()
        .map(|w| w.trim_end_matches(';').to_ascii_lowercase())
        .collect();
    words.windows(2).any(|w| w[0] == "and" && w[1] == "chain")
        && !words
            .windows(3)
            .any(|w| w[0] == "and" && w[1] == "no" && w[2] == "chain")
}

/// After a statement's ReadyForQuery with transaction `status` (`failed`: the statement was
/// answered with an error): whether that ReadyForQuery is the string's last (kept for the
/// client), with what is left of the string adjusted.
fn next_after(script: &mut Script, status: u8, failed: bool) -> bool {
    if failed || status == b'E' {
        script.steps.clear();
        if !script.implicit || status == b'I' {
            // The client's transaction stays failed until its ROLLBACK, as in PostgreSQL (or
            // the transaction is over already).
            return true;
        }
        script.steps.push_back(Sent::query("ROLLBACK", true));
        return false;
    }
    script.steps.is_empty()
}

/// The length of the complete message at the start of `b`, if there is one.
fn frame_len(b: &[u8]) -> Option<usize> {
    let len = u32::from_be_bytes(b.get(1..5)?.try_into().ok()?) as usize + 1;
    (len >= 5 && b.len() >= len).then_some(len)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn script(implicit: bool, left: usize) -> Script {
        Script {
            steps: (0..left)
                .map(|i| Sent::query(&format!("s{i}"), false))
                .collect(),
            current: None,
            failed: false,
            implicit,
            ready: true,
            held: BytesMut::new(),
        }
    }

    #[test]
    fn what_follows_a_statement() {
        // Statements left: this ReadyForQuery is not the last.
        let mut s = script(true, 2);
        assert!(!next_after(&mut s, b'T', false));
        assert_eq!(s.steps.len(), 2);
        // The last one's is kept.
        let mut s = script(false, 0);
        assert!(next_after(&mut s, b'I', false));
        // A failure in the client's own transaction: kept (status E), the rest dropped; also
        // when the error left the transaction as it was.
        for status in [b'E', b'T'] {
            let mut s = script(false, 3);
            assert!(next_after(&mut s, status, true));
            assert!(s.steps.is_empty());
        }
        // In an implicit one: the rest replaced by a hidden ROLLBACK, whose answer is last.
        for (status, failed) in [(b'E', false), (b'E', true), (b'T', true)] {
            let mut s = script(true, 3);
            assert!(!next_after(&mut s, status, failed));
            assert_eq!(s.steps.len(), 1);
            let mut rollback = Vec::new();
            encode::query(&mut rollback, "ROLLBACK").expect("query");
            assert!(matches!(&s.steps[0].send, Send::Unit(u) if *u == rollback));
            assert!(s.steps[0].hidden);
        }
        // An error that ended the transaction already: nothing left to roll back.
        let mut s = script(true, 3);
        assert!(next_after(&mut s, b'I', true));
        assert!(s.steps.is_empty());
    }

    #[test]
    fn message_lengths() {
        assert_eq!(frame_len(&[b'Z', 0, 0, 0, 5, b'I', b'C']), Some(6));
        assert_eq!(frame_len(&[b'Z', 0, 0, 0, 5]), None);
        assert_eq!(frame_len(&[b'Z', 0, 0]), None);
        assert_eq!(frame_len(&[b'Z', 0, 0, 0, 1]), None);
    }
}
