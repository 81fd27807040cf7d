//! Writes that read other tables or other statements' rows, through the endpoint and compared
//! with the same statements over the one-server copies: `UPDATE … FROM` a reference table,
//! `DELETE … USING` a co-located table joined on the key (with RETURNING), and data-modifying
//! `WITH` whose parts are all on one group by key. Refused with 0A000, nothing written: a join
//! not on the key (`UPDATE … FROM`, `DELETE … USING`, a subquery: the refusal says why the
//! general path takes no write), and a data-modifying `WITH` whose parts are on different
//! groups or on every group.

use tokio_postgres::Client;

use super::{affected, answer, connect, over, simple};

/// Both answers of `shape` (rows or completions), which must be equal as multisets (a
/// RETURNING list comes in no promised order, on one server as across groups).
async fn same(client: &Client, shape: &str) -> Vec<String> {
    let mut got = answer(client, &over(shape, false)).await;
    let mut want = answer(client, &over(shape, true)).await;
    got.sort();
    want.sort();
    assert_eq!(got, want, "{shape}");
    got
}

/// Both tables' rows, which must be equal.
async fn same_tables(client: &Client, what: &str) {
    for shape in [
        "select * from ORDERS order by o_orderkey",
        "select * from LINEITEM order by l_orderkey, l_linenumber",
    ] {
        assert_eq!(
            simple(client, &over(shape, false)).await,
            simple(client, &over(shape, true)).await,
            "{what}: {shape}"
        );
    }
}

/// Refused with 0A000 (only through the endpoint's distributed tables).
async fn refused_0a000(client: &Client, shape: &str, needle: &str) {
    let e = client
        .simple_query(&over(shape, false))
        .await
        .expect_err(shape);
    assert_eq!(e.code().map(|c| c.code()), Some("0A000"), "{shape}: {e:?}");
    let message = e
        .as_db_error()
        .map(|d| d.message().to_string())
        .unwrap_or_default();
    assert!(message.contains(needle), "{shape}: {message}");
}

pub async fn writes(client: &Client, groups: &[String]) {
    // An order on each group.
    let mut on = Vec::new();
    for group in groups {
        let key: i64 = connect(group)
            .await
            .query_one("select min(o_orderkey) from orders", &[])
            .await
            .expect("an order")
            .get(0);
        on.push(key);
    }
    let (a, b) = (on[0], on[1]);

    // UPDATE … FROM a reference table: every group, all or none.
    let n = "update ORDERS set o_comment = n_name from nation \
             where n_nationkey = o_nationkey and n_name like '%A%'";
    assert_eq!(
        affected(client, &over(n, false)).await,
        affected(client, &over(n, true)).await,
        "{n}"
    );
    same_tables(client, "update … from a reference table").await;
    // DELETE … USING a co-located table on its key, with RETURNING.
    same(
        client,
        "delete from LINEITEM using ORDERS where l_orderkey = o_orderkey \
         and o_totalprice < 60 returning l_orderkey, l_linenumber",
    )
    .await;
    same_tables(client, "delete … using").await;
    // By key: one group.
    same(
        client,
        &format!(
            "update ORDERS o set o_comment = n.n_comment from nation n \
             where n.n_nationkey = o.o_nationkey and o.o_orderkey = {b} returning o.o_comment"
        ),
    )
    .await;
    // Not on the key (joined rows on several groups): refused, saying why the general path
    // takes no write; nothing written.
    for shape in [
        "update ORDERS set o_comment = 'no' from LINEITEM where l_linenumber = o_orderkey",
        "delete from ORDERS using LINEITEM where l_quantity = o_nationkey and l_linenumber = 2",
        "update ORDERS set o_comment = 'no' where o_orderkey in \
         (select l_linenumber from LINEITEM)",
    ] {
        refused_0a000(client, shape, "not run through the general path").await;
    }
    refused_0a000(
        client,
        "update ORDERS set o_comment = 'no' from LINEITEM where l_linenumber = o_orderkey",
        "not joined on its shard key",
    )
    .await;
    same_tables(client, "refused update … from").await;

    // Data-modifying WITH, every part by key on one group.
    for key in [a, b] {
        let got = same(
            client,
            &format!(
                "with d as (delete from LINEITEM where l_orderkey = {key} returning l_quantity) \
                 update ORDERS set o_comment = 'moved ' || (select count(*) from d) \
                 where o_orderkey = {key} returning o_comment"
            ),
        )
        .await;
        assert!(got.iter().any(|m| m.starts_with("row")), "{got:?}");
        same(
            client,
            &format!(
                "with i as (insert into LINEITEM values ({key}, 90, 1, 'cte') returning *) \
                 select l_linenumber, l_comment from i"
            ),
        )
        .await;
    }
    same_tables(client, "data-modifying WITH").await;
    // Parts on two groups, or on every group: refused, nothing written.
    refused_0a000(
        client,
        &format!(
            "with d as (delete from LINEITEM where l_orderkey = {a} returning *) \
             update ORDERS set o_comment = 'x' where o_orderkey = {b}"
        ),
        "different groups",
    )
    .await;
    refused_0a000(
        client,
        "with d as (delete from LINEITEM where l_quantity = 3 returning *) select count(*) from d",
        "every group",
    )
    .await;
    refused_0a000(
        client,
        &format!(
            "with d as (delete from ORDERS where o_orderkey = {a} returning *) \
             insert into ORDERS select o_orderkey + 1000, o_custkey, o_nationkey, o_totalprice, \
             o_comment from d"
        ),
        "one shard group",
    )
    .await;
    // Rows moved between tables across groups (the brief's shape): refused.
    refused_0a000(
        client,
        "with moved as (delete from LINEITEM where l_quantity = 6 returning *) \
         insert into ORDERS select l_orderkey + 5000, 0, 0, 0, l_comment from moved",
        "data-modifying WITH",
    )
    .await;
    same_tables(client, "refused data-modifying WITH").await;
}
