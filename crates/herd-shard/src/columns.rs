//! What the tables' columns tell the planner about a statement's columns, the way PostgreSQL
//! resolves them: an unqualified column of a statement reading several tables
//! (`FROM orders, lineitem WHERE o_orderkey = l_orderkey`) belongs to the one table of its FROM
//! that has a column of that name, and `INSERT INTO t VALUES (…)` without a column list fills
//! `t`'s columns in their order. Pure: the columns (`Names::columns`, by `schema.name`, in
//! column order) come from the caller. Where PostgreSQL's answer is not certain from them — a
//! FROM item whose columns are not a table's own, a table whose columns are not known, a name
//! in no table or in several — nothing is filled in, so the planner refuses as without it.

use std::collections::HashMap;

use herd_sql::{ColumnName, KeyFacts, StmtKind, TableRef};

use crate::{ShardMap, TableKind};

/// Fills in, in place, the qualifier of each unqualified column of `facts`' key conditions and
/// column equalities (its INSERT … SELECT source's too) with the table reference (alias, else
/// name) of the one top-level table that has a column of that name; `columns` maps
/// `schema.name` to a table's columns. A statement reading one table is left alone (its
/// unqualified columns are that table's already).
pub fn qualify_columns(facts: &mut KeyFacts, columns: &HashMap<String, Vec<String>>) {
    if let Some(source) = facts.source.as_deref_mut() {
        qualify_columns(source, columns);
    }
    // Most statements read one table: they stop here.
    if facts.tables.len() < 2 || facts.opaque_from {
        return;
    }
    let unqualified = facts.conditions.iter().any(|c| c.qualifier.is_none())
        || facts
            .equalities
            .iter()
            .any(|(a, b)| a.0.is_none() || b.0.is_none());
    if !unqualified {
        return;
    }
    // Every top-level table's columns, or nothing is certain.
    let Some(tables) = facts
        .tables
        .iter()
        .map(|t| columns.get(&crate::qualified(&t.name)).map(|c| (t, c)))
        .collect::<Option<Vec<_>>>()
    else {
        return;
    };
    let owner = |column: &str| -> Option<String> {
        let mut having = tables
            .iter()
            .filter(|(_, cols)| cols.iter().any(|c| c == column));
        let (t, _) = having.next()?;
        if having.next().is_some() {
            return None;
        }
        Some(reference_name(t))
    };
    for c in facts
        .conditions
        .iter_mut()
        .filter(|c| c.qualifier.is_none())
    {
        c.qualifier = owner(&c.column);
    }
    let qualify = |c: &mut ColumnName| {
        if c.0.is_none() {
            c.0 = owner(&c.1);
        }
    };
    for (a, b) in &mut facts.equalities {
        qualify(a);
        qualify(b);
    }
}

/// The name a table reference goes by in its statement: its alias, else its name.
fn reference_name(t: &TableRef) -> String {
    t.alias.clone().unwrap_or_else(|| t.name.clone())
}

/// `INSERT INTO t VALUES (…)` or `INSERT INTO t SELECT …` without a column list, `t`
/// distributed: sets the INSERT's columns to `t`'s columns in order (the VALUES or SELECT
/// fill them in that order), so its shard key's position is known. Left alone when `t`'s
/// columns are not known, or for any other statement.
pub fn fill_insert_columns(
    facts: &mut KeyFacts,
    map: &ShardMap,
    columns: &HashMap<String, Vec<String>>,
) {
    if facts.kind != StmtKind::Insert || !facts.insert_columns.is_empty() {
        return;
    }
    let Some(target) = facts.tables.first() else {
        return;
    };
    if !matches!(map.table(&target.name), Some(TableKind::Distributed { .. })) {
        return;
    }
    if facts.insert_rows.is_empty() && !facts.insert_select {
        // DEFAULT VALUES: no value for the key.
        return;
    }
    if let Some(cols) = columns.get(&crate::qualified(&target.name)) {
        facts.insert_columns = cols.clone();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::KeyType;

    fn columns() -> HashMap<String, Vec<String>> {
        let mut m = HashMap::new();
        for (t, cols) in [
            (
                "public.orders",
                &["o_orderkey", "o_custkey", "o_comment"][..],
            ),
            (
                "public.lineitem",
                &["l_orderkey", "l_linenumber", "l_comment"],
            ),
            ("public.nation", &["n_nationkey", "n_name", "n_comment"]),
        ] {
            m.insert(t.to_string(), cols.iter().map(|c| c.to_string()).collect());
        }
        m
    }

    fn map() -> ShardMap {
        let mut m = ShardMap::new(2, 32);
        for (t, c) in [
            ("public.orders", "o_orderkey"),
            ("public.lineitem", "l_orderkey"),
        ] {
            m.tables.insert(
                t.into(),
                TableKind::Distributed {
                    column: c.into(),
                    key_type: KeyType::Int8,
                },
            );
        }
        m.tables
            .insert("public.nation".into(), TableKind::Reference);
        m
    }

    fn q(s: Option<&str>) -> Option<String> {
        s.map(str::to_string)
    }

    /// (statement, the qualifiers of its equalities' sides and its conditions after).
    #[test]
    fn unqualified_columns_take_their_tables() {
        type Case<'a> = (
            &'a str,
            &'a [(Option<&'a str>, Option<&'a str>)],
            &'a [Option<&'a str>],
        );
        let cases: &[Case<'_>] = &[
            (
                "select * from orders, lineitem where o_orderkey = l_orderkey and o_orderkey = 7",
                &[(Some("orders"), Some("lineitem"))],
                &[Some("orders")],
            ),
            // Aliases are what the statement calls its tables.
            (
                "select * from orders o join lineitem l on o_orderkey = l_orderkey where l_orderkey in (1, 2)",
                &[(Some("o"), Some("l"))],
                &[Some("l")],
            ),
            // Mixed: a written qualifier is kept.
            (
                "select * from orders, lineitem where orders.o_orderkey = l_orderkey",
                &[(Some("orders"), Some("lineitem"))],
                &[],
            ),
            (
                "update orders set o_comment = 'x' from lineitem where o_orderkey = l_orderkey and l_linenumber = 1",
                &[(Some("orders"), Some("lineitem"))],
                &[Some("lineitem")],
            ),
            // A column of both tables (ambiguous: PostgreSQL raises an error) or of neither.
            (
                "select * from orders, lineitem where o_orderkey = l_orderkey and o_comment = l_comment and nope = 1",
                &[(Some("orders"), Some("lineitem")), (Some("orders"), Some("lineitem"))],
                &[None],
            ),
            (
                "select * from orders, nation, lineitem where o_orderkey = l_orderkey and n_comment = 'x' and l_comment = 'y'",
                &[(Some("orders"), Some("lineitem"))],
                &[Some("nation"), Some("lineitem")],
            ),
        ];
        for (sql, equalities, conditions) in cases {
            let mut f = herd_sql::key_facts(sql).expect(sql);
            qualify_columns(&mut f, &columns());
            let got: Vec<_> = f
                .equalities
                .iter()
                .map(|(a, b)| (a.0.clone(), b.0.clone()))
                .collect();
            let want: Vec<_> = equalities.iter().map(|(a, b)| (q(*a), q(*b))).collect();
            assert_eq!(got, want, "{sql}");
            let got: Vec<_> = f.conditions.iter().map(|c| c.qualifier.clone()).collect();
            let want: Vec<_> = conditions.iter().map(|c| q(*c)).collect();
            assert_eq!(got, want, "{sql}");
        }
    }

    /// Nothing is filled in where PostgreSQL's resolution is not certain from the columns.
    #[test]
    fn uncertain_columns_stay_unqualified() {
        for sql in [
            // A table whose columns are not known.
            "select * from orders, unknown_table where o_orderkey = l_orderkey",
            // FROM items whose columns are not their table's own.
            "select * from orders, (select 1 as l_orderkey) s where o_orderkey = l_orderkey",
            "select * from orders, lineitem l(a, b, c) where o_orderkey = a",
            "select * from (orders join lineitem on true) j where o_orderkey = l_orderkey",
            "select * from orders, generate_series(1, 2) l_orderkey where o_orderkey = l_orderkey",
        ] {
            let mut f = herd_sql::key_facts(sql).expect(sql);
            qualify_columns(&mut f, &columns());
            assert!(
                f.equalities
                    .iter()
                    .all(|(a, b)| a.0.is_none() || b.0.is_none()),
                "{sql}: {:?}",
                f.equalities
            );
        }
        // One table: left as written (the planner ties it to that table already).
        let mut f = herd_sql::key_facts("select * from orders where o_orderkey = 1").expect("f");
        qualify_columns(&mut f, &columns());
        assert_eq!(f.conditions[0].qualifier, None);
    }

    #[test]
    fn inserts_without_a_column_list() {
        let cases: &[(&str, &[&str])] = &[
            (
                "insert into orders values (1, 2, 'x')",
                &["o_orderkey", "o_custkey", "o_comment"],
            ),
            (
                "insert into public.lineitem select * from lineitem where l_orderkey = 1",
                &["l_orderkey", "l_linenumber", "l_comment"],
            ),
            // A column list is kept; DEFAULT VALUES has no key; a reference table and a
            // table whose columns are not known are left alone.
            (
                "insert into orders (o_custkey, o_orderkey) values (1, 2)",
                &["o_custkey", "o_orderkey"],
            ),
            ("insert into orders default values", &[]),
            ("insert into nation values (1, 'x', 'y')", &[]),
            ("insert into s3.orders values (1)", &[]),
        ];
        let mut map = map();
        map.tables.insert(
            "s3.orders".into(),
            TableKind::Distributed {
                column: "id".into(),
                key_type: KeyType::Int8,
            },
        );
        for (sql, want) in cases {
            let mut f = herd_sql::key_facts(sql).expect(sql);
            fill_insert_columns(&mut f, &map, &columns());
            assert_eq!(f.insert_columns, *want, "{sql}");
        }
    }

    /// End to end through the planner: with the columns learnt, TPC-H's unqualified join and
    /// an INSERT without a column list are placed; without them, refused as before.
    #[test]
    fn plans_with_learnt_columns() {
        let map = map();
        let param = |_| crate::ParamValue::Missing;
        let plan_of = |sql: &str, learnt: bool| {
            let mut f = herd_sql::key_facts(sql).expect(sql);
            if learnt {
                qualify_columns(&mut f, &columns());
                fill_insert_columns(&mut f, &map, &columns());
            }
            let relations: Vec<String> = f.tables.iter().map(|t| t.name.clone()).collect();
            crate::plan(Some(&f), &relations, &map, &param)
        };
        let join = "select count(*) from orders, lineitem where o_orderkey = l_orderkey";
        assert!(matches!(plan_of(join, false), crate::Plan::General { .. }));
        assert!(matches!(plan_of(join, true), crate::Plan::AllGroups { .. }));
        let by_key =
            "select * from orders, lineitem where o_orderkey = l_orderkey and o_orderkey = 5";
        assert!(matches!(
            plan_of(by_key, true),
            crate::Plan::Group { reason: "key", .. }
        ));
        let ambiguous = "select * from orders, lineitem where o_comment = l_comment";
        assert!(matches!(
            plan_of(ambiguous, true),
            crate::Plan::General { .. }
        ));
        let insert = "insert into orders values (1, 2, 'x'), (2, 3, 'y'), (3, 4, 'z'), (4, 5, 'w')";
        assert!(matches!(plan_of(insert, false), crate::Plan::Refuse(_)));
        assert!(matches!(
            plan_of(insert, true),
            crate::Plan::InsertSplit(_) | crate::Plan::Group { .. }
        ));
    }
}
