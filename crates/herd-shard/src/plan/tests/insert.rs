//! INSERTs: rows of several groups split by key, INSERT … SELECT on one group or by rows.

use super::*;

#[test]
fn rows_of_several_groups_are_split() {
    let (a, b) = split_keys();
    let ga = run(
        &format!("select * from orders where customer_id = {a}"),
        &[],
    );
    let Plan::Group { group: ga, .. } = ga else {
        panic!("{ga:?}")
    };
    let got = run(
        &format!("insert into orders (customer_id, v) values ({a}, 'x'), ({b}, 'y'), ({a}, $1)"),
        &[Some("z")],
    );
    assert_eq!(got, Plan::InsertSplit(vec![ga, 1 - ga, ga]));
    // One group's rows only: that group.
    let one = run(
        &format!("insert into orders (customer_id, v) values ({a}, 'x'), ({a}, 'y')"),
        &[],
    );
    assert!(
        matches!(one, Plan::Group { group, .. } if group == ga),
        "{one:?}"
    );
}

#[test]
fn insert_select_across_groups_runs_by_rows() {
    let (a, b) = split_keys();
    let (ga, gx) = (
        group_of(a),
        map().group_of(Some(&KeyValue::Text("x".into()))),
    );
    let rows = |source: Option<u32>| {
        Plan::InsertSelect(crate::InsertSelect {
            table: "orders".into(),
            key_column: "customer_id".into(),
            key_type: KeyType::Int8,
            key_index: 0,
            source,
        })
    };
    let cases: Vec<(String, Plan)> = vec![
        (
            format!("insert into orders (customer_id, v) select customer_id, v from items where customer_id in ({a}, {b})"),
            rows(None),
        ),
        (
            "insert into orders (customer_id, v) select customer_id, v from items".into(),
            rows(None),
        ),
        (
            format!("insert into orders (customer_id, v) select {b}, v from items where customer_id = {a}"),
            rows(Some(ga)),
        ),
        (
            format!("insert into orders (customer_id, v) select email, v from users where email = 'x' and {a} = {a}"),
            rows(Some(gx)),
        ),
        (
            format!("insert into orders (customer_id, v) select customer_id + 1, v from items where customer_id = {a}"),
            rows(Some(ga)),
        ),
        (
            "insert into orders (customer_id, v) select g, 'x' from generate_series(1, 100) g".into(),
            rows(Some(0)),
        ),
    ];
    for (sql, want) in cases {
        assert_eq!(run(&sql, &[]), want, "{sql}");
    }
}
