//! One view of the cluster from any process (slice 12): two shard groups over `herd agent`s on
//! loopback (a0, a1 in group 0; b0 alone in group 1, serving the dashboard with
//! `--dashboard-listen` on 127.0.0.2, so with the token) and one `herd proxy --api-listen`.
//! `/cluster/metrics` of the proxy and of b0 lists every agent and the proxy, `instance`
//! labelled, and passes `promtool check metrics`; after kill -9 of a0 (agent and server) the
//! page still answers 200 with a0 as `herd_scrape_up 0`, and b0's dashboard shows group 0's
//! failover to a1 (its timeline read from the store, written by a1's agent); b0's API refuses
//! requests without the token as the proxy's does.

mod common;

use std::time::{Duration, Instant};

use common::agent_groups::Groups;
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;

/// Agents: (name, group).
const AGENTS: [(&str, u32); 3] = [("a0", 0), ("a1", 0), ("b0", 1)];

/// `method path` on `addr` (10 s at most), with the token when given: status and body.
fn call(method: &str, addr: &str, path: &str, token: Option<&str>) -> (u16, String) {
    let agent = ureq::AgentBuilder::new()
        .timeout(Duration::from_secs(10))
        .build();
    let mut request = agent.request(method, &format!("http://{addr}{path}"));
    if let Some(t) = token {
        request = request.set("Authorization", &format!("Bearer {t}"));
    }
    match request.call() {
        Ok(r) => (r.status(), r.into_string().unwrap_or_default()),
        Err(ureq::Error::Status(code, r)) => (code, r.into_string().unwrap_or_default()),
        Err(e) => (0, e.to_string()),
    }
}

/// The `herd_scrape_up` sample of `instance` in `page` (`None`: not listed).
fn up(page: &str, instance: &str) -> Option<u8> {
    let prefix = format!("herd_scrape_up{{instance=\"{instance}\",");
    page.lines()
        .find(|l| l.starts_with(&prefix))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
}

/// `promtool check metrics` on `text`, kept in the test's directory.
fn promtool_check(dir: &std::path::Path, text: &str) {
    common::promtool_check(&dir.join("cluster-metrics.txt"), text);
}

/// Polls `GET path` on `addr` until `ok` accepts the 200 body (`limit` at most); that body.
fn wait_page(
    g: &Groups,
    addr: &str,
    path: &str,
    token: Option<&str>,
    limit: Duration,
    what: &str,
    ok: impl Fn(&str) -> bool,
) -> String {
    let deadline = Instant::now() + limit;
    loop {
        let (code, body) = call("GET", addr, path, token);
        if code == 200 && ok(&body) {
            return body;
        }
        assert!(
            Instant::now() < deadline,
            "{what} not seen on {addr}{path} within {limit:?}; last answer {code}:\n{body}\nlogs:\n{}",
            g.logs()
        );
        std::thread::sleep(Duration::from_millis(300));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn any_process_shows_the_whole_cluster() {
    let mut g = Groups::new(&AGENTS, "v");
    // b0's dashboard beyond 127.0.0.1: every request but the health checks needs the token.
    let dashboard = format!("127.0.0.2:{}", g.base + 2 * AGENTS.len() as u16 + 2);
    g.start_agent(0);
    g.wait_role(0, "primary", Duration::from_secs(60));
    // The others get a0's secrets (copied by `start_agent`).
    g.start_agent(1);
    g.start_agent_with(2, &["--dashboard-listen", &dashboard]);
    g.wait_role(1, "replica", Duration::from_secs(90));
    g.wait_role(2, "primary", Duration::from_secs(90));
    g.start_proxy();
    let _client = g.connect_proxy().await;
    let token = std::fs::read_to_string(g.agent_dir(2).join("secrets/api-token"))
        .expect("b0's API token (created when its dashboard listens beyond 127.0.0.1)")
        .trim()
        .to_string();

    // Every agent and the proxy answer, on the proxy's page and on b0's.
    let apis: Vec<String> = (0..AGENTS.len()).map(|i| g.api(i)).collect();
    let proxy_api = g.proxy_api();
    let all_up = |page: &str| {
        apis.iter()
            .chain([&proxy_api])
            .all(|a| up(page, a) == Some(1))
    };
    let page = wait_page(
        &g,
        &proxy_api,
        "/cluster/metrics",
        None,
        Duration::from_secs(60),
        "every agent and the proxy up",
        all_up,
    );
    for a in &apis {
        assert!(
            page.contains(&format!("herd_agent_rounds_total{{instance=\"{a}\"}}")),
            "agent {a}'s own samples, labelled:\n{page}"
        );
    }
    assert!(
        page.lines()
            .filter(|l| !l.starts_with('#'))
            .all(|l| l.contains("{instance=\"")),
        "every sample has its instance first:\n{page}"
    );
    promtool_check(g.dir.path(), &page);
    // a1's lag in seconds and live sync_state, from a0's walsenders in its member record.
    wait_page(
        &g,
        &proxy_api,
        "/status",
        None,
        Duration::from_secs(30),
        "a1's lag in seconds and live sync_state",
        |body| {
            let v: serde_json::Value = serde_json::from_str(body).unwrap_or_default();
            v["nodes"].as_array().is_some_and(|nodes| {
                nodes.iter().any(|n| {
                    n["name"] == "a1"
                        && n["lag"]["replay_seconds"].is_number()
                        && n["sync_state"].is_string()
                })
            })
        },
    );
    let from_b0 = wait_page(
        &g,
        &dashboard,
        "/cluster/metrics",
        Some(&token),
        Duration::from_secs(30),
        "every agent and the proxy up (b0)",
        all_up,
    );
    promtool_check(g.dir.path(), &from_b0);

    // The token rules of the proxy's API: without it, refused; the page's shell stays open.
    for (method, path) in [
        ("GET", "/status"),
        ("GET", "/cluster/metrics"),
        ("GET", "/dashboard/snapshot"),
        ("POST", "/switchover?group=0"),
    ] {
        let (code, _) = call(method, &dashboard, path, None);
        assert_eq!(code, 401, "{method} {path} without the token");
        let (code, _) = call(method, &dashboard, path, Some("not-the-token"));
        assert_eq!(code, 401, "{method} {path} with a wrong token");
    }
    assert_eq!(
        call("GET", &dashboard, "/", None).0,
        200,
        "the page's shell"
    );

    // kill -9 of a0, agent and server: group 0 fails over to a1.
    let pid = g.agents[0].as_ref().expect("a0 runs").id();
    kill(Pid::from_raw(pid as i32), Signal::SIGKILL).expect("kill a0's agent");
    let _ = herd_pg::kill_server(&g.agent_dir(0).join("pgdata"));
    if let Some(mut child) = g.agents[0].take() {
        let _ = child.wait();
    }
    g.wait_role(1, "primary", Duration::from_secs(90));

    // The page still answers, a0 reported down (its record expires; it is remembered).
    let page = wait_page(
        &g,
        &proxy_api,
        "/cluster/metrics",
        None,
        Duration::from_secs(30),
        "a0 down, the others up",
        |p| {
            up(p, &apis[0]) == Some(0)
                && up(p, &apis[1]) == Some(1)
                && up(p, &apis[2]) == Some(1)
                && up(p, &proxy_api) == Some(1)
        },
    );
    promtool_check(g.dir.path(), &page);

    // b0 (group 1) shows group 0's failover: the promotion on its timeline (written to the
    // store by a1's agent, read by b0's) and a1 the only primary of group 0 in its status.
    let primaries = |v: &serde_json::Value, g: u64| -> Vec<String> {
        common::groups::group(&v["status"], g)["nodes"]
            .as_array()
            .map(|n| {
                n.iter()
                    .filter(|x| x["role"] == "primary")
                    .filter_map(|x| x["name"].as_str().map(str::to_string))
                    .collect()
            })
            .unwrap_or_default()
    };
    let snapshot = wait_page(
        &g,
        &dashboard,
        "/dashboard/snapshot",
        Some(&token),
        Duration::from_secs(30),
        "group 0's failover to a1 on b0's timeline and status",
        |body| {
            let v: serde_json::Value = serde_json::from_str(body).unwrap_or_default();
            let promoted = v["events"].as_array().is_some_and(|events| {
                events.iter().any(|e| {
                    e["group"] == 0
                        && e["kind"] == "failover"
                        && e["node"] == "a1"
                        && e["ok"] == true
                })
            });
            promoted && v["status"]["groups"].is_array() && primaries(&v, 0) == ["a1"]
        },
    );
    let v: serde_json::Value = serde_json::from_str(&snapshot).expect("snapshot JSON");
    assert_eq!(primaries(&v, 1), ["b0"], "group 1 on b0's dashboard: {v}");
}
