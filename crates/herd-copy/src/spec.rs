//! What a copy is: its name, its source (a shard group's database), its tables (each with an
//! optional column list and row filter, or whole schemas) and its target; and the SQL that
//! PostgreSQL's logical replication needs for it. Pure: no I/O.

use serde::{Deserialize, Serialize};

use crate::CopyError;

/// Prefix of every object Herd creates for a copy: publication, slot, subscription, role.
pub const PREFIX: &str = "herd_copy_";

/// Longest copy name: PostgreSQL identifiers hold 63 bytes, the prefix takes 10.
const MAX_NAME: usize = 40;

/// A logical copy's definition, kept in the source cluster's data directory (mode 0600: the
/// target URL may hold a password).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct CopySpec {
    /// Its name: lower-case letters, digits and `_`, starting with a letter.
    pub name: String,
    /// The source shard group (0 when the cluster has one).
    pub group: u32,
    /// The source (and target) database.
    pub database: String,
    /// Tables copied, each with its column list and row filter.
    pub tables: Vec<TableSpec>,
    /// Schemas copied whole (every table, also tables created later once refreshed).
    pub schemas: Vec<String>,
    /// The target: a libpq URL or key=value string.
    pub target: String,
    /// The operations published (PostgreSQL's `publish` option, e.g. `insert, update,
    /// delete`); `None`: all of them, TRUNCATE included.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub publish: Option<String>,
}

/// One table of a copy.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TableSpec {
    /// `schema.table` (`public.` added when no schema is given).
    pub table: String,
    /// Only these columns travel (PostgreSQL 15 column list); `None`: every column.
    pub columns: Option<Vec<String>>,
    /// Only rows matching this SQL expression travel (PostgreSQL 15 row filter).
    pub row_filter: Option<String>,
}

impl CopySpec {
    /// Checks the name and that something is copied.
    pub fn validate(&self) -> Result<(), CopyError> {
        validate_name(&self.name)?;
        if self.tables.is_empty() && self.schemas.is_empty() {
            return Err(CopyError::Invalid(
                "a copy needs at least one --table or --schema".into(),
            ));
        }
        let mut seen = std::collections::BTreeSet::new();
        for t in &self.tables {
            if !seen.insert(t.table.as_str()) {
                return Err(CopyError::Invalid(format!(
                    "table {} is named twice",
                    t.table
                )));
            }
            if t.columns.as_ref().is_some_and(Vec::is_empty) {
                return Err(CopyError::Invalid(format!(
                    "the column list of {} is empty",
                    t.table
                )));
            }
        }
        Ok(())
    }

    /// The name of the publication, slot, subscription and role of this copy.
    pub fn object_name(&self) -> String {
        format!("{PREFIX}{}", self.name)
    }

    /// `CREATE PUBLICATION …` for this copy's tables and schemas.
    pub fn create_publication(&self) -> String {
        let mut parts = Vec::new();
        if !self.tables.is_empty() {
            let tables: Vec<String> = self
                .tables
                .iter()
                .map(TableSpec::publication_item)
                .collect();
            parts.push(format!("TABLE {}", tables.join(", ")));
        }
        if !self.schemas.is_empty() {
            let schemas: Vec<String> = self.schemas.iter().map(|s| quote_ident(s)).collect();
            parts.push(format!("TABLES IN SCHEMA {}", schemas.join(", ")));
        }
        let with = self.publish.as_ref().map_or(String::new(), |p| {
            format!(" WITH (publish = {})", quote_literal(p))
        });
        format!(
            "CREATE PUBLICATION {} FOR {}{with}",
            quote_ident(&self.object_name()),
            parts.join(", ")
        )
    }

    /// `CREATE SUBSCRIPTION …` on the target, streaming from `source_conninfo` through a slot
    /// of the copy's name created on the source.
    pub fn create_subscription(&self, source_conninfo: &str) -> String {
        let name = self.object_name();
        format!(
            "CREATE SUBSCRIPTION {} CONNECTION {} PUBLICATION {} \
             WITH (slot_name = {}, create_slot = true, copy_data = true)",
            quote_ident(&name),
            quote_literal(source_conninfo),
            quote_ident(&name),
            quote_literal(&name),
        )
    }
}

impl TableSpec {
    /// Parses `table` or `schema.table`.
    pub fn new(table: &str) -> Result<TableSpec, CopyError> {
        Ok(TableSpec {
            table: qualify(table)?,
            columns: None,
            row_filter: None,
        })
    }

    /// `"schema"."table" (cols) WHERE (filter)`.
    pub(crate) fn publication_item(&self) -> String {
        let mut item = quote_qualified(&self.table);
        if let Some(cols) = &self.columns {
            let cols: Vec<String> = cols.iter().map(|c| quote_ident(c)).collect();
            item.push_str(&format!(" ({})", cols.join(", ")));
        }
        if let Some(filter) = &self.row_filter {
            item.push_str(&format!(" WHERE ({filter})"));
        }
        item
    }
}

/// The libpq connection string the target's subscription uses to reach the source: Herd's
/// endpoint (`endpoint` as host and port), which relays the replication connection to the
/// group's current primary — also after a failover or switchover, without anyone changing it —
/// and holds back what a failover could still lose (see the proxy's replication relay).
pub fn source_conninfo(
    endpoint: (&str, u16),
    group: u32,
    database: &str,
    user: &str,
    password: &str,
) -> String {
    let mut pairs = vec![
        ("host", endpoint.0.to_string()),
        ("port", endpoint.1.to_string()),
        ("dbname", database.to_string()),
        ("user", user.to_string()),
        ("password", password.to_string()),
        ("connect_timeout", "5".to_string()),
    ];
    if group > 0 {
        pairs.push(("options", format!("-c herd.group={group}")));
    }
    conninfo(&pairs)
}

/// `conninfo` with the server's certificate checked against the CA in `ca_file` and its names
/// against the host dialled, presenting `cert` and `key` (files on the server that connects).
pub fn verify_full(conninfo: &str, ca_file: &str, cert: &str, key: &str) -> String {
    let tls = self::conninfo(&[
        ("sslmode", "verify-full".to_string()),
        ("sslrootcert", ca_file.to_string()),
        ("sslcert", cert.to_string()),
        ("sslkey", key.to_string()),
    ]);
    format!("{conninfo} {tls}")
}

/// A libpq key=value connection string of `pairs`, each value quoted.
pub fn conninfo(pairs: &[(&str, String)]) -> String {
    pairs
        .iter()
        .map(|(k, v)| format!("{k}={}", conninfo_value(v)))
        .collect::<Vec<_>>()
        .join(" ")
}

/// A libpq key=value value: quoted, with `\` and `'` escaped.
fn conninfo_value(v: &str) -> String {
    format!("'{}'", v.replace('\\', "\\\\").replace('\'', "\\'"))
}

/// Checks a copy name.
pub fn validate_name(name: &str) -> Result<(), CopyError> {
    let ok = !name.is_empty()
        && name.len() <= MAX_NAME
        && name.starts_with(|c: char| c.is_ascii_lowercase())
        && name
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_');
    if ok {
        Ok(())
    } else {
        Err(CopyError::Invalid(format!(
            "invalid copy name {name:?}: use up to {MAX_NAME} lower-case letters, digits and _, starting with a letter"
        )))
    }
}

/// `table` → `public.table`; `schema.table` kept. Names are taken as PostgreSQL folds
/// unquoted identifiers (lower case); a name with other characters is refused.
pub fn qualify(table: &str) -> Result<String, CopyError> {
    let parts: Vec<&str> = table.split('.').collect();
    let valid = |p: &str| {
        !p.is_empty()
            && p.starts_with(|c: char| c.is_ascii_alphabetic() || c == '_')
            && p.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
    };
    match parts.as_slice() {
        [t] if valid(t) => Ok(format!("public.{}", t.to_ascii_lowercase())),
        [s, t] if valid(s) && valid(t) => Ok(format!(
            "{}.{}",
            s.to_ascii_lowercase(),
            t.to_ascii_lowercase()
        )),
        _ => Err(CopyError::Invalid(format!(
            "invalid table name {table:?}: give table or schema.table (letters, digits, _)"
        ))),
    }
}

/// `"name"`, with `"` doubled.
pub fn quote_ident(name: &str) -> String {
    format!("\"{}\"", name.replace('"', "\"\""))
}

/// `schema.table` → `"schema"."table"`.
pub fn quote_qualified(name: &str) -> String {
    name.split('.')
        .map(quote_ident)
        .collect::<Vec<_>>()
        .join(".")
}

/// `'text'`, with `'` doubled (standard_conforming_strings is on in PostgreSQL 15).
pub fn quote_literal(text: &str) -> String {
    format!("'{}'", text.replace('\'', "''"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec() -> CopySpec {
        CopySpec {
            name: "eu_orders".into(),
            group: 0,
            database: "shop".into(),
            tables: vec![
                TableSpec {
                    table: "public.orders".into(),
                    columns: Some(vec!["id".into(), "region".into()]),
                    row_filter: Some("region = 'eu'".into()),
                },
                TableSpec::new("items").expect("valid"),
            ],
            schemas: vec!["audit".into()],
            target: "postgresql://u:p@127.0.0.1:5432/shop".into(),
            publish: None,
        }
    }

    #[test]
    fn publication_lists_tables_columns_filters_and_schemas() {
        assert_eq!(
            spec().create_publication(),
            "CREATE PUBLICATION \"herd_copy_eu_orders\" FOR TABLE \"public\".\"orders\" (\"id\", \"region\") \
             WHERE (region = 'eu'), \"public\".\"items\", TABLES IN SCHEMA \"audit\""
        );
        let mut no_truncate = spec();
        no_truncate.publish = Some("insert, update, delete".into());
        assert!(no_truncate
            .create_publication()
            .ends_with(" WITH (publish = 'insert, update, delete')"));
    }

    #[test]
    fn subscription_names_its_slot_and_quotes_the_conninfo() {
        let sql = spec().create_subscription("host='a' password='it\\'s'");
        assert!(sql.starts_with("CREATE SUBSCRIPTION \"herd_copy_eu_orders\" CONNECTION 'host=''a'' password=''it\\''s'''"), "{sql}");
        assert!(
            sql.ends_with(
                "WITH (slot_name = 'herd_copy_eu_orders', create_slot = true, copy_data = true)"
            ),
            "{sql}"
        );
    }

    #[test]
    fn verified_conninfo_names_the_ca_file_quoted() {
        let c = verify_full(
            "host='p' port='7000'",
            "/d/secrets/c'a.crt",
            "/d/h.crt",
            "/d/h.key",
        );
        assert_eq!(
            c,
            "host='p' port='7000' sslmode='verify-full' sslrootcert='/d/secrets/c\\'a.crt' \
             sslcert='/d/h.crt' sslkey='/d/h.key'"
        );
    }

    #[test]
    fn conninfo_goes_through_the_endpoint_and_names_the_group() {
        let c = source_conninfo(("127.0.0.1", 7000), 0, "shop", "herd_copy_x", "p'w");
        assert_eq!(
            c,
            "host='127.0.0.1' port='7000' dbname='shop' user='herd_copy_x' \
             password='p\\'w' connect_timeout='5'"
        );
        let c = source_conninfo(("127.0.0.1", 7000), 2, "shop", "u", "pw");
        assert!(c.ends_with(" options='-c herd.group=2'"), "{c}");
    }

    #[test]
    fn names_and_tables_are_checked() {
        for (name, ok) in [
            ("orders", true),
            ("eu_2", true),
            ("", false),
            ("2eu", false),
            ("Orders", false),
            ("a-b", false),
            (&"x".repeat(41), false),
        ] {
            assert_eq!(validate_name(name).is_ok(), ok, "{name}");
        }
        assert_eq!(qualify("Orders").expect("ok"), "public.orders");
        assert_eq!(qualify("s.t").expect("ok"), "s.t");
        for bad in ["", "a.b.c", "a;drop", "\"x\"", ".t"] {
            assert!(qualify(bad).is_err(), "{bad}");
        }
        let mut s = spec();
        s.tables
            .push(TableSpec::new("public.items").expect("valid"));
        assert!(s.validate().is_err());
        s.tables.clear();
        s.schemas.clear();
        assert!(s.validate().is_err());
    }
}
