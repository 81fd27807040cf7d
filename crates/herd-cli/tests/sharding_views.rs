//! Views over distributed tables (issue #40, docs/sharding-general.md "Views over distributed
//! tables"): `CREATE VIEW` over distributed tables is made on group 0 as written, and a read of
//! the view is answered on the general path over its global view (`herd_global.v_<oid>`).
//! Through the endpoint of one 2-group cluster, every read must answer as one server answers
//! the same views over the same rows (one-server copies: tables that live on group 0 only):
//! a join not on the key, an aggregate, a view over a view, a view mixing a distributed, a
//! reference and a group-0 table, `security_barrier`, CREATE OR REPLACE VIEW, DROP VIEW, the
//! extended protocol, a transaction block, privileges; writes through such views, temporary
//! and materialized views over distributed tables stay refused.

mod common;

use std::time::Duration;

use common::{cluster, connect, refused, run_all, text_rows as simple};
use tokio_postgres::error::SqlState;
use tokio_postgres::Client;

/// The whole test's bound (a cluster start included).
const LIMIT: Duration = Duration::from_secs(150);

/// `sql` over the distributed tables and views, or over their one-server copies.
fn over(sql: &str, one: bool) -> String {
    let s = if one { "_one" } else { "" };
    let mut out = sql.to_string();
    for name in [
        "ORDERS", "CUSTOMER", "V_JOIN", "V_AGG", "V_OVER", "V_MIXED", "V_SB",
    ] {
        out = out.replace(name, &format!("{}{s}", name.to_lowercase()));
    }
    out
}

/// The views, each made over the distributed tables and over the one-server copies.
const VIEWS: &[&str] = &[
    // A join not on the key.
    "create view V_JOIN as select c_name, o_orderkey, o_totalprice \
     from ORDERS join CUSTOMER on c_custkey = o_custkey",
    // An aggregate.
    "create view V_AGG as select o_custkey, count(*) as n, sum(o_totalprice) as total \
     from ORDERS group by o_custkey",
    // A view over a view, with column names of its own.
    "create view V_OVER (cust, big_total) as select o_custkey, total from V_AGG where n > 5",
    // A distributed, a reference and a group-0 table.
    "create view V_MIXED as select p_name, n_name, o_orderkey from ORDERS \
     join promo on p_custkey = o_custkey join CUSTOMER on c_custkey = o_custkey \
     join nation on n_nationkey = c_nation",
    // security_barrier kept.
    "create view V_SB with (security_barrier) as select o_orderkey, o_status from ORDERS \
     where o_status <> 'P'",
];

/// Reads compared (each ordered completely, so one answer is right).
const READS: &[&str] = &[
    "select * from V_JOIN order by o_orderkey",
    "select c_name, count(*), sum(o_totalprice) from V_JOIN group by 1 order by 1",
    "select * from V_AGG order by o_custkey",
    "select * from V_OVER order by cust",
    "select v.cust, a.n from V_OVER v join V_AGG a on a.o_custkey = v.cust order by 1",
    "select * from V_MIXED order by o_orderkey",
    "select * from V_SB where o_orderkey < 30 order by 1",
    "select count(*) from V_AGG where o_custkey in (select o_custkey from ORDERS where o_status = 'F')",
];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn views_over_distributed_tables_answer_as_one_server() {
    let c = cluster();
    c.up(&["--shards", "2", "--replicas", "0"]);
    let url = c.url(&[]);
    tokio::time::timeout(LIMIT, async {
        let client = connect(&url).await;
        set_up(&client).await;
        for one in [false, true] {
            for v in VIEWS {
                run_all(&client, &[&over(v, one)]).await;
            }
        }
        compare_reads(&client).await;
        let explained = simple(&client, "select herd.explain('select * from v_agg')").await;
        let explained = explained[0][0].as_deref().unwrap_or_default();
        assert!(explained.contains("general path"), "{explained}");
        extended(&client).await;
        wrapped(&client).await;
        replace_and_drop(&client).await;
        transactions(&client).await;
        still_refused(&client).await;
        privileges(&client, &url).await;
        unknown_path(&url).await;
    })
    .await
    .expect("the test's time limit");
}

async fn compare_reads(client: &Client) {
    for read in READS {
        let started = std::time::Instant::now();
        let herd = simple(client, &over(read, false)).await;
        let one = simple(client, &over(read, true)).await;
        assert!(!one.is_empty(), "{read}: no rows to compare");
        assert_eq!(herd, one, "{read}");
        eprintln!("{:>5} ms  {read}", started.elapsed().as_millis());
    }
}

async fn set_up(client: &Client) {
    for s in ["", "_one"] {
        run_all(
            client,
            &[
                &format!(
                    "create table orders{s} (o_orderkey bigint primary key, o_custkey bigint, \
                     o_status text, o_totalprice numeric(12,2))"
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
            "select herd.create_distributed_table('customer', 'c_custkey')",
            "select herd.create_reference_table('nation')",
            "insert into nation values (0, 'ALGERIA'), (1, 'BRAZIL'), (2, 'CHINA'), (3, 'EGYPT')",
            "insert into promo values (2, 'spring'), (5, 'summer'), (7, 'autumn')",
        ],
    )
    .await;
    let orders: Vec<String> = (1..=90i64)
        .map(|k| {
            format!(
                "({k}, {}, '{}', {}.{:02})",
                k % 11,
                ["F", "O", "P"][(k % 3) as usize],
                (k * 37) % 150,
                k % 100
            )
        })
        .collect();
    let customers: Vec<String> = (0..12i64)
        .map(|k| format!("({k}, 'Customer#{k:03}', {})", k % 4))
        .collect();
    for s in ["", "_one"] {
        run_all(
            client,
            &[
                &format!("insert into orders{s} values {}", orders.join(", ")),
                &format!("insert into customer{s} values {}", customers.join(", ")),
            ],
        )
        .await;
    }
}

/// A view read by the extended protocol, with a parameter.
async fn extended(client: &Client) {
    let sql = "select o_custkey, total::text from V_AGG where n >= $1 order by 1";
    let mut answers = Vec::new();
    for one in [false, true] {
        let statement = client.prepare(&over(sql, one)).await.expect("prepare");
        let rows = client
            .query(&statement, &[&7i64])
            .await
            .unwrap_or_else(|e| panic!("{sql}: {e:?}"));
        let rows: Vec<(i64, String)> = rows
            .iter()
            .map(|r| (r.get::<_, i64>(0), r.get::<_, String>(1)))
            .collect();
        answers.push(rows);
    }
    assert!(!answers[1].is_empty());
    assert_eq!(answers[0], answers[1], "extended protocol");
}

/// A cursor and `COPY (SELECT …) TO STDOUT` over a view, as over a read across groups.
async fn wrapped(client: &Client) {
    let mut fetched = Vec::new();
    for one in [false, true] {
        let sql = over(
            "declare c cursor for select * from V_AGG order by o_custkey",
            one,
        );
        client.batch_execute("begin").await.expect("begin");
        client.batch_execute(&sql).await.expect("declare");
        fetched.push(simple(client, "fetch 4 from c").await);
        fetched.push(simple(client, "fetch all from c").await);
        client.batch_execute("commit").await.expect("commit");
    }
    assert!(!fetched[0].is_empty());
    assert_eq!(fetched[0..2], fetched[2..4], "cursor over a view");
    let mut copied = Vec::new();
    for one in [false, true] {
        let sql = over(
            "copy (select * from V_JOIN order by o_orderkey) to stdout (format csv)",
            one,
        );
        let stream = client.copy_out(&sql).await.expect("copy out");
        let chunks: Vec<bytes::Bytes> = futures_util::TryStreamExt::try_collect(stream)
            .await
            .expect("copy data");
        copied.push(chunks.concat());
    }
    assert!(!copied[0].is_empty());
    assert_eq!(copied[0], copied[1], "COPY (SELECT … FROM view) TO STDOUT");
    // In a block that made a table first (the catalog's names forgotten by the DDL): read
    // over the global view still, as one server answers.
    let read = "select * from V_AGG order by o_custkey";
    let want = simple(client, &over(read, true)).await;
    client
        .batch_execute("begin; create table made_in_block (a int)")
        .await
        .expect("ddl in a block");
    match client.simple_query(&over(read, false)).await {
        Ok(_) => assert_eq!(simple(client, &over(read, false)).await, want),
        Err(e) => assert_eq!(e.code(), Some(&SqlState::FEATURE_NOT_SUPPORTED), "{e}"),
    }
    client.batch_execute("rollback").await.expect("rollback");
}

/// CREATE OR REPLACE VIEW is followed at the next read; a dropped view is PostgreSQL's
/// error, as on one server.
async fn replace_and_drop(client: &Client) {
    for one in [false, true] {
        run_all(
            client,
            &[&over(
                "create or replace view V_AGG as select o_custkey, count(*) as n, \
                 sum(o_totalprice) as total, max(o_orderkey) as last from ORDERS \
                 where o_status <> 'O' group by o_custkey",
                one,
            )],
        )
        .await;
    }
    for read in [
        "select * from V_AGG order by o_custkey",
        "select * from V_OVER order by cust",
    ] {
        assert_eq!(
            simple(client, &over(read, false)).await,
            simple(client, &over(read, true)).await,
            "after CREATE OR REPLACE VIEW: {read}"
        );
    }
    let mut codes = Vec::new();
    for one in [false, true] {
        run_all(client, &[&over("drop view V_OVER", one)]).await;
        let e = client
            .simple_query(&over("select * from V_OVER", one))
            .await
            .expect_err("dropped");
        codes.push(e.code().cloned());
    }
    assert_eq!(codes[0], Some(SqlState::UNDEFINED_TABLE), "{codes:?}");
    assert_eq!(codes[0], codes[1]);
    // The others still read.
    compare_one(client, "select * from V_AGG order by o_custkey").await;
}

async fn compare_one(client: &Client, read: &str) {
    assert_eq!(
        simple(client, &over(read, false)).await,
        simple(client, &over(read, true)).await,
        "{read}"
    );
}

/// Inside a transaction block: as every general read, answered while the block has not
/// written, refused once it has.
async fn transactions(client: &Client) {
    let read = "select * from V_JOIN order by o_orderkey";
    let want = simple(client, &over(read, true)).await;
    client.batch_execute("begin").await.expect("begin");
    assert_eq!(simple(client, read).await, want, "in a transaction block");
    client
        .batch_execute("update orders set o_status = 'X' where o_orderkey = 1")
        .await
        .expect("update by key");
    refused(client, read, "transaction").await;
    client.batch_execute("rollback").await.expect("rollback");
    assert_eq!(simple(client, read).await, want, "after the transaction");
}

/// Writes through such views, temporary and materialized views over distributed tables, and
/// a function reading such a view: refused with the reason (0A000); nothing written.
async fn still_refused(client: &Client) {
    run_all(
        client,
        &["create view v_plain as select * from orders where o_status = 'F'"],
    )
    .await;
    for (sql, needle) in [
        (
            "insert into v_plain values (1000, 1, 'F', 1.00)",
            "a write through view public.v_plain is not supported",
        ),
        (
            "update v_plain set o_totalprice = 0 where o_orderkey = 3",
            "a write through view public.v_plain",
        ),
        ("delete from v_agg", "a write through view public.v_agg"),
        (
            "create temp view tv as select * from orders",
            "a temporary view over distributed tables",
        ),
        (
            "create temp view tv as select * from v_agg",
            "view public.v_agg reads distributed table public.orders",
        ),
        (
            "create materialized view mv as select * from orders",
            "CREATE MATERIALIZED VIEW",
        ),
        (
            "create materialized view mv as select * from v_agg",
            "view public.v_agg reads distributed table public.orders",
        ),
        (
            "create table t_copy as select * from v_join",
            "view public.v_join reads distributed table",
        ),
        ("select * from v_sb for update", "FOR UPDATE"),
    ] {
        refused(client, sql, needle).await;
    }
    compare_one(client, "select count(*), sum(o_totalprice) from ORDERS").await;
    // A materialized view over a reference table still lives on group 0, which holds every
    // row of it, and refreshes there.
    run_all(
        client,
        &[
            "create materialized view mv_nation as select * from nation",
            "insert into nation values (4, 'ETHIOPIA')",
            "refresh materialized view mv_nation",
        ],
    )
    .await;
    assert_eq!(
        simple(client, "select count(*) from mv_nation").await,
        vec![vec![Some("5".to_string())]]
    );
}

/// A search_path Herd does not follow (`set_config()`): which view a name means is not
/// known, so its read is refused rather than answered from group 0's rows.
async fn unknown_path(url: &str) {
    let client = connect(url).await;
    client
        .batch_execute("select set_config('search_path', 'public', false)")
        .await
        .expect("set_config");
    refused(&client, "select * from v_agg", "set_config").await;
    refused(&client, "select * from public.v_agg", "set_config").await;
}

/// A role reads a view it was granted over tables it may not read (the view's owner's
/// privileges apply, as on one server); a view made by a role that may not read the table
/// does not read it (42501).
async fn privileges(client: &Client, url: &str) {
    run_all(
        client,
        &[
            "create role viewer login password 'viewer-secret'",
            "grant select on v_join, v_join_one to viewer",
            "create schema viewer_s authorization viewer",
        ],
    )
    .await;
    let (_, host) = url.split_once('@').expect("url with credentials");
    let viewer = connect(&format!("postgresql://viewer:viewer-secret@{host}")).await;
    let read = "select * from V_JOIN order by o_orderkey";
    let got = granted(&viewer, &over(read, false)).await;
    assert_eq!(got, simple(&viewer, &over(read, true)).await);
    // Not the tables themselves.
    for one in [false, true] {
        let e = viewer
            .simple_query(&over("select count(*) from ORDERS", one))
            .await
            .expect_err("no SELECT on orders");
        assert_eq!(e.code(), Some(&SqlState::INSUFFICIENT_PRIVILEGE), "{e}");
    }
    // A security_invoker view: the reader's privileges on the tables apply.
    for one in [false, true] {
        let sql = over(
            "create view V_INV with (security_invoker) as select o_orderkey from ORDERS",
            one,
        )
        .replace("V_INV", if one { "v_inv_one" } else { "v_inv" });
        run_all(client, &[&sql]).await;
    }
    run_all(client, &["grant select on v_inv, v_inv_one to viewer"]).await;
    for name in ["v_inv_one", "v_inv"] {
        let deadline = std::time::Instant::now() + Duration::from_secs(20);
        loop {
            let e = viewer
                .simple_query(&format!("select count(*) from {name}"))
                .await
                .expect_err("security_invoker: no SELECT on orders");
            if e.code() == Some(&SqlState::INSUFFICIENT_PRIVILEGE)
                && e.as_db_error().is_some_and(|d| !d.message().contains(name))
            {
                break;
            }
            assert!(std::time::Instant::now() < deadline, "{name}: {e}");
            tokio::time::sleep(Duration::from_millis(300)).await;
        }
    }
    run_all(
        client,
        &[
            "grant select on orders to viewer",
            "grant select on orders_one to viewer",
        ],
    )
    .await;
    let herd = granted(&viewer, "select count(*) from v_inv").await;
    assert_eq!(
        herd,
        simple(&viewer, "select count(*) from v_inv_one").await
    );
    run_all(
        client,
        &[
            "revoke select on orders from viewer",
            "revoke select on orders_one from viewer",
        ],
    )
    .await;
    // Its own view over a table it may not read: refused at the read, as on one server.
    for one in [false, true] {
        let name = if one {
            "viewer_s.mine_one"
        } else {
            "viewer_s.mine"
        };
        let sql = over("create view NAME as select o_orderkey from ORDERS", one);
        run_all(&viewer, &[&sql.replace("NAME", name)]).await;
    }
    for name in ["viewer_s.mine_one", "viewer_s.mine"] {
        let deadline = std::time::Instant::now() + Duration::from_secs(20);
        loop {
            let e = viewer
                .simple_query(&format!("select count(*) from {name}"))
                .await
                .expect_err("no SELECT on orders through the view");
            if e.code() == Some(&SqlState::INSUFFICIENT_PRIVILEGE) {
                break;
            }
            // The catalog's names are read again within 3 s.
            assert!(std::time::Instant::now() < deadline, "{name}: {e}");
            tokio::time::sleep(Duration::from_millis(300)).await;
        }
    }
}

/// The rows of `sql`, once a GRANT made just before is followed (42501 until then, at most a
/// few seconds).
async fn granted(client: &Client, sql: &str) -> Vec<Vec<Option<String>>> {
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    loop {
        match client.simple_query(sql).await {
            Ok(_) => return simple(client, sql).await,
            Err(e) if std::time::Instant::now() < deadline => {
                assert_eq!(e.code(), Some(&SqlState::INSUFFICIENT_PRIVILEGE), "{e}");
                tokio::time::sleep(Duration::from_millis(300)).await;
            }
            Err(e) => panic!("the grant was not followed: {e}"),
        }
    }
}
