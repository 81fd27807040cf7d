//! DDL on distributed and reference tables: uniqueness, refusals naming the construct,
//! maintenance on every group, shared collations.

use super::*;

#[test]
fn uniqueness_without_the_shard_key_is_refused_on_distributed_tables() {
    let refusals = [
        ("create unique index on users (name)", "CREATE UNIQUE INDEX"),
        (
            "create unique index u on orders (id)",
            "CREATE UNIQUE INDEX u",
        ),
        (
            "create unique index u on orders ((customer_id + 1), id)",
            "CREATE UNIQUE INDEX u",
        ),
        (
            "create unique index concurrently u on orders (id)",
            "CREATE UNIQUE INDEX u",
        ),
        ("alter table users add unique (name)", "UNIQUE"),
        (
            "alter table orders add constraint o_pk primary key (id)",
            "PRIMARY KEY o_pk",
        ),
        ("alter table orders add column code text unique", "UNIQUE"),
        (
            "alter table orders add exclude using gist (customer_id with <>, id with =)",
            "EXCLUDE",
        ),
    ];
    for (sql, what) in refusals {
        let got = run(sql, &[]);
        assert!(
            refused(&got, &format!("{what} on distributed table public."))
                || refused(&got, &format!("{what} on distributed table ")),
            "{sql}: {got:?}"
        );
        assert!(
            refused(&got, "does not include its shard key"),
            "{sql}: {got:?}"
        );
        assert!(refused(&got, "reference table"), "{sql}: {got:?}");
    }
    // A uniqueness of another table that names a distributed one (a foreign key) is not that
    // table's.
    let got = run(
        "alter table plain_table add unique (x), add foreign key (y) references orders (id)",
        &[],
    );
    assert!(!refused(&got, "does not include its shard key"), "{got:?}");
    // With the key, on a reference table, or on an existing (checked) unique index: as before.
    for (sql, want) in [
        (
            "create unique index on users (email, name)",
            Plan::Everywhere("CREATE INDEX"),
        ),
        (
            "alter table orders add primary key (customer_id, id)",
            Plan::Everywhere("ALTER TABLE"),
        ),
        (
            "alter table orders add unique (id, customer_id)",
            Plan::Everywhere("ALTER TABLE"),
        ),
        (
            "alter table orders add exclude (customer_id with =)",
            Plan::Everywhere("ALTER TABLE"),
        ),
        (
            "alter table orders add primary key using index o_idx",
            Plan::Everywhere("ALTER TABLE"),
        ),
        (
            "create unique index on countries (name)",
            Plan::Everywhere("CREATE INDEX"),
        ),
        (
            "alter table countries add unique (name)",
            Plan::Everywhere("ALTER TABLE"),
        ),
        (
            "create index on orders (id)",
            Plan::Everywhere("CREATE INDEX"),
        ),
        // About another table: a foreign key to a distributed table is not its uniqueness.
        (
            "alter table items add unique (customer_id, v), add foreign key (v) references countries (name)",
            Plan::Everywhere("ALTER TABLE"),
        ),
    ] {
        assert_eq!(run(sql, &[]), want, "{sql}");
    }
}

#[test]
fn ddl_refusals_name_the_construct_and_maintenance_runs_on_every_group() {
    for (sql, needle) in [
        (
            "create table t2 as select * from orders",
            "CREATE TABLE … AS",
        ),
        (
            "create materialized view mv as select * from orders",
            "CREATE MATERIALIZED VIEW",
        ),
        (
            "prepare p as select * from orders where customer_id = $1",
            "SQL PREPARE",
        ),
        (
            "declare c cursor for select * from orders",
            "DECLARE … CURSOR",
        ),
        ("copy (select * from orders) to stdout", "COPY (query) TO"),
        ("create policy p on orders using (v = 'x')", "POLICY"),
        (
            "alter table orders rename column customer_id to cid",
            "renaming the shard key column",
        ),
        ("alter table orders rename to x", "to rename the table"),
        (
            "create table o1 partition of orders for values in (1)",
            "PARTITION OF",
        ),
        ("vacuum orders, plain_table", "separate statements"),
        (
            "alter table orders alter column customer_id type text",
            "shard key column orders.customer_id",
        ),
        (
            "alter table orders drop column customer_id",
            "shard key column orders.customer_id",
        ),
    ] {
        let got = run(sql, &[]);
        assert!(refused(&got, needle), "{sql}: {got:?}");
        assert!(
            !refused(&got, "to RENAME it") || sql.contains("rename to"),
            "{sql}: {got:?}"
        );
    }
    for (sql, want) in [
        (
            "alter table orders rename column v to w",
            Plan::Everywhere("ALTER TABLE"),
        ),
        (
            "alter table orders rename v to w",
            Plan::Everywhere("ALTER TABLE"),
        ),
        (
            "alter table countries rename column name to label",
            Plan::Everywhere("ALTER TABLE"),
        ),
        (
            "alter table orders rename constraint c1 to c2",
            Plan::Everywhere("ALTER TABLE"),
        ),
        (
            "create view v as select * from countries",
            Plan::Group {
                group: 0,
                reason: "local_table",
            },
        ),
        // Views over distributed tables: the catalog object, on group 0 (a read of it is
        // answered over its global view).
        (
            "create view v as select * from orders",
            Plan::Group {
                group: 0,
                reason: "view",
            },
        ),
        (
            "create or replace view v as select * from countries c join orders o on o.v = c.name",
            Plan::Group {
                group: 0,
                reason: "view",
            },
        ),
        (
            "create table c2 as select * from countries",
            Plan::Group {
                group: 0,
                reason: "local_table",
            },
        ),
        (
            "vacuum orders",
            Plan::EachGroup {
                tag: "VACUUM",
                undo: String::new(),
            },
        ),
        (
            "vacuum (analyze, verbose) orders, countries",
            Plan::EachGroup {
                tag: "VACUUM",
                undo: String::new(),
            },
        ),
        (
            "analyze orders",
            Plan::EachGroup {
                tag: "ANALYZE",
                undo: String::new(),
            },
        ),
    ] {
        assert_eq!(run(sql, &[]), want, "{sql}");
    }
}

#[test]
fn collations_are_shared_once_tables_are() {
    let shared = |sql: &str, m: &ShardMap| shared_object_plan(key_facts(sql).as_ref(), m);
    let m = map();
    assert_eq!(
        shared("create collation ci (provider = icu, locale = 'und-u-ks-level2', deterministic = false)", &m),
        Some(Plan::Everywhere("CREATE COLLATION"))
    );
    assert_eq!(
        shared("drop collation if exists public.ci", &m),
        Some(Plan::Everywhere("DROP COLLATION"))
    );
    assert_eq!(shared("drop table orders", &m), None);
    assert_eq!(shared("create table t (a int)", &m), None);
    // Nothing distributed yet: group 0 keeps it until a table using it is distributed.
    let empty = ShardMap::new(2, 32);
    assert_eq!(shared("create collation ci (locale = 'C')", &empty), None);
}
