//! Catalog lookups for statements across shard groups, on group 0's primary: whether text
//! sorts in byte order (a merge compares text that way), and which columns an INSERT that
//! leaves them out computes (a reference table's copies would differ).

use super::failed;
use crate::{ProxyContext, ProxyError};

/// Collations whose order is byte order (PostgreSQL's "C" and "POSIX"; glibc's C.UTF-8
/// compares code points, which is UTF-8's byte order). A database whose default is an ICU
/// locale is described as `ICU <locale>` (its `datcollate` only serves libc functions such as
/// `lower`, and may well be "C"), which no ICU collation is.
fn bytewise_collation(name: &str, collate: &str) -> bool {
    matches!(name, "C" | "POSIX" | "ucs_basic")
        || matches!(collate, "C" | "POSIX" | "C.UTF-8" | "C.utf8")
}

impl ProxyContext {
    /// For text sort keys of a cross-group ORDER BY, given as (table OID, column number) from
    /// the RowDescription (0, 0 for an expression, which has the database's collation): the
    /// first collation that does not order byte by byte, if any. Answers are cached.
    pub async fn non_bytewise_collation(
        &self,
        database: &str,
        columns: &[(u32, i16)],
    ) -> Result<Option<String>, ProxyError> {
        let key = |c: &(u32, i16)| (database.to_string(), c.0, c.1);
        let missing: Vec<(u32, i16)> = {
            let known = self
                .shard_maps
                .bytewise
                .lock()
                .unwrap_or_else(|p| p.into_inner());
            columns
                .iter()
                .filter(|c| !known.contains_key(&key(c)))
                .copied()
                .collect()
        };
        if !missing.is_empty() {
            let client = self
                .group_client(0, database, "to read a column's collation")
                .await?;
            let rels: Vec<u32> = missing.iter().map(|c| c.0).collect();
            let atts: Vec<i16> = missing.iter().map(|c| c.1).collect();
            let rows = client
                .query(
                    "SELECT x.rel, x.att, coalesce(c.collname::text, ''), coalesce(c.collcollate, ''), \
                            (SELECT CASE WHEN d.datlocprovider = 'i' \
                                         THEN 'ICU ' || coalesce(to_jsonb(d)->>'daticulocale', to_jsonb(d)->>'datlocale', '') \
                                         ELSE d.datcollate::text END \
                             FROM pg_database d WHERE d.datname = current_database()) \
                     FROM unnest($1::oid[], $2::int2[]) AS x(rel, att) \
                     LEFT JOIN pg_attribute a ON a.attrelid = x.rel AND a.attnum = x.att \
                     LEFT JOIN pg_collation c ON c.oid = a.attcollation AND c.collname <> 'default'",
                    &[&rels, &atts],
                )
                .await
                .map_err(|e| failed("reading a column's collation", e))?;
            let mut known = self
                .shard_maps
                .bytewise
                .lock()
                .unwrap_or_else(|p| p.into_inner());
            for row in rows {
                let (rel, att): (u32, i16) = (row.get(0), row.get(1));
                let (name, collate, db): (String, String, String) =
                    (row.get(2), row.get(3), row.get(4));
                let ok = if name.is_empty() {
                    bytewise_collation("", &db)
                } else {
                    bytewise_collation(&name, &collate)
                };
                let label = if name.is_empty() { db } else { name };
                known.insert((database.to_string(), rel, att), ok);
                if !ok {
                    return Ok(Some(label));
                }
            }
        }
        let known = self
            .shard_maps
            .bytewise
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        Ok(columns
            .iter()
            .find(|c| known.get(&key(c)) == Some(&false))
            .map(|c| format!("of column {} of table OID {}", c.1, c.0)))
    }

    /// A column of `tables` whose collation is not byte order, if any (an expression over it,
    /// such as `upper(name)`, sorts by that collation). Answers are cached.
    pub async fn table_with_other_collation(
        &self,
        database: &str,
        tables: &[String],
    ) -> Result<Option<String>, ProxyError> {
        let key = |t: &String| (database.to_string(), t.clone());
        let missing: Vec<String> = {
            let known = self
                .shard_maps
                .tables_bytewise
                .lock()
                .unwrap_or_else(|p| p.into_inner());
            if let Some(t) = tables.iter().find(|t| known.get(&key(t)) == Some(&false)) {
                return Ok(Some(format!("a column of {t}")));
            }
            tables
                .iter()
                .filter(|t| !known.contains_key(&key(t)))
                .cloned()
                .collect()
        };
        if missing.is_empty() {
            return Ok(None);
        }
        let client = self
            .group_client(0, database, "to read the tables' collations")
            .await?;
        let rows = client
            .query(
                "SELECT t, coalesce((SELECT c.collname::text FROM pg_attribute a \
                   JOIN pg_collation c ON c.oid = a.attcollation \
                   WHERE a.attrelid = to_regclass(t) AND a.attnum > 0 AND NOT a.attisdropped \
                     AND c.collname NOT IN ('default', 'C', 'POSIX', 'ucs_basic') \
                     AND coalesce(c.collcollate, '') NOT IN ('C', 'POSIX', 'C.UTF-8', 'C.utf8') \
                   LIMIT 1), '') FROM unnest($1::text[]) t",
                &[&missing],
            )
            .await
            .map_err(|e| failed("reading the tables' collations", e))?;
        let mut known = self
            .shard_maps
            .tables_bytewise
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        let mut found = None;
        for row in rows {
            let (table, collation): (String, String) = (row.get(0), row.get(1));
            if !collation.is_empty() && found.is_none() {
                found = Some(format!("{collation} (a column of {table})"));
            }
            known.insert((database.to_string(), table), collation.is_empty());
        }
        Ok(found)
    }

    /// For the columns of a cross-group aggregate's partial rows, given as (table OID, column
    /// number) from the RowDescription: each column's collation (quoted, qualified) when it is
    /// not the database's default, so the final query — whose parameters have the default —
    /// can give their values the column's own. Not cached: asked only for such aggregates,
    /// which make a second round trip anyway.
    pub async fn column_collations(
        &self,
        database: &str,
        columns: &[(u32, i16)],
    ) -> Result<Vec<Option<String>>, ProxyError> {
        let client = self
            .group_client(0, database, "to read the columns' collations")
            .await?;
        let rels: Vec<u32> = columns.iter().map(|c| c.0).collect();
        let atts: Vec<i16> = columns.iter().map(|c| c.1).collect();
        let rows = client
            .query(
                "SELECT (SELECT quote_ident(n.nspname) || '.' || quote_ident(c.collname) \
                         FROM pg_attribute a JOIN pg_collation c ON c.oid = a.attcollation \
                         JOIN pg_namespace n ON n.oid = c.collnamespace \
                         WHERE a.attrelid = x.rel AND a.attnum = x.att \
                           AND a.attcollation NOT IN (0, 100)) \
                 FROM unnest($1::oid[], $2::int2[]) WITH ORDINALITY AS x(rel, att, n) ORDER BY x.n",
                &[&rels, &atts],
            )
            .await
            .map_err(|e| failed("reading the columns' collations", e))?;
        Ok(rows.iter().map(|r| r.get(0)).collect())
    }

    /// A text column of `tables` whose collation is not the database's default, if any: an
    /// expression over the tables' columns (`min(name)`, `upper(name)`) may have it, and the
    /// RowDescription does not say which.
    pub async fn non_default_collation_in(
        &self,
        database: &str,
        tables: &[String],
    ) -> Result<Option<String>, ProxyError> {
        let client = self
            .group_client(0, database, "to read the tables' collations")
            .await?;
        let row = client
            .query_opt(
                "SELECT c.collname::text || ' (column ' || a.attname || ' of ' || a.attrelid::regclass::text || ')' \
                 FROM pg_attribute a JOIN pg_collation c ON c.oid = a.attcollation \
                 WHERE a.attcollation NOT IN (0, 100) AND a.attnum > 0 AND NOT a.attisdropped \
                   AND a.attrelid IN (SELECT to_regclass(t) FROM unnest($1::text[]) t) \
                 LIMIT 1",
                &[&tables],
            )
            .await
            .map_err(|e| failed("reading the tables' collations", e))?;
        Ok(row.map(|r| r.get(0)))
    }

    /// The columns of `table` whose value an INSERT that leaves them out computes (identity,
    /// or a default that is not a constant: `nextval`, `now()` …).
    pub async fn computed_defaults(
        &self,
        database: &str,
        table: &str,
    ) -> Result<Vec<String>, ProxyError> {
        let client = self
            .group_client(0, database, "to read the table's column defaults")
            .await?;
        let rows = client
            .query(
                "SELECT a.attname::text FROM pg_attribute a
                 LEFT JOIN pg_attrdef d ON d.adrelid = a.attrelid AND d.adnum = a.attnum
                 WHERE a.attrelid = to_regclass($1) AND a.attnum > 0 AND NOT a.attisdropped
                   AND a.attgenerated = ''
                   AND (a.attidentity <> '' OR (d.adbin IS NOT NULL AND pg_get_expr(d.adbin, d.adrelid)
                        !~ '^(''([^'']|'''')*''|-?[0-9.]+|true|false|NULL)(::[a-z ]+)?$'))
                 ORDER BY a.attnum",
                &[&table],
            )
            .await
            .map_err(|e| failed("reading the table's column defaults", e))?;
        Ok(rows.iter().map(|r| r.get(0)).collect())
    }
}

#[cfg(test)]
mod tests {
    use super::bytewise_collation;

    #[test]
    fn byte_order_collations() {
        assert!(bytewise_collation("", "C"));
        assert!(bytewise_collation("", "C.UTF-8"));
        assert!(bytewise_collation("C", ""));
        assert!(!bytewise_collation("", "en_US.UTF-8"));
        // An ICU default, whatever its datcollate: never byte order.
        assert!(!bytewise_collation("", "ICU und"));
        assert!(!bytewise_collation("", "ICU en-US"));
        assert!(!bytewise_collation("ci", ""));
    }
}
