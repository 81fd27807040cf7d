//! Routing table tests: each accepted form, every refusal, COPY and DDL.

use super::*;
use herd_sql::key_facts;

fn map() -> ShardMap {
    let mut m = ShardMap::new(2, 32);
    let d = |c: &str, t| TableKind::Distributed {
        column: c.into(),
        key_type: t,
    };
    m.tables
        .insert("public.orders".into(), d("customer_id", KeyType::Int8));
    m.tables
        .insert("public.items".into(), d("customer_id", KeyType::Int8));
    m.tables
        .insert("public.users".into(), d("email", KeyType::Text));
    m.tables
        .insert("public.countries".into(), TableKind::Reference);
    m
}

fn run(sql: &str, params: &[Option<&str>]) -> Plan {
    let m = map();
    let cls = herd_sql::classify(sql);
    let relations: Vec<String> = cls
        .statements
        .iter()
        .flat_map(|s| s.relations.clone())
        .collect();
    let facts = key_facts(sql);
    let p = |n: u32| match params.get(n as usize - 1) {
        Some(Some(t)) => ParamValue::Text(t.as_bytes().to_vec()),
        Some(None) => ParamValue::Null,
        None => ParamValue::Missing,
    };
    plan(facts.as_ref(), &relations, &m, &p)
}

fn group_of(v: i64) -> u32 {
    map().group_of(Some(&KeyValue::Int8(v)))
}

/// Two keys on different groups.
fn split_keys() -> (i64, i64) {
    let a = 1;
    let b = (2..100)
        .find(|k| group_of(*k) != group_of(a))
        .expect("another group");
    (a, b)
}

fn group(g: u32) -> Plan {
    Plan::Group {
        group: g,
        reason: "key",
    }
}

/// Refused by the fast paths with `needle` in the reason: refused outright, or (a read
/// lacking a construct) handed to the general path with that reason.
fn refused(p: &Plan, needle: &str) -> bool {
    matches!(p, Plan::Refuse(m) | Plan::General { why: m } if m.contains(needle))
}

#[test]
fn reads_lacking_a_construct_take_the_general_path_and_writes_do_not() {
    let (a, _) = split_keys();
    for sql in [
        "select * from orders where customer_id in (select customer_id from orders where v = 'x')"
            .to_string(),
        "with c as (select * from orders) select count(*) from c".into(),
        "select customer_id from orders union select customer_id from orders".into(),
        "select * from orders a join orders b on a.v = b.v".into(),
        "select * from countries c left join orders o on o.v = c.name".into(),
        "select * from nowhere join orders using (id)".into(),
        format!("select * from orders a join orders b on a.v = b.v where a.customer_id = {a}"),
    ] {
        assert!(
            matches!(run(&sql, &[]), Plan::General { .. }),
            "{sql}: {:?}",
            run(&sql, &[])
        );
    }
    for sql in [
        "update orders set n = 1 where customer_id in (select customer_id from orders where v = 'x')",
        "delete from orders where customer_id in (select 1 from orders o2 where o2.v = 'y')",
        "with d as (delete from orders returning *) select count(*) from d",
        "select * into newt from orders a join orders b on a.v = b.v",
    ] {
        assert!(
            matches!(run(sql, &[]), Plan::Refuse(_)),
            "{sql}: {:?}",
            run(sql, &[])
        );
    }
    // UPDATE … FROM / DELETE … USING not on the keys: the refusal says why the general path
    // does not take a write.
    for sql in [
        "update orders set n = i.n from items i where i.v = orders.v",
        "delete from orders using items i where i.v = orders.v",
        "update orders set n = 1 where customer_id in (select customer_id from orders where v = 'x')",
    ] {
        assert!(
            refused(&run(sql, &[]), "not run through the general path"),
            "{sql}: {:?}",
            run(sql, &[])
        );
    }
}

#[test]
fn routes_single_key_statements() {
    let (a, b) = split_keys();
    let ga = group(group_of(a));
    let cases: Vec<(String, Vec<Option<&str>>, Plan)> = vec![
        (format!("select * from orders where customer_id = {a}"), vec![], ga.clone()),
        (format!("select * from orders where customer_id = '{a}'"), vec![], ga.clone()),
        (format!("select * from orders where customer_id = '{a}'::bigint"), vec![], ga.clone()),
        (format!("select * from orders o where o.customer_id = {a} and o.v > 3"), vec![], ga.clone()),
        (format!("select * from public.orders where orders.customer_id = {a}"), vec![], ga.clone()),
        ("select * from orders where customer_id = $1".into(), vec![Some("1")], ga.clone()),
        (format!("select * from orders where customer_id in ({a}, {a})"), vec![], ga.clone()),
        (format!("update orders set v = v + 1 where customer_id = {a}"), vec![], ga.clone()),
        (format!("delete from orders where customer_id = {a}"), vec![], ga.clone()),
        (format!("insert into orders (customer_id, v) values ({a}, 1)"), vec![], ga.clone()),
        (format!("insert into orders (v, customer_id) values (1, {a}), (2, {a})"), vec![], ga.clone()),
        ("insert into orders (customer_id) values ($1)".into(), vec![Some("1")], ga.clone()),
        (
            format!("select * from orders o join countries c on c.id = o.country where o.customer_id = {a}"),
            vec![],
            // A join with a reference table runs where the key's rows are.
            ga.clone(),
        ),
        (
            format!("select * from orders, items where orders.customer_id = {a} and items.customer_id = {a}"),
            vec![],
            ga.clone(),
        ),
        // INSERT … SELECT within one group: the key from a co-located table read by key, or
        // a constant of the group the SELECT reads.
        (
            format!("insert into orders (customer_id, v) select customer_id, v from items where customer_id = {a}"),
            vec![],
            ga.clone(),
        ),
        (
            format!("insert into orders (v, customer_id) select i.v, i.customer_id from items i where i.customer_id in ({a}, {a})"),
            vec![],
            ga.clone(),
        ),
        (
            "insert into orders (customer_id, v) select o.customer_id, o.v || 'x' from orders o where o.customer_id = $1".into(),
            vec![Some("1")],
            ga.clone(),
        ),
        (format!("insert into orders (customer_id, v) select {a}, 'x'"), vec![], ga.clone()),
        (
            format!("insert into orders (customer_id, v) select {a}, name from countries where id = 3"),
            vec![],
            ga.clone(),
        ),
        (
            format!("insert into orders (customer_id, v) select $1, v from items where customer_id = {a}"),
            vec![Some("1")],
            ga.clone(),
        ),
        // More forms of the key: reversed, cast, parameters among others, aggregates,
        // locking, ordering, RETURNING, ON CONFLICT, EXPLAIN.
        (format!("select * from orders where {a} = customer_id"), vec![], ga.clone()),
        (format!("select * from orders where customer_id = {a}::int8"), vec![], ga.clone()),
        (format!("select * from orders where customer_id = cast('{a}' as bigint)"), vec![], ga.clone()),
        ("select * from orders where v = $1 and customer_id = $2".into(), vec![Some("x"), Some("1")], ga.clone()),
        ("update orders set v = $1 where customer_id = $2".into(), vec![Some("x"), Some("1")], ga.clone()),
        ("delete from orders where customer_id in ($1, $2)".into(), vec![Some("1"), Some("1")], ga.clone()),
        (format!("select count(*), sum(v) from orders where customer_id = {a}"), vec![], ga.clone()),
        (format!("select * from orders where customer_id = {a} for update"), vec![], ga.clone()),
        (format!("select * from orders where customer_id = {a} order by id desc limit 5"), vec![], ga.clone()),
        (format!("insert into orders (customer_id, v) values ({a}, 'x') returning id"), vec![], ga.clone()),
        (
            format!("insert into orders (customer_id, v) values ({a}, 'x') on conflict (customer_id, id) do update set v = excluded.v"),
            vec![],
            ga.clone(),
        ),
        (format!("explain select * from orders where customer_id = {a}"), vec![], ga.clone()),
        (format!("explain analyze update orders set v = 1 where customer_id = {a}"), vec![], ga.clone()),
        (format!("select * from public.orders o where o.customer_id = {a}"), vec![], ga.clone()),
        (format!("delete from orders o where o.customer_id = {a} returning *"), vec![], ga.clone()),
        // Co-located tables joined on the key: the joined table's rows share the key.
        (
            format!("select * from orders o join items i on i.customer_id = o.customer_id where o.customer_id = {a}"),
            vec![],
            ga.clone(),
        ),
        (
            format!("select * from orders join items using (customer_id) where orders.customer_id = {a}"),
            vec![],
            ga.clone(),
        ),
        (
            format!("select * from orders o left join items i on o.customer_id = i.customer_id where o.customer_id = {a}"),
            vec![],
            ga.clone(),
        ),
        (
            format!("select * from orders o, items i where i.customer_id = o.customer_id and i.customer_id = {a}"),
            vec![],
            ga.clone(),
        ),
        (
            format!("select * from orders o join items i on i.customer_id = o.customer_id and o.customer_id = {a}"),
            vec![],
            ga.clone(),
        ),
        (
            format!("delete from items using orders o where items.customer_id = o.customer_id and o.customer_id = {a}"),
            vec![],
            ga.clone(),
        ),
        ("select * from countries".into(), vec![], Plan::Anywhere),
        ("select 1".into(), vec![], Plan::Anywhere),
        ("select * from plain_table".into(), vec![], Plan::Group { group: 0, reason: "local_table" }),
        ("insert into plain_table values (1)".into(), vec![], Plan::Group { group: 0, reason: "local_table" }),
    ];
    for (sql, params, want) in cases {
        let got = run(&sql, &params);
        assert_eq!(got, want, "{sql}");
    }
    match run(
        "copy orders (v, customer_id) from stdin with (format csv)",
        &[],
    ) {
        Plan::CopyIn(c) => {
            assert_eq!(c.key_column, "customer_id");
            assert_eq!(c.format, crate::CopyFormat::Csv { header: false });
        }
        other => panic!("{other:?}"),
    }
    for (sql, binary, header) in [
        ("copy orders to stdout", false, false),
        (
            "copy orders (v) to stdout with (format csv, header)",
            false,
            true,
        ),
        ("copy orders to stdout (format binary)", true, false),
    ] {
        let want = Plan::CopyOut(CopyOut {
            table: "orders".into(),
            binary,
            header,
        });
        assert_eq!(run(sql, &[]), want, "{sql}");
    }
    assert_eq!(run("copy countries to stdout", &[]), Plan::Anywhere);
    for (sql, needle) in [
        ("copy orders to '/tmp/f'", "to STDOUT"),
        (
            "copy orders to stdout (delimiter '|')",
            "FORMAT and HEADER only",
        ),
        ("copy orders from '/tmp/f'", "from STDIN"),
        (
            "copy orders from stdin with (delimiter '|')",
            "default delimiters",
        ),
        ("copy orders (v) from stdin", "shard key column"),
        ("copy countries from stdin", "reference table"),
    ] {
        assert!(refused(&run(sql, &[]), needle), "{sql}");
    }
    for (sql, tag) in [
        ("truncate orders", "TRUNCATE TABLE"),
        ("create index on orders (v)", "CREATE INDEX"),
        ("alter table orders add column w int", "ALTER TABLE"),
        ("alter table countries add column w int", "ALTER TABLE"),
        ("grant select on orders to public", "GRANT"),
        ("revoke select on orders from public", "REVOKE"),
        (
            "grant usage on all sequences in schema public to app",
            "GRANT",
        ),
        (
            "revoke all on all tables in schema public from app",
            "REVOKE",
        ),
        ("drop table orders", "DROP TABLE"),
        (
            "drop table if exists orders, countries cascade",
            "DROP TABLE",
        ),
    ] {
        assert_eq!(run(sql, &[]), Plan::Everywhere(tag), "{sql}");
    }
    assert_eq!(
        run(
            "create index concurrently orders_v on public.orders (v)",
            &[]
        ),
        Plan::EachGroup {
            tag: "CREATE INDEX",
            undo: "DROP INDEX CONCURRENTLY IF EXISTS public.orders_v".into()
        }
    );
    // NULL keys go where PostgreSQL's hash partitioning puts them: remainder 0.
    assert_eq!(
        run("select * from orders where customer_id = $1", &[None]),
        group(map().group_of(None))
    );
    let text_key = map().group_of(Some(&KeyValue::Text("a@b.c".into())));
    assert_eq!(
        run("select * from users where email = 'a@b.c'", &[]),
        group(text_key)
    );
    let _ = b;
}

#[test]
fn refuses_what_spans_groups_or_cannot_be_told() {
    let (a, _) = split_keys();
    let cases: Vec<(String, Vec<Option<&str>>, &str)> = vec![
        (
            "insert into orders values (1, 2)".into(),
            vec![],
            "column list",
        ),
        (
            format!("insert into orders select * from items where customer_id = {a}"),
            vec![],
            "column list",
        ),
        (
            format!("insert into orders (customer_id, v) select {a}, (select max(v) from items)"),
            vec![],
            "subquery",
        ),
        (
            format!("insert into orders (customer_id, v) select customer_id, v from items where customer_id = {a} union select {a}, 'x'"),
            vec![],
            "set operation",
        ),
        (
            format!("insert into orders (customer_id, v) select {a}, i from plain_table"),
            vec![],
            "group 0",
        ),
        (
            format!("update orders set customer_id = 5 where customer_id = {a}"),
            vec![],
            "move the row",
        ),
        (
            "select * from orders where customer_id = $1".into(),
            vec![],
            "no value",
        ),
        (
            "select * from orders where customer_id = 'x'".into(),
            vec![],
            "not a valid bigint",
        ),
        (
            "select * from orders where customer_id = v + 1".into(),
            vec![],
            "constant or a parameter",
        ),
        (
            format!(
                "select * from orders where customer_id = {a} and id in (select id from items)"
            ),
            vec![],
            "subquery, join or CTE",
        ),
        (
            format!("select * from orders, plain_table where customer_id = {a}"),
            vec![],
            "lives on shard group 0",
        ),
        (
            "select * from orders, items where customer_id = 1".into(),
            vec![],
            "not joined on its shard key",
        ),
        (
            "select * from orders where customer_id = $1".into(),
            vec![Some("not-a-number")],
            "customer_id",
        ),
        (
            format!("with x as (select * from orders where customer_id = {a}) select * from x"),
            vec![],
            "subquery, join or CTE",
        ),
        // Joined, but not on the key, or on a key of another hash: their rows may meet on
        // different groups.
        (
            format!("select * from orders o join items i on i.v = o.customer_id where o.customer_id = {a}"),
            vec![],
            "not joined on its shard key",
        ),
        (
            format!("select * from orders o join users u on u.email = o.v where o.customer_id = {a}"),
            vec![],
            "not joined on its shard key",
        ),
        (
            "drop table orders, plain_table".into(),
            vec![],
            "separate statements",
        ),
        (
            "alter table orders rename to x".into(),
            vec![],
            "undistribute_table",
        ),
        (
            "create index concurrently on orders (v)".into(),
            vec![],
            "needs an index name",
        ),
        (
            "insert into countries select id, v from orders".into(),
            vec![],
            "every group's copy must come out the same",
        ),
        (
            format!("select 1 from orders where customer_id = {a}; select 2"),
            vec![],
            "sent alone",
        ),
    ];
    for (sql, params, needle) in cases {
        let got = run(&sql, &params);
        assert!(refused(&got, needle), "{sql}: {got:?}");
    }
}

#[test]
fn selects_not_restricted_to_one_group_run_on_every_group() {
    let (a, b) = split_keys();
    for (sql, params) in [
        ("select * from orders".to_string(), vec![]),
        ("select * from orders where v = 1".into(), vec![]),
        (format!("select * from orders where customer_id = {a} or customer_id = {b}"), vec![]),
        (format!("select * from orders where customer_id in ({a}, {b})"), vec![]),
        ("select * from orders where customer_id = any($1)".into(), vec![Some("{1,2}")]),
        (format!("select * from orders where customer_id > {a}"), vec![]),
        // Co-located: joined on the key (an outer join's ON restricts only the other side).
        ("select * from orders o join items i on i.customer_id = o.customer_id".into(), vec![]),
        (format!("select * from orders o left join items i on i.customer_id = o.customer_id and i.customer_id = {a}"), vec![]),
        (format!("select * from orders o join items i on i.customer_id = o.customer_id where o.customer_id = {a} and i.customer_id = {b}"), vec![]),
        // With a reference table, which every group holds.
        ("select * from orders o join countries c on c.id = o.v::int".into(), vec![]),
    ] {
        let got = run(&sql, &params);
        assert!(matches!(got, Plan::AllGroups { .. }), "{sql}: {got:?}");
    }
    // Writes without a key run on every group, all or none (RETURNING too).
    assert_eq!(
        run("delete from orders where v = 1", &[]),
        Plan::WriteAllGroups("DELETE")
    );
    assert_eq!(
        run(
            &format!("update orders set v = 'x' where customer_id in ({a}, {b})"),
            &[]
        ),
        Plan::WriteAllGroups("UPDATE")
    );
    assert_eq!(
        run("update orders set v = 'x' returning id", &[]),
        Plan::WriteAllGroups("UPDATE")
    );
    assert!(refused(
        &run(
            "update orders o set v = 'x' from items i where i.v = o.v",
            &[]
        ),
        "not joined on its shard key"
    ));
}

#[test]
fn each_reference_of_a_table_counts() {
    let (a, _) = split_keys();
    // A self-join not on the key: rows of one group meet rows of every other.
    for sql in [
        format!("select * from orders a join orders b on a.v = b.v where a.customer_id = {a}"),
        "select * from orders a join orders b on a.v = b.v".to_string(),
    ] {
        assert!(
            refused(&run(&sql, &[]), "not joined on its shard key")
                || refused(&run(&sql, &[]), "no condition"),
            "{sql}: {:?}",
            run(&sql, &[])
        );
    }
    // Read again in a subquery: that read needs every group.
    for sql in [
        format!("select * from orders where customer_id = {a} and v in (select v from orders)"),
        format!("delete from orders where customer_id = {a} and v in (select v from orders)"),
        "select * from orders where v in (select v from orders)".to_string(),
    ] {
        assert!(
            refused(&run(&sql, &[]), "subquery"),
            "{sql}: {:?}",
            run(&sql, &[])
        );
    }
    // A self-join on the key stays on the key's group, or fans out without a key.
    let on_key = run(
        &format!("select * from orders a join orders b on b.customer_id = a.customer_id where a.customer_id = {a}"),
        &[],
    );
    assert!(
        matches!(on_key, Plan::Group { reason: "key", .. }),
        "{on_key:?}"
    );
    let all = run(
        "select * from orders a join orders b on b.customer_id = a.customer_id",
        &[],
    );
    assert!(matches!(all, Plan::AllGroups { .. }), "{all:?}");
}

#[test]
fn writes_to_reference_tables_reach_every_group() {
    assert_eq!(
        run("insert into countries (id, name) values (1, 'x')", &[]),
        Plan::WriteReference {
            table: "countries".into(),
            tag: "INSERT 0",
            columns: vec!["id".into(), "name".into()],
        }
    );
    assert!(matches!(
        run("delete from countries where id = 3", &[]),
        Plan::WriteReference { tag: "DELETE", .. }
    ));
}

#[test]
fn strings_of_several_statements_keep_to_one_group() {
    let (a, b) = split_keys();
    let several = |sqls: &[String]| plan_several(sqls.iter().map(|s| run(s, &[])));
    let upd = |k: i64| format!("update orders set n = 1 where customer_id = {k}");
    assert_eq!(
        several(&["begin".into(), upd(a), upd(a), "commit".into()]),
        group(group_of(a))
    );
    assert!(refused(
        &several(&[upd(a), upd(b)]),
        "different shard groups"
    ));
    assert!(refused(
        &several(&[upd(a), "update orders set n = 2".into()]),
        "send it alone"
    ));
    assert!(refused(
        &several(&[
            upd(a),
            "select * from nowhere join orders using (id)".into()
        ]),
        "not distributed"
    ));
    assert_eq!(
        several(&["select 1".into(), "begin".into()]),
        Plan::Anywhere
    );
}

#[test]
fn a_group_being_added_holds_what_every_group_runs() {
    let held = |sql: &str| run(sql, &[]).reaches_every_group();
    // Reference writes and DDL on mapped tables: the new group must not miss them.
    assert!(held("insert into countries (id, name) values (1, 'x')"));
    assert!(held("update countries set name = 'y' where id = 1"));
    assert!(held("alter table orders add column note text"));
    assert!(held("create index concurrently o_idx on orders (total)"));
    // Rows of distributed tables live where their shards are (none on a new group yet).
    assert!(!held(
        "insert into orders (customer_id, total) values (1, 2)"
    ));
    assert!(!held("update orders set total = 0"));
    assert!(!held("select * from orders"));
    assert!(!held("select * from countries"));
}

/// Issue 38's classes of wrong answers: each statement is refused, never run on a guess.
#[test]
fn wrong_answer_classes_are_refused() {
    let (a, _) = split_keys();
    let cases: Vec<(String, &str)> = vec![
        // Data-modifying WITH: its target is a relation of the statement.
        (
            "with d as (delete from orders where v = 'x' returning *) select count(*) from d"
                .into(),
            "data-modifying WITH",
        ),
        // (By key on one group it runs there: `plan/tests/modifying_with.rs`.)
        (
            "with d as (update countries set name = 'x' returning *) select count(*) from d".into(),
            "data-modifying WITH",
        ),
        // A reference table (or a function) on the preserved side of an outer join.
        (
            "select * from countries c left join orders o on o.v = c.name".into(),
            "preserved side of an outer join",
        ),
        (
            "select * from orders o right join countries c on o.v = c.name".into(),
            "preserved side of an outer join",
        ),
        (
            "select * from orders o full join countries c on o.v = c.name".into(),
            "preserved side of an outer join",
        ),
        (
            "select * from generate_series(1, 3) g left join orders o on o.customer_id = g".into(),
            "preserved side of an outer join",
        ),
        // SELECT … INTO from a distributed table, even by key.
        (
            format!("select * into newt from orders where customer_id = {a}"),
            "SELECT … INTO reading distributed table",
        ),
        // A key compared through a conversion.
        (
            "select * from users where email = 'k  '::char(12)".into(),
            "converted to bpchar",
        ),
        (
            "select * from users where email = 'abcdef'::varchar(3)".into(),
            "converted to varchar",
        ),
    ];
    for (sql, needle) in cases {
        let got = run(&sql, &[]);
        assert!(refused(&got, needle), "{sql}: {got:?}");
    }
    // What stays answerable: the distributed table on the preserved side, a join filtered by
    // key, a conversion to the key's own type, and a data-modifying WITH on local tables.
    let fine: Vec<(String, Plan)> = vec![
        (
            "select * from orders o left join countries c on o.v = c.name".into(),
            Plan::AllGroups {
                table: "orders".into(),
            },
        ),
        (
            format!("select * from countries c left join orders o on o.v = c.name where o.customer_id = {a}"),
            group(group_of(a)),
        ),
        (
            format!("select * from orders where customer_id = '{a}'::int8"),
            group(group_of(a)),
        ),
        (
            format!("select * from orders where customer_id = {a}::int4"),
            group(group_of(a)),
        ),
        (
            "with d as (delete from plain returning *) select count(*) from d".into(),
            Plan::Group {
                group: 0,
                reason: "local_table",
            },
        ),
    ];
    for (sql, want) in fine {
        assert_eq!(run(&sql, &[]), want, "{sql}");
    }
}

/// A parameter declared of another type than the key's is never read as a key.
#[test]
fn parameters_of_other_types_are_not_keys() {
    let m = map();
    let sql = "select * from users where email = $1";
    let facts = key_facts(sql);
    let relations = vec!["users".to_string()];
    let typed = |_: u32| ParamValue::OtherType(1042);
    let got = plan(facts.as_ref(), &relations, &m, &typed);
    assert!(refused(&got, "declared of type OID 1042"), "{got:?}");
    for oid in [0, 25, 1043, 705, 20, 23, 21, 2950] {
        assert!(param_type_alike(oid), "{oid}");
    }
    for oid in [1042, 19, 700, 701, 1700] {
        assert!(!param_type_alike(oid), "{oid}");
    }
}

mod ddl;
mod insert;
mod modifying_with;
