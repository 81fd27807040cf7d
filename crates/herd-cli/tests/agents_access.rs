//! How clients and operators reach a multi-host cluster (a 3-member etcd cluster, three `herd
//! agent`s and a `herd proxy` on loopback, as in agents.rs): a proxy started before its agents
//! refuses logins at once and then serves; `herd status` answers from the agents' APIs while the
//! store is down; and those APIs answer the cluster's own signed requests only (issue #42).

mod common;

use std::process::Command;
use std::time::{Duration, Instant};

use common::hosts::{copy_dir, Hosts, HERD};

/// `herd proxy` started before any agent serves at once: while no member leads, a login is
/// refused with 57P03 and says why well within a client's 2 s connect timeout (it used to
/// accept TCP and answer nothing until a leader appeared); once the agents elected one, logins
/// work.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_proxy_started_before_its_agents_refuses_logins_at_once_then_serves() {
    let mut hosts = Hosts::prepare(None, None);
    // The cluster's passwords made up front (as the first agent would), so the proxy can start
    // first; the first agent then uses them.
    let layout = herd_cluster::Layout::new(hosts.agent_dir(0));
    herd_cluster::Secrets::generate()
        .save(&layout, herd_cluster::REPLICATION_USER)
        .expect("secrets");
    copy_dir(&layout.secrets(), &hosts.dir.path().join("proxy/secrets"));
    hosts.start_proxy();
    hosts.wait_proxy_listening();
    for attempt in 0..3 {
        let started = Instant::now();
        let refused = tokio::time::timeout(
            Duration::from_secs(10),
            tokio_postgres::connect(&hosts.proxy_url(), tokio_postgres::NoTls),
        )
        .await
        .expect("the proxy answers");
        let took = started.elapsed();
        let Err(e) = refused else {
            panic!("a login succeeded with no member running\n{}", hosts.logs());
        };
        eprintln!("login #{attempt} before any agent: refused in {took:?}: {e}");
        assert_eq!(
            e.code(),
            Some(&tokio_postgres::error::SqlState::CANNOT_CONNECT_NOW),
            "{e}"
        );
        let message = e
            .as_db_error()
            .map(|d| d.message().to_string())
            .unwrap_or_default();
        assert!(message.contains("no member leads group 0 yet"), "{message}");
        assert!(took < Duration::from_millis(2500), "refused after {took:?}");
    }
    hosts.start_members();
    let url = hosts.proxy_url();
    common::eventually(
        Duration::from_secs(30),
        "a login after the election",
        || async {
            match common::try_connect(&url).await {
                Some(c) => c.query_one("select 1", &[]).await.is_ok(),
                None => false,
            }
        },
    )
    .await;
}

/// `herd status` while etcd's quorum is lost (2 of its 3 members killed): it says which etcd
/// endpoints answer, asks each agent's API instead (at the addresses kept by the last good
/// `herd status`, or named with `--agent-api`), marks those rows and exits with code 2.
#[test]
fn status_answers_from_the_agents_while_the_store_is_down() {
    let mut hosts = Hosts::start();
    let leader = hosts.wait_primary("before the outage");
    // The member record and the failsafe question answer the cluster's own signed requests
    // only (issue #42); health checks stay open to load balancers.
    let api = hosts.api(leader);
    for (method, path) in [("GET", "/member"), ("POST", "/failsafe")] {
        let url = format!("http://{api}{path}");
        match ureq::request(method, &url)
            .timeout(Duration::from_secs(5))
            .call()
        {
            Err(ureq::Error::Status(401, _)) => {}
            other => panic!("{method} {path} without the cluster's key: {other:?}"),
        }
        match ureq::request(method, &url)
            .set(
                "authorization",
                "Herd-HMAC nonce=00112233445566778899aabbccddeeff, sig=00",
            )
            .timeout(Duration::from_secs(5))
            .call()
        {
            Err(ureq::Error::Status(403, _)) => {}
            other => panic!("{method} {path} with a forged signature: {other:?}"),
        }
    }
    let health = ureq::get(&format!("http://{api}/primary"))
        .timeout(Duration::from_secs(5))
        .call()
        .expect("the leader's health check");
    assert_eq!(health.status(), 200);
    let (dcs, cluster) = (hosts.dcs(), hosts.cluster.clone());
    let secrets_dir = hosts.agent_dir(0);
    let status = move |state: &std::path::Path, extra: &[String]| {
        let mut cmd = Command::new(HERD);
        cmd.arg("status")
            .args(extra)
            .args(["--dcs", &dcs, "--cluster", &cluster])
            .arg("--data-dir")
            .arg(&secrets_dir)
            .args(["--etcd-timeout-ms", "1000"])
            .env("XDG_STATE_HOME", state);
        let out = herd_testkit::output_within(&mut cmd, Duration::from_secs(60)).expect("exits");
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            herd_testkit::describe(&out),
        )
    };
    let state = hosts.dir.path().join("state");
    let (code, _, all) = status(&state, &[]);
    assert_eq!(code, Some(0), "{all}");
    assert!(
        state.join(format!("herd/{}.json", hosts.cluster)).exists(),
        "the agents' addresses are kept"
    );

    hosts.etcd.kill(1);
    hosts.etcd.kill(2);
    let marked = "from the agent; store unreachable";
    let leader_row = |out: &str| {
        out.lines().any(|l| {
            l.starts_with(&format!("{} ", Hosts::name(leader)))
                && l.contains(" primary ")
                && l.ends_with(marked)
        })
    };
    let started = Instant::now();
    let (code, out, all) = status(&state, &[]);
    eprintln!(
        "herd status during the outage took {:?}:\n{out}",
        started.elapsed()
    );
    assert_eq!(code, Some(2), "{all}\n{}", hosts.logs());
    assert!(
        out.contains(&format!("leader: {} ({marked})", Hosts::name(leader))),
        "{all}"
    );
    assert!(leader_row(&out), "{all}");
    assert!(
        out.contains("does not answer"),
        "the killed etcd members: {all}"
    );

    // Nothing kept (another machine): the agents named on the command line.
    let elsewhere = hosts.dir.path().join("elsewhere");
    let named: Vec<String> = (0..3)
        .flat_map(|i| {
            [
                "--agent-api".to_string(),
                format!("http://{}", hosts.api(i)),
            ]
        })
        .collect();
    let (code, out, all) = status(&elsewhere, &named);
    assert_eq!(code, Some(2), "{all}");
    assert!(leader_row(&out), "{all}");
    // Neither: a clear error naming the flag.
    let (code, _, all) = status(&elsewhere, &[]);
    assert_eq!(code, Some(1), "{all}");
    assert!(all.contains("--agent-api"), "{all}");

    hosts.etcd.restart(1);
    hosts.etcd.restart(2);
    herd_testkit::wait_until(Duration::from_secs(60), "the store back", || {
        (status(&state, &[]).0 == Some(0)).then_some(())
    });
}
