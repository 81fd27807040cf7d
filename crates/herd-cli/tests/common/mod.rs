//! Shared helpers of the end-to-end tests (included with `mod common;`).

#![allow(dead_code)]

pub mod agent_groups;
pub mod bench_child;
pub mod copies;
pub mod groups;
pub mod hosts;
pub mod process;
pub mod raw;
pub mod sharded_hosts;
pub mod shards;
pub mod webdriver;

use std::time::Duration;

use herd_testkit::TestCluster;
use tokio_postgres::{Client, NoTls};

/// A cluster handle for this test binary's `herd`.
pub fn cluster() -> TestCluster {
    TestCluster::new(std::path::Path::new(env!("CARGO_BIN_EXE_herd")))
}

/// Connects with a URL printed by `herd url`.
pub async fn connect(url: &str) -> Client {
    let (client, conn) = tokio_postgres::connect(url, NoTls)
        .await
        .unwrap_or_else(|e| panic!("connecting to {url}: {e} ({:?})", e.as_db_error()));
    tokio::spawn(async move {
        let _ = conn.await;
    });
    client
}

/// A file's permission bits (e.g. 0o600).
pub fn mode(path: &std::path::Path) -> u32 {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(path)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
        .permissions()
        .mode()
        & 0o777
}

/// Connects, or `None` when the server does not accept the connection (within its
/// `connect_timeout`).
pub async fn try_connect(url: &str) -> Option<Client> {
    let (client, conn) =
        tokio::time::timeout(Duration::from_secs(5), tokio_postgres::connect(url, NoTls))
            .await
            .ok()?
            .ok()?;
    tokio::spawn(async move {
        let _ = conn.await;
    });
    Some(client)
}

/// Waits (async) until `f` yields true, panicking after `timeout`.
pub async fn eventually<F, Fut>(timeout: Duration, what: &str, mut f: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = tokio::time::Instant::now() + timeout;
    while !f().await {
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out after {timeout:?} waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// `select count(*) from <table>` on `client`, or `None` when the query fails.
pub async fn count(client: &Client, table: &str) -> Option<i64> {
    client
        .query_one(&format!("select count(*) from {table}"), &[])
        .await
        .ok()
        .map(|r| r.get(0))
}

/// The nodes of a status document with the given role.
pub fn nodes_with_role<'a>(
    status: &'a serde_json::Value,
    role: &str,
) -> Vec<&'a serde_json::Value> {
    status["nodes"]
        .as_array()
        .expect("nodes array")
        .iter()
        .filter(|n| n["role"] == role)
        .collect()
}

/// A GET on Herd's API: (status code, parsed JSON body).
pub fn api_get(port: u16, path: &str) -> (u16, serde_json::Value) {
    let url = format!("http://127.0.0.1:{port}{path}");
    match ureq::get(&url).timeout(Duration::from_secs(5)).call() {
        Ok(resp) => (resp.status(), resp.into_json().expect("JSON body")),
        Err(ureq::Error::Status(code, resp)) => (code, resp.into_json().expect("JSON body")),
        Err(e) => panic!("GET {url}: {e}"),
    }
}

/// A GET on Herd's API returning the body as text (for `/metrics`).
pub fn api_get_text(port: u16, path: &str) -> String {
    let url = format!("http://127.0.0.1:{port}{path}");
    ureq::get(&url)
        .timeout(Duration::from_secs(5))
        .call()
        .unwrap_or_else(|e| panic!("GET {url}: {e}"))
        .into_string()
        .expect("text body")
}

/// Keeps the SIGSTOPped processes `frozen` (a primary's postmaster and backends) stopped until
/// `replaced` says another node is primary, at least `at_least` (longer than the hung timeout)
/// and at most 60 s after the freeze, then thaws them. A fixed wait raced the failover on a
/// loaded machine: thawed before the hung timeout had run out, the old primary simply carried
/// on. After 60 s they are thawed anyway, and the caller's check of a new primary fails.
pub fn thaw_once_replaced(frozen: &[i32], at_least: Duration, replaced: impl Fn() -> bool) {
    use nix::sys::signal::{kill, Signal};
    use nix::unistd::Pid;
    std::thread::sleep(at_least);
    let limit = std::time::Instant::now() + Duration::from_secs(60).saturating_sub(at_least);
    while !replaced() {
        if std::time::Instant::now() >= limit {
            eprintln!("no other primary within 60 s of the freeze: thawing it");
            break;
        }
        std::thread::sleep(Duration::from_millis(500));
    }
    for p in frozen {
        let _ = kill(Pid::from_raw(*p), Signal::SIGCONT);
    }
}

/// Direct children of `pid`, from /proc (PostgreSQL's backends lead process groups of their
/// own, so a process group signal does not reach them).
pub fn children(pid: i32) -> Vec<i32> {
    let mut out = Vec::new();
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return out;
    };
    for entry in entries.flatten() {
        let Ok(child) = entry.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{child}/stat")) else {
            continue;
        };
        let ppid = stat
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().nth(1)?.parse::<i32>().ok());
        if ppid == Some(pid) {
            out.push(child);
        }
    }
    out
}

/// Asserts that `sql` is refused with 0A000 (feature_not_supported) and a message that
/// contains `needle`.
pub async fn refused(client: &Client, sql: &str, needle: &str) {
    let e = client.simple_query(sql).await.expect_err(sql);
    assert_eq!(
        e.code(),
        Some(&tokio_postgres::error::SqlState::FEATURE_NOT_SUPPORTED),
        "{sql}: {e}"
    );
    let message = e
        .as_db_error()
        .map(|d| d.message().to_string())
        .unwrap_or_default();
    assert!(message.contains(needle), "{sql}: {message}");
}

/// The rows of a simple query, values as text (a failure panics with the statement).
pub async fn text_rows(client: &Client, sql: &str) -> Vec<Vec<Option<String>>> {
    client
        .simple_query(sql)
        .await
        .unwrap_or_else(|e| panic!("{sql}: {e:?}"))
        .into_iter()
        .filter_map(|m| match m {
            tokio_postgres::SimpleQueryMessage::Row(r) => {
                Some((0..r.len()).map(|i| r.get(i).map(str::to_string)).collect())
            }
            _ => None,
        })
        .collect()
}

/// Accounts 1..=`n` with balance `start` each in table `accounts (id, balance)`, in one INSERT.
pub async fn fill_accounts(db: &Client, n: i64, start: i64) {
    let rows: Vec<String> = (1..=n).map(|i| format!("({i}, {start})")).collect();
    db.batch_execute(&format!(
        "insert into accounts (id, balance) values {}",
        rows.join(", ")
    ))
    .await
    .expect("accounts");
}

/// The accounts held by each group's primary, read directly at `urls` (index = group).
pub async fn accounts_by_group(urls: &[String]) -> Vec<Vec<i64>> {
    let mut on = Vec::new();
    for url in urls {
        let db = connect(url).await;
        on.push(
            db.query("select id from accounts order by id", &[])
                .await
                .expect("ids")
                .iter()
                .map(|r| r.get(0))
                .collect(),
        );
    }
    on
}

/// Runs `sqls` (a transaction's statements, `begin` to `commit`) on `db`, each within 10 s:
/// whether all of them succeeded (else it is rolled back).
pub async fn all_or_nothing(db: &Client, sqls: &[String]) -> bool {
    for s in sqls {
        let done = tokio::time::timeout(Duration::from_secs(10), db.batch_execute(s)).await;
        if !matches!(done, Ok(Ok(()))) {
            let _ = db.batch_execute("rollback").await;
            return false;
        }
    }
    true
}

/// Runs each statement of `sqls` on `client` (a test's set-up), failing on the first error.
pub async fn run_all(client: &Client, sqls: &[&str]) {
    for sql in sqls {
        client.batch_execute(sql).await.expect(sql);
    }
}

/// Accounts 1..=`n` with balance 0 in table `accounts (id, balance)`, in one INSERT.
pub async fn seed_accounts(client: &Client, n: i64) {
    let values: Vec<String> = (1..=n).map(|i| format!("({i}, 0)")).collect();
    client
        .batch_execute(&format!(
            "INSERT INTO accounts (id, balance) VALUES {}",
            values.join(", ")
        ))
        .await
        .expect("accounts");
}

/// kill -9 of group 0's primary server (its pid from `herd status`).
pub fn kill_primary(c: &TestCluster) {
    let status = c.status();
    let pid = status["nodes"]
        .as_array()
        .and_then(|n| n.iter().find(|n| n["role"] == "primary"))
        .and_then(|n| n["pid"].as_i64())
        .expect("primary pid");
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(pid as i32),
        nix::sys::signal::Signal::SIGKILL,
    )
    .expect("kill -9 the primary");
}

/// Ends a load: stops the writers and the reader (`stop`), waits for them, and checks the
/// reader read more than a few times and noted nothing wrong (`bad`) during `what`.
pub async fn end_load(
    stop: &std::sync::atomic::AtomicBool,
    writers: Vec<tokio::task::JoinHandle<()>>,
    reader: tokio::task::JoinHandle<u64>,
    bad: &std::sync::Mutex<Vec<String>>,
    what: &str,
) {
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    for w in writers {
        w.await.expect("writer");
    }
    let reads = reader.await.expect("reader");
    assert!(reads > 5, "the reader read {reads} times");
    let bad = bad.lock().expect("bad").clone();
    assert!(bad.is_empty(), "reads during {what}: {bad:?}");
}

/// Runs `promtool check metrics` on `text` (written to `file`, kept for a look after a
/// failure), failing with its complaints; bounded in time.
pub fn promtool_check(file: &std::path::Path, text: &str) {
    std::fs::write(file, text).expect("writing the metrics");
    let input = std::fs::File::open(file).expect("reading the metrics back");
    let mut cmd = std::process::Command::new("promtool");
    cmd.args(["check", "metrics"])
        .stdin(std::process::Stdio::from(input));
    let out = herd_testkit::output_within(&mut cmd, Duration::from_secs(30))
        .expect("promtool check metrics finished within 30 s");
    assert!(
        out.status.success(),
        "promtool check metrics: {}\n{text}",
        herd_testkit::describe(&out)
    );
}
