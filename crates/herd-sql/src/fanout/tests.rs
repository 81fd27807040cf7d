use super::*;

fn agg(name: &str) -> bool {
    matches!(name, "count" | "sum" | "avg" | "min" | "max" | "my_agg")
}

fn plan(sql: &str) -> FanOut {
    fan_out(sql, &agg).unwrap_or_else(|e| panic!("{sql}: {e}"))
}

fn refused(sql: &str) -> String {
    match fan_out(sql, &agg) {
        Ok(f) => panic!("{sql} planned as {f:?}"),
        Err(e) => e,
    }
}

#[test]
fn plain_rows_run_unchanged() {
    let f = plan("select id, name from accounts where balance > 10");
    assert_eq!(f.sql, "SELECT id, name FROM accounts WHERE balance > 10");
    assert!(f.sort.is_empty());
    assert_eq!((f.hidden, f.limit, f.offset), (0, None, None));
}

#[test]
fn order_by_keys_become_hidden_columns_unless_positional() {
    let f = plan("select name from accounts order by balance desc, 1 limit 5");
    assert_eq!(
        f.sql,
        "SELECT name, balance AS herd_sort_0 FROM accounts ORDER BY balance DESC, 1 LIMIT 5"
    );
    assert_eq!(
        f.sort,
        vec![
            SortKey {
                column: SortColumn::Hidden(0),
                descending: true,
                nulls_first: true
            },
            SortKey {
                column: SortColumn::Output(0),
                descending: false,
                nulls_first: false
            },
        ]
    );
    assert_eq!((f.hidden, f.limit), (1, Some(Bound::Const(5))));
    // An alias of the select list means its expression.
    let f = plan("select id, balance * 2 as twice from accounts order by twice nulls first");
    assert_eq!(
        f.sql,
        "SELECT id, balance * 2 AS twice, balance * 2 AS herd_sort_0 FROM accounts ORDER BY twice NULLS FIRST"
    );
    assert!(f.sort[0].nulls_first && !f.sort[0].descending);
}

#[test]
fn offset_is_applied_by_the_merge() {
    let f = plan("select id from accounts order by id limit 10 offset 5");
    assert_eq!(
        f.sql,
        "SELECT id, id AS herd_sort_0 FROM accounts ORDER BY id LIMIT 15"
    );
    assert_eq!(
        (f.limit, f.offset),
        (Some(Bound::Const(10)), Some(Bound::Const(5)))
    );
    let f = plan("select id from accounts order by id offset 3");
    assert_eq!(
        f.sql,
        "SELECT id, id AS herd_sort_0 FROM accounts ORDER BY id"
    );
    let f = plan("select id from accounts order by id limit $1");
    assert_eq!(f.limit, Some(Bound::Param(1)));
    assert!(f.sql.ends_with("LIMIT $1"), "{}", f.sql);
    let f = plan("select id from accounts limit all");
    assert_eq!(f.limit, None);
    let f = plan("select id from accounts order by id limit 3000000000");
    assert_eq!(f.limit, Some(Bound::Const(3_000_000_000)));
    // An SQL EXECUTE's argument written in: an integer constant converted to an integer type.
    let f = plan("select id from accounts order by id limit (CAST(4 AS smallint)) offset 2::int8");
    assert_eq!(
        (f.limit, f.offset),
        (Some(Bound::Const(4)), Some(Bound::Const(2)))
    );
    let f = plan("select id from accounts order by id limit CAST(NULL AS integer)");
    assert_eq!(f.limit, None);
    for sql in [
        "select id from accounts order by id limit CAST(2.5 AS numeric)",
        "select id from accounts order by id limit CAST(f() AS integer)",
    ] {
        assert!(refused(sql).contains("LIMIT"), "{sql}");
    }
}

#[test]
fn what_the_merge_cannot_answer_is_named() {
    for (sql, what) in [
        (
            "select id, my_agg(balance) from accounts group by id",
            "my_agg()",
        ),
        (
            "select id, row_number() over () from accounts",
            "window function",
        ),
        (
            "select count(*), row_number() over () from accounts",
            "OVER",
        ),
        (
            "select distinct on (name) name from accounts",
            "DISTINCT ON",
        ),
        (
            "select count(distinct name) filter (where grp > 1) from accounts",
            "FILTER",
        ),
        ("select name, count(*) from accounts", "outside GROUP BY"),
        ("select * from accounts group by id", "*"),
        (
            "select grp, count(*) from accounts group by rollup (grp)",
            "ROLLUP",
        ),
        ("select herd_partial from accounts", "herd_partial"),
        (
            "select id from accounts union select id from others",
            "UNION",
        ),
        ("with a as (select * from accounts) select * from a", "WITH"),
        (
            "select id from accounts order by id fetch first 3 rows with ties",
            "WITH TIES",
        ),
        ("select id from accounts order by id using <", "USING"),
        ("select id from accounts limit $1 offset $2", "parameters"),
        ("select id from accounts limit 1 + 1", "expression"),
        ("select * into copy from accounts", "SELECT INTO"),
        (
            "select id from accounts order by name collate \"en-x-icu\"",
            "en-x-icu",
        ),
    ] {
        let e = refused(sql);
        assert!(e.contains(what), "{sql}: {e}");
    }
    // A subquery's own aggregate (on a reference table) is the subquery's business.
    let f = plan("select id from accounts where balance > (select avg(rate) from rates)");
    assert!(f.sort.is_empty());
    // An unknown function is treated as a possible aggregate.
    assert!(fan_out("select mystery(id) from accounts", &|_| true).is_err());
    assert!(fan_out("select lower(name) from accounts", &agg).is_ok());
    assert!(fan_out("select id from accounts order by name collate \"C\"", &agg).is_ok());
}

#[test]
fn aggregates_become_partials_and_a_final_query() {
    let f = plan(
        "select grp, count(*), sum(balance), avg(balance) as mean, max(name) from accounts \
         where balance > $1 group by grp having count(*) > 2 order by mean desc, 1 limit 3",
    );
    assert_eq!(
        f.sql,
        "SELECT grp AS c0, count(*) AS c1, sum(balance) AS c2, sum(balance) AS c3, \
         count(balance) AS c4, max(name) AS c5, count(*) AS c6 FROM accounts WHERE balance > $1 \
         GROUP BY grp"
    );
    let c = f.combine.expect("combine");
    assert_eq!(c.columns, 7);
    assert!(f.sort.is_empty() && f.limit.is_none());
    // int8 counts, a numeric sum (sum of bigint), numeric average.
    let sql = c
        .final_sql(&[23, 20, 1700, 1700, 20, 25, 20], 2, 2)
        .expect("final");
    assert_eq!(
        sql,
        "SELECT c0 AS grp, COALESCE(sum(c1), 0)::int8 AS count, sum(c2)::numeric AS sum, \
         (sum(c3)::numeric / nullif(sum(c4), 0)::numeric) AS mean, max(c5) AS max \
         FROM (VALUES ($2, $3, $4, $5, $6, $7, $8, $9), ($10, $11, $12, $13, $14, $15, $16, $17)) \
         AS herd_partial(c0, c1, c2, c3, c4, c5, c6, herd_keep) WHERE herd_keep GROUP BY c0 \
         HAVING COALESCE(sum(c6), 0)::int8 > 2 ORDER BY mean DESC, 1 LIMIT 3"
    );
    // No partial rows at all: one row of NULLs, left out.
    let none = c
        .final_sql(&[23, 20, 1700, 1700, 20, 25, 20], 1, 0)
        .expect("final");
    assert!(
        none.contains("(VALUES ($1, $2, $3, $4, $5, $6, $7, $8))"),
        "{none}"
    );
    // A sum of a type the final query cannot cast back is refused.
    assert!(c.final_sql(&[23, 20, 600, 1700, 20, 25, 20], 1, 1).is_err());
}

#[test]
fn distinct_and_expressions_over_keys_and_aggregates() {
    let f = plan("select distinct grp, name from accounts order by name");
    assert_eq!(
        f.sql,
        "SELECT grp AS c0, name AS c1 FROM accounts GROUP BY grp, name"
    );
    let c = f.combine.expect("combine");
    let sql = c.final_sql(&[23, 25], 1, 1).expect("final");
    assert_eq!(
        sql,
        "SELECT DISTINCT c0 AS grp, c1 AS name FROM (VALUES ($1, $2, $3)) AS herd_partial(c0, c1, herd_keep) \
         WHERE herd_keep GROUP BY c0, c1 ORDER BY name"
    );
    // A column of another collation keeps it in the final query.
    let sql = c
        .final_sql_collated(&[23, 25], &[None, Some("\"public\".\"ci\"".into())], 1, 2)
        .expect("final");
    assert!(
        sql.contains(
            "(VALUES ($1, $2 COLLATE \"public\".\"ci\", $3), ($4, $5 COLLATE \"public\".\"ci\", $6))"
        ),
        "{sql}"
    );
    let f = plan(
        "select upper(name), coalesce(sum(balance), 0) * 2 + count(*) filter (where flag) \
         from accounts group by upper(name)",
    );
    assert_eq!(
        f.sql,
        "SELECT upper(name) AS c0, sum(balance) AS c1, count(*) FILTER (WHERE flag) AS c2 \
         FROM accounts GROUP BY upper(name)"
    );
    let sql = f
        .combine
        .expect("combine")
        .final_sql(&[25, 1700, 20], 1, 1)
        .expect("final");
    assert!(
        sql.starts_with(
            "SELECT c0 AS upper, COALESCE(sum(c1)::numeric, 0) * 2 + COALESCE(sum(c2), 0)::int8 AS \"?column?\""
        ),
        "{sql}"
    );
    // GROUP BY a position or an output name.
    let f = plan("select grp % 2 as parity, count(*) from accounts group by 1");
    assert!(f.sql.ends_with("GROUP BY grp % 2"), "{}", f.sql);
    let f = plan("select grp % 2 as parity, count(*) from accounts group by parity");
    assert!(f.sql.ends_with("GROUP BY grp % 2"), "{}", f.sql);
}

#[test]
fn distinct_aggregates_group_by_their_argument() {
    let f = plan("select grp, count(*), count(distinct name), sum(distinct balance) from accounts group by grp");
    assert_eq!(
        f.sql,
        "SELECT grp AS c0, count(*) AS c1, name AS c2, balance AS c3 FROM accounts \
         GROUP BY grp, name, balance"
    );
    let sql = f
        .combine
        .expect("combine")
        .final_sql(&[23, 20, 25, 1700], 1, 1)
        .expect("final");
    assert!(
        sql.starts_with(
            "SELECT c0 AS grp, COALESCE(sum(c1), 0)::int8 AS count, count(DISTINCT c2) AS count, \
             sum(DISTINCT c3) AS sum FROM"
        ),
        "{sql}"
    );
}
