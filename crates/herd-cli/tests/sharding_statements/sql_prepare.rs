//! SQL-level `PREPARE` / `EXECUTE` / `DEALLOCATE` over distributed tables (issue 40): the
//! proxy keeps them per session and places each `EXECUTE` as the statement it runs. Every
//! step through the endpoint over the distributed tables is compared with the same step on
//! group 0's server itself over the one-server copies (`orders_one`, `lineitem_one`,
//! `events_one`): a key lookup of each group, a fan-out aggregate, a join not on the key (the
//! general path), a write by key, an INSERT with parameters, several argument sets, inside
//! COMMITted and rolled-back blocks, DEALLOCATE / DEALLOCATE ALL / DISCARD ALL, and
//! PostgreSQL's errors (a name in use, an unknown name, a wrong number of arguments, a
//! PREPARE that does not parse, a failed block).

use tokio_postgres::Client;

use super::{answer, connect, over};

/// `steps` through `herd` over the distributed tables and through `one` (a server) over the
/// copies: every answer the same (rows, command tags, SQLSTATEs).
async fn same_answers(herd: &Client, one: &Client, what: &str, steps: &[String]) {
    for step in steps {
        let got = answer(herd, &over(step, false)).await;
        let want = answer(one, &over(step, true)).await;
        assert_eq!(got, want, "{what}: {step}");
    }
}

pub(super) async fn sql_prepare(url: &str, groups: &[String]) {
    let keys = super::order_keys(groups).await;
    let herd = connect(url).await;
    let one = connect(&groups[0]).await;
    let (k0, k1) = (keys[0], keys[1]);
    let mut steps: Vec<String> = vec![
        "prepare k(bigint) as select o_orderkey, o_totalprice, o_comment from ORDERS \
         where o_orderkey = $1"
            .into(),
        "prepare agg(int) as select count(*), sum(o_totalprice), min(o_comment) from ORDERS \
         where o_nationkey = $1"
            .into(),
        // Parameter types left to the server, one used twice.
        "prepare g as select o.o_custkey, count(*) from ORDERS o join LINEITEM l \
         on l.l_orderkey = o.o_custkey where o.o_custkey < $1 or o.o_custkey = $1 \
         group by 1 order by 1"
            .into(),
        "prepare up(bigint, text) as update ORDERS set o_comment = $2 where o_orderkey = $1".into(),
        "prepare ins(bigint, int) as insert into EVENTS (id, v, note) values ($1, $2, 'p')".into(),
        "prepare top(int) as select o_orderkey from ORDERS order by o_totalprice desc, \
         o_orderkey limit $1"
            .into(),
    ];
    for k in [k0, k1, k0 + 2, k1 + 2, 59, 1000] {
        steps.push(format!("execute k({k})"));
    }
    for n in 0..3 {
        steps.push(format!("execute agg({n})"));
    }
    steps.extend([
        "execute g(4)".to_string(),
        "execute g('7')".into(),
        "execute top(5)".into(),
        format!("execute up({k0}, 'one''s')"),
        format!("execute up({k1}, NULL)"),
        format!("execute k({k0})"),
        format!("execute k({k1})"),
        "execute ins(1001, 1)".into(),
        "execute ins(1002, -2)".into(),
        "select * from EVENTS where id > 1000 order by id".into(),
        // In a block that commits, and in one that rolls back: as one server.
        "begin".into(),
        format!("execute up({k0}, 'c0')"),
        format!("execute up({k1}, 'c1')"),
        "execute ins(1003, 3)".into(),
        format!("execute k({k0})"),
        "commit".into(),
        "begin".into(),
        format!("execute up({k1}, 'r1')"),
        "execute ins(1004, 4)".into(),
        "rollback".into(),
        format!("execute k({k0})"),
        format!("execute k({k1})"),
        "select * from EVENTS where id > 1000 order by id".into(),
        // Prepared inside a block that is on group 1, run there and after it.
        "begin".into(),
        format!("execute k({k1})"),
        "prepare inblock(bigint) as select count(*), max(o_orderkey) from ORDERS \
         where o_custkey = $1"
            .into(),
        "execute inblock(3)".into(),
        format!("execute up({k1}, 'b1')"),
        "commit".into(),
        "execute inblock(4)".into(),
        format!("execute k({k1})"),
        // PostgreSQL's errors.
        "prepare k(int) as select 1".into(),
        "execute nope(1)".into(),
        "execute k(1, 2)".into(),
        "execute k".into(),
        "execute g('x')".into(),
        "deallocate nope".into(),
        "prepare bad as select no_such_column from ORDERS".into(),
        "prepare bad as select * from no_such_table".into(),
        "execute bad".into(),
        // A failed block refuses everything but its end, and keeps nothing prepared in it.
        "begin".into(),
        "execute nope".into(),
        "execute agg(0)".into(),
        "prepare late as select 1".into(),
        "rollback".into(),
        "execute late".into(),
        // A block's PREPARE outlives its ROLLBACK, as in PostgreSQL.
        "begin".into(),
        "prepare kept(bigint) as select o_comment from ORDERS where o_orderkey = $1".into(),
        "rollback".into(),
        format!("execute kept({k1})"),
        // Forgotten one by one, all at once, and by DISCARD ALL.
        "deallocate k".into(),
        "execute k(1)".into(),
        "deallocate prepare agg".into(),
        "execute agg(0)".into(),
        "deallocate all".into(),
        "execute g(4)".into(),
        "prepare k(bigint) as select o_comment from ORDERS where o_orderkey = $1".into(),
        format!("execute k({k1})"),
        "discard all".into(),
        "execute k(1)".into(),
        "prepare k(bigint) as select o_orderkey from ORDERS where o_orderkey = $1".into(),
        format!("execute k({k0})"),
        "deallocate k".into(),
    ]);
    same_answers(&herd, &one, "SQL PREPARE/EXECUTE", &steps).await;
    // An argument that is not a constant: refused with the reason (PostgreSQL would evaluate
    // it once; Herd does not evaluate it for the statement's groups).
    let prepare = "prepare e(bigint) as select o_comment from orders where o_orderkey = $1";
    assert_eq!(answer(&herd, prepare).await, vec!["complete 0".to_string()]);
    // A key that is not a number: refused by the planner (0A000, as the same statement sent
    // with that literal or as a Bind parameter), where one server says 22P02.
    let got = answer(&herd, "execute e('x')").await;
    assert!(got == ["error 0A000"] || got == ["error 22P02"], "{got:?}");
    for sql in ["execute e(1 + 1)", "execute e(1::bigint)"] {
        assert_eq!(
            answer(&herd, sql).await,
            vec!["error 0A000".to_string()],
            "{sql}"
        );
    }
    // A number where PostgreSQL's assignment conversion refuses it (42804 on one server):
    // refused rather than converted explicitly.
    let sql = "prepare b(boolean) as select count(*) from orders where (o_nationkey = 1) = $1";
    assert_eq!(answer(&herd, sql).await, vec!["complete 0".to_string()]);
    assert_eq!(
        answer(&herd, "execute b(1)").await,
        vec!["error 0A000".to_string()]
    );
    assert_eq!(answer(&herd, "execute b(true)").await.len(), 3);
    // In a string of several statements a PREPARE would be a server's own: still refused.
    let got = answer(&herd, "prepare z as select * from orders; select 1").await;
    assert_eq!(got, vec!["error 0A000".to_string()]);
    // EXECUTE sent through the extended protocol (a driver's query() of the client's SQL):
    // the same rows as one server's.
    for (client, table) in [(&herd, "orders"), (&one, "orders_one")] {
        let sql = format!(
            "prepare x(bigint) as select o_orderkey, o_comment from {table} where o_orderkey = $1"
        );
        assert_eq!(answer(client, &sql).await, vec!["complete 0".to_string()]);
    }
    for k in [k0, k1, 1000] {
        let sql = format!("execute x({k})");
        let rows = |rows: Vec<tokio_postgres::Row>| -> Vec<(i64, Option<String>)> {
            rows.iter().map(|r| (r.get(0), r.get(1))).collect()
        };
        let got = rows(herd.query(&sql, &[]).await.expect("extended EXECUTE"));
        let want = rows(one.query(&sql, &[]).await.expect("extended EXECUTE"));
        assert_eq!(got, want, "{sql}");
    }
    let e = herd
        .query("execute nope(1)", &[])
        .await
        .expect_err("unknown");
    assert_eq!(e.code().map(|c| c.code()), Some("26000"), "{e}");
    // The session was never pinned: statements of both groups still run outside a block.
    for k in &keys {
        let sql = format!("select o_orderkey from orders where o_orderkey = {k}");
        assert_eq!(answer(&herd, &sql).await.len(), 3, "{sql}");
    }
}
