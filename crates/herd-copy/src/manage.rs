//! Creating, pausing, resuming and dropping copies: the statements on the source (role,
//! grants, publication; the slot is made by the target's subscription) and on the target
//! (tables, subscription), in an order that leaves nothing half-made behind a failure.

use std::time::{Duration, Instant};

use rand::distributions::Alphanumeric;
use rand::Rng;
use tokio_postgres::Client;

use crate::schema::{prepare_target, read_table, tables_of_schema, TableDef};
use crate::spec::{quote_ident, quote_literal, quote_qualified, source_conninfo};
use crate::status::{read_target, table_state};
use crate::{CopyError, CopySpec};

/// Where a copy's source objects are made.
pub struct Source<'a> {
    /// The source group's primary (superuser): publication, slot.
    pub primary: &'a Client,
    /// Where roles are made (superuser): the primary of a cluster with one group; the
    /// endpoint of a sharded one, which creates a role on every group (the endpoint checks
    /// passwords against group 0's roles).
    pub roles: &'a Client,
}

/// What `create` did.
#[derive(Debug)]
pub struct Created {
    /// Every table of the copy.
    pub tables: Vec<String>,
    /// The tables created on the target (the others existed and matched).
    pub created_on_target: Vec<String>,
}

/// The refusal of a second copy named `name`.
pub fn exists_already(name: &str) -> CopyError {
    CopyError::Invalid(format!(
        "a copy named {name} exists already (`herd copy list`); drop it first or choose another name"
    ))
}

/// Creates the copy `spec` from the source group's primary (`source`, superuser) to its
/// target, which reaches the source through the cluster's `endpoint` (host, port). The caller
/// checks first that no copy of that name exists ([`exists_already`]) and keeps the definition
/// once this returns: in the data directory's [`crate::Store`] on one host, in the store of the
/// agents on several.
/// `wal_level` must already be `logical` on the source. `verify_endpoint`: the target is a
/// server of the same cluster with a CA, and the endpoint serves a certificate of that CA for
/// `endpoint`'s host (the caller checked): the subscription then says `sslmode=verify-full`
/// with the target's own `ssl_ca_file`, and a target without one is refused before anything
/// is made.
pub async fn create(
    spec: &CopySpec,
    sources: &Source<'_>,
    endpoint: (&str, u16),
    verify_endpoint: bool,
    progress: &(dyn Fn(&str) + Sync),
) -> Result<Created, CopyError> {
    spec.validate()?;
    let source = sources.primary;
    let level: String = source
        .query_one("show wal_level", &[])
        .await
        .map_err(|e| CopyError::sql("reading wal_level on the source", &e))?
        .get(0);
    if level != "logical" {
        return Err(CopyError::Invalid(format!(
            "wal_level is {level} on the source primary; copies need logical"
        )));
    }
    progress("reading the source's table definitions");
    let defs = published_tables(spec, source).await?;
    let target = crate::target::connect(&spec.target).await?;
    let tls = match verify_endpoint {
        true => Some(target_tls(&target).await?),
        false => None,
    };
    progress("creating the publication and the copy's role on the source");
    let password: String = rand::thread_rng()
        .sample_iter(&Alphanumeric)
        .take(32)
        .map(char::from)
        .collect();
    create_source_side(spec, sources, &defs, &password).await?;
    progress("preparing the target's tables");
    let created_on_target = match prepare_target(&target, &defs).await {
        Ok(c) => c,
        Err(e) => {
            let _ = drop_source_side(spec, sources).await;
            return Err(e);
        }
    };
    progress("creating the subscription on the target (it makes the slot on the source)");
    let name = spec.object_name();
    let mut conninfo = source_conninfo(endpoint, spec.group, &spec.database, &name, &password);
    if let Some((ca, cert, key)) = &tls {
        conninfo = crate::spec::verify_full(&conninfo, ca, cert, key);
    }
    if let Err(e) = target
        .batch_execute(&spec.create_subscription(&conninfo))
        .await
    {
        let err = CopyError::sql("creating the subscription on the target", &e);
        let _ = drop_source_side(spec, sources).await;
        return Err(err);
    }
    Ok(Created {
        tables: defs.iter().map(|d| d.table.clone()).collect(),
        created_on_target,
    })
}

/// The files the target server serves TLS with, which its OS user reads (`ssl_ca_file`,
/// `ssl_cert_file`, `ssl_key_file`): its subscription verifies the endpoint with the CA and
/// presents the certificate (else libpq looks for the OS user's `~/.postgresql/postgresql.crt`
/// and fails on one it may not read). An error when it serves no TLS with a CA.
async fn target_tls(target: &Client) -> Result<(String, String, String), CopyError> {
    let row = target
        .query_one(
            "SELECT current_setting('ssl')::bool, current_setting('ssl_ca_file'), \
             current_setting('ssl_cert_file'), current_setting('ssl_key_file')",
            &[],
        )
        .await
        .map_err(|e| CopyError::sql("reading the target's TLS settings", &e))?;
    let (ssl, ca): (bool, String) = (row.get(0), row.get(1));
    let files = (ssl && !ca.is_empty()).then(|| (ca, row.get(2), row.get(3)));
    files.ok_or_else(|| {
        CopyError::Invalid(
            "the target serves no TLS with a CA (ssl, ssl_ca_file), so its subscription cannot \
             verify the endpoint; nothing was made"
                .into(),
        )
    })
}

/// The published shape of every table of `spec` (schemas expanded), read from the source.
async fn published_tables(spec: &CopySpec, source: &Client) -> Result<Vec<TableDef>, CopyError> {
    let mut defs = Vec::new();
    for t in &spec.tables {
        let def = read_table(source, &t.table).await?.ok_or_else(|| {
            CopyError::Invalid(format!(
                "there is no table {} in database {} at the source",
                t.table, spec.database
            ))
        })?;
        defs.push(def.published(t)?);
    }
    for schema in &spec.schemas {
        let tables = tables_of_schema(source, schema).await?;
        if tables.is_empty() {
            return Err(CopyError::Invalid(format!(
                "schema {schema} has no table in database {} at the source",
                spec.database
            )));
        }
        for table in tables {
            if defs.iter().any(|d| d.table == table) {
                continue;
            }
            if let Some(def) = read_table(source, &table).await? {
                defs.push(def);
            }
        }
    }
    Ok(defs)
}

/// The publication (in one transaction with its proof), then the role and its grants. The
/// publication is proved harmless to the source's own writes first: PostgreSQL refuses updates
/// and deletes of a published table whose row filter or column list reaches beyond its replica
/// identity, and checks that when a statement starts — so an `EXPLAIN` of each (which starts
/// it, touching no row) must pass.
async fn create_source_side(
    spec: &CopySpec,
    source: &Source<'_>,
    defs: &[TableDef],
    password: &str,
) -> Result<(), CopyError> {
    let primary = source.primary;
    let begun = primary
        .batch_execute(&format!("BEGIN; {}", spec.create_publication()))
        .await;
    if let Err(e) = begun {
        let _ = primary.batch_execute("ROLLBACK").await;
        let hint = if e.as_db_error().is_some_and(|d| d.code().code() == "42710") {
            " (left by an interrupted create? `herd copy drop` with this name removes it)"
        } else {
            ""
        };
        return Err(CopyError::sql(
            format!("creating the copy's publication on the source{hint}"),
            &e,
        ));
    }
    for d in defs {
        let Some(key) = d.columns.iter().find(|c| c.in_key).or(d.columns.first()) else {
            continue;
        };
        let col = quote_ident(&key.name);
        let table = quote_qualified(&d.table);
        for probe in [
            format!("EXPLAIN UPDATE {table} SET {col} = {col} WHERE false"),
            format!("EXPLAIN DELETE FROM {table} WHERE false"),
        ] {
            if let Err(e) = primary.batch_execute(&probe).await {
                let _ = primary.batch_execute("ROLLBACK").await;
                return Err(CopyError::Invalid(format!(
                    "copying {} this way would make PostgreSQL refuse the source's own updates and deletes of it: {}. \
                     A row filter's columns and a column list must include the table's primary key (its replica identity); \
                     a table without a primary key needs one (or REPLICA IDENTITY FULL, without a column list or filter)",
                    d.table,
                    e.as_db_error().map_or(e.to_string(), |d| match d.detail() {
                        Some(detail) => format!("{} ({detail})", d.message()),
                        None => d.message().to_string(),
                    })
                )));
            }
        }
    }
    primary
        .batch_execute("COMMIT")
        .await
        .map_err(|e| CopyError::sql("committing the copy's publication", &e))?;
    if let Err(e) = create_role(spec, source, defs, password).await {
        let _ = drop_source_side(spec, source).await;
        return Err(e);
    }
    Ok(())
}

/// The copy's role (LOGIN REPLICATION, SELECT on the copied tables), one statement at a time
/// (through the endpoint of a sharded cluster each reaches every group).
async fn create_role(
    spec: &CopySpec,
    source: &Source<'_>,
    defs: &[TableDef],
    password: &str,
) -> Result<(), CopyError> {
    let (primary, roles) = (source.primary, source.roles);
    let role = quote_ident(&spec.object_name());
    let mut sql = vec![format!(
        "CREATE ROLE {role} LOGIN REPLICATION PASSWORD {}",
        quote_literal(password)
    )];
    let mut schemas: Vec<&str> = defs
        .iter()
        .filter_map(|d| d.table.split('.').next())
        .collect();
    schemas.sort_unstable();
    schemas.dedup();
    for s in schemas {
        sql.push(format!(
            "GRANT USAGE ON SCHEMA {} TO {role}",
            quote_ident(s)
        ));
    }
    for d in defs {
        sql.push(format!(
            "GRANT SELECT ON {} TO {role}",
            quote_qualified(&d.table)
        ));
    }
    // The role on every group (through the endpoint of a sharded cluster), its grants on the
    // source group only: that is where it reads, and where `drop_source_side` revokes them.
    for (i, statement) in sql.iter().enumerate() {
        let client = if i == 0 { roles } else { primary };
        client.batch_execute(statement).await.map_err(|e| {
            let hint = if e.as_db_error().is_some_and(|d| d.code().code() == "42710") {
                " (left by an interrupted create? `herd copy drop` with this name removes it)"
            } else {
                ""
            };
            CopyError::sql(format!("creating the copy's role on the source{hint}"), &e)
        })?;
    }
    Ok(())
}

/// Drops the source side of a copy: its slot (after its walsender ends), publication, role.
/// Each is dropped if present, so this also cleans up after an interrupted create.
pub async fn drop_source_side(spec: &CopySpec, source: &Source<'_>) -> Result<(), CopyError> {
    let name = spec.object_name();
    let (primary, roles) = (source.primary, source.roles);
    let source = primary;
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let row = source
            .query_opt(
                "select active_pid from pg_replication_slots where slot_name = $1",
                &[&name],
            )
            .await
            .map_err(|e| CopyError::sql("reading the copy's slot on the source", &e))?;
        match row.map(|r| r.get::<_, Option<i32>>(0)) {
            None => break,
            Some(Some(pid)) if Instant::now() < deadline => {
                // The target's walsender still streams (its subscription was not reachable to
                // disable): end it so the slot can go.
                let _ = source
                    .execute("select pg_terminate_backend($1)", &[&pid])
                    .await;
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            Some(_) => {
                source
                    .execute("select pg_drop_replication_slot($1)", &[&name])
                    .await
                    .map_err(|e| CopyError::sql("dropping the copy's slot on the source", &e))?;
                break;
            }
        }
    }
    let role = quote_ident(&name);
    source
        .batch_execute(&format!("DROP PUBLICATION IF EXISTS {role}"))
        .await
        .map_err(|e| CopyError::sql("dropping the copy's publication on the source", &e))?;
    let exists = roles
        .query_opt("select 1 from pg_roles where rolname = $1", &[&name])
        .await
        .map_err(|e| CopyError::sql("looking up the copy's role", &e))?
        .is_some();
    if exists {
        // Its grants are on the source group (see `create_role`), the role on every group.
        for (client, statement) in [
            (source, format!("DROP OWNED BY {role}")),
            (roles, format!("DROP ROLE {role}")),
        ] {
            client
                .batch_execute(&statement)
                .await
                .map_err(|e| CopyError::sql("dropping the copy's role on the source", &e))?;
        }
    }
    Ok(())
}

/// Drops the subscription on the target, keeping its slot for the source side to drop (the
/// target may not reach the source).
pub async fn drop_target_side(spec: &CopySpec, target: &Client) -> Result<(), CopyError> {
    let name = spec.object_name();
    let exists = target
        .query_opt("select 1 from pg_subscription where subname = $1", &[&name])
        .await
        .map_err(|e| CopyError::sql("looking up the subscription on the target", &e))?
        .is_some();
    if !exists {
        return Ok(());
    }
    let sub = quote_ident(&name);
    target
        .batch_execute(&format!(
            "ALTER SUBSCRIPTION {sub} DISABLE; ALTER SUBSCRIPTION {sub} SET (slot_name = NONE); DROP SUBSCRIPTION {sub}"
        ))
        .await
        .map_err(|e| CopyError::sql("dropping the subscription on the target", &e))
}

/// Brings tables added since the copy was made into it: for a copy of whole schemas, tables
/// created there later (the publication covers them already) are created or checked on the
/// target, their rows granted to the copy's role, and the subscription refreshed, which copies
/// them and streams them from then on. Answers the tables added.
pub async fn refresh(
    spec: &CopySpec,
    source: &Source<'_>,
    target: &Client,
) -> Result<Vec<String>, CopyError> {
    let defs = published_tables(spec, source.primary).await?;
    let name = spec.object_name();
    let known: Vec<String> = match crate::status::read_target(target, &name)
        .await
        .map_err(CopyError::Invalid)?
    {
        Some(sub) => sub.tables.into_iter().map(|(t, _, _)| t).collect(),
        None => {
            return Err(CopyError::Invalid(format!(
                "the target has no subscription {name}; drop the copy and create it again"
            )))
        }
    };
    let added: Vec<TableDef> = defs
        .into_iter()
        .filter(|d| !known.contains(&d.table))
        .collect();
    if added.is_empty() {
        return Ok(Vec::new());
    }
    prepare_target(target, &added).await?;
    let role = quote_ident(&name);
    for d in &added {
        source
            .roles
            .batch_execute(&format!(
                "GRANT SELECT ON {} TO {role}",
                quote_qualified(&d.table)
            ))
            .await
            .map_err(|e| CopyError::sql(format!("granting {} to the copy's role", d.table), &e))?;
    }
    target
        .batch_execute(&format!("ALTER SUBSCRIPTION {role} REFRESH PUBLICATION"))
        .await
        .map_err(|e| CopyError::sql("refreshing the subscription on the target", &e))?;
    Ok(added.into_iter().map(|d| d.table).collect())
}

/// Pauses (`false`) or resumes (`true`) the copy: its subscription on the target. The slot
/// keeps the source's WAL meanwhile (up to `max_slot_wal_keep_size`).
pub async fn set_enabled(spec: &CopySpec, target: &Client, enabled: bool) -> Result<(), CopyError> {
    let verb = if enabled { "ENABLE" } else { "DISABLE" };
    target
        .batch_execute(&format!(
            "ALTER SUBSCRIPTION {} {verb}",
            quote_ident(&spec.object_name())
        ))
        .await
        .map_err(|e| CopyError::sql(format!("{verb} of the subscription on the target"), &e))
}

/// After this long with no table's copy begun, the target's worker limit is checked.
const WORKERS_CHECK_AFTER: Duration = Duration::from_secs(15);

/// Fails, saying what to change, when every logical replication worker of the target is busy:
/// the initial copy needs one more and would wait for one indefinitely.
async fn check_workers(target: &Client) -> Result<(), CopyError> {
    let row = target
        .query_one(
            "select (select count(*) from pg_stat_subscription where pid is not null)::int, \
                    current_setting('max_logical_replication_workers')::int",
            &[],
        )
        .await
        .map_err(|e| CopyError::sql("reading the target's logical replication workers", &e))?;
    let (running, max): (i32, i32) = (row.get(0), row.get(1));
    if running >= max {
        return Err(CopyError::Invalid(format!(
            "the initial copy cannot start: all {max} logical replication workers of the target are busy \
             ({running} running; max_logical_replication_workers = {max}). Raise max_logical_replication_workers \
             (and max_worker_processes) on the target and restart it; the copy starts as soon as a worker is free"
        )));
    }
    Ok(())
}

/// Waits until every table of the copy is copied and streaming, reporting progress; bounded by
/// `limit` (the copy goes on in the background after it).
pub async fn wait_copied(
    spec: &CopySpec,
    target: &Client,
    limit: Duration,
    progress: &(dyn Fn(&str) + Sync),
) -> Result<(), CopyError> {
    let name = spec.object_name();
    let started = Instant::now();
    let deadline = started + limit;
    loop {
        let sub = read_target(target, &name)
            .await
            .map_err(CopyError::Invalid)?
            .ok_or_else(|| {
                CopyError::Invalid(format!("the subscription {name} vanished from the target"))
            })?;
        let done =
            !sub.tables.is_empty() && sub.tables.iter().all(|(_, s, _)| s == "r" || s == "s");
        let mut line: Vec<String> = sub
            .tables
            .iter()
            .map(|(t, s, rows)| match rows {
                Some(n) if s == "d" => format!("{t} copying ({n} rows)"),
                _ => format!("{t} {}", table_state(s)),
            })
            .collect();
        if sub.sync_errors > 0 {
            line.push(format!(
                "{} failed attempt(s), retried — see the target's log",
                sub.sync_errors
            ));
        }
        progress(&line.join(", "));
        if done {
            return Ok(());
        }
        let waiting = sub.tables.iter().all(|(_, s, _)| s == "i");
        if waiting && started.elapsed() > WORKERS_CHECK_AFTER {
            check_workers(target).await?;
        }
        if Instant::now() > deadline {
            return Err(CopyError::Timeout(format!(
                "the initial copy is still running after {} s; it goes on in the background (`herd copy list` shows it)",
                limit.as_secs()
            )));
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}
