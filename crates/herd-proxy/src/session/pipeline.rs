//! An extended-protocol pipeline whose statements belong to different shard groups: several
//! Parse/Bind/Execute before one Sync, as JDBC batches, psycopg's `executemany` and libpq's
//! pipeline mode send them (transaction pooling).
//!
//! PostgreSQL runs such a pipeline as one implicit transaction up to its Sync (all or none),
//! or inside the client's transaction block; an error skips everything up to the Sync. Herd
//! gives the same by running it as `script.rs` runs a query string of several statements: the
//! pipeline is cut after each Execute, each piece goes through the usual path as a unit of its
//! own (its Sync added) inside the transaction — the client's block, or a `BEGIN` … `COMMIT`
//! of the proxy's around the whole pipeline — so transactions across groups (`spanning.rs`)
//! do the work: a two-phase commit when several groups wrote. The client sees one answer, as
//! from one server: each statement's messages and one ReadyForQuery. A failed statement ends
//! the pipeline: the rest is not sent, the proxy's transaction rolled back (the client's own
//! is left failed). A leading `BEGIN` begins the client's transaction (answered by the proxy,
//! as a lone `BEGIN` is) and a trailing `COMMIT` ends it; other transaction control, and what
//! cannot run inside a transaction across groups, refuse the pipeline before anything runs
//! (`herd_shard::script`'s rules).

use herd_shard::{Control, Plan, ScriptStep};
use herd_wire::frontend::{tag, Bind, Execute, Parse};
use herd_wire::{encode, split_frame};

use super::script::{Send, Sent, Steps};
use super::shard::{plan_sql, typed_params, Resolver};
use super::Session;
use crate::analysis::{analyze, LocalAnswer};
use crate::ProxyError;

/// Why a pipeline's statements cannot run one after the other.
const IN_PARTS: &str = "a pipeline whose statements belong to different shard groups runs \
     statement by statement: each Bind must be followed by its Execute (without a row limit) \
     before the next Bind; send this batch's statements with a Sync each";

/// One statement's messages of a pipeline, without a Sync.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Piece {
    /// Its messages, as the client sent them.
    pub(super) bytes: Vec<u8>,
    /// The statement its Bind names (`None`: no Bind, e.g. a Parse and Describe only).
    pub(super) statement: Option<Vec<u8>>,
    /// That Bind's parameters and formats, unparsed.
    pub(super) params: Vec<u8>,
}

/// A pipeline's statements, and how it ends.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Pipeline {
    pub(super) pieces: Vec<Piece>,
    /// Closed by Sync (ReadyForQuery owed); else by Flush: the client reads the answers
    /// before its Sync, which comes later (psycopg's `executemany(…, returning=True)`).
    pub(super) synced: bool,
}

/// Why a pipeline flushed before its Sync is refused outside a transaction block.
const FLUSHED: &str = "a pipeline whose statements belong to different shard groups and that \
     asks for its results (Flush) before its Sync runs across groups only inside a transaction \
     block: begin one first, or send a Sync after each statement";

/// The statements of `unit`, when it is an extended-protocol pipeline of several executions
/// closed by Sync or Flush; `Ok(None)` when it is not; `Err` why it cannot run piece by piece
/// (a portal executed in parts, or bound without being executed before the next Bind).
pub(super) fn pieces(unit: &[u8]) -> Result<Option<Pipeline>, String> {
    let mut pieces: Vec<Piece> = Vec::new();
    let mut current = Piece {
        bytes: Vec::new(),
        statement: None,
        params: Vec::new(),
    };
    let mut executed = false;
    let mut synced = false;
    let mut flushed = false;
    let mut rest = unit;
    while let Ok(Some((frame, used))) = split_frame(rest, usize::MAX) {
        let raw = &rest[..used];
        rest = &rest[used..];
        if synced {
            return Ok(None); // Sync ends a unit: nothing follows it
        }
        match frame.tag {
            tag::SYNC => {
                synced = true;
                continue;
            }
            tag::FLUSH => {
                flushed = true;
                synced = true; // nothing may follow it either
                continue;
            }
            tag::PARSE | tag::DESCRIBE | tag::CLOSE => {}
            tag::BIND => {
                let Ok(b) = Bind::decode(frame.body) else {
                    return Ok(None);
                };
                if current.statement.is_some() {
                    return Err(IN_PARTS.into());
                }
                current.statement = Some(b.statement.to_vec());
                current.params = b.rest.to_vec();
            }
            tag::EXECUTE => {
                let Ok(e) = Execute::decode(frame.body) else {
                    return Ok(None);
                };
                if current.statement.is_none() || e.max_rows != 0 {
                    return Err(IN_PARTS.into());
                }
                current.bytes.extend_from_slice(raw);
                executed = true;
                pieces.push(std::mem::replace(
                    &mut current,
                    Piece {
                        bytes: Vec::new(),
                        statement: None,
                        params: Vec::new(),
                    },
                ));
                continue;
            }
            // A simple Query, FunctionCall, Flush…: not a pipeline of executions.
            _ => return Ok(None),
        }
        current.bytes.extend_from_slice(raw);
    }
    if !synced || !executed || pieces.len() < 2 || !rest.is_empty() {
        return Ok(None);
    }
    if !current.bytes.is_empty() {
        if current.statement.is_some() {
            return Err(IN_PARTS.into()); // bound, never executed
        }
        // Closes or Describes after the last Execute go with it.
        if let Some(last) = pieces.last_mut() {
            last.bytes.extend_from_slice(&current.bytes);
        }
    }
    Ok(Some(Pipeline {
        pieces,
        synced: !flushed,
    }))
}

/// What the proxy sends for a pipeline of `pieces` given the steps `herd_shard::script`
/// accepted for its statements: the proxy's hidden BEGIN/COMMIT as simple queries, a leading
/// BEGIN of the client's answered by the proxy, every other piece with a Sync of its own.
pub(super) fn sends(
    pieces: Vec<Piece>,
    steps: &[ScriptStep],
    leading_begin: Option<String>,
) -> Vec<Sent> {
    let implicit = steps.first().is_some_and(|s| s.hidden);
    let hidden = |sql: &str| Sent::query(sql, true);
    let mut out = Vec::with_capacity(pieces.len() + 2);
    if implicit {
        out.push(hidden("BEGIN"));
    }
    let mut begin = leading_begin;
    for piece in pieces {
        if let Some(sql) = begin.take() {
            out.push(Sent {
                send: Send::Begin {
                    piece: piece.bytes,
                    sql,
                },
                hidden: false,
            });
            continue;
        }
        let mut unit = piece.bytes;
        encode::sync(&mut unit);
        out.push(Sent {
            send: Send::Unit(unit),
            hidden: false,
        });
    }
    if implicit {
        out.push(hidden("COMMIT"));
    }
    out
}

impl Session {
    /// The sends for `unit` when it is a pipeline whose statements need several shard groups
    /// and can run one after the other in its transaction; `Err` why not; `None` when it is
    /// not such a pipeline (the caller's own refusal stands).
    pub(super) fn pipeline_of(
        &self,
        unit: &[u8],
        map: &herd_shard::ShardMap,
        resolver: &Resolver<'_>,
    ) -> Option<Result<Steps, String>> {
        if self.ctx.config.pool_mode == herd_core::PoolMode::Session || self.script.is_some() {
            return None;
        }
        let Pipeline { pieces, synced } = match pieces(unit) {
            Ok(Some(p)) => p,
            Ok(None) => return None,
            Err(why) => return Some(Err(why)),
        };
        let open = self.in_transaction();
        if !synced && !open {
            return Some(Err(FLUSHED.into()));
        }
        // Statements parsed earlier in the pipeline, for the Binds that follow.
        let mut parsed = std::collections::HashMap::new();
        let mut parsed_types = std::collections::HashMap::new();
        let mut statements = Vec::with_capacity(pieces.len());
        for piece in &pieces {
            let mut rest = piece.bytes.as_slice();
            while let Ok(Some((frame, used))) = split_frame(rest, usize::MAX) {
                rest = &rest[used..];
                if frame.tag == tag::PARSE {
                    if let Ok(p) = Parse::decode(frame.body) {
                        parsed.insert(p.name.to_vec(), p.query.to_vec());
                        parsed_types.insert(p.name.to_vec(), p.param_types);
                    }
                }
            }
            let Some(name) = &piece.statement else {
                statements.push((String::new(), Control::None, Plan::Anywhere));
                continue;
            };
            let Some(sql) = self.bound_sql(&parsed, name) else {
                // An unknown statement: the server's own error (26000) where it runs.
                statements.push((String::new(), Control::None, Plan::Anywhere));
                continue;
            };
            let types = match parsed_types.get(name) {
                Some(t) => t.clone(),
                None => self.bound_types(name).unwrap_or_default(),
            };
            let text = String::from_utf8_lossy(&sql).into_owned();
            let control = super::script::control(&self.ctx, &text);
            let plan = plan_sql(
                &self.ctx,
                map,
                Some(resolver),
                &sql,
                &typed_params(&piece.params, &types),
            );
            statements.push((text, control, plan));
        }
        let steps = match herd_shard::script(&statements, open) {
            Ok(steps) => steps,
            Err(why) => return Some(Err(format!("{why} (in a pipeline, before its Sync)"))),
        };
        let leading_begin = (!open && statements.first().is_some_and(|s| s.1 == Control::Begin))
            .then(|| statements[0].0.clone());
        Some(Ok(Steps {
            sends: sends(pieces, &steps, leading_begin),
            ready: synced,
        }))
    }

    /// The client's `BEGIN` at the head of a pipeline (its messages `piece`, statement
    /// `sql`): begun as a lone `BEGIN` is — the server is chosen by the next statement — and
    /// answered as a server answers those messages (without ReadyForQuery: more follows).
    pub(super) fn begin_in_pipeline(&mut self, piece: &[u8], sql: &str) -> Result<(), ProxyError> {
        let read_only = matches!(
            analyze(&self.ctx, sql.as_bytes(), self.state.unsafe_encoding).local,
            Some(LocalAnswer::Begin { read_only: true })
        );
        let batch = match self.fan_out_batch(piece) {
            Ok(b) => b,
            Err(e) => {
                let mut out = Vec::new();
                encode::error_response(&mut out, "ERROR", e.sqlstate(), &e.to_string())?;
                encode::ready_for_query(&mut out, b'I')?;
                self.out.buf.extend_from_slice(&out);
                return Ok(());
            }
        };
        self.pending_begin = Some(super::PendingBegin {
            sql: sql.to_string(),
            read_only,
            consistency: None,
        });
        let mut out = Vec::new();
        super::batch::answer_command(&mut out, &batch, "BEGIN")?;
        // The script's filter takes this ReadyForQuery as the step's end (dropped: not last).
        encode::ready_for_query(&mut out, b'T')?;
        self.out.buf.extend_from_slice(&out);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(out: &mut Vec<u8>, name: &str, sql: &str) {
        encode::parse(out, name, sql, &[]).expect("parse");
    }

    fn bind(out: &mut Vec<u8>, statement: &str) {
        encode::bind_renamed(out, "", statement, &[0, 0, 0, 0, 0, 0]).expect("bind");
    }

    fn execute(out: &mut Vec<u8>, max_rows: i32) {
        encode::execute(out, "", max_rows).expect("execute");
    }

    fn describe(out: &mut Vec<u8>) {
        encode::describe(out, herd_wire::frontend::KIND_PORTAL, b"").expect("describe");
    }

    /// psycopg's executemany: Parse/Bind/Describe/Execute per row, one Sync.
    fn executemany(n: usize) -> Vec<u8> {
        let mut b = Vec::new();
        for i in 0..n {
            parse(&mut b, "", &format!("insert into t values ({i})"));
            bind(&mut b, "");
            describe(&mut b);
            execute(&mut b, 0);
        }
        encode::sync(&mut b);
        b
    }

    #[test]
    fn pipelines_cut_after_each_execute() {
        let unit = executemany(3);
        let p = pieces(&unit).expect("ok").expect("a pipeline");
        assert!(p.synced);
        let p = p.pieces;
        assert_eq!(p.len(), 3);
        assert!(p.iter().all(|p| p.statement.as_deref() == Some(&b""[..])));
        // Every message but the Sync is in exactly one piece, in order.
        let joined: Vec<u8> = p.iter().flat_map(|p| p.bytes.clone()).collect();
        assert_eq!(joined, unit[..unit.len() - 5]);
        // JDBC: one named Parse, then Bind/Execute per row; a Close after the last Execute
        // goes with it.
        let mut b = Vec::new();
        parse(&mut b, "S_1", "insert into t values ($1)");
        for _ in 0..2 {
            bind(&mut b, "S_1");
            execute(&mut b, 0);
        }
        let before_close = b.len();
        encode::close(&mut b, herd_wire::frontend::KIND_STATEMENT, b"S_1").expect("close");
        encode::sync(&mut b);
        let p = pieces(&b).expect("ok").expect("a pipeline").pieces;
        assert_eq!(p.len(), 2);
        assert_eq!(p[0].statement.as_deref(), Some(&b"S_1"[..]));
        assert!(p[1].bytes.len() > before_close - p[0].bytes.len());
    }

    #[test]
    fn what_is_not_a_pipeline() {
        // One execution, no Sync, a simple query: the caller's usual path.
        assert_eq!(pieces(&executemany(1)), Ok(None));
        let unsynced = executemany(2);
        assert_eq!(pieces(&unsynced[..unsynced.len() - 5]), Ok(None));
        // Flushed before its Sync (psycopg's executemany with RETURNING): a pipeline whose
        // ReadyForQuery is owed later.
        let mut flushed = executemany(2);
        flushed.truncate(flushed.len() - 5);
        encode::flush(&mut flushed);
        let p = pieces(&flushed).expect("ok").expect("a pipeline");
        assert!(!p.synced);
        assert_eq!(p.pieces.len(), 2);
        // Sync then Flush are two units: nothing may follow the Sync.
        let mut both = executemany(2);
        encode::flush(&mut both);
        assert_eq!(pieces(&both), Ok(None));
        let mut q = Vec::new();
        encode::query(&mut q, "select 1; select 2").expect("query");
        assert_eq!(pieces(&q), Ok(None));
    }

    #[test]
    fn portals_in_parts_are_refused() {
        // A row limit (a cursor-style fetch), two Binds before an Execute, an Execute
        // without its Bind, a Bind never executed.
        let mut limited = Vec::new();
        for max_rows in [0, 10] {
            parse(&mut limited, "", "select 1");
            bind(&mut limited, "");
            execute(&mut limited, max_rows);
        }
        encode::sync(&mut limited);
        let mut two_binds = Vec::new();
        parse(&mut two_binds, "", "select 1");
        bind(&mut two_binds, "");
        bind(&mut two_binds, "");
        execute(&mut two_binds, 0);
        execute(&mut two_binds, 0);
        encode::sync(&mut two_binds);
        let mut again = Vec::new();
        parse(&mut again, "", "select 1");
        bind(&mut again, "");
        execute(&mut again, 0);
        execute(&mut again, 0);
        encode::sync(&mut again);
        let mut unexecuted = Vec::new();
        parse(&mut unexecuted, "", "select 1");
        bind(&mut unexecuted, "");
        execute(&mut unexecuted, 0);
        bind(&mut unexecuted, "");
        execute(&mut unexecuted, 0);
        bind(&mut unexecuted, "");
        encode::sync(&mut unexecuted);
        for unit in [limited, two_binds, again, unexecuted] {
            let why = pieces(&unit).expect_err("refused");
            assert!(why.contains("statement by statement"), "{why}");
        }
    }

    #[test]
    fn sends_wrap_an_implicit_transaction() {
        let unit = executemany(2);
        let p = pieces(&unit).expect("ok").expect("a pipeline").pieces;
        let step = |sql: &str, hidden| ScriptStep {
            sql: sql.into(),
            hidden,
        };
        // Outside a transaction: the proxy's BEGIN and COMMIT around the pieces, each piece
        // with a Sync.
        let implicit = [
            step("BEGIN", true),
            step("a", false),
            step("b", false),
            step("COMMIT", true),
        ];
        let s = sends(p.clone(), &implicit, None);
        assert_eq!(s.len(), 4);
        assert!(s[0].hidden && s[3].hidden && !s[1].hidden && !s[2].hidden);
        match &s[1].send {
            Send::Unit(u) => {
                assert!(u.ends_with(&[tag::SYNC, 0, 0, 0, 4]));
                assert_eq!(u.len(), p[0].bytes.len() + 5);
            }
            Send::Begin { .. } => panic!("a statement, not a BEGIN"),
        }
        // The client's leading BEGIN: answered by the proxy, no hidden steps.
        let own = [step("begin", false), step("b", false)];
        let s = sends(p, &own, Some("begin".into()));
        assert_eq!(s.len(), 2);
        assert!(matches!(&s[0].send, Send::Begin { sql, .. } if sql == "begin"));
        assert!(s.iter().all(|s| !s.hidden));
    }
}
