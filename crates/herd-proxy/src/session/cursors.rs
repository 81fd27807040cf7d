//! Cursors over distributed tables (issue 40).
//!
//! - `DECLARE c CURSOR FOR <query>` runs where its query would: on the query's group when it
//!   reads one group by key, else on the general path (group 0 over the global relations),
//!   where PostgreSQL keeps the cursor. `FETCH`/`MOVE`/`CLOSE` name no table and go to the
//!   block's server. *Rule:* once a cursor is declared, the transaction block stays on that
//!   server until it ends — a statement for another group (or every group) is refused there,
//!   with the reason, instead of moving the block away from its cursor.

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
    /// Why a statement planned `plan` (its text `text`) is refused because of a cursor of
    /// the transaction block. `None`: it is not (the common case: one field test).
    pub(super) fn held_here(&self, plan: &Plan, text: &[u8], map: &ShardMap) -> Option<Here> {
        let general = self.att.cursor?;
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
                "this cursor reads every shard group through group 0, and a shard is moving \
                 between groups (both hold its rows until the move ends): fetch again once \
                 the move ends"
                    .into(),
            ));
        }
        None
    }

    /// Notes a cursor a statement sent on the general path leaves on group 0's server: the
    /// block stays there.
    pub(super) fn note_general(&mut self, sql: &str) {
        if first_word_is(sql.as_bytes(), &["declare"]) {
            self.att.cursor = Some(true);
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
