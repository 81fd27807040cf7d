//! Backups across hosts: three `herd agent`s, each host in its own network namespace, whose
//! herd.toml has `[backup]` with a repository on the file system every namespace sees (as an
//! NFS mount would be across real hosts).

mod common;

use std::io::BufRead;
use std::process::{Command, Stdio};
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use common::hosts::{Hosts, HERD};
use herd_testkit::netns::Lab;
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;

/// Writes through the proxy all along; `herd backup --dcs` (a second one at the same moment is
/// refused, naming the rule); kill -9 of the primary's agent and server; writes on the new
/// primary; then `herd restore --to latest --repository …` into a new directory holds every
/// acknowledged write, those after the failover included (the archive followed the new
/// primary, timeline history and all).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backup_across_hosts_restores_every_acknowledged_write_after_a_failover() {
    let lab = match Lab::build(3) {
        Ok(lab) => lab,
        Err(e) if !Lab::available() => {
            eprintln!("SKIPPED: network namespaces need root and `ip netns` ({e})");
            return;
        }
        Err(e) => panic!("building the network namespaces: {e}"),
    };
    let hosts = Hosts::start_in_configured(lab, "[backup]\nrepository = \"@DIR@/repo\"\n");
    let repo = hosts.dir.path().join("repo");
    let (stop, record, threads) = common::hosts::start_checker(&hosts).await;
    let acked = || record.lock().expect("record").acknowledged.len();
    hosts.wait_writes(&acked, "at first");

    // A backup, and a second one asked while it runs: refused.
    let started = Instant::now();
    let mut first = Command::new(HERD)
        .args(["backup", "--dcs", &hosts.dcs(), "--cluster", &hosts.cluster])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("herd backup");
    let stderr = first.stderr.take().expect("stderr");
    let (tx, rx) = std::sync::mpsc::channel::<String>();
    let reader = std::thread::spawn(move || {
        for line in std::io::BufReader::new(stderr)
            .lines()
            .map_while(Result::ok)
        {
            let _ = tx.send(line);
        }
    });
    let mut first_err = Vec::new();
    loop {
        let line = rx
            .recv_timeout(Duration::from_secs(60))
            .unwrap_or_else(|_| {
                panic!("herd backup asked nobody: {first_err:?}\n{}", hosts.logs())
            });
        first_err.push(line.clone());
        if line.contains("backup: asked") {
            break;
        }
    }
    let mut second = Command::new(HERD);
    second.args([
        "backup",
        "--dcs",
        &hosts.dcs(),
        "--cluster",
        &hosts.cluster,
        "--group",
        "0",
    ]);
    let second = herd_testkit::output_within(&mut second, Duration::from_secs(60))
        .expect("the second herd backup exits");
    let said = String::from_utf8_lossy(&second.stderr);
    assert!(
        !second.status.success()
            && said.contains("another backup of shard group 0")
            && said.contains("one backup at a time per group"),
        "a second backup while one runs: {}",
        herd_testkit::describe(&second)
    );
    let deadline = Instant::now() + Duration::from_secs(300);
    let status = loop {
        if let Some(status) = first.try_wait().expect("wait") {
            break status;
        }
        assert!(
            Instant::now() < deadline,
            "herd backup still runs after 300 s\n{}",
            hosts.logs()
        );
        std::thread::sleep(Duration::from_millis(200));
    };
    reader.join().expect("reader");
    first_err.extend(rx.try_iter());
    let mut out = String::new();
    std::io::Read::read_to_string(&mut first.stdout.take().expect("stdout"), &mut out)
        .expect("stdout");
    assert!(
        status.success() && out.contains("Shard group 0: backup"),
        "herd backup: {status}\n{out}\n{}\n{}",
        first_err.join("\n"),
        hosts.logs()
    );
    eprintln!(
        "backup across hosts: {:.1} s ({})",
        started.elapsed().as_secs_f64(),
        out.lines().next().unwrap_or_default()
    );
    assert!(
        repo.join("backup/herd-g0").is_dir(),
        "the backup is in the shared repository"
    );
    // `herd backup list --dcs` lists it from the repository the agents' herd.toml names.
    let label = std::fs::read_dir(repo.join("backup/herd-g0"))
        .expect("the stanza's backups")
        .flatten()
        .map(|d| d.file_name().to_string_lossy().into_owned())
        .find(|n| n.ends_with('F') && n.starts_with(|c: char| c.is_ascii_digit()))
        .expect("a full backup's directory");
    let agents_toml = hosts.agent_config.clone().expect("the agents' herd.toml");
    let mut list = Command::new(HERD);
    list.args([
        "backup",
        "list",
        "--dcs",
        &hosts.dcs(),
        "--cluster",
        &hosts.cluster,
    ])
    .arg("--config")
    .arg(&agents_toml);
    let listed = herd_testkit::output_within(&mut list, Duration::from_secs(60))
        .expect("herd backup list --dcs exits");
    let text = String::from_utf8_lossy(&listed.stdout);
    assert!(
        listed.status.success()
            && text
                .lines()
                .any(|l| l.starts_with(&label) && l.contains("full")),
        "herd backup list --dcs shows {label}: {}",
        herd_testkit::describe(&listed)
    );
    eprintln!("herd backup list --dcs:\n{text}");
    let mut bare = Command::new(HERD);
    bare.args([
        "backup",
        "list",
        "--dcs",
        &hosts.dcs(),
        "--cluster",
        &hosts.cluster,
    ]);
    let bare = herd_testkit::output_within(&mut bare, Duration::from_secs(60))
        .expect("herd backup list --dcs without --config exits");
    assert!(
        !bare.status.success() && String::from_utf8_lossy(&bare.stderr).contains("--config"),
        "without --config: {}",
        herd_testkit::describe(&bare)
    );
    hosts.wait_writes(&acked, "after the backup");

    // kill -9 of the primary's agent and server: another host takes over and archives.
    let old = hosts.wait_primary("before the failover");
    let postmaster = hosts.postmaster(old).expect("postmaster pid");
    hosts.signal_agent(old, Signal::SIGKILL);
    let _ = kill(Pid::from_raw(postmaster), Signal::SIGKILL);
    let deadline = Instant::now() + Duration::from_secs(90);
    let new = loop {
        if let Some(p) = (0..3).find(|&i| i != old && hosts.role(i).as_deref() == Some("primary")) {
            break p;
        }
        assert!(
            Instant::now() < deadline,
            "no failover after 90 s\n{}",
            hosts.logs()
        );
        std::thread::sleep(Duration::from_millis(200));
    };
    hosts.wait_writes(&acked, "after the failover");
    stop.store(true, Ordering::SeqCst);
    for t in threads {
        t.join().expect("checker thread");
    }
    let record = std::mem::take(&mut *record.lock().expect("record"));
    assert!(record.two_writable.is_empty(), "{:?}", record.two_writable);

    // The new primary's current segment archived (as archive_timeout would, sooner).
    let primary = common::connect(&hosts.node_url(new)).await;
    let segment: String = primary
        .query_one("select pg_walfile_name(pg_switch_wal())", &[])
        .await
        .expect("pg_switch_wal")
        .get(0);
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let last: String = primary
            .query_one(
                "select coalesce(last_archived_wal, '') from pg_stat_archiver",
                &[],
            )
            .await
            .expect("pg_stat_archiver")
            .get(0);
        if last >= segment {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "segment {segment} not archived after 60 s (last {last:?})\n{}",
            hosts.logs()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // `herd status --dcs` shows the new primary's archiving, read by its agent.
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let status: serde_json::Value =
            serde_json::from_str(&hosts.herd_store(&["status", "--json"])).expect("status JSON");
        let archiving = &status["archiving"];
        if archiving["last_archived_wal"]
            .as_str()
            .is_some_and(|w| w >= segment.as_str())
        {
            assert!(archiving["warning"].is_null(), "{archiving}");
            let text = hosts.herd_store(&["status"]);
            assert!(text.contains("WAL archiving: last archived"), "{text}");
            break;
        }
        assert!(
            Instant::now() < deadline,
            "herd status --dcs shows no archiving up to {segment}: {archiving}"
        );
        std::thread::sleep(Duration::from_millis(300));
    }
    assert!(
        std::fs::read_dir(repo.join("archive/herd-g0"))
            .expect("archive")
            .flatten()
            .any(|d| std::fs::read_dir(d.path())
                .into_iter()
                .flatten()
                .flatten()
                .any(|f| f.file_name().to_string_lossy().ends_with(".history"))),
        "the new timeline's history file is archived"
    );

    // Restored into a new directory from the repository alone: every acknowledged write.
    let restored = common::cluster();
    let port = restored.port.to_string();
    let repo_arg = repo.display().to_string();
    let out = restored.herd(&[
        "restore",
        "--to",
        "latest",
        "--repository",
        &repo_arg,
        "--port",
        &port,
    ]);
    assert!(
        out.status.success(),
        "restore: {}",
        herd_testkit::describe(&out)
    );
    restored.up(&[]);
    let client = common::connect(&restored.url(&["--primary"])).await;
    let present: std::collections::HashSet<i64> = client
        .query("select id from acked", &[])
        .await
        .expect("read the restored rows")
        .iter()
        .map(|r| r.get(0))
        .collect();
    let lost: Vec<&i64> = record
        .acknowledged
        .iter()
        .filter(|id| !present.contains(id))
        .collect();
    assert!(
        lost.is_empty(),
        "{} of {} acknowledged writes missing from the restore: {lost:?}",
        lost.len(),
        record.acknowledged.len()
    );
    eprintln!(
        "{} acknowledged writes (before and after the failover), all restored",
        record.acknowledged.len()
    );
}

/// The backups in `config`'s repository as (label, start, stop), read with pgBackRest itself.
fn backups(config: &std::path::Path) -> Vec<(String, i64, i64)> {
    let out = Command::new("pgbackrest")
        .arg(format!("--config={}", config.display()))
        .args(["--stanza=herd-g0", "info", "--output=json"])
        .output()
        .expect("pgbackrest info");
    let info: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_default();
    info[0]["backup"]
        .as_array()
        .map(|list| {
            list.iter()
                .map(|b| {
                    (
                        b["label"].as_str().unwrap_or_default().to_string(),
                        b["timestamp"]["start"].as_i64().unwrap_or_default(),
                        b["timestamp"]["stop"].as_i64().unwrap_or_default(),
                    )
                })
                .collect()
        })
        .unwrap_or_default()
}

/// Scheduled backups across hosts (`full_every_s`, `incr_every_s`): taken by the group's
/// leader, one at a time; after kill -9 of the primary the new leader's agent goes on with the
/// schedule, never overlapping a backup.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scheduled_backups_across_hosts_follow_the_leader_one_at_a_time() {
    let hosts = Hosts::start_configured(
        "[backup]\nrepository = \"@DIR@/repo\"\nfull_every_s = 3600\nincr_every_s = 4\n\
         replicas_from_repository = true\n",
    );
    let first = hosts.wait_primary("at first");
    let config = |i: usize| hosts.agent_dir(i).join("backup/pgbackrest.conf");
    let deadline = Instant::now() + Duration::from_secs(120);
    while !backups(&config(first)).iter().any(|b| b.0.ends_with('I')) {
        assert!(
            Instant::now() < deadline,
            "no full then incremental backup within 120 s: {:?}\n{}",
            backups(&config(first)),
            hosts.logs()
        );
        std::thread::sleep(Duration::from_millis(500));
    }
    let killed_at = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("clock")
        .as_secs() as i64;
    let postmaster = hosts.postmaster(first).expect("postmaster pid");
    hosts.signal_agent(first, Signal::SIGKILL);
    let _ = kill(Pid::from_raw(postmaster), Signal::SIGKILL);
    let deadline = Instant::now() + Duration::from_secs(90);
    let next = loop {
        if let Some(p) = (0..3).find(|&i| i != first && hosts.role(i).as_deref() == Some("primary"))
        {
            break p;
        }
        assert!(
            Instant::now() < deadline,
            "no failover after 90 s\n{}",
            hosts.logs()
        );
        std::thread::sleep(Duration::from_millis(200));
    };
    let deadline = Instant::now() + Duration::from_secs(120);
    while !backups(&config(next)).iter().any(|b| b.1 > killed_at) {
        assert!(
            Instant::now() < deadline,
            "no scheduled backup by the new leader within 120 s: {:?}\n{}",
            backups(&config(next)),
            hosts.logs()
        );
        std::thread::sleep(Duration::from_millis(500));
    }
    // Its agent logs the backup once pgBackRest listed it: a moment after it appears.
    let log_file = hosts.dir.path().join(format!("{}.log", Hosts::name(next)));
    let deadline = Instant::now() + Duration::from_secs(30);
    while !std::fs::read_to_string(&log_file)
        .unwrap_or_default()
        .contains("backup of shard group 0: backup")
    {
        assert!(
            Instant::now() < deadline,
            "the new leader's agent did not log the backup:\n{}",
            hosts.logs()
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    let list = backups(&config(next));
    for pair in list.windows(2) {
        assert!(pair[0].2 <= pair[1].1, "backups overlap: {list:?}");
    }
    eprintln!(
        "{} scheduled backups, none overlapping: {list:?}",
        list.len()
    );

    // `replicas_from_repository`: the remaining replica loses its directory (moved away, its
    // server killed); its agent rebuilds it from the repository's newest backup, not
    // pg_basebackup of the new primary, and it follows the primary again.
    let other = (0..3)
        .find(|&i| i != first && i != next)
        .expect("a third member");
    let pgdata = hosts.agent_dir(other).join("pgdata");
    let pid = hosts.postmaster(other).expect("the replica's postmaster");
    let aside = hosts.agent_dir(other).join("pgdata-lost");
    std::fs::rename(&pgdata, &aside).expect("move the replica's directory away");
    let _ = kill(Pid::from_raw(pid), Signal::SIGKILL);
    let other_log = hosts.dir.path().join(format!("{}.log", Hosts::name(other)));
    let deadline = Instant::now() + Duration::from_secs(120);
    while !std::fs::read_to_string(&other_log)
        .unwrap_or_default()
        .contains("building the replica from backup")
    {
        assert!(
            Instant::now() < deadline,
            "the replica was not rebuilt from the repository within 120 s:\n{}",
            hosts.logs()
        );
        std::thread::sleep(Duration::from_millis(300));
    }
    let _ = std::fs::remove_dir_all(&aside);
    hosts.wait_role(other, "replica", Duration::from_secs(120));
    assert!(
        pgdata.join("PG_VERSION").exists(),
        "the rebuilt replica's directory"
    );

    // A `herd proxy` with its API gives the new primary's archiving in `/metrics`.
    let api = hosts.base + 7;
    let mut proxy = Command::new(HERD)
        .args(["proxy", "--dcs", &hosts.dcs(), "--cluster", &hosts.cluster])
        .args(["--listen", &format!("127.0.0.1:{}", hosts.base + 3)])
        .args(["--api-listen", &format!("127.0.0.1:{api}")])
        .arg("--data-dir")
        .arg(hosts.dir.path().join("proxy"))
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("herd proxy");
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut last = String::new();
    while !last.contains("herd_archive_last_archived_age_seconds{group=\"0\"}") {
        if Instant::now() > deadline {
            let _ = proxy.kill();
            panic!("no archiving in the proxy's /metrics within 30 s:\n{last}");
        }
        std::thread::sleep(Duration::from_millis(300));
        last = ureq::get(&format!("http://127.0.0.1:{api}/metrics"))
            .timeout(Duration::from_secs(5))
            .call()
            .ok()
            .and_then(|r| r.into_string().ok())
            .unwrap_or_default();
    }
    let _ = proxy.kill();
    let _ = proxy.wait();
    assert!(
        last.contains("herd_archive_behind{group=\"0\"} 0"),
        "{last}"
    );

    // Bad input, refused clearly: a group the cluster does not have; an agent whose
    // repository is not the same path on every host, or whose S3 settings are incomplete.
    let mut cmd = Command::new(HERD);
    cmd.args(["backup", "--dcs", &hosts.dcs(), "--cluster", &hosts.cluster])
        .args(["--group", "3"]);
    let out = herd_testkit::output_within(&mut cmd, Duration::from_secs(60)).expect("exits");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && err.contains("has 1 shard group(s)"),
        "{err}"
    );
    for (toml, says) in [
        (
            "[backup]\nrepository = \"backups\"\n",
            "must be an absolute path",
        ),
        ("[backup]\nenabled = true\n", "must be an absolute path"),
        (
            "[backup.s3]\nbucket = \"b\"\nendpoint = \"s3.example\"\ncredentials_file = \"k\"\n",
            "backup.s3.region",
        ),
    ] {
        let file = hosts.dir.path().join("bad.toml");
        std::fs::write(&file, toml).expect("bad.toml");
        let fresh = hosts.dir.path().join("fresh");
        let mut cmd = Command::new(HERD);
        cmd.args(["agent", "--dcs", &hosts.dcs(), "--cluster", &hosts.cluster])
            .args(["--name", "h9", "--api-listen", "127.0.0.1:0"])
            .arg("--data-dir")
            .arg(&fresh)
            .arg("--config")
            .arg(&file);
        let out = herd_testkit::output_within(&mut cmd, Duration::from_secs(60)).expect("exits");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success() && err.contains(says), "{toml}: {err}");
    }
}
