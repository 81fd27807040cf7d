//! The general path in the session: a read the fast paths refuse for want of a construct
//! (`Plan::General`, or a read across groups whose shape the merge cannot finish) runs on
//! group 0's primary, its distributed tables pointed at their global relations
//! (`herd_global`, see `shards/global.rs`), and PostgreSQL's answer is the client's.
//!
//! Read-only, and refused where its answer could differ from one server's:
//! - while a shard moves between groups (both groups hold the shard's rows then);
//! - inside a transaction block attached to another group than 0, spanning groups, or that
//!   may have written: postgres_fdw reads each group in a remote transaction of its own, which
//!   would not see that transaction's own writes.
//!
//! Only statements already headed for a refusal come here: nothing is added to a statement a
//! fast path answers.

use std::cell::RefCell;

use herd_shard::{ShardMap, TableKind};
use herd_wire::encode;
use herd_wire::frontend::Bind;

use super::shard::Resolver;
use super::translate::Translator;
use crate::router::track::Expect;
use crate::ProxyContext;

/// The general path's statement for `sql`, or the reason to refuse it (`why`: the fast
/// path's refusal, completed with why the general path cannot take it either).
pub(super) fn general_sql(
    ctx: &ProxyContext,
    map: &ShardMap,
    resolver: Option<&Resolver<'_>>,
    database: &str,
    sql: &[u8],
    why: &str,
) -> Result<String, String> {
    let not = |reason: &str| format!("{why} (nor can the general path answer it: {reason})");
    if map.hides_rows() {
        return Err(not(
            "a shard is moving between groups; it answers such reads again once the move ends",
        ));
    }
    let global = ctx
        .cached_global(database)
        .ok_or_else(|| not("its global tables are not built yet"))?;
    let r = resolver.ok_or_else(|| not("the catalog's names are not known yet"))?;
    let schemas = r
        .names
        .schemas_for(&r.path, r.user)
        .ok_or_else(|| not("the session's search_path was changed with set_config()"))?;
    let text = std::str::from_utf8(sql).map_err(|_| not("the statement is not UTF-8"))?;
    let missing = RefCell::new(None);
    let rewritten = herd_sql::globalize(text, &|schema, name| {
        let resolved = match schema {
            Some(s) => format!("{s}.{name}"),
            None => r.names.resolve(name, &schemas),
        };
        let key = herd_shard::qualified(&resolved);
        match map.table(&resolved) {
            Some(TableKind::Distributed { .. }) => {
                let found = global.relations.get(&key).cloned();
                if found.is_none() {
                    *missing.borrow_mut() = Some(format!(
                        "{key} has no global table yet (distributed after they were built); retry"
                    ));
                }
                found
            }
            // A view over distributed tables: its global view (`shards/global_views.rs`).
            _ if global.views.contains_key(&key) => global.views.get(&key).cloned(),
            _ if r.names.views.contains_key(&key) => {
                if let Some(why) = global.refused_views.get(&key) {
                    *missing.borrow_mut() = Some(format!("view {key} has no global view: {why}"));
                } else if herd_shard::view_reads_distributed(r.names, map, &key).is_some() {
                    *missing.borrow_mut() = Some(format!(
                        "view {key} has no global view yet (made after they were built); retry"
                    ));
                }
                None
            }
            _ => None,
        }
    })
    .map_err(|e| not(&e))?;
    if let Some(why) = missing.into_inner() {
        // A table or view the global relations were not built with would be read on group 0
        // only.
        return Err(not(&why));
    }
    Ok(rewritten)
}

/// What becomes of a Query or Bind that cannot run as it is on the attached server.
pub(super) enum Here {
    /// Refused in-band, with this reason.
    Refuse(String),
    /// The general path's statement, and the Bind's statement's parameter types.
    General(String, Vec<u32>),
}

impl Translator<'_> {
    /// For a statement planned `plan` that the fast paths cannot answer (`Plan::General`, or
    /// a read across groups whose shape the merge cannot finish): the general path's
    /// statement, or its refusal where the general path cannot run (a transaction block on
    /// another group, spanning groups, or that may have written). `None`: not such a
    /// statement. `bind_sql`: the Bind's statement text.
    pub(super) fn general_here(
        &self,
        plan: &herd_shard::Plan,
        frame: &herd_wire::Frame<'_>,
        bind_sql: Option<&[u8]>,
        bind_types: Vec<u32>,
        map: &ShardMap,
        resolver: Option<&Resolver<'_>>,
    ) -> Result<Option<Here>, crate::ProxyError> {
        let text = || -> Result<Vec<u8>, crate::ProxyError> {
            Ok(match frame.tag {
                herd_wire::frontend::tag::QUERY => {
                    herd_wire::frontend::Query::decode(frame.body)?.sql.to_vec()
                }
                _ => bind_sql.unwrap_or_default().to_vec(),
            })
        };
        let why = match plan {
            herd_shard::Plan::General { why } => why.clone(),
            herd_shard::Plan::AllGroups { table } => {
                let catalog = self.ctx.catalog();
                match herd_sql::fan_out(&String::from_utf8_lossy(&text()?), &|name| {
                    catalog.may_be_aggregate(name)
                }) {
                    Ok(_) => return Ok(None),
                    Err(why) => format!(
                        "{why} ({table} is distributed: add a condition on its shard key to \
                         read one group)"
                    ),
                }
            }
            _ => return Ok(None),
        };
        let in_block = self.att.status != b'I';
        if self.att.group != 0 || self.spanning || (in_block && self.att.wrote) {
            return Ok(Some(Here::Refuse(format!(
                "{why} (nor can the general path answer it here: it reads every group on \
                 group 0, in remote transactions of its own, so not inside a transaction \
                 block that is on another group or has written: run it outside the \
                 transaction block, or first in it)"
            ))));
        }
        let sql = general_sql(self.ctx, map, resolver, self.database, &text()?, &why);
        Ok(Some(match sql {
            Ok(sql) => Here::General(sql, bind_types),
            Err(why) => Here::Refuse(why),
        }))
    }

    /// Sends the general path's statement `sql` in place of the client's Query, or of the
    /// client's Bind (`types`: its statement's parameter types): the server's unnamed
    /// statement becomes `sql`, and the client's portal is bound to it with the client's
    /// parameters and result formats.
    pub(super) fn send_general(
        &mut self,
        frame: &herd_wire::Frame<'_>,
        sql: &str,
        types: &[u32],
        to_server: &mut Vec<u8>,
    ) -> Result<(), crate::ProxyError> {
        self.ctx.metrics.inc_labels(
            "herd_shard_routed_total",
            &[("group", "0"), ("reason", "general")],
        );
        if frame.tag == herd_wire::frontend::tag::QUERY {
            encode::query(to_server, sql)?;
            // A simple query drops the unnamed statement (PostgreSQL's exec_simple_query).
            self.state.unnamed = None;
            self.att.lease.conn.unnamed = None;
            self.att.tracker.sent(Expect::Query, false, None);
        } else {
            let b = Bind::decode(frame.body)?;
            encode::parse(to_server, "", sql, types)?;
            self.att.tracker.sent(Expect::Parse, true, None);
            // The server's unnamed statement is no longer the client's.
            self.att.lease.conn.unnamed = None;
            encode::bind_renamed(to_server, b.portal, "", b.rest)?;
            self.att.tracker.sent(Expect::Bind, false, None);
        }
        Ok(())
    }
}

impl super::Session {
    /// Readies the general path for a statement the fast paths refuse with `why`: the global
    /// relations built or checked on group 0, and the statement rewritten once to see that it
    /// can be (the translator rewrites it again when it is sent). `Err`: refused, with why.
    pub(super) async fn general_route(
        &self,
        map: &ShardMap,
        names: &std::sync::Arc<herd_shard::Names>,
        resolver: &Resolver<'_>,
        sql: &str,
        why: &str,
    ) -> Result<(), crate::ProxyError> {
        use super::shard::not_supported;
        if !self.parked.is_empty() {
            return Err(not_supported(format!(
                "{why} (nor can the general path answer it inside a transaction that spans \
                 shard groups: its remote reads would not see the transaction's writes)"
            )));
        }
        if map.hides_rows() {
            return Err(not_supported(format!(
                "{why} (nor can the general path answer it while a shard moves between groups; \
                 it does again once the move ends)"
            )));
        }
        self.ctx
            .global_tables(&self.database, map, names)
            .await
            .map_err(|e| {
                not_supported(format!(
                    "{why} (nor can the general path answer it: its global tables on group 0 \
                     could not be made ready: {e})"
                ))
            })?;
        general_sql(
            &self.ctx,
            map,
            Some(resolver),
            &self.database,
            sql.as_bytes(),
            why,
        )
        .map(|_| ())
        .map_err(not_supported)
    }
}
