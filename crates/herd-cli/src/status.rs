//! `herd status` and the summary printed by `herd up`.

use std::fmt::Write;

use herd_cluster::{Cluster, Layout};
use herd_config::Config;
use herd_core::{ClusterStatus, LagInfo, NodeStatus};

pub async fn run(layout: &Layout, json: bool) -> anyhow::Result<()> {
    let cluster = open(layout)?;
    let status = herd_cluster::observe(&cluster).await.status;
    if json {
        println!("{}", serde_json::to_string_pretty(&status)?);
    } else {
        print!("{}", table(&status));
    }
    Ok(())
}

/// Opens the cluster of `layout` with its saved configuration.
pub fn open(layout: &Layout) -> anyhow::Result<Cluster> {
    let config = if layout.config().exists() {
        Config::load(&layout.config())?
    } else {
        Config::default()
    };
    Ok(Cluster::open(layout.clone(), config)?)
}

/// What `herd up` prints once the cluster is ready.
pub fn summary(cluster: &Cluster, status: &ClusterStatus) -> String {
    let mut out = String::from("\nHerd cluster ready.\n\n");
    out.push_str(&table(status));
    let api = cluster.config.api_port();
    let _ = write!(
        out,
        "\nConnect:     psql \"$(herd url --data-dir {dir})\"\n\
         Endpoint:    {endpoint}   (Herd's proxy: writes to the primary, reads to replicas)\n\
         HTTP API:    http://{host}:{api}/status\n\
         Commit mode: {mode} with {sync} — change it with `herd config set commit-mode MODE`\n",
        dir = cluster.layout.root().display(),
        endpoint = cluster.endpoint_url(false),
        host = cluster.host(),
        mode = status.commit_mode,
        sync = status.sync_standbys,
    );
    out
}

/// The human-readable status table.
pub fn table(s: &ClusterStatus) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "commit mode: {}   sync standbys: {}   synchronous_standby_names: {}",
        s.commit_mode,
        s.sync_standbys,
        s.synchronous_standby_names
            .as_deref()
            .unwrap_or("(primary unreachable)")
    );
    match &s.supervisor {
        Some(sup) => {
            let _ = writeln!(
                out,
                "supervisor: pid {}, API port {}",
                sup.pid, sup.api_port
            );
        }
        None => out.push_str("supervisor: not running (servers are not restarted if they die)\n"),
    }
    let header = [
        "NODE",
        "ROLE",
        "STATE",
        "PID",
        "PORT",
        "LSN (current/received)",
        "REPLAYED",
        "LAG bytes w/f/r",
        "LAG time w/f/r",
        "SYNC",
    ];
    let rows: Vec<[String; 10]> = s.nodes.iter().map(row).collect();
    let mut widths = header.map(str::len);
    for r in &rows {
        for (w, cell) in widths.iter_mut().zip(r) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let mut line = |cells: Vec<String>| {
        let padded: Vec<String> = cells
            .iter()
            .zip(widths)
            .map(|(c, w)| format!("{c:<w$}"))
            .collect();
        let _ = writeln!(out, "{}", padded.join("  ").trim_end());
    };
    line(header.iter().map(|h| h.to_string()).collect());
    for r in rows {
        line(r.to_vec());
    }
    out
}

fn row(n: &NodeStatus) -> [String; 10] {
    let opt = |v: Option<String>| v.unwrap_or_else(|| "-".into());
    let (bytes, time) = match &n.lag {
        Some(l) => lag_cells(l),
        None => ("-".into(), "-".into()),
    };
    [
        n.name.to_string(),
        n.role.to_string(),
        format!("{:?}", n.state).to_lowercase(),
        opt(n.pid.map(|p| p.to_string())),
        n.port.to_string(),
        opt(n.current_lsn.or(n.received_lsn).map(|l| l.to_string())),
        opt(n.replayed_lsn.map(|l| l.to_string())),
        bytes,
        time,
        opt(n.sync_state.map(|s| format!("{s:?}").to_lowercase())),
    ]
}

fn lag_cells(l: &LagInfo) -> (String, String) {
    let secs = |s: Option<f64>| s.map_or("?".to_string(), |s| format!("{:.1}ms", s * 1000.0));
    (
        format!("{}/{}/{}", l.write_bytes, l.flush_bytes, l.replay_bytes),
        format!(
            "{}/{}/{}",
            secs(l.write_seconds),
            secs(l.flush_seconds),
            secs(l.replay_seconds)
        ),
    )
}
