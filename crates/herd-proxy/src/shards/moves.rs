//! The proxy's part of an online shard move (`herd shards move`, which copies the rows with a
//! logical copy and calls these through the endpoint):
//!
//! - `herd.move_begin(shard, group)`: the map records the move; the rows copied to the target
//!   group are hidden there from every statement until the switch.
//! - `herd.move_switch(shard)`: statements on the shard wait at the proxy; on the source group
//!   a trigger refuses every later write of the shard's rows (creating it waits for the
//!   transactions writing the shard's tables, so none is still running); a marker row written
//!   on the source then reaches the target through the copy, which proves every earlier change
//!   arrived; the map names the target (two-phase commit on every group) and the statements
//!   go on there. Bounded: past `SWITCH_LIMIT` the switch is undone and the answer says so.
//! - `herd.move_finish(shard)`: once the copy is dropped and the source's rows deleted, the map
//!   forgets the move (and the source's trigger goes).
//! - `herd.move_cancel(shard)`: before the switch, forgets the move (the caller deletes the
//!   copied rows on the target first).

use std::sync::Arc;
use std::time::{Duration, Instant};

use herd_shard::{ShardMap, ShardMove};
use tokio_postgres::Client;

use super::{commit_everywhere, failed, quote_qualified, refused};
use crate::{ProxyContext, ProxyError};

/// How long a switch may keep the shard's statements waiting before it is undone.
pub const SWITCH_LIMIT: Duration = Duration::from_secs(5);

/// How long one attempt to create the source's trigger may queue behind writers (others'
/// writes of the table queue behind it meanwhile, so attempts are short and repeated).
const GUARD_LOCK_TIMEOUT_MS: u64 = 100;

/// Name of the source's triggers for `shard` (a plain identifier: no quoting needed).
fn guard_name(shard: u32, which: &str) -> String {
    format!("herd_move_{shard}_{which}")
}

fn shard_arg(args: &[String]) -> Result<u32, ProxyError> {
    args.first()
        .and_then(|a| a.trim().parse().ok())
        .ok_or_else(|| refused("22023", "the first argument is a shard number".into()))
}

impl ProxyContext {
    /// Runs a `herd.move_*` function; `None` when `function` is not one.
    pub(super) async fn move_call(
        &self,
        database: &str,
        function: &str,
        args: &[String],
    ) -> Option<Result<String, ProxyError>> {
        let answer = match function {
            "move_begin" => self.move_begin(database, args).await,
            "move_switch" => self.move_switch(database, args).await,
            "move_finish" => self.move_end(database, args, true).await,
            "move_cancel" => self.move_end(database, args, false).await,
            _ => return None,
        };
        Some(answer)
    }

    async fn move_begin(&self, database: &str, args: &[String]) -> Result<String, ProxyError> {
        let shard = shard_arg(args)?;
        let to: u32 = args
            .get(1)
            .and_then(|a| a.trim().parse().ok())
            .ok_or_else(|| refused("22023", "the second argument is a shard group".into()))?;
        let _one_at_a_time = self.begin_map_change(database).await?;
        let (clients, current) = self.current_map(database).await?;
        let from = *current.placement.get(shard as usize).ok_or_else(|| {
            refused(
                "22023",
                format!(
                    "there is no shard {shard}: the map has {} (0 to {})",
                    current.shard_count,
                    current.shard_count.saturating_sub(1)
                ),
            )
        })?;
        if to >= self.groups() {
            return Err(refused(
                "22023",
                format!(
                    "there is no shard group {to}: the cluster has {}",
                    self.groups()
                ),
            ));
        }
        if let Some(m) = current.moves.get(&shard) {
            if m.to == to && !current.switched(shard) {
                return Ok(format!(
                    "shard {shard} is moving from group {} to {to}",
                    m.from
                ));
            }
            return Err(refused(
                "55000",
                format!(
                    "shard {shard} is already moving from group {} to {}; finish that move first",
                    m.from, m.to
                ),
            ));
        }
        if from == to {
            return Err(refused(
                "22023",
                format!("shard {shard} is on group {to} already"),
            ));
        }
        let mut next = current.clone();
        next.version += 1;
        next.moves.insert(shard, ShardMove { from, to });
        commit_everywhere(&self.commits, &clients, &next, &[], &[]).await?;
        self.install_map(database, next);
        Ok(format!("shard {shard} is moving from group {from} to {to}"))
    }

    async fn move_switch(&self, database: &str, args: &[String]) -> Result<String, ProxyError> {
        let shard = shard_arg(args)?;
        let _one_at_a_time = self.begin_map_change(database).await?;
        let (clients, current) = self.current_map(database).await?;
        let Some(m) = current.moves.get(&shard).cloned() else {
            return Err(refused("55000", format!("shard {shard} is not moving")));
        };
        if current.switched(shard) {
            return Ok(format!(
                "shard {shard} was switched to group {} already",
                m.to
            ));
        }
        let started = Instant::now();
        let mut paused = current.clone();
        paused.paused.insert(shard);
        self.install_map(database, paused);
        // Guard and marker are bounded; the map's two-phase commit, once begun, is not cut
        // short (a change cut between its phases would leave the proxy unsure of its own map).
        let ready = tokio::time::timeout(
            SWITCH_LIMIT,
            self.switch_ready(&clients, &current, shard, &m),
        )
        .await
        .unwrap_or_else(|_| {
            Err(refused(
                "57014",
                format!(
                    "the switch of shard {shard} did not finish within {} s (transactions writing its tables on group {} stayed open, or the copy lags); nothing changed, writes go on: retry",
                    SWITCH_LIMIT.as_secs(),
                    m.from
                ),
            ))
        });
        let mut next = current.clone();
        next.version += 1;
        next.placement[shard as usize] = m.to;
        let switched = match ready {
            Ok(floor) => match commit_everywhere(&self.commits, &clients, &next, &[], &[]).await {
                Ok(()) => Ok(floor),
                // Decided or not, the stored map says which (reading it resolves a change
                // left in doubt).
                Err(e) => match self.current_map(database).await {
                    Ok((_, stored)) if stored.switched(shard) => Ok(floor),
                    Ok(_) => Err(e),
                    Err(unread) => {
                        // Unknown: the guard stays (the shard's writes are refused, never
                        // lost) and statements stop waiting; the next run of the move settles
                        // it.
                        self.install_map(database, current);
                        return Err(failed(
                            &format!("switching shard {shard} ({e}); the map cannot be read now"),
                            unread,
                        ));
                    }
                },
            },
            Err(e) => Err(e),
        };
        match switched {
            Ok(floor) => {
                self.raise_read_floor(m.to, floor);
                self.install_map(database, next);
                let paused_ms = started.elapsed().as_millis();
                self.metrics.inc("herd_shard_moves_switched_total", "");
                Ok(format!(
                    "shard {shard} switched from group {} to {}; its statements waited {paused_ms} ms",
                    m.from, m.to
                ))
            }
            Err(e) => {
                // Writes of the shard go on at the source: its trigger goes.
                let _ = drop_guards(&clients[m.from as usize], &current, shard).await;
                self.install_map(database, current);
                Err(e)
            }
        }
    }

    /// The switch's preparation, with the shard paused: the guard, then the marker through the
    /// copy. The target's WAL position holding every row of the shard.
    async fn switch_ready(
        &self,
        clients: &[Client],
        current: &ShardMap,
        shard: u32,
        m: &ShardMove,
    ) -> Result<herd_core::Lsn, ProxyError> {
        let source = &clients[m.from as usize];
        let target = &clients[m.to as usize];
        create_guards(source, current, shard, m.to).await?;
        let token: i64 = rand::random::<i64>().abs();
        source
            .execute(
                "INSERT INTO herd.move_marks (shard, token) VALUES ($1, $2) \
                 ON CONFLICT (shard) DO UPDATE SET token = excluded.token",
                &[&(shard as i32), &token],
            )
            .await
            .map_err(|e| failed("writing the move's marker on the source group", e))?;
        // Changes arrive in commit order: once the marker is on the target, so is every change
        // of the shard committed before it (and the trigger admits none after).
        loop {
            let row = target
                .query_opt(
                    "SELECT token, pg_current_wal_lsn()::text FROM herd.move_marks WHERE shard = $1",
                    &[&(shard as i32)],
                )
                .await
                .map_err(|e| failed("reading the move's marker on the target group", e))?;
            if let Some(row) = row.filter(|r| r.get::<_, i64>(0) == token) {
                let lsn: String = row.get(1);
                durable_on_target(target).await?;
                return Ok(lsn.parse().unwrap_or(herd_core::Lsn(0)));
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }

    /// Forgets the move of the shard in `args`: after its cleanup (`finished`: switched, the
    /// source's rows deleted) or instead of its switch.
    async fn move_end(
        &self,
        database: &str,
        args: &[String],
        finished: bool,
    ) -> Result<String, ProxyError> {
        let shard = shard_arg(args)?;
        let _one_at_a_time = self.begin_map_change(database).await?;
        let (clients, current) = self.current_map(database).await?;
        let Some(m) = current.moves.get(&shard).cloned() else {
            return Ok(format!("shard {shard} is not moving"));
        };
        if current.switched(shard) != finished {
            return Err(refused(
                "55000",
                if finished {
                    format!("shard {shard} has not switched to group {} yet", m.to)
                } else {
                    format!(
                        "shard {shard} has switched to group {} already: finish the move instead",
                        m.to
                    )
                },
            ));
        }
        drop_guards(&clients[m.from as usize], &current, shard).await?;
        let mut next = current.clone();
        next.version += 1;
        next.moves.remove(&shard);
        commit_everywhere(&self.commits, &clients, &next, &[], &[]).await?;
        self.install_map(database, next);
        Ok(if finished {
            format!("shard {shard} moved from group {} to {}", m.from, m.to)
        } else {
            format!("the move of shard {shard} to group {} is cancelled", m.to)
        })
    }

    /// Raises group `group`'s read floor to `lsn` (never lowers it).
    fn raise_read_floor(&self, group: u32, lsn: herd_core::Lsn) {
        if let Some(f) = self.shard_maps.floors.get(group as usize) {
            f.fetch_max(lsn.0, std::sync::atomic::Ordering::Relaxed);
        }
    }

    /// The WAL position group `group`'s replicas must have replayed before serving a
    /// read-your-writes read (0 until a shard moved there).
    pub fn read_floor(&self, group: u32) -> herd_core::Lsn {
        herd_core::Lsn(
            self.shard_maps
                .floors
                .get(group as usize)
                .map_or(0, |f| f.load(std::sync::atomic::Ordering::Relaxed)),
        )
    }

    /// A receiver that sees every replacement of a shard map.
    pub(crate) fn map_changes(&self) -> tokio::sync::watch::Receiver<u64> {
        self.shard_maps.changed.subscribe()
    }

    /// Replaces the proxy's copy of `database`'s map and wakes statements waiting on it.
    pub(crate) fn install_map(&self, database: &str, map: ShardMap) {
        if let Ok(mut maps) = self.shard_maps.maps.lock() {
            maps.insert(database.to_string(), Arc::new(map));
        }
        self.shard_maps.changed.send_modify(|v| *v += 1);
    }
}

/// Waits until the target group holds every row the copy applied as durably as its commit
/// mode holds any commit: the copy applies without waiting for the target's synchronous
/// standbys (one apply worker waiting on each of its transactions could not keep up with the
/// source's writers), so before the map names the target — after which the source's rows are
/// deleted — one transaction on the target commits with `synchronous_commit = on`. Its commit
/// waits for the standbys to hold the WAL up to it, so every row applied before it too.
async fn durable_on_target(target: &Client) -> Result<(), ProxyError> {
    target
        .batch_execute(
            "BEGIN; SET LOCAL synchronous_commit = on; \
             SELECT pg_logical_emit_message(true, 'herd_move', 'switch'); COMMIT",
        )
        .await
        .map_err(|e| failed("making the copied rows durable on the target group", e))
}

/// On the source group: triggers that refuse writes of the shard's rows, on every distributed
/// table, in one transaction. Creating a trigger waits for the transactions that are writing
/// the table (and makes later writers of the table queue behind it): each attempt waits at
/// most `GUARD_LOCK_TIMEOUT_MS`, and attempts repeat until the caller's bound.
async fn create_guards(
    source: &Client,
    map: &ShardMap,
    shard: u32,
    to: u32,
) -> Result<(), ProxyError> {
    let mut sql = String::new();
    for (table, column, key_type) in map.distributed() {
        let table = quote_qualified(table);
        for (which, events, row) in [
            ("new", "INSERT OR UPDATE", "NEW"),
            ("old", "UPDATE OR DELETE", "OLD"),
        ] {
            let name = guard_name(shard, which);
            let key = map.key_shard_sql(column, key_type, Some(row));
            sql.push_str(&format!(
                "DROP TRIGGER IF EXISTS {name} ON {table}; \
                 CREATE TRIGGER {name} BEFORE {events} ON {table} FOR EACH ROW \
                 WHEN ({key} = {shard}) EXECUTE FUNCTION herd.shard_moving('{shard}', '{to}');"
            ));
        }
    }
    with_short_locks(
        source,
        &sql,
        "guarding the moving shard's rows on the source group",
    )
    .await
}

/// Drops the source's triggers of the shard (those present).
async fn drop_guards(source: &Client, map: &ShardMap, shard: u32) -> Result<(), ProxyError> {
    let mut sql = String::new();
    for (table, ..) in map.distributed() {
        let table = quote_qualified(table);
        for which in ["new", "old"] {
            sql.push_str(&format!(
                "DROP TRIGGER IF EXISTS {} ON {table};",
                guard_name(shard, which)
            ));
        }
    }
    with_short_locks(
        source,
        &sql,
        "dropping the moved shard's guard on the source group",
    )
    .await
}

/// Runs `sql` (DDL on tables others use) in one transaction whose lock waits are short, again
/// and again until it gets its locks: a long wait would make everyone else's statements on the
/// table queue behind it. The caller bounds the whole.
pub(super) async fn with_short_locks(
    client: &Client,
    sql: &str,
    what: &str,
) -> Result<(), ProxyError> {
    let sql = format!("BEGIN; SET LOCAL lock_timeout = '{GUARD_LOCK_TIMEOUT_MS}ms'; {sql} COMMIT;");
    loop {
        match client.batch_execute(&sql).await {
            Ok(()) => return Ok(()),
            Err(e) if e.code() == Some(&tokio_postgres::error::SqlState::LOCK_NOT_AVAILABLE) => {
                let _ = client.batch_execute("ROLLBACK").await;
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            Err(e) => {
                let _ = client.batch_execute("ROLLBACK").await;
                return Err(failed(what, e));
            }
        }
    }
}
