//! The shard map as the proxy keeps it, per database: loaded from shard group 0's primary, and
//! changed by `SELECT herd.create_distributed_table(…)` and its siblings through the endpoint.
//!
//! Durable copy: table `herd.shard_map (version, map jsonb)` in the database, identical on every
//! group's primary (and so on its replicas, through streaming replication). A change inserts the
//! next version on every group inside one two-phase commit: every group PREPAREs it, then group
//! 0 commits first — its committed row is the decision — then the others. A change left in
//! doubt (the proxy died between the two phases) is resolved when the map is next loaded:
//! committed everywhere if any group committed it, else rolled back everywhere.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use herd_shard::{KeyType, ShardMap, TableKind, DEFAULT_SHARD_COUNT};
use tokio_postgres::Client;

mod add_group;
mod definitions;
mod distribute;
mod gate;
mod global;
mod global_views;
mod in_doubt;
mod lookups;
mod moves;
mod names;
mod new_group;

pub use add_group::Admitted;
use definitions::{sequence_strides, table_ddl};
pub use gate::{ChangeScope, ChangeToken, GateFuture, MapGate};
use in_doubt::recover_ddl;
pub use in_doubt::{resolve_database, resolve_in_doubt, IN_DOUBT_AFTER_S, TXN_DECISIONS_DDL};

use crate::monitor::admin_connect_db;
use crate::roles::literal;
use crate::{ProxyContext, ProxyError};

/// The schema, the map's table and the catalog view, created on every group with the first map.
const MAP_DDL: &str = "CREATE SCHEMA IF NOT EXISTS herd;
CREATE TABLE IF NOT EXISTS herd.txn_decisions (
    gid text PRIMARY KEY,
    decided_at timestamptz NOT NULL DEFAULT now());
CREATE TABLE IF NOT EXISTS herd.shard_map (
    version bigint PRIMARY KEY,
    map jsonb NOT NULL,
    changed_at timestamptz NOT NULL DEFAULT now());
CREATE TABLE IF NOT EXISTS herd.move_marks (
    shard int PRIMARY KEY,
    token bigint NOT NULL);
CREATE OR REPLACE FUNCTION herd.shard_moving() RETURNS trigger LANGUAGE plpgsql AS $f$
BEGIN
    RAISE EXCEPTION 'shard % of %.% is moving to shard group %: retry the transaction',
        TG_ARGV[0], TG_TABLE_SCHEMA, TG_TABLE_NAME, TG_ARGV[1]
        USING ERRCODE = '40001';
END $f$;
CREATE OR REPLACE VIEW herd.shards AS
    SELECT (p.ord - 1)::int AS shard, p.grp::int AS shard_group,
           (m.map->'moves'->((p.ord - 1)::text)->>'to')::int AS moving_to,
           CASE WHEN m.map->'moves' ? ((p.ord - 1)::text)
                THEN p.grp::int = (m.map->'moves'->((p.ord - 1)::text)->>'to')::int END AS switched
    FROM (SELECT map FROM herd.shard_map ORDER BY version DESC LIMIT 1) m,
         jsonb_array_elements_text(m.map->'placement') WITH ORDINALITY p(grp, ord);
CREATE OR REPLACE VIEW herd.tables AS
    SELECT t.key AS table_name, t.value->>'kind' AS kind,
           t.value->>'column' AS distribution_column, t.value->>'key_type' AS key_type,
           m.version AS map_version
    FROM (SELECT version, map FROM herd.shard_map ORDER BY version DESC LIMIT 1) m,
         jsonb_each(m.map->'tables') t;";

/// Prepared transactions of map changes are named `herd_map_<version>`.
const GID_PREFIX: &str = "herd_map_";

/// Shard maps by database.
pub struct ShardMaps {
    maps: Mutex<HashMap<String, Arc<ShardMap>>>,
    /// Bumped whenever a map is replaced: statements waiting for a paused shard look again.
    changed: tokio::sync::watch::Sender<u64>,
    /// Per group, a WAL position its replicas must have replayed before they serve a
    /// read-your-writes read: where a moved shard's rows were complete on its new group.
    /// (Sized for the most groups a cluster can have, so a group added later has one.)
    floors: [std::sync::atomic::AtomicU64; herd_config::MAX_SHARDS as usize],
    /// A group is being added: statements every group must run (reference-table writes,
    /// DDL) wait until it is done, so the new group misses none of them.
    adding_group: std::sync::atomic::AtomicBool,
    /// One change at a time.
    changing: tokio::sync::Mutex<()>,
    /// One preparation of new groups at a time.
    preparing: tokio::sync::Mutex<()>,
    /// (database, table OID, column number; 0, 0 for an expression) → its text orders
    /// byte by byte (a C-like collation), as a cross-group merge compares text.
    bytewise: Mutex<HashMap<(String, u32, i16), bool>>,
    /// (database, table) → every text column of the table has a byte-order collation (or
    /// the database's, checked separately): an expression over them sorts in byte order.
    tables_bytewise: Mutex<HashMap<(String, String), bool>>,
    /// Per database, what names mean (schemas, views, function bodies), briefly kept.
    names: names::NamesCache,
    /// The multi-proxy rules around maps, when the embedding gives them ([`MapGate`]).
    gate: std::sync::RwLock<Option<Arc<dyn MapGate>>>,
    /// The general path's global relations on group 0, per database.
    global: global::GlobalCache,
    /// While another proxy's map change holds this one: the maps held when it began, for the
    /// statements of transactions under way (see [`ProxyContext::shard_map_in_transaction`]).
    before_hold: Mutex<HashMap<String, Arc<ShardMap>>>,
    /// The gate's hold generation the last statement saw (a change: a hold began or ended).
    seen_generation: std::sync::atomic::AtomicU64,
}

impl Default for ShardMaps {
    fn default() -> ShardMaps {
        ShardMaps {
            maps: Mutex::default(),
            changed: tokio::sync::watch::channel(0).0,
            floors: Default::default(),
            adding_group: Default::default(),
            changing: tokio::sync::Mutex::default(),
            preparing: tokio::sync::Mutex::default(),
            bytewise: Mutex::default(),
            tables_bytewise: Mutex::default(),
            names: names::NamesCache::default(),
            gate: std::sync::RwLock::default(),
            global: global::GlobalCache::default(),
            before_hold: Mutex::default(),
            seen_generation: Default::default(),
        }
    }
}

fn failed(what: &str, e: impl std::fmt::Display) -> ProxyError {
    ProxyError::Server {
        code: "XX000".into(),
        message: format!("{what}: {e}"),
    }
}

fn refused(code: &str, message: String) -> ProxyError {
    ProxyError::Server {
        code: code.into(),
        message,
    }
}

impl ProxyContext {
    /// The shard map of `database` (empty when the cluster has one group, or nothing is
    /// distributed there yet).
    pub async fn shard_map(&self, database: &str) -> Result<Arc<ShardMap>, ProxyError> {
        self.check_map_use()?;
        if let Some(m) = self
            .shard_maps
            .maps
            .lock()
            .ok()
            .and_then(|m| m.get(database).cloned())
        {
            return Ok(m);
        }
        let generation = self.hold_generation();
        let map = if self.groups() > 1 {
            self.wait_to_load_map(database).await?;
            // Roles made directly on group 0 reach the other groups before sessions need them.
            if let Err(e) = self.sync_roles(database, &[]).await {
                tracing::warn!(error = %e, "copying roles to the other shard groups");
            }
            let clients = match self.each_group_client(database).await {
                Ok(c) => c,
                Err(e) => match self.missing_database(database, e).await {
                    // On group 0 only, nothing distributed: everything runs there, as before
                    // sharding (one server's answers).
                    Err(e) if self.nothing_distributed(database).await => {
                        tracing::warn!(database, error = %e, "a database of shard group 0 only");
                        return Ok(self.install_empty_map(database));
                    }
                    Err(e) | Ok(e) => return Err(e),
                },
            };
            recover(self, &clients).await?;
            if !self.adding_group() && add_group::guards_left(&clients[0]).await {
                // A group addition stopped in the middle (its supervisor with it): its
                // triggers would refuse every reference-table write from now on.
                add_group::drop_guards(&clients[0]).await?;
            }
            let map = read_map(&clients[0]).await?;
            if let Some(m) = &map {
                // Groups added since the tables were distributed get them first.
                let _one_at_a_time = self.shard_maps.preparing.lock().await;
                new_group::prepare(&clients, m).await?;
            }
            match map {
                // Tables dropped while their entries stayed (a crash between a DROP TABLE on
                // every group and its map change) leave the map now.
                Some(m) if !dangling(&clients[0], &m).await?.is_empty() => {
                    drop(clients);
                    return self.forget_dropped(database).await;
                }
                other => other,
            }
        } else {
            None
        };
        let map =
            Arc::new(map.unwrap_or_else(|| ShardMap::new(self.groups(), DEFAULT_SHARD_COUNT)));
        // A hold that began (or ended) during the read may be a change this map predates.
        if self.hold_generation() == generation {
            if let Ok(mut m) = self.shard_maps.maps.lock() {
                m.insert(database.to_string(), map.clone());
            }
        }
        Ok(map)
    }

    /// [`ProxyContext::shard_map`] for a statement of a transaction under way: while another
    /// proxy's map change holds this one, the map held when the hold began, instead of waiting
    /// for the change's end. The transaction may hold locks the change waits for (each would
    /// wait for the other until the statement's wait ran out); it routes as the changing
    /// proxy's own transactions under way do, by the map it started with.
    pub async fn shard_map_in_transaction(
        &self,
        database: &str,
    ) -> Result<Arc<ShardMap>, ProxyError> {
        self.check_map_use()?;
        if self.map_gate().is_some_and(|g| g.held()) {
            let kept = self
                .shard_maps
                .before_hold
                .lock()
                .ok()
                .and_then(|m| m.get(database).cloned());
            if let Some(map) = kept {
                return Ok(map);
            }
        }
        self.shard_map(database).await
    }

    /// Forgets the cached map of `database` (dropped, or created again).
    pub(crate) fn forget_map(&self, database: &str) {
        if let Ok(mut m) = self.shard_maps.maps.lock() {
            m.remove(database);
        }
    }

    /// Admin connections to every group's primary and the map they hold, with any change left
    /// in doubt resolved first (the caller holds the `changing` lock).
    async fn current_map(&self, database: &str) -> Result<(Vec<Client>, ShardMap), ProxyError> {
        let clients = self.group_clients(database).await?;
        recover(self, &clients).await?;
        let current = read_map(&clients[0])
            .await?
            .unwrap_or_else(|| ShardMap::new(self.groups(), DEFAULT_SHARD_COUNT));
        Ok((clients, current))
    }

    /// Admin connections to every group's primary, on `database`; a database that exists on
    /// some groups only is named as such.
    async fn group_clients(&self, database: &str) -> Result<Vec<Client>, ProxyError> {
        match self.each_group_client(database).await {
            Ok(c) => Ok(c),
            Err(e) => Err(self
                .missing_database(database, e)
                .await
                .unwrap_or_else(|e| e)),
        }
    }

    /// `e` (a failure to reach a group on `database`) as the refusal it is when the database
    /// is missing on some groups (`Err`), or `e` itself (`Ok`): a database created directly on
    /// group 0 (or through an endpoint that did not create databases on every group yet)
    /// otherwise fails with an unreachable group's 57P03.
    async fn missing_database(
        &self,
        database: &str,
        e: ProxyError,
    ) -> Result<ProxyError, ProxyError> {
        let mut missing = Vec::new();
        for g in 1..self.groups() {
            let Ok(c) = self
                .group_client(g, "postgres", "to list its databases")
                .await
            else {
                continue;
            };
            let absent = c
                .query_one(
                    "SELECT NOT EXISTS (SELECT 1 FROM pg_database WHERE datname = $1)",
                    &[&database],
                )
                .await
                .is_ok_and(|r| r.get::<_, bool>(0));
            if absent {
                missing.push(g.to_string());
            }
        }
        if missing.is_empty() {
            return Ok(e);
        }
        Err(refused(
            "0A000",
            format!(
                "database {database} is missing on shard group(s) {} (it was created directly on \
                 group 0, or through an endpoint that created databases on group 0 only), so no \
                 table can be distributed in it: create it on those groups too (CREATE DATABASE \
                 through `herd url --group G --primary`, with group 0's owner and locale)",
                missing.join(", ")
            ),
        ))
    }

    /// `database` has no distributed or reference table (read on group 0).
    async fn nothing_distributed(&self, database: &str) -> bool {
        match self
            .group_client(0, database, "to read the shard map")
            .await
        {
            Ok(c) => read_map(&c)
                .await
                .is_ok_and(|m| m.is_none_or(|m| m.tables.is_empty())),
            Err(_) => false,
        }
    }

    /// Caches and returns an empty map for `database`.
    fn install_empty_map(&self, database: &str) -> Arc<ShardMap> {
        let map = Arc::new(ShardMap::new(self.groups(), DEFAULT_SHARD_COUNT));
        if let Ok(mut m) = self.shard_maps.maps.lock() {
            m.insert(database.to_string(), map.clone());
        }
        map
    }

    /// Admin connections to every group's primary, on `database`.
    async fn each_group_client(&self, database: &str) -> Result<Vec<Client>, ProxyError> {
        let mut clients = Vec::new();
        for g in 0..self.groups() {
            clients.push(
                self.group_client(g, database, "to read or change the shard map")
                    .await?,
            );
        }
        Ok(clients)
    }

    /// An admin connection to group `g`'s primary, on `database`; `why` completes the error.
    pub(crate) async fn group_client(
        &self,
        g: u32,
        database: &str,
        why: &str,
    ) -> Result<Client, ProxyError> {
        let primary = self.current_primary_of(g).await?;
        admin_connect_db(&primary, &self.admin, database, Duration::from_secs(5))
            .await
            .ok_or_else(|| {
                ProxyError::Unavailable(format!(
                    "cannot reach shard group {g}'s primary {} {why}",
                    primary.name
                ))
            })
    }

    /// Removes from `database`'s map every table that no longer exists (after a `DROP TABLE`
    /// ran on every group), in one two-phase commit like any map change; the map after.
    pub async fn forget_dropped(&self, database: &str) -> Result<Arc<ShardMap>, ProxyError> {
        let _one_at_a_time = self.begin_map_change(database).await?;
        let (clients, current) = self.current_map(database).await?;
        let gone = dangling(&clients[0], &current).await?;
        let map = if gone.is_empty() {
            current
        } else {
            let mut next = current.clone();
            next.version = current.version + 1;
            for table in &gone {
                next.tables.remove(table);
            }
            commit_everywhere(&self.commits, &clients, &next, &[], &[]).await?;
            tracing::info!(database, tables = ?gone, "dropped tables left the shard map");
            next
        };
        let map = Arc::new(map);
        if let Ok(mut m) = self.shard_maps.maps.lock() {
            m.insert(database.to_string(), map.clone());
        }
        Ok(map)
    }

    /// The table (`schema.name`) of each index in `indexes` (as written), looked up on group 0
    /// where every index of a distributed table also exists; unknown indexes are left out.
    pub async fn index_tables(
        &self,
        database: &str,
        indexes: &[String],
    ) -> Result<Vec<String>, ProxyError> {
        let client = self
            .group_client(0, database, "to look up an index")
            .await?;
        let rows = client
            .query(
                "SELECT n.nspname || '.' || t.relname FROM unnest($1::text[]) x \
                 JOIN pg_index i ON i.indexrelid = to_regclass(x) \
                 JOIN pg_class t ON t.oid = i.indrelid JOIN pg_namespace n ON n.oid = t.relnamespace",
                &[&indexes],
            )
            .await
            .map_err(|e| failed("looking up an index's table", e))?;
        Ok(rows.iter().map(|r| r.get(0)).collect())
    }
}

/// The newest map in `herd.shard_map`, `None` when there is none.
async fn read_map(client: &Client) -> Result<Option<ShardMap>, ProxyError> {
    let rows = client
        .query(
            "SELECT map::text FROM herd.shard_map ORDER BY version DESC LIMIT 1",
            &[],
        )
        .await;
    let rows = match rows {
        Ok(r) => r,
        // No table yet: nothing was ever distributed in this database.
        Err(e) if e.code() == Some(&tokio_postgres::error::SqlState::UNDEFINED_TABLE) => {
            return Ok(None)
        }
        Err(e) => return Err(failed("reading the shard map", e)),
    };
    let Some(row) = rows.first() else {
        return Ok(None);
    };
    let text: String = row.get(0);
    serde_json::from_str(&text)
        .map(Some)
        .map_err(|e| failed("the stored shard map is damaged", e))
}

/// Resolves every map change and every DDL left in doubt on these groups.
async fn recover(ctx: &ProxyContext, clients: &[Client]) -> Result<(), ProxyError> {
    in_doubt::count_resolved(ctx, recover_ddl(clients).await?);
    let mut in_doubt: Vec<(usize, String)> = Vec::new();
    for (g, c) in clients.iter().enumerate() {
        let rows = c
            .query(
                "SELECT gid FROM pg_prepared_xacts WHERE database = current_database() AND gid LIKE 'herd\\_map\\_%'",
                &[],
            )
            .await
            .map_err(|e| failed("looking for shard map changes in doubt", e))?;
        in_doubt.extend(rows.iter().map(|r| (g, r.get::<_, String>(0))));
    }
    for (g, gid) in in_doubt {
        let version: i64 = gid
            .strip_prefix(GID_PREFIX)
            .and_then(|v| v.parse().ok())
            .unwrap_or(-1);
        let mut committed = false;
        for c in clients {
            let row = c
                .query_opt(
                    "SELECT 1 FROM herd.shard_map WHERE version = $1",
                    &[&version],
                )
                .await
                .ok()
                .flatten();
            committed |= row.is_some();
        }
        let verb = if committed { "COMMIT" } else { "ROLLBACK" };
        tracing::warn!(group = g, gid = %gid, "resolving a shard map change left in doubt: {verb}");
        clients[g]
            .batch_execute(&format!("{verb} PREPARED {}", literal(&gid)))
            .await
            .map_err(|e| failed("resolving a shard map change in doubt", e))?;
    }
    Ok(())
}

/// Writes `next` (and, on groups other than 0, `ddl` for tables they lack) on every group in
/// one two-phase commit.
async fn commit_everywhere(
    gate: &crate::commit_gate::CommitGate,
    clients: &[Client],
    next: &ShardMap,
    ddl: &[String],
    per_group: &[Vec<String>],
) -> Result<(), ProxyError> {
    let json = serde_json::to_string(next).map_err(|e| failed("encoding the shard map", e))?;
    let gid = literal(&format!("{GID_PREFIX}{}", next.version));
    let mut prepared: Vec<usize> = Vec::new();
    for (g, c) in clients.iter().enumerate() {
        let mut sql = format!("BEGIN;\n{MAP_DDL}\n");
        if g > 0 {
            for stmt in ddl {
                sql.push_str(stmt);
                sql.push_str(";\n");
            }
        }
        for stmt in per_group.get(g).into_iter().flatten() {
            sql.push_str(stmt);
            sql.push_str(";\n");
        }
        sql.push_str(&format!(
            "INSERT INTO herd.shard_map (version, map) VALUES ({}, {}::jsonb);\nPREPARE TRANSACTION {gid};",
            next.version,
            literal(&json)
        ));
        if let Err(e) = c.batch_execute(&sql).await {
            for p in &prepared {
                let _ = clients[*p]
                    .batch_execute(&format!("ROLLBACK PREPARED {gid}"))
                    .await;
            }
            let detail = e
                .as_db_error()
                .map_or(e.to_string(), |d| d.message().to_string());
            return Err(failed(
                &format!("changing the shard map on shard group {g} failed; nothing was changed"),
                detail,
            ));
        }
        prepared.push(g);
    }
    // Group 0 first: once its commit is durable the change is decided (see `recover`). A
    // second phase: no restore point across groups falls inside it.
    let _second_phase = gate.second_phase().await;
    for (g, c) in clients.iter().enumerate() {
        if let Err(e) = c.batch_execute(&format!("COMMIT PREPARED {gid}")).await {
            return Err(failed(
                &format!(
                    "committing the shard map on shard group {g} failed (it is resolved when the \
                     map is next read)"
                ),
                e,
            ));
        }
    }
    Ok(())
}

/// Tables of `map` that no longer exist (on group 0, whose `client` this is).
async fn dangling(client: &Client, map: &ShardMap) -> Result<Vec<String>, ProxyError> {
    let names: Vec<String> = map.tables.keys().cloned().collect();
    if names.is_empty() {
        return Ok(names);
    }
    let rows = client
        .query(
            "SELECT n FROM unnest($1::text[]) n WHERE to_regclass(n) IS NULL",
            &[&names],
        )
        .await
        .map_err(|e| failed("checking the shard map's tables", e))?;
    Ok(rows.iter().map(|r| r.get(0)).collect())
}

fn quote_qualified(name: &str) -> String {
    name.split('.')
        .map(|p| format!("\"{}\"", p.replace('"', "\"\"")))
        .collect::<Vec<_>>()
        .join(".")
}
