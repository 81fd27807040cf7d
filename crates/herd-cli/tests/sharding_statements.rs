//! Statements across shard groups that were refused before issue #40, through the endpoint of
//! one 2-group cluster and compared with the same statements on one-server copies of the same
//! rows (tables that live on group 0 only): co-located joins written with unqualified columns
//! as TPC-H writes them (`FROM orders, lineitem WHERE o_orderkey = l_orderkey`), and `INSERT
//! INTO t VALUES (…)` without a column list. What must still be refused is checked next to
//! each (a column of both tables, FROM items whose columns are not a table's own, a join not
//! on the keys, a row without its key). And a query string of several statements on different
//! groups (`BEGIN; UPDATE … ; UPDATE … ; COMMIT` as `psql -c` sends it, or without BEGIN: one
//! implicit transaction), answered message for message as one server answers it, failures
//! included, with no prepared transaction left behind.

mod common;
#[path = "sharding_statements/copies.rs"]
mod copies;
#[path = "sharding_statements/cursors.rs"]
mod cursors;
#[path = "sharding_statements/insert_select.rs"]
mod insert_select;
#[path = "sharding_statements/pipelines.rs"]
mod pipelines;
#[path = "sharding_statements/sql_prepare.rs"]
mod sql_prepare;
#[path = "sharding_statements/writes.rs"]
mod writes;

use std::time::Duration;

use common::{cluster, connect, refused, run_all, text_rows as simple};
use tokio_postgres::{Client, SimpleQueryMessage};

/// The whole test's bound (a cluster start included).
const LIMIT: Duration = Duration::from_secs(300);

/// The command tag's row count of a simple query.
async fn affected(client: &Client, sql: &str) -> u64 {
    client
        .simple_query(sql)
        .await
        .unwrap_or_else(|e| panic!("{sql}: {e:?}"))
        .into_iter()
        .find_map(|m| match m {
            SimpleQueryMessage::CommandComplete(n) => Some(n),
            _ => None,
        })
        .unwrap_or_else(|| panic!("{sql}: no command tag"))
}

/// `shape` over the distributed tables and over their one-server copies: `ORDERS`,
/// `LINEITEM`, `EVENTS` name the tables.
fn over(shape: &str, one: bool) -> String {
    let suffix = if one { "_one" } else { "" };
    shape
        .replace("ORDERS", &format!("orders{suffix}"))
        .replace("LINEITEM", &format!("lineitem{suffix}"))
        .replace("EVENTS", &format!("events{suffix}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn statements_across_groups_answer_as_one_server() {
    let c = cluster();
    c.up(&["--shards", "2", "--replicas", "0"]);
    let url = c.url(&[]);
    let groups: Vec<String> = (0..2)
        .map(|g| c.url(&["--group", &g.to_string(), "--primary"]))
        .collect();
    tokio::time::timeout(LIMIT, async {
        let client = connect(&url).await;
        set_up(&client).await;
        unqualified_joins(&client).await;
        inserts_without_columns(&client, &groups).await;
        strings_of_statements(&client, &groups).await;
        pipelines::pipelines(&client, &url, &groups).await;
        writes::writes(&client, &groups).await;
        insert_select::insert_select(&client, &url, &groups).await;
        copies::copies(&client, &url, &groups).await;
        cursors::cursors(&client, &url, &groups).await;
        sql_prepare::sql_prepare(&url, &groups).await;
    })
    .await
    .expect("the test's time limit");
}

async fn set_up(client: &Client) {
    for one in [false, true] {
        let s = if one { "_one" } else { "" };
        run_all(
            client,
            &[
                &format!(
                    "create table orders{s} (o_orderkey bigint primary key, o_custkey bigint, \
                     o_nationkey int, o_totalprice numeric(12,2), o_comment text)"
                ),
                &format!(
                    "create table lineitem{s} (l_orderkey bigint, l_linenumber int, \
                     l_quantity int, l_comment text, primary key (l_orderkey, l_linenumber))"
                ),
                // The key is not the first column: its position comes from the catalog.
                &format!("create table events{s} (note text, id bigint primary key, v int)"),
            ],
        )
        .await;
    }
    run_all(
        client,
        &[
            "create table nation (n_nationkey int primary key, n_name text, n_comment text)",
            "create table t1 (k bigint primary key, v int)",
            "create table t2 (k bigint primary key, v int)",
            "select herd.create_distributed_table('orders', 'o_orderkey')",
            "select herd.create_distributed_table('lineitem', 'l_orderkey')",
            "select herd.create_distributed_table('events', 'id')",
            "select herd.create_distributed_table('t1', 'k')",
            "select herd.create_distributed_table('t2', 'k')",
            "select herd.create_reference_table('nation')",
            "insert into nation values (0, 'ALGERIA', 'n0'), (1, 'BRAZIL', 'n1'), \
             (2, 'CHINA', NULL), (3, 'EGYPT', 'n3'), (4, 'FRANCE', 'n4')",
        ],
    )
    .await;
    // TPC-H style rows, inserted without a column list (rows of both groups in one INSERT:
    // split by key, two-phase commit).
    let orders: Vec<String> = (1..=60i64)
        .map(|i| {
            format!(
                "({i}, {}, {}, {}.{:02}, {})",
                i % 13,
                i % 5,
                (i * 37) % 500,
                i % 100,
                if i % 9 == 0 {
                    "NULL".into()
                } else {
                    format!("'c{}'", i % 4)
                }
            )
        })
        .collect();
    let lines: Vec<String> = (1..=60i64)
        .flat_map(|o| {
            (1..=(o % 4 + 1)).map(move |l| format!("({o}, {l}, {}, 'c{}')", (o + l) % 7, l))
        })
        .collect();
    for one in [false, true] {
        for (t, rows) in [("ORDERS", &orders), ("LINEITEM", &lines)] {
            let sql = over(&format!("insert into {t} values {}", rows.join(", ")), one);
            assert_eq!(affected(client, &sql).await, rows.len() as u64, "{sql}");
        }
    }
}

/// TPC-H never qualifies its columns: joins of co-located tables on their keys written that
/// way run on every group (or on one, by key) and answer as one server.
async fn unqualified_joins(client: &Client) {
    for shape in [
        "select count(*), sum(l_quantity) from ORDERS, LINEITEM where o_orderkey = l_orderkey",
        "select o_orderkey, sum(l_quantity) as q from ORDERS, LINEITEM \
         where o_orderkey = l_orderkey and o_totalprice > 100 \
         group by o_orderkey order by q desc, o_orderkey limit 10",
        "select n_name, count(*), sum(o_totalprice) from ORDERS, LINEITEM, nation \
         where l_orderkey = o_orderkey and o_nationkey = n_nationkey group by n_name order by n_name",
        "select l_linenumber, l_quantity from ORDERS join LINEITEM on o_orderkey = l_orderkey \
         where o_orderkey = 7 order by l_linenumber",
        "select o_orderkey, l_linenumber from ORDERS o, LINEITEM l \
         where o_orderkey = l_orderkey and l_comment like 'c1%' order by 1, 2",
        "select o_nationkey, count(*) from ORDERS, LINEITEM \
         where o_orderkey = l_orderkey and l_quantity < l_linenumber group by 1 order by 1",
        "select o_orderkey, l_linenumber from ORDERS, LINEITEM \
         where o_orderkey = l_orderkey and l_orderkey in (3, 4, 5, 40) order by 1, 2",
    ] {
        let got = simple(client, &over(shape, false)).await;
        let want = simple(client, &over(shape, true)).await;
        assert!(!want.is_empty(), "{shape}");
        assert_eq!(got, want, "{shape}");
    }
    // UPDATE … FROM a co-located table, unqualified: on every group, all or none.
    let update = "update ORDERS set o_comment = 'touched' from LINEITEM \
                  where o_orderkey = l_orderkey and l_quantity = 3";
    assert_eq!(
        affected(client, &over(update, false)).await,
        affected(client, &over(update, true)).await
    );
    let all = "select * from ORDERS order by o_orderkey";
    assert_eq!(
        simple(client, &over(all, false)).await,
        simple(client, &over(all, true)).await
    );
    // A column of both tables is ambiguous, as PostgreSQL says: never tied to one of them.
    // One of neither, a FROM item whose columns are not its table's own, or a join on a
    // column that is not the key: no fast path, so the general path (issue #40) answers
    // them on group 0, as one server does (its errors included).
    for sql in [
        "select count(*) from t1, t2 where k = k",
        "select count(*) from t1 join t2 on k = t2.k",
    ] {
        let e = client.simple_query(sql).await.expect_err(sql);
        assert_eq!(
            e.code(),
            Some(&tokio_postgres::error::SqlState::AMBIGUOUS_COLUMN),
            "{sql}: {e}"
        );
    }
    let e = client
        .simple_query("select count(*) from orders, lineitem where o_orderkey = no_such_column")
        .await
        .expect_err("no such column");
    assert_eq!(
        e.code(),
        Some(&tokio_postgres::error::SqlState::UNDEFINED_COLUMN),
        "{e}"
    );
    for shape in [
        "select count(*) from ORDERS, LINEITEM where o_orderkey = l_linenumber",
        "select count(*) from ORDERS o(a, b, c, d, e), LINEITEM where a = l_orderkey",
        "select count(*) from ORDERS, (select l_orderkey from LINEITEM) s \
         where o_orderkey = l_orderkey",
    ] {
        let got = simple(client, &over(shape, false)).await;
        assert_eq!(got, simple(client, &over(shape, true)).await, "{shape}");
    }
}

/// `INSERT INTO t VALUES (…)` without a column list: each row goes by the key's position in
/// the table's columns.
async fn inserts_without_columns(client: &Client, groups: &[String]) {
    let rows: Vec<String> = (1..=24i64)
        .map(|i| format!("('n{i}', {i}, {})", i * 10))
        .collect();
    for one in [false, true] {
        let sql = over(
            &format!("insert into EVENTS values {}", rows.join(", ")),
            one,
        );
        assert_eq!(affected(client, &sql).await, 24);
        // The extended protocol: one row by key, its key a parameter.
        for id in [100i64, 101, 102] {
            let n = client
                .execute(
                    &over("insert into EVENTS values ($1, $2, $3)", one),
                    &[&format!("p{id}"), &id, &7i32],
                )
                .await
                .expect("insert by key");
            assert_eq!(n, 1);
        }
    }
    let all = "select * from EVENTS order by id";
    let got = simple(client, &over(all, false)).await;
    assert_eq!(got.len(), 27);
    assert_eq!(got, simple(client, &over(all, true)).await);
    // Each row on its key's group.
    let mut counts = Vec::new();
    for group in groups {
        let direct = connect(group).await;
        let n: i64 = direct
            .query_one("select count(*) from events", &[])
            .await
            .expect("count")
            .get(0);
        counts.push(n);
    }
    assert_eq!(counts.iter().sum::<i64>(), 27, "{counts:?}");
    assert!(counts.iter().all(|n| *n > 0), "{counts:?}");
    for (sql, needle) in [
        ("insert into events values ('short')", "lacks the key"),
        ("insert into events default values", "shard key column"),
        (
            "insert into events select note, id, v from events where id = 5 \
             union select 'x', 1, 1",
            "set operation",
        ),
    ] {
        refused(client, sql, needle).await;
    }
}

/// A simple query's answer, message by message: rows, completions, or the error's SQLSTATE.
async fn answer(client: &Client, sql: &str) -> Vec<String> {
    match client.simple_query(sql).await {
        Ok(messages) => messages
            .into_iter()
            .map(|m| match m {
                SimpleQueryMessage::Row(r) => format!(
                    "row {:?}",
                    (0..r.len())
                        .map(|i| r.get(i).map(str::to_string))
                        .collect::<Vec<_>>()
                ),
                SimpleQueryMessage::CommandComplete(n) => format!("complete {n}"),
                SimpleQueryMessage::RowDescription(_) => "description".into(),
                _ => "other".into(),
            })
            .collect(),
        Err(e) => vec![format!("error {}", e.code().map_or("", |c| c.code()))],
    }
}

/// A query string of several statements on different groups: run statement by statement in
/// its transaction, answered as one server answers it.
async fn strings_of_statements(client: &Client, groups: &[String]) {
    for t in ["acct", "acct_one"] {
        client
            .batch_execute(&format!(
                "create table {t} (id bigint primary key, balance int not null)"
            ))
            .await
            .expect("accounts");
    }
    client
        .batch_execute("select herd.create_distributed_table('acct', 'id')")
        .await
        .expect("distribute");
    let values: Vec<String> = (1..=20).map(|i| format!("({i}, 100)")).collect();
    for t in ["acct", "acct_one"] {
        client
            .batch_execute(&format!("insert into {t} values {}", values.join(", ")))
            .await
            .expect("rows");
    }
    // An account on each group.
    let mut on = Vec::new();
    for group in groups {
        let direct = connect(group).await;
        let id: i64 = direct
            .query_one("select min(id) from acct", &[])
            .await
            .expect("an account")
            .get(0);
        on.push(id);
    }
    let (a, b) = (on[0], on[1]);
    let same = |shape: String| async move {
        let got = answer(client, &shape.replace("ACCT", "acct")).await;
        let want = answer(client, &shape.replace("ACCT", "acct_one")).await;
        assert_eq!(got, want, "{shape}");
        got
    };
    let balances = "select id, balance from ACCT order by id";
    let transfer = |amount: i32, to: &str| {
        format!(
            "update ACCT set balance = balance - {amount} where id = {a}; \
             update ACCT set balance = balance {to} where id = {b}"
        )
    };
    // psql -c "BEGIN; …; COMMIT": every answer as one server's, two groups written.
    let got = same(format!("BEGIN; {}; COMMIT", transfer(10, "+ 10"))).await;
    assert_eq!(
        got,
        ["complete 0", "complete 1", "complete 1", "complete 0"]
    );
    same(balances.to_string()).await;
    // Without BEGIN: one implicit transaction; a read across groups and a split INSERT in it.
    let got = same(format!(
        "{}; select sum(balance) from ACCT; insert into ACCT values (100, 1), (101, 2), (102, 3), (103, 4)",
        transfer(5, "+ 5")
    ))
    .await;
    assert!(got.contains(&"complete 4".to_string()), "{got:?}");
    same(balances.to_string()).await;
    // A failure in the implicit transaction undoes the whole string.
    let got = same(transfer(7, "/ 0")).await;
    assert_eq!(got, ["error 22012"]);
    same(balances.to_string()).await;
    assert_eq!(
        answer(client, "select 1").await.last().map(String::as_str),
        Some("complete 1")
    );
    // In the client's own transaction: the rest (its COMMIT) is not run, the transaction stays
    // failed until ROLLBACK.
    for t in ["acct", "acct_one"] {
        let string = format!("BEGIN; {}; COMMIT", transfer(7, "/ 0")).replace("ACCT", t);
        assert_eq!(answer(client, &string).await, ["error 22012"], "{t}");
        assert_eq!(answer(client, "select 1").await, ["error 25P02"], "{t}");
        assert_eq!(answer(client, "rollback").await, ["complete 0"], "{t}");
    }
    same(balances.to_string()).await;
    // BEGIN without COMMIT: the transaction stays open across both groups.
    for t in ["acct", "acct_one"] {
        let string = format!("BEGIN; {}", transfer(1, "+ 1")).replace("ACCT", t);
        assert_eq!(
            answer(client, &string).await,
            ["complete 0", "complete 1", "complete 1"]
        );
        assert_eq!(answer(client, "commit").await, ["complete 0"], "{t}");
    }
    same(balances.to_string()).await;
    // Inside a transaction block the client began: the statements run in it, a trailing
    // COMMIT ends it; a failure leaves it failed.
    for t in ["acct", "acct_one"] {
        let string = transfer(3, "+ 3").replace("ACCT", t);
        assert_eq!(answer(client, "begin").await, ["complete 0"]);
        assert_eq!(answer(client, &string).await, ["complete 1", "complete 1"]);
        assert_eq!(answer(client, &string).await, ["complete 1", "complete 1"]);
        assert_eq!(answer(client, "commit").await, ["complete 0"], "{t}");
        assert_eq!(answer(client, "begin").await, ["complete 0"]);
        let with_commit = format!("{string}; commit");
        assert_eq!(
            answer(client, &with_commit).await,
            ["complete 1", "complete 1", "complete 0"],
            "{t}"
        );
        // Once the transaction spans both groups, a string with its COMMIT on one of them.
        assert_eq!(answer(client, "begin").await, ["complete 0"]);
        assert_eq!(answer(client, &string).await, ["complete 1", "complete 1"]);
        let one_and_commit = format!("update {t} set balance = balance + 1 where id = {a}; commit");
        assert_eq!(
            answer(client, &one_and_commit).await,
            ["complete 1", "complete 0"],
            "{t}"
        );
        assert_eq!(answer(client, "begin").await, ["complete 0"]);
        let failing = transfer(3, "/ 0").replace("ACCT", t);
        assert_eq!(answer(client, &failing).await, ["error 22012"], "{t}");
        assert_eq!(answer(client, "select 1").await, ["error 25P02"], "{t}");
        assert_eq!(answer(client, "rollback").await, ["complete 0"], "{t}");
    }
    same(balances.to_string()).await;
    // A query pipelined behind the string waits for it and sees its writes.
    let (string, behind) = (
        transfer(2, "+ 2").replace("ACCT", "acct"),
        format!("select balance from acct where id = {b}"),
    );
    let (first, second) = tokio::join!(client.simple_query(&string), client.simple_query(&behind));
    first.expect("the string");
    assert!(!second.expect("the query behind it").is_empty());
    client
        .batch_execute(&transfer(2, "+ 2").replace("ACCT", "acct_one"))
        .await
        .expect("the same on one server");
    same(balances.to_string()).await;
    // No two-phase transaction left anywhere.
    for group in groups {
        let direct = connect(group).await;
        let n: i64 = direct
            .query_one("select count(*) from pg_prepared_xacts", &[])
            .await
            .expect("prepared")
            .get(0);
        assert_eq!(n, 0);
    }
    // Writes to a reference table in a string (`kinds`; `kinds_one` lives on group 0 alone):
    // in the string's transaction like the others, all or none.
    for t in ["kinds", "kinds_one"] {
        client
            .batch_execute(&format!("create table {t} (id int primary key, name text)"))
            .await
            .expect("kinds");
    }
    client
        .batch_execute("select herd.create_reference_table('kinds')")
        .await
        .expect("reference table");
    let kinds_same = |shape: String| async move {
        let got = answer(
            client,
            &shape.replace("KINDS", "kinds").replace("ACCT", "acct"),
        )
        .await;
        let want = answer(
            client,
            &shape
                .replace("KINDS", "kinds_one")
                .replace("ACCT", "acct_one"),
        )
        .await;
        assert_eq!(got, want, "{shape}");
        got
    };
    let got = kinds_same(format!(
        "insert into KINDS values (1, 'a'); insert into KINDS values (2, 'b'); {}",
        transfer(1, "+ 1")
    ))
    .await;
    assert_eq!(
        got,
        ["complete 1", "complete 1", "complete 1", "complete 1"]
    );
    let got = kinds_same(
        "BEGIN; update KINDS set name = 'c' where id = 2; insert into KINDS values (3, 'd'); COMMIT"
            .to_string(),
    )
    .await;
    assert_eq!(
        got,
        ["complete 0", "complete 1", "complete 1", "complete 0"]
    );
    // A duplicate key undoes the whole string: no row 4 on any group.
    let got = kinds_same(
        "insert into KINDS values (4, 'e'); insert into KINDS values (1, 'again')".to_string(),
    )
    .await;
    assert_eq!(got, ["error 23505"]);
    kinds_same("select id, name from KINDS order by id".to_string()).await;
    same(balances.to_string()).await;
    for group in groups {
        let rows: Vec<(i32, String)> = connect(group)
            .await
            .query("select id, name from kinds order by id", &[])
            .await
            .expect("kinds on a group")
            .iter()
            .map(|r| (r.get(0), r.get(1)))
            .collect();
        assert_eq!(
            rows,
            [
                (1, "a".to_string()),
                (2, "c".to_string()),
                (3, "d".to_string())
            ],
            "every group holds the same reference rows"
        );
    }
    // Still refused: other transaction control, a COMMIT without BEGIN, DDL, a statement
    // refused on its own (nothing of the string runs).
    for (sql, needle) in [
        (
            format!("BEGIN; update acct set balance = 0 where id = {a}; SAVEPOINT s; update acct set balance = 0 where id = {b}; COMMIT"),
            "leading BEGIN",
        ),
        (
            format!("update acct set balance = 0 where id = {a}; update acct set balance = 0 where id = {b}; COMMIT"),
            "does not begin with BEGIN",
        ),
        (
            format!("update acct set balance = 0 where id = {a}; create index on acct (balance)"),
            "send it alone",
        ),
        (
            format!("update acct set balance = 0 where id = {a}; update acct set balance = 0 where id = {b}; copy acct_one from stdin"),
            "COPY in a query string",
        ),
        (
            format!("update acct set balance = 0 where id = {a}; select count(*) from acct x, acct y where x.balance = y.balance"),
            "not joined on its shard key",
        ),
    ] {
        refused(client, &sql, needle).await;
    }
    same(balances.to_string()).await;
}

/// A key of each group: the smallest `o_orderkey` of its rows of `orders`.
async fn order_keys(groups: &[String]) -> Vec<i64> {
    let mut keys = Vec::new();
    for g in groups {
        let row = connect(g)
            .await
            .query_one("select min(o_orderkey) from orders", &[])
            .await
            .expect("a key of the group");
        keys.push(row.get::<_, i64>(0));
    }
    keys
}
