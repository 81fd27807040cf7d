//! The client's message batch for a statement that runs on every shard group (a fan-out read
//! or a write on every group): what it sent, and the Parses it brings, remembered as a server
//! would remember them for later Binds.

use std::sync::Arc;

use herd_wire::frontend::{tag, Bind, Describe, Execute, Parse, Query, KIND_STATEMENT};
use herd_wire::split_frame;

use super::fan_out::not_supported;
use super::state::{Statement, Unnamed};
use super::Session;
use crate::analysis::analyze;
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
    /// Describe of the portal (RowDescription).
    pub(super) describe_portal: bool,
    /// Ends with Sync (ReadyForQuery owed).
    pub(super) sync: bool,
}

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
                    } else {
                        batch.describe_portal = true;
                    }
                }
                tag::EXECUTE if Execute::decode(frame.body)?.max_rows != 0 => {
                    return Err(not_supported(
                        "a SELECT across shard groups is fetched whole: Execute with a row \
                         limit (a cursor-style fetch) is not supported"
                            .into(),
                    ));
                }
                tag::SYNC => batch.sync = true,
                _ => {}
            }
        }
        for (name, query, types) in &batch.parses {
            let analysis = analyze(&self.ctx, query, self.state.unsafe_encoding);
            let stmt = Arc::new(Statement::new(query, types.clone(), &analysis));
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
                self.state.statements.insert(name.clone(), stmt);
            }
        }
        Ok(batch)
    }
}
