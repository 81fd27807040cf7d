//! `herd secrets rotate` (issue #42 part 4) on a running `herd up` cluster: under a write
//! load through the endpoint no transaction fails, the old passwords are refused afterwards
//! and the new ones accepted, replication streams again after a replica restart (with the
//! new replication password), the files stay 0600; a rotation cut short is finished by
//! running it again; a stopped cluster is refused clearly. Across hosts (`--dcs`):
//! `secrets_rotate_hosts.rs`.

mod common;

use std::os::unix::fs::PermissionsExt;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use common::{connect, eventually, mode, nodes_with_role, try_connect};
use herd_scram::Verifier;
use herd_testkit::TestCluster;

fn secret(c: &TestCluster, name: &str) -> String {
    std::fs::read_to_string(c.data_dir().join("secrets").join(name))
        .unwrap_or_else(|e| panic!("reading secrets/{name}: {e}"))
        .trim()
        .to_string()
}

/// `herd secrets rotate`, bounded; its output.
async fn rotate(c: &TestCluster) -> std::process::Output {
    let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_herd"));
    cmd.args(["secrets", "rotate", "--data-dir"])
        .arg(c.data_dir());
    tokio::task::spawn_blocking(move || {
        herd_testkit::output_within(&mut cmd, Duration::from_secs(120))
            .expect("herd secrets rotate within 120 s")
    })
    .await
    .expect("rotate task")
}

async fn rotate_ok(c: &TestCluster) -> String {
    let began = std::time::Instant::now();
    let out = rotate(c).await;
    eprintln!(
        "herd secrets rotate took {} ms",
        began.elapsed().as_millis()
    );
    assert!(
        out.status.success(),
        "herd secrets rotate: {}",
        herd_testkit::describe(&out)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Whether `role`'s stored verifier on `client`'s server is `password`'s.
async fn verifies(client: &tokio_postgres::Client, role: &str, password: &str) -> bool {
    let stored: String = client
        .query_one(
            "select rolpassword from pg_authid where rolname = $1",
            &[&role],
        )
        .await
        .expect("rolpassword")
        .get(0);
    let v = Verifier::parse(&stored).expect("a SCRAM verifier");
    Verifier::from_password(password, v.salt(), v.iterations()) == v
}

fn with_password(url: &str, old: &str, new: &str) -> String {
    assert!(url.contains(old), "{url} holds the password");
    url.replace(old, new)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rotation_under_load_keeps_clients_and_replication() {
    let c = common::cluster();
    c.up(&["--replicas", "1"]);
    let old_superuser = secret(&c, "superuser.password");
    let old_replication = secret(&c, "replication.password");
    let old_endpoint = c.url(&[]);
    let old_primary = c.url(&["--primary"]);

    let setup = connect(&old_endpoint).await;
    setup
        .batch_execute("create table ticks(id bigserial primary key, writer int not null)")
        .await
        .expect("create");

    // Writers, each on one connection opened before the rotation, one transaction per insert.
    let mut clients = Vec::new();
    for _ in 0..4 {
        clients.push(Arc::new(connect(&old_endpoint).await));
    }
    let load = Load::start(&clients, TICK);
    tokio::time::sleep(Duration::from_secs(2)).await;
    let before = load.done();
    let said = rotate_ok(&c).await;
    assert!(said.contains("Rotated"), "{said}");
    tokio::time::sleep(Duration::from_secs(3)).await;
    let (ok, errors) = load.stop().await;
    eprintln!(
        "load: {before} transactions before the rotation, {ok} in all, {} failed",
        errors.len()
    );
    assert!(errors.is_empty(), "failed transactions: {errors:?}");
    assert!(ok > before + 20, "the writers went on: {before} then {ok}");
    // The connection opened before the rotation still works.
    setup.batch_execute("select 1").await.expect("old session");

    // New passwords in the files (0600, no leftovers), different from the old ones.
    let new_superuser = secret(&c, "superuser.password");
    let new_replication = secret(&c, "replication.password");
    assert_ne!(new_superuser, old_superuser);
    assert_ne!(new_replication, old_replication);
    let secrets = c.data_dir().join("secrets");
    for name in ["superuser.password", "replication.password", "pgpass"] {
        assert_eq!(mode(&secrets.join(name)), 0o600, "{name}");
    }
    assert_eq!(mode(&secrets), 0o700);
    for name in [
        "superuser.password.next",
        "replication.password.next",
        "pgpass.tmp",
    ] {
        assert!(!secrets.join(name).exists(), "{name} left behind");
    }
    let pgpass = std::fs::read_to_string(secrets.join("pgpass")).expect("pgpass");
    assert!(
        pgpass.contains(&new_replication),
        "pgpass has the new password"
    );

    // The old password is refused at the endpoint and at the primary, the new one accepted.
    assert!(
        try_connect(&old_endpoint).await.is_none(),
        "old password at the endpoint"
    );
    assert!(
        try_connect(&old_primary).await.is_none(),
        "old password at the primary"
    );
    let new_endpoint = c.url(&[]);
    assert_eq!(
        new_endpoint,
        with_password(&old_endpoint, &old_superuser, &new_superuser)
    );
    let endpoint = connect(&new_endpoint).await;
    let primary = connect(&c.url(&["--primary"])).await;
    assert!(verifies(&primary, "postgres", &new_superuser).await);
    assert!(verifies(&primary, "replicator", &new_replication).await);
    assert!(!verifies(&primary, "replicator", &old_replication).await);
    // The standby has the new verifiers too (replicated).
    let replica = connect(&c.url(&["--replica", "1"])).await;
    assert!(verifies(&replica, "replicator", &new_replication).await);
    drop(replica);

    // A replica restarted after the rotation streams again: its walreceiver logs in with the
    // new replication password (the old one no longer works).
    let status = c.status();
    let pid = nodes_with_role(&status, "replica")[0]["pid"]
        .as_i64()
        .expect("replica pid");
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(pid as i32),
        nix::sys::signal::Signal::SIGKILL,
    )
    .expect("kill -9 the replica");
    eventually(
        Duration::from_secs(90),
        "the replica restarted and streaming",
        || {
            let c = &c;
            async move {
                c.try_status().is_some_and(|s| {
                    let r = nodes_with_role(&s, "replica");
                    r.len() == 1
                        && r[0]["state"] == "streaming"
                        && r[0]["pid"].as_i64() != Some(pid)
                })
            }
        },
    )
    .await;
    endpoint
        .batch_execute("insert into ticks(writer) values (99)")
        .await
        .expect("a write after the restart");
    eventually(
        Duration::from_secs(30),
        "the write on the replica",
        || async {
            match try_connect(&c.url(&["--replica", "1"])).await {
                Some(r) => r
                    .query_one("select count(*) from ticks where writer = 99", &[])
                    .await
                    .is_ok_and(|row| row.get::<_, i64>(0) == 1),
                None => false,
            }
        },
    )
    .await;

    // A switchover after the rotation, under the same sessions' writes: the new primary's
    // server connections are opened for sessions that logged in with the old password (the
    // endpoint logs them in with the key of the superuser's latest login), the old primary
    // rejoins as a replica streaming with the new replication password.
    let load = Load::start(&clients, TICK);
    tokio::time::sleep(Duration::from_secs(1)).await;
    let out = tokio::task::spawn_blocking({
        let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_herd"));
        cmd.args(["switchover", "--to", "node1", "--data-dir"])
            .arg(c.data_dir());
        move || herd_testkit::output_within(&mut cmd, Duration::from_secs(120))
    })
    .await
    .expect("switchover task")
    .expect("switchover within 120 s");
    assert!(
        out.status.success(),
        "switchover: {}",
        herd_testkit::describe(&out)
    );
    tokio::time::sleep(Duration::from_secs(2)).await;
    let (ok, errors) = load.stop().await;
    eprintln!(
        "switchover: {ok} transactions, {} failed: {errors:?}",
        errors.len()
    );
    assert!(
        errors.iter().all(|e| !e.contains("password")),
        "sessions from before the rotation refused: {errors:?}"
    );
    assert!(
        errors.len() <= 4,
        "at most one failed transaction per session: {errors:?}"
    );
    assert!(ok > 20, "the writers went on: {ok}");
    eventually(
        Duration::from_secs(90),
        "node0 streaming from node1",
        || {
            let c = &c;
            async move {
                c.try_status().is_some_and(|s| {
                    let r = nodes_with_role(&s, "replica");
                    r.len() == 1 && r[0]["name"] == "node0" && r[0]["state"] == "streaming"
                })
            }
        },
    )
    .await;
    let primary = connect(&c.url(&["--primary"])).await;

    // A rotation cut short after the servers changed (simulated: the next passwords written
    // and set on the primary, the files not replaced) is finished by running it again.
    let (next_superuser, next_replication) = (
        "Nextsuperuser0123456789abcdefABCD",
        "Nextreplication0123456789abcdefAB",
    );
    for (name, value) in [
        ("superuser.password.next", next_superuser),
        ("replication.password.next", next_replication),
    ] {
        let path = secrets.join(name);
        std::fs::write(&path, format!("{value}\n")).expect("write .next");
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).expect("0600");
    }
    primary
        .batch_execute(&format!(
            "alter role postgres password '{}'",
            herd_pg::scram_verifier(next_superuser)
        ))
        .await
        .expect("cut-short change");
    let said = rotate_ok(&c).await;
    assert!(said.contains("Rotated"), "{said}");
    assert_eq!(secret(&c, "superuser.password"), next_superuser);
    assert_eq!(secret(&c, "replication.password"), next_replication);
    assert!(!secrets.join("superuser.password.next").exists());
    let endpoint = connect(&c.url(&[])).await;
    endpoint.batch_execute("select 1").await.expect("resumed");
    let primary = connect(&c.url(&["--primary"])).await;
    assert!(verifies(&primary, "replicator", next_replication).await);

    // A failover after the rotations: the agents promote and rejoin (a rewind or a clone of
    // the old primary, as the superuser and the replication role) with the passwords they
    // took up while running.
    drop(primary);
    common::kill_primary(&c);
    eventually(
        Duration::from_secs(120),
        "node0 primary, node1 back streaming",
        || {
            let c = &c;
            async move {
                c.try_status().is_some_and(|s| {
                    let p = nodes_with_role(&s, "primary");
                    let r = nodes_with_role(&s, "replica");
                    p.len() == 1
                        && p[0]["name"] == "node0"
                        && r.len() == 1
                        && r[0]["name"] == "node1"
                        && r[0]["state"] == "streaming"
                })
            }
        },
    )
    .await;
    eventually(
        Duration::from_secs(30),
        "writes through the endpoint",
        || async {
            match try_connect(&c.url(&[])).await {
                Some(e) => e
                    .batch_execute("insert into ticks(writer) values (100)")
                    .await
                    .is_ok(),
                None => false,
            }
        },
    )
    .await;

    // A stopped cluster is refused clearly; the files are left as they are.
    c.herd_ok(&["down"]);
    let out = rotate(&c).await;
    assert!(
        !out.status.success(),
        "rotating a stopped cluster succeeded"
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("not running") && err.contains("herd up"),
        "{err}"
    );
    assert_eq!(secret(&c, "superuser.password"), next_superuser);
    assert!(!secrets.join("superuser.password.next").exists());
}

const TICK: &str = "insert into ticks(writer) values ({w})";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rotation_reaches_every_shard_group() {
    let c = common::cluster();
    c.up(&["--shards", "2", "--replicas", "0"]);
    let old_superuser = secret(&c, "superuser.password");
    let old_endpoint = c.url(&[]);
    let setup = connect(&old_endpoint).await;
    common::run_all(
        &setup,
        &[
            "create table events (id bigint primary key, writer int not null)",
            "select herd.create_distributed_table('events', 'id')",
            "insert into events select g, g % 4 from generate_series(1, 100) g",
        ],
    )
    .await;
    // A read only the general path answers: group 0 gets postgres_fdw servers for both groups,
    // whose user mappings hold the superuser's password.
    let general = "select distinct on (writer) writer, id from events order by writer, id";
    let first = common::text_rows(&setup, general).await;
    assert_eq!(first.len(), 4, "{first:?}");

    let mut clients = Vec::new();
    for _ in 0..4 {
        clients.push(Arc::new(connect(&old_endpoint).await));
    }
    let load = Load::start(&clients, "insert into events values ({n}, {w})");
    tokio::time::sleep(Duration::from_secs(2)).await;
    let said = rotate_ok(&c).await;
    assert!(said.contains("2 shard group(s)"), "{said}");
    assert!(said.contains("2 global-table user mapping(s)"), "{said}");
    tokio::time::sleep(Duration::from_secs(2)).await;
    let (ok, errors) = load.stop().await;
    eprintln!(
        "load over 2 groups: {ok} transactions, {} failed",
        errors.len()
    );
    assert!(errors.is_empty(), "failed transactions: {errors:?}");
    assert!(ok > 20, "the writers wrote: {ok}");

    let new_superuser = secret(&c, "superuser.password");
    assert!(
        try_connect(&old_endpoint).await.is_none(),
        "old password at the endpoint"
    );
    let endpoint = connect(&c.url(&[])).await;
    let rows: i64 = endpoint
        .query_one("select count(*) from events", &[])
        .await
        .expect("count across groups")
        .get(0);
    assert_eq!(rows, 100 + ok as i64, "every acknowledged insert is there");
    assert_eq!(common::text_rows(&endpoint, general).await, first);
    let mut verifiers = Vec::new();
    for g in ["0", "1"] {
        let url = c.url(&["--group", g, "--primary"]);
        let old = with_password(&url, &new_superuser, &old_superuser);
        assert!(
            try_connect(&old).await.is_none(),
            "old password on group {g}"
        );
        let primary = connect(&url).await;
        assert!(
            verifies(&primary, "postgres", &new_superuser).await,
            "group {g}"
        );
        let v: String = primary
            .query_one(
                "select rolpassword from pg_authid where rolname = 'postgres'",
                &[],
            )
            .await
            .expect("rolpassword")
            .get(0);
        verifiers.push(v);
        if g == "0" {
            let options: Vec<String> = primary
                .query(
                    "select array_to_string(umoptions, ',') from pg_user_mappings \
                     where srvname like 'herd\\_group\\_%'",
                    &[],
                )
                .await
                .expect("mappings")
                .iter()
                .map(|r| r.get(0))
                .collect();
            assert_eq!(options.len(), 2, "{options:?}");
            for o in &options {
                assert!(
                    o.contains(&format!("password={new_superuser}")),
                    "mapping updated"
                );
            }
        }
    }
    // One verifier, salt included, on every group: the endpoint logs in to each with one key.
    assert_eq!(verifiers[0], verifiers[1]);
}

/// Writers on `clients`, one insert per transaction into `table`, until stopped.
struct Load {
    stop: Arc<AtomicBool>,
    done: Arc<AtomicU64>,
    errors: Arc<std::sync::Mutex<Vec<String>>>,
    writers: Vec<tokio::task::JoinHandle<()>>,
}

impl Load {
    /// `template`: the statement, `{w}` replaced by the writer's number and `{n}` by a number
    /// no other statement of the load gets.
    fn start(clients: &[Arc<tokio_postgres::Client>], template: &str) -> Load {
        let stop = Arc::new(AtomicBool::new(false));
        let done = Arc::new(AtomicU64::new(0));
        let errors = Arc::new(std::sync::Mutex::new(Vec::new()));
        let mut writers = Vec::new();
        for (w, client) in clients.iter().enumerate() {
            let (client, stop, done, errors) =
                (client.clone(), stop.clone(), done.clone(), errors.clone());
            let template = template.replace("{w}", &w.to_string());
            writers.push(tokio::spawn(async move {
                let mut n = (w as u64 + 1) * 10_000_000;
                while !stop.load(Ordering::Relaxed) {
                    n += 1;
                    let sql = template.replace("{n}", &n.to_string());
                    match tokio::time::timeout(Duration::from_secs(10), client.batch_execute(&sql))
                        .await
                    {
                        Ok(Ok(())) => {
                            done.fetch_add(1, Ordering::Relaxed);
                        }
                        Ok(Err(e)) => errors.lock().expect("errors").push(format!("{e:?}")),
                        Err(_) => errors
                            .lock()
                            .expect("errors")
                            .push("no answer in 10 s".into()),
                    }
                    tokio::time::sleep(Duration::from_millis(5)).await;
                }
            }));
        }
        Load {
            stop,
            done,
            errors,
            writers,
        }
    }

    fn done(&self) -> u64 {
        self.done.load(Ordering::Relaxed)
    }

    /// Stops the writers: the transactions done, the errors met.
    async fn stop(self) -> (u64, Vec<String>) {
        self.stop.store(true, Ordering::Relaxed);
        for w in self.writers {
            w.await.expect("writer");
        }
        let errors = self.errors.lock().expect("errors").clone();
        (self.done.load(Ordering::Relaxed), errors)
    }
}

#[test]
fn no_cluster_is_a_clear_error() {
    let dir = herd_testkit::scratch_dir();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_herd"))
        .args(["secrets", "rotate", "--data-dir"])
        .arg(dir.path())
        .output()
        .expect("herd");
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("error:") && err.contains("herd up"), "{err}");
    // A multi-host cluster without a copy of its secrets: refused, naming the directory,
    // before the store is asked (the command across hosts: secrets_rotate_hosts.rs).
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_herd"))
        .args([
            "secrets",
            "rotate",
            "--dcs",
            "etcd://127.0.0.1:1",
            "--cluster",
            "main",
        ])
        .arg("--data-dir")
        .arg(dir.path())
        .output()
        .expect("herd");
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("holding the cluster's secrets/")
            && err.contains(&dir.path().display().to_string()),
        "{err}"
    );
}
