//! Transactions that span shard groups (Sharding II): BEGIN, statements whose rows are on
//! different groups, COMMIT or ROLLBACK — all or none on every group, the transaction's own
//! writes visible to it on every group and to nobody else before the commit, two-phase only
//! when more than one group wrote, refusals for what would act on one group's part only.

mod common;

use common::{api_get_text, cluster, connect};
use tokio_postgres::error::SqlState;
use tokio_postgres::Client;

/// A counter's value in a /metrics text (0 when absent).
fn metric(text: &str, name: &str) -> f64 {
    text.lines()
        .filter(|l| l.starts_with(name) && !l.starts_with('#'))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// The balance of account `id`, as a client sees it.
async fn balance(client: &Client, id: i64) -> i64 {
    client
        .query_one("select balance from acct where id = $1", &[&id])
        .await
        .unwrap_or_else(|e| panic!("balance of {id}: {e:?}"))
        .get(0)
}

/// Transactions prepared and not yet decided on a group's primary.
async fn prepared(direct: &Client) -> i64 {
    direct
        .query_one("select count(*) from pg_prepared_xacts", &[])
        .await
        .expect("pg_prepared_xacts")
        .get(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn transactions_span_groups_all_or_none() {
    let c = cluster();
    c.up(&["--shards", "2", "--replicas", "0"]);
    let endpoint = c.url(&[]);
    let client = connect(&endpoint).await;
    client
        .batch_execute(
            "create table acct (id bigint primary key, balance bigint not null, \
             ref bigint, constraint ref_unique unique (ref) deferrable initially deferred)",
        )
        .await
        .expect("create");
    client
        .simple_query("select herd.create_distributed_table('acct', 'id')")
        .await
        .expect("distribute");
    let rows: Vec<String> = (1..=20).map(|i| format!("({i}, 100, {i})")).collect();
    client
        .batch_execute(&format!(
            "insert into acct (id, balance, ref) values {}",
            rows.join(", ")
        ))
        .await
        .expect("accounts");
    // One account on each group.
    let direct = [
        connect(&c.url(&["--group", "0", "--primary"])).await,
        connect(&c.url(&["--group", "1", "--primary"])).await,
    ];
    let mut on = [Vec::new(), Vec::new()];
    for (g, d) in direct.iter().enumerate() {
        for r in d
            .query("select id from acct order by id", &[])
            .await
            .expect("ids")
        {
            on[g].push(r.get::<_, i64>(0));
        }
    }
    assert!(
        on[0].len() >= 2 && on[1].len() >= 2,
        "both groups hold accounts: {on:?}"
    );
    let (a, b) = (on[0][0], on[1][0]);
    let (a2, b2) = (on[0][1], on[1][1]);
    let api = c.api_port();
    let two_phase = || {
        metric(
            &api_get_text(api, "/metrics"),
            "herd_shard_2pc_commits_total",
        )
    };

    // A transfer in the simple protocol: both groups or neither, and the transaction reads its
    // own writes on both groups while another session sees neither.
    let before = two_phase();
    client
        .batch_execute(&format!(
            "begin; update acct set balance = balance - 30 where id = {a}; \
             update acct set balance = balance + 30 where id = {b};"
        ))
        .await
        .expect_err("a batch inside a transaction keeps to one group");
    client.batch_execute("rollback").await.expect("rollback");
    client.batch_execute("begin").await.expect("begin");
    client
        .batch_execute(&format!(
            "update acct set balance = balance - 30 where id = {a}"
        ))
        .await
        .expect("debit on group 0");
    client
        .batch_execute(&format!(
            "update acct set balance = balance + 30 where id = {b}"
        ))
        .await
        .expect("credit on group 1");
    assert_eq!(balance(&client, a).await, 70, "own write on group 0");
    assert_eq!(balance(&client, b).await, 130, "own write on group 1");
    let other = connect(&endpoint).await;
    assert_eq!(
        balance(&other, a).await,
        100,
        "not visible before the commit"
    );
    assert_eq!(
        balance(&other, b).await,
        100,
        "not visible before the commit"
    );
    client.batch_execute("commit").await.expect("commit");
    assert_eq!(balance(&other, a).await, 70);
    assert_eq!(balance(&other, b).await, 130);
    assert_eq!(
        two_phase(),
        before + 1.0,
        "two groups wrote: a two-phase commit"
    );
    for d in &direct {
        assert_eq!(prepared(d).await, 0, "nothing left prepared");
    }

    // ROLLBACK undoes every group's part.
    client.batch_execute("begin").await.expect("begin");
    for (id, delta) in [(b, -50), (a, 50), (b2, 7)] {
        client
            .batch_execute(&format!(
                "update acct set balance = balance + {delta} where id = {id}"
            ))
            .await
            .expect("update");
    }
    client.batch_execute("rollback").await.expect("rollback");
    assert_eq!(
        (
            balance(&other, a).await,
            balance(&other, b).await,
            balance(&other, b2).await
        ),
        (70, 130, 100),
        "rolled back on both groups"
    );

    // The extended protocol (tokio-postgres' transaction, parameters, COMMIT as a statement).
    let mut ext = connect(&endpoint).await;
    let tx = ext.transaction().await.expect("begin");
    tx.execute(
        "update acct set balance = balance - $1 where id = $2",
        &[&5i64, &b],
    )
    .await
    .expect("debit on group 1");
    tx.execute(
        "update acct set balance = balance + $1 where id = $2",
        &[&5i64, &a],
    )
    .await
    .expect("credit on group 0");
    let seen: i64 = tx
        .query_one("select balance from acct where id = $1", &[&b])
        .await
        .expect("read back")
        .get(0);
    assert_eq!(
        seen, 125,
        "own write on group 1 after moving to group 0 and back"
    );
    tx.commit().await.expect("commit");
    assert_eq!(
        (balance(&other, a).await, balance(&other, b).await),
        (75, 125)
    );
    ext.execute("begin", &[]).await.expect("begin (extended)");
    ext.execute("update acct set balance = balance + 1 where id = $1", &[&a])
        .await
        .expect("group 0");
    ext.execute("update acct set balance = balance + 1 where id = $1", &[&b])
        .await
        .expect("group 1");
    ext.execute("commit", &[]).await.expect("commit (extended)");
    assert_eq!(
        (balance(&other, a).await, balance(&other, b).await),
        (76, 126)
    );

    // A statement failing on the second group fails the whole transaction: COMMIT rolls back.
    client.batch_execute("begin").await.expect("begin");
    client
        .batch_execute(&format!(
            "update acct set balance = balance + 1000 where id = {a}"
        ))
        .await
        .expect("group 0");
    let e = client
        .batch_execute(&format!(
            "update acct set balance = balance / 0 where id = {b}"
        ))
        .await
        .expect_err("division by zero on group 1");
    assert_eq!(e.code(), Some(&SqlState::DIVISION_BY_ZERO), "{e}");
    let e = client
        .batch_execute(&format!("select balance from acct where id = {a}"))
        .await
        .expect_err("the transaction is aborted");
    assert_eq!(e.code(), Some(&SqlState::IN_FAILED_SQL_TRANSACTION), "{e}");
    let answer = client.simple_query("commit").await.expect("commit");
    let tag = answer.iter().find_map(|m| match m {
        tokio_postgres::SimpleQueryMessage::CommandComplete(_) => Some(()),
        _ => None,
    });
    assert!(tag.is_some(), "COMMIT answered");
    assert_eq!(
        balance(&other, a).await,
        76,
        "the failed transaction left nothing"
    );

    // A deferred constraint that fails at PREPARE on one group: nothing anywhere.
    client.batch_execute("begin").await.expect("begin");
    client
        .batch_execute(&format!("update acct set balance = 0 where id = {a}"))
        .await
        .expect("group 0");
    client
        .batch_execute(&format!("update acct set ref = {b2} where id = {b}"))
        .await
        .expect("deferred duplicate on group 1");
    let e = client
        .batch_execute("commit")
        .await
        .expect_err("the deferred unique check fails at commit");
    assert_eq!(e.code(), Some(&SqlState::UNIQUE_VIOLATION), "{e}");
    assert_eq!(balance(&other, a).await, 76, "group 0 rolled back too");
    for d in &direct {
        assert_eq!(prepared(d).await, 0, "nothing left prepared");
    }

    // Reads on several groups and a write on one: no two-phase commit needed.
    let before = two_phase();
    client.batch_execute("begin").await.expect("begin");
    balance(&client, a2).await;
    client
        .batch_execute(&format!(
            "update acct set balance = balance + 2 where id = {b2}"
        ))
        .await
        .expect("group 1");
    balance(&client, a).await;
    client.batch_execute("commit").await.expect("commit");
    assert_eq!(two_phase(), before, "one group wrote: a plain commit");
    assert_eq!(balance(&other, b2).await, 102);

    // What would act on one group's part only is refused inside a spanning transaction.
    for sql in [
        "savepoint s1",
        "commit and chain",
        "prepare transaction 'mine'",
    ] {
        client.batch_execute("begin").await.expect("begin");
        balance(&client, a).await;
        balance(&client, b).await;
        let e = client.batch_execute(sql).await.expect_err(sql);
        assert_eq!(
            e.code(),
            Some(&SqlState::FEATURE_NOT_SUPPORTED),
            "{sql}: {e}"
        );
        client.batch_execute("rollback").await.expect("rollback");
    }
    // A cross-group read inside the transaction is refused (it needs every group's part).
    client.batch_execute("begin").await.expect("begin");
    let e = client
        .batch_execute("select sum(balance) from acct")
        .await
        .expect_err("a fan-out in a transaction");
    assert_eq!(e.code(), Some(&SqlState::FEATURE_NOT_SUPPORTED), "{e}");
    client.batch_execute("rollback").await.expect("rollback");

    // A client that leaves in the middle leaves nothing behind on any group.
    {
        let quitter = connect(&endpoint).await;
        quitter.batch_execute("begin").await.expect("begin");
        quitter
            .batch_execute(&format!("update acct set balance = -1 where id = {a}"))
            .await
            .expect("group 0");
        quitter
            .batch_execute(&format!("update acct set balance = -1 where id = {b}"))
            .await
            .expect("group 1");
    }
    other
        .batch_execute("set lock_timeout = '1s'")
        .await
        .expect("lock_timeout");
    common::eventually(
        std::time::Duration::from_secs(20),
        "locks released",
        || async {
            let row = other
                .query_one(
                    "update acct set balance = balance where id = $1 returning balance",
                    &[&b],
                )
                .await;
            matches!(row, Ok(r) if r.get::<_, i64>(0) == 126)
        },
    )
    .await;
    let total: i64 = other
        .query_one("select sum(balance)::bigint from acct", &[])
        .await
        .expect("sum")
        .get(0);
    assert_eq!(
        total,
        20 * 100 + 4,
        "transfers kept the total (+2 and +2 added)"
    );
}
