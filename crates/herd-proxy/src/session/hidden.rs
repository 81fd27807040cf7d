//! Statements across groups while a shard moves: each group runs them without the rows it
//! hides (the copies made for a move on its target, the rows left on its source after the
//! switch), as `herd_sql::hide_rows` rewrites them. A map without moves rewrites nothing.

use std::borrow::Cow;

use super::shard::not_supported;
use super::Session;
use crate::ProxyError;

impl Session {
    /// Whether some group hides rows from statements across groups (a move is under way):
    /// only then does each group get its own statement.
    pub(super) fn hides_rows(&self) -> bool {
        self.map.as_ref().is_some_and(|m| m.hides_rows())
    }

    /// `sql` as group `g` runs it when it reads or writes every group: without the rows the
    /// group hides while a shard moves (the map that planned it says which).
    pub(super) fn sql_on_group<'a>(
        &self,
        g: u32,
        sql: &'a str,
    ) -> Result<Cow<'a, str>, ProxyError> {
        let Some(map) = self.map.as_ref().filter(|m| m.hides_rows()) else {
            return Ok(Cow::Borrowed(sql));
        };
        let shards: Vec<String> = map.hidden_on(g).iter().map(u32::to_string).collect();
        if shards.is_empty() {
            return Ok(Cow::Borrowed(sql));
        }
        let hidden: Vec<herd_sql::Hidden> = map
            .distributed()
            .map(|(table, column, key_type)| herd_sql::Hidden {
                table: table.to_string(),
                keep: format!(
                    "{} NOT IN ({})",
                    map.key_shard_sql(column, key_type, None),
                    shards.join(", ")
                ),
            })
            .collect();
        herd_sql::hide_rows(sql, &hidden)
            .map(Cow::Owned)
            .map_err(|e| {
                not_supported(format!(
                    "a shard is moving between groups, and this statement across groups cannot be \
                     made to leave out the rows copied for the move: {e}"
                ))
            })
    }
}
