//! The catalog facts name resolution needs (`herd_shard::Names`), read from group 0's primary
//! per database: which schemas hold each relation name, what each view reads and calls, what
//! each function's body reads, the schemas, the tables' columns, and the `search_path`
//! defaults of roles and the database. Kept for a few seconds and forgotten at once after DDL through the endpoint, so
//! a name means what it means on the server; DDL made directly on a server is seen within
//! [`NAMES_TTL`].

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use herd_shard::{Body, Names};
use tokio_postgres::Client;

use super::failed;
use crate::{ProxyContext, ProxyError};

/// How long a database's names are used before they are read again.
pub const NAMES_TTL: Duration = Duration::from_secs(3);

/// Relations of every kind a query may name, by unqualified name (other sessions' temporary
/// schemas and TOAST tables left out).
const RELATIONS: &str = "SELECT c.relname::text, array_agg(DISTINCT n.nspname::text) \
     FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace \
     WHERE c.relkind IN ('r', 'v', 'm', 'p', 'f', 'S') \
       AND n.nspname NOT LIKE 'pg_temp%' AND n.nspname NOT LIKE 'pg_toast%' \
     GROUP BY c.relname";

/// The columns of the user's tables (ordinary and partitioned), in order, dropped ones left
/// out: which table an unqualified column of a join belongs to, what an INSERT without a column
/// list fills.
const COLUMNS: &str = "SELECT n.nspname || '.' || c.relname, \
     array_agg(a.attname::text ORDER BY a.attnum) \
     FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace \
     JOIN pg_attribute a ON a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped \
     WHERE c.relkind IN ('r', 'p') \
       AND n.nspname NOT IN ('pg_catalog', 'information_schema', 'herd') \
       AND n.nspname NOT LIKE 'pg_temp%' AND n.nspname NOT LIKE 'pg_toast%' \
     GROUP BY n.nspname, c.relname";

/// Each view's dependencies on relations and functions, from its rewrite rule.
const VIEWS: &str = "SELECT vn.nspname || '.' || v.relname, d.refclassid = 'pg_proc'::regclass, \
     CASE WHEN d.refclassid = 'pg_class'::regclass \
          THEN (SELECT tn.nspname || '.' || t.relname FROM pg_class t \
                JOIN pg_namespace tn ON tn.oid = t.relnamespace WHERE t.oid = d.refobjid) \
          ELSE (SELECT pn.nspname || '.' || p.proname FROM pg_proc p \
                JOIN pg_namespace pn ON pn.oid = p.pronamespace WHERE p.oid = d.refobjid) END \
     FROM pg_class v JOIN pg_namespace vn ON vn.oid = v.relnamespace \
     JOIN pg_rewrite r ON r.ev_class = v.oid \
     JOIN pg_depend d ON d.classid = 'pg_rewrite'::regclass AND d.objid = r.oid \
       AND d.refclassid IN ('pg_class'::regclass, 'pg_proc'::regclass) AND d.refobjid <> v.oid \
     WHERE v.relkind IN ('v', 'm') \
       AND vn.nspname NOT IN ('pg_catalog', 'information_schema', 'herd_global')";

/// The materialized views.
const MATERIALIZED: &str = "SELECT n.nspname || '.' || c.relname FROM pg_class c \
     JOIN pg_namespace n ON n.oid = c.relnamespace WHERE c.relkind = 'm'";

/// Functions and procedures of the user's (not PostgreSQL's, not Herd's, not in C), with what
/// is needed to read their bodies and their own `search_path`.
const FUNCTIONS: &str = "SELECT n.nspname::text, p.proname::text, l.lanname::text, p.prosrc, \
     CASE WHEN l.lanname IN ('sql', 'plpgsql') THEN pg_get_functiondef(p.oid) END, \
     (SELECT option_value FROM pg_options_to_table(p.proconfig) \
      WHERE option_name = 'search_path') \
     FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace \
     JOIN pg_language l ON l.oid = p.prolang \
     WHERE n.nspname NOT IN ('pg_catalog', 'information_schema', 'herd') \
       AND l.lanname NOT IN ('c', 'internal') AND p.prokind IN ('f', 'p')";

/// What runs on a write besides the statement: user triggers' functions (not Herd's own,
/// not internal ones such as foreign keys') and rules other than a view's.
const WRITE_HOOKS: &str = "SELECT n.nspname || '.' || c.relname, pn.nspname || '.' || p.proname \
     FROM pg_trigger t JOIN pg_class c ON c.oid = t.tgrelid \
     JOIN pg_namespace n ON n.oid = c.relnamespace \
     JOIN pg_proc p ON p.oid = t.tgfoid JOIN pg_namespace pn ON pn.oid = p.pronamespace \
     WHERE NOT t.tgisinternal AND pn.nspname <> 'herd' \
     UNION ALL \
     SELECT n.nspname || '.' || c.relname, 'rule ' || r.rulename \
     FROM pg_rewrite r JOIN pg_class c ON c.oid = r.ev_class \
     JOIN pg_namespace n ON n.oid = c.relnamespace \
     WHERE r.rulename <> '_RETURN' AND c.relkind IN ('r', 'p')";

/// `search_path` set by `ALTER ROLE … [IN DATABASE …] SET` or `ALTER DATABASE … SET`, most
/// specific first (role in this database, role, this database).
const DEFAULT_PATHS: &str = "SELECT coalesce(r.rolname::text, ''), \
     (SELECT option_value FROM pg_options_to_table(s.setconfig) \
      WHERE option_name = 'search_path') \
     FROM pg_db_role_setting s LEFT JOIN pg_roles r ON r.oid = s.setrole \
     WHERE s.setdatabase IN (0, (SELECT oid FROM pg_database WHERE datname = current_database())) \
     ORDER BY (s.setdatabase <> 0 AND s.setrole <> 0) DESC, s.setrole <> 0 DESC";

/// Names by database, with when they were read.
#[derive(Default)]
pub struct NamesCache {
    by_database: std::sync::Mutex<HashMap<String, (Instant, Arc<Names>)>>,
    /// One reading at a time: sessions that find the names old wait for one reading instead
    /// of each making its own.
    loading: tokio::sync::Mutex<()>,
}

impl ProxyContext {
    /// The names of `database`, read again when older than [`NAMES_TTL`].
    pub async fn names(&self, database: &str) -> Result<Arc<Names>, ProxyError> {
        if let Some(n) = self.cached_names(database) {
            return Ok(n);
        }
        let _one_reading = self.shard_maps.names.loading.lock().await;
        if let Some(n) = self.cached_names(database) {
            return Ok(n);
        }
        let client = self
            .group_client(0, database, "to read the catalog's names")
            .await?;
        let names = Arc::new(load(&client).await?);
        if let Ok(mut m) = self.shard_maps.names.by_database.lock() {
            m.insert(database.to_string(), (Instant::now(), names.clone()));
        }
        Ok(names)
    }

    /// The names of `database` if read less than [`NAMES_TTL`] ago.
    pub fn cached_names(&self, database: &str) -> Option<Arc<Names>> {
        let m = self.shard_maps.names.by_database.lock().ok()?;
        m.get(database)
            .filter(|(at, _)| at.elapsed() < NAMES_TTL)
            .map(|(_, n)| n.clone())
    }

    /// The names last read for `database`, however old (`None` after DDL forgot them): for
    /// checks that cannot wait for a read, right after the routing read them fresh.
    pub fn last_names(&self, database: &str) -> Option<Arc<Names>> {
        let m = self.shard_maps.names.by_database.lock().ok()?;
        m.get(database).map(|(_, n)| n.clone())
    }

    /// Another proxy's map change began or ended: every database's names are read again (the
    /// table it distributed was made through that proxy, maybe after this one read them).
    pub(crate) fn forget_all_names(&self) {
        if let Ok(mut m) = self.shard_maps.names.by_database.lock() {
            m.clear();
        }
    }

    /// DDL ran through the endpoint in `database`: its names are read again before the next
    /// statement is planned.
    pub fn forget_names(&self, database: &str) {
        if let Ok(mut m) = self.shard_maps.names.by_database.lock() {
            m.remove(database);
        }
    }
}

async fn load(client: &Client) -> Result<Names, ProxyError> {
    let read = |e| failed("reading the catalog's names", e);
    let mut names = Names::default();
    for row in client.query(RELATIONS, &[]).await.map_err(read)? {
        names.relations.insert(row.get(0), row.get(1));
    }
    for row in client
        .query("SELECT nspname::text FROM pg_namespace", &[])
        .await
        .map_err(read)?
    {
        names.schemas.insert(row.get(0));
    }
    for row in client.query(COLUMNS, &[]).await.map_err(read)? {
        names.columns.insert(row.get(0), row.get(1));
    }
    for row in client.query(VIEWS, &[]).await.map_err(read)? {
        let (view, is_function, target): (String, bool, Option<String>) =
            (row.get(0), row.get(1), row.get(2));
        let Some(target) = target else { continue };
        let list = if is_function {
            names.view_calls.entry(view).or_default()
        } else {
            names.views.entry(view).or_default()
        };
        if !list.contains(&target) {
            list.push(target);
        }
    }
    for row in client.query(MATERIALIZED, &[]).await.map_err(read)? {
        names.materialized.insert(row.get(0));
    }
    for row in client.query(FUNCTIONS, &[]).await.map_err(read)? {
        let (schema, name, language, source): (String, String, String, String) =
            (row.get(0), row.get(1), row.get(2), row.get(3));
        let definition: Option<String> = row.get(4);
        let path: Option<String> = row.get(5);
        let body = match herd_sql::body_reads(&language, &source, definition.as_deref()) {
            Ok(r) => Body::Reads {
                relations: r.relations,
                calls: r.calls,
                path,
            },
            Err(why) => Body::Opaque(why),
        };
        for key in [format!("{schema}.{name}"), name] {
            names.functions.entry(key).or_default().push(body.clone());
        }
    }
    for row in client.query(WRITE_HOOKS, &[]).await.map_err(read)? {
        let (table, hook): (String, String) = (row.get(0), row.get(1));
        names.write_hooks.entry(table).or_default().push(hook);
    }
    for row in client.query(DEFAULT_PATHS, &[]).await.map_err(read)? {
        let (role, path): (String, Option<String>) = (row.get(0), row.get(1));
        if let Some(path) = path {
            names.default_paths.entry(role).or_insert(path);
        }
    }
    Ok(names)
}
