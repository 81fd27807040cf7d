//! Sharding through the one endpoint on a 2-group cluster: a table distributed in SQL
//! (`herd.create_distributed_table`), rows placed by PostgreSQL's hash of the key on the group
//! the map names (in the simple and extended protocols, text and binary parameters), reads by
//! key from that group, clear 0A000 refusals for what would span groups (also inside a
//! transaction), local tables on group 0, and the map kept across `herd down`/`up`.

mod common;
#[path = "sharding/copy.rs"]
mod copy;
#[path = "sharding/roles.rs"]
mod roles;

use common::{cluster, connect};
use herd_shard::{KeyValue, ShardMap, DEFAULT_SHARD_COUNT};
use std::time::Duration;

use tokio_postgres::error::SqlState;

fn code(e: &tokio_postgres::Error) -> String {
    e.code().map(|c| c.code().to_string()).unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn distributed_table_routed_by_key() {
    let c = cluster();
    c.up(&["--shards", "2", "--replicas", "1"]);
    let endpoint = c.url(&[]);
    let client = connect(&endpoint).await;
    client
        .batch_execute(
            "create table orders (id bigserial, customer_id bigint not null, v text, \
             primary key (customer_id, id)); create table notes (t text)",
        )
        .await
        .expect("creating tables through the endpoint");
    let answer = client
        .simple_query("select herd.create_distributed_table('orders', 'customer_id')")
        .await
        .expect("distributing");
    assert!(
        format!("{answer:?}").contains("distributed by customer_id"),
        "{answer:?}"
    );
    let again = client
        .simple_query("select herd.create_distributed_table('orders', 'customer_id')")
        .await
        .expect_err("twice");
    assert_eq!(code(&again), "42P07");
    let bad = client
        .simple_query("select herd.create_distributed_table('orders', 'nope')")
        .await
        .expect_err("unknown column");
    assert_eq!(code(&bad), "42703");
    let listed = client
        .query_one("select kind, distribution_column, key_type from herd.tables where table_name = 'public.orders'", &[])
        .await
        .expect("herd.tables");
    assert_eq!(
        (
            listed.get::<_, String>(0),
            listed.get::<_, String>(1),
            listed.get::<_, String>(2)
        ),
        ("distributed".into(), "customer_id".into(), "int8".into())
    );

    // Rows by key: half in the simple protocol (literals), half in the extended one (binary
    // parameters, as tokio-postgres sends an i64).
    for k in 0..60i64 {
        if k % 2 == 0 {
            client
                .batch_execute(&format!(
                    "insert into orders (customer_id, v) values ({k}, 'v{k}')"
                ))
                .await
                .expect("insert (simple)");
        } else {
            client
                .execute(
                    "insert into orders (customer_id, v) values ($1, $2)",
                    &[&k, &format!("v{k}")],
                )
                .await
                .expect("insert (extended)");
        }
    }
    // Every row is on the group the rule names, and both groups hold some.
    let map = ShardMap::new(2, DEFAULT_SHARD_COUNT);
    let mut total = 0;
    for g in 0..2u32 {
        let direct = connect(&c.url(&["--group", &g.to_string(), "--primary"])).await;
        let rows = direct
            .query("select customer_id from orders", &[])
            .await
            .expect("reading a group directly");
        assert!(!rows.is_empty(), "group {g} holds no row");
        for r in &rows {
            let k: i64 = r.get(0);
            assert_eq!(
                map.group_of(Some(&KeyValue::Int8(k))),
                g,
                "key {k} on group {g}"
            );
        }
        total += rows.len();
    }
    assert_eq!(total, 60);

    // Reads and writes by key reach the row wherever it is.
    for k in [3i64, 4, 57] {
        let row = client
            .query_one("select v from orders where customer_id = $1", &[&k])
            .await
            .expect("read by key (extended)");
        assert_eq!(row.get::<_, String>(0), format!("v{k}"));
        let rows = client
            .simple_query(&format!("select v from orders where customer_id = {k}"))
            .await
            .expect("read by key (simple)");
        let found = rows
            .iter()
            .filter(|m| matches!(m, tokio_postgres::SimpleQueryMessage::Row(_)))
            .count();
        assert_eq!(found, 1, "key {k}");
    }
    let updated = client
        .execute("update orders set v = 'w' where customer_id = $1", &[&5i64])
        .await
        .expect("update by key");
    assert_eq!(updated, 1);
    // INSERT … SELECT within the key's group.
    let copied = client
        .execute(
            "insert into orders (customer_id, v) select customer_id, v || '-copy' from orders where customer_id = $1",
            &[&5i64],
        )
        .await
        .expect("insert … select by key");
    assert_eq!(copied, 1);
    let both = client
        .query_one("select count(*) from orders where customer_id = 5", &[])
        .await
        .expect("count by key");
    assert_eq!(both.get::<_, i64>(0), 2);
    client
        .execute(
            "delete from orders where customer_id = 5 and v = 'w-copy'",
            &[],
        )
        .await
        .expect("delete by key");

    // A co-located table joined on the key runs on the key's group.
    client
        .batch_execute("create table items (customer_id bigint, item text)")
        .await
        .expect("items");
    client
        .simple_query("select herd.create_distributed_table('items', 'customer_id')")
        .await
        .expect("distribute items");
    client
        .execute(
            "insert into items (customer_id, item) values ($1, 'book')",
            &[&5i64],
        )
        .await
        .expect("insert item by key");
    let joined = client
        .query(
            "select o.v, i.item from orders o join items i using (customer_id) where o.customer_id = $1",
            &[&5i64],
        )
        .await
        .expect("join on the key");
    assert_eq!(joined.len(), 1);
    assert_eq!(joined[0].get::<_, String>(1), "book");

    roles::reach_every_group(&c, &client, &endpoint, &map).await;

    // What would span groups is refused, naming the table and the way out.
    for sql in [
        "update orders set customer_id = 1 where customer_id = 2",
        "alter table orders rename to orders2",
    ] {
        common::refused(&client, sql, "orders").await;
    }
    // Reads no fast path answers take the general path (issue #40; compared with one server
    // in tests/sharding_general.rs).
    for sql in [
        "select string_agg(v, ',') from orders",
        "select * from orders, notes where customer_id = 1",
    ] {
        client.simple_query(sql).await.expect(sql);
    }
    // A transaction follows its statements to the other group (tests/spanning.rs has the
    // rest): a key of the other group is answered there, and ROLLBACK undoes both groups.
    let (a, b) = {
        let a = 1i64;
        let ga = map.group_of(Some(&KeyValue::Int8(a)));
        let b = (2..100)
            .find(|k| map.group_of(Some(&KeyValue::Int8(*k))) != ga)
            .expect("a key on the other group");
        (a, b)
    };
    client.batch_execute("begin").await.expect("begin");
    client
        .batch_execute(&format!(
            "insert into orders (customer_id, v) values ({a}, 'tx')"
        ))
        .await
        .expect("first statement picks the group");
    client
        .execute(
            "insert into orders (customer_id, v) values ($1, 'tx')",
            &[&b],
        )
        .await
        .expect("the other group in the transaction");
    let seen = client
        .query(
            "select v from orders where customer_id = $1 and v = 'tx'",
            &[&b],
        )
        .await
        .expect("read back on the other group");
    assert_eq!(seen.len(), 1, "the transaction reads its own write");
    client.batch_execute("rollback").await.expect("rollback");
    for key in [a, b] {
        let kept = client
            .query_one(
                "select count(*) from orders where customer_id = $1 and v = 'tx'",
                &[&key],
            )
            .await
            .expect("count");
        assert_eq!(
            kept.get::<_, i64>(0),
            0,
            "the rolled back transaction left nothing"
        );
    }

    // Local tables live on group 0.
    client
        .batch_execute("insert into notes values ('n')")
        .await
        .expect("local table");
    let g0 = connect(&c.url(&["--group", "0", "--primary"])).await;
    assert_eq!(
        g0.query_one("select count(*) from notes", &[])
            .await
            .expect("notes")
            .get::<_, i64>(0),
        1
    );

    // Where a statement goes, explained; EXPLAIN itself runs on the key's group.
    let ga = map.group_of(Some(&KeyValue::Int8(3)));
    let explained = client
        .simple_query("select herd.explain('select * from orders where customer_id = 3')")
        .await
        .expect("herd.explain");
    assert!(
        format!("{explained:?}").contains(&format!("shard group {ga}: the group that holds")),
        "{explained:?}"
    );
    let everywhere = client
        .simple_query("select herd.explain('select * from orders')")
        .await
        .expect("herd.explain of a fan-out");
    assert!(
        format!("{everywhere:?}").contains("every shard group"),
        "{everywhere:?}"
    );
    let general = client
        .simple_query("select herd.explain('select string_agg(v, v) from orders')")
        .await
        .expect("herd.explain of a read the merge cannot finish");
    assert!(
        format!("{general:?}").contains("general path"),
        "{general:?}"
    );
    let refused = client
        .simple_query(
            "select herd.explain('update orders set customer_id = 1 where customer_id = 2')",
        )
        .await
        .expect("herd.explain of a refused statement");
    assert!(
        format!("{refused:?}").contains("refused with 0A000"),
        "{refused:?}"
    );
    client
        .simple_query("explain select * from orders where customer_id = 3")
        .await
        .expect("EXPLAIN by key");

    // DDL on a distributed table reaches every group, all or none.
    client
        .batch_execute("create index orders_v on orders (v)")
        .await
        .expect("create index everywhere");
    client
        .batch_execute("alter table orders add column note text")
        .await
        .expect("alter everywhere");
    let e = client
        .batch_execute("alter table orders add column note text")
        .await
        .expect_err("fails on every group: nothing changes anywhere");
    assert_eq!(e.code(), Some(&SqlState::DUPLICATE_COLUMN), "{e}");
    for g in 0..2u32 {
        let direct = connect(&c.url(&["--group", &g.to_string(), "--primary"])).await;
        let row = direct
            .query_one(
                "select (select count(*) from pg_indexes where indexname = 'orders_v'),                  (select count(*) from information_schema.columns where table_name = 'orders' and column_name = 'note'),                  (select count(*) from pg_prepared_xacts)",
                &[],
            )
            .await
            .expect("catalog");
        assert_eq!(
            (
                row.get::<_, i64>(0),
                row.get::<_, i64>(1),
                row.get::<_, i64>(2)
            ),
            (1, 1, 0),
            "group {g}"
        );
    }

    copy::split_and_gathered(&c, &client).await;

    // `herd shards verify` checks placement with PostgreSQL's own hash functions, and names
    // a row put on the wrong group behind Herd's back.
    let out = c.herd_ok(&["shards", "verify"]);
    assert!(
        out.contains("public.orders on group 1") && out.contains("all in place"),
        "{out}"
    );
    let wrong_group = 1 - map.group_of(Some(&KeyValue::Int8(777)));
    let direct = connect(&c.url(&["--group", &wrong_group.to_string(), "--primary"])).await;
    direct
        .batch_execute("insert into orders (customer_id, v) values (777, 'misplaced')")
        .await
        .expect("a row behind Herd's back");
    let out = c.herd(&["shards", "verify"]);
    assert!(!out.status.success(), "verify must fail");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("1 NOT on the group") && text.contains("777"),
        "{text}"
    );
    direct
        .batch_execute("delete from orders where customer_id = 777")
        .await
        .expect("cleaning up");

    // The map survives a restart of everything.
    drop(client);
    c.herd_ok(&["down"]);
    c.up(&[]);
    let client = connect(&c.url(&[])).await;
    still_distributed(&client).await;
    // … and a kill -9 of Herd itself (the servers keep running; `herd up` adopts them and a
    // new proxy reads the map from the groups).
    drop(client);
    let supervisor = c.status()["supervisor"]["pid"]
        .as_i64()
        .expect("supervisor pid") as i32;
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(supervisor),
        nix::sys::signal::Signal::SIGKILL,
    )
    .expect("kill -9 herd");
    common::eventually(
        Duration::from_secs(10),
        "the supervisor to be gone",
        || async { c.status()["supervisor"].is_null() },
    )
    .await;
    c.up(&[]);
    let client = connect(&c.url(&[])).await;
    still_distributed(&client).await;

    // CREATE INDEX CONCURRENTLY runs on each group in turn; one that fails on a group is
    // dropped from every group.
    client
        .batch_execute("create index concurrently orders_note on orders (note)")
        .await
        .expect("concurrent index everywhere");
    client
        .batch_execute(
            "insert into orders (customer_id, v, note) values (5, 'again', 'same'); \
             insert into orders (customer_id, v, note) values (5, 'third', 'same')",
        )
        .await
        .expect("duplicates on one group");
    let e = client
        .batch_execute(
            "create unique index concurrently orders_unique_note on orders (customer_id, note)",
        )
        .await
        .expect_err("duplicates on one group");
    assert_eq!(e.code(), Some(&SqlState::UNIQUE_VIOLATION), "{e}");
    for g in 0..2u32 {
        let direct = connect(&c.url(&["--group", &g.to_string(), "--primary"])).await;
        let row = direct
            .query_one(
                "select (select count(*) from pg_index i join pg_class c on c.oid = i.indexrelid \
                         where c.relname = 'orders_note' and i.indisvalid), \
                        (select count(*) from pg_class where relname = 'orders_unique_note')",
                &[],
            )
            .await
            .expect("indexes");
        assert_eq!(
            (row.get::<_, i64>(0), row.get::<_, i64>(1)),
            (1, 0),
            "group {g}"
        );
    }

    // DROP INDEX of a distributed table's indexes reaches every group (looked up by name),
    // also CONCURRENTLY (group by group).
    client
        .batch_execute("drop index orders_note")
        .await
        .expect("drop index everywhere");
    client
        .batch_execute("drop index concurrently orders_v")
        .await
        .expect("drop index concurrently everywhere");
    for g in 0..2u32 {
        let direct = connect(&c.url(&["--group", &g.to_string(), "--primary"])).await;
        let row = direct
            .query_one(
                "select count(*) from pg_class where relname in ('orders_note', 'orders_v')",
                &[],
            )
            .await
            .expect("catalog");
        assert_eq!(row.get::<_, i64>(0), 0, "group {g}");
    }

    // DROP TABLE of a distributed table drops it everywhere and takes it out of the map: a
    // new table of the same name is an ordinary one on group 0.
    client
        .batch_execute("drop table orders")
        .await
        .expect("drop everywhere");
    for g in 0..2u32 {
        let direct = connect(&c.url(&["--group", &g.to_string(), "--primary"])).await;
        let row = direct
            .query_one("select to_regclass('orders') is null", &[])
            .await
            .expect("catalog");
        assert!(row.get::<_, bool>(0), "orders still on group {g}");
    }
    let listed = client
        .query(
            "select table_name from herd.tables where table_name = 'public.orders'",
            &[],
        )
        .await
        .expect("herd.tables");
    assert!(listed.is_empty(), "orders still in the map");
    client
        .batch_execute("create table orders (i int); insert into orders values (1)")
        .await
        .expect("a new local table");
    let n = client
        .query_one("select count(*) from orders", &[])
        .await
        .expect("no key needed");
    assert_eq!(n.get::<_, i64>(0), 1);
}

/// `orders` is still distributed after a restart: read by key, counted over every group, and
/// what cannot be combined across groups refused (a table on one server would answer it).
async fn still_distributed(client: &tokio_postgres::Client) {
    let row = client
        .query_one("select v from orders where customer_id = $1", &[&57i64])
        .await
        .expect("read by key after a restart");
    assert_eq!(row.get::<_, String>(0), "v57");
    let n = client
        .query_one("select count(*) from orders", &[])
        .await
        .expect("counted over every group");
    assert!(n.get::<_, i64>(0) >= 60);
    let e = client
        .simple_query("update orders set customer_id = 1 where customer_id = 2")
        .await
        .expect_err("still distributed");
    assert_eq!(e.code(), Some(&SqlState::FEATURE_NOT_SUPPORTED));
}
