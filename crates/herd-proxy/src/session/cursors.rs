//! Cursors and SQL prepared statements over distributed tables (issue 40).
//!
//! - `DECLARE c CURSOR FOR <query>` runs where its query would: on the query's group when it
//!   reads one group by key, else on the general path (group 0 over the global relations),
//!   where PostgreSQL keeps the cursor. `FETCH`/`MOVE`/`CLOSE` name no table and go to the
//!   block's server. *Rule:* once a cursor is declared, the transaction block stays on that
//!   server until it ends — a statement for another group (or every group) is refused there,
//!   with the reason, instead of moving the block away from its cursor.
//! - `PREPARE q AS <read of distributed tables>` is prepared on the general path (group 0's
//!   primary); like every SQL `PREPARE`, it pins the session to that server. Its `EXECUTE`
//!   runs there as a general read: refused while a shard moves, or inside a transaction block
//!   that has written (postgres_fdw's remote reads would not see the block's writes).

use herd_shard::{Plan, ShardMap};

use super::general::Here;
use super::shard::first_word_is;
use super::translate::Translator;

/// Why a statement for another group is refused in a block holding a cursor.
const CURSOR_BLOCK: &str = "this transaction block declared a cursor, which lives on the \
     server of the block's shard group: the block stays on that group until it ends, and this \
     statement needs another group (or every group); run it outside the block, or before the \
     DECLARE";

impl Translator<'_> {
    /// What becomes of a statement planned `plan` (its text `text`) because of a cursor of the
    /// transaction block or a general prepared statement: refused, or (an `EXECUTE` of a
    /// general prepared statement) sent as a general read. `None`: nothing (the common case,
    /// two field tests).
    pub(super) fn held_here(&self, plan: &Plan, text: &[u8], map: &ShardMap) -> Option<Here> {
        if self.att.cursor.is_none() && self.state.general_prepared.is_empty() {
            return None;
        }
        if let Some(general) = self.att.cursor {
            let leaves = match plan {
                Plan::Anywhere | Plan::Refuse(_) => false,
                Plan::Group { group, .. } => *group != self.att.group,
                Plan::General { .. } => self.att.group != 0,
                _ => true,
            };
            if leaves {
                return Some(Here::Refuse(CURSOR_BLOCK.into()));
            }
            if general && map.hides_rows() && first_word_is(text, &["fetch", "move"]) {
                return Some(Here::Refuse(
                    "this cursor reads every shard group through group 0, and a shard is \
                     moving between groups (both hold its rows until the move ends): fetch \
                     again once the move ends"
                        .into(),
                ));
            }
        }
        if self.state.general_prepared.is_empty() || !first_word_is(text, &["execute"]) {
            return None;
        }
        let name = herd_sql::executed(&String::from_utf8_lossy(text))?;
        if !self.state.general_prepared.contains(&name) {
            return None;
        }
        if map.hides_rows() {
            return Some(Here::Refuse(format!(
                "prepared statement {name} reads every shard group through group 0, and a \
                 shard is moving between groups (both hold its rows until the move ends): \
                 execute it again once the move ends"
            )));
        }
        if self.att.status != b'I' && self.att.wrote {
            return Some(Here::Refuse(format!(
                "prepared statement {name} reads every shard group through group 0 in remote \
                 transactions of its own, which would not see this transaction block's writes: \
                 execute it outside the block, or before the block writes"
            )));
        }
        // Sent as it is (not noted as a write, as EXECUTE otherwise is).
        Some(Here::General(
            String::from_utf8_lossy(text).into_owned(),
            Vec::new(),
        ))
    }

    /// Notes what a statement sent on the general path leaves on group 0's server: a cursor
    /// (the block stays there), a prepared statement (the session is pinned there, as by any
    /// SQL PREPARE, and its EXECUTEs are general reads).
    pub(super) fn note_general(&mut self, sql: &str) {
        let bytes = sql.as_bytes();
        if first_word_is(bytes, &["declare"]) {
            self.att.cursor = Some(true);
        } else if first_word_is(bytes, &["prepare"]) {
            if let Some(herd_sql::Wrapper::Prepare { name }) =
                herd_sql::wrapped(sql).map(|w| w.wrapper)
            {
                self.state.general_prepared.insert(name);
                self.att.pinned = true;
            }
        }
    }

    /// Notes a DECLARE that runs on the attached server as it is (its query reads that
    /// group by key, or no distributed table): the block stays on this server.
    pub(super) fn note_cursor(&mut self, text: &[u8]) {
        // Outside a block PostgreSQL refuses the DECLARE, and the ReadyForQuery that says
        // so clears the mark (the block's first statement is translated before its BEGIN's
        // answer, the status still idle).
        if self.att.cursor.is_none() && first_word_is(text, &["declare"]) {
            self.att.cursor = Some(false);
        }
    }
}
