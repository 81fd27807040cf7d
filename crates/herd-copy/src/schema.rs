//! The target's tables: created from the source's definitions when missing, checked when
//! present, with an error that names each difference.

use tokio_postgres::Client;

use crate::spec::{quote_ident, quote_qualified};
use crate::{CopyError, TableSpec};

/// One column as PostgreSQL describes it.
#[derive(Clone, Debug, PartialEq)]
pub struct Column {
    /// Its name.
    pub name: String,
    /// `format_type()` of its type, e.g. `numeric(10,2)`.
    pub type_name: String,
    /// NOT NULL.
    pub not_null: bool,
    /// Has a default (or is generated or an identity): a row may omit it.
    pub has_default: bool,
    /// Part of the primary key.
    pub in_key: bool,
}

/// A table's columns, in order.
#[derive(Clone, Debug, PartialEq)]
pub struct TableDef {
    /// `schema.table`.
    pub table: String,
    /// Its columns.
    pub columns: Vec<Column>,
}

/// Reads `table`'s definition; `None` when there is no such table.
pub async fn read_table(client: &Client, table: &str) -> Result<Option<TableDef>, CopyError> {
    let rows = client
        .query(
            "select a.attname::text, format_type(a.atttypid, a.atttypmod), a.attnotnull, \
                    a.atthasdef or a.attidentity <> '' or a.attgenerated <> '', \
                    coalesce(a.attnum = any(i.indkey), false) \
             from pg_attribute a \
             left join pg_index i on i.indrelid = a.attrelid and i.indisprimary \
             where a.attrelid = to_regclass($1) and a.attnum > 0 and not a.attisdropped \
             order by a.attnum",
            &[&quote_qualified(table)],
        )
        .await
        .map_err(|e| CopyError::sql(format!("reading the definition of {table}"), &e))?;
    if rows.is_empty() {
        return Ok(None);
    }
    Ok(Some(TableDef {
        table: table.to_string(),
        columns: rows
            .iter()
            .map(|r| Column {
                name: r.get(0),
                type_name: r.get(1),
                not_null: r.get(2),
                has_default: r.get(3),
                in_key: r.get(4),
            })
            .collect(),
    }))
}

/// The tables of `schema` (ordinary and partitioned), as `schema.table`.
pub async fn tables_of_schema(client: &Client, schema: &str) -> Result<Vec<String>, CopyError> {
    let rows = client
        .query(
            "select n.nspname || '.' || c.relname from pg_class c \
             join pg_namespace n on n.oid = c.relnamespace \
             where n.nspname = $1 and c.relkind in ('r', 'p') and not c.relispartition \
             order by 1",
            &[&schema],
        )
        .await
        .map_err(|e| CopyError::sql(format!("listing the tables of schema {schema}"), &e))?;
    Ok(rows.iter().map(|r| r.get(0)).collect())
}

impl TableDef {
    /// The columns that travel: the spec's column list (checked to exist), else all.
    pub fn published(&self, spec: &TableSpec) -> Result<TableDef, CopyError> {
        let Some(list) = &spec.columns else {
            return Ok(self.clone());
        };
        let mut columns = Vec::new();
        for name in list {
            let col = self
                .columns
                .iter()
                .find(|c| &c.name == name)
                .ok_or_else(|| {
                    CopyError::Invalid(format!("{} has no column {name:?}", self.table))
                })?;
            columns.push(col.clone());
        }
        Ok(TableDef {
            table: self.table.clone(),
            columns,
        })
    }

    /// `CREATE TABLE` for the target: the published columns with their types, NOT NULL and
    /// the primary key (when its columns travel), so updates and deletes find their rows.
    pub fn create_sql(&self) -> String {
        let mut items: Vec<String> = self
            .columns
            .iter()
            .map(|c| {
                let null = if c.not_null { " NOT NULL" } else { "" };
                format!("{} {}{null}", quote_ident(&c.name), c.type_name)
            })
            .collect();
        let key: Vec<String> = self
            .columns
            .iter()
            .filter(|c| c.in_key)
            .map(|c| quote_ident(&c.name))
            .collect();
        if !key.is_empty() {
            items.push(format!("PRIMARY KEY ({})", key.join(", ")));
        }
        format!(
            "CREATE TABLE {} ({})",
            quote_qualified(&self.table),
            items.join(", ")
        )
    }

    /// Every way the target's table `target` cannot receive this (published) table's rows.
    pub fn differences(&self, target: &TableDef) -> Vec<String> {
        let mut out = Vec::new();
        for c in &self.columns {
            match target.columns.iter().find(|t| t.name == c.name) {
                None => out.push(format!("column {} ({}) is missing", c.name, c.type_name)),
                Some(t) if t.type_name != c.type_name => out.push(format!(
                    "column {} is {} at the source but {} on the target",
                    c.name, c.type_name, t.type_name
                )),
                Some(_) => {}
            }
        }
        for t in &target.columns {
            let copied = self.columns.iter().any(|c| c.name == t.name);
            if !copied && t.not_null && !t.has_default {
                out.push(format!(
                    "column {} is NOT NULL without a default on the target but is not copied",
                    t.name
                ));
            }
        }
        if !target.columns.iter().any(|c| c.in_key) {
            out.push(
                "the target table has no primary key, so copied updates and deletes could not find their rows"
                    .into(),
            );
        }
        out
    }
}

/// Creates each missing table on the target (and its schema), checks the others; fails with
/// every difference named before anything is created.
pub async fn prepare_target(
    target: &Client,
    tables: &[TableDef],
) -> Result<Vec<String>, CopyError> {
    let mut problems = Vec::new();
    let mut missing = Vec::new();
    for def in tables {
        match read_table(target, &def.table).await? {
            None => missing.push(def),
            Some(existing) => {
                for d in def.differences(&existing) {
                    problems.push(format!("target table {}: {d}", def.table));
                }
            }
        }
    }
    if !problems.is_empty() {
        return Err(CopyError::Schema(format!(
            "the target's tables cannot receive the copy:\n  {}\nChange the target's tables (or drop them: Herd creates missing ones from the source's definitions)",
            problems.join("\n  ")
        )));
    }
    let mut created = Vec::new();
    for def in missing {
        let schema = def.table.split('.').next().unwrap_or("public");
        let sql = format!(
            "CREATE SCHEMA IF NOT EXISTS {}; {}",
            quote_ident(schema),
            def.create_sql()
        );
        target
            .batch_execute(&sql)
            .await
            .map_err(|e| CopyError::sql(format!("creating {} on the target", def.table), &e))?;
        created.push(def.table.clone());
    }
    Ok(created)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn col(name: &str, ty: &str, not_null: bool, in_key: bool) -> Column {
        Column {
            name: name.into(),
            type_name: ty.into(),
            not_null,
            has_default: false,
            in_key,
        }
    }

    fn orders() -> TableDef {
        TableDef {
            table: "public.orders".into(),
            columns: vec![
                col("id", "bigint", true, true),
                col("region", "text", false, false),
                col("total", "numeric(10,2)", true, false),
            ],
        }
    }

    #[test]
    fn create_keeps_types_not_null_and_key() {
        assert_eq!(
            orders().create_sql(),
            "CREATE TABLE \"public\".\"orders\" (\"id\" bigint NOT NULL, \"region\" text, \
             \"total\" numeric(10,2) NOT NULL, PRIMARY KEY (\"id\"))"
        );
    }

    #[test]
    fn column_lists_pick_columns_and_name_unknown_ones() {
        let mut spec = TableSpec::new("orders").expect("valid");
        spec.columns = Some(vec!["id".into(), "total".into()]);
        let p = orders().published(&spec).expect("known columns");
        assert_eq!(p.columns.len(), 2);
        spec.columns = Some(vec!["nope".into()]);
        let err = orders().published(&spec).expect_err("unknown column");
        assert!(err.to_string().contains("nope"), "{err}");
    }

    #[test]
    fn differences_name_each_problem() {
        let source = orders();
        assert!(source.differences(&orders()).is_empty());
        let mut target = orders();
        target.columns[2].type_name = "integer".into();
        target.columns.remove(1);
        target.columns.push(col("extra", "text", true, false));
        let d = source.differences(&target);
        assert_eq!(
            d,
            vec![
                "column region (text) is missing".to_string(),
                "column total is numeric(10,2) at the source but integer on the target".into(),
                "column extra is NOT NULL without a default on the target but is not copied".into(),
            ]
        );
        let mut keyless = orders();
        for c in &mut keyless.columns {
            c.in_key = false;
        }
        assert!(source.differences(&keyless)[0].contains("no primary key"));
    }
}
