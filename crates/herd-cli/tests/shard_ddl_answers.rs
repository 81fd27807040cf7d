//! Issue #38 on a 2-group cluster: DDL and collations never give an answer one PostgreSQL
//! server would not. Uniqueness that leaves out the shard key is refused (at distribution and
//! at later DDL) where one server would raise 23505; column collations (a user-created,
//! case-insensitive ICU one) reach every group, a nondeterministic shard key is refused,
//! GROUP BY / DISTINCT / count(DISTINCT) across groups answer under the column's collation and
//! what the proxy cannot (min/max, ORDER BY) is refused; an ICU database default counts as
//! non-byte order; CREATE/ALTER/DROP DATABASE reach every group, and a group added later gets
//! the collations and ICU databases; VACUUM, ANALYZE and RENAME COLUMN run on every group;
//! other DDL is refused naming the construct. "One server" is group 0's primary, reached
//! directly, holding a plain copy of the same rows.

mod common;

use std::time::Duration;

use common::{cluster, connect, refused, run_all};
use herd_testkit::TestCluster;
use tokio_postgres::error::SqlState;
use tokio_postgres::{Client, SimpleQueryMessage};

/// The bound on each test's own work (a cluster start comes on top).
const LIMIT: Duration = Duration::from_secs(240);

/// `url` with its database replaced by `db`.
fn with_db(url: &str, db: &str) -> String {
    let (head, query) = url.split_once('?').unwrap_or((url, ""));
    let base = head.rsplit_once('/').map_or(head, |(b, _)| b);
    format!("{base}/{db}?{query}")
}

/// The text of every row's first column of a simple query.
async fn column(client: &Client, sql: &str) -> Vec<Option<String>> {
    client
        .simple_query(sql)
        .await
        .unwrap_or_else(|e| panic!("{sql}: {e}"))
        .iter()
        .filter_map(|m| match m {
            SimpleQueryMessage::Row(r) => Some(r.get(0).map(str::to_string)),
            _ => None,
        })
        .collect()
}

/// Group `g`'s primary, on database `db`.
async fn group(c: &TestCluster, g: u32, db: &str) -> Client {
    connect(&with_db(
        &c.url(&["--group", &g.to_string(), "--primary"]),
        db,
    ))
    .await
}

/// Whether group `g` has database `db`.
async fn has_database(c: &TestCluster, g: u32, db: &str) -> bool {
    group(c, g, "postgres")
        .await
        .query_one(
            "select count(*) from pg_database where datname = $1",
            &[&db],
        )
        .await
        .expect("pg_database")
        .get::<_, i64>(0)
        == 1
}

/// A key of group 0 and one of group 1 for `table` (whose key column is `k`), found by
/// inserting each candidate through the endpoint and looking for it on group 1.
async fn keys_on_both_groups(c: &TestCluster, endpoint: &Client, table: &str) -> (i64, i64) {
    let g1 = group(c, 1, "postgres").await;
    let (mut on_0, mut on_1) = (None, None);
    for k in 1..200i64 {
        endpoint
            .batch_execute(&format!("insert into {table} (k) values ({k})"))
            .await
            .expect("probe insert");
        let there = g1
            .query_one(&format!("select count(*) from {table} where k = {k}"), &[])
            .await
            .expect("probe read")
            .get::<_, i64>(0);
        endpoint
            .batch_execute(&format!("delete from {table} where k = {k}"))
            .await
            .expect("probe delete");
        if there == 1 {
            on_1 = on_1.or(Some(k));
        } else {
            on_0 = on_0.or(Some(k));
        }
        if let (Some(a), Some(b)) = (on_0, on_1) {
            return (a, b);
        }
    }
    panic!("no keys of both groups below 200");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn uniqueness_collations_and_ddl_across_groups() {
    let c = cluster();
    c.up(&["--shards", "2", "--replicas", "0"]);
    tokio::time::timeout(LIMIT, async {
        let endpoint = connect(&c.url(&[])).await;
        let one_server = group(&c, 0, "postgres").await;
        uniqueness(&c, &endpoint, &one_server).await;
        collations(&c, &endpoint, &one_server).await;
        other_ddl(&c, &endpoint).await;
    })
    .await
    .expect("the checks finish in time");
}

/// Class 8: the same e-mail under keys of two groups.
async fn uniqueness(c: &TestCluster, endpoint: &Client, one_server: &Client) {
    // One server: the second row is a 23505.
    run_all(
        one_server,
        &[
            "create table plain_users (k bigint primary key, email text unique)",
            "insert into plain_users values (1, 'a@x')",
        ],
    )
    .await;
    let e = one_server
        .batch_execute("insert into plain_users values (2, 'a@x')")
        .await
        .expect_err("one server refuses the duplicate");
    assert_eq!(e.code(), Some(&SqlState::UNIQUE_VIOLATION));

    // Through the endpoint: refused when distributed, naming the constraint and the way out.
    run_all(
        endpoint,
        &["create table users (k bigint primary key, email text unique)"],
    )
    .await;
    refused(
        endpoint,
        "select herd.create_distributed_table('users', 'email')",
        "PRIMARY KEY users_pkey on distributed table public.users does not include its shard key email",
    )
    .await;
    refused(
        endpoint,
        "select herd.create_distributed_table('users', 'k')",
        "UNIQUE users_email_key on distributed table public.users does not include its shard key k",
    )
    .await;
    refused(
        endpoint,
        "select herd.create_distributed_table('users', 'k')",
        "herd.create_reference_table('public.users')",
    )
    .await;
    // A reference table holds every row on every group: its uniqueness is one server's.
    endpoint
        .simple_query("select herd.create_reference_table('users')")
        .await
        .expect("a reference table may have any uniqueness");
    endpoint
        .batch_execute("insert into users values (1, 'a@x')")
        .await
        .expect("first row");
    let e = endpoint
        .batch_execute("insert into users values (2, 'a@x')")
        .await
        .expect_err("the duplicate, as on one server");
    assert_eq!(e.code(), Some(&SqlState::UNIQUE_VIOLATION), "{e}");

    // Later DDL on a distributed table.
    run_all(
        endpoint,
        &[
            "create table members (k bigint not null, email text, note text)",
            "select herd.create_distributed_table('members', 'k')",
        ],
    )
    .await;
    for (sql, needle) in [
        (
            "create unique index members_email on members (email)",
            "CREATE UNIQUE INDEX members_email",
        ),
        (
            "create unique index concurrently members_email on members (lower(email), note)",
            "CREATE UNIQUE INDEX members_email",
        ),
        (
            "alter table members add unique (email)",
            "UNIQUE on distributed table members",
        ),
        (
            "alter table members add constraint m_pk primary key (email)",
            "PRIMARY KEY m_pk",
        ),
        (
            "alter table members add column code text unique",
            "does not include its shard key k",
        ),
    ] {
        refused(endpoint, sql, needle).await;
    }
    run_all(
        endpoint,
        &["alter table members add constraint m_unique unique (k, email)"],
    )
    .await;
    let (a, b) = keys_on_both_groups(c, endpoint, "members").await;
    endpoint
        .batch_execute(&format!(
            "insert into members (k, email) values ({a}, 'a@x'), ({b}, 'a@x')"
        ))
        .await
        .expect("the same e-mail under two keys: (k, email) differs, as on one server");
    let e = endpoint
        .batch_execute(&format!(
            "insert into members (k, email) values ({b}, 'a@x')"
        ))
        .await
        .expect_err("(k, email) twice");
    assert_eq!(e.code(), Some(&SqlState::UNIQUE_VIOLATION), "{e}");
    // An exclusion constraint on the key reaches every group with the table.
    run_all(
        endpoint,
        &[
            "create table slots (k bigint, at int, exclude using btree (k with =))",
            "select herd.create_distributed_table('slots', 'k')",
        ],
    )
    .await;
    for key in [a, b] {
        endpoint
            .batch_execute(&format!("insert into slots (k, at) values ({key}, 1)"))
            .await
            .expect("first slot");
        let e = endpoint
            .batch_execute(&format!("insert into slots (k, at) values ({key}, 2)"))
            .await
            .expect_err("the key again");
        assert_eq!(
            e.code(),
            Some(&SqlState::EXCLUSION_VIOLATION),
            "key {key}: {e}"
        );
    }
    // No group kept a refused index.
    for g in 0..2 {
        let n = group(c, g, "postgres")
            .await
            .query_one(
                "select count(*) from pg_index where indrelid = 'members'::regclass",
                &[],
            )
            .await
            .expect("indexes")
            .get::<_, i64>(0);
        assert_eq!(n, 1, "group {g}: only m_unique");
    }
}

/// Classes 4 and 5: a case-insensitive collation, and an ICU database default.
async fn collations(c: &TestCluster, endpoint: &Client, one_server: &Client) {
    run_all(
        endpoint,
        &["create collation ci (provider = icu, locale = 'und-u-ks-level2', deterministic = false)",
          "create table people (k bigint, name text collate ci)",
          "create table tags (name text collate ci primary key)"],
    )
    .await;
    refused(
        endpoint,
        "select herd.create_distributed_table('tags', 'name')",
        "nondeterministic collation ci",
    )
    .await;
    endpoint
        .simple_query("select herd.create_distributed_table('people', 'k')")
        .await
        .expect("distributed by a bigint");
    // The collation (created on group 0 only) and the column's use of it reached group 1.
    let on_1 = group(c, 1, "postgres").await;
    let coll = on_1
        .query_one(
            "select c.collname::text, c.collisdeterministic from pg_attribute a \
             join pg_collation c on c.oid = a.attcollation \
             where a.attrelid = 'people'::regclass and a.attname = 'name'",
            &[],
        )
        .await
        .expect("group 1's column");
    assert_eq!(
        (coll.get::<_, String>(0), coll.get::<_, bool>(1)),
        ("ci".to_string(), false)
    );
    // A collation created once tables are distributed reaches every group, so a column of a
    // distributed table can use it (ALTER TABLE runs on every group).
    run_all(
        endpoint,
        &["create collation ci2 (provider = icu, locale = 'und-u-ks-level1', deterministic = false)",
          "alter table people add column nick text collate ci2"],
    )
    .await;
    let nick = on_1
        .query_one(
            "select c.collname::text from pg_attribute a join pg_collation c on c.oid = a.attcollation \
             where a.attrelid = 'people'::regclass and a.attname = 'nick'",
            &[],
        )
        .await
        .expect("group 1's nick");
    assert_eq!(nick.get::<_, String>(0), "ci2");
    run_all(
        one_server,
        &["create table plain_people (k bigint, name text collate ci)"],
    )
    .await;
    let (a, b) = keys_on_both_groups(c, endpoint, "people").await;
    let rows = format!("({a}, 'Alice'), ({b}, 'ALICE'), ({}, 'bob')", b + 1000);
    endpoint
        .batch_execute(&format!("insert into people (k, name) values {rows}"))
        .await
        .expect("rows");
    one_server
        .batch_execute(&format!("insert into plain_people (k, name) values {rows}"))
        .await
        .expect("plain rows");
    // Equality under the column's collation on every group: one server's count.
    let count = |t: &str| format!("select count(*) from {t} where name = 'alice'");
    assert_eq!(
        column(endpoint, &count("people")).await,
        column(one_server, &count("plain_people")).await
    );
    assert_eq!(
        column(one_server, &count("plain_people")).await,
        vec![Some("2".into())]
    );
    // Grouped and distinct under the column's collation, as one server does ('Alice' on one
    // group and 'ALICE' on the other are one value).
    for sql in [
        "select count(distinct name) from people",
        "select count(*) from people group by name order by 1",
        "select count(*) from people where name = 'ALICE' group by name",
    ] {
        assert_eq!(
            column(endpoint, sql).await,
            column(one_server, &sql.replace("people", "plain_people")).await,
            "{sql}"
        );
    }
    assert_eq!(
        column(endpoint, "select count(distinct name) from people").await,
        vec![Some("2".into())]
    );
    // Which of equal values stands for them is PostgreSQL's choice on one server too.
    let lowered = |v: Vec<Option<String>>| {
        let mut v: Vec<String> = v.into_iter().flatten().map(|s| s.to_lowercase()).collect();
        v.sort();
        v
    };
    assert_eq!(
        lowered(column(endpoint, "select distinct name from people").await),
        lowered(column(one_server, "select distinct name from plain_people").await)
    );
    // What the proxy would compare by bytes, or combine without knowing the collation, is
    // refused.
    for (sql, needle) in [
        ("select min(name), max(name) from people", "collation ci"),
        (
            "select upper(name), count(*) from people group by 1",
            "collation ci",
        ),
        ("select name from people order by name", "ORDER BY on text"),
    ] {
        refused(endpoint, sql, needle).await;
    }

    // An ICU database default (created through the endpoint, so on every group): its text
    // does not sort in byte order ('a' < 'B' there, 'B' < 'a' in bytes).
    endpoint
        .batch_execute(
            "create database icu_words template template0 locale_provider icu icu_locale 'en' \
             lc_collate 'C' lc_ctype 'C.UTF-8'",
        )
        .await
        .expect("an ICU database");
    let words = connect(&with_db(&c.url(&[]), "icu_words")).await;
    run_all(
        &words,
        &[
            "create table w (k bigint, w text)",
            "select herd.create_distributed_table('w', 'k')",
            "insert into w (k, w) values (1, 'a'), (2, 'B'), (3, 'c'), (4, 'D'), (5, 'e'), (6, 'F')",
        ],
    )
    .await;
    let plain = group(c, 0, "icu_words").await;
    run_all(&plain, &["create table plain_w as select * from w"]).await;
    let sorted = column(&plain, "select w from plain_w order by w").await;
    assert_eq!(sorted.first(), Some(&Some("a".to_string())), "ICU order");
    // Before, the merge answered in byte order (B before a).
    refused(&words, "select w from w order by w", "ICU en").await;
    drop(words);
}

/// Class 10 and the DDL refusals.
async fn other_ddl(c: &TestCluster, endpoint: &Client) {
    // CREATE DATABASE reaches every group; a table is distributed there.
    run_all(endpoint, &["create database shop"]).await;
    for g in 0..2 {
        assert!(has_database(c, g, "shop").await, "group {g} has shop");
    }
    let shop = connect(&with_db(&c.url(&[]), "shop")).await;
    run_all(
        &shop,
        &[
            "create table orders (k bigint primary key, v text)",
            "select herd.create_distributed_table('orders', 'k')",
        ],
    )
    .await;
    let rows: Vec<String> = (1..=20).map(|k| format!("({k}, 'v')")).collect();
    shop.batch_execute(&format!(
        "insert into orders (k, v) values {}",
        rows.join(", ")
    ))
    .await
    .expect("rows of both groups");
    assert_eq!(
        column(&shop, "select count(*) from orders").await,
        vec![Some("20".into())]
    );
    // Twice: PostgreSQL's own error, and the database stays on every group.
    let e = endpoint
        .batch_execute("create database shop")
        .await
        .expect_err("twice");
    assert_eq!(e.code(), Some(&SqlState::DUPLICATE_DATABASE), "{e}");
    // Made on group 1 behind Herd's back: the CREATE fails there and is taken back on group 0.
    group(c, 1, "postgres")
        .await
        .batch_execute("create database half")
        .await
        .expect("half");
    let e = endpoint
        .batch_execute("create database half")
        .await
        .expect_err("exists on group 1");
    assert_eq!(e.code(), Some(&SqlState::DUPLICATE_DATABASE), "{e}");
    assert!(
        e.to_string().contains("shard group 1") || format!("{e:?}").contains("shard group 1"),
        "{e:?}"
    );
    assert!(!has_database(c, 0, "half").await, "taken back on group 0");
    // DROP while a session uses it on group 1: refused, and dropped on no group (group 0,
    // checked first, could have dropped its copy).
    drop(shop);
    let user = group(c, 1, "shop").await;
    let e = endpoint
        .batch_execute("drop database shop")
        .await
        .expect_err("in use");
    assert_eq!(e.code(), Some(&SqlState::OBJECT_IN_USE), "{e}");
    assert!(format!("{e:?}").contains("dropped on no group"), "{e:?}");
    for g in 0..2 {
        assert!(has_database(c, g, "shop").await, "group {g} still has shop");
    }
    drop(user);
    // Once that session has ended (and the proxy's own connections to shop closed).
    common::eventually(Duration::from_secs(15), "DROP DATABASE shop", || async {
        endpoint.batch_execute("drop database shop").await.is_ok()
    })
    .await;
    for g in 0..2 {
        assert!(!has_database(c, g, "shop").await, "group {g} dropped shop");
    }

    // ALTER DATABASE: the same settings and name on every group (all or none).
    run_all(
        endpoint,
        &[
            "create database store",
            "alter database store set datestyle = 'SQL, DMY'",
            "alter database store rename to store2",
        ],
    )
    .await;
    for g in 0..2 {
        let on = group(c, g, "postgres").await;
        let setting = on
            .query_one(
                "select array_to_string(s.setconfig, ',') from pg_db_role_setting s \
                 join pg_database d on d.oid = s.setdatabase where d.datname = 'store2'",
                &[],
            )
            .await
            .expect("store2's settings");
        assert_eq!(
            setting.get::<_, String>(0),
            "DateStyle=SQL, DMY",
            "group {g}"
        );
        assert!(!has_database(c, g, "store").await, "group {g}: renamed");
    }
    let e = endpoint
        .batch_execute("alter database store2 rename to half")
        .await
        .expect_err("half exists on group 1");
    assert_eq!(e.code(), Some(&SqlState::DUPLICATE_DATABASE), "{e}");
    assert!(has_database(c, 0, "store2").await, "group 0 kept the name");
    run_all(endpoint, &["drop database store2"]).await;

    // A database made on group 0 only (directly): its statements run there, as on one
    // server; distributing in it is refused naming the cause.
    group(c, 0, "postgres")
        .await
        .batch_execute("create database legacy")
        .await
        .expect("legacy on group 0");
    let legacy = connect(&with_db(&c.url(&[]), "legacy")).await;
    run_all(
        &legacy,
        &[
            "create table t (k bigint, v text)",
            "insert into t values (1, 'one')",
        ],
    )
    .await;
    assert_eq!(
        column(&legacy, "select v from t").await,
        vec![Some("one".into())]
    );
    refused(
        &legacy,
        "select herd.create_distributed_table('t', 'k')",
        "database legacy is missing on shard group(s) 1",
    )
    .await;
    drop(legacy);

    // RENAME COLUMN, VACUUM and ANALYZE on every group.
    run_all(
        endpoint,
        &[
            "alter table members rename column note to remark",
            "vacuum members",
            "analyze members",
        ],
    )
    .await;
    for g in 0..2 {
        let on = group(c, g, "postgres").await;
        let renamed = on
            .query_one(
                "select count(*) from pg_attribute where attrelid = 'members'::regclass and attname = 'remark'",
                &[],
            )
            .await
            .expect("renamed")
            .get::<_, i64>(0);
        assert_eq!(renamed, 1, "group {g}");
        common::eventually(Duration::from_secs(10), "vacuum and analyze statistics", || async {
            on.query_one(
                "select last_vacuum is not null and last_analyze is not null from pg_stat_user_tables where relname = 'members'",
                &[],
            )
            .await
            .is_ok_and(|r| r.get::<_, bool>(0))
        })
        .await;
    }
    // A view over a reference table only lives on group 0, which holds every row of it.
    run_all(
        endpoint,
        &["create view user_emails as select email from users"],
    )
    .await;
    assert_eq!(
        column(endpoint, "select email from user_emails").await,
        vec![Some("a@x".into())]
    );
    // A view over a distributed table is made on group 0 and read across groups (issue 40's
    // views slice, tested against one server in sharding_views.rs): every group's rows.
    run_all(
        endpoint,
        &["create view members_v as select k from members"],
    )
    .await;
    assert_eq!(
        column(endpoint, "select count(*) from members_v").await,
        column(endpoint, "select count(*) from members").await
    );
    // Refusals that name the construct and what to do. (`COPY (query) TO STDOUT` and cursors
    // over distributed reads are answered since issue 40's cursors slice: tested in
    // sharding_statements/copies.rs and cursors.rs.)
    for (sql, needle) in [
        (
            "alter table members rename column k to key",
            "renaming the shard key column",
        ),
        (
            "create table copy_of as select * from members",
            "CREATE TABLE … AS",
        ),
        // Alone in a simple query, SQL PREPARE is the proxy's (sharding_statements'
        // sql_prepare.rs); in a string of several statements it is still refused.
        (
            "prepare p as select * from members where k = $1; select 1",
            "SQL PREPARE",
        ),
        ("create policy p on members using (true)", "POLICY"),
        (
            "begin; declare c cursor for select * from members",
            "send it on its own",
        ),
    ] {
        refused(endpoint, sql, needle).await;
        let _ = endpoint.batch_execute("rollback").await;
    }
}

/// A group added later gets the user's collations with the tables that use them, and group
/// 0's databases with their ICU default.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_group_gets_collations_and_icu_databases() {
    let c = cluster();
    c.up(&["--shards", "2", "--replicas", "0"]);
    tokio::time::timeout(LIMIT, async {
        let endpoint = connect(&c.url(&[])).await;
        endpoint
            .batch_execute(
                "create database icu_words template template0 locale_provider icu \
                 icu_locale 'en' lc_collate 'C' lc_ctype 'C.UTF-8'",
            )
            .await
            .expect("an ICU database");
        let words = connect(&with_db(&c.url(&[]), "icu_words")).await;
        run_all(
            &words,
            &["create collation ci (provider = icu, locale = 'und-u-ks-level2', deterministic = false)",
              "create table people (k bigint, name text collate ci)",
              "select herd.create_distributed_table('people', 'k')"],
        )
        .await;
        drop(words);
        tokio::task::block_in_place(|| c.herd_ok(&["group", "add"]));
        let added = group(&c, 2, "icu_words").await;
        let row = added
            .query_one(
                "select d.datlocprovider::text, d.daticulocale, c.collname::text, c.collisdeterministic \
                 from pg_database d, pg_attribute a join pg_collation c on c.oid = a.attcollation \
                 where d.datname = current_database() \
                   and a.attrelid = 'people'::regclass and a.attname = 'name'",
                &[],
            )
            .await
            .expect("the new group's database and column");
        assert_eq!(
            (
                row.get::<_, String>(0),
                row.get::<_, Option<String>>(1),
                row.get::<_, String>(2),
                row.get::<_, bool>(3)
            ),
            ("i".to_string(), Some("en".to_string()), "ci".to_string(), false)
        );
    })
    .await
    .expect("the checks finish in time");
}
