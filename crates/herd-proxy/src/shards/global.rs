//! The general path's global relations on the coordinating group (group 0): for each
//! distributed table, a view `herd_global.t_<oid>` that is the `UNION ALL` of one postgres_fdw
//! foreign table per shard group (group 0's own through a loopback server), so PostgreSQL on
//! group 0 answers any read over every group's rows.
//!
//! - Which rows: each group's whole table. Outside a shard move a group holds exactly the rows
//!   of the shards the map gives it (the fan-out relies on the same), so the union is every row
//!   once; while a move is under way the session refuses the general path (`hides_rows`), as
//!   both groups then hold the moving shard's rows. The view does not depend on the placement,
//!   so a move's switch needs no rebuild.
//! - No catalog dependency on the user's tables (every group is read through a foreign
//!   table, group 0 included): `DROP TABLE`, `ALTER TABLE … DROP COLUMN` and the like keep
//!   working; what they change is seen in the tables' column definitions, which are part of
//!   the `spec` the objects were built from (kept in `herd_global.built` on group 0): a
//!   different spec rebuilds everything, in one transaction, under an advisory lock.
//! - Credentials: one user mapping per server for the proxy's admin role (a superuser, whose
//!   password the proxy already holds), readable by superusers only (`pg_user_mapping`); the
//!   servers are not granted to anyone, the foreign tables not either. The views (owned by the
//!   admin role, so they read the foreign tables as it) are granted SELECT to exactly the roles
//!   that may SELECT the distributed table itself (its ACL, or the owner's default, copied; the
//!   ACL is part of the spec, so a GRANT or REVOKE rebuilds them), so PostgreSQL checks the
//!   reader's privilege itself. Not applied on this path: column privileges and row-level
//!   security policies. (A check inside each branch of the view would keep the branches from
//!   being flattened into the join: TPC-H Q20's correlated subquery then ran once per row of
//!   partsupp, minutes instead of a second.)
//! - Servers name every node of their group, `target_session_attrs=read-write`: a failover is
//!   followed by libpq itself. `use_remote_estimate`: the foreign tables have no statistics on
//!   group 0, and without the groups' own estimates correlated subqueries over them were
//!   planned per row of the outer table (TPC-H Q20 ran minutes instead of a second); it costs
//!   a remote EXPLAIN per foreign table when a general read is planned.
//!
//! - TLS between the servers: when group 0's primary serves TLS with a CA (`ssl` on and
//!   `ssl_ca_file` set: a multi-host cluster with a CA, whose servers take every login from
//!   other hosts over TLS only), each server says `sslmode 'verify-full'` and `sslrootcert` =
//!   that server's own `ssl_ca_file` (a file its OS user reads already): every node's
//!   certificate must be of the cluster's CA and name the address in `host`. Without (one-host
//!   clusters, no CA) libpq's default as before. The path is part of the spec, and group 0's
//!   primary part of what is checked, so a new primary whose CA file lies elsewhere (another
//!   `--data-dir`) rebuilds the servers.
//!
//! Built when a general statement first needs it (and again when the tables' columns, the
//! groups or their nodes change), not in the map's two-phase commit: the objects depend on the
//! topology and on DDL too, and on group 0 only.

use std::collections::HashMap;
use std::sync::Arc;

use herd_shard::{Names, ShardMap};
use tokio_postgres::Client;

use super::{failed, quote_qualified};
use crate::roles::literal;
use crate::{ProxyContext, ProxyError};

/// The global relation of each distributed table (`schema.table` → SQL name), as built.
#[derive(Debug)]
pub struct GlobalTables {
    /// `schema.table` → `herd_global.t_<oid>`.
    pub relations: HashMap<String, String>,
    /// Views over distributed tables: `schema.view` → `herd_global.v_<oid>`
    /// (`global_views.rs`).
    pub views: HashMap<String, String>,
    /// Views over distributed tables without a global view: `schema.view` → why.
    pub refused_views: HashMap<String, String>,
    /// What was checked: the names read (kept, so that a later read is never taken for this
    /// one) and the tables and nodes asked for.
    checked: (Arc<Names>, String),
}

impl GlobalTables {
    fn checked_as(&self, names: &Arc<Names>, asked: &str) -> bool {
        Arc::ptr_eq(&self.checked.0, names) && self.checked.1 == asked
    }
}

/// Cache of [`GlobalTables`] per database.
#[derive(Default)]
pub struct GlobalCache {
    by_database: std::sync::Mutex<HashMap<String, Arc<GlobalTables>>>,
    building: tokio::sync::Mutex<()>,
}

/// Advisory lock key of the build (any proxy, one at a time per database).
const BUILD_LOCK: i64 = 0x4845_5244_474c_4f42; // "HERDGLOB"

/// A distributed table as its global relation is built from.
#[derive(Debug)]
struct Table {
    /// `schema.table`, as the map names it.
    key: String,
    /// Its OID on group 0 (names the global relation).
    oid: i64,
    /// Its columns' definitions, in order.
    columns: String,
    /// The roles that may SELECT it (quoted, or PUBLIC), comma-separated; empty: none.
    readers: String,
}

const COLUMNS: &str = "SELECT t.key, c.oid::int8,
    (SELECT string_agg(quote_ident(a.attname) || ' ' || format_type(a.atttypid, a.atttypmod)
        || CASE WHEN a.attcollation <> 0 AND a.attcollation <> ty.typcollation
           THEN ' COLLATE ' || quote_ident(cn.nspname) || '.' || quote_ident(co.collname)
           ELSE '' END, ', ' ORDER BY a.attnum)
     FROM pg_attribute a
     JOIN pg_type ty ON ty.oid = a.atttypid
     LEFT JOIN pg_collation co ON co.oid = a.attcollation
     LEFT JOIN pg_namespace cn ON cn.oid = co.collnamespace
     WHERE a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped),
    coalesce((SELECT string_agg(DISTINCT CASE WHEN x.grantee = 0 THEN 'PUBLIC'
                                          ELSE quote_ident(r.rolname) END, ', ')
     FROM aclexplode(coalesce(c.relacl, acldefault('r', c.relowner))) x
     LEFT JOIN pg_roles r ON r.oid = x.grantee
     WHERE x.privilege_type = 'SELECT'), '')
FROM unnest($1::text[], $2::text[]) AS t(key, quoted)
JOIN pg_class c ON c.oid = to_regclass(t.quoted)
ORDER BY t.key";

impl ProxyContext {
    /// The global relations of `database`'s distributed tables on group 0, built or rebuilt
    /// first when they are missing or out of date. `names` is the catalog's names as the
    /// statement was planned with: while they are the same, the check is not repeated.
    pub(crate) async fn global_tables(
        &self,
        database: &str,
        map: &ShardMap,
        names: &Arc<Names>,
    ) -> Result<Arc<GlobalTables>, ProxyError> {
        let nodes = self.group_nodes(map.groups());
        let tables: Vec<&str> = map.distributed().map(|(t, ..)| t).collect();
        // Group 0's primary: its CA file is the servers' `sslrootcert` (see the module's docs).
        let coordinating = self
            .view_of(0)
            .primary
            .as_ref()
            .map(|e| (e.host.clone(), e.port));
        let asked = format!("{tables:?} {nodes:?} {database} {coordinating:?}");
        let fresh = |g: &Arc<GlobalTables>| g.checked_as(names, &asked);
        if let Some(g) = self.cached_global(database).filter(fresh) {
            return Ok(g);
        }
        let _one = self.shard_maps.global.building.lock().await;
        if let Some(g) = self.cached_global(database).filter(fresh) {
            return Ok(g);
        }
        let mut client = self
            .group_client(0, database, "to build the general path's global tables")
            .await?;
        let read = |e| failed("reading the distributed tables' columns", e);
        let keys: Vec<String> = tables.iter().map(|t| t.to_string()).collect();
        let quoted: Vec<String> = tables.iter().map(|t| quote_qualified(t)).collect();
        let rows = client
            .query(COLUMNS, &[&keys, &quoted])
            .await
            .map_err(read)?;
        let columns: Vec<Table> = rows
            .iter()
            .map(|r| Table {
                key: r.get(0),
                oid: r.get(1),
                columns: r.get::<_, Option<String>>(2).unwrap_or_default(),
                readers: r.get(3),
            })
            .collect();
        // The views over distributed tables, dependencies first, made over the tables'
        // global relations.
        let over = herd_shard::views_over_distributed(names, map);
        let views = super::global_views::read(&mut client, &over).await?;
        let relations: HashMap<String, String> = columns
            .iter()
            .map(|t| (t.key.clone(), format!("herd_global.t_{}", t.oid)))
            .collect();
        let made = super::global_views::make(&views, &relations);
        let row = client
            .query_one(SERVER_TLS, &[])
            .await
            .map_err(|e| failed("reading group 0's TLS settings", e))?;
        let tls = ServerFiles::of(row.get(0), row.get(1), row.get(2), row.get(3));
        let spec = format!(
            "{} {views:?}",
            spec_of(&columns, &nodes, database, &self.admin.user, tls.as_ref())
        );
        let built = Built {
            spec: &spec,
            columns: &columns,
            views_sql: &made.sql,
        };
        build_if_needed(
            &mut client,
            &built,
            &nodes,
            tls.as_ref(),
            database,
            &self.admin,
        )
        .await?;
        // Views PostgreSQL would not make (each is made on its own: one cannot keep the
        // others, or the tables' global relations, from being built).
        let mut made = made;
        if !views.is_empty() {
            super::global_views::refused_by_server(&mut client, &mut made).await?;
        }
        let global = Arc::new(GlobalTables {
            relations,
            views: made.views,
            refused_views: made.refused,
            checked: (names.clone(), asked),
        });
        if let Ok(mut m) = self.shard_maps.global.by_database.lock() {
            m.insert(database.to_string(), global.clone());
        }
        Ok(global)
    }

    /// The global relations last built for `database`, if any (not checked again).
    pub(crate) fn cached_global(&self, database: &str) -> Option<Arc<GlobalTables>> {
        let m = self.shard_maps.global.by_database.lock().ok()?;
        m.get(database).cloned()
    }

    /// Per group `0..groups`, its nodes' `(host, port)`, sorted (a failover changes nothing).
    fn group_nodes(&self, groups: u32) -> Vec<Vec<(String, u16)>> {
        (0..groups)
            .map(|g| {
                let view = self.view_of(g);
                let mut nodes: Vec<(String, u16)> = view
                    .primary
                    .iter()
                    .chain(view.replicas.iter().map(|r| &r.endpoint))
                    .map(|e| (e.host.clone(), e.port))
                    .collect();
                nodes.sort();
                nodes.dedup();
                nodes
            })
            .collect()
    }
}

/// Group 0's server's TLS settings: whether it serves TLS, its CA, certificate and key files.
const SERVER_TLS: &str = "SELECT current_setting('ssl')::bool, current_setting('ssl_ca_file'), \
     current_setting('ssl_cert_file'), current_setting('ssl_key_file')";

/// The files group 0's server serves TLS with, which its OS user reads: its foreign servers
/// verify the other servers with the CA (`sslrootcert`) and present the certificate and key
/// (`sslcert`, `sslkey` in the user mapping). Without them libpq would look for the OS user's
/// `~/.postgresql/postgresql.crt`, and fail on one it may not read (seen: a server started by
/// root keeps root's `HOME`).
#[derive(Debug, PartialEq)]
struct ServerFiles {
    ca: String,
    cert: String,
    key: String,
}

impl ServerFiles {
    /// The files when the server serves TLS with a CA, else `None`.
    fn of(ssl: bool, ca: String, cert: String, key: String) -> Option<ServerFiles> {
        (ssl && !ca.is_empty()).then_some(ServerFiles { ca, cert, key })
    }
}

/// What the objects are built from: compared with `herd_global.built` on group 0. `tls`: the
/// servers' verify-full settings, `None` for libpq's default.
fn spec_of(
    columns: &[Table],
    nodes: &[Vec<(String, u16)>],
    database: &str,
    admin: &str,
    tls: Option<&ServerFiles>,
) -> String {
    format!("v5 {database} {admin} {nodes:?} {tls:?} {columns:?}")
}

/// A foreign server's TLS options (verify-full against the CA file on the server), and its
/// user mapping's (the server's certificate and key); none without.
fn tls_options(tls: Option<&ServerFiles>) -> (String, String) {
    match tls {
        Some(t) => (
            format!(", sslmode 'verify-full', sslrootcert {}", literal(&t.ca)),
            format!(", sslcert {}, sslkey {}", literal(&t.cert), literal(&t.key)),
        ),
        None => (String::new(), String::new()),
    }
}

/// What a build makes: its spec, the tables' global relations, the views' global views.
struct Built<'a> {
    spec: &'a str,
    columns: &'a [Table],
    /// The statements that make the global views (`global_views::make`).
    views_sql: &'a str,
}

async fn build_if_needed(
    client: &mut Client,
    built: &Built<'_>,
    nodes: &[Vec<(String, u16)>],
    tls: Option<&ServerFiles>,
    database: &str,
    admin: &crate::monitor::AdminLogin,
) -> Result<(), ProxyError> {
    let err = |e| failed("building the general path's global tables on group 0", e);
    let tx = client.transaction().await.map_err(err)?;
    tx.execute("SELECT pg_advisory_xact_lock($1)", &[&BUILD_LOCK])
        .await
        .map_err(err)?;
    let exists: bool = tx
        .query_one("SELECT to_regclass('herd_global.built') IS NOT NULL", &[])
        .await
        .map_err(err)?
        .get(0);
    if exists {
        let rows = tx
            .query("SELECT spec FROM herd_global.built", &[])
            .await
            .map_err(err)?;
        if rows.len() == 1 && rows[0].get::<_, String>(0) == built.spec {
            return tx.commit().await.map_err(err);
        }
    }
    tx.batch_execute(&build_sql(built, nodes, database, admin, tls))
        .await
        .map_err(err)?;
    tx.commit().await.map_err(err)
}

/// The statements that (re)create every object of the general path on group 0.
fn build_sql(
    built: &Built<'_>,
    nodes: &[Vec<(String, u16)>],
    database: &str,
    admin: &crate::monitor::AdminLogin,
    tls: Option<&ServerFiles>,
) -> String {
    let (server_tls, mapping_tls) = tls_options(tls);
    let ident = |s: &str| format!("\"{}\"", s.replace('"', "\"\""));
    let mut sql = String::from(
        "DROP SCHEMA IF EXISTS herd_global CASCADE;
CREATE EXTENSION IF NOT EXISTS postgres_fdw SCHEMA herd;
DO $herd$ DECLARE s text; BEGIN
  FOR s IN SELECT srvname FROM pg_foreign_server WHERE srvname LIKE 'herd\\_group\\_%' LOOP
    EXECUTE format('DROP SERVER %I CASCADE', s);
  END LOOP;
END $herd$;
CREATE SCHEMA herd_global;
REVOKE ALL ON SCHEMA herd_global FROM PUBLIC;
GRANT USAGE ON SCHEMA herd_global TO PUBLIC;
CREATE TABLE herd_global.built (spec text NOT NULL);
CREATE TABLE herd_global.refused (view text NOT NULL, why text NOT NULL);
",
    );
    for (g, group_nodes) in nodes.iter().enumerate() {
        let hosts: Vec<&str> = group_nodes.iter().map(|(h, _)| h.as_str()).collect();
        let ports: Vec<String> = group_nodes.iter().map(|(_, p)| p.to_string()).collect();
        sql.push_str(&format!(
            "CREATE SERVER herd_group_{g} FOREIGN DATA WRAPPER postgres_fdw OPTIONS (host {}, \
             port {}, dbname {}, target_session_attrs 'read-write', async_capable 'true', \
             use_remote_estimate 'true', fetch_size '10000', application_name 'herd_general'{});
CREATE USER MAPPING FOR {} SERVER herd_group_{g} OPTIONS (user {}, password {}{});
",
            literal(&hosts.join(",")),
            literal(&ports.join(",")),
            literal(database),
            server_tls,
            ident(&admin.user),
            literal(&admin.user),
            literal(&admin.password.get()),
            mapping_tls,
        ));
    }
    for t in built.columns {
        let (schema, name) = t.key.split_once('.').unwrap_or(("public", &t.key));
        let (oid, cols) = (t.oid, &t.columns);
        let mut branches = Vec::new();
        for g in 0..nodes.len() {
            sql.push_str(&format!(
                "CREATE FOREIGN TABLE herd_global.t_{oid}_g{g} ({cols}) SERVER herd_group_{g} \
                 OPTIONS (schema_name {}, table_name {});
",
                literal(schema),
                literal(name)
            ));
            branches.push(format!("SELECT * FROM herd_global.t_{oid}_g{g}"));
        }
        sql.push_str(&format!(
            "CREATE VIEW herd_global.t_{oid} AS {};
",
            branches.join(" UNION ALL ")
        ));
        if !t.readers.is_empty() {
            sql.push_str(&format!(
                "GRANT SELECT ON herd_global.t_{oid} TO {};
",
                t.readers
            ));
        }
    }
    sql.push_str(built.views_sql);
    sql.push_str(&format!(
        "INSERT INTO herd_global.built VALUES ({});\n",
        literal(built.spec)
    ));
    sql
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_group_is_a_branch_of_each_table_and_the_password_stays_in_the_mapping() {
        let admin = crate::monitor::AdminLogin {
            user: "herd".into(),
            password: "s'cret".into(),
            tls: None,
        };
        let cols = vec![Table {
            key: "public.orders".into(),
            oid: 42,
            columns: "id bigint".into(),
            readers: "app, \"Odd\"".into(),
        }];
        let nodes = vec![
            vec![("127.0.0.1".to_string(), 5432)],
            vec![("127.0.0.1".to_string(), 5433), ("127.0.0.1".into(), 5434)],
        ];
        let spec = spec_of(&cols, &nodes, "db", "herd", None);
        assert!(!spec.contains("cret"), "the spec is readable: no password");
        let built = Built {
            spec: &spec,
            columns: &cols,
            views_sql: "CREATE VIEW herd_global.v_7 (id) AS SELECT 1;\n",
        };
        let sql = build_sql(&built, &nodes, "db", &admin, None);
        assert!(
            sql.find("CREATE VIEW herd_global.v_7") > sql.find("CREATE VIEW herd_global.t_42"),
            "views after the tables' global relations"
        );
        assert!(
            !sql.contains("sslmode"),
            "no CA: libpq's default, as before"
        );
        assert!(sql.contains("host '127.0.0.1,127.0.0.1', port '5433,5434'"));
        assert!(sql.contains("password 's''cret'"));
        assert_eq!(
            sql.matches("password").count(),
            2,
            "one mapping per group: {sql}"
        );
        assert!(sql.contains(
            "CREATE VIEW herd_global.t_42 AS SELECT * FROM herd_global.t_42_g0 UNION ALL \
             SELECT * FROM herd_global.t_42_g1;"
        ));
        assert!(sql.contains("GRANT SELECT ON herd_global.t_42 TO app, \"Odd\";"));
        assert!(!sql.contains("t_42 TO PUBLIC"), "only the table's readers");
        assert!(sql.contains("table_name 'orders'"));
    }

    #[test]
    fn with_a_ca_every_server_verifies_its_nodes_with_the_servers_ca_file() {
        let admin = crate::monitor::AdminLogin {
            user: "herd".into(),
            password: "pw".into(),
            tls: None,
        };
        let nodes = vec![
            vec![("10.0.0.1".to_string(), 5432)],
            vec![("10.0.0.2".to_string(), 5432)],
        ];
        let files = |ssl: bool, ca: &str| {
            ServerFiles::of(
                ssl,
                ca.into(),
                "/d/tls/h1.crt".into(),
                "/d/tls/h1.key".into(),
            )
        };
        assert_eq!(files(false, "/d/ca.crt"), None, "no TLS served");
        assert_eq!(files(true, ""), None, "no CA");
        let tls = files(true, "/var/lib/herd/secrets/ca'.crt");
        let ca = tls.as_ref();
        let spec = spec_of(&[], &nodes, "db", "herd", ca);
        assert_ne!(
            spec,
            spec_of(&[], &nodes, "db", "herd", None),
            "a CA rebuilds"
        );
        let built = Built {
            spec: &spec,
            columns: &[],
            views_sql: "",
        };
        let sql = build_sql(&built, &nodes, "db", &admin, ca);
        let tls = "application_name 'herd_general', sslmode 'verify-full', \
                   sslrootcert '/var/lib/herd/secrets/ca''.crt');";
        assert_eq!(sql.matches(tls).count(), 2, "every group's server: {sql}");
        let mapping = "password 'pw', sslcert '/d/tls/h1.crt', sslkey '/d/tls/h1.key');";
        assert_eq!(sql.matches(mapping).count(), 2, "every mapping: {sql}");
    }
}
