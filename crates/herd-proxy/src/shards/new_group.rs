//! A shard group added to a cluster whose database already distributes tables (`herd up
//! --shards N` with a larger N): before the map is used, the new group gets Herd's schema, every
//! mapped table (group 0's definitions), the reference tables' rows and the map itself, in one
//! transaction of its own (so a group holding the map holds everything); then the distributed
//! tables' sequences of every group count in steps of the new number of groups, each past every
//! value handed out so far, so ids stay unique across groups. The new group holds no shard until
//! `herd shards rebalance` (or `herd shards move`) gives it some.

use tokio_postgres::Client;

use herd_shard::{ShardMap, TableKind};

use super::definitions::owned_sequences;
use super::{failed, quote_qualified, read_map, table_ddl, MAP_DDL};
use crate::ProxyError;

/// Prepares every group of `clients` (group order) that does not hold the map yet; the groups
/// prepared.
pub(super) async fn prepare(clients: &[Client], map: &ShardMap) -> Result<Vec<usize>, ProxyError> {
    let mut added = Vec::new();
    for (g, c) in clients.iter().enumerate().skip(1) {
        if read_map(c).await?.is_none() {
            added.push(g);
        }
    }
    if added.is_empty() || map.tables.is_empty() {
        return Ok(Vec::new());
    }
    let mut ddl = Vec::new();
    for table in map.tables.keys() {
        ddl.extend(table_ddl(&clients[0], table).await?);
    }
    let json = serde_json::to_string(map).map_err(|e| failed("encoding the shard map", e))?;
    for &g in &added {
        let c = &clients[g];
        let mut sql = format!("BEGIN;\n{MAP_DDL}\n");
        for stmt in &ddl {
            sql.push_str(stmt);
            sql.push_str(";\n");
        }
        let done = async {
            c.batch_execute(&sql).await?;
            for (table, kind) in &map.tables {
                if *kind != TableKind::Reference {
                    continue;
                }
                // Reference tables are small by design: their rows travel as one JSON value.
                let name = quote_qualified(table);
                let rows: Option<String> = clients[0]
                    .query_one(&format!("SELECT json_agg(t)::text FROM {name} t"), &[])
                    .await?
                    .get(0);
                if let Some(rows) = rows {
                    c.execute(
                        &format!(
                            "INSERT INTO {name} SELECT * FROM json_populate_recordset(NULL::{name}, $1::text::json)"
                        ),
                        &[&rows],
                    )
                    .await?;
                }
            }
            c.execute(
                "INSERT INTO herd.shard_map (version, map) VALUES ($1, $2::text::jsonb)",
                &[&(map.version as i64), &json],
            )
            .await?;
            c.batch_execute("COMMIT").await
        };
        if let Err(e) = done.await {
            let _ = c.batch_execute("ROLLBACK").await;
            return Err(failed(
                &format!("preparing the new shard group {g} (its tables from group 0)"),
                e,
            ));
        }
        tracing::warn!(
            group = g,
            tables = map.tables.len(),
            "a new shard group received the distributed and reference tables"
        );
    }
    restride(clients, map, clients.len() - added.len()).await?;
    Ok(added)
}

/// Every distributed table's sequences on every group: increment × groups, restarted at the
/// group's next value past the highest handed out anywhere (they counted in steps of `before`
/// groups until now). Writers may be taking values meanwhile (a group added while the cluster
/// runs): every group's sequence is locked first (`ALTER SEQUENCE` waits for the transactions
/// that took a value and holds back `nextval` until its commit), so the highest value read is
/// the highest there will be under the old spacing.
async fn restride(clients: &[Client], map: &ShardMap, before: usize) -> Result<(), ProxyError> {
    for (table, ..) in map.distributed() {
        for (seq, increment, start) in owned_sequences(&clients[0], table).await? {
            let step = increment / (before.max(1) as i64);
            if step == 0 {
                continue;
            }
            let respaced = respace(clients, &seq, increment, start, step).await;
            for c in clients {
                // Committed where all went well, rolled back everywhere otherwise.
                let end = if respaced.is_ok() {
                    "COMMIT"
                } else {
                    "ROLLBACK"
                };
                let _ = c.batch_execute(end).await;
            }
            respaced.map_err(|e| failed("spacing a sequence over the new number of groups", e))?;
        }
    }
    Ok(())
}

/// Locks `seq` on every group (each in a transaction the caller ends), reads the highest value
/// handed out and restarts each group's at its own residue past it.
async fn respace(
    clients: &[Client],
    seq: &str,
    increment: i64,
    start: i64,
    step: i64,
) -> Result<(), tokio_postgres::Error> {
    let n = clients.len() as i64;
    let mut highest = start;
    for c in clients {
        // `session_replication_role = replica`: a group being added keeps DDL of clients away
        // with an event trigger; Herd's own statements pass it.
        c.batch_execute(&format!(
            "BEGIN; SET LOCAL session_replication_role = replica;              SET LOCAL lock_timeout = '{RESPACE_LOCK_TIMEOUT_S}s';              ALTER SEQUENCE {seq} INCREMENT BY {increment}"
        ))
        .await?;
        let row = c
            .query_one(&format!("SELECT last_value FROM {seq}"), &[])
            .await?;
        highest = highest.max(row.get(0));
    }
    let past = next_index(start, step, highest);
    for (g, c) in clients.iter().enumerate() {
        let index = past + (g as i64 - past).rem_euclid(n);
        c.batch_execute(&format!(
            "ALTER SEQUENCE {seq} INCREMENT BY {} RESTART WITH {}",
            step * n,
            start + index * step
        ))
        .await?;
    }
    Ok(())
}

/// How long re-spacing a sequence waits for the transactions holding it.
const RESPACE_LOCK_TIMEOUT_S: u64 = 10;

/// The first index i (value `start + i × step`) beyond `highest`.
fn next_index(start: i64, step: i64, highest: i64) -> i64 {
    ((highest - start) / step + 1).max(0)
}

#[cfg(test)]
mod tests {
    use super::next_index;

    #[test]
    fn restarts_past_every_value_handed_out() {
        // Start 1, step 1: values 1, 2, …; highest 10 → index 10 (value 11).
        assert_eq!(next_index(1, 1, 10), 10);
        assert_eq!(next_index(1, 1, 1), 1);
        // Step 5 from 100: highest 117 → index 4 (value 120).
        assert_eq!(next_index(100, 5, 117), 4);
        // Nothing handed out below start.
        assert_eq!(next_index(10, 1, 3), 0);
        // Group g of n takes the first index ≥ past with index ≡ g (mod n): distinct residues.
        let (past, n) = (next_index(1, 1, 10), 3i64);
        let firsts: Vec<i64> = (0..n).map(|g| past + (g - past).rem_euclid(n)).collect();
        assert_eq!(firsts, vec![12, 10, 11]);
    }
}
