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
}

#[test]
fn what_the_merge_cannot_answer_is_named() {
    for (sql, what) in [
        ("select count(*) from accounts", "count()"),
        (
            "select id, my_agg(balance) from accounts group by id",
            "GROUP BY",
        ),
        ("select max(balance) from accounts", "max()"),
        (
            "select sum(x) filter (where x > 0) + 1 from accounts",
            "sum()",
        ),
        (
            "select id, row_number() over () from accounts",
            "window function",
        ),
        ("select distinct name from accounts", "DISTINCT"),
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
        ("select id from accounts order by count(*)", "count()"),
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
