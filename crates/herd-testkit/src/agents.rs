//! Watching `herd agent`s and their servers from a test or a benchmark: an agent's member
//! record, whether a server accepts writes, the ends of log files.

use std::path::Path;
use std::time::Duration;

/// The member record the agent whose API listens at `api` (`host:port`) serves, if it answers
/// within 2 s; the request is signed with the key of the cluster whose superuser password is
/// `password` (the agents answer nothing else).
pub fn member(api: &str, password: &str) -> Option<serde_json::Value> {
    let agent = ureq::AgentBuilder::new()
        .timeout_connect(Duration::from_millis(500))
        .timeout(Duration::from_secs(2))
        .build();
    let (_, authorization) = herd_apikey::ApiKey::from_password(password).sign("GET", "/member");
    let r = agent
        .get(&format!("http://{api}/member"))
        .set(herd_apikey::AUTHORIZATION, &authorization)
        .call()
        .ok()?;
    r.into_json().ok()
}

/// The value of counter `name` in the Prometheus text the agent at `api` serves on `/metrics`.
pub fn agent_metric(api: &str, name: &str) -> Option<u64> {
    let agent = ureq::AgentBuilder::new()
        .timeout_connect(Duration::from_millis(500))
        .timeout(Duration::from_secs(2))
        .build();
    let text = agent
        .get(&format!("http://{api}/metrics"))
        .call()
        .ok()?
        .into_string()
        .ok()?;
    text.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.trim().parse().ok())
}

/// Whether the server at `url` accepts writes now (`not pg_is_in_recovery()`), over the
/// connection kept in `client` (opened when missing, dropped when it fails; 1 s to connect,
/// 0.5 s to answer). A server that does not answer does not accept writes.
pub async fn accepts_writes(url: &str, client: &mut Option<tokio_postgres::Client>) -> bool {
    if client.is_none() {
        let connect = tokio_postgres::connect(url, tokio_postgres::NoTls);
        if let Ok(Ok((c, conn))) = tokio::time::timeout(Duration::from_secs(1), connect).await {
            tokio::spawn(conn);
            *client = Some(c);
        }
    }
    let Some(c) = client.as_ref() else {
        return false;
    };
    let probe = c.query_one("select not pg_is_in_recovery()", &[]);
    match tokio::time::timeout(Duration::from_millis(500), probe).await {
        Ok(Ok(row)) => row.get::<_, bool>(0),
        _ => {
            *client = None;
            false
        }
    }
}

/// The last `lines` lines of each `dir/NAME.log`, each under a `--- NAME` heading.
pub fn log_tails(dir: &Path, names: &[&str], lines: usize) -> String {
    let mut out = String::new();
    for name in names {
        let text = std::fs::read_to_string(dir.join(format!("{name}.log"))).unwrap_or_default();
        let all: Vec<&str> = text.lines().collect();
        out.push_str(&format!(
            "--- {name}\n{}\n",
            all[all.len().saturating_sub(lines)..].join("\n")
        ));
    }
    out
}
