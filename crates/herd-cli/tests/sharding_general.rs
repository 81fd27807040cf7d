//! The general path (issue #40, docs/sharding-general.md): reads the fast paths cannot answer
//! across shard groups — window functions, CTEs, `IN (subquery)`, set operations, joins not on
//! the key, `string_agg … ORDER BY`, `percentile_cont`, `DISTINCT ON`, `ROLLUP`, TPC-H shapes —
//! run on group 0 over postgres_fdw global tables, through the endpoint of one 2-group
//! cluster, and must answer exactly as one server answers the same rows (one-server copies:
//! tables that live on group 0 only). Simple and extended protocol; inside a transaction block
//! while it has not written; writes and reads in a transaction that wrote stay refused.

mod common;

use std::time::Duration;

use common::{cluster, connect, refused, run_all, text_rows as simple};
use tokio_postgres::Client;

/// The whole test's bound (a cluster start included).
const LIMIT: Duration = Duration::from_secs(110);

/// `shape` over the distributed tables, or over their one-server copies.
fn over(shape: &str, one: bool) -> String {
    let s = if one { "_one" } else { "" };
    shape
        .replace("ORDERS", &format!("orders{s}"))
        .replace("LINEITEM", &format!("lineitem{s}"))
        .replace("CUSTOMER", &format!("customer{s}"))
}

/// The reads compared (each ordered completely, so one answer is right).
const SHAPES: &[&str] = &[
    // Window functions.
    "select o_orderkey, rank() over (partition by o_custkey order by o_totalprice desc, o_orderkey), \
     sum(o_totalprice) over (partition by o_custkey) from ORDERS order by o_orderkey",
    // CTE.
    "with big as (select o_custkey, sum(o_totalprice) s from ORDERS group by o_custkey) \
     select * from big where s > 300 order by o_custkey",
    // IN (subquery) over distributed tables, and a correlated EXISTS.
    "select count(*), sum(o_totalprice) from ORDERS where o_custkey in \
     (select c_custkey from CUSTOMER where c_nation = 1)",
    "select c_custkey from CUSTOMER c where exists (select 1 from ORDERS o \
     where o.o_custkey = c.c_custkey and o.o_totalprice > 90) order by 1",
    // Set operations.
    "select o_custkey from ORDERS union select c_custkey from CUSTOMER order by 1",
    "select o_custkey from ORDERS except select c_custkey from CUSTOMER where c_nation = 2 order by 1",
    // A join not on the key (and with a reference table).
    "select c_name, n_name, count(*), sum(o_totalprice) from ORDERS join CUSTOMER on c_custkey = o_custkey \
     join nation on n_nationkey = c_nation group by c_name, n_name order by 1, 2",
    // A self-join not on the key.
    "select a.o_orderkey, count(*) from ORDERS a join ORDERS b on a.o_custkey = b.o_custkey \
     and a.o_orderkey < b.o_orderkey group by 1 order by 1",
    // Aggregates the merge cannot finish.
    "select o_custkey, string_agg(o_comment, ',' order by o_orderkey) from ORDERS group by 1 order by 1",
    "select percentile_cont(0.5) within group (order by o_totalprice), stddev(o_totalprice)::numeric(20,6) from ORDERS",
    "select array_agg(o_orderkey order by o_orderkey) from ORDERS where o_custkey = 3",
    // DISTINCT ON, ROLLUP.
    "select distinct on (o_custkey) o_custkey, o_orderkey, o_totalprice from ORDERS \
     order by o_custkey, o_totalprice desc, o_orderkey",
    "select o_custkey % 3 as m, o_status, count(*), sum(o_totalprice) from ORDERS \
     group by rollup (1, 2) order by 1 nulls last, 2 nulls last",
    // A table of group 0 only joined with a distributed one.
    "select p_name, count(*) from ORDERS join promo on p_custkey = o_custkey group by 1 order by 1",
    // TPC-H shapes: Q18 (IN over a grouped subquery), Q13 (outer join, nested aggregate),
    // Q22-like (scalar subquery).
    "select c_name, o_orderkey, sum(l_quantity) from CUSTOMER, ORDERS, LINEITEM \
     where o_orderkey in (select l_orderkey from LINEITEM group by l_orderkey having sum(l_quantity) > 20) \
     and c_custkey = o_custkey and o_orderkey = l_orderkey \
     group by c_name, o_orderkey order by 3 desc, 2 limit 10",
    "select c_count, count(*) as custdist from (select c_custkey, count(o_orderkey) c_count \
     from CUSTOMER left outer join ORDERS on c_custkey = o_custkey and o_comment not like '%7%' \
     group by c_custkey) as c_orders group by c_count order by custdist desc, c_count desc",
    "select count(*) from ORDERS where o_totalprice > (select avg(o_totalprice) from ORDERS)",
];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reads_the_fast_paths_refuse_answer_as_one_server() {
    let c = cluster();
    c.up(&["--shards", "2", "--replicas", "0"]);
    let url = c.url(&[]);
    let group0 = c.url(&["--group", "0", "--primary"]);
    tokio::time::timeout(LIMIT, async {
        let client = connect(&url).await;
        set_up(&client).await;
        for shape in SHAPES {
            let started = std::time::Instant::now();
            let herd = simple(&client, &over(shape, false)).await;
            let one = simple(&client, &over(shape, true)).await;
            assert!(!one.is_empty(), "{shape}: no rows to compare");
            assert_eq!(herd, one, "{shape}");
            eprintln!("{:>5} ms  {shape}", started.elapsed().as_millis());
        }
        // They took the general path (and not some fast path).
        let explained = simple(
            &client,
            "select herd.explain('select distinct on (o_custkey) o_custkey from orders')",
        )
        .await;
        let explained = explained[0][0].as_deref().unwrap_or_default();
        assert!(explained.contains("general path"), "{explained}");
        extended(&client).await;
        transactions(&client, &group0).await;
        still_refused(&client).await;
        privileges(&client, &url).await;
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
                     o_status text, o_totalprice numeric(12,2), o_comment text)"
                ),
                &format!(
                    "create table lineitem{s} (l_orderkey bigint, l_linenumber int, \
                     l_quantity int, primary key (l_orderkey, l_linenumber))"
                ),
                &format!(
                    "create table customer{s} (c_custkey bigint primary key, c_name text, \
                     c_nation int)"
                ),
            ],
        )
        .await;
    }
    run_all(
        client,
        &[
            "create table nation (n_nationkey int primary key, n_name text)",
            "create table promo (p_custkey bigint primary key, p_name text)",
            "select herd.create_distributed_table('orders', 'o_orderkey')",
            "select herd.create_distributed_table('lineitem', 'l_orderkey')",
            "select herd.create_distributed_table('customer', 'c_custkey')",
            "select herd.create_reference_table('nation')",
            "insert into nation values (0, 'ALGERIA'), (1, 'BRAZIL'), (2, 'CHINA'), (3, 'EGYPT')",
            "insert into promo values (2, 'spring'), (5, 'summer'), (7, 'autumn')",
        ],
    )
    .await;
    let orders: Vec<String> = (1..=80i64)
        .map(|k| {
            format!(
                "({k}, {}, '{}', {}.{:02}, 'c{k}')",
                k % 13,
                ["F", "O", "P"][(k % 3) as usize],
                (k * 37) % 150,
                k % 100
            )
        })
        .collect();
    let lines: Vec<String> = (1..=80i64)
        .flat_map(|k| (1..=(k % 4 + 1)).map(move |n| format!("({k}, {n}, {})", (k * n) % 11 + 1)))
        .collect();
    let customers: Vec<String> = (0..15i64)
        .map(|k| format!("({k}, 'Customer#{k:03}', {})", k % 4))
        .collect();
    for s in ["", "_one"] {
        run_all(
            client,
            &[
                &format!("insert into orders{s} values {}", orders.join(", ")),
                &format!("insert into lineitem{s} values {}", lines.join(", ")),
                &format!("insert into customer{s} values {}", customers.join(", ")),
            ],
        )
        .await;
    }
}

/// The extended protocol: a prepared statement with parameters, bound in later messages.
async fn extended(client: &Client) {
    let shape = "select o_orderkey, rank() over (order by o_totalprice desc, o_orderkey) \
                 from ORDERS where o_custkey = any ($1) and o_totalprice > $2::float8 order by 1";
    let keys: Vec<i64> = vec![1, 2, 5];
    let price = 20f64;
    let (keys, price) = (&keys, &price);
    let run = |sql: String| async move {
        let statement = client.prepare(&sql).await.expect("prepare");
        client
            .query(&statement, &[keys, price])
            .await
            .unwrap_or_else(|e| panic!("{sql}: {e:?}"))
            .iter()
            .map(|r| (r.get::<_, i64>(0), r.get::<_, i64>(1)))
            .collect::<Vec<_>>()
    };
    let herd = run(over(shape, false)).await;
    let one = run(over(shape, true)).await;
    assert!(!one.is_empty());
    assert_eq!(herd, one, "extended protocol");
    // The same statement bound again (a named statement kept by the proxy).
    let statement = client
        .prepare("select count(*) from orders where o_custkey in (select c_custkey from customer where c_nation = $1)")
        .await
        .expect("prepare");
    for nation in 0..4i32 {
        let herd: i64 = client
            .query_one(&statement, &[&nation])
            .await
            .expect("general read by Bind")
            .get(0);
        let one: i64 = client
            .query_one(
                "select count(*) from orders_one where o_custkey in (select c_custkey from customer_one where c_nation = $1)",
                &[&nation],
            )
            .await
            .expect("one server")
            .get(0);
        assert_eq!(herd, one, "nation {nation}");
    }
}

/// Inside a transaction block: answered while it has not written; refused once it has
/// (postgres_fdw's remote reads would not see its writes).
async fn transactions(client: &Client, group0: &str) {
    let direct = connect(group0).await;
    let on_group0: i64 = simple(&direct, "select min(o_orderkey) from orders").await[0][0]
        .as_deref()
        .expect("a row on group 0")
        .parse()
        .expect("a key");
    let general = "select count(*) from orders where o_custkey in (select c_custkey from customer)";
    let want = simple(
        client,
        "select count(*) from orders_one where o_custkey in (select c_custkey from customer_one)",
    )
    .await;
    client.batch_execute("begin").await.expect("begin");
    simple(
        client,
        &format!("select * from orders where o_orderkey = {on_group0}"),
    )
    .await;
    assert_eq!(
        simple(client, general).await,
        want,
        "in a transaction block"
    );
    client
        .batch_execute(&format!(
            "update orders set o_comment = 'x' where o_orderkey = {on_group0}"
        ))
        .await
        .expect("update");
    refused(client, general, "transaction").await;
    client.batch_execute("rollback").await.expect("rollback");
    assert_eq!(simple(client, general).await, want, "after the transaction");
}

/// Writes keep their refusals: the general path is read-only.
async fn still_refused(client: &Client) {
    for sql in [
        "update orders set o_comment = 'y' where o_custkey in (select c_custkey from customer where c_nation = 1)",
        "delete from orders where o_custkey in (select c_custkey from customer where c_nation = 1)",
        "select * from orders where o_custkey in (select c_custkey from customer) for update",
    ] {
        let e = client.simple_query(sql).await.expect_err(sql);
        assert_eq!(
            e.code(),
            Some(&tokio_postgres::error::SqlState::FEATURE_NOT_SUPPORTED),
            "{sql}: {e}"
        );
    }
    // Nothing changed.
    assert_eq!(
        simple(client, "select count(*) from orders where o_comment = 'y'").await,
        vec![vec![Some("0".to_string())]]
    );
}

/// A role reads on the general path what it may SELECT, and is refused (42501) the rest, as
/// on one server; a GRANT is followed once the catalog is read again (names are kept 3 s).
async fn privileges(client: &Client, url: &str) {
    run_all(
        client,
        &[
            "create role reader login password 'reader-secret'",
            "grant select on customer to reader",
        ],
    )
    .await;
    let (_, host) = url.split_once('@').expect("url with credentials");
    let reader = connect(&format!("postgresql://reader:reader-secret@{host}")).await;
    let window = "select c_custkey, rank() over (order by c_name) from customer order by 1";
    let got = granted(&reader, window).await;
    let want = simple(
        client,
        "select c_custkey, rank() over (order by c_name) from customer_one order by 1",
    )
    .await;
    assert_eq!(got, want);
    let across = "select count(*) from orders where o_custkey in (select c_custkey from customer)";
    let e = reader
        .simple_query(across)
        .await
        .expect_err("no SELECT on orders");
    assert_eq!(
        e.code(),
        Some(&tokio_postgres::error::SqlState::INSUFFICIENT_PRIVILEGE),
        "{e}"
    );
    run_all(client, &["grant select on orders to reader"]).await;
    granted(&reader, across).await;
}

/// The rows of `sql`, once a GRANT made just before is followed (42501 until then, at most
/// a few seconds).
async fn granted(client: &Client, sql: &str) -> Vec<Vec<Option<String>>> {
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    loop {
        match client.simple_query(sql).await {
            Ok(_) => return simple(client, sql).await,
            Err(e) if std::time::Instant::now() < deadline => {
                assert_eq!(
                    e.code(),
                    Some(&tokio_postgres::error::SqlState::INSUFFICIENT_PRIVILEGE),
                    "{e}"
                );
                tokio::time::sleep(Duration::from_millis(300)).await;
            }
            Err(e) => panic!("the grant was not followed: {e}"),
        }
    }
}
