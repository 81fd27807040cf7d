//! TPC-H's 22 queries through Herd on 2 shard groups (`HERD_TPCH_GROUPS` for more) against one
//! server (issue #40): data from the `tpchgen` crate at scale factor 0.01, loaded through the
//! endpoint twice — into schema
//! `public`, where lineitem/orders are distributed by orderkey, customer by custkey,
//! part/partsupp by partkey and nation/region/supplier are reference tables, and into schema
//! `one`, plain tables on group 0 (one server). Each query (tpchgen's text with the
//! specification's validation parameters; Q15 as the specification writes it: a view over
//! lineitem, the query reading it, the view dropped, each statement sent alone) runs under `search_path = public` and `search_path = one`,
//! and the answers must hold the same rows. Rows are compared as sorted multisets: without
//! the specification's LIMITs several queries order on values that tie, and the order among
//! ties is any server's choice.

mod common;

use std::fmt::Display;
use std::time::{Duration, Instant};

use common::{cluster, connect, run_all};
use futures_util::SinkExt;
use tokio_postgres::Client;
use tpchgen::generators::{
    CustomerGenerator, LineItemGenerator, NationGenerator, OrderGenerator, PartGenerator,
    PartSuppGenerator, RegionGenerator, SupplierGenerator,
};

/// The whole test's bound (a cluster start included).
const LIMIT: Duration = Duration::from_secs(170);

/// Scale factor: 15,000 orders, about 60,000 lineitems.
const SF: f64 = 0.01;

const TABLES: &str = "
create table nation (n_nationkey int primary key, n_name text, n_regionkey int, n_comment text);
create table region (r_regionkey int primary key, r_name text, r_comment text);
create table part (p_partkey bigint primary key, p_name text, p_mfgr text, p_brand text,
    p_type text, p_size int, p_container text, p_retailprice numeric(15,2), p_comment text);
create table supplier (s_suppkey bigint primary key, s_name text, s_address text,
    s_nationkey int, s_phone text, s_acctbal numeric(15,2), s_comment text);
create table partsupp (ps_partkey bigint, ps_suppkey bigint, ps_availqty int,
    ps_supplycost numeric(15,2), ps_comment text, primary key (ps_partkey, ps_suppkey));
create table customer (c_custkey bigint primary key, c_name text, c_address text,
    c_nationkey int, c_phone text, c_acctbal numeric(15,2), c_mktsegment text, c_comment text);
create table orders (o_orderkey bigint primary key, o_custkey bigint, o_orderstatus text,
    o_totalprice numeric(15,2), o_orderdate date, o_orderpriority text, o_clerk text,
    o_shippriority int, o_comment text);
create table lineitem (l_orderkey bigint, l_partkey bigint, l_suppkey bigint, l_linenumber int,
    l_quantity numeric(15,2), l_extendedprice numeric(15,2), l_discount numeric(15,2),
    l_tax numeric(15,2), l_returnflag text, l_linestatus text, l_shipdate date,
    l_commitdate date, l_receiptdate date, l_shipinstruct text, l_shipmode text,
    l_comment text, primary key (l_orderkey, l_linenumber));";

/// The validation parameters of each query (`:1`, `:2`, … in order).
fn parameters(q: i32) -> Vec<&'static str> {
    match q {
        1 => vec!["90"],
        2 => vec!["15", "BRASS", "EUROPE"],
        3 => vec!["BUILDING", "1995-03-15"],
        4 => vec!["1993-07-01"],
        5 => vec!["ASIA", "1994-01-01"],
        6 => vec!["1994-01-01", "0.06", "24"],
        7 => vec!["FRANCE", "GERMANY"],
        8 => vec!["BRAZIL", "AMERICA", "ECONOMY ANODIZED STEEL"],
        9 => vec!["green"],
        10 => vec!["1993-10-01"],
        // FRACTION is 0.0001 / SF.
        11 => vec!["GERMANY", "0.01"],
        12 => vec!["MAIL", "SHIP", "1994-01-01"],
        13 => vec!["special", "requests"],
        14 => vec!["1995-09-01"],
        15 => vec!["1996-01-01"],
        16 => vec![
            "Brand#45",
            "MEDIUM POLISHED",
            "49",
            "14",
            "23",
            "45",
            "19",
            "3",
            "36",
            "9",
        ],
        17 => vec!["Brand#23", "MED BOX"],
        18 => vec!["300"],
        19 => vec!["Brand#12", "Brand#23", "Brand#34", "1", "10", "20"],
        20 => vec!["forest", "1994-01-01", "CANADA"],
        21 => vec!["SAUDI ARABIA"],
        22 => vec!["13", "31", "23", "29", "30", "18", "17"],
        _ => vec![],
    }
}

/// Query `q` as run: parameters put in (the highest first, so `:1` does not eat `:10`).
fn query(q: i32) -> String {
    let mut sql = tpchgen::q_and_a::queries::query(q)
        .unwrap_or_else(|| panic!("no Q{q}"))
        .to_string();
    for (i, value) in parameters(q).iter().enumerate().rev() {
        sql = sql.replace(&format!(":{}", i + 1), value);
    }
    // `interval '90' day (3)` is SQL's, not PostgreSQL's; Q15's stream number.
    sql.replace(" day (3)", " day")
        .replace("revenue:s", "revenue0")
}

/// Query `q` as its statements, each sent alone: Q15 is a view over lineitem, the query
/// reading it, and the view dropped (the specification's text); the others are one query.
/// The query compared is the one that returns rows.
fn statements(q: i32) -> (Vec<String>, String, Vec<String>) {
    let sql = query(q);
    let parts: Vec<String> = sql
        .split(';')
        .map(|p| p.trim().to_string())
        .filter(|p| !p.is_empty())
        .collect();
    match parts.as_slice() {
        [create, select, drop] => (vec![create.clone()], select.clone(), vec![drop.clone()]),
        _ => (Vec::new(), sql, Vec::new()),
    }
}

/// Rows of a simple query as text, sorted.
async fn rows(client: &Client, sql: &str) -> Vec<Vec<Option<String>>> {
    let mut rows = common::text_rows(client, sql).await;
    rows.sort();
    rows
}

/// The generator's rows as COPY text (`|`-separated, without the trailing `|`).
fn tbl<T: Display>(items: impl Iterator<Item = T>) -> String {
    let mut out = String::new();
    for item in items {
        let line = item.to_string();
        out.push_str(line.strip_suffix('|').unwrap_or(&line));
        out.push('\n');
    }
    out
}

async fn copy(client: &Client, table: &str, data: &str) {
    let sink = client
        .copy_in(&format!("copy {table} from stdin"))
        .await
        .unwrap_or_else(|e| panic!("copy {table}: {e:?}"));
    futures_util::pin_mut!(sink);
    // The text format's default delimiter (TPC-H's text has no tabs nor backslashes).
    sink.send(bytes::Bytes::from(data.replace('|', "\t")))
        .await
        .unwrap_or_else(|e| panic!("copy {table}: {e:?}"));
    sink.finish()
        .await
        .unwrap_or_else(|e| panic!("copy {table}: {e:?}"));
}

/// A reference table's rows as INSERTs of 2,000 rows each (every group gets the same copy).
async fn insert(client: &Client, table: &str, data: &str) {
    let rows: Vec<String> = data
        .lines()
        .map(|l| {
            let values: Vec<String> = l
                .split('|')
                .map(|v| format!("'{}'", v.replace('\'', "''")))
                .collect();
            format!("({})", values.join(", "))
        })
        .collect();
    for chunk in rows.chunks(2000) {
        client
            .batch_execute(&format!("insert into {table} values {}", chunk.join(", ")))
            .await
            .unwrap_or_else(|e| panic!("insert {table}: {e:?}"));
    }
}

/// Loads both layouts: through the endpoint (`client`), and the one-server copies directly on
/// group 0's server (`group0`; COPY FROM STDIN into a table that is not distributed hangs
/// through the endpoint of a sharded cluster — a finding of this test, left to its own fix).
async fn load(client: &Client, group0: &Client) {
    run_all(client, &["create schema one"]).await;
    client.batch_execute(TABLES).await.expect("tables");
    client
        .batch_execute(&TABLES.replace("create table ", "create table one."))
        .await
        .expect("one-server tables");
    run_all(
        client,
        &[
            "select herd.create_distributed_table('orders', 'o_orderkey')",
            "select herd.create_distributed_table('lineitem', 'l_orderkey')",
            "select herd.create_distributed_table('customer', 'c_custkey')",
            "select herd.create_distributed_table('part', 'p_partkey')",
            "select herd.create_distributed_table('partsupp', 'ps_partkey')",
            "select herd.create_reference_table('nation')",
            "select herd.create_reference_table('region')",
            "select herd.create_reference_table('supplier')",
        ],
    )
    .await;
    let data = [
        ("nation", tbl(NationGenerator::new(SF, 1, 1).iter())),
        ("region", tbl(RegionGenerator::new(SF, 1, 1).iter())),
        ("supplier", tbl(SupplierGenerator::new(SF, 1, 1).iter())),
        ("part", tbl(PartGenerator::new(SF, 1, 1).iter())),
        ("partsupp", tbl(PartSuppGenerator::new(SF, 1, 1).iter())),
        ("customer", tbl(CustomerGenerator::new(SF, 1, 1).iter())),
        ("orders", tbl(OrderGenerator::new(SF, 1, 1).iter())),
        ("lineitem", tbl(LineItemGenerator::new(SF, 1, 1).iter())),
    ];
    for (table, rows) in &data {
        let at = Instant::now();
        if matches!(*table, "nation" | "region" | "supplier") {
            insert(client, table, rows).await;
        } else {
            copy(client, table, rows).await;
        }
        let herd_ms = at.elapsed().as_millis();
        copy(group0, &format!("one.{table}"), rows).await;
        eprintln!(
            "{table}: {} rows, through Herd {herd_ms} ms, one server {} ms",
            rows.lines().count(),
            at.elapsed().as_millis() - herd_ms
        );
    }
    run_all(group0, &["analyze"]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tpch_queries_answer_as_one_server() {
    // 2 groups in CI; `HERD_TPCH_GROUPS=4` for more (a bad value fails the test).
    let groups = std::env::var("HERD_TPCH_GROUPS").map_or(2, |v| {
        v.trim()
            .parse::<u32>()
            .ok()
            .filter(|n| (2..=8).contains(n))
            .unwrap_or_else(|| panic!("HERD_TPCH_GROUPS={v}: a number of groups from 2 to 8"))
    });
    let c = cluster();
    c.up(&["--shards", &groups.to_string(), "--replicas", "0"]);
    let url = c.url(&[]);
    let group0 = c.url(&["--group", "0", "--primary"]);
    tokio::time::timeout(LIMIT, async {
        let client = connect(&url).await;
        let group0 = connect(&group0).await;
        let started = Instant::now();
        load(&client, &group0).await;
        eprintln!(
            "loaded SF {SF} twice in {} ms",
            started.elapsed().as_millis()
        );
        let lineitems = rows(&client, "select count(*) from lineitem").await;
        assert_eq!(
            lineitems,
            rows(&client, "select count(*) from one.lineitem").await
        );
        for q in 1..=22 {
            let (before, sql, after) = statements(q);
            let at = Instant::now();
            client
                .batch_execute("set search_path = public")
                .await
                .expect("path");
            for b in &before {
                run_all(&client, &[b]).await;
            }
            let herd = rows(&client, &sql).await;
            let herd_ms = at.elapsed().as_millis();
            let explained: String = client
                .query_one("select herd.explain($1)", &[&sql])
                .await
                .expect("herd.explain")
                .get(0);
            let path = if explained.contains("general path") {
                "general"
            } else {
                "fast"
            };
            for a in &after {
                run_all(&client, &[a]).await;
            }
            client
                .batch_execute("set search_path = one")
                .await
                .expect("path");
            let at = Instant::now();
            for b in &before {
                run_all(&client, &[b]).await;
            }
            let one = rows(&client, &sql).await;
            for a in &after {
                run_all(&client, &[a]).await;
            }
            let one_ms = at.elapsed().as_millis();
            assert_eq!(herd, one, "Q{q}:\n{sql}");
            eprintln!(
                "Q{q:<2} {:>4} rows  herd {herd_ms:>5} ms ({path:<7})  one server {one_ms:>5} ms",
                one.len()
            );
        }
    })
    .await
    .expect("the test's time limit");
}
