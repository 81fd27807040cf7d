//! Cursors over distributed tables (issue 40), through the endpoint and
//! compared with the same statements over the one-server copies (`orders_one`, `lineitem_one`
//! on group 0): a cursor over a read across groups lives on group 0 (the general path), one
//! over a key on the key's group; `FETCH`/`MOVE`/`CLOSE` follow it; the block stays on the
//! cursor's server (a statement for another group is refused there); `WITH HOLD` is refused.
//! (SQL PREPARE/EXECUTE: `sql_prepare.rs`.)

use tokio_postgres::Client;

use super::{answer, connect, over};

/// `steps` (with `ORDERS`/`LINEITEM` placeholders) through `herd` over the distributed tables
/// and through `one` over the one-server copies: every statement's answer the same.
async fn same_answers(herd: &Client, one: &Client, what: &str, steps: &[&str]) {
    for step in steps {
        let got = answer(herd, &over(step, false)).await;
        let want = answer(one, &over(step, true)).await;
        assert_eq!(got, want, "{what}: {step}");
        assert!(
            !got.iter().any(|m| m.starts_with("error 0A000")),
            "{what}: {step}: {got:?}"
        );
    }
}

/// The SQLSTATE `sql` fails with through `client` (empty when it succeeds).
async fn code(client: &Client, sql: &str) -> String {
    answer(client, sql)
        .await
        .into_iter()
        .find_map(|m| m.strip_prefix("error ").map(str::to_string))
        .unwrap_or_default()
}

pub(super) async fn cursors(client: &Client, url: &str, groups: &[String]) {
    let keys = super::order_keys(groups).await;
    let one = connect(url).await;
    same_answers(
        client,
        &one,
        "a cursor across groups",
        &[
            "begin",
            "declare c scroll cursor for select o_orderkey, o_totalprice, o_comment from ORDERS \
             where o_custkey < 9 order by o_totalprice desc, o_orderkey",
            "fetch 5 from c",
            "fetch next from c",
            "move forward 3 in c",
            "fetch backward 2 from c",
            "fetch absolute 10 from c",
            // A read across groups in the block: on group 0 too (the general path).
            "select count(*), sum(o_totalprice) from ORDERS",
            "fetch all from c",
            "close c",
            "declare d cursor for select l_orderkey, count(*) from LINEITEM group by 1 \
             having count(*) > 2 order by 1",
            "fetch 4 from d",
            "fetch 100 from d",
            "commit",
            // psql's FETCH_COUNT: a cursor of a window function's rows.
            "begin",
            "declare _psql_cursor no scroll cursor for select o_orderkey, rank() over \
             (partition by o_nationkey order by o_totalprice) from ORDERS order by 1",
            "fetch forward 25 from _psql_cursor",
            "fetch forward 25 from _psql_cursor",
            "fetch forward 25 from _psql_cursor",
            "close _psql_cursor",
            "commit",
        ],
    )
    .await;
    // Through the extended protocol with a parameter (as drivers' server-side cursors send
    // it): across groups and by key.
    for (decl, param) in [
        (
            "declare e cursor for select o_orderkey, o_totalprice from ORDERS \
             where o_nationkey = $1 order by 2, 1",
            2i64,
        ),
        (
            "declare e cursor for select * from ORDERS where o_orderkey = $1",
            keys[1],
        ),
    ] {
        let mut answers = Vec::new();
        for (c, one) in [(client, false), (&one, true)] {
            c.batch_execute("begin").await.expect("begin");
            let decl = over(decl, one);
            let declared = if decl.contains("o_nationkey") {
                c.execute(decl.as_str(), &[&(param as i32)]).await
            } else {
                c.execute(decl.as_str(), &[&param]).await
            };
            declared.unwrap_or_else(|e| panic!("{decl}: {e:?}"));
            let mut got = Vec::new();
            for fetch in ["fetch 3 from e", "fetch all from e"] {
                let rows = c.query(fetch, &[]).await.expect("fetch");
                got.push(
                    rows.iter()
                        .map(|r| format!("{:?}", r.get::<_, i64>(0)))
                        .collect::<Vec<_>>(),
                );
            }
            c.batch_execute("commit").await.expect("commit");
            answers.push(got);
        }
        assert_eq!(answers[0], answers[1], "{decl}");
        assert!(!answers[0].concat().is_empty(), "{decl}: rows");
    }
    // By key: the cursor on the key's group, the block's statements by that key with it.
    for k in &keys {
        same_answers(
            client,
            &one,
            "a cursor by key",
            &[
                "begin",
                &format!("declare k cursor for select * from ORDERS where o_orderkey = {k}"),
                "fetch all from k",
                &format!("select o_comment from ORDERS where o_orderkey = {k}"),
                "close k",
                "commit",
            ],
        )
        .await;
    }
    // The block stays on its cursor's server: a statement for the other group is refused
    // there (the block fails, as after any error), ROLLBACK ends it.
    for (declare, other) in [
        (
            "declare c cursor for select * from orders order by 1".to_string(),
            keys[1],
        ),
        (
            format!(
                "declare c cursor for select * from orders where o_orderkey = {}",
                keys[0]
            ),
            keys[1],
        ),
        (
            format!(
                "declare c cursor for select * from orders where o_orderkey = {}",
                keys[1]
            ),
            keys[0],
        ),
    ] {
        assert_eq!(code(client, "begin").await, "");
        assert_eq!(code(client, &declare).await, "", "{declare}");
        assert_eq!(code(client, "fetch 2 from c").await, "", "{declare}");
        let refused = answer(
            client,
            &format!("select * from orders where o_orderkey = {other}"),
        )
        .await;
        assert_eq!(refused, ["error 0A000"], "{declare}");
        assert_eq!(code(client, "fetch 2 from c").await, "25P02", "{declare}");
        assert_eq!(code(client, "rollback").await, "");
    }
    // A cursor across groups in a block already on group 1: refused (the general path runs
    // on group 0 only), the block then rolled back.
    assert_eq!(code(client, "begin").await, "");
    assert_eq!(
        code(
            client,
            &format!("select * from orders where o_orderkey = {}", keys[1])
        )
        .await,
        ""
    );
    assert_eq!(
        code(
            client,
            "declare c cursor for select * from orders order by 1"
        )
        .await,
        "0A000"
    );
    assert_eq!(code(client, "rollback").await, "");
    // WITH HOLD outlives the transaction on one server connection: refused.
    for sql in [
        "declare h cursor with hold for select * from orders",
        "declare h cursor with hold for select * from orders where o_orderkey = 1",
    ] {
        assert_eq!(code(client, sql).await, "0A000", "{sql}");
    }
    // Outside a transaction block PostgreSQL's own error, as one server answers it; the
    // session then reads both groups again.
    for sql in [
        "declare x cursor for select * from ORDERS order by 1".to_string(),
        format!(
            "declare x cursor for select * from ORDERS where o_orderkey = {}",
            keys[1]
        ),
    ] {
        assert_eq!(code(client, &over(&sql, false)).await, "25P01", "{sql}");
        assert_eq!(code(&one, &over(&sql, true)).await, "25P01", "{sql}");
    }
    for k in &keys {
        let sql = format!("select o_orderkey from orders where o_orderkey = {k}");
        assert_eq!(answer(client, &sql).await.len(), 3, "{sql}");
    }
    assert_eq!(answer(client, "select count(*) from orders").await.len(), 3);
}
