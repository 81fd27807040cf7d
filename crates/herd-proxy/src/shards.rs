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
mod gate;
mod in_doubt;
mod lookups;
mod moves;
mod names;
mod new_group;

pub use add_group::Admitted;
use definitions::{sequence_strides, table_ddl};
pub use gate::{ChangeToken, GateFuture, MapGate};
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
        if let Ok(mut m) = self.shard_maps.maps.lock() {
            m.insert(database.to_string(), map.clone());
        }
        Ok(map)
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
            commit_everywhere(&clients, &next, &[], &[]).await?;
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

    /// Runs `SELECT herd.<function>(args…)`; the text is the function's one-row answer.
    pub async fn herd_call(
        &self,
        database: &str,
        function: &str,
        args: &[String],
    ) -> Result<String, ProxyError> {
        if self.groups() < 2 {
            return Err(refused(
                "0A000",
                format!(
                    "herd.{function}: this cluster has one shard group, so nothing is distributed; \
                     create it with `herd up --shards N`"
                ),
            ));
        }
        if let Some(answer) = self.move_call(database, function, args).await {
            return answer;
        }
        let _one_at_a_time = self.begin_map_change(database).await?;
        let (clients, current) = self.current_map(database).await?;
        if let Some((shard, m)) = current.moves.iter().next() {
            return Err(refused(
                "55000",
                format!(
                    "herd.{function} waits until shard {shard} has moved from group {} to {} \
                     (`herd shards move` finishes or cancels it)",
                    m.from, m.to
                ),
            ));
        }
        let mut next = current.clone();
        next.version = current.version + 1;
        let mut per_group: Vec<Vec<String>> = Vec::new();
        let (answer, ddl) = match (function, args) {
            ("create_distributed_table", [table, column]) => {
                let (name, key_type) = describe_key(&clients[0], table, column).await?;
                check_new(&current, &name)?;
                check_key_collation(&clients[0], &name, column).await?;
                check_uniqueness(&clients[0], &name, column).await?;
                check_empty(&clients, &name).await?;
                next.tables.insert(
                    name.clone(),
                    TableKind::Distributed {
                        column: column.clone(),
                        key_type,
                    },
                );
                per_group = sequence_strides(&clients[0], &name, clients.len()).await?;
                (
                    format!(
                        "{name} distributed by {column} ({key_type}) over {} shard groups",
                        self.groups()
                    ),
                    table_ddl(&clients[0], &name).await?,
                )
            }
            ("create_reference_table", [table]) => {
                let name = resolve(&clients[0], table).await?;
                check_new(&current, &name)?;
                check_empty(&clients, &name).await?;
                next.tables.insert(name.clone(), TableKind::Reference);
                (
                    format!(
                        "{name} is a reference table on {} shard groups",
                        self.groups()
                    ),
                    table_ddl(&clients[0], &name).await?,
                )
            }
            ("undistribute_table", [table]) => {
                let name = resolve(&clients[0], table).await?;
                if next.tables.remove(&name).is_none() {
                    return Err(refused(
                        "42P01",
                        format!("{name} is neither a distributed nor a reference table"),
                    ));
                }
                // Its rows on the other groups would vanish from sight: only an empty table.
                check_empty(&clients, &name).await?;
                (
                    format!("{name} lives on shard group 0 only again"),
                    Vec::new(),
                )
            }
            _ => {
                return Err(refused(
                    "42883",
                    format!(
                        "herd.{function} with {} argument(s) does not exist; Herd's functions are \
                         create_distributed_table(table, column), create_reference_table(table), \
                         undistribute_table(table) and explain(statement)",
                        args.len()
                    ),
                ))
            }
        };
        commit_everywhere(&clients, &next, &ddl, &per_group).await?;
        self.install_map(database, next);
        Ok(answer)
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
    // Group 0 first: once its commit is durable the change is decided (see `recover`).
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

/// `schema.table` of a table name as the client wrote it (resolved on group 0).
async fn resolve(client: &Client, table: &str) -> Result<String, ProxyError> {
    let row = client
        .query_opt(
            "SELECT n.nspname || '.' || c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace \
             WHERE c.oid = to_regclass($1) AND c.relkind IN ('r', 'p')",
            &[&table],
        )
        .await
        .map_err(|e| failed("looking up the table", e))?;
    row.map(|r| r.get(0)).ok_or_else(|| {
        refused(
            "42P01",
            format!("table {table} does not exist (create it through the endpoint first)"),
        )
    })
}

/// The table's qualified name and the type of its key column.
async fn describe_key(
    client: &Client,
    table: &str,
    column: &str,
) -> Result<(String, KeyType), ProxyError> {
    let name = resolve(client, table).await?;
    let row = client
        .query_opt(
            "SELECT format_type(atttypid, atttypmod) FROM pg_attribute \
             WHERE attrelid = to_regclass($1) AND attname = $2 AND attnum > 0 AND NOT attisdropped",
            &[&name, &column],
        )
        .await
        .map_err(|e| failed("looking up the key column", e))?;
    let Some(row) = row else {
        return Err(refused(
            "42703",
            format!("column {column} of {name} does not exist"),
        ));
    };
    let type_name: String = row.get(0);
    let key_type = KeyType::from_pg(&type_name).ok_or_else(|| {
        refused(
            "0A000",
            format!(
                "{name}.{column} is {type_name}; a shard key is smallint, integer, bigint, text, varchar or uuid"
            ),
        )
    })?;
    Ok((name, key_type))
}

/// A shard key whose collation is nondeterministic (case- or accent-insensitive) is refused:
/// values it holds equal ('a' and 'A') hash differently and would live on different groups.
async fn check_key_collation(client: &Client, name: &str, column: &str) -> Result<(), ProxyError> {
    let row = client
        .query_opt(
            "SELECT c.collname::text FROM pg_attribute a JOIN pg_collation c ON c.oid = a.attcollation \
             WHERE a.attrelid = to_regclass($1) AND a.attname = $2 AND NOT c.collisdeterministic",
            &[&name, &column],
        )
        .await
        .map_err(|e| failed("looking up the key column's collation", e))?;
    match row {
        None => Ok(()),
        Some(r) => Err(refused(
            "0A000",
            format!(
                "{name}.{column} has the nondeterministic collation {}: values it holds equal \
                 (such as 'a' and 'A') hash differently, so they would live on different shard \
                 groups; distribute by a column with a deterministic collation (for instance \
                 one that stores lower({column})), or make {name} a reference table",
                r.get::<_, String>(0)
            ),
        )),
    }
}

/// Every UNIQUE, PRIMARY KEY and EXCLUDE constraint and unique index of the table must compare
/// the shard key for equality: otherwise each group enforces it over its own rows only (the
/// same value could be stored once per group, where one server raises 23505).
async fn check_uniqueness(client: &Client, name: &str, column: &str) -> Result<(), ProxyError> {
    let row = client
        .query_opt(
            "WITH k AS (SELECT attnum FROM pg_attribute WHERE attrelid = to_regclass($1) AND attname = $2)
             SELECT CASE c.contype WHEN 'p' THEN 'PRIMARY KEY' WHEN 'u' THEN 'UNIQUE'
                                   WHEN 'x' THEN 'EXCLUDE' ELSE 'CREATE UNIQUE INDEX' END,
                    coalesce(c.conname::text, ir.relname::text)
             FROM pg_index i JOIN pg_class ir ON ir.oid = i.indexrelid
             LEFT JOIN pg_constraint c ON c.conindid = i.indexrelid AND c.conrelid = i.indrelid
                                      AND c.contype IN ('p', 'u', 'x')
             WHERE i.indrelid = to_regclass($1) AND (i.indisunique OR c.contype = 'x')
               AND NOT CASE WHEN c.contype = 'x' THEN EXISTS (
                       SELECT 1 FROM unnest(c.conkey, c.conexclop) AS e(att, op)
                       JOIN pg_operator o ON o.oid = e.op
                       WHERE e.att = (SELECT attnum FROM k) AND o.oprname = '=')
                   ELSE EXISTS (
                       SELECT 1 FROM unnest(i.indkey::int2[]) WITH ORDINALITY AS e(att, n)
                       WHERE e.att = (SELECT attnum FROM k) AND e.n <= i.indnkeyatts) END
             LIMIT 1",
            &[&name, &column],
        )
        .await
        .map_err(|e| failed("reading the table's unique constraints", e))?;
    match row {
        None => Ok(()),
        Some(r) => {
            let (what, constraint): (String, String) = (r.get(0), r.get(1));
            Err(refused(
                "0A000",
                herd_shard::uniqueness_message(&what, Some(&constraint), name, column, false),
            ))
        }
    }
}

fn check_new(map: &ShardMap, name: &str) -> Result<(), ProxyError> {
    match map.tables.get(name) {
        Some(_) => Err(refused(
            "42P07",
            format!("{name} is already distributed or a reference table (see herd.tables)"),
        )),
        None => Ok(()),
    }
}

/// Distributing moves no rows yet: the table must be empty wherever it exists.
async fn check_empty(clients: &[Client], name: &str) -> Result<(), ProxyError> {
    for (g, c) in clients.iter().enumerate() {
        let sql = format!(
            "SELECT to_regclass({lit}) IS NOT NULL AND EXISTS (SELECT 1 FROM {name})",
            lit = literal(name),
            name = quote_qualified(name)
        );
        let exists_with_rows = match c.query_one(&sql, &[]).await {
            Ok(r) => r.get::<_, bool>(0),
            // Not on this group yet: created with the change.
            Err(e) if e.code() == Some(&tokio_postgres::error::SqlState::UNDEFINED_TABLE) => false,
            Err(e) => return Err(failed("checking the table is empty", e)),
        };
        if exists_with_rows {
            return Err(refused(
                "55000",
                format!(
                    "{name} has rows on shard group {g}; distribute a table while it is empty, then \
                     load it through the endpoint (moving existing rows is not supported yet)"
                ),
            ));
        }
    }
    Ok(())
}

fn quote_qualified(name: &str) -> String {
    name.split('.')
        .map(|p| format!("\"{}\"", p.replace('"', "\"\"")))
        .collect::<Vec<_>>()
        .join(".")
}
