//! SELECTs across shard groups (Sharding II, fan-out reads), checked differentially: every
//! query runs through the endpoint on a distributed table and on a plain copy of the same rows
//! that lives on one PostgreSQL server (group 0), and the answers must be equal — the same rows
//! in the same order where the query orders them, in the simple protocol (text) and the
//! extended one (binary results, parameters). The data has NULLs, ties, NaN and infinities,
//! numeric signs and scales, BC dates, time zones and non-ASCII text. What the merge cannot
//! answer is refused with 0A000 naming the construct.

mod common;

use common::{cluster, connect};
use std::time::Duration;
use tokio_postgres::error::SqlState;
use tokio_postgres::SimpleQueryMessage;

const COLUMNS: &str = "(id bigint primary key, grp int, name text, balance numeric(12,2), \
     score float8, born date, seen timestamptz, flag bool, note varchar(20))";

/// The column list an INSERT into a distributed table names (its key among them).
const NAMES: &str = "(id, grp, name, balance, score, born, seen, flag, note)";

/// Row `i` of both tables, as SQL literals.
fn row(i: i64) -> String {
    let names = [
        "alpha", "Beta", "gamma", "Émile", "zeta", "_x", "a b", "ähnlich",
    ];
    let name = if i % 13 == 0 {
        "NULL".to_string()
    } else {
        format!("'{}{}'", names[(i % 8) as usize], i % 3)
    };
    let balance = match i % 11 {
        0 => "NULL".to_string(),
        5 => "0".to_string(),
        7 => "-0.01".to_string(),
        _ => format!("{:.2}", ((i * 7919) % 2001 - 1000) as f64 / 7.0),
    };
    let score = match i % 17 {
        0 => "NULL".to_string(),
        3 => "'NaN'".to_string(),
        4 => "'Infinity'".to_string(),
        5 => "'-Infinity'".to_string(),
        6 => "'-0'".to_string(),
        _ => format!("{}", ((i * 31) % 97) as f64 / 3.0 - 10.0),
    };
    let born = match i % 23 {
        0 => "NULL".to_string(),
        5 => "'0044-03-15 BC'".to_string(),
        9 => "'infinity'".to_string(),
        _ => format!("date '1990-01-01' + {}", (i * 53) % 20000),
    };
    let seen = match i % 19 {
        0 => "NULL".to_string(),
        1 => "'2024-03-10 12:00:00+05:30'".to_string(),
        _ => format!(
            "timestamptz '2024-01-01 00:00:00+00' + interval '{} seconds'",
            (i * 3571) % 900_000
        ),
    };
    let flag = match i % 10 {
        0 => "NULL",
        n if n % 3 == 0 => "true",
        _ => "false",
    };
    let note = if i % 4 == 0 {
        "NULL".to_string()
    } else {
        format!("'note{}'", i % 5)
    };
    format!(
        "({i}, {}, {name}, {balance}, {score}, {born}, {seen}, {flag}, {note})",
        i % 7
    )
}

/// Asserts that `sql` is refused with 0A000 and a message that contains `needle`.
async fn refused(client: &tokio_postgres::Client, sql: &str, needle: &str) {
    let e = client.simple_query(sql).await.expect_err(sql);
    assert_eq!(
        e.code(),
        Some(&SqlState::FEATURE_NOT_SUPPORTED),
        "{sql}: {e}"
    );
    let message = e
        .as_db_error()
        .map(|d| d.message().to_string())
        .unwrap_or_default();
    assert!(message.contains(needle), "{sql}: {message}");
}

/// Rows of a simple query as text.
async fn simple(client: &tokio_postgres::Client, sql: &str) -> Vec<Vec<Option<String>>> {
    client
        .simple_query(sql)
        .await
        .unwrap_or_else(|e| panic!("{sql}: {e:?}"))
        .into_iter()
        .filter_map(|m| match m {
            SimpleQueryMessage::Row(r) => {
                Some((0..r.len()).map(|i| r.get(i).map(str::to_string)).collect())
            }
            _ => None,
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn selects_across_groups_answer_as_one_server() {
    let c = cluster();
    c.up(&["--shards", "2", "--replicas", "0"]);
    let client = connect(&c.url(&[])).await;
    client
        .batch_execute(&format!(
            "create table acct {COLUMNS}; create table acct_one {COLUMNS}"
        ))
        .await
        .expect("tables");
    client
        .simple_query("select herd.create_distributed_table('acct', 'id')")
        .await
        .expect("distribute");
    let rows: Vec<String> = (1..=160).map(row).collect();
    client
        .batch_execute(&format!(
            "insert into acct_one {NAMES} values {}",
            rows.join(", ")
        ))
        .await
        .expect("the one-server copy");
    for r in &rows {
        client
            .batch_execute(&format!("insert into acct {NAMES} values {r}"))
            .await
            .unwrap_or_else(|e| panic!("{r}: {e:?}"));
    }
    // Both groups hold rows (else nothing is merged).
    for g in 0..2 {
        let direct = connect(&c.url(&["--group", &g.to_string(), "--primary"])).await;
        let n: i64 = direct
            .query_one("select count(*) from acct", &[])
            .await
            .expect("count")
            .get(0);
        assert!(n > 20, "group {g} holds {n} rows");
    }

    // (query, ordered): unordered answers are compared as multisets.
    let shapes: &[(&str, bool)] = &[
        ("select * from T", false),
        ("select id, name from T where balance > 0", false),
        ("select id, note from T where flag", false),
        ("select id from T where id in (1, 2, 3, 50, 77, 140)", false),
        ("select * from T where false", false),
        ("select id from T order by id", true),
        ("select id, name from T order by name, id", true),
        (
            "select id, name from T order by name desc nulls last, id desc",
            true,
        ),
        (
            "select id, balance from T order by balance desc nulls last, id limit 10",
            true,
        ),
        (
            "select id, balance from T order by balance nulls first, id limit 7 offset 5",
            true,
        ),
        ("select id, score from T order by score, id", true),
        ("select id, score from T order by score desc, id", true),
        ("select id, born from T order by born desc, id", true),
        ("select id, seen from T order by seen, id", true),
        (
            "select id, seen from T order by seen desc nulls last, id limit 33",
            true,
        ),
        ("select id, flag from T order by flag, id", true),
        (
            "select id, note from T order by note desc, id limit 20",
            true,
        ),
        ("select name from T order by id desc limit 5", true),
        (
            "select id, balance * 2 as b2 from T order by b2, id limit 15",
            true,
        ),
        ("select id, grp from T order by 2, 1", true),
        ("select id from T order by grp, id limit 30 offset 10", true),
        ("select id from T order by id offset 150", true),
        ("select id from T order by id limit 0", true),
        ("select id from T order by id limit all", true),
        (
            "select upper(name) as u, id from T order by u nulls first, id limit 25",
            true,
        ),
        (
            "select id, name from T where name like 'a%' order by name, id",
            true,
        ),
        ("select id from T where grp = 3 order by balance, id", true),
        (
            "select t.id, t.grp from T t order by t.grp desc, t.id",
            true,
        ),
        ("select id from T order by id for update", true),
        (
            "select id, name from T order by name collate \"C\", id",
            true,
        ),
    ];
    for (shape, ordered) in shapes {
        let over = |t: &str| shape.replace(" T", &format!(" {t}"));
        let mut got = simple(&client, &over("acct")).await;
        let mut want = simple(&client, &over("acct_one")).await;
        if !ordered {
            got.sort();
            want.sort();
        }
        assert!(!shape.contains("limit") || got.len() <= want.len());
        assert_eq!(got, want, "{shape}");
    }

    // The extended protocol: binary results (sort keys decoded from binary), parameters in
    // the WHERE clause and the LIMIT.
    let extended: &[(&str, &[&(dyn tokio_postgres::types::ToSql + Sync)])] = &[
        (
            "select id from T order by balance desc nulls first, id",
            &[],
        ),
        ("select id from T order by score, id", &[]),
        ("select id from T order by born, id", &[]),
        ("select id from T order by seen desc, id", &[]),
        ("select id from T order by name, id", &[]),
        ("select id from T order by flag desc, id", &[]),
        (
            "select id from T where grp = $1 order by id limit $2",
            &[&2i32, &9i64],
        ),
        (
            "select id from T where score > $1 order by balance, id",
            &[&0.5f64],
        ),
        ("select id from T order by id limit 4 offset 100", &[]),
    ];
    for (shape, params) in extended {
        let over = |t: &str| shape.replace(" T", &format!(" {t}"));
        let ids = |rows: Vec<tokio_postgres::Row>| -> Vec<i64> {
            rows.iter().map(|r| r.get(0)).collect()
        };
        let got = client
            .query(&over("acct"), params)
            .await
            .unwrap_or_else(|e| panic!("{shape}: {e}"));
        let want = client
            .query(&over("acct_one"), params)
            .await
            .unwrap_or_else(|e| panic!("{shape}: {e}"));
        assert_eq!(ids(got), ids(want), "{shape}");
    }
    // A statement prepared once and run again (named, in separate batches, as drivers do).
    let prepared = client
        .prepare("select id, name from acct where grp = $1 order by id")
        .await
        .expect("prepare");
    for g in [1i32, 4] {
        let got: Vec<i64> = client
            .query(&prepared, &[&g])
            .await
            .expect("run prepared")
            .iter()
            .map(|r| r.get(0))
            .collect();
        let want: Vec<i64> = (1..=160).filter(|i| i % 7 == i64::from(g)).collect();
        assert_eq!(got, want);
    }

    aggregates(&client).await;
    joins(&client).await;
    let groups = [
        connect(&c.url(&["--group", "0", "--primary"])).await,
        connect(&c.url(&["--group", "1", "--primary"])).await,
    ];
    writes(&client, &groups).await;
    unique_ids(&client).await;
    reference_writes(&client, &groups).await;

    // What the merge cannot answer: 0A000, naming the construct; nothing partial.
    for (sql, needle) in [
        (
            "select string_agg(distinct name, ',') from acct",
            "string_agg",
        ),
        ("select string_agg(name, ',') from acct", "string_agg()"),
        (
            "select grp, name, count(*) from acct group by grp",
            "outside GROUP BY",
        ),
        (
            "select id, row_number() over (order by id) from acct",
            "row_number",
        ),
        ("select id from acct union select id from acct", "UNION"),
        (
            "select a.id from acct a join acct b on a.grp = b.grp",
            "not joined on its shard key",
        ),
    ] {
        refused(&client, sql, needle).await;
    }
    // Text under a collation that is not byte order is refused, not merged wrongly.
    let e = client
        .simple_query("select id from acct order by name collate \"en-x-icu\", id")
        .await
        .expect_err("a non-C collation");
    assert_eq!(e.code(), Some(&SqlState::FEATURE_NOT_SUPPORTED), "{e}");
    // So is a column declared with such a collation, or an expression over it.
    client
        .batch_execute("create table icu (id bigint primary key, name text collate \"en-x-icu\")")
        .await
        .expect("icu table");
    client
        .simple_query("select herd.create_distributed_table('icu', 'id')")
        .await
        .expect("distribute icu");
    for i in 1..=6i64 {
        client
            .batch_execute(&format!("insert into icu (id, name) values ({i}, 'n{i}')"))
            .await
            .expect("insert icu");
    }
    for sql in [
        "select id from icu order by name",
        "select id from icu order by upper(name), id",
    ] {
        refused(&client, sql, "en-x-icu").await;
    }
    // Its rows in key order are merged as usual.
    assert_eq!(
        simple(&client, "select id from icu order by id")
            .await
            .len(),
        6
    );
    // Inside a transaction block: refused, and the transaction fails as on an error.
    client.batch_execute("begin").await.expect("begin");
    let e = client
        .simple_query("select id from acct")
        .await
        .expect_err("fan-out in a transaction");
    assert_eq!(e.code(), Some(&SqlState::FEATURE_NOT_SUPPORTED), "{e}");
    client.batch_execute("rollback").await.expect("rollback");
    // The session goes on.
    let n = simple(&client, "select id from acct order by id limit 3").await;
    assert_eq!(
        n,
        vec![
            vec![Some("1".into())],
            vec![Some("2".into())],
            vec![Some("3".into())]
        ]
    );
}

/// Aggregates, GROUP BY, HAVING and DISTINCT: partial rows per group, the answer computed from
/// them by PostgreSQL, compared with the one-server copy (types, scales, NULLs, empty inputs).
async fn aggregates(client: &tokio_postgres::Client) {
    let shapes: &[&str] = &[
        "select count(*) from T",
        "select count(*), count(name), count(balance), count(score) from T",
        "select sum(grp), sum(id), sum(balance), sum(score), sum(grp::int2) from T",
        "select sum(id + 9223372036854775000) from T",
        "select min(id), max(id), min(name), max(name), min(born), max(born), min(seen), max(seen) from T",
        "select min(balance), max(balance), max(balance) - min(balance), min(note), max(flag::int) from T",
        "select avg(grp), avg(id), avg(balance), avg(grp::int2), avg(score) from T",
        "select bool_and(flag), bool_or(flag), every(flag) from T",
        "select grp, count(*), sum(balance) from T group by grp order by grp",
        "select grp, avg(balance) from T group by grp having count(*) > 20 order by 2 desc nulls last, grp",
        "select flag, count(*) from T group by flag order by flag nulls first",
        "select distinct grp from T order by grp",
        "select distinct note, flag from T order by note, flag",
        "select count(*) from T where false",
        "select sum(balance), avg(balance), max(name), bool_and(flag) from T where false",
        "select grp, count(*) from T where false group by grp",
        "select grp % 2 as parity, count(*), max(balance) from T group by parity order by parity",
        "select upper(note) as n, count(*) from T group by upper(note) order by n nulls first",
        "select grp, count(*) filter (where flag), sum(balance) filter (where balance > 0) from T group by grp order by grp",
        "select grp, coalesce(sum(balance), 0) * 2 + count(*) as x from T group by grp order by x desc, grp limit 3",
        "select count(*) * 1.0 / 3 from T",
        "select grp, name, count(*) from T group by grp, name order by grp, name nulls last limit 10 offset 5",
        "select grp, max(seen) - min(seen) as span from T group by 1 order by 1",
        "select case when count(*) > 100 then 'many' else 'few' end as size, grp from T group by grp order by grp",
        "select note, count(*) from T where grp in (1, 2) group by note having max(id) > 50 order by note",
        "select count(distinct grp), count(distinct name), count(*) from T",
        "select grp, count(distinct note), sum(distinct grp), avg(distinct id) from T group by grp order by grp",
        "select count(distinct id), max(distinct balance) from T",
        "select count(*), count(distinct name) from T where false",
    ];
    for shape in shapes {
        let over = |t: &str| shape.replace(" T", &format!(" {t}"));
        let got = simple(client, &over("acct")).await;
        let want = simple(client, &over("acct_one")).await;
        assert_eq!(got, want, "{shape}");
    }
    // The column names and types are a single server's too.
    let described = client
        .prepare("select grp, count(*), sum(balance), avg(id) as mean from acct group by grp")
        .await
        .expect("prepare an aggregate");
    let names: Vec<(String, String)> = described
        .columns()
        .iter()
        .map(|c| (c.name().to_string(), c.type_().name().to_string()))
        .collect();
    let want: Vec<(String, String)> = [
        ("grp", "int4"),
        ("count", "int8"),
        ("sum", "numeric"),
        ("mean", "numeric"),
    ]
    .iter()
    .map(|(n, t)| (n.to_string(), t.to_string()))
    .collect();
    assert_eq!(names, want);
    // The extended protocol: parameters in WHERE, HAVING and LIMIT, binary results.
    let extended: &[(&str, &[&(dyn tokio_postgres::types::ToSql + Sync)])] = &[
        (
            "select count(*)::text, sum(balance)::text, avg(balance)::text from T where grp > $1",
            &[&3i32],
        ),
        (
            "select grp::text, count(*)::text from T where score > $1 group by grp order by grp",
            &[&0.5f64],
        ),
        (
            "select grp::text, count(*)::text from T group by grp having count(*) > $1 order by grp limit $2",
            &[&22i64, &3i64],
        ),
        ("select max(seen)::text, min(born)::text from T where id < $1", &[&100i64]),
    ];
    for (shape, params) in extended {
        let over = |t: &str| shape.replace(" T", &format!(" {t}"));
        let text = |rows: Vec<tokio_postgres::Row>| -> Vec<Vec<Option<String>>> {
            rows.iter()
                .map(|r| (0..r.len()).map(|i| r.get(i)).collect())
                .collect()
        };
        let got = client
            .query(&over("acct"), params)
            .await
            .unwrap_or_else(|e| panic!("{shape}: {e:?}"));
        let want = client
            .query(&over("acct_one"), params)
            .await
            .unwrap_or_else(|e| panic!("{shape}: {e:?}"));
        assert_eq!(text(got), text(want), "{shape}");
        // tokio-postgres closes the statement right away and the next query follows in the
        // same breath: the proxy must plan it afresh, not refuse it on the server the Close
        // went to.
        let next = client.simple_query("select count(*) from acct").await;
        assert!(next.is_ok(), "after {shape}: {next:?}");
    }
    let prepared = client
        .prepare("select count(*), sum(id)::text from acct where grp = $1")
        .await
        .expect("prepare");
    for g in [0i32, 5] {
        let row = client
            .query_one(&prepared, &[&g])
            .await
            .expect("run prepared");
        let want: Vec<i64> = (1..=160).filter(|i| i % 7 == i64::from(g)).collect();
        assert_eq!(row.get::<_, i64>(0), want.len() as i64);
        assert_eq!(
            row.get::<_, String>(1),
            want.iter().sum::<i64>().to_string()
        );
    }
}

/// The rows a simple query's CommandComplete reports.
async fn simple_count(client: &tokio_postgres::Client, sql: &str) -> u64 {
    client
        .simple_query(sql)
        .await
        .unwrap_or_else(|e| panic!("{sql}: {e:?}"))
        .into_iter()
        .find_map(|m| match m {
            SimpleQueryMessage::CommandComplete(n) => Some(n),
            _ => None,
        })
        .unwrap_or_default()
}

/// UPDATE and DELETE without a key of one group: every group, all or none, the same rows
/// changed as on one server.
async fn writes(client: &tokio_postgres::Client, groups: &[tokio_postgres::Client]) {
    let over = |sql: &str, t: &str| sql.replace(" T", &format!(" {t}"));
    for sql in [
        "update T set note = 'upd' where grp = 3",
        "update T set balance = balance + 1 where balance < 0",
        "delete from T where flag and grp = 2",
        "update T set name = upper(name) where id in (1, 2, 3, 150)",
        "delete from T where id in (4, 5, 6, 7)",
    ] {
        let got = simple_count(client, &over(sql, "acct")).await;
        let want = simple_count(client, &over(sql, "acct_one")).await;
        assert_eq!(got, want, "{sql}");
        assert!(got > 0, "{sql} changed nothing");
    }
    // The extended protocol, with parameters.
    let sql = "update T set score = $1 where grp = $2 and id > $3";
    let params: [&(dyn tokio_postgres::types::ToSql + Sync); 3] = [&1.5f64, &4i32, &20i64];
    let got = client
        .execute(&over(sql, "acct"), &params)
        .await
        .expect("update (extended)");
    let want = client
        .execute(&over(sql, "acct_one"), &params)
        .await
        .expect("update (extended)");
    assert_eq!(got, want);
    // Multi-row INSERTs whose rows belong to both groups: each group inserts its rows.
    let rows: Vec<String> = (1001..=1006).map(row).collect();
    let sql = format!("insert into T {NAMES} values {}", rows.join(", "));
    let explained = simple(
        client,
        &format!(
            "select herd.explain('{}')",
            over(&sql, "acct").replace('\'', "''")
        ),
    )
    .await;
    assert!(
        format!("{explained:?}").contains("every shard group its rows"),
        "the rows span both groups: {explained:?}"
    );
    assert_eq!(simple_count(client, &over(&sql, "acct")).await, 6);
    assert_eq!(simple_count(client, &over(&sql, "acct_one")).await, 6);
    let sql = "insert into T (id, grp, name) values ($1, 1, $2), ($3, 2, $4), ($5, 3, 'lit')";
    let params: [&(dyn tokio_postgres::types::ToSql + Sync); 5] =
        [&2001i64, &"p1", &2002i64, &"p2", &2003i64];
    for t in ["acct", "acct_one"] {
        let n = client
            .execute(&over(sql, t), &params)
            .await
            .expect("insert (extended)");
        assert_eq!(n, 3, "{t}");
    }
    let all = "select * from T order by id";
    assert_eq!(
        simple(client, &over(all, "acct")).await,
        simple(client, &over(all, "acct_one")).await,
        "the same rows after the same writes"
    );
    // All or none: a write that fails on one group (division by zero where id 77 lives)
    // changes no group.
    let before = simple(client, &over(all, "acct")).await;
    let e = client
        .execute("update acct set grp = grp / (id - 77)", &[])
        .await
        .expect_err("division by zero on one group");
    assert_eq!(e.code(), Some(&SqlState::DIVISION_BY_ZERO), "{e}");
    assert_eq!(
        simple(client, &over(all, "acct")).await,
        before,
        "no group kept the write"
    );
    // The same for an INSERT: a duplicate key on one group, nothing inserted anywhere.
    let explained = simple(
        client,
        "select herd.explain('insert into acct (id, grp) values (3001, 1), (3002, 1), (8, 1), (3003, 1)')",
    )
    .await;
    assert!(
        format!("{explained:?}").contains("every shard group its rows"),
        "the rows span both groups: {explained:?}"
    );
    let e = client
        .simple_query("insert into acct (id, grp) values (3001, 1), (3002, 1), (8, 1), (3003, 1)")
        .await
        .expect_err("a duplicate on one group");
    assert_eq!(e.code(), Some(&SqlState::UNIQUE_VIOLATION), "{e}");
    assert_eq!(
        simple(client, &over(all, "acct")).await,
        before,
        "no group kept the rows"
    );
    // RETURNING: every group's rows (compared as sets: they come group by group).
    for sql in [
        "insert into T (id, grp) values (3001, 1), (3002, 1), (3003, 1) returning id, grp",
        "update T set note = 'ret' where grp = 5 returning id, note",
        "delete from T where id in (3001, 3003, 11, 12) returning *",
    ] {
        let mut got = simple(client, &over(sql, "acct")).await;
        let mut want = simple(client, &over(sql, "acct_one")).await;
        got.sort();
        want.sort();
        assert!(!want.is_empty(), "{sql}");
        assert_eq!(got, want, "{sql}");
    }
    let sql = "update T set score = score where grp = $1 returning id, score";
    let ids = |rows: Vec<tokio_postgres::Row>| {
        let mut ids: Vec<i64> = rows.iter().map(|r| r.get(0)).collect();
        ids.sort_unstable();
        ids
    };
    let got = client
        .query(&over(sql, "acct"), &[&6i32])
        .await
        .expect("returning (extended)");
    let want = client
        .query(&over(sql, "acct_one"), &[&6i32])
        .await
        .expect("returning (extended)");
    assert_eq!(ids(got), ids(want));
    assert_eq!(
        simple(client, &over(all, "acct")).await,
        simple(client, &over(all, "acct_one")).await,
        "the same rows after the same writes"
    );
    // Nothing is left prepared anywhere.
    for (g, direct) in groups.iter().enumerate() {
        let n: i64 = direct
            .query_one("select count(*) from pg_prepared_xacts", &[])
            .await
            .expect("pg_prepared_xacts")
            .get(0);
        assert_eq!(n, 0, "group {g} holds prepared transactions");
    }
    // Refused inside a transaction block.
    client.batch_execute("begin").await.expect("begin");
    let e = client
        .simple_query("delete from acct where grp = 1")
        .await
        .expect_err("in a transaction");
    assert_eq!(e.code(), Some(&SqlState::FEATURE_NOT_SUPPORTED), "{e}");
    client.batch_execute("rollback").await.expect("rollback");
}

/// serial, bigserial and identity columns of a distributed table never collide across groups,
/// and nextval through the endpoint hands out values no group has used.
async fn unique_ids(client: &tokio_postgres::Client) {
    client
        .batch_execute(
            "create table ev (id bigserial, ident int generated always as identity, \
             small serial, k bigint not null, primary key (k, id))",
        )
        .await
        .expect("create ev");
    client
        .simple_query("select herd.create_distributed_table('ev', 'k')")
        .await
        .expect("distribute ev");
    for k in 0..40i64 {
        client
            .execute("insert into ev (k) values ($1)", &[&k])
            .await
            .expect("insert ev");
    }
    let rows = client
        .query("select id, ident, small from ev", &[])
        .await
        .expect("read ev from every group");
    assert_eq!(rows.len(), 40);
    for col in 0..3 {
        let mut values: Vec<i64> = rows
            .iter()
            .map(|r| match col {
                0 => r.get::<_, i64>(0),
                1 => i64::from(r.get::<_, i32>(1)),
                _ => i64::from(r.get::<_, i32>(2)),
            })
            .collect();
        values.sort_unstable();
        values.dedup();
        assert_eq!(
            values.len(),
            40,
            "column {col} has duplicates across groups"
        );
    }
    let ids: Vec<i64> = rows.iter().map(|r| r.get(0)).collect();
    for _ in 0..10 {
        let n: i64 = client
            .query_one("select nextval('ev_id_seq')", &[])
            .await
            .expect("nextval")
            .get(0);
        assert!(!ids.contains(&n), "nextval gave {n}, which a group used");
    }
}

/// Writes to a reference table reach every group's copy, all or none, and stay identical;
/// what would give each copy its own value is refused.
async fn reference_writes(client: &tokio_postgres::Client, groups: &[tokio_postgres::Client]) {
    client
        .batch_execute(
            "create table cur (code text primary key, rate numeric, note text default 'none', \
             n serial)",
        )
        .await
        .expect("create cur");
    client
        .simple_query("select herd.create_reference_table('cur')")
        .await
        .expect("reference table");
    assert_eq!(
        simple_count(
            client,
            "insert into cur (code, rate, n) values ('eur', 1.0, 1), ('usd', 1.08, 2), ('chf', 0.94, 3)"
        )
        .await,
        3
    );
    let n = client
        .execute(
            "insert into cur (code, rate, n) values ($1, $2::text::numeric, $3)",
            &[&"gbp", &"0.85", &4i32],
        )
        .await
        .expect("insert (extended)");
    assert_eq!(n, 1);
    assert_eq!(
        simple_count(client, "update cur set rate = rate * 2 where rate < 1").await,
        2
    );
    assert_eq!(
        simple_count(client, "delete from cur where code = 'usd'").await,
        1
    );
    let returned = simple(
        client,
        "update cur set rate = rate where code = 'eur' returning code",
    )
    .await;
    assert_eq!(
        returned,
        vec![vec![Some("eur".to_string())]],
        "one copy's rows"
    );
    let copy = "select code, rate::text, note, n from cur order by code";
    let want = vec![
        vec![
            Some("chf".into()),
            Some("1.88".into()),
            Some("none".into()),
            Some("3".into()),
        ],
        vec![
            Some("eur".into()),
            Some("1.0".into()),
            Some("none".into()),
            Some("1".into()),
        ],
        vec![
            Some("gbp".into()),
            Some("1.70".into()),
            Some("none".into()),
            Some("4".into()),
        ],
    ];
    for (g, direct) in groups.iter().enumerate() {
        assert_eq!(simple(direct, copy).await, want, "group {g}'s copy");
    }
    // What would differ between the copies is refused, and changes nothing.
    for (sql, needle) in [
        ("update cur set note = now()::text", "now"),
        (
            "update cur set note = current_timestamp::text",
            "CURRENT_TIMESTAMP",
        ),
        ("update cur set rate = random()", "random"),
        (
            "insert into cur (code, rate) values ('jpy', 0.006)",
            "column n",
        ),
        ("update cur set note = default", "DEFAULT"),
    ] {
        refused(client, sql, needle).await;
    }
    for direct in groups {
        assert_eq!(simple(direct, copy).await, want);
    }
    // A failure on one copy (a check that only group 1's copy has) leaves every copy as it was.
    groups[1]
        .batch_execute("alter table cur add constraint only_here check (rate < 1.9)")
        .await
        .expect("a constraint on group 1 only");
    let e = client
        .simple_query("update cur set rate = 1.95 where code = 'eur'")
        .await
        .expect_err("violates group 1's check");
    assert_eq!(e.code(), Some(&SqlState::CHECK_VIOLATION), "{e}");
    for direct in groups {
        assert_eq!(simple(direct, copy).await, want);
    }
}

/// A two-phase write abandoned between its phases (a crash of the session or of Herd) is
/// resolved by the proxy within about a minute, as group 0 decided: committed on the other
/// groups where group 0 committed it, rolled back everywhere where group 0 still holds it — so
/// no prepared transaction keeps its locks.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn writes_left_in_doubt_are_resolved() {
    let c = cluster();
    c.up(&["--shards", "2", "--replicas", "0"]);
    let client = connect(&c.url(&[])).await;
    client
        .batch_execute("create table doubt (k bigint primary key, v text)")
        .await
        .expect("create");
    client
        .simple_query("select herd.create_distributed_table('doubt', 'k')")
        .await
        .expect("distribute");
    let groups = [
        connect(&c.url(&["--group", "0", "--primary"])).await,
        connect(&c.url(&["--group", "1", "--primary"])).await,
    ];
    // Decided: group 0 committed its part, with the decision row; group 1 still prepared.
    // Undecided: both prepared. Rolled back: group 0 rolled its part back (a later group's
    // PREPARE failed as far as the session knew), group 1 prepared all the same.
    for (g, direct) in groups.iter().enumerate() {
        let decision = if g == 0 {
            "insert into herd.txn_decisions (gid) values ('herd_ddl_wtest_decided');"
        } else {
            ""
        };
        direct
            .batch_execute(&format!(
                "begin; insert into doubt values ({}, 'decided'); {decision} prepare transaction 'herd_ddl_wtest_decided'",
                10 + g
            ))
            .await
            .expect("prepare decided");
        direct
            .batch_execute(&format!(
                "begin; insert into doubt values ({}, 'rolled back'); prepare transaction 'herd_ddl_wtest_rolled'",
                30 + g
            ))
            .await
            .expect("prepare rolled back");
        direct
            .batch_execute(&format!(
                "begin; insert into doubt values ({}, 'undecided'); prepare transaction 'herd_ddl_wtest_undecided'",
                20 + g
            ))
            .await
            .expect("prepare undecided");
    }
    for decision in [
        "commit prepared 'herd_ddl_wtest_decided'",
        "rollback prepared 'herd_ddl_wtest_rolled'",
    ] {
        groups[0]
            .batch_execute(decision)
            .await
            .expect("group 0's decision");
    }
    // The proxy resolves them once they are old enough.
    let deadline = std::time::Instant::now() + Duration::from_secs(90);
    loop {
        let mut left = 0;
        for direct in &groups {
            left += direct
                .query_one("select count(*) from pg_prepared_xacts", &[])
                .await
                .expect("pg_prepared_xacts")
                .get::<_, i64>(0);
        }
        if left == 0 {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "{left} prepared transactions still in doubt after 90 s"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    for (g, direct) in groups.iter().enumerate() {
        let rows: Vec<String> = direct
            .query("select v from doubt order by k", &[])
            .await
            .expect("rows")
            .iter()
            .map(|r| r.get(0))
            .collect();
        assert_eq!(rows, vec!["decided".to_string()], "group {g}");
    }
}

/// Chaos: writes on every group run in a loop while group 1 fails over (its primary fenced and a
/// replica promoted, possibly between a write's phases). Every write stays all or none: once
/// what was left in doubt is resolved, every row has been incremented the same number of times,
/// at least once per acknowledged write and at most once per attempt, and nothing is left
/// prepared.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cross_group_writes_stay_atomic_through_a_failover() {
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
    use std::sync::Arc;

    let c = cluster();
    c.up(&["--shards", "2", "--replicas", "1"]);
    let endpoint = c.url(&[]);
    let client = connect(&endpoint).await;
    client
        .batch_execute("create table tally (k bigint primary key, n bigint not null)")
        .await
        .expect("create");
    client
        .simple_query("select herd.create_distributed_table('tally', 'k')")
        .await
        .expect("distribute");
    let rows: Vec<String> = (1..=12).map(|k| format!("({k}, 0)")).collect();
    client
        .batch_execute(&format!(
            "insert into tally (k, n) values {}",
            rows.join(", ")
        ))
        .await
        .expect("rows on both groups");
    let stop = Arc::new(AtomicBool::new(false));
    let (ok, attempts) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
    let writer = {
        let (stop, ok, attempts, endpoint) =
            (stop.clone(), ok.clone(), attempts.clone(), endpoint.clone());
        tokio::spawn(async move {
            let mut client = connect(&endpoint).await;
            while !stop.load(Ordering::Relaxed) {
                attempts.fetch_add(1, Ordering::Relaxed);
                let write = client.simple_query("update tally set n = n + 1");
                match tokio::time::timeout(Duration::from_secs(10), write).await {
                    Ok(Ok(_)) => {
                        ok.fetch_add(1, Ordering::Relaxed);
                    }
                    _ => {
                        // The session may be gone with the old primary: a new one.
                        tokio::time::sleep(Duration::from_millis(100)).await;
                        if let Some(fresh) = common::try_connect(&endpoint).await {
                            client = fresh;
                        }
                    }
                }
            }
        })
    };
    tokio::time::sleep(Duration::from_secs(1)).await;
    c.herd_ok(&["failover", "--group", "1"]);
    tokio::time::sleep(Duration::from_secs(3)).await;
    stop.store(true, Ordering::Relaxed);
    writer.await.expect("writer");
    let (ok, attempts) = (ok.load(Ordering::Relaxed), attempts.load(Ordering::Relaxed));
    assert!(ok > 0, "no write went through");
    // What a failover left prepared is resolved (after 30 s) on both groups' primaries.
    let deadline = std::time::Instant::now() + Duration::from_secs(120);
    loop {
        let mut left = 0;
        for g in ["0", "1"] {
            if let Some(direct) = common::try_connect(&c.url(&["--group", g, "--primary"])).await {
                left += direct
                    .query_one("select count(*) from pg_prepared_xacts", &[])
                    .await
                    .map(|r| r.get::<_, i64>(0))
                    .unwrap_or(1);
            } else {
                left += 1;
            }
        }
        if left == 0 {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "{left} prepared transactions still in doubt after 120 s"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let client = connect(&endpoint).await;
    let row = client
        .query_one("select min(n), max(n), count(*) from tally", &[])
        .await
        .expect("tally");
    let (min, max, count): (i64, i64, i64) = (row.get(0), row.get(1), row.get(2));
    eprintln!("{ok} of {attempts} writes acknowledged; every row incremented {min}..{max} times");
    assert_eq!(count, 12);
    assert_eq!(
        min, max,
        "a write reached some rows (groups) and not others"
    );
    assert!(
        max as u64 >= ok,
        "an acknowledged write was lost ({max} < {ok})"
    );
    assert!(max as u64 <= attempts, "more increments than attempts");
}

/// Joins pushed down to every group: distributed tables co-located on their keys, and a
/// reference table; compared with the same joins of the one-server copies.
async fn joins(client: &tokio_postgres::Client) {
    client
        .batch_execute(
            "create table tx (id bigint, acct_id bigint, amount numeric, primary key (acct_id, id)); \
             create table tx_one (id bigint, acct_id bigint, amount numeric); \
             create table kinds (grp int primary key, label text)",
        )
        .await
        .expect("tables");
    for sql in [
        "select herd.create_distributed_table('tx', 'acct_id')",
        "select herd.create_reference_table('kinds')",
    ] {
        client.simple_query(sql).await.expect(sql);
    }
    let rows: Vec<String> = (1..=120i64)
        .map(|i| format!("({i}, {}, {}.5)", (i * 7) % 160 + 1, i))
        .collect();
    for t in ["tx", "tx_one"] {
        client
            .batch_execute(&format!(
                "insert into {t} (id, acct_id, amount) values {}",
                rows.join(", ")
            ))
            .await
            .expect("transactions");
    }
    client
        .batch_execute(
            "insert into kinds (grp, label) values (0, 'zero'), (1, 'one'), (2, 'two'), \
             (3, 'three'), (4, 'four'), (5, 'five')",
        )
        .await
        .expect("kinds");
    for shape in [
        "select a.id, t.id, t.amount from T a join X t on t.acct_id = a.id order by a.id, t.id",
        "select a.grp, count(*), sum(t.amount) from T a join X t on t.acct_id = a.id group by a.grp order by a.grp",
        "select a.id, k.label from T a join kinds k on k.grp = a.grp where a.balance > 0 order by a.id",
        "select k.label, count(*), max(a.name) from T a join kinds k on k.grp = a.grp group by k.label order by k.label",
        "select a.id from T a left join X t on t.acct_id = a.id where t.id is null order by a.id",
        "select a.id, sum(t.amount) as total from T a join X t on t.acct_id = a.id group by a.id order by total desc, a.id limit 5",
    ] {
        let over = |t: &str, x: &str| shape.replace(" T", &format!(" {t}")).replace(" X", &format!(" {x}"));
        let got = simple(client, &over("acct", "tx")).await;
        let want = simple(client, &over("acct_one", "tx_one")).await;
        assert!(!want.is_empty(), "{shape}");
        assert_eq!(got, want, "{shape}");
    }
}
