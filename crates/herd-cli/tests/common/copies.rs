//! Helpers of the logical copy tests (`tests/copies.rs`): content fingerprints, a copy's
//! status, slot copies on the replicas, writers under faults.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use herd_testkit::TestCluster;
use tokio_postgres::Client;

/// The filtered subset's fingerprint: rows, and a digest of every copied column in key order.
pub const SOURCE_SUBSET: &str = "select count(*), coalesce(md5(string_agg(id || ':' || region || ':' || total, ',' order by id)), '') \
                             from orders where id % 10 = 0";
/// The same fingerprint over every row of the target's copy.
pub const TARGET_ALL: &str = "select count(*), coalesce(md5(string_agg(id || ':' || region || ':' || total, ',' order by id)), '') \
                          from orders";

/// `sql`'s row count and digest on `client`.
pub async fn fingerprint(client: &Client, sql: &str) -> (i64, String) {
    let row = client.query_one(sql, &[]).await.expect("fingerprint");
    (row.get(0), row.get(1))
}

/// `herd copy list --json`, the copy named `name`.
pub fn copy_status(c: &TestCluster, name: &str) -> serde_json::Value {
    let text = c.herd_ok(&["copy", "list", "--json"]);
    let all: serde_json::Value = serde_json::from_str(&text).expect("copy list JSON");
    all.as_array()
        .and_then(|a| a.iter().find(|x| x["name"] == name).cloned())
        .unwrap_or_else(|| panic!("copy {name} not listed: {text}"))
}

/// Direct superuser URL of `node`'s server (its port from `herd status`).
pub fn node_url(c: &TestCluster, node: &str) -> String {
    c.url(&["--replica", node])
}

/// Whether every replica of `c` holds a copy of slot `slot`.
pub async fn replicas_hold(c: &TestCluster, slot: &str) -> bool {
    let status = c.status();
    for n in status["nodes"].as_array().expect("nodes") {
        if n["role"] != "replica" {
            continue;
        }
        let Some(client) =
            super::try_connect(&node_url(c, n["name"].as_str().expect("name"))).await
        else {
            return false;
        };
        let held = client
            .query_opt(
                "select 1 from pg_replication_slots where slot_name = $1",
                &[&slot],
            )
            .await
            .ok()
            .flatten()
            .is_some();
        if !held {
            return false;
        }
    }
    true
}

/// Writers upserting random keys through the source's endpoint until told to stop; counts
/// acknowledged writes (errors around failovers are expected and retried with a new
/// connection).
pub fn start_writers(
    endpoint: &str,
    stop: &Arc<AtomicBool>,
    acked: &Arc<AtomicU64>,
) -> Vec<tokio::task::JoinHandle<()>> {
    (0..3)
        .map(|w| {
            let (endpoint, stop, acked) = (endpoint.to_string(), stop.clone(), acked.clone());
            tokio::spawn(async move {
                let mut n: i64 = w;
                while !stop.load(Ordering::Relaxed) {
                    let Some(client) = super::try_connect(&endpoint).await else {
                        tokio::time::sleep(Duration::from_millis(200)).await;
                        continue;
                    };
                    while !stop.load(Ordering::Relaxed) {
                        n += 3;
                        let id = (n * 7919) % 50_000;
                        let sql = format!(
                            "insert into orders values ({id}, 'eu', {id}, 'w') \
                             on conflict (id) do update set total = orders.total + 1, region = 'us'"
                        );
                        let step = tokio::time::timeout(
                            Duration::from_secs(10),
                            client.batch_execute(&sql),
                        )
                        .await;
                        match step {
                            Ok(Ok(())) => {
                                acked.fetch_add(1, Ordering::Relaxed);
                            }
                            _ => break,
                        }
                    }
                }
            })
        })
        .collect()
}

/// The replica's startup process (the one replaying WAL), found under its postmaster.
pub fn startup_process(postmaster: i32) -> i32 {
    super::children(postmaster)
        .into_iter()
        .find(|p| {
            std::fs::read_to_string(format!("/proc/{p}/cmdline"))
                .is_ok_and(|c| c.contains("startup"))
        })
        .expect("the replica's startup process")
}

/// Publications, copy roles and logical slots on a server: what a copy leaves behind.
pub async fn copy_objects_left(client: &Client) -> i64 {
    client
        .query_one(
            "select (select count(*) from pg_publication) \
             + (select count(*) from pg_roles where rolname like 'herd_copy%') \
             + (select count(*) from pg_replication_slots where slot_type = 'logical')",
            &[],
        )
        .await
        .expect("objects left by copies")
        .get(0)
}
