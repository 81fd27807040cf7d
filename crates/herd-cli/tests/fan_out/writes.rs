//! Writes on every group (UPDATE/DELETE without a key, split INSERTs, reference tables) and
//! cluster-unique ids, compared with the one-server copy.

use tokio_postgres::error::SqlState;

use super::{refused, row, simple, NAMES};
use tokio_postgres::SimpleQueryMessage;

/// The rows a simple query's CommandComplete reports.
pub async fn simple_count(client: &tokio_postgres::Client, sql: &str) -> u64 {
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
pub async fn writes(client: &tokio_postgres::Client, groups: &[tokio_postgres::Client]) {
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
    // Inside a transaction block: every group's part writes, the transaction reads its own
    // writes, and ROLLBACK (or COMMIT, two-phase) decides for every group.
    let count = "select count(*) from acct where grp = 1";
    let before = simple(client, count).await;
    client.batch_execute("begin").await.expect("begin");
    assert!(simple_count(client, "delete from acct where grp = 1").await > 0);
    assert_eq!(simple(client, count).await, vec![vec![Some("0".into())]]);
    client.batch_execute("rollback").await.expect("rollback");
    assert_eq!(
        simple(client, count).await,
        before,
        "rolled back on every group"
    );
    client.batch_execute("begin").await.expect("begin");
    let changed = simple_count(client, "update acct set note = 'tx' where grp = 1").await;
    client
        .batch_execute("update acct set note = 'tx2' where id = 2")
        .await
        .expect("a write by key in the same transaction");
    client.batch_execute("commit").await.expect("commit");
    client
        .batch_execute(
            "update acct_one set note = 'tx' where grp = 1; \
             update acct_one set note = 'tx2' where id = 2",
        )
        .await
        .expect("the same on the one-server copy");
    assert_eq!(
        simple(client, "select count(*) from acct where note = 'tx'").await,
        vec![vec![Some(changed.to_string())]],
        "committed on every group"
    );
    assert_eq!(
        simple(client, "select * from acct order by id").await,
        simple(client, "select * from acct_one order by id").await
    );
}

/// serial, bigserial and identity columns of a distributed table never collide across groups,
/// and nextval through the endpoint hands out values no group has used.
pub async fn unique_ids(client: &tokio_postgres::Client) {
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
pub async fn reference_writes(client: &tokio_postgres::Client, groups: &[tokio_postgres::Client]) {
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
