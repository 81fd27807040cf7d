//! Roles made through the endpoint on a 2-group cluster: created, changed and dropped on every
//! group with group 0's verifier; a role made directly on one group is left alone.

use crate::common::connect;
use herd_shard::{KeyValue, ShardMap};
use herd_testkit::TestCluster;
use std::time::Duration;

/// Runs the roles phase through `client` (the endpoint at `endpoint`) with the table `orders`
/// distributed by `map`.
pub async fn reach_every_group(
    c: &TestCluster,
    client: &tokio_postgres::Client,
    endpoint: &str,
    map: &ShardMap,
) {
    // Roles made through the endpoint reach every group with group 0's verifier: a new login
    // role reads and writes rows on both groups, and a changed password works everywhere.
    client
        .batch_execute("create role app login password 'app-secret'")
        .await
        .expect("create role through the endpoint");
    for grant in [
        "grant select, insert on orders to app",
        "grant usage on all sequences in schema public to app",
    ] {
        client
            .batch_execute(grant)
            .await
            .expect("grant on every group");
    }
    let (_, host) = endpoint.split_once('@').expect("url with credentials");
    let as_app = |password: &str| format!("postgresql://app:{password}@{host}");
    let keys: Vec<i64> = {
        let g0 = map.group_of(Some(&KeyValue::Int8(1)));
        let other = (2..100)
            .find(|k| map.group_of(Some(&KeyValue::Int8(*k))) != g0)
            .expect("a key of the other group");
        vec![1, other]
    };
    let app = connect(&as_app("app-secret")).await;
    for k in &keys {
        app.execute(
            "insert into orders (customer_id, v) values ($1, 'by app')",
            &[k],
        )
        .await
        .unwrap_or_else(|e| panic!("app writes key {k}: {e:?}"));
    }
    client
        .batch_execute("alter role app password 'new-secret'")
        .await
        .expect("alter role through the endpoint");
    let mut verifiers = Vec::new();
    for g in 0..2u32 {
        let direct = connect(&c.url(&["--group", &g.to_string(), "--primary"])).await;
        let row = direct
            .query_one(
                "select rolpassword from pg_authid where rolname = 'app'",
                &[],
            )
            .await
            .expect("verifier");
        verifiers.push(row.get::<_, String>(0));
    }
    assert_eq!(verifiers[0], verifiers[1], "one verifier on every group");
    // The proxy trusts a verifier for up to 5 s.
    let mut reconnected = None;
    for _ in 0..100 {
        if let Ok((cl, conn)) =
            tokio_postgres::connect(&as_app("new-secret"), tokio_postgres::NoTls).await
        {
            tokio::spawn(conn);
            reconnected = Some(cl);
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let app = reconnected.expect("the new password opens the endpoint");
    for k in &keys {
        let n = app
            .query_one(
                "select count(*) from orders where customer_id = $1 and v = 'by app'",
                &[k],
            )
            .await
            .unwrap_or_else(|e| panic!("app reads key {k}: {e}"));
        assert_eq!(n.get::<_, i64>(0), 1, "key {k}");
    }
    // A role made directly on one group is left alone; a role dropped through the endpoint is
    // dropped on every group.
    let g1 = connect(&c.url(&["--group", "1", "--primary"])).await;
    g1.batch_execute("create role only_here")
        .await
        .expect("a role on group 1 only");
    let on_g1 = |role: &'static str| {
        let g1 = &g1;
        async move {
            g1.query_one("select count(*) from pg_roles where rolname = $1", &[&role])
                .await
                .expect("roles on group 1")
                .get::<_, i64>(0)
        }
    };
    client
        .batch_execute("create role passing")
        .await
        .expect("create role");
    assert_eq!(on_g1("passing").await, 1);
    client
        .batch_execute("drop role passing")
        .await
        .expect("drop role");
    assert_eq!(on_g1("passing").await, 0);
    assert_eq!(on_g1("only_here").await, 1, "a role of group 1 alone stays");
    client
        .execute(
            "delete from orders where v = 'by app' and customer_id = $1",
            &[&keys[0]],
        )
        .await
        .expect("clean up");
    client
        .execute(
            "delete from orders where v = 'by app' and customer_id = $1",
            &[&keys[1]],
        )
        .await
        .expect("clean up");
}
