//! Key facts of statements, table-tested.

use super::*;

fn c(q: Option<&str>, col: &str, values: Vec<KeyExpr>) -> Condition {
    Condition {
        qualifier: q.map(str::to_string),
        column: col.into(),
        values,
    }
}

fn lit(s: &str) -> KeyExpr {
    KeyExpr::Const(Some(s.into()))
}

#[test]
fn selects_updates_deletes() {
    let f = key_facts("select * from orders o where o.customer_id = 42 and x = $1").expect("facts");
    assert_eq!(f.kind, StmtKind::Select);
    assert_eq!(f.tables[0].name, "orders");
    assert_eq!(f.tables[0].alias.as_deref(), Some("o"));
    assert_eq!(
        f.conditions,
        vec![
            c(Some("o"), "customer_id", vec![lit("42")]),
            c(None, "x", vec![KeyExpr::Param(1)])
        ]
    );
    assert!(!f.nested);
    let f =
        key_facts("update orders set v = 1 where customer_id in (1, '2', null)").expect("facts");
    assert_eq!(f.kind, StmtKind::Update);
    assert_eq!(f.set_columns, ["v"]);
    assert_eq!(
        f.conditions,
        vec![c(
            None,
            "customer_id",
            vec![lit("1"), lit("2"), KeyExpr::Const(None)]
        )]
    );
    let f = key_facts("delete from public.orders where '7'::bigint = customer_id").expect("facts");
    assert_eq!(f.tables[0].name, "public.orders");
    assert_eq!(
        f.conditions,
        vec![c(
            None,
            "customer_id",
            vec![KeyExpr::Cast(Box::new(lit("7")), "int8".into())]
        )]
    );
    let f = key_facts("select 1 from orders where customer_id = 9000000000").expect("f");
    assert_eq!(f.conditions[0].values, vec![lit("9000000000")]);
    // OR is not a conjunction: no condition is certain.
    let f =
        key_facts("select * from orders where customer_id = 1 or customer_id = 2").expect("facts");
    assert!(f.conditions.is_empty());
}

#[test]
fn inserts() {
    let f =
        key_facts("insert into orders (customer_id, v) values (1, 'a'), ($2, 'b')").expect("facts");
    assert_eq!(f.kind, StmtKind::Insert);
    assert_eq!(f.insert_columns, ["customer_id", "v"]);
    assert_eq!(
        f.insert_rows,
        vec![vec![lit("1"), lit("a")], vec![KeyExpr::Param(2), lit("b")]]
    );
    assert!(!f.insert_select);
    let f = key_facts("insert into orders select * from staging").expect("facts");
    assert!(f.insert_select);
    assert!(f.insert_columns.is_empty());
    let f = key_facts("insert into orders values (now()::int, 1)").expect("facts");
    assert_eq!(
        f.insert_rows,
        vec![vec![
            KeyExpr::Cast(Box::new(KeyExpr::Other), "int4".into()),
            lit("1")
        ]]
    );
}

#[test]
fn nesting_and_other_statements() {
    let joined = key_facts(
        "select * from orders o join items i using (customer_id) where o.customer_id = 1",
    )
    .expect("facts");
    assert!(!joined.nested);
    assert_eq!(joined.tables.len(), 2);
    for sql in [
        "select * from orders join (select 1) s on true where customer_id = 1",
        "select * from orders where customer_id = (select max(id) from c)",
        "with x as (select 1) select * from orders where customer_id = 1",
        "select * from orders where customer_id = 1 union select * from orders",
        "select (select 1 from items) from orders where customer_id = 1",
    ] {
        assert!(key_facts(sql).expect("facts").nested, "{sql}");
    }
    let ddl = key_facts("create table t (i int)").expect("facts");
    assert_eq!(ddl.kind, StmtKind::Other);
    assert_eq!(ddl.utility.as_deref(), Some("CreateStmt"));
    let explained = key_facts("explain analyze select * from orders where k = 1").expect("f");
    assert_eq!(explained.kind, StmtKind::Select);
    assert_eq!(explained.conditions.len(), 1);
    let copy = key_facts("copy orders (a, b) from stdin with (format csv, header)")
        .expect("facts")
        .copy
        .expect("copy facts");
    assert!(copy.from && copy.client_data && copy.header && copy.other_options.is_empty());
    assert_eq!((copy.columns.len(), copy.format.as_str()), (2, "csv"));
    let file = key_facts("copy orders from '/tmp/x'")
        .expect("f")
        .copy
        .expect("copy");
    assert!(!file.client_data);
    let idx = key_facts("create index concurrently on orders (v)").expect("facts");
    assert_eq!(
        (idx.utility.as_deref(), idx.concurrent),
        (Some("IndexStmt"), true)
    );
    assert_eq!(idx.index_name, None);
    let named = key_facts("create index concurrently orders_v on orders (v)").expect("f");
    assert_eq!(named.index_name.as_deref(), Some("orders_v"));
    let drop = key_facts("drop table orders, s.items").expect("facts");
    assert_eq!(drop.drop_type.as_deref(), Some("OBJECT_TABLE"));
    assert_eq!(drop.tables.len(), 2);
    let grant = key_facts("grant usage on all sequences in schema public to app").expect("f");
    assert!(grant.all_in_schema && !grant.revoke);
    let revoke = key_facts("revoke select on orders from app").expect("f");
    assert!(!revoke.all_in_schema && revoke.revoke);
    let drop = key_facts("drop index orders_v").expect("facts");
    assert_eq!(drop.drop_type.as_deref(), Some("OBJECT_INDEX"));
    assert_eq!(ddl.tables[0].name, "t");
    for (sql, table) in [
        ("truncate orders", "orders"),
        ("drop table s.orders", "s.orders"),
        ("create index on orders (v)", "orders"),
        ("alter table orders add column w int", "orders"),
        ("copy orders from stdin", "orders"),
    ] {
        let f = key_facts(sql).expect("facts");
        assert!(f.tables.iter().any(|t| t.name == table), "{sql}: {f:?}");
    }
    assert_eq!(key_facts("select 1; select 2"), None);
    assert_eq!(key_facts("selec"), None);
}

#[test]
fn from_items_whose_columns_are_not_their_tables() {
    for (sql, opaque) in [
        (
            "select * from orders, lineitem where o_orderkey = l_orderkey",
            false,
        ),
        (
            "select * from orders o join lineitem l on o_orderkey = l_orderkey",
            false,
        ),
        (
            "update orders set v = 1 from lineitem where o_orderkey = l_orderkey",
            false,
        ),
        (
            "select * from orders o(a, b), lineitem where a = l_orderkey",
            true,
        ),
        (
            "select * from (orders join lineitem on o_orderkey = l_orderkey) j",
            true,
        ),
        (
            "select * from orders, (select 1 as l_orderkey) s where o_orderkey = l_orderkey",
            true,
        ),
        (
            "select * from orders, generate_series(1, 3) l_orderkey where o_orderkey = 1",
            true,
        ),
        ("select * from orders, lateral (values (1)) v(x)", true),
    ] {
        let f = key_facts(sql).expect(sql);
        assert_eq!(f.opaque_from, opaque, "{sql}");
    }
}
