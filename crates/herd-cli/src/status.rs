//! `herd status` and the summary printed by `herd up`.

use std::fmt::Write;

use anyhow::Context;

use herd_cluster::{Cluster, Layout};
use herd_config::Config;
use herd_core::{ArchiveStatus, ClusterStatus, LagInfo, NodeStatus};

pub async fn run(layout: &Layout, json: bool) -> anyhow::Result<()> {
    let groups = open_all(layout)?;
    let cluster = &groups[0];
    let mut status = herd_cluster::observe_groups(&groups)
        .await
        .context("observing the shard groups")?;
    status.copies = crate::copy::read_statuses(layout).await?;
    if json {
        crate::output::emitln!("{}", serde_json::to_string_pretty(&status)?);
    } else {
        crate::output::emit!("{}", table(&status));
        if !status.copies.is_empty() {
            crate::output::emitln!("\nlogical copies:");
            for c in &status.copies {
                crate::output::emit!("{}", copy_lines(c));
            }
        }
        if let Some(sup) = &status.supervisor {
            let url = format!("http://{}:{}/metrics", cluster.host(), sup.api_port);
            let token = herd_cluster::Secrets::read_api_token(layout);
            let text = tokio::task::spawn_blocking(move || {
                let mut request = ureq::get(&url).timeout(std::time::Duration::from_secs(2));
                if let Some(t) = token {
                    request = request.set("Authorization", &format!("Bearer {t}"));
                }
                request.call().ok()?.into_string().ok()
            })
            .await
            .ok()
            .flatten();
            if let Some(text) = text {
                crate::output::emit!("{}", proxy_summary(&text));
            }
        }
    }
    Ok(())
}

/// The proxy's counters from `/metrics`, condensed to a few lines.
fn proxy_summary(metrics: &str) -> String {
    let mut routed: std::collections::BTreeMap<String, u64> = Default::default();
    let mut pools: std::collections::BTreeMap<String, (u64, u64, u64, u64)> = Default::default();
    let mut scalar = std::collections::BTreeMap::new();
    let mut sharded = false;
    for line in metrics.lines().filter(|l| !l.starts_with('#')) {
        let Some((key, value)) = line.rsplit_once(' ') else {
            continue;
        };
        sharded |= key.starts_with("herd_shard_");
        let value = value.parse::<f64>().unwrap_or(0.0) as u64;
        let label = |name: &str| {
            key.split(&format!("{name}=\""))
                .nth(1)
                .and_then(|r| r.split('"').next())
                .unwrap_or("")
                .to_string()
        };
        if key.starts_with("herd_routed_total{") {
            *routed
                .entry(format!("{}/{}", label("node"), label("reason")))
                .or_default() += value;
        } else if key.starts_with("herd_pool_connections{") {
            let entry = pools.entry(label("node")).or_default();
            if label("state") == "in_use" {
                entry.0 += value;
            } else {
                entry.1 += value;
            }
        } else if key.starts_with("herd_pool_waits_total{") {
            pools.entry(label("node")).or_default().2 += value;
        } else if key.starts_with("herd_pool_timeouts_total{") {
            pools.entry(label("node")).or_default().3 += value;
        } else if key.starts_with("herd_shard_in_doubt_resolved_total{") {
            let name = format!("in_doubt_{}", label("outcome"));
            *scalar.entry(name).or_default() += value;
        } else if !key.contains('{') {
            scalar.insert(key.to_string(), value);
        }
    }
    let get = |k: &str| scalar.get(k).copied().unwrap_or(0);
    let mut out = String::from("\nproxy:\n  routed (node/reason): ");
    out.push_str(
        &routed
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect::<Vec<_>>()
            .join(" "),
    );
    let _ = write!(
        out,
        "\n  read-your-writes: {} waits, {} fallbacks to the primary; client connections: {}\n  pools (in use/idle, waits for a free connection, timeouts): ",
        get("herd_ryw_waits_total"),
        get("herd_ryw_fallbacks_total"),
        get("herd_client_connections_total")
    );
    out.push_str(
        &pools
            .iter()
            .map(|(n, (u, i, w, t))| format!("{n} {u}/{i} {w} waits {t} timeouts"))
            .collect::<Vec<_>>()
            .join(", "),
    );
    out.push('\n');
    if sharded {
        let _ = writeln!(
            out,
            "  shard groups: {} reads across groups ({} rows merged), {} writes on every group, \
             {} moves of a transaction to another group, {} two-phase commits ({} aborted), in \
             doubt resolved: {} committed, {} rolled back",
            get("herd_shard_fan_out_total"),
            get("herd_shard_fan_out_rows_total"),
            get("herd_shard_write_all_total"),
            get("herd_shard_group_moves_total"),
            get("herd_shard_2pc_commits_total"),
            get("herd_shard_2pc_aborts_total"),
            get("in_doubt_commit"),
            get("in_doubt_rollback"),
        );
    }
    out
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

/// Opens every shard group of the cluster of `layout` (group 0 first; never empty).
pub fn open_all(layout: &Layout) -> anyhow::Result<Vec<Cluster>> {
    let cluster = open(layout)?;
    Ok(herd_cluster::open_groups(layout, &cluster.config)?)
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
         Dashboard:   http://{host}:{api}/   (live topology, lag, routing and events)\n\
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

/// The human-readable status: one table, or one per shard group.
pub fn table(s: &ClusterStatus) -> String {
    if s.groups.is_empty() {
        return group_table(s);
    }
    let mut out = String::new();
    for g in s.all_groups() {
        let _ = writeln!(out, "shard group {}:", g.group);
        out.push_str(&group_table(g));
        out.push('\n');
    }
    out
}

/// One group's table.
fn group_table(s: &ClusterStatus) -> String {
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
    if let Some(note) = &s.ha_note {
        let _ = writeln!(out, "last HA event: {note}");
    }
    if let Some(a) = &s.archiving {
        out.push_str(&archive_lines(a));
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

/// The primary's WAL archiving in a line, and its warning in another.
pub(crate) fn archive_lines(a: &ArchiveStatus) -> String {
    let age = |s: Option<f64>| s.map_or(String::new(), |s| format!(" {s:.0} s ago"));
    let mut out = match &a.last_archived_wal {
        Some(wal) => format!(
            "WAL archiving: last archived {wal}{}",
            age(a.last_archived_age_seconds)
        ),
        None => "WAL archiving: nothing archived yet".to_string(),
    };
    let _ = write!(out, ", {} waiting", a.pending);
    if a.pending > 0 {
        let _ = write!(out, " (oldest {:.0} s)", a.behind_seconds);
    }
    let _ = write!(out, ", {} failed attempt(s)", a.failed_count);
    if let Some(wal) = &a.last_failed_wal {
        let _ = write!(out, " (last {wal}{})", age(a.last_failed_age_seconds));
    }
    out.push('\n');
    if let Some(w) = &a.warning {
        let _ = writeln!(out, "WARNING: {w}");
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

/// A copy's status in a few lines: state, lag, retained WAL, bytes sent, then each table.
pub fn copy_lines(c: &herd_core::CopyStatus) -> String {
    let mib = |b: u64| format!("{:.1} MiB", b as f64 / (1u64 << 20) as f64);
    let mut facts = vec![c.state.as_str().to_string()];
    if let Some(b) = c.lag_bytes {
        let secs = c
            .lag_seconds
            .map(|s| format!(" / {s:.1} s"))
            .unwrap_or_default();
        facts.push(format!("lag {b} B{secs}"));
    }
    if let Some(b) = c.retained_bytes {
        facts.push(format!("slot retains {}", mib(b)));
    }
    if let Some(b) = c.sent_bytes {
        facts.push(format!("sent {}", mib(b)));
    }
    let mut out = format!(
        "copy {} (group {}, {} → {}): {}\n",
        c.name,
        c.group,
        c.database,
        c.target,
        facts.join(", ")
    );
    if let Some(why) = &c.reason {
        out.push_str(&format!("  ! {why}\n"));
    }
    for t in &c.tables {
        let rows = t.rows.map(|r| format!(", ~{r} rows")).unwrap_or_default();
        out.push_str(&format!("  {} {}{rows}\n", t.table, t.state));
    }
    out
}

#[cfg(test)]
mod tests {
    #[test]
    fn proxy_summary_condenses_metrics() {
        let text = "# TYPE herd_routed_total counter\n\
            herd_routed_total{node=\"node1\",reason=\"read\"} 5\n\
            herd_ryw_waits_total 3\n\
            herd_pool_connections{node=\"node0\",user=\"u\",database=\"d\",state=\"in_use\"} 1\n\
            herd_pool_connections{node=\"node0\",user=\"u\",database=\"d\",state=\"idle\"} 2\n\
            herd_pool_waits_total{node=\"node0\",user=\"u\",database=\"d\"} 4\n\
            herd_pool_timeouts_total{node=\"node0\",user=\"u\",database=\"d\"} 1\n";
        let s = super::proxy_summary(text);
        assert!(s.contains("node1/read=5"), "{s}");
        assert!(s.contains("3 waits"), "{s}");
        assert!(s.contains("node0 1/2 4 waits 1 timeouts"), "{s}");
        assert!(!s.contains("shard groups"), "no sharding counters: {s}");
        let sharded = format!(
            "{text}herd_shard_fan_out_total 2\nherd_shard_fan_out_rows_total 40\n\
             herd_shard_2pc_commits_total 7\nherd_shard_2pc_aborts_total 1\n\
             herd_shard_in_doubt_resolved_total{{outcome=\"commit\"}} 3\n\
             herd_shard_in_doubt_resolved_total{{outcome=\"rollback\"}} 4\n"
        );
        let s = super::proxy_summary(&sharded);
        assert!(s.contains("2 reads across groups (40 rows merged)"), "{s}");
        assert!(s.contains("7 two-phase commits (1 aborted)"), "{s}");
        assert!(s.contains("3 committed, 4 rolled back"), "{s}");
    }
}
