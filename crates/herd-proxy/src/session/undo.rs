//! What a failed or skipped client message leaves undone: a Parse the proxy recorded, a
//! Close it answered itself. PostgreSQL skips everything up to the next Sync after an error,
//! so the proxy forgets (or restores) what those messages did to the session.

use std::sync::Arc;

use super::state::{SessionState, Statement};
use super::Attached;

/// What to undo when a message the proxy acted on fails or is skipped after an error.
#[derive(Debug)]
pub enum Undo {
    /// A Parse: the server-side statement (if this Parse created it) and the client's name
    /// (if it was named) are forgotten; PostgreSQL created neither.
    Parse {
        /// Server-side name added to the connection's prepared set.
        server: Option<String>,
        /// The client's name, and the statement it was given.
        client: Option<(Vec<u8>, Arc<Statement>)>,
    },
    /// A Parse of the unnamed statement: it does not exist afterwards.
    Unnamed {
        /// Its token.
        token: u64,
    },
    /// A Close of a named statement answered by the proxy: the statement still exists.
    Close {
        /// The client's name.
        client: Vec<u8>,
        /// The statement.
        stmt: Arc<Statement>,
    },
}

/// Undoes what failed messages did to the session, newest first (a Close then a Parse of the
/// same name, both skipped, must leave the old statement in place).
pub fn undo_failed(failed: &[u64], att: &mut Attached, state: &mut SessionState) {
    for id in failed.iter().rev() {
        let Some(pos) = att.undo.iter().position(|(i, _)| i == id) else {
            continue;
        };
        let (_, undo) = att.undo.remove(pos);
        match undo {
            Undo::Parse { server, client } => {
                if let Some(name) = server {
                    att.lease.conn.prepared.remove(&name);
                }
                if let Some((name, stmt)) = client {
                    if state
                        .statements
                        .get(&name)
                        .is_some_and(|s| Arc::ptr_eq(s, &stmt))
                    {
                        state.statements.remove(&name);
                    }
                }
            }
            Undo::Unnamed { token } => {
                if state.unnamed.as_ref().is_some_and(|u| u.token == token) {
                    state.unnamed = None;
                }
                if att.lease.conn.unnamed == Some(token) {
                    att.lease.conn.unnamed = None;
                }
            }
            Undo::Close { client, stmt } => {
                state.statements.entry(client).or_insert(stmt);
            }
        }
    }
}
