//! `herd secrets rotate --dcs …` (issue #42 part 4, across hosts): two `herd agent`s (a primary
//! and a replica) and a `herd proxy` over a real etcd, on loopback, each with its own copy of
//! the secrets directory, and an operator's copy the command runs with. Four sessions opened
//! through the proxy before the rotation write all along.
//!
//! With the replica's agent frozen (SIGSTOP) the command refuses, naming it, and no server
//! changes (the old password still logs in). Once it runs again, the command goes on with the
//! same rotation: afterwards no write failed, the old password is refused and the new one
//! accepted at the proxy and at the primary, every copy (agents', proxy's, operator's) holds
//! the new passwords (0600, no `.next` left), the store's copy is gone, the agents' API answers
//! requests signed with the new key, and the replica, its server killed and restarted by its
//! agent, streams again (its walreceiver logs in with the new replication password).

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::hosts::{copy_dir, Hosts, HERD};
use common::{mode, try_connect};
use herd_cluster::{Layout, Secrets};
use nix::sys::signal::Signal;

/// `herd secrets rotate --dcs … --wait WAIT` with the operator's copy (90 s at most); (exit
/// code, stdout + stderr, how long it took).
fn rotate(hosts: &Hosts, op: &Path, wait: &str) -> (Option<i32>, String, Duration) {
    let began = Instant::now();
    let mut cmd = Command::new(HERD);
    cmd.args(["secrets", "rotate", "--wait", wait, "--data-dir"])
        .arg(op)
        .args(["--dcs", &hosts.dcs(), "--cluster", &hosts.cluster]);
    let out = herd_testkit::output_within(&mut cmd, Duration::from_secs(90)).expect("herd exits");
    (
        out.status.code(),
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ),
        began.elapsed(),
    )
}

fn url(host: &str, port: u16, password: &str) -> String {
    format!("postgresql://postgres:{password}@{host}:{port}/postgres?connect_timeout=3")
}

/// Whether the store still holds the rotation record (etcd's JSON gateway).
fn record_in_store(hosts: &Hosts) -> bool {
    use base64::Engine as _;
    let key = format!("/herd/{}/secrets_rotation", hosts.cluster);
    let body = serde_json::json!({
        "key": base64::engine::general_purpose::STANDARD.encode(key),
    });
    let endpoint = hosts.etcd.endpoints()[0].clone();
    let answer: serde_json::Value = ureq::AgentBuilder::new()
        .timeout(Duration::from_secs(5))
        .build()
        .post(&format!("{endpoint}/v3/kv/range"))
        .send_json(body)
        .expect("etcd range")
        .into_json()
        .expect("etcd answer");
    answer["kvs"].as_array().is_some_and(|k| !k.is_empty())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn passwords_rotate_across_hosts_without_failing_a_write() {
    let started = Instant::now();
    let mut hosts = Hosts::prepare(None, None);
    hosts.start_agent(0);
    hosts.wait_role(0, "primary", Duration::from_secs(60));
    let first = hosts.agent_dir(0).join("secrets");
    let op: PathBuf = hosts.dir.path().join("operator");
    for to in [
        hosts.agent_dir(1).join("secrets"),
        hosts.dir.path().join("proxy/secrets"),
        op.join("secrets"),
    ] {
        copy_dir(&first, &to);
    }
    hosts.start_agent(1);
    hosts.start_proxy();
    hosts.wait_role(1, "replica", Duration::from_secs(60));
    hosts.wait_proxy_listening();
    let old = Secrets::load(&Layout::new(hosts.agent_dir(0))).expect("the first passwords");
    let proxy_url = |password: &str| url("127.0.0.1", hosts.proxy_port(), password);
    let primary_url = |password: &str| url("127.0.0.1", hosts.pg_port(0), password);

    let admin = {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Some(c) = try_connect(&proxy_url(&old.superuser)).await {
                break c;
            }
            assert!(
                Instant::now() < deadline,
                "no session through the proxy\n{}",
                hosts.logs()
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    };
    admin
        .batch_execute("create table rot (id bigserial primary key, writer int)")
        .await
        .expect("table");

    // Four sessions opened before the rotation write until the end.
    let stop = Arc::new(AtomicBool::new(false));
    let ok = Arc::new(AtomicU64::new(0));
    let failed = Arc::new(Mutex::new(Vec::<String>::new()));
    let mut writers = Vec::new();
    for w in 0..4 {
        let client = try_connect(&proxy_url(&old.superuser))
            .await
            .expect("a writer's session");
        let (stop, ok, failed) = (stop.clone(), ok.clone(), failed.clone());
        writers.push(tokio::spawn(async move {
            while !stop.load(Ordering::SeqCst) {
                let sql = format!("insert into rot (writer) values ({w})");
                match tokio::time::timeout(Duration::from_secs(10), client.batch_execute(&sql))
                    .await
                {
                    Ok(Ok(())) => {
                        ok.fetch_add(1, Ordering::SeqCst);
                    }
                    Ok(Err(e)) => failed.lock().expect("failed").push(format!("{e:?}")),
                    Err(_) => failed.lock().expect("failed").push("timed out".into()),
                }
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        }));
    }
    let wait_writes = |what: &'static str| {
        let (ok, hosts) = (ok.clone(), &hosts);
        async move {
            let before = ok.load(Ordering::SeqCst);
            let deadline = Instant::now() + Duration::from_secs(30);
            while ok.load(Ordering::SeqCst) < before + 40 {
                assert!(
                    Instant::now() < deadline,
                    "no writes {what}\n{}",
                    hosts.logs()
                );
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    };
    wait_writes("before the rotation").await;

    // A member that does not take the next passwords up (its agent frozen): refused, named,
    // and no server changed.
    hosts.signal_agent(1, Signal::SIGSTOP);
    let (code, out, _) = rotate(&hosts, &op, "2");
    hosts.signal_agent(1, Signal::SIGCONT);
    assert_ne!(code, Some(0), "rotated with h1 frozen: {out}");
    assert!(
        out.contains("h1") && out.contains("no server was changed") && !out.contains("h0,"),
        "{out}"
    );
    assert!(
        try_connect(&primary_url(&old.superuser)).await.is_some(),
        "the primary refused the old password after a refused rotation"
    );
    assert_eq!(
        Secrets::load(&Layout::new(&op)).expect("operator's copy"),
        old,
        "the operator's current files changed"
    );

    // Meanwhile the members that took them up hold them (0600) and h0's API answers requests
    // signed with either key.
    let staged = std::fs::read_to_string(op.join("secrets/superuser.password.next"))
        .expect("the operator's copy staged the next password");
    let staged = staged.trim();
    let held = hosts.agent_dir(0).join("secrets/superuser.password.next");
    assert_eq!(
        std::fs::read_to_string(&held)
            .expect("h0 holds the next password")
            .trim(),
        staged
    );
    assert_eq!(mode(&held), 0o600);
    for (which, password) in [("current", old.superuser.as_str()), ("next", staged)] {
        assert!(
            herd_testkit::agents::member(&hosts.api(0), password).is_some(),
            "h0's API refuses a request signed with the {which} key\n{}",
            hosts.logs()
        );
    }

    assert!(
        herd_testkit::agents::member(&hosts.api(0), "a guess").is_none(),
        "h0's API answers any key"
    );
    let status = hosts.herd_store(&["status"]);
    assert!(
        status.contains("password rotation under way: h0 holds the next passwords"),
        "{status}"
    );

    // The rotation, resumed once h1 runs.
    let (code, out, took) = rotate(&hosts, &op, "60");
    assert_eq!(code, Some(0), "{out}\n{}", hosts.logs());
    assert!(
        out.contains("Going on with the rotation under way"),
        "{out}"
    );
    let new = Secrets::load(&Layout::new(&op)).expect("the new passwords");
    assert_ne!(new.superuser, old.superuser);
    assert_ne!(new.replication, old.replication);
    wait_writes("after the rotation").await;
    stop.store(true, Ordering::SeqCst);
    for w in writers {
        w.await.expect("writer");
    }
    let failed = failed.lock().expect("failed").clone();
    let written = ok.load(Ordering::SeqCst);
    assert!(
        failed.is_empty(),
        "{} of {} writes failed across the rotation: {failed:?}\n{}",
        failed.len(),
        written + failed.len() as u64,
        hosts.logs()
    );

    // Old refused, new accepted, at the proxy and at the primary.
    for (what, at) in [
        ("the proxy", &proxy_url as &dyn Fn(&str) -> String),
        ("the primary", &primary_url),
    ] {
        assert!(
            try_connect(&at(&old.superuser)).await.is_none(),
            "{what} still accepts the old password"
        );
        let deadline = Instant::now() + Duration::from_secs(20);
        while try_connect(&at(&new.superuser)).await.is_none() {
            assert!(
                Instant::now() < deadline,
                "{what} refuses the new password\n{}",
                hosts.logs()
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    // Every copy holds the new passwords, 0600, no `.next` left (each member renames at its
    // round, acknowledged before the command ended).
    for dir in [
        hosts.agent_dir(0),
        hosts.agent_dir(1),
        hosts.dir.path().join("proxy"),
        op.clone(),
    ] {
        assert_eq!(
            Secrets::load(&Layout::new(&dir)).expect("passwords"),
            new,
            "{}",
            dir.display()
        );
        for name in ["superuser.password", "replication.password", "pgpass"] {
            assert_eq!(
                mode(&dir.join("secrets").join(name)),
                0o600,
                "{}/{name}",
                dir.display()
            );
        }
        for name in ["superuser.password.next", "replication.password.next"] {
            assert!(
                !dir.join("secrets").join(name).exists(),
                "{}/{name} left",
                dir.display()
            );
        }
    }

    // The store's copy goes (its last form, without the passwords, expires).
    herd_testkit::wait_until(Duration::from_secs(20), "the store's copy to go", || {
        (!record_in_store(&hosts)).then_some(())
    });

    // The agents' API answers requests signed with the new key (`role` signs with h0's file).
    assert_eq!(
        hosts.role(1).as_deref(),
        Some("replica"),
        "{}",
        hosts.logs()
    );

    // The replica's server killed and restarted by its agent streams again: its walreceiver
    // logged in with the new replication password from its passfile.
    let pid = hosts.postmaster(1).expect("h1's postmaster");
    let killed_at = Instant::now();
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), Signal::SIGKILL).expect("kill -9");
    let primary = try_connect(&primary_url(&new.superuser))
        .await
        .expect("the primary with the new password");
    let deadline = Instant::now() + Duration::from_secs(90);
    loop {
        let restarted = hosts.postmaster(1).is_some_and(|p| p != pid);
        let streaming: i64 = primary
            .query_one(
                "select count(*) from pg_stat_replication \
                 where application_name = 'h1' and state = 'streaming' \
                 and backend_start > now() - $1::float8 * interval '1 second'",
                &[&killed_at.elapsed().as_secs_f64()],
            )
            .await
            .expect("pg_stat_replication")
            .get(0);
        if restarted && streaming == 1 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "h1 does not stream again after its restart\n{}\n{}",
            hosts.logs(),
            std::fs::read_to_string(hosts.agent_dir(1).join("logs/postgresql.log"))
                .unwrap_or_default()
        );
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    eprintln!(
        "rotation across hosts: {written} writes through sessions opened before it, 0 failed; \
         the command took {:.1} s; the test {:.0} s",
        took.as_secs_f64(),
        started.elapsed().as_secs_f64()
    );
}
