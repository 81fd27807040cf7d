//! COPY through the endpoint on a 2-group cluster: FROM STDIN split by key (text, CSV, binary),
//! into a table of group 0 only, TO STDOUT gathered from every group, and a bad key failing the
//! whole load.

use crate::common::connect;
use herd_testkit::TestCluster;
use std::time::Duration;
use tokio_postgres::error::SqlState;

/// Runs the COPY phase through `client` on the distributed table `orders`.
pub async fn split_and_gathered(c: &TestCluster, client: &tokio_postgres::Client) {
    // COPY FROM STDIN is split by key (text, CSV with a header, binary); the count is the total.
    use futures_util::SinkExt;
    let sink = client
        .copy_in("copy orders (customer_id, v) from stdin")
        .await
        .expect("copy text");
    let text: String = (1000..1100).map(|k| format!("{k}\tc{k}\n")).collect();
    futures_util::pin_mut!(sink);
    sink.send(bytes::Bytes::from(text)).await.expect("send");
    assert_eq!(sink.finish().await.expect("finish"), 100);
    let sink = client
        .copy_in("copy orders (v, customer_id) from stdin with (format csv, header)")
        .await
        .expect("copy csv");
    let csv: String = std::iter::once("v,customer_id\n".to_string())
        .chain((1100..1150).map(|k| format!("\"c,{k}\",{k}\n")))
        .collect();
    futures_util::pin_mut!(sink);
    sink.send(bytes::Bytes::from(csv)).await.expect("send");
    assert_eq!(sink.finish().await.expect("finish"), 50);
    let sink = client
        .copy_in("copy orders (customer_id, v) from stdin with (format binary)")
        .await
        .expect("copy binary");
    let writer = tokio_postgres::binary_copy::BinaryCopyInWriter::new(
        sink,
        &[
            tokio_postgres::types::Type::INT8,
            tokio_postgres::types::Type::TEXT,
        ],
    );
    futures_util::pin_mut!(writer);
    for k in 1150..1160i64 {
        writer
            .as_mut()
            .write(&[&k, &format!("b{k}")])
            .await
            .expect("row");
    }
    assert_eq!(writer.finish().await.expect("finish"), 10);
    let loaded = client
        .query_one("select v from orders where customer_id = $1", &[&1125i64])
        .await
        .expect("a CSV row by key");
    assert_eq!(loaded.get::<_, String>(0), "c,1125");
    // COPY FROM STDIN into a table that is not distributed (it lives on group 0) streams to
    // group 0 as on one server: many CopyData messages after the server's CopyInResponse (they
    // once waited behind the sharded session's rule for new units, and the COPY hung).
    client
        .batch_execute("create table copy_log (id int primary key, note text)")
        .await
        .expect("a table of group 0");
    let sink = client
        .copy_in("copy copy_log from stdin")
        .await
        .expect("copy into a table of group 0");
    futures_util::pin_mut!(sink);
    for chunk in 0..20 {
        let text: String = (chunk * 1000..(chunk + 1) * 1000)
            .map(|k| format!("{k}\tnote {k}\n"))
            .collect();
        sink.send(bytes::Bytes::from(text)).await.expect("send");
    }
    let copied = tokio::time::timeout(Duration::from_secs(60), sink.finish())
        .await
        .expect("the COPY into group 0's table ends")
        .expect("finish");
    assert_eq!(copied, 20_000);
    let n: i64 = client
        .query_one("select count(*) from copy_log", &[])
        .await
        .expect("count")
        .get(0);
    assert_eq!(n, 20_000);
    // COPY TO STDOUT gathers every group's rows: one header, one binary signature and trailer.
    let mut direct_rows = Vec::new();
    for g in 0..2u32 {
        let direct = connect(&c.url(&["--group", &g.to_string(), "--primary"])).await;
        let text = copy_out_text(&direct, "copy orders (customer_id, v) to stdout").await;
        assert!(!text.is_empty(), "group {g} holds rows");
        direct_rows.extend(text.lines().map(str::to_string));
    }
    direct_rows.sort();
    let through = copy_out_text(client, "copy orders (customer_id, v) to stdout").await;
    let mut rows: Vec<String> = through.lines().map(str::to_string).collect();
    rows.sort();
    assert_eq!(rows, direct_rows, "every group's rows, each once");
    let csv = copy_out_text(
        client,
        "copy orders (customer_id, v) to stdout with (format csv, header)",
    )
    .await;
    assert_eq!(csv.lines().next(), Some("customer_id,v"));
    assert_eq!(csv.lines().filter(|l| *l == "customer_id,v").count(), 1);
    assert_eq!(csv.lines().count(), direct_rows.len() + 1);
    let stream = client
        .copy_out("copy orders (customer_id, v) to stdout with (format binary)")
        .await
        .expect("binary copy out");
    let binary = tokio_postgres::binary_copy::BinaryCopyOutStream::new(
        stream,
        &[
            tokio_postgres::types::Type::INT8,
            tokio_postgres::types::Type::TEXT,
        ],
    );
    use futures_util::TryStreamExt;
    let mut keys: Vec<i64> = binary
        .map_ok(|row| row.get::<i64>(0))
        .try_collect()
        .await
        .expect("binary rows: one signature, one trailer");
    keys.sort();
    let mut want: Vec<i64> = direct_rows
        .iter()
        .filter_map(|l| l.split('\t').next()?.parse().ok())
        .collect();
    want.sort();
    assert_eq!(keys, want);

    // A bad key fails the whole load: no group keeps any of its rows.
    let sink = client
        .copy_in("copy orders (customer_id, v) from stdin")
        .await
        .expect("copy");
    futures_util::pin_mut!(sink);
    sink.send(bytes::Bytes::from("2000\tok\nnot-a-number\tbad\n"))
        .await
        .expect("send");
    let e = sink.finish().await.expect_err("bad key");
    assert_eq!(e.code(), Some(&SqlState::BAD_COPY_FILE_FORMAT), "{e}");
    let none = client
        .query_one("select count(*) from orders where customer_id = 2000", &[])
        .await
        .expect("count");
    assert_eq!(none.get::<_, i64>(0), 0);
}

/// The text a `COPY … TO STDOUT` sends.
async fn copy_out_text(client: &tokio_postgres::Client, sql: &str) -> String {
    use futures_util::TryStreamExt;
    let stream = client.copy_out(sql).await.expect("copy out");
    let chunks: Vec<bytes::Bytes> = stream.try_collect().await.expect("copy data");
    chunks
        .iter()
        .map(|c| String::from_utf8_lossy(c).into_owned())
        .collect()
}
