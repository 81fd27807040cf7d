//! Statements across groups while a shard moves: each group runs them without the rows it
//! hides (the copies made for a move on its target, the rows left on its source after the
//! switch), as `herd_sql::hide_rows` rewrites them. A map without moves rewrites nothing.

use std::borrow::Cow;

use super::shard::not_supported;
use super::Session;
use crate::ProxyError;

impl Session {
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
            .tables
            .iter()
            .filter_map(|(table, kind)| match kind {
                herd_shard::TableKind::Distributed { column, key_type } => Some(herd_sql::Hidden {
                    table: table.clone(),
                    keep: format!(
                        "{} NOT IN ({})",
                        herd_shard::shard_sql(
                            &format!("\"{}\"", column.replace('"', "\"\"")),
                            *key_type,
                            map.shard_count
                        ),
                        shards.join(", ")
                    ),
                }),
                herd_shard::TableKind::Reference => None,
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
