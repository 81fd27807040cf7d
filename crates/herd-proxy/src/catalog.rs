//! Function volatility from the primary's `pg_proc`, so reads calling only immutable or stable
//! functions can go to replicas. Unknown functions (created since the last load) are treated as
//! volatile by the classifier: they go to the primary. Unlogged tables are listed too: a hot
//! standby cannot read them, so statements reading them go to the primary.

use std::collections::{HashMap, HashSet};

use herd_sql::{FunctionCatalog, Volatility};
use tokio_postgres::Client;

/// Name → volatility, both `name` and `schema.name`; overloads keep the most volatile.
#[derive(Debug, Default)]
pub struct ProcCatalog {
    map: HashMap<String, Volatility>,
    /// Unlogged tables, both `name` and `schema.name`.
    unlogged: HashSet<String>,
    /// Names (both forms) some aggregate or window function has (`prokind` a or w).
    aggregates: HashSet<String>,
}

impl FunctionCatalog for ProcCatalog {
    fn volatility(&self, name: &str) -> Option<Volatility> {
        self.map.get(name).copied()
    }

    fn is_unlogged(&self, relation: &str) -> bool {
        self.unlogged.contains(relation)
    }
}

impl ProcCatalog {
    /// Reads every function of the database `client` is connected to.
    pub async fn load(client: &Client) -> Result<ProcCatalog, tokio_postgres::Error> {
        let rows = client
            .query(
                "select n.nspname::text, p.proname::text, p.provolatile::text, \
                 p.prokind in ('a', 'w') \
                 from pg_proc p join pg_namespace n on n.oid = p.pronamespace",
                &[],
            )
            .await?;
        let mut catalog = ProcCatalog::default();
        for row in rows {
            let (schema, name, v): (String, String, String) = (row.get(0), row.get(1), row.get(2));
            let v = match v.as_str() {
                "i" => Volatility::Immutable,
                "s" => Volatility::Stable,
                _ => Volatility::Volatile,
            };
            if row.get::<_, bool>(3) {
                catalog.aggregates.insert(format!("{schema}.{name}"));
                catalog.aggregates.insert(name.clone());
            }
            catalog.insert(format!("{schema}.{name}"), v);
            catalog.insert(name, v);
        }
        let unlogged = client
            .query(
                "select n.nspname::text, c.relname::text from pg_class c \
                 join pg_namespace n on n.oid = c.relnamespace where c.relpersistence = 'u'",
                &[],
            )
            .await?;
        for row in unlogged {
            let (schema, name): (String, String) = (row.get(0), row.get(1));
            catalog.note_unlogged(&schema, &name);
        }
        Ok(catalog)
    }

    /// Whether `name` (as written, possibly schema-qualified) may be an aggregate or window
    /// function: true when some function of that name is one, or when the name is unknown
    /// (created since the catalog was read).
    pub fn may_be_aggregate(&self, name: &str) -> bool {
        self.aggregates.contains(name) || !self.map.contains_key(name)
    }

    /// Records an unlogged table `schema.name`.
    pub fn note_unlogged(&mut self, schema: &str, name: &str) {
        self.unlogged.insert(format!("{schema}.{name}"));
        self.unlogged.insert(name.to_string());
    }

    fn insert(&mut self, name: String, v: Volatility) {
        let rank = |v: Volatility| match v {
            Volatility::Immutable => 0,
            Volatility::Stable => 1,
            Volatility::Volatile => 2,
        };
        let entry = self.map.entry(name).or_insert(v);
        if rank(v) > rank(*entry) {
            *entry = v;
        }
    }

    /// Number of names known.
    pub fn len(&self) -> usize {
        self.map.len()
    }

    /// True when nothing is known (not loaded yet): every function is then unknown.
    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unlogged_tables_by_either_name() {
        let mut c = ProcCatalog::default();
        c.note_unlogged("public", "events");
        assert!(c.is_unlogged("events"));
        assert!(c.is_unlogged("public.events"));
        assert!(!c.is_unlogged("other.events"));
        assert!(!c.is_unlogged("orders"));
    }
}
