//! 1,000 client connections through the one endpoint of a 2-group cluster: every client reads
//! and writes by key at once, and no node ever holds more server connections for them than
//! its pool size (10, the default), so M clients cost M + N connections, not M × N.

mod common;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use common::{api_get_text, cluster, connect};
use futures_util::StreamExt;

const CLIENTS: usize = 1000;
const POOL_SIZE: f64 = 10.0;
const KEYS: i64 = 200;

/// The largest `herd_pool_connections` (in use + idle) of any node in a /metrics text.
fn busiest_pool(metrics: &str) -> (String, f64) {
    let mut per_node: std::collections::HashMap<String, f64> = Default::default();
    for line in metrics
        .lines()
        .filter(|l| l.starts_with("herd_pool_connections{"))
    {
        let node = line
            .split("node=\"")
            .nth(1)
            .and_then(|r| r.split('"').next())
            .unwrap_or("")
            .to_string();
        let value: f64 = line
            .rsplit(' ')
            .next()
            .and_then(|v| v.parse().ok())
            .unwrap_or(0.0);
        *per_node.entry(node).or_default() += value;
    }
    per_node
        .into_iter()
        .max_by(|a, b| a.1.total_cmp(&b.1))
        .unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_thousand_clients_share_each_nodes_pool() {
    let c = cluster();
    c.up(&["--shards", "2", "--replicas", "1"]);
    let url = c.url(&[]);
    let setup = connect(&url).await;
    setup
        .batch_execute("create table kv (k bigint primary key, v bigint not null default 0)")
        .await
        .expect("create");
    setup
        .simple_query("select herd.create_distributed_table('kv', 'k')")
        .await
        .expect("distribute");
    for k in 0..KEYS {
        setup
            .execute("insert into kv (k) values ($1)", &[&k])
            .await
            .expect("insert by key");
    }

    // The clients connect (50 handshakes at a time) and stay connected.
    let clients: Vec<tokio_postgres::Client> = futures_util::stream::iter(0..CLIENTS)
        .map(|_| {
            let url = url.clone();
            async move {
                tokio::time::timeout(Duration::from_secs(60), connect(&url))
                    .await
                    .expect("a client connects within 60 s")
            }
        })
        .buffer_unordered(50)
        .collect()
        .await;
    assert_eq!(clients.len(), CLIENTS);

    // While they all work, /metrics is sampled: no node's pool may exceed its size.
    let done = Arc::new(AtomicBool::new(false));
    let api = c.api_port();
    let sampler = {
        let done = done.clone();
        tokio::task::spawn_blocking(move || {
            let mut worst = (String::new(), 0.0);
            let mut samples = 0;
            while !done.load(Ordering::Relaxed) {
                let b = busiest_pool(&api_get_text(api, "/metrics"));
                if b.1 > worst.1 {
                    worst = b;
                }
                samples += 1;
                std::thread::sleep(Duration::from_millis(50));
            }
            (worst, samples)
        })
    };
    let updates = Arc::new(AtomicU64::new(0));
    let mut tasks = Vec::new();
    for (i, client) in clients.into_iter().enumerate() {
        let updates = updates.clone();
        tasks.push(tokio::spawn(async move {
            let k = (i as i64 * 7) % KEYS;
            let row = client
                .query_one("select v from kv where k = $1", &[&k])
                .await
                .expect("read by key");
            let _: i64 = row.get(0);
            let n = client
                .execute("update kv set v = v + 1 where k = $1", &[&k])
                .await
                .expect("write by key");
            updates.fetch_add(n, Ordering::Relaxed);
            client
        }));
    }
    let mut clients = Vec::new();
    for t in tasks {
        let client = tokio::time::timeout(Duration::from_secs(180), t)
            .await
            .expect("every client done within 180 s")
            .expect("client task");
        clients.push(client);
    }
    // Every client is still connected while the pools are checked once more.
    let last = busiest_pool(&api_get_text(api, "/metrics"));
    done.store(true, Ordering::Relaxed);
    let (worst, samples) = sampler.await.expect("sampler");
    assert!(samples > 0);
    for (node, n) in [worst, last] {
        assert!(
            n <= POOL_SIZE,
            "node {node} held {n} server connections (pool size {POOL_SIZE})"
        );
    }
    assert_eq!(updates.load(Ordering::Relaxed), CLIENTS as u64);

    // PostgreSQL agrees: each primary serves the clients with at most its pool of backends,
    // besides this check's own and Herd's own named connections — kept: the supervisor's
    // probe, the copies' slot sync, the proxy's monitor and (group 0) its shard-map
    // connection; room for two one-off looks at the same instant — and every update landed once.
    let mut total = 0;
    for g in 0..2u32 {
        let direct = connect(&c.url(&["--group", &g.to_string(), "--primary"])).await;
        let row = direct
            .query_one(
                "select count(*) filter (where application_name not like 'herd%'), \
                        coalesce(string_agg(application_name, ', ') \
                          filter (where application_name like 'herd%'), ''), \
                        (select coalesce(sum(v), 0)::bigint from kv) \
                 from pg_stat_activity \
                 where backend_type = 'client backend' and pid <> pg_backend_pid()",
                &[],
            )
            .await
            .expect("pg_stat_activity");
        let pooled: i64 = row.get(0);
        let herds: String = row.get(1);
        assert!(
            pooled <= POOL_SIZE as i64,
            "group {g}'s primary has {pooled} client backends for {CLIENTS} clients"
        );
        assert!(
            herds.split(", ").count() <= 6,
            "group {g}'s primary has more of Herd's own connections than expected: {herds}"
        );
        total += row.get::<_, i64>(2);
    }
    assert_eq!(total, CLIENTS as i64);
    drop(clients);
}
