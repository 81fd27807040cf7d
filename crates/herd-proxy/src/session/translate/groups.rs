//! The sharded rule of translation: a statement whose rows are on another shard group than the
//! attached server's is refused in-band (the server itself fails it, so its transaction aborts
//! as PostgreSQL's would), or replaced by the general path's statement.

use herd_wire::frontend::{tag, Bind, Query};
use herd_wire::{encode, Frame};

use super::super::general::Here;
use super::Translator;
use crate::router::track::Expect;
use crate::ProxyError;

impl Translator<'_> {
    /// Why a Query or Bind cannot run on the attached server's shard group (a transaction
    /// stays on the group of its first statement), if it cannot; or the general path's
    /// statement that runs in its place.
    pub(super) fn wrong_group(&mut self, frame: &Frame<'_>) -> Result<Option<Here>, ProxyError> {
        let Some(map) = self.map else {
            return Ok(None);
        };
        let mut sql_of_bind = None;
        let mut bind_types = Vec::new();
        // The names as last read (this check runs inside a transaction, without awaiting),
        // however old: the routing of the unit has just read them (if 3 s old, a name would
        // otherwise be taken as `public`'s, e.g. under `search_path = one`).
        let names = self.ctx.last_names(self.database);
        let resolver = names.as_deref().map(|names| super::super::shard::Resolver {
            names,
            path: self.state.search_path(),
            user: self.user,
        });
        let plan = match frame.tag {
            tag::QUERY => super::super::shard::plan_sql(
                self.ctx,
                map,
                resolver.as_ref(),
                Query::decode(frame.body)?.sql,
                &[],
            ),
            tag::BIND => {
                let b = Bind::decode(frame.body)?;
                let stmt = if b.statement.is_empty() {
                    self.state.unnamed.as_ref().map(|u| &*u.stmt)
                } else {
                    self.state.statements.get(b.statement).map(|s| &**s)
                };
                let types = stmt.map(|s| s.param_types.clone()).unwrap_or_default();
                bind_types = types.clone();
                let sql = stmt.map(|s| s.query.clone());
                let Some(sql) = sql.or_else(|| self.state.passed.get(b.statement).cloned()) else {
                    return Ok(None);
                };
                let plan = super::super::shard::plan_sql(
                    self.ctx,
                    map,
                    resolver.as_ref(),
                    &sql,
                    &super::super::shard::typed_params(b.rest, &types),
                );
                sql_of_bind = Some(sql);
                plan
            }
            _ => return Ok(None),
        };
        if self.spanning {
            let text = match frame.tag {
                tag::QUERY => Query::decode(frame.body)?.sql.to_vec(),
                _ => sql_of_bind.clone().unwrap_or_default(),
            };
            let classified = self
                .ctx
                .classifier
                .get_or_classify(&String::from_utf8_lossy(&text));
            if classified
                .statements
                .iter()
                .any(|s| s.tx != herd_sql::TxEffect::None)
            {
                return Ok(Some(Here::Refuse(
                    super::super::spanning::SPANNING_CONTROL.to_string(),
                )));
            }
        }
        // Only its first word is looked at: a Query's body as it is (the text and its NUL).
        let text: &[u8] = match frame.tag {
            tag::QUERY => frame.body,
            _ => sql_of_bind.as_deref().unwrap_or_default(),
        };
        // A block holding a cursor on group 0 stays there: a read across groups takes the
        // general path there instead of every group's part.
        let plan = match plan {
            herd_shard::Plan::AllGroups { table }
                if self.att.cursor.is_some() && self.att.group == 0 =>
            {
                herd_shard::Plan::General {
                    why: format!(
                        "{table} is distributed, and this transaction block holds a cursor on \
                         group 0's server"
                    ),
                }
            }
            p => p,
        };
        // A block holding a cursor stays on its server (`cursors.rs`).
        if let Some(verdict) = self.held_here(&plan, text, map) {
            return Ok(Some(verdict));
        }
        // A read the fast paths cannot answer: the general path, on group 0.
        if let Some(verdict) = self.general_here(
            &plan,
            frame,
            sql_of_bind.as_deref(),
            bind_types,
            map,
            resolver.as_ref(),
        )? {
            if let Here::General(sql, _) = &verdict {
                self.note_general(sql);
            }
            return Ok(Some(verdict));
        }
        let here = self.att.group;
        if matches!(plan, herd_shard::Plan::Anywhere)
            || matches!(plan, herd_shard::Plan::Group { group, .. } if group == here)
        {
            self.note_cursor(text);
        }
        Ok(match plan {
            herd_shard::Plan::Refuse(why) => Some(why),
            herd_shard::Plan::Everywhere(_)
            | herd_shard::Plan::EachGroup { .. }
            | herd_shard::Plan::CopyIn(_)
            | herd_shard::Plan::CopyOut(_) => Some(super::super::shard::ALONE.to_string()),
            herd_shard::Plan::AllGroups { .. } => {
                Some(super::super::shard::FAN_OUT_ALONE.to_string())
            }
            herd_shard::Plan::WriteAllGroups(_)
            | herd_shard::Plan::InsertSplit(_)
            | herd_shard::Plan::InsertSelect(_)
            | herd_shard::Plan::WriteReference { .. } => {
                Some(super::super::shard::WRITE_ALL_ALONE.to_string())
            }
            herd_shard::Plan::Group { group, .. } if group != here => Some(format!(
                "this statement's rows are on shard group {group}, but it came in one batch with \
                 statements for group {here} (or the session is pinned to group {here}): inside a \
                 transaction, send statements for another group in a query or Sync of their own"
            )),
            _ => None,
        }
        .map(Here::Refuse))
    }

    /// Makes the server itself fail `frame` with 0A000 and `why`, so its transaction aborts
    /// as PostgreSQL's would: a Query becomes a DO block that raises; a Bind binds the client's
    /// portal to such a block (its Execute raises).
    pub(super) fn refuse_here(
        &mut self,
        frame: &Frame<'_>,
        why: &str,
        to_server: &mut Vec<u8>,
    ) -> Result<(), ProxyError> {
        let sql = super::super::shard::raising_sql(why);
        if frame.tag == tag::QUERY {
            encode::query(to_server, &sql)?;
            self.att.tracker.sent(Expect::Query, false, None);
        } else {
            let b = Bind::decode(frame.body)?;
            encode::parse(to_server, "", &sql, &[])?;
            self.att.tracker.sent(Expect::Parse, true, None);
            // The server's unnamed statement is no longer the client's.
            self.att.lease.conn.unnamed = None;
            encode::bind_renamed(to_server, b.portal, "", &[0, 0, 0, 0, 0, 0])?;
            self.att.tracker.sent(Expect::Bind, false, None);
        }
        Ok(())
    }
}
