//! `herd shards verify`: every row of every distributed table on the group the placement rule
//! names, checked inside PostgreSQL with its own hash functions.

use anyhow::{bail, Context};
use herd_cluster::Layout;
use herd_shard::ShardMap;

pub async fn verify(layout: &Layout, database: &str) -> anyhow::Result<()> {
    let groups = crate::status::open_all(layout)?;
    if groups.len() < 2 {
        bail!(
            "this cluster has one shard group: nothing is distributed (see `herd up --shards N`)"
        );
    }
    let mut clients = Vec::new();
    for g in &groups {
        let mut spec = g.conn_spec(&g.state.primary);
        spec.dbname = database.to_string();
        let client = herd_pg::connect(&spec).await.with_context(|| {
            format!(
                "connecting to shard group {}'s primary {} (is the cluster up? `herd up`)",
                g.group(),
                g.state.primary
            )
        })?;
        clients.push(client);
    }
    let Some(map) = stored_map(&clients[0]).await? else {
        crate::output::emitln!("{database}: no distributed table");
        return Ok(());
    };
    let mut misplaced_total = 0i64;
    for (table, column, key_type) in map.distributed() {
        let shard = map.key_shard_sql(column, key_type, None);
        let placement: Vec<String> = map.placement.iter().map(u32::to_string).collect();
        for (g, client) in clients.iter().enumerate() {
            // The group of each row's shard, looked up in the map's placement array; rows a
            // move under way keeps hidden on this group (copied, or not deleted yet) are in
            // their place too.
            let hidden: Vec<String> = map.hidden_on(g as u32).iter().map(u32::to_string).collect();
            let misplaced = if hidden.is_empty() {
                format!("(array[{}])[{shard} + 1] <> {g}", placement.join(","))
            } else {
                format!(
                    "(array[{}])[{shard} + 1] <> {g} and {shard} not in ({})",
                    placement.join(","),
                    hidden.join(",")
                )
            };
            let sql = format!(
                "select count(*), count(*) filter (where {misplaced}), \
                 (array_agg({col}::text) filter (where {misplaced}))[1:5] \
                 from {table}",
                col = quote_ident(column),
                table = quote_qualified(table),
            );
            let row = client
                .query_one(&sql, &[])
                .await
                .with_context(|| format!("checking {table} on shard group {g}"))?;
            let (rows, misplaced): (i64, i64) = (row.get(0), row.get(1));
            let examples: Option<Vec<String>> = row.get(2);
            misplaced_total += misplaced;
            if misplaced == 0 {
                crate::output::emitln!("{table} on group {g}: {rows} rows, all in place");
            } else {
                crate::output::emitln!(
                    "{table} on group {g}: {rows} rows, {misplaced} NOT on the group the rule names (keys e.g. {})",
                    examples.unwrap_or_default().join(", ")
                );
            }
        }
    }
    if misplaced_total > 0 {
        bail!("{misplaced_total} rows are not on the group their key's shard is placed on");
    }
    Ok(())
}

/// The newest shard map stored in the database of `client` (a group's primary); `None` when
/// nothing was ever distributed there.
pub(crate) async fn stored_map(
    client: &tokio_postgres::Client,
) -> anyhow::Result<Option<ShardMap>> {
    let Ok(row) = client
        .query_opt(
            "select map::text from herd.shard_map order by version desc limit 1",
            &[],
        )
        .await
    else {
        // No herd.shard_map table: nothing distributed.
        return Ok(None);
    };
    row.map(|r| {
        serde_json::from_str(&r.get::<_, String>(0))
            .context("the stored shard map (herd.shard_map) is damaged")
    })
    .transpose()
}

fn quote_ident(name: &str) -> String {
    format!("\"{}\"", name.replace('"', "\"\""))
}

fn quote_qualified(name: &str) -> String {
    name.split('.')
        .map(quote_ident)
        .collect::<Vec<_>>()
        .join(".")
}
