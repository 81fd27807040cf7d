//! The general path's global views (docs/sharding-general.md, "Views over distributed
//! tables"): for each view of the user's that reads distributed tables (directly or through
//! other views), `herd_global.v_<oid>` on group 0 — the view's definition as PostgreSQL
//! prints it under an empty `search_path` (every name qualified), with its distributed
//! tables pointed at their global relations (`herd_global.t_<oid>`) and its views at their
//! own global views, made after them. A read of the view is answered over it.
//!
//! - *Owner:* the view's own owner, so PostgreSQL checks the owner's privileges on what the
//!   definition reads, as it does for the view: the global relations are granted exactly to
//!   the roles that may SELECT each table, so a view made by a role that may not read a
//!   distributed table does not read it through Herd either (42501, as on one server).
//! - *Readers:* SELECT granted to the roles the view's ACL gives SELECT (or the owner's
//!   default): a read of the view is a read of its global view.
//! - *Options:* `security_barrier` and `security_invoker` are kept (with `security_invoker`
//!   the reader's privileges are checked on the global relations, which mirror the tables'
//!   ACLs: as on one server, column privileges and row-level security aside, which the general
//!   path does not apply). `check_option` is not: the global view is read-only.
//! - A definition the general path cannot read (`FOR UPDATE` in it, say) makes no global
//!   view; a read of the view is refused with the reason.
//!
//! The definitions, owners, options and ACLs are part of the build's spec: `CREATE OR REPLACE
//! VIEW`, `DROP VIEW`, `ALTER VIEW … OWNER`, GRANT and REVOKE rebuild.

use std::cell::RefCell;
use std::collections::HashMap;

use tokio_postgres::Client;

use super::{failed, quote_qualified};
use crate::roles::literal;
use crate::ProxyError;

/// A view over distributed tables, as its global view is made from.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct View {
    /// `schema.view`, as the catalog's names list it.
    pub(super) key: String,
    /// Its OID on group 0 (names the global view).
    pub(super) oid: i64,
    /// Its column names, quoted, comma-separated.
    pub(super) columns: String,
    /// Its `security_barrier` / `security_invoker` options (`name=value`, comma-separated).
    pub(super) options: String,
    /// Its owner, quoted.
    pub(super) owner: String,
    /// The roles that may SELECT it (quoted, or PUBLIC), comma-separated; empty: none.
    pub(super) readers: String,
    /// `pg_get_viewdef` under an empty `search_path`.
    pub(super) definition: String,
}

/// The views' catalog facts, in the order asked (dependencies first); a view gone meanwhile
/// is left out.
const VIEWS: &str = "SELECT t.key, c.oid::int8,
    (SELECT string_agg(quote_ident(a.attname), ', ' ORDER BY a.attnum) FROM pg_attribute a
     WHERE a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped),
    coalesce((SELECT string_agg(o, ', ' ORDER BY o) FROM unnest(c.reloptions) o
              WHERE o LIKE 'security\\_barrier=%' OR o LIKE 'security\\_invoker=%'), ''),
    quote_ident(pg_get_userbyid(c.relowner)),
    coalesce((SELECT string_agg(DISTINCT CASE WHEN x.grantee = 0 THEN 'PUBLIC'
                                          ELSE quote_ident(r.rolname) END, ', ')
     FROM aclexplode(coalesce(c.relacl, acldefault('r', c.relowner))) x
     LEFT JOIN pg_roles r ON r.oid = x.grantee
     WHERE x.privilege_type = 'SELECT'), ''),
    pg_get_viewdef(c.oid)
FROM unnest($1::text[], $2::text[]) WITH ORDINALITY AS t(key, quoted, n)
JOIN pg_class c ON c.oid = to_regclass(t.quoted) AND c.relkind = 'v'
ORDER BY t.n";

/// Reads the views `keys` (`schema.view`, dependencies first) on group 0, their definitions
/// printed under an empty `search_path` so that every name in them is qualified.
pub(super) async fn read(client: &mut Client, keys: &[String]) -> Result<Vec<View>, ProxyError> {
    if keys.is_empty() {
        return Ok(Vec::new());
    }
    let err = |e| failed("reading the views over distributed tables", e);
    let quoted: Vec<String> = keys.iter().map(|k| quote_qualified(k)).collect();
    let tx = client.transaction().await.map_err(err)?;
    tx.batch_execute("SET LOCAL search_path = ''")
        .await
        .map_err(err)?;
    let rows = tx.query(VIEWS, &[&keys, &quoted]).await.map_err(err)?;
    tx.commit().await.map_err(err)?;
    Ok(rows
        .iter()
        .map(|r| View {
            key: r.get(0),
            oid: r.get(1),
            columns: r.get::<_, Option<String>>(2).unwrap_or_default(),
            options: r.get(3),
            owner: r.get(4),
            readers: r.get(5),
            definition: r.get::<_, Option<String>>(6).unwrap_or_default(),
        })
        .collect())
}

/// The global views made from `views` (in order) over the tables' global relations
/// `tables` (`schema.table` → `herd_global.t_<oid>`).
#[derive(Debug, Default, PartialEq)]
pub(super) struct Made {
    /// `schema.view` → `herd_global.v_<oid>`.
    pub(super) views: HashMap<String, String>,
    /// `schema.view` → why it has no global view.
    pub(super) refused: HashMap<String, String>,
    /// The statements that make them (run in the build's transaction).
    pub(super) sql: String,
}

/// Pure: the global views of `views` (dependencies first) over `tables`.
pub(super) fn make(views: &[View], tables: &HashMap<String, String>) -> Made {
    let mut made = Made::default();
    for v in views {
        let unbuilt = RefCell::new(None::<String>);
        let definition = v.definition.trim().trim_end_matches(';');
        let rewritten = herd_sql::globalize(definition, &|schema, name| {
            // Unqualified under an empty search_path: pg_catalog's, or a WITH query.
            let key = herd_shard::qualified(&format!("{}.{name}", schema?));
            if let Some(t) = tables.get(&key).or_else(|| made.views.get(&key)) {
                return Some(t.clone());
            }
            if let Some(why) = made.refused.get(&key) {
                *unbuilt.borrow_mut() = Some(format!("it reads view {key}, which {why}"));
            }
            None
        });
        let name = format!("herd_global.v_{}", v.oid);
        match (rewritten, unbuilt.into_inner()) {
            (Ok(body), None) => {
                let with = if v.options.is_empty() {
                    String::new()
                } else {
                    format!(" WITH ({})", v.options)
                };
                let mut statements = vec![
                    format!("CREATE VIEW {name} ({}){with} AS {body}", v.columns),
                    format!("ALTER VIEW {name} OWNER TO {}", v.owner),
                ];
                if !v.readers.is_empty() {
                    statements.push(format!("GRANT SELECT ON {name} TO {}", v.readers));
                }
                if statements.iter().any(|s| s.contains(TAG)) {
                    made.refused.insert(
                        v.key.clone(),
                        format!("its definition contains {TAG}, which Herd quotes it with"),
                    );
                    continue;
                }
                made.sql.push_str(&guarded(&v.key, &statements));
                made.views.insert(v.key.clone(), name);
            }
            (Err(e), _) => {
                made.refused.insert(
                    v.key.clone(),
                    format!("the general path cannot read its definition ({e})"),
                );
            }
            (Ok(_), Some(why)) => {
                made.refused.insert(v.key.clone(), why);
            }
        }
    }
    made
}

/// The dollar-quote tag of a view's guarded statements.
const TAG: &str = "$herd_view$";

/// `statements` run as one, in a subtransaction: when PostgreSQL refuses one, none is kept
/// and the view's key and the error are noted in `herd_global.refused`, so one view it cannot
/// make keeps neither the others nor the tables' global relations from being built.
fn guarded(key: &str, statements: &[String]) -> String {
    let executes: Vec<String> = statements
        .iter()
        .map(|s| format!("EXECUTE {};", literal(s)))
        .collect();
    format!(
        "DO {TAG} BEGIN {} EXCEPTION WHEN others THEN INSERT INTO herd_global.refused VALUES \
         ({}, SQLERRM); END {TAG};\n",
        executes.join(" "),
        literal(key)
    )
}

/// Moves the views PostgreSQL refused to make (`herd_global.refused`) from `made.views` to
/// `made.refused`, with its error.
pub(super) async fn refused_by_server(
    client: &mut Client,
    made: &mut Made,
) -> Result<(), ProxyError> {
    let rows = client
        .query("SELECT view, why FROM herd_global.refused", &[])
        .await
        .map_err(|e| failed("reading the views the build could not make", e))?;
    for r in rows {
        let (key, why): (String, String) = (r.get(0), r.get(1));
        made.views.remove(&key);
        made.refused
            .insert(key, format!("PostgreSQL refused its global view ({why})"));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn view(key: &str, oid: i64, definition: &str) -> View {
        View {
            key: key.into(),
            oid,
            columns: "id, \"Total\"".into(),
            options: String::new(),
            owner: "alice".into(),
            readers: "alice, bob".into(),
            definition: definition.into(),
        }
    }

    #[test]
    fn views_read_global_relations_and_the_global_views_they_depend_on() {
        let tables: HashMap<String, String> =
            [("public.orders".to_string(), "herd_global.t_10".to_string())].into();
        let mut inner = view(
            "public.v_inner",
            20,
            " SELECT orders.id,\n    orders.total\n   FROM public.orders\n  WHERE orders.total > 0;",
        );
        inner.options = "security_barrier=true".into();
        let outer = view(
            "public.v_outer",
            21,
            " SELECT v.id, n.name FROM public.v_inner v JOIN public.nation n ON n.id = v.id;",
        );
        let locked = view(
            "public.v_locked",
            22,
            " SELECT orders.id FROM public.orders FOR UPDATE;",
        );
        let over_locked = view(
            "public.v_over",
            23,
            " SELECT v_locked.id FROM public.v_locked;",
        );
        let made = make(&[inner, outer, locked, over_locked], &tables);
        assert_eq!(made.views["public.v_inner"], "herd_global.v_20");
        assert_eq!(made.views["public.v_outer"], "herd_global.v_21");
        assert!(
            made.sql.contains(
                "DO $herd_view$ BEGIN EXECUTE 'CREATE VIEW herd_global.v_20 (id, \"Total\") \
                 WITH (security_barrier=true) AS SELECT orders.id,\n    orders.total\n   \
                 FROM herd_global.t_10 AS \"orders\"\n  WHERE orders.total > 0'; \
                 EXECUTE 'ALTER VIEW herd_global.v_20 OWNER TO alice'; \
                 EXECUTE 'GRANT SELECT ON herd_global.v_20 TO alice, bob'; EXCEPTION WHEN \
                 others THEN INSERT INTO herd_global.refused VALUES ('public.v_inner', SQLERRM); \
                 END $herd_view$;\n"
            ),
            "{}",
            made.sql
        );
        assert!(
            made.sql
                .contains("FROM herd_global.v_20 v JOIN public.nation n ON n.id = v.id';"),
            "the view read through its global view, the other table as it is: {}",
            made.sql
        );
        assert!(made.refused["public.v_locked"].contains("FOR UPDATE"));
        assert!(
            made.refused["public.v_over"].contains("reads view public.v_locked"),
            "{:?}",
            made.refused
        );
        assert!(!made.sql.contains("v_22") && !made.sql.contains("v_23"));
    }
}
