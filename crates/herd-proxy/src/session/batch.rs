//! The client's message batch for a statement that runs on every shard group (a fan-out read
//! or a write on every group): what it sent, and the Parses it brings, remembered as a server
//! would remember them for later Binds.

use std::sync::Arc;

use herd_wire::frontend::{tag, Bind, Describe, Execute, Parse, Query, KIND_STATEMENT};
use herd_wire::{encode, split_frame};

use super::fan_out::not_supported;
use super::state::{Statement, Unnamed};
use super::Session;
use crate::analysis::analyze;
use crate::pool::Lease;
use crate::server::server_error;
use crate::ProxyError;

/// The client's message batch, as far as a fan-out cares.
#[derive(Default)]
pub(super) struct Batch {
    /// A simple Query (else the extended protocol).
    pub(super) simple: bool,
    /// The simple Query's text.
    pub(super) query: Vec<u8>,
    /// Parses of the batch, in order (answered with ParseComplete each).
    pub(super) parses: Vec<(Vec<u8>, Vec<u8>, Vec<u32>)>,
    /// The Bind's statement name and its parameters and result formats, unparsed.
    pub(super) bind: Option<(Vec<u8>, Vec<u8>)>,
    /// Describe of the statement before the Bind (ParameterDescription + RowDescription).
    pub(super) describe_statement: bool,
    /// That Describe of the statement came after the Bind (tokio-postgres' `query_typed`
    /// sends Parse, Bind, Describe statement, Execute): its answer is owed after
    /// BindComplete.
    pub(super) describe_statement_after_bind: bool,
    /// Describe of the portal (RowDescription).
    pub(super) describe_portal: bool,
    /// Ends with Sync (ReadyForQuery owed).
    pub(super) sync: bool,
}

/// `unit` binds a portal it does not execute (an extended-protocol batch with a Bind and no
/// Execute): its rows would be fetched by a later batch.
pub(super) fn binds_without_execute(unit: &[u8]) -> bool {
    let (mut bind, mut execute) = (false, false);
    let mut rest = unit;
    while let Ok(Some((frame, used))) = split_frame(rest, usize::MAX) {
        rest = &rest[used..];
        match frame.tag {
            tag::BIND => bind = true,
            tag::EXECUTE => execute = true,
            _ => {}
        }
    }
    bind && !execute
}

/// Why a SELECT across groups is not read in parts.
pub(super) const FETCHED_WHOLE: &str =
    "a SELECT across shard groups is fetched whole, in the batch that \
     binds it: a portal bound in one batch and executed in another, or an Execute with a row \
     limit (a cursor-style fetch), is not supported";

impl Session {
    /// Reads the client's batch: what it sent, and the Parses it brings (remembered, as a
    /// server would, for later Binds).
    pub(super) fn fan_out_batch(&mut self, unit: &[u8]) -> Result<Batch, ProxyError> {
        let mut batch = Batch::default();
        let mut rest = unit;
        while let Some((frame, used)) = split_frame(rest, usize::MAX)? {
            rest = &rest[used..];
            match frame.tag {
                tag::QUERY => {
                    batch.query = Query::decode(frame.body)?.sql.to_vec();
                    batch.simple = true;
                }
                tag::PARSE => {
                    let p = Parse::decode(frame.body)?;
                    batch
                        .parses
                        .push((p.name.to_vec(), p.query.to_vec(), p.param_types.clone()));
                }
                tag::BIND => {
                    let b = Bind::decode(frame.body)?;
                    batch.bind = Some((b.statement.to_vec(), b.rest.to_vec()));
                }
                tag::DESCRIBE => {
                    if Describe::decode(frame.body)?.kind == KIND_STATEMENT {
                        batch.describe_statement = true;
                        batch.describe_statement_after_bind = batch.bind.is_some();
                    } else {
                        batch.describe_portal = true;
                    }
                }
                tag::EXECUTE if Execute::decode(frame.body)?.max_rows != 0 => {
                    return Err(not_supported(FETCHED_WHOLE.into()));
                }
                tag::SYNC => batch.sync = true,
                _ => {}
            }
        }
        for (name, query, types) in &batch.parses {
            self.remember_parse(name, query, types.clone())?;
        }
        Ok(batch)
    }

    /// Records a Parse the proxy answers itself (no server prepares it now), as a server
    /// would: a later Bind of it finds its text; a name in use is PostgreSQL's 42P05.
    pub(super) fn remember_parse(
        &mut self,
        name: &[u8],
        query: &[u8],
        types: Vec<u32>,
    ) -> Result<(), ProxyError> {
        let analysis = analyze(&self.ctx, query, self.state.unsafe_encoding);
        let stmt = Arc::new(Statement::new(query, types, &analysis, self.state.path));
        if name.is_empty() {
            let token = self.ctx.next_token();
            self.state.unnamed = Some(Unnamed { stmt, token });
        } else if self.state.statements.contains_key(name) {
            return Err(ProxyError::Server {
                code: "42P05".into(),
                message: format!(
                    "prepared statement \"{}\" already exists",
                    String::from_utf8_lossy(name)
                ),
            });
        } else {
            self.state.statements.insert(name.to_vec(), stmt);
        }
        Ok(())
    }

    /// The SQL the batch runs: its simple query, or the statement its Bind names (parsed in
    /// the batch or earlier).
    pub(super) fn batch_sql(&self, batch: &Batch) -> Vec<u8> {
        if batch.simple {
            return batch.query.clone();
        }
        let parsed: std::collections::HashMap<Vec<u8>, Vec<u8>> = batch
            .parses
            .iter()
            .map(|(name, query, _)| (name.clone(), query.clone()))
            .collect();
        let statement = batch.bind.as_ref().map(|b| b.0.clone()).unwrap_or_default();
        self.bound_sql(&parsed, &statement).unwrap_or_default()
    }
}

/// The parameter types PostgreSQL infers for `sql` (`declared` first), asked on `lease`
/// (Parse and Describe of the unnamed statement, then Sync).
pub(super) async fn infer_param_types(
    lease: &mut Lease,
    sql: &[u8],
    declared: &[u32],
) -> Result<Vec<u32>, ProxyError> {
    let mut request = Vec::new();
    encode::parse(&mut request, b"", sql, declared)?;
    encode::describe(&mut request, KIND_STATEMENT, b"")?;
    encode::sync(&mut request);
    // The server's unnamed statement is this one now, no client's.
    lease.conn.unnamed = None;
    lease.conn.send_own(&request).await?;
    let (mut types, mut error) = (declared.to_vec(), None);
    loop {
        let (t, body) = lease.conn.next_message().await?;
        match t {
            b't' => types = super::combine::param_types(&body),
            b'E' => error = error.or(Some(server_error(&body))),
            b'Z' => break,
            _ => {}
        }
    }
    error.map_or(Ok(types), Err)
}

/// Answers `batch`, a statement without rows (COMMIT, ROLLBACK) the proxy ran itself, with
/// `tag`: what each of its messages is owed, ending idle.
pub(super) fn answer_command(
    out: &mut Vec<u8>,
    batch: &Batch,
    tag: &str,
) -> Result<(), ProxyError> {
    if !batch.simple {
        for _ in &batch.parses {
            encode::parse_complete(out);
        }
        // ParameterDescription of no parameters, and no rows: before or after the Bind, as
        // the client asked.
        let describe = |out: &mut Vec<u8>| {
            out.extend_from_slice(&[b't', 0, 0, 0, 6, 0, 0]);
            encode::no_data(out);
        };
        if batch.describe_statement && !batch.describe_statement_after_bind {
            describe(out);
        }
        if batch.bind.is_some() {
            encode::bind_complete(out);
        }
        if batch.describe_statement_after_bind {
            describe(out);
        }
        if batch.describe_portal {
            encode::no_data(out);
        }
    }
    encode::command_complete(out, tag)?;
    if batch.simple || batch.sync {
        encode::ready_for_query(out, b'I')?;
    }
    Ok(())
}
