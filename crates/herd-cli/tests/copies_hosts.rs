//! Logical copies across hosts, modelled on loopback: three `herd agent`s over a 3-member etcd
//! cluster and a `herd proxy`, copying to another Herd cluster through `herd copy … --dcs`.

mod common;

use std::time::Duration;

use common::hosts::Hosts;
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;

/// Logical copies across hosts: `herd copy create --dcs …` from a cluster of three agents to
/// another Herd cluster, through the `herd proxy` endpoint; each replica's agent copies the
/// copy's slot into its data directory (a restart asked through the store) and moves it
/// forward; after kill -9 of the primary (agent and server) the copy streams on from the
/// promoted replica with no row lost and none applied twice; `list` and `drop` through the
/// store.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn copies_across_hosts_survive_a_failover() {
    let mut hosts = Hosts::start_configured("[postgres]\nwal_level = \"logical\"\n");
    let target = common::cluster();
    target.up(&["--replicas", "0"]);
    let tgt_url = target.url(&[]);
    let tgt = common::connect(&tgt_url).await;
    let proxy = common::connect(&hosts.proxy_url()).await;
    proxy
        .batch_execute(
            "create table orders (id int primary key, v text); \
             insert into orders select g, 'seed' from generate_series(1, 100) g",
        )
        .await
        .expect("source rows");
    let endpoint = format!("127.0.0.1:{}", hosts.proxy_port());
    let secrets = hosts.agent_dir(1);
    let secrets = secrets.to_str().expect("utf-8 path");
    let out = hosts.herd_store(&[
        "copy",
        "create",
        "c1",
        "--data-dir",
        secrets,
        "--endpoint",
        &endpoint,
        "--to",
        &tgt_url,
        "--table",
        "orders",
    ]);
    assert!(out.contains("copy c1 streams from shard group 0"), "{out}");
    let p = hosts.wait_primary("now");
    let replicas: Vec<usize> = (0..3).filter(|&i| i != p).collect();
    for &r in &replicas {
        let url = hosts.node_url(r);
        common::eventually(
            Duration::from_secs(90),
            &format!("the copy's slot on {}", Hosts::name(r)),
            || {
                let url = url.clone();
                async move {
                    let Some(c) = common::try_connect(&url).await else {
                        return false;
                    };
                    c.query_opt(
                        "select 1 from pg_replication_slots where slot_name = 'herd_copy_c1'",
                        &[],
                    )
                    .await
                    .is_ok_and(|row| row.is_some())
                }
            },
        )
        .await;
    }
    proxy
        .batch_execute("insert into orders select g, 'before' from generate_series(101, 200) g")
        .await
        .expect("rows before the failover");
    let postmaster = hosts.postmaster(p).expect("postmaster pid");
    hosts.signal_agent(p, Signal::SIGKILL);
    let _ = kill(Pid::from_raw(postmaster), Signal::SIGKILL);
    let _ = hosts.agents[p].take().map(|mut c| c.wait());
    herd_testkit::wait_until(Duration::from_secs(60), "a new primary", || {
        replicas
            .iter()
            .copied()
            .find(|&r| hosts.role(r).as_deref() == Some("primary"))
    });
    let mut next = 201;
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while next <= 300 {
        assert!(
            std::time::Instant::now() < deadline,
            "writes after the failover"
        );
        let proxy = common::try_connect(&hosts.proxy_url()).await;
        let ok = match proxy {
            Some(c) => c
                .execute("insert into orders values ($1, 'after')", &[&next])
                .await
                .is_ok(),
            None => false,
        };
        if ok {
            next += 1;
        } else {
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
    // Every row once on the target: the copy went on from the promoted replica's slot.
    common::eventually(
        Duration::from_secs(90),
        "every row on the target",
        || async {
            tgt.query_one("select count(*), coalesce(sum(id), 0) from orders", &[])
                .await
                .is_ok_and(|r| (r.get::<_, i64>(0), r.get::<_, i64>(1)) == (300, 45_150))
        },
    )
    .await;
    let listed: serde_json::Value =
        serde_json::from_str(&hosts.herd_store(&["copy", "list", "--data-dir", secrets, "--json"]))
            .expect("list json");
    assert_eq!(listed[0]["name"], "c1", "{listed}");
    assert_eq!(listed[0]["state"], "streaming", "{listed}");
    let out = hosts.herd_store(&["copy", "drop", "c1", "--data-dir", secrets]);
    assert!(out.contains("copy c1 dropped"), "{out}");
    let listed = hosts.herd_store(&["copy", "list", "--data-dir", secrets]);
    assert!(listed.contains("no copies"), "{listed}");
}
