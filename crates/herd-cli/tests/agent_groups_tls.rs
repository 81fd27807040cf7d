//! The servers' connections to each other over verified TLS (issue #42, part 4): two shard
//! groups of two `herd agent`s on loopback whose secrets hold the cluster's CA, and a `herd
//! proxy` serving clients with a certificate of that CA. The general path's postgres_fdw
//! servers on group 0 say `sslmode=verify-full` with the server's own CA file and group 1 sees
//! their sessions over TLS; a shard move's subscription verifies the endpoint (no note that it
//! could not) and the move completes, every row once.

mod common;

use std::process::Command;
use std::time::{Duration, Instant};

use common::agent_groups::Groups;
use common::hosts::HERD;

/// Agents: (name, group).
const AGENTS: [(&str, u32); 4] = [("a0", 0), ("a1", 0), ("b0", 1), ("b1", 1)];

/// Runs `herd ARGS` (120 s at most); (success, stdout + stderr).
fn herd(args: &[&str]) -> (bool, String) {
    let mut cmd = Command::new(HERD);
    cmd.args(args);
    let out = herd_testkit::output_within(&mut cmd, Duration::from_secs(120)).expect("herd exits");
    (
        out.status.success(),
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fdw_and_shard_moves_verify_the_servers_and_the_endpoint() {
    let mut g = Groups::new(&AGENTS, "gt");
    let first = g.agent_dir(0);
    std::fs::create_dir_all(&first).expect("agent dir");
    herd_cluster::Secrets::generate()
        .save(
            &herd_cluster::Layout::new(&first),
            herd_cluster::REPLICATION_USER,
        )
        .expect("secrets");
    let first_arg = first.to_str().expect("utf-8 path").to_string();
    let (ok, out) = herd(&["certs", "init", "--cluster", "gt", "--data-dir", &first_arg]);
    assert!(ok, "{out}");
    g.start_agent(0);
    g.wait_role(0, "primary", Duration::from_secs(60));
    for i in 1..AGENTS.len() {
        g.start_agent(i);
    }
    g.wait_role(1, "replica", Duration::from_secs(60));
    let b = g.wait_primary_of(&[2, 3], Duration::from_secs(90));
    // The proxy serves clients with a certificate of the cluster's CA for the address the
    // subscriptions dial.
    let tls_dir = g.dir.path().join("proxy-tls");
    let tls_arg = tls_dir.to_str().expect("utf-8 path").to_string();
    let (ok, out) = herd(&[
        "certs",
        "issue",
        "proxy",
        "--host",
        "127.0.0.1",
        "--out",
        &tls_arg,
        "--data-dir",
        &first_arg,
    ]);
    assert!(ok, "{out}");
    let cert = tls_dir.join("proxy.crt");
    let key = tls_dir.join("proxy.key");
    g.start_proxy_with(&[
        "--tls-cert",
        cert.to_str().expect("utf-8 path"),
        "--tls-key",
        key.to_str().expect("utf-8 path"),
    ]);
    let proxy = g.connect_proxy().await;
    common::shards::distributed_table(&proxy, "items", "v int").await;
    proxy
        .batch_execute("insert into items select i, i % 7 from generate_series(1, 200) i")
        .await
        .expect("rows on both groups");

    // A read only the general path answers: group 0 reads group 1 through postgres_fdw.
    let explained = proxy
        .simple_query("select herd.explain('select distinct on (v) v from items')")
        .await
        .expect("explain");
    eprintln!("{explained:?}");
    let rows = proxy
        .query("select distinct on (v) v from items order by v", &[])
        .await
        .expect("a general read over both groups");
    assert_eq!(rows.len(), 7, "every value once");
    let group0 = common::connect(&g.url(g.pg_port(0))).await;
    let options: String = group0
        .query_one(
            "select array_to_string(srvoptions, ' ') from pg_foreign_server \
             where srvname = 'herd_group_1'",
            &[],
        )
        .await
        .expect("group 1's foreign server on group 0")
        .get(0);
    eprintln!("herd_group_1: {options}");
    let ca = first.join("secrets").join(herd_certs::CA_CERT);
    assert!(options.contains("sslmode=verify-full"), "{options}");
    assert!(
        options.contains(&format!("sslrootcert={}", ca.display())),
        "{options}"
    );
    let group1 = common::connect(&g.url(g.pg_port(b))).await;
    let deadline = Instant::now() + Duration::from_secs(30);
    let fdw = loop {
        let row = group1
            .query_one(
                "select count(*), count(*) filter (where ssl) \
                 from pg_stat_ssl join pg_stat_activity using (pid) \
                 where application_name = 'herd_general'",
                &[],
            )
            .await
            .expect("pg_stat_ssl on group 1");
        let seen: (i64, i64) = (row.get(0), row.get(1));
        if seen.0 > 0 || Instant::now() > deadline {
            break seen;
        }
        // The general path's connection lives in the proxy's pooled session; read again.
        proxy
            .query("select distinct on (v) v from items order by v", &[])
            .await
            .expect("a general read");
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    eprintln!("postgres_fdw sessions on group 1 (all, over TLS): {fdw:?}");
    assert!(fdw.0 > 0 && fdw.0 == fdw.1, "{fdw:?}\n{}", g.logs());

    // A shard move: the destination's subscription reaches the proxy with verify-full.
    let shard = common::shards::first_shard_of(&proxy, 0).await;
    let endpoint = format!("127.0.0.1:{}", g.proxy_port());
    let (ok, out) = herd(&[
        "shards",
        "move",
        &shard.to_string(),
        "--to",
        "1",
        "--data-dir",
        &first_arg,
        "--endpoint",
        &endpoint,
        "--wait-timeout",
        "90",
        "--dcs",
        &g.dcs(),
        "--cluster",
        &g.cluster,
    ]);
    assert!(ok, "{out}\n{}", g.logs());
    assert!(
        out.contains(&format!("shard {shard} moved from group 0 to group 1")),
        "{out}"
    );
    assert!(
        out.contains(&format!(
            "the destination's subscription verifies the endpoint {endpoint} (sslmode=verify-full"
        )),
        "{out}"
    );
    assert!(!out.contains("does not serve TLS"), "{out}");
    let row = proxy
        .query_one("select count(*), count(distinct id) from items", &[])
        .await
        .expect("count after the move");
    assert_eq!(
        (row.get::<_, i64>(0), row.get::<_, i64>(1)),
        (200, 200),
        "every row once after the move"
    );
}
