//! The live dashboard in a real browser (headless Chromium through WebDriver) against a real
//! cluster: the page loads without console errors, shows the three nodes with their roles,
//! its lag chart gets new points, and after `herd switchover` it shows the new primary and the
//! event within 5 s without a reload; screenshots at 1280×800 and 390 px wide. The same
//! cluster's `/metrics` passes `promtool check metrics`.

mod common;

use std::path::PathBuf;
use std::time::{Duration, Instant};

use common::webdriver::Browser;
use common::{api_get_text, cluster, connect};
use serde_json::Value;

/// The nodes the page shows: `[[name, role], …]`.
const NODES: &str = "return [...document.querySelectorAll('tr[data-node]')]\
                     .map(r => [r.dataset.node, r.dataset.role]);";

fn roles(v: &Value) -> Vec<(String, String)> {
    v.as_array()
        .map(|rows| {
            rows.iter()
                .map(|r| {
                    (
                        r[0].as_str().unwrap_or("").to_string(),
                        r[1].as_str().unwrap_or("").to_string(),
                    )
                })
                .collect()
        })
        .unwrap_or_default()
}

/// Where the screenshots go: the tests' scratch directory under the target directory.
fn output_dir() -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("dashboard");
    std::fs::create_dir_all(&dir).expect("creating the screenshot directory");
    dir
}

/// Severe console entries (errors), ignoring nothing.
fn errors(console: &[Value]) -> Vec<&Value> {
    console.iter().filter(|e| e["level"] == "SEVERE").collect()
}

#[test]
fn dashboard_live_in_a_real_browser() {
    let c = cluster();
    // A results directory as `herd bench --out` leaves it (one scenario), shown by the page.
    let bench = c.data_dir().with_file_name("bench");
    std::fs::create_dir_all(bench.join("proxy")).expect("bench dir");
    std::fs::write(bench.join("proxy/report.md"), "# proxy\n\n| a | b |\n").expect("report");
    std::fs::write(
        bench.join("proxy/proxy.svg"),
        "<svg xmlns='http://www.w3.org/2000/svg' width='40' height='20'>\
         <rect width='40' height='20' fill='teal'/></svg>",
    )
    .expect("chart");
    std::fs::create_dir_all(c.data_dir()).expect("data dir");
    std::fs::write(
        c.data_dir().join("herd.toml"),
        // Backups on: the page shows the primary's WAL archiving, /metrics its figures.
        format!(
            "[dashboard]\nbench_results = {:?}\n[backup]\nenabled = true\n",
            bench.display().to_string()
        ),
    )
    .expect("herd.toml");
    let up = c.up(&[]);
    let page = format!("http://127.0.0.1:{}/", c.api_port());
    assert!(up.contains(&page), "herd up prints the dashboard: {up}");

    // Some routed traffic, so routing and pool figures exist.
    let runtime = tokio::runtime::Runtime::new().expect("runtime");
    let url = c.url(&[]);
    runtime.block_on(async {
        let client = connect(&url).await;
        client
            .batch_execute("create table d(i int); insert into d select generate_series(1, 100)")
            .await
            .expect("writes");
        for _ in 0..20 {
            client
                .query("select count(*) from d", &[])
                .await
                .expect("read");
        }
    });

    let browser = Browser::start(1280, 800);
    browser.goto(&page);
    let nodes = browser.wait_for(
        Duration::from_secs(10),
        "three nodes on the page",
        NODES,
        |v| roles(v).len() == 3,
    );
    let mut shown = roles(&nodes);
    shown.sort();
    assert_eq!(
        shown,
        [
            ("node0".to_string(), "primary".to_string()),
            ("node1".to_string(), "replica".to_string()),
            ("node2".to_string(), "replica".to_string()),
        ],
        "the page's nodes"
    );
    browser.wait_for(
        Duration::from_secs(10),
        "the WAL archiving line",
        "return document.querySelector('[data-archiving]')?.textContent ?? '';",
        |v| v.as_str().is_some_and(|t| t.starts_with("WAL archiving: ")),
    );
    browser.wait_for(
        Duration::from_secs(5),
        "the live indicator",
        "return document.getElementById('conn').textContent;",
        |v| v == "live",
    );

    // The commit-wait chart samples the primary's active backends while the page is open: a
    // backend sleeping there is sampled with its wait event, and charted among "other" (the
    // chart names the events a commit waits in).
    let primary_url = c.url(&["--primary"]);
    let sleeper = runtime.spawn(async move {
        let client = connect(&primary_url).await;
        let _ = client.simple_query("select pg_sleep(3)").await;
    });
    let waits = browser.wait_for(
        Duration::from_secs(5),
        "a wait event on the commit-wait chart",
        "return [...document.querySelectorAll('#waits-chart path')].map(p => p.dataset.series);",
        |v| v.as_array().is_some_and(|a| !a.is_empty()),
    );
    assert!(
        waits.to_string().contains("other"),
        "the chart's series: {waits}"
    );
    let snapshot = api_get_text(c.api_port(), "/dashboard/snapshot");
    assert!(
        snapshot.contains("\"Timeout:PgSleep\":1"),
        "the sampled wait events: {snapshot}"
    );
    let _ = runtime.block_on(sleeper);

    // The lag chart gets new points while the page stays open.
    let last_t = "return Number(document.getElementById('lag-chart').dataset.lastT);";
    let first = browser.wait_for(Duration::from_secs(5), "a lag point", last_t, |v| {
        v.as_f64().unwrap_or(0.0) > 0.0
    });
    let first = first.as_f64().unwrap_or(0.0);
    browser.wait_for(Duration::from_secs(5), "a newer lag point", last_t, |v| {
        v.as_f64().unwrap_or(0.0) > first
    });
    let drawn = browser.eval("return document.querySelectorAll('#lag-chart path').length;");
    assert_eq!(drawn, 2, "one lag line per replica");

    // The bench report with its chart, loaded from the results directory.
    browser.wait_for(
        Duration::from_secs(5),
        "the bench report's chart",
        "const i = document.querySelector('#bench [data-report=proxy] img'); \
         return i && i.complete ? i.naturalWidth : 0;",
        |v| v == 40,
    );
    let outside = format!(
        "http://127.0.0.1:{}/bench/file?path=..%2Fdata%2Fherd.toml",
        c.api_port()
    );
    match ureq::get(&outside).timeout(Duration::from_secs(5)).call() {
        Err(ureq::Error::Status(404, _)) => {}
        other => panic!("a path outside the results directory: {other:?}"),
    }
    // Another site's page cannot post an action, nor reach the API under a rebound name.
    let api = format!("http://127.0.0.1:{}", c.api_port());
    let forged = ureq::post(&format!("{api}/config?key=commit-mode&value=async"))
        .set("Origin", "http://evil.example")
        .timeout(Duration::from_secs(5))
        .call();
    assert!(
        matches!(forged, Err(ureq::Error::Status(403, _))),
        "a cross-site action: {forged:?}"
    );
    let rebound = ureq::get(&format!("{api}/status"))
        .set("Host", "evil.example")
        .timeout(Duration::from_secs(5))
        .call();
    assert!(
        matches!(rebound, Err(ureq::Error::Status(403, _))),
        "a rebound host name: {rebound:?}"
    );
    assert_eq!(c.status()["commit_mode"], "on");

    let console = browser.console();
    assert!(errors(&console).is_empty(), "console errors: {console:?}");
    let dir = output_dir();
    let wide = dir.join("dashboard-1280x800.png");
    browser.screenshot(&wide);

    // A switchover shows up without a reload: the marker set now survives.
    browser.eval("window.__herdMarker = 42; return null;");
    c.herd_ok(&["switchover", "--to", "node1"]);
    let switched = Instant::now();
    browser.wait_for(
        Duration::from_secs(5),
        "node1 as primary on the page",
        NODES,
        |v| roles(v).iter().any(|(n, r)| n == "node1" && r == "primary"),
    );
    let event = browser.wait_for(
        Duration::from_secs(5).saturating_sub(switched.elapsed()),
        "the switchover on the timeline",
        "const e = document.querySelector('#events li[data-kind=switchover]'); \
         return e ? e.textContent : null;",
        |v| v.is_string(),
    );
    assert!(
        event
            .as_str()
            .unwrap_or("")
            .contains("switched over to node1"),
        "{event}"
    );
    assert!(
        switched.elapsed() <= Duration::from_secs(5),
        "shown after {:?}",
        switched.elapsed()
    );
    assert_eq!(
        browser.eval("return window.__herdMarker;"),
        42,
        "the page was not reloaded"
    );

    // An action from the page, behind its confirmation (accepted here): the commit mode.
    browser.eval(
        "window.confirm = () => true; \
         document.getElementById('commit-mode').value = 'remote_apply'; \
         document.getElementById('apply-commit').click(); return null;",
    );
    browser.wait_for(
        Duration::from_secs(15),
        "the new commit mode on the page",
        "return document.getElementById('commit').textContent;",
        |v| v.as_str().unwrap_or("").contains("remote_apply"),
    );
    assert_eq!(c.status()["commit_mode"], "remote_apply");
    // Declined: nothing is sent.
    browser.eval(
        "window.confirm = () => false; \
         document.getElementById('commit-mode').value = 'async'; \
         document.getElementById('apply-commit').click(); return null;",
    );
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(c.status()["commit_mode"], "remote_apply");

    // A narrow screen: everything fits the width (tables scroll inside their boxes).
    browser.resize(390, 844);
    let widths = browser.wait_for(
        Duration::from_secs(5),
        "a 390 px wide viewport",
        "return [window.innerWidth, document.documentElement.scrollWidth];",
        |v| v[0].as_i64().is_some_and(|w| w <= 390),
    );
    assert!(
        widths[1].as_i64() <= widths[0].as_i64(),
        "the page overflows a narrow screen: {widths}"
    );
    browser.screenshot(&dir.join("dashboard-390.png"));
    let console = browser.console();
    assert!(errors(&console).is_empty(), "console errors: {console:?}");
    eprintln!("screenshots in {}", dir.display());

    // The same cluster's metrics follow Prometheus conventions.
    let metrics = api_get_text(c.api_port(), "/metrics");
    assert!(metrics.contains("herd_routed_total"), "{metrics}");
    assert!(
        metrics.contains("herd_archive_failed_total{group=\"0\"}"),
        "{metrics}"
    );
    promtool_check(&metrics);

    // A replica's postmaster killed: the supervisor restarts it, and the timeline shows the
    // restart and the replica leaving and rejoining the read pool.
    let status = c.status();
    let node2 = status["nodes"]
        .as_array()
        .and_then(|n| n.iter().find(|n| n["name"] == "node2"))
        .and_then(|n| n["pid"].as_i64())
        .expect("node2's pid");
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(node2 as i32),
        nix::sys::signal::Signal::SIGKILL,
    )
    .expect("killing node2");
    // (kind, shown as failed) of each event naming node2; a restart attempt may fail while the
    // dead postmaster's backends still hold its lock, and the supervisor tries again.
    let seen = |v: &Value, kind: &str, failed: bool| {
        v.as_array().is_some_and(|a| {
            a.iter()
                .any(|e| e[0] == kind && e[1].as_bool() == Some(failed))
        })
    };
    let events = browser.wait_for(
        Duration::from_secs(30),
        "node2's restart and read-pool departure and return",
        "return [...document.querySelectorAll('#events li')]\
           .filter(e => e.textContent.includes('node2'))\
           .map(e => [e.dataset.kind, e.classList.contains('failed')]);",
        |v| {
            seen(v, "restart", false)
                && seen(v, "left_read_pool", true)
                && seen(v, "joined_read_pool", false)
        },
    );
    eprintln!("node2's events: {events}");

    // A lost primary: the automatic failover appears with the supervisor's reason.
    let status = c.status();
    let primary = common::nodes_with_role(&status, "primary")[0]["pid"]
        .as_i64()
        .expect("primary pid");
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(primary as i32),
        nix::sys::signal::Signal::SIGKILL,
    )
    .expect("killing the primary");
    let failover = browser.wait_for(
        Duration::from_secs(30),
        "the failover on the timeline",
        "const e = document.querySelector('#events li[data-kind=failover]'); \
         return e ? e.textContent : null;",
        |v| v.is_string(),
    );
    assert!(
        failover.as_str().unwrap_or("").contains("node1 lost for"),
        "{failover}"
    );

    // An open page does not hold the supervisor up: its stream ends when the cluster stops.
    let stopping = Instant::now();
    c.herd_ok(&["down"]);
    assert!(
        stopping.elapsed() < Duration::from_secs(20),
        "herd down with a viewer took {:?}",
        stopping.elapsed()
    );
    drop(browser);
}

/// Runs `promtool check metrics` on `text` (kept beside the screenshots), failing with its
/// complaints; bounded in time.
fn promtool_check(text: &str) {
    common::promtool_check(&output_dir().join("metrics.txt"), text);
}

/// Beyond 127.0.0.1 the API wants the token of `secrets/api-token` (mode 0600), except for the
/// health checks and the page's static files; `herd` itself sends it.
#[test]
fn api_beyond_localhost_needs_the_token() {
    use std::os::unix::fs::PermissionsExt;
    let c = cluster();
    std::fs::create_dir_all(c.data_dir()).expect("data dir");
    std::fs::write(
        c.data_dir().join("herd.toml"),
        "[network]\nlisten_address = \"127.0.0.2\"\n",
    )
    .expect("herd.toml");
    c.up(&[]);
    let file = c.data_dir().join("secrets/api-token");
    let mode = std::fs::metadata(&file)
        .expect("token file")
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o600);
    let token = std::fs::read_to_string(&file).expect("token");
    let token = token.trim();
    let base = format!("http://127.0.0.2:{}", c.api_port());
    let code = |method: &str, path: &str, auth: Option<&str>| -> u16 {
        let mut r =
            ureq::request(method, &format!("{base}{path}")).timeout(Duration::from_secs(30));
        if let Some(a) = auth {
            r = r.set("Authorization", a);
        }
        match r.call() {
            Ok(resp) => resp.status(),
            Err(ureq::Error::Status(code, _)) => code,
            Err(e) => panic!("{method} {path}: {e}"),
        }
    };
    let bearer = format!("Bearer {token}");
    for (method, path, auth, want) in [
        ("GET", "/", None, 200),
        ("GET", "/primary", None, 200),
        ("GET", "/status", None, 401),
        ("GET", "/metrics", None, 401),
        ("GET", "/dashboard/snapshot", None, 401),
        ("GET", "/dashboard/snapshot", Some("Bearer wrong"), 401),
        ("GET", "/dashboard/snapshot", Some(bearer.as_str()), 200),
        ("POST", "/config?key=commit-mode&value=async", None, 401),
        (
            "POST",
            "/config?key=commit-mode&value=async",
            Some(bearer.as_str()),
            200,
        ),
    ] {
        assert_eq!(code(method, path, auth), want, "{method} {path} {auth:?}");
    }
    assert_eq!(c.status()["commit_mode"], "async");

    // The page asks for the token, then goes live with it (kept in a same-site cookie).
    let browser = Browser::start(1280, 800);
    browser.goto(&format!("{base}/"));
    browser.wait_for(
        Duration::from_secs(10),
        "the token form",
        "return !document.getElementById('login').hidden;",
        |v| v == true,
    );
    browser.eval(&format!(
        "document.getElementById('token').value = '{token}'; \
         document.getElementById('login-form').requestSubmit(); return null;"
    ));
    browser.wait_for(
        Duration::from_secs(10),
        "three nodes after logging in",
        NODES,
        |v| roles(v).len() == 3,
    );
    drop(browser);

    // The command line reads the token file itself.
    let out = c.herd_ok(&["switchover", "--to", "node2"]);
    assert!(out.contains("switched over to node2"), "{out}");
}
