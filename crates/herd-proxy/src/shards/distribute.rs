//! `SELECT herd.create_distributed_table(…)` and the other map-changing functions of Herd's
//! own: the checks a table must pass, then the map change on every group in one two-phase
//! commit.

use tokio_postgres::Client;

use super::*;

impl ProxyContext {
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
        commit_everywhere(&self.commits, &clients, &next, &ddl, &per_group).await?;
        self.install_map(database, next);
        Ok(answer)
    }
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
