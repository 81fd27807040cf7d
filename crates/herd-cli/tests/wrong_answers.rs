//! Issue 38's classes of wrong answers across shard groups, on a real 2-group cluster: each
//! statement either answers as one PostgreSQL server would (checked against the rows the test
//! loaded, which it knows) or is refused with 0A000 and a message naming the real cause.
//! Covered here: data-modifying WITH, LIMIT/OFFSET parameters of every integer type (binary
//! and text), reference tables on an outer join's preserved side (answered on the general
//! path since issue #40), function bodies and views
//! that read distributed tables, names through the session's search_path (SET, SET LOCAL,
//! startup options, set_config), keys compared through a conversion, and Herd's functions
//! called with bound parameters.

mod common;

use std::time::Duration;

use common::{cluster, connect, refused};
use tokio_postgres::types::Type;
use tokio_postgres::Client;

/// Every test here finishes well within this, or fails.
const BOUND: Duration = Duration::from_secs(300);

/// `customers` (id 1..=40, region 1 + id % 3) and `orders` (one per customer, amount
/// id % 4) distributed on their keys, `regions` (1..=4, region 4 without customers) a
/// reference table, and `s2.customers`, a plain table of one row.
async fn schema(client: &Client) {
    client
        .batch_execute(
            "create table customers (id bigint primary key, name text, region int);
             create table orders (id bigint, customer_id bigint, amount int,
                                  primary key (customer_id, id));
             create table regions (id int primary key, name text);
             create schema s2;
             create table s2.customers (id bigint, name text, region int);
             insert into s2.customers values (1000, 'other', 1);",
        )
        .await
        .expect("tables");
    for call in [
        "select herd.create_distributed_table('customers', 'id')",
        "select herd.create_distributed_table('orders', 'customer_id')",
        "select herd.create_reference_table('regions')",
    ] {
        client.simple_query(call).await.expect(call);
    }
    client
        .batch_execute(
            "insert into regions (id, name) values (1, 'n'), (2, 's'), (3, 'e'), (4, 'w')",
        )
        .await
        .expect("regions");
    for id in 1..=40i64 {
        client
            .execute(
                "insert into customers (id, name, region) values ($1, $2, $3)",
                &[&id, &format!("c{id}"), &(1 + (id % 3) as i32)],
            )
            .await
            .expect("customer");
        client
            .execute(
                "insert into orders (id, customer_id, amount) values ($1, $1, $2)",
                &[&id, &((id % 4) as i32)],
            )
            .await
            .expect("order");
    }
}

async fn count(client: &Client, sql: &str) -> i64 {
    client.query_one(sql, &[]).await.expect(sql).get(0)
}

/// A 2-group cluster without replicas, its endpoint's URL.
fn two_groups() -> (herd_testkit::TestCluster, String) {
    let c = cluster();
    c.up(&["--shards", "2", "--replicas", "0"]);
    let url = c.url(&[]);
    (c, url)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wrong_answers_are_refused_or_right() {
    let (_c, url) = two_groups();
    tokio::time::timeout(BOUND, async {
        let client = connect(&url).await;
        schema(&client).await;
        data_modifying_with(&client).await;
        limit_parameters(&client).await;
        outer_joins(&client).await;
        functions_and_views(&client).await;
        search_path(&client, &url).await;
        conversions(&client).await;
        herd_calls_with_parameters(&client).await;
        refusal_fails_its_transaction(&client).await;
        portals_across_groups(&url).await;
    })
    .await
    .expect("within the bound");
}

async fn data_modifying_with(client: &Client) {
    for sql in [
        // Without a key (every group), and a reference table written. (By key, on one
        // group, it runs there: `sharding_statements/writes.rs` compares it with one server.)
        "with d as (delete from orders where amount = 0 returning *) select count(*) from d",
        "with u as (update regions set name = 'x' returning *) select count(*) from u",
    ] {
        refused(client, sql, "data-modifying WITH").await;
    }
    // Nothing changed anywhere.
    assert_eq!(count(client, "select count(*) from orders").await, 40);
    assert_eq!(
        count(client, "select count(*) from orders where amount = 0").await,
        10
    );
    assert_eq!(
        count(client, "select count(*) from regions where name = 'x'").await,
        0
    );
}

async fn limit_parameters(client: &Client) {
    let sql = "select id from customers order by id desc limit $1";
    // Binary parameters of each integer width, as drivers send small ints.
    let rows = client
        .query_typed(sql, &[(&4i16, Type::INT2)])
        .await
        .expect("int2");
    assert_eq!(rows.len(), 4);
    assert_eq!(rows[0].get::<_, i64>(0), 40);
    let rows = client
        .query_typed(sql, &[(&3i32, Type::INT4)])
        .await
        .expect("int4");
    assert_eq!(rows.len(), 3);
    let rows = client.query(sql, &[&2i64]).await.expect("int8");
    assert_eq!(rows.len(), 2);
    // Left for the server to type (binary int8).
    let rows = client
        .query_typed(sql, &[(&5i64, Type::INT8)])
        .await
        .expect("int8 typed");
    assert_eq!(rows.len(), 5);
    // An OFFSET parameter whose type the server infers (no declared types).
    let rows = client
        .query("select id from customers order by id offset $1", &[&37i64])
        .await
        .expect("offset, server-typed");
    assert_eq!(rows.len(), 3);
    // OFFSET, and a numeric limit (text format, as the simple protocol has it).
    let rows = client
        .query_typed(
            "select id from customers order by id offset $1",
            &[(&35i16, Type::INT2)],
        )
        .await
        .expect("offset int2");
    assert_eq!(
        rows.iter().map(|r| r.get::<_, i64>(0)).collect::<Vec<_>>(),
        vec![36, 37, 38, 39, 40]
    );
    let rows = client
        .simple_query("select id from customers order by id limit 2.5")
        .await;
    // PostgreSQL rounds 2.5 to 3; Herd either does the same or refuses.
    match rows {
        Ok(msgs) => {
            let n = msgs
                .iter()
                .filter(|m| matches!(m, tokio_postgres::SimpleQueryMessage::Row(_)))
                .count();
            assert_eq!(n, 3, "limit 2.5");
        }
        Err(e) => assert_eq!(
            e.code(),
            Some(&tokio_postgres::error::SqlState::FEATURE_NOT_SUPPORTED),
            "{e}"
        ),
    }
}

async fn outer_joins(client: &Client) {
    // No fast path answers these (every group would add the reference side's unmatched rows):
    // the general path does, on group 0 (issue #40). Every customer once, region 4 once
    // unmatched; three rows of the series.
    for (sql, rows) in [
        (
            "select r.id, c.id from regions r left join customers c on c.region = r.id",
            41,
        ),
        (
            "select r.id, c.id from customers c right join regions r on c.region = r.id",
            41,
        ),
        (
            "select r.id, c.id from customers c full join regions r on c.region = r.id",
            41,
        ),
        (
            "select g, c.id from generate_series(1, 3) g left join customers c on c.id = g",
            3,
        ),
    ] {
        let got = client.query(sql, &[]).await.expect(sql);
        assert_eq!(got.len(), rows, "{sql}");
    }
    // A write with such a join keeps its refusal (the general path is read-only).
    refused(
        client,
        "update customers set name = name where id in \
         (select c.id from regions r left join customers c on c.region = r.id)",
        "customers",
    )
    .await;
    // The distributed table on the preserved side: every customer once.
    assert_eq!(
        count(
            client,
            "select count(*) from customers c left join regions r on c.region = r.id"
        )
        .await,
        40
    );
    // Filtered by key to one group: region 4's unmatched row is not there (WHERE drops it).
    assert_eq!(
        count(
            client,
            "select count(*) from regions r left join customers c on c.region = r.id \
             where c.id = 5"
        )
        .await,
        1
    );
}

async fn functions_and_views(client: &Client) {
    // Each alone: a function is created on every group (DDL on every group comes alone).
    for f in [
        "create function f_count() returns bigint language sql \
           as 'select count(*) from customers'",
        "create function f_name(k bigint) returns text language plpgsql as $$
           begin return (select name from customers where id = k); end $$",
        "create function f_regions() returns bigint language plpgsql as $$
           begin return (select count(*) from regions); end $$",
        "create function f_dynamic() returns bigint language plpgsql as $$
           declare n bigint; begin
             execute 'select count(*) from ' || 'regions' into n; return n; end $$",
        "create function plus1(bigint) returns bigint language sql immutable \
           as 'select $1 + 1'",
        // Its body names a table of group 0 only: created everywhere all the same.
        "create function f_local() returns bigint language sql \
           as 'select count(*) from s2.customers'",
    ] {
        client.batch_execute(f).await.expect(f);
    }
    // A function that reads no table, in a read across groups: every group has it.
    assert_eq!(
        count(
            client,
            "select count(*) from customers c where plus1(c.id) > 35"
        )
        .await,
        6
    );
    // One that reads a group-0 table runs on group 0.
    assert_eq!(count(client, "select f_local()").await, 1);
    refused(
        client,
        "select f_count()",
        "function f_count reads distributed table public.customers",
    )
    .await;
    refused(
        client,
        "select f_name(3)",
        "function f_name reads distributed",
    )
    .await;
    refused(client, "select f_dynamic()", "dynamic SQL").await;
    // A function that reads only a reference table answers as one server.
    assert_eq!(count(client, "select f_regions()").await, 4);
}

async fn search_path(client: &Client, url: &str) {
    // Default path: public.customers, across both groups.
    assert_eq!(count(client, "select count(*) from customers").await, 40);
    client
        .batch_execute("set search_path = s2, public")
        .await
        .expect("set");
    assert_eq!(
        count(client, "select count(*) from customers").await,
        1,
        "s2.customers under search_path s2, public"
    );
    assert_eq!(
        count(client, "select count(*) from public.customers").await,
        40
    );
    client
        .batch_execute("reset search_path")
        .await
        .expect("reset");
    // SET LOCAL lasts for its transaction.
    client
        .batch_execute("begin; set local search_path = s2, public")
        .await
        .expect("set local");
    assert_eq!(count(client, "select count(*) from customers").await, 1);
    client.batch_execute("commit").await.expect("commit");
    assert_eq!(count(client, "select count(*) from customers").await, 40);
    // A startup option, as libpq's PGOPTIONS sends it.
    let with_option = format!("{url}?options=-c%20search_path%3Ds2%2Cpublic");
    let other = connect(&with_option).await;
    assert_eq!(count(&other, "select count(*) from customers").await, 1);
    // set_config: Herd does not follow it and says so.
    other
        .simple_query("select set_config('search_path', 'public', false)")
        .await
        .expect("set_config");
    refused(
        &other,
        "select count(*) from customers",
        "search_path was changed with set_config()",
    )
    .await;
    // (set_config pins the session to its server, on group 0: a qualified name still
    // answers.)
    assert_eq!(count(&other, "select count(*) from s2.customers").await, 1);
}

async fn conversions(client: &Client) {
    client
        .batch_execute("create table tk (k text primary key, v int)")
        .await
        .expect("tk");
    client
        .simple_query("select herd.create_distributed_table('tk', 'k')")
        .await
        .expect("distribute tk");
    for k in ["a", "b", "c", "d", "e", "f", "g", "h"] {
        client
            .execute("insert into tk (k, v) values ($1, 1)", &[&k])
            .await
            .expect("tk row");
    }
    refused(
        client,
        "select * from tk where k = 'a  '::char(12)",
        "converted to bpchar",
    )
    .await;
    // A parameter the client declares as char(n) is not read as a text key either.
    let e = client
        .query_typed("select v from tk where k = $1", &[(&"a  ", Type::BPCHAR)])
        .await
        .expect_err("bpchar parameter");
    assert_eq!(
        e.code(),
        Some(&tokio_postgres::error::SqlState::FEATURE_NOT_SUPPORTED),
        "{e}"
    );
    // The key's own type (or a width of integer) still routes by key.
    assert_eq!(
        count(client, "select count(*) from tk where k = 'a'::text").await,
        1
    );
    assert_eq!(
        count(
            client,
            "select count(*) from customers where id = '7'::int4"
        )
        .await,
        1
    );
}

async fn herd_calls_with_parameters(client: &Client) {
    client
        .batch_execute(
            "create table p1 (id bigint primary key); create table p2 (id bigint primary key)",
        )
        .await
        .expect("p tables");
    // Binary text parameters (tokio-postgres prepares, then binds).
    let row = client
        .query_one(
            "select herd.create_distributed_table($1, $2)",
            &[&"p1", &"id"],
        )
        .await
        .expect("bound parameters");
    assert!(row.get::<_, String>(0).contains("distributed by id"));
    // Declared text, and a literal mixed in.
    let row = client
        .query_typed(
            "select herd.create_distributed_table($1, 'id')",
            &[(&"p2", Type::TEXT)],
        )
        .await
        .expect("typed parameter");
    assert!(row[0].get::<_, String>(0).contains("public.p2"));
    let kinds = client
        .query(
            "select table_name from herd.tables where table_name in ('public.p1', 'public.p2')",
            &[],
        )
        .await
        .expect("herd.tables");
    assert_eq!(kinds.len(), 2);
    // Errors come back as PostgreSQL's would.
    let e = client
        .query_one(
            "select herd.create_distributed_table($1, $2)",
            &[&"p1", &"id"],
        )
        .await
        .expect_err("twice");
    assert_eq!(e.code().map(|c| c.code()), Some("42P07"), "{e}");
}

/// Triggers run on each group that runs the write: one that reads or writes a shared table
/// (a reference table's copy, a distributed table's rows) would come out per group.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn writes_with_triggers_on_shared_tables() {
    let (c, url) = two_groups();
    tokio::time::timeout(BOUND, async {
        let client = connect(&url).await;
        schema(&client).await;
        // Triggers on distributed tables are refused through the endpoint: made on each
        // group's primary directly, as a user could, with their functions.
        let on_each_group = |sql: &'static str| {
            let urls = [
                c.url(&["--primary", "--group", "0"]),
                c.url(&["--primary", "--group", "1"]),
            ];
            async move {
                for u in urls {
                    connect(&u).await.batch_execute(sql).await.expect(sql);
                }
            }
        };
        on_each_group(
            "create function bump() returns trigger language plpgsql as $$
               begin update regions set name = name || '+'; return new; end $$;
             create function stamp() returns trigger language plpgsql as $$
               begin new.name := upper(new.name); return new; end $$;
             create trigger t_stamp before insert on customers
               for each row execute function stamp();",
        )
        .await;
        // The names are read again within a few seconds of DDL made outside the endpoint.
        tokio::time::sleep(Duration::from_secs(4)).await;
        // A trigger that touches only its own row still runs.
        client
            .execute(
                "insert into customers (id, name, region) values (41, 'x', 1)",
                &[],
            )
            .await
            .expect("stamped insert");
        let name: String = client
            .query_one("select name from customers where id = 41", &[])
            .await
            .expect("read")
            .get(0);
        assert_eq!(name, "X");
        on_each_group(
            "create trigger t_bump after insert on customers \
             for each row execute function bump()",
        )
        .await;
        tokio::time::sleep(Duration::from_secs(4)).await;
        refused(
            &client,
            "insert into customers (id, name, region) values (42, 'y', 1)",
            "a trigger calling public.bump, which reads or writes",
        )
        .await;
        assert_eq!(
            count(&client, "select count(*) from customers where id = 42").await,
            0
        );
    })
    .await
    .expect("within the bound");
}

/// A statement refused before the transaction reached any server fails the transaction, as
/// any error fails a PostgreSQL transaction: later statements get 25P02, COMMIT rolls back.
async fn refusal_fails_its_transaction(client: &Client) {
    client.batch_execute("begin").await.expect("begin");
    let e = client
        .simple_query(
            "update customers set name = name where id in \
             (select c.id from regions r left join customers c on c.region = r.id)",
        )
        .await
        .expect_err("refused");
    assert_eq!(
        e.code(),
        Some(&tokio_postgres::error::SqlState::FEATURE_NOT_SUPPORTED)
    );
    let e = client
        .simple_query("update customers set name = 'lost' where id = 9")
        .await
        .expect_err("aborted");
    assert_eq!(e.code().map(|c| c.code()), Some("25P02"), "{e}");
    let answer = client
        .simple_query("commit")
        .await
        .expect("commit answered");
    assert!(
        answer
            .iter()
            .any(|m| matches!(m, tokio_postgres::SimpleQueryMessage::CommandComplete(_))),
        "{answer:?}"
    );
    assert_eq!(
        count(client, "select count(*) from customers where name = 'lost'").await,
        0
    );
    // The session goes on as usual.
    assert_eq!(count(client, "select count(*) from customers").await, 40);
}

/// A portal of a read across groups bound in one round trip and executed in another is
/// refused as a fetch in parts (0A000), never left to fail as a missing portal.
async fn portals_across_groups(url: &str) {
    let mut client = connect(url).await;
    let tx = client.transaction().await.expect("transaction");
    let stmt = tx
        .prepare("select id from customers where id = 15 or id = 16")
        .await
        .expect("prepare");
    let e = match tx.bind(&stmt, &[]).await {
        Err(e) => e,
        Ok(portal) => tx.query_portal(&portal, 3).await.expect_err("refused"),
    };
    assert_eq!(
        e.code(),
        Some(&tokio_postgres::error::SqlState::FEATURE_NOT_SUPPORTED),
        "{e}"
    );
    // Dropped without waiting: tokio-postgres sends ROLLBACK and the next query at once. The
    // query is planned once the transaction is over, and answered as one server would.
    drop(tx);
    assert_eq!(count(&client, "select count(*) from customers").await, 40);
    assert_eq!(
        count(&client, "select count(*) from orders where amount >= 0").await,
        40
    );
}
