//! `INSERT … SELECT` into a distributed table whose rows go to several shard groups, through
//! the endpoint, compared with the same statement on a one-server copy: from a set-returning
//! function (bare literals take the column's type, as on one server), from a distributed
//! table read on every group, inside a transaction with parameters and RETURNING (rolled back,
//! then committed), with no rows, with ON CONFLICT. Every row must be where its key says:
//! a lookup by key through the endpoint finds each one. What Herd cannot place exactly is
//! refused with 0A000 (a key of another type; a SELECT aggregating across groups).

use tokio_postgres::Client;

use super::{affected, over, simple};
use crate::common::{connect, refused, run_all};

/// `COPIED` is the distributed table, `copied_one` its one-server copy.
fn on(shape: &str, one: bool) -> String {
    over(shape, one).replace("COPIED", if one { "copied_one" } else { "copied" })
}

pub async fn insert_select(client: &Client, url: &str, groups: &[String]) {
    run_all(
        client,
        &[
            "create table copied (k bigint primary key, v text, n numeric, j jsonb)",
            "create table copied_one (k bigint primary key, v text, n numeric, j jsonb)",
            "select herd.create_distributed_table('copied', 'k')",
        ],
    )
    .await;
    // From a set-returning function (the SELECT runs on group 0); the jsonb literal is a bare
    // literal, which takes the column's type.
    // A char(8) value goes into a text column without its padding (not cut to one
    // character, as a cast to `character` would).
    let series = "insert into COPIED (k, v, n, j) select g, ('v' || g)::char(8), g * 1.5, \
                  '{\"a\": 1}' from generate_series(1, 200) g";
    for one in [false, true] {
        assert_eq!(affected(client, &on(series, one)).await, 200, "{series}");
    }
    // From a distributed table read on every group, the key computed.
    let from_orders = "insert into COPIED (k, v) select o_custkey * 1000 + o_orderkey + 1000, \
                       o_comment from ORDERS";
    for one in [false, true] {
        assert_eq!(
            affected(client, &on(from_orders, one)).await,
            60,
            "{from_orders}"
        );
    }
    // Without a column list (the key is not the first column), its key an expression.
    let no_columns = "insert into EVENTS select note, id + 1000, v from EVENTS where id <= 5";
    for one in [false, true] {
        assert_eq!(
            affected(client, &on(no_columns, one)).await,
            5,
            "{no_columns}"
        );
    }
    let events = "select * from EVENTS order by id";
    assert_eq!(
        simple(client, &on(events, false)).await,
        simple(client, &on(events, true)).await
    );
    // Again: ON CONFLICT DO NOTHING inserts none.
    let again = format!("{series} on conflict do nothing");
    for one in [false, true] {
        assert_eq!(affected(client, &on(&again, one)).await, 0, "{again}");
    }
    // No rows at all.
    let none = "insert into COPIED (k, v) select g, 'x' from generate_series(1, 0) g";
    for one in [false, true] {
        assert_eq!(affected(client, &on(none, one)).await, 0, "{none}");
    }
    // Inside a transaction, extended protocol with parameters and RETURNING: rolled back,
    // then committed. The SELECT sees the transaction's own rows.
    let mut c = connect(url).await;
    for commit in [false, true] {
        let tx = c.transaction().await.expect("begin");
        tx.execute(
            "insert into copied (k, v) values (500000, 'mine'), (500001, 'mine')",
            &[],
        )
        .await
        .expect("rows of this transaction");
        let rows = tx
            .query(
                "insert into copied (k, v) select k + $1, v from copied \
                 where k <= $2 or v = 'mine' returning k",
                &[&100_000i64, &10i64],
            )
            .await
            .expect("insert … select with parameters");
        let mut keys: Vec<i64> = rows.iter().map(|r| r.get(0)).collect();
        keys.sort_unstable();
        let mut want: Vec<i64> = (1..=10).map(|k| k + 100_000).collect();
        want.extend([600_000, 600_001]);
        assert_eq!(keys, want);
        if commit {
            tx.commit().await.expect("commit");
        } else {
            tx.rollback().await.expect("rollback");
        }
    }
    run_all(
        client,
        &[
            "insert into copied_one (k, v) values (500000, 'mine'), (500001, 'mine')",
            "insert into copied_one (k, v) select k + 100000, v from copied_one \
             where k <= 10 or v = 'mine'",
        ],
    )
    .await;
    // In a string of several statements (psql -c), each statement in turn, one transaction.
    let string =
        "begin; insert into COPIED (k, v) select g, 'str' from generate_series(700001, 700040) g; \
                  update COPIED set v = 'str2' where k = 700001; commit";
    for one in [false, true] {
        client
            .batch_execute(&on(string, one))
            .await
            .unwrap_or_else(|e| panic!("{string}: {e}"));
    }
    // The same rows as on one server, and each where its key says.
    let all = "select * from COPIED order by k";
    let rows = simple(client, &on(all, false)).await;
    assert_eq!(rows, simple(client, &on(all, true)).await);
    assert_eq!(rows.len(), 200 + 60 + 2 + 12 + 40);
    let mut found = 0;
    for row in &rows {
        let k = row[0].clone().expect("a key");
        let hit = simple(client, &format!("select k from copied where k = {k}")).await;
        found += hit.len();
    }
    assert_eq!(found, rows.len(), "every row is on its key's group");
    let mut per_group = Vec::new();
    for url in groups {
        let direct = connect(url).await;
        let n = simple(&direct, "select count(*) from copied").await;
        per_group.push(n[0][0].clone().unwrap_or_default());
    }
    assert!(
        per_group.iter().all(|n| n != "0"),
        "rows on every group: {per_group:?}"
    );
    // What cannot be placed exactly is refused, nothing written.
    refused(
        client,
        "insert into copied (k, v) select g * 1.0, 'x' from generate_series(900001, 900003) g",
        "not of the key's type",
    )
    .await;
    refused(
        client,
        "insert into copied (k, v) select o_custkey + 900000, count(*)::text from orders \
         group by o_custkey",
        "aggregates",
    )
    .await;
    let after = simple(client, "select count(*) from copied where k > 900000").await;
    assert_eq!(after[0][0].as_deref(), Some("0"));
}
