//! Statements across shard groups that were refused before issue #40, through the endpoint of
//! one 2-group cluster and compared with the same statements on one-server copies of the same
//! rows (tables that live on group 0 only): co-located joins written with unqualified columns
//! as TPC-H writes them (`FROM orders, lineitem WHERE o_orderkey = l_orderkey`), and `INSERT
//! INTO t VALUES (…)` without a column list. What must still be refused is checked next to
//! each (a column of both tables, FROM items whose columns are not a table's own, a join not
//! on the keys, a row without its key).

mod common;

use std::time::Duration;

use common::{cluster, connect, refused, run_all};
use tokio_postgres::{Client, SimpleQueryMessage};

/// The whole test's bound (a cluster start included).
const LIMIT: Duration = Duration::from_secs(300);

/// Rows of a simple query as text.
async fn simple(client: &Client, sql: &str) -> Vec<Vec<Option<String>>> {
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
    // column that is not the key: refused as before.
    for (sql, needle) in [
        (
            "select count(*) from t1, t2 where k = k",
            "not joined on its shard key",
        ),
        (
            "select count(*) from t1 join t2 on k = t2.k",
            "not joined on its shard key",
        ),
        (
            "select count(*) from orders, lineitem where o_orderkey = l_linenumber",
            "not joined on its shard key",
        ),
        (
            "select count(*) from orders, lineitem where o_orderkey = no_such_column",
            "not joined on its shard key",
        ),
        (
            "select count(*) from orders o(a, b, c, d, e), lineitem where a = l_orderkey",
            "not joined on its shard key",
        ),
        (
            "select count(*) from orders, (select l_orderkey from lineitem) s \
             where o_orderkey = l_orderkey",
            "subquery",
        ),
    ] {
        refused(client, sql, needle).await;
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
            "insert into events select note, id + 1000, v from events where id = 5",
            "expression",
        ),
    ] {
        refused(client, sql, needle).await;
    }
}
