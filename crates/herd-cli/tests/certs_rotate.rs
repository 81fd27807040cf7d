//! `herd certs rotate` (issue #42): three `herd agent`s on loopback with the cluster's CA and
//! a proxy, a write every ~20 ms through the proxy; the CA is replaced in three steps
//! (`--stage`, `--issue`, `--finish`), the secrets directory copied to every host after the
//! first and the last as an operator would. After each step writes keep being acknowledged
//! and both standbys stream over TLS; each step refuses out of order, `--issue` is refused,
//! naming them, while members do not trust the next CA yet, and `--finish` is refused, naming
//! it, while a member (h2, not given the next CA's key) is on the old CA.

mod common;

use std::os::unix::fs::MetadataExt as _;
use std::path::Path;
use std::process::Command;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::hosts::{Hosts, Record, HERD};

/// Runs `herd ARGS` (60 s at most); (exit code, stdout + stderr).
fn herd(args: &[&str]) -> (Option<i32>, String) {
    let mut cmd = Command::new(HERD);
    cmd.args(args);
    let out = herd_testkit::output_within(&mut cmd, Duration::from_secs(60)).expect("herd exits");
    (
        out.status.code(),
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ),
    )
}

/// `herd certs rotate --STEP` on h0's data directory, through the cluster's store.
fn rotate(hosts: &Hosts, step: &str) -> (Option<i32>, String) {
    let dir = hosts.agent_dir(0);
    let dir = dir.to_str().expect("utf-8 path");
    let dcs = hosts.dcs();
    herd(&[
        "certs",
        "rotate",
        &format!("--{step}"),
        "--data-dir",
        dir,
        "--dcs",
        &dcs,
        "--cluster",
        &hosts.cluster,
    ])
}

/// Copies the secrets directory `from` to `to` as `rsync -a --delete` would: each file through
/// a temporary one and a rename, files no longer in `from` removed (`except`: left out); the
/// owner kept with `keep_owner`, else the copy is the copier's (as a plain `scp -r`: the agents
/// hand a changed `ca.crt` to the servers' OS user).
fn copy_secrets(from: &Path, to: &Path, except: &[&str], keep_owner: bool) {
    for entry in std::fs::read_dir(from).expect("read secrets") {
        let entry = entry.expect("entry");
        let name = entry.file_name();
        if except.iter().any(|e| name == *e) {
            continue;
        }
        let tmp = to.join(".copying");
        std::fs::copy(entry.path(), &tmp).expect("copy");
        // As rsync -a run as root: the owner kept (the servers' OS user reads ca.crt).
        if keep_owner {
            let meta = entry.metadata().expect("metadata");
            std::os::unix::fs::chown(&tmp, Some(meta.uid()), Some(meta.gid())).expect("chown");
        }
        std::fs::rename(&tmp, to.join(&name)).expect("rename");
    }
    for entry in std::fs::read_dir(to).expect("read copy") {
        let entry = entry.expect("entry");
        if !from.join(entry.file_name()).exists() {
            std::fs::remove_file(entry.path()).expect("remove");
        }
    }
}

/// Every other host's (and the proxy's) secrets made h0's.
fn copy_to_all(hosts: &Hosts, except_h2: &[&str]) {
    let from = hosts.agent_dir(0).join("secrets");
    copy_secrets(&from, &hosts.agent_dir(1).join("secrets"), &[], false);
    copy_secrets(&from, &hosts.agent_dir(2).join("secrets"), except_h2, false);
    copy_secrets(&from, &hosts.dir.path().join("proxy/secrets"), &[], false);
}

/// The superuser on node `i` over verified TLS (the CA file read again when it changes).
async fn superuser_over_tls(hosts: &Hosts, i: usize) -> tokio_postgres::Client {
    let ca = hosts.agent_dir(0).join("secrets").join(herd_certs::CA_CERT);
    trusting(hosts, i, &ca).await
}

/// The superuser on node `i`, trusting only the CA(s) in `ca` (30 s of tries): the server
/// serves a certificate of that CA.
async fn trusting(hosts: &Hosts, i: usize, ca: &Path) -> tokio_postgres::Client {
    let tls = herd_pg::ClientTls::new(herd_pg::TlsMode::VerifyFull, ca)
        .expect("the cluster's CA")
        .expect("TLS settings");
    let mut config: tokio_postgres::Config = hosts.node_url(i).parse().expect("node URL");
    config.application_name("herd-test");
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        match herd_pg::connect_config(&mut config, Some(&tls)).await {
            Ok(client) => return client,
            Err(e) => assert!(
                Instant::now() < deadline,
                "the superuser over TLS to {}: {e:?}\n{}\n{}",
                hosts.pg_host(i),
                hosts.logs(),
                std::fs::read_to_string(hosts.agent_dir(i).join("logs/postgresql.log"))
                    .unwrap_or_default()
            ),
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// After a step: new writes acknowledged through the proxy (20 more within 60 s), and both
/// standbys streaming over TLS as a new verified connection to the primary sees it.
async fn still_serving(hosts: &Hosts, record: &Arc<Mutex<Record>>, after: &str) {
    let acked = || record.lock().expect("record").acknowledged.len();
    let before = acked();
    let deadline = Instant::now() + Duration::from_secs(60);
    while acked() < before + 20 {
        assert!(
            Instant::now() < deadline,
            "after {after}: writes stopped being acknowledged ({} then {}); errors: {:?}\n{}",
            before,
            acked(),
            record.lock().expect("record").write_errors,
            hosts.logs()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let primary = hosts.wait_primary(after);
    let client = superuser_over_tls(hosts, primary).await;
    let over_tls = "select count(*) filter (where ssl), count(*) \
                    from pg_stat_ssl join pg_stat_replication using (pid)";
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let row = client.query_one(over_tls, &[]).await.expect("pg_stat_ssl");
        let seen = (row.get::<_, i64>(0), row.get::<_, i64>(1));
        if seen == (2, 2) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "after {after}: standbys streaming over TLS / all: {seen:?}\n{}",
            hosts.logs()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    eprintln!(
        "after {after}: {} writes acknowledged, both standbys on TLS",
        acked()
    );
}

/// Waits (60 s) until the members' records show `want(i, issuer)` for every member.
fn wait_issuers(hosts: &Hosts, want: &dyn Fn(usize, Option<&str>) -> bool, what: &str) {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let issuers: Vec<Option<String>> = (0..3)
            .map(|i| {
                hosts
                    .member(i)
                    .and_then(|m| m["tls_issuer"].as_str().map(str::to_string))
            })
            .collect();
        if (0..3).all(|i| want(i, issuers[i].as_deref())) {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{what}: issuers {issuers:?}\n{}",
            hosts.logs()
        );
        std::thread::sleep(Duration::from_millis(300));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_ca_is_replaced_in_three_steps_under_writes() {
    let started = Instant::now();
    let mut hosts = Hosts::prepare(None, None);
    let first = hosts.agent_dir(0);
    herd_cluster::Secrets::generate()
        .save(
            &herd_cluster::Layout::new(&first),
            herd_cluster::REPLICATION_USER,
        )
        .expect("secrets");
    let first_arg = first.to_str().expect("utf-8 path").to_string();
    let (code, out) = herd(&[
        "certs",
        "init",
        "--cluster",
        "rot",
        "--data-dir",
        &first_arg,
    ]);
    assert_eq!(code, Some(0), "{out}");
    let secrets = first.join("secrets");
    let old_pem = std::fs::read_to_string(secrets.join("ca.crt")).expect("ca.crt");
    let old_fp = herd_certs::fingerprint(&old_pem).expect("fingerprint");
    hosts.start_members();
    hosts.start_proxy();
    hosts.wait_proxy_listening();
    wait_issuers(
        &hosts,
        &|_, fp| fp == Some(old_fp.as_str()),
        "on the first CA",
    );
    let (stop, record, threads) = common::hosts::start_checker(&hosts).await;
    still_serving(&hosts, &record, "start").await;

    // Out of order: nothing staged yet.
    for step in ["issue", "finish"] {
        let (code, out) = rotate(&hosts, step);
        assert_ne!(code, Some(0), "--{step} before --stage ran: {out}");
        assert!(
            out.contains("run `herd certs rotate --stage` first"),
            "{out}"
        );
    }

    // 1. Stage, and copy to every host: h2 gets the bundle but not the next CA's key.
    let (code, out) = rotate(&hosts, "stage");
    assert_eq!(code, Some(0), "{out}");
    let (code, out) = rotate(&hosts, "stage");
    assert_ne!(code, Some(0), "a second --stage ran: {out}");
    assert!(out.contains("a rotation is under way"), "{out}");
    let next_fp = herd_certs::rotate::next_fingerprint(&secrets)
        .expect("next")
        .expect("staged");
    // Not copied yet: h1 and h2 do not trust the next CA, so --issue waits for them.
    let (code, out) = rotate(&hosts, "issue");
    assert_ne!(
        code,
        Some(0),
        "--issue ran before the hosts had the bundle: {out}"
    );
    assert!(
        out.contains("do not trust the next CA yet") && out.contains("h1") && out.contains("h2"),
        "{out}"
    );
    copy_to_all(&hosts, &["ca.next.key"]);
    still_serving(&hosts, &record, "--stage").await;
    let (code, out) = rotate(&hosts, "finish");
    assert_ne!(code, Some(0), "--finish before --issue ran: {out}");
    assert!(
        out.contains("run `herd certs rotate --issue` first"),
        "{out}"
    );

    // 2. Issue: h0 and h1 move to the next CA; h2, without its key, stays on the old one.
    // Every agent publishes what its ca.crt holds within a round of the copy.
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let (code, out) = rotate(&hosts, "issue");
        if code == Some(0) {
            break;
        }
        assert!(Instant::now() < deadline, "--issue after the copy: {out}");
        std::thread::sleep(Duration::from_millis(500));
    }
    wait_issuers(
        &hosts,
        &|i, fp| {
            fp == Some(if i == 2 {
                old_fp.as_str()
            } else {
                next_fp.as_str()
            })
        },
        "h0, h1 on the next CA, h2 on the old",
    );
    still_serving(&hosts, &record, "--issue (h2 on the old CA)").await;
    // What the servers serve, not only what their files say: h0, h1 the next CA's, h2 the old.
    let only_old = hosts.dir.path().join("only-old.crt");
    std::fs::write(&only_old, &old_pem).expect("old CA alone");
    let only_next = secrets.join("ca.next.crt");
    for i in 0..2 {
        trusting(&hosts, i, &only_next).await;
    }
    trusting(&hosts, 2, &only_old).await;
    let (code, out) = rotate(&hosts, "finish");
    assert_ne!(code, Some(0), "--finish ran with h2 on the old CA: {out}");
    assert!(out.contains("h2 still serve"), "{out}");
    assert!(!out.contains("h0") && !out.contains("h1"), "{out}");

    // h2 gets the next CA's key: it issues from it within a round.
    copy_to_all(&hosts, &[]);
    wait_issuers(
        &hosts,
        &|_, fp| fp == Some(next_fp.as_str()),
        "all on the next CA",
    );
    still_serving(&hosts, &record, "--issue").await;
    for i in 0..3 {
        trusting(&hosts, i, &only_next).await;
    }

    // 3. Finish: the next CA alone, the old kept; copied to every host.
    let (code, out) = rotate(&hosts, "finish");
    assert_eq!(code, Some(0), "{out}");
    let ca = std::fs::read_to_string(secrets.join("ca.crt")).expect("ca.crt");
    assert_eq!(herd_certs::pem_blocks(&ca).len(), 1, "{ca}");
    assert_eq!(herd_certs::fingerprint(&ca).expect("fp"), next_fp);
    assert!(secrets.join("ca.old.crt").exists() && secrets.join("ca.old.key").exists());
    assert!(!secrets.join("ca.next.crt").exists());
    copy_to_all(&hosts, &[]);
    still_serving(&hosts, &record, "--finish").await;
    for i in 0..3 {
        trusting(&hosts, i, &secrets.join("ca.crt")).await;
    }
    let (code, out) = rotate(&hosts, "finish");
    assert_ne!(code, Some(0), "a second --finish ran: {out}");

    common::hosts::finish(&hosts, &stop, threads, &record).await;
    eprintln!("rotation test took {:?}", started.elapsed());
}

/// Two shard groups of two agents: `--issue` flags both groups, `--finish` waits for the
/// members of both, and the general path's postgres_fdw reads (group 0 reading group 1 over
/// verified TLS) and writes through the proxy go on after each step.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn both_shard_groups_move_to_the_next_ca() {
    use common::agent_groups::Groups;
    const AGENTS: [(&str, u32); 4] = [("a0", 0), ("a1", 0), ("b0", 1), ("b1", 1)];
    let mut g = Groups::new(&AGENTS, "gr");
    let first = g.agent_dir(0);
    std::fs::create_dir_all(&first).expect("agent dir");
    herd_cluster::Secrets::generate()
        .save(
            &herd_cluster::Layout::new(&first),
            herd_cluster::REPLICATION_USER,
        )
        .expect("secrets");
    let first_arg = first.to_str().expect("utf-8 path").to_string();
    let (code, out) = herd(&["certs", "init", "--cluster", "gr", "--data-dir", &first_arg]);
    assert_eq!(code, Some(0), "{out}");
    g.start_agent(0);
    g.wait_role(0, "primary", Duration::from_secs(60));
    for i in 1..AGENTS.len() {
        g.start_agent(i);
    }
    g.wait_role(1, "replica", Duration::from_secs(60));
    g.wait_primary_of(&[2, 3], Duration::from_secs(90));
    g.start_proxy();
    let proxy = g.connect_proxy().await;
    common::shards::distributed_table(&proxy, "items", "v int").await;
    let secrets = first.join("secrets");
    let dcs = g.dcs();
    let rotate = |step: &str| {
        herd(&[
            "certs",
            "rotate",
            &format!("--{step}"),
            "--data-dir",
            &first_arg,
            "--dcs",
            &dcs,
            "--cluster",
            &g.cluster,
        ])
    };
    let copy_all = || {
        for i in 1..AGENTS.len() {
            copy_secrets(&secrets, &g.agent_dir(i).join("secrets"), &[], true);
        }
        copy_secrets(&secrets, &g.dir.path().join("proxy/secrets"), &[], true);
    };
    let mut next_id = 0;
    let mut serves = |after: &'static str| {
        next_id += 100;
        let id = next_id;
        let proxy = &proxy;
        async move {
            proxy
                .execute(
                    "insert into items select i, i % 7 from generate_series($1::int, $1::int + 99) i",
                    &[&id],
                )
                .await
                .unwrap_or_else(|e| panic!("after {after}: writes through the proxy: {e:?}"));
            let rows = proxy
                .query("select distinct on (v) v from items order by v", &[])
                .await
                .unwrap_or_else(|e| {
                    panic!("after {after}: a general read over both groups: {e:?}")
                });
            assert_eq!(rows.len(), 7, "after {after}: every value once");
        }
    };
    serves("start").await;

    let (code, out) = rotate("stage");
    assert_eq!(code, Some(0), "{out}");
    let next_fp = herd_certs::rotate::next_fingerprint(&secrets)
        .expect("next")
        .expect("staged");
    copy_all();
    serves("--stage").await;
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let (code, out) = rotate("issue");
        if code == Some(0) {
            break;
        }
        assert!(Instant::now() < deadline, "--issue after the copy: {out}");
        std::thread::sleep(Duration::from_millis(500));
    }
    let password = g.password();
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let issuers: Vec<Option<String>> = (0..AGENTS.len())
            .map(|i| {
                herd_testkit::agents::member(&g.api(i), &password)
                    .and_then(|m| m["tls_issuer"].as_str().map(str::to_string))
            })
            .collect();
        if issuers
            .iter()
            .all(|i| i.as_deref() == Some(next_fp.as_str()))
        {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "both groups on the next CA: {issuers:?}\n{}",
            g.logs()
        );
        std::thread::sleep(Duration::from_millis(300));
    }
    serves("--issue").await;
    let (code, out) = rotate("finish");
    assert_eq!(code, Some(0), "{out}");
    copy_all();
    serves("--finish").await;
    // New sessions (new fdw connections, new pooled connections) once the servers reloaded.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let fresh = g.connect_proxy().await;
    let rows = fresh
        .query("select distinct on (v) v from items order by v", &[])
        .await
        .expect("a general read in a new session after --finish");
    assert_eq!(rows.len(), 7);
}
