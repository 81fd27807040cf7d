//! Two-phase work left in doubt (DDL, COPY, writes on several groups): its decisions, and
//! its resolution when the shard map is read and, in the background, every few seconds.

use std::time::Duration;

use tokio_postgres::Client;

use super::{failed, literal};
use crate::{ProxyContext, ProxyError};

/// The table whose row, written in group 0's part of a two-phase commit, is the commit
/// decision: present once group 0 committed, absent if it rolled back.
pub const TXN_DECISIONS_DDL: &str = "CREATE SCHEMA IF NOT EXISTS herd;
CREATE TABLE IF NOT EXISTS herd.txn_decisions (
    gid text PRIMARY KEY,
    decided_at timestamptz NOT NULL DEFAULT now())";

/// How long a two-phase write or DDL may stay prepared before it counts as abandoned (its
/// session crashed between the phases) and is resolved; a live session finishes in
/// milliseconds.
pub const IN_DOUBT_AFTER_S: u64 = 30;

/// Resolves, every few seconds for as long as the proxy runs, the two-phase writes and DDL of
/// every database with a shard map that were left in doubt (a crash of a session, of Herd, or a
/// group's primary failing over between the phases): committed where group 0's decision row
/// exists, else rolled back, so none keeps its locks.
pub async fn resolve_in_doubt(
    ctx: std::sync::Arc<ProxyContext>,
    mut shutdown: tokio::sync::watch::Receiver<bool>,
) {
    loop {
        tokio::select! {
            _ = tokio::time::sleep(Duration::from_secs(IN_DOUBT_AFTER_S / 3)) => {}
            _ = shutdown.changed() => return,
        }
        if ctx.groups() < 2 || ctx.in_doubt_resolved_elsewhere() {
            continue;
        }
        let databases: Vec<String> = match ctx.shard_maps.maps.lock() {
            Ok(m) => m.keys().cloned().collect(),
            Err(_) => continue,
        };
        for database in databases {
            let outcome = async {
                let clients = ctx.group_clients(&database).await?;
                count_resolved(&ctx, resolve_database(&clients).await?);
                Ok::<(), ProxyError>(())
            };
            if let Err(e) = outcome.await {
                tracing::warn!(database = %database, error = %e, "resolving two-phase work in doubt");
            }
        }
    }
}

/// One database's two-phase work left in doubt, resolved over `clients` (one per shard group,
/// group 0 first, each on that group's primary), and its decisions no group needs any more
/// forgotten; returns how many parts were committed and rolled back. Run by every proxy of a
/// one-host cluster and by the elected coordinator of a multi-host one; safe to run twice at
/// once (both reach the same verdict from group 0's decision row; a second COMMIT/ROLLBACK
/// PREPARED of a gid already resolved fails and is retried as a no-op next round).
pub async fn resolve_database(clients: &[Client]) -> Result<(u64, u64), ProxyError> {
    let resolved = recover_ddl(clients).await?;
    forget_decisions(clients).await?;
    Ok(resolved)
}

/// Deletes decisions no group needs any more: older than ten minutes, their gid prepared
/// nowhere.
async fn forget_decisions(clients: &[Client]) -> Result<(), ProxyError> {
    let mut held: Vec<String> = Vec::new();
    for c in clients {
        let rows = c
            .query(
                "SELECT gid FROM pg_prepared_xacts WHERE database = current_database()",
                &[],
            )
            .await
            .map_err(|e| failed("listing prepared transactions", e))?;
        held.extend(rows.iter().map(|r| r.get::<_, String>(0)));
    }
    if let Some(c) = clients.first() {
        c.execute(
            "DELETE FROM herd.txn_decisions WHERE decided_at < now() - interval '10 minutes' \
             AND gid <> ALL($1)",
            &[&held],
        )
        .await
        .map_err(|e| failed("forgetting old two-phase decisions", e))?;
    }
    Ok(())
}

/// DDL run on every group (`herd_ddl_…`) left in doubt: group 0 commits first and rolls back
/// last, so one still prepared on group 0 was not decided (rolled back everywhere), and one
/// gone from group 0 but prepared elsewhere was committed (committed everywhere).
/// Returns how many parts it committed and rolled back.
pub(super) async fn recover_ddl(clients: &[Client]) -> Result<(u64, u64), ProxyError> {
    // The decisions table (databases whose map predates it get it here, outside any
    // two-phase commit).
    if let Some(c) = clients.first() {
        c.batch_execute(TXN_DECISIONS_DDL)
            .await
            .map_err(|e| failed("creating herd.txn_decisions", e))?;
    }
    // (gid, old enough to be abandoned) per group. A young one may belong to a session between
    // its phases right now: deciding it from a look taken before that session's next step
    // could commit one group and roll back another.
    let mut held: Vec<Vec<(String, bool)>> = Vec::new();
    for c in clients {
        let rows = c
            .query(
                &format!(
                    "SELECT gid, prepared < now() - interval '{IN_DOUBT_AFTER_S} seconds' \
                     FROM pg_prepared_xacts WHERE database = current_database() \
                     AND gid LIKE 'herd\\_ddl\\_%'"
                ),
                &[],
            )
            .await
            .map_err(|e| failed("looking for DDL in doubt", e))?;
        held.push(rows.iter().map(|r| (r.get(0), r.get(1))).collect());
    }
    let (mut committed, mut rolled_back) = (0, 0);
    for (g, gids) in held.iter().enumerate() {
        for (gid, abandoned) in gids {
            if !abandoned {
                continue;
            }
            // Committed only where group 0 committed its part, which holds the decision row;
            // group 0 still holding its part (undecided), or having rolled it back (a later
            // group failed to prepare — its outcome unknown to the session), means roll back.
            let decided = !held[0].iter().any(|(h, _)| h == gid)
                && clients[0]
                    .query_opt("SELECT 1 FROM herd.txn_decisions WHERE gid = $1", &[gid])
                    .await
                    .map_err(|e| failed("reading a two-phase decision", e))?
                    .is_some();
            let verb = if decided { "COMMIT" } else { "ROLLBACK" };
            tracing::warn!(group = g, gid = %gid, "resolving DDL left in doubt: {verb}");
            clients[g]
                .batch_execute(&format!("{verb} PREPARED {}", literal(gid)))
                .await
                .map_err(|e| failed("resolving DDL in doubt", e))?;
            if decided {
                committed += 1;
            } else {
                rolled_back += 1;
            }
        }
    }
    Ok((committed, rolled_back))
}

/// Counts what recovery resolved in `/metrics`.
pub(super) fn count_resolved(ctx: &ProxyContext, (committed, rolled_back): (u64, u64)) {
    let name = "herd_shard_in_doubt_resolved_total";
    ctx.metrics.add(name, "outcome=\"commit\"", committed);
    ctx.metrics.add(name, "outcome=\"rollback\"", rolled_back);
}
