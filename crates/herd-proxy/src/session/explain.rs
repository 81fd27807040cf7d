//! What the endpoint says about where statements run: `SELECT herd.explain('<statement>')`
//! (the plan of any statement, without running it) and `EXPLAIN` of a read across shard groups
//! (the merge step, the statement every group runs, and group 0's own plan of it).

use herd_shard::Plan;
use herd_wire::encode;

use super::shard::plan_sql;
use super::Session;
use crate::ProxyError;

/// Where a read taking the general path runs.
const GENERAL: &str = "shard group 0's primary, over every group's rows (the general path: \
     PostgreSQL answers it over postgres_fdw global tables; read-only, each group read at its \
     own snapshot)";

impl Session {
    /// `herd.explain('<statement>')`: where the statement would run through the endpoint, and
    /// why (parameters are unknown here: a key given as `$n` is planned at Bind time).
    pub(super) async fn explain(&mut self, sql: &str) -> Result<String, ProxyError> {
        let Some(map) = self.active_map().await? else {
            return Ok("shard group 0: nothing is distributed in this database".into());
        };
        let names = self.ctx.names(&self.database).await?;
        let resolver = super::shard::Resolver {
            names: &names,
            path: self.state.search_path(),
            user: &self.user,
        };
        Ok(match plan_sql(&self.ctx, &map, Some(&resolver), sql.as_bytes(), &[]) {
            Plan::Anywhere => {
                "any shard group (it names no table that lives on one group); outside a \
                 transaction it runs on group 0"
                    .into()
            }
            Plan::Group {
                group,
                reason: "key",
            } => {
                format!("shard group {group}: the group that holds its shard key's rows")
            }
            Plan::Group { group, .. } => {
                format!("shard group {group}: tables that are not distributed live there")
            }
            Plan::Everywhere(tag) => {
                format!("every shard group, all or none ({tag} in a two-phase commit)")
            }
            Plan::CopyIn(c) => format!(
                "every shard group: rows split by {} and loaded in one two-phase commit",
                c.key_column
            ),
            Plan::EachGroup { tag, .. } => format!(
                "every shard group, one after the other ({tag} outside a transaction; undone \
                 everywhere if one group fails)"
            ),
            Plan::CopyOut(_) => {
                "every shard group: each group's rows in turn, as one COPY (each group's rows as \
                 of its own snapshot)"
                    .into()
            }
            Plan::WriteReference { tag, .. } => format!(
                "every shard group, all or none ({tag} of a reference table in a two-phase \
                 commit; alone, outside a transaction block)"
            ),
            Plan::InsertSplit(_) => "every shard group its rows, all or none (an INSERT split \
                 by key in a two-phase commit; alone, outside a transaction block)"
                .into(),
            Plan::InsertSelect(i) => format!(
                "every shard group its rows, all or none (the SELECT runs on {}, the proxy \
                 splits its rows by {} into one INSERT … VALUES per group in a two-phase commit; \
                 alone in its query or Sync)",
                match i.source {
                    Some(g) => format!("shard group {g}"),
                    None => "every shard group".into(),
                },
                i.key_column
            ),
            Plan::WriteAllGroups(tag) => format!(
                "every shard group, all or none ({tag} in a two-phase commit; alone, outside a \
                 transaction block)"
            ),
            Plan::AllGroups { .. } => {
                let catalog = self.ctx.catalog();
                match herd_sql::fan_out(sql, &|name| catalog.may_be_aggregate(name)) {
                    Ok(f) if f.combine.is_some() => "every shard group: each group's partial \
                         aggregates, combined by PostgreSQL on group 0's primary (alone, outside a \
                         transaction block)"
                        .into(),
                    Ok(f) if f.sort.is_empty() => "every shard group: the rows of all groups \
                         together (alone, outside a transaction block)"
                        .into(),
                    Ok(_) => "every shard group: each group's rows sorted there, merged in order \
                         by the proxy (alone, outside a transaction block)"
                        .into(),
                    // What the merge cannot finish takes the general path.
                    Err(_) => GENERAL.into(),
                }
            }
            Plan::Refuse(why) => format!("refused with 0A000: {why}"),
            Plan::General { .. } => GENERAL.into(),
        })
    }

    /// Answers `EXPLAIN <prefix options> <statement>` of a read across groups: how the proxy
    /// combines the groups' answers, the statement each group's primary runs, and group 0's
    /// plan of it (each group plans its own rows; group 0's stands for them).
    pub(super) async fn explain_fan_out(
        &mut self,
        unit: &[u8],
        prefix: &str,
        plan: herd_sql::FanOut,
    ) -> Result<(), ProxyError> {
        let groups = self.ctx.groups();
        let mut lines = vec![format!(
            "Herd fan-out: {groups} shard groups, every group's primary at once"
        )];
        lines.push(match (&plan.combine, plan.sort.is_empty()) {
            (Some(_), _) => "  Combine: each group's partial rows, finished by a final query on \
                 group 0's primary (aggregates, GROUP BY, HAVING, DISTINCT, ORDER BY, LIMIT)"
                .to_string(),
            (None, true) => "  Merge: the groups' rows concatenated by the proxy".to_string(),
            (None, false) => format!(
                "  Merge: the groups' sorted rows merged in order by the proxy ({} sort key{}{})",
                plan.sort.len(),
                if plan.sort.len() == 1 { "" } else { "s" },
                match plan.limit {
                    Some(_) => ", LIMIT applied after the merge",
                    None => "",
                }
            ),
        });
        lines.push(format!("  Group statement: {}", plan.sql));
        let explain = format!("{prefix} {}", plan.sql);
        let answer = async {
            let primary = self.ctx.current_primary_of(0).await?;
            let mut lease = self.lease(&primary).await?;
            let rows = lease.conn.internal_query(&explain).await;
            if rows.is_ok() {
                lease.release();
            }
            rows
        };
        match answer.await {
            Ok(rows) => {
                lines.push("  Group 0's plan:".into());
                for row in rows {
                    let text = row.into_iter().flatten().collect::<Vec<_>>().join(" ");
                    for l in text.lines() {
                        lines.push(format!("    {l}"));
                    }
                }
            }
            Err(e) => return self.reply_error(&e, unit).await,
        }
        let mut out = Vec::new();
        encode::row_description_text(&mut out, &["QUERY PLAN"])?;
        for l in &lines {
            encode::data_row(&mut out, &[Some(l.as_bytes())])?;
        }
        encode::command_complete(&mut out, "EXPLAIN")?;
        encode::ready_for_query(&mut out, b'I')?;
        self.out.buf.extend_from_slice(&out);
        Ok(())
    }
}
