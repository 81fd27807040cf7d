//! The `# HELP` text of every metric the proxy exposes (Prometheus conventions want one per
//! metric; `promtool check metrics` flags any without).

/// The help text of metric `name`.
pub fn help(name: &str) -> &'static str {
    match name {
        "herd_routed_total" => "Transactions and statements routed to a node, by reason.",
        "herd_ryw_waits_total" => {
            "Reads that waited for a replica to replay the session's last write."
        }
        "herd_ryw_fallbacks_total" => {
            "Reads sent to the primary because no replica caught up in time."
        }
        "herd_client_connections_total" => "Client connections accepted by the endpoint.",
        "herd_auth_failures_total" => "Client authentications refused.",
        "herd_tls_handshake_failures_total" => "Client TLS handshakes that failed.",
        "herd_malformed_startups_total" => {
            "Client connections closed for a malformed startup message."
        }
        "herd_local_answers_total" => "Statements answered by the proxy itself, without a server.",
        "herd_read_retries_total" => {
            "Reads retried on another server after a replica failed before answering."
        }
        "herd_server_failures_total" => {
            "Server connections that failed during a unit of work, by node."
        }
        "herd_standby_refusals_total" => {
            "Statements a standby refused (e.g. a write on a replica), by node and SQLSTATE."
        }
        "herd_unit_errors_total" => "Units of work that ended in an error, by SQLSTATE.",
        "herd_schema_changes_total" => {
            "Schema changes after which servers prepare kept statements again (DDL through the \
             endpoint, or a server saying a kept statement was out of date)."
        }
        "herd_stale_retries_total" => {
            "Units run again after a server refused a kept statement as out of date, before \
             the client saw anything."
        }
        "herd_replication_connections_total" => "Replication connections relayed to the primary.",
        "herd_ha_decisions_total" => {
            "Decisions of the high-availability supervisor, by shard group and action."
        }
        "herd_shard_routed_total" => "Statements routed to one shard group.",
        "herd_shard_fan_out_total" => "Statements fanned out to several shard groups.",
        "herd_shard_fan_out_rows_total" => "Rows merged from fanned-out statements.",
        "herd_shard_write_all_total" => "Writes applied to every shard group (reference tables).",
        "herd_shard_group_moves_total" => "Transactions that moved to another shard group.",
        "herd_shard_2pc_total" => {
            "Transactions committed with two-phase commit across shard groups."
        }
        "herd_shard_2pc_commits_total" => "Two-phase commits that committed.",
        "herd_restore_points_total" => {
            "Restore points across shard groups, taken with two-phase commits held, by outcome."
        }
        "herd_shard_2pc_aborts_total" => "Two-phase commits that rolled back.",
        "herd_shard_in_doubt_resolved_total" => {
            "In-doubt prepared transactions resolved by the recovery loop."
        }
        "herd_shard_ddl_total" => "DDL statements applied to every shard group.",
        "herd_shard_copy_rows_total" => "Rows of COPY FROM routed to shard groups.",
        "herd_shard_copy_out_total" => "COPY TO statements merged across shard groups.",
        "herd_shard_move_waits_total" => {
            "Statements that waited for a shard switching groups or for a shard group being added."
        }
        "herd_shard_moves_switched_total" => {
            "Shard moves that switched the shard to its new group."
        }
        "herd_primary_available" => "1 when shard group 0 has a primary accepting writes.",
        "herd_group_primary_available" => "1 when the shard group has a primary accepting writes.",
        "herd_replica_lag_bytes" => "Bytes of WAL the replica has not replayed (proxy's poll).",
        "herd_replica_staleness_seconds" => {
            "Upper bound on how old the replica's data is (NaN when unknown)."
        }
        "herd_replica_in_read_pool" => {
            "1 when the replica is in the read pool (lag-aware, with hysteresis)."
        }
        "herd_pool_connections" => "Server connections of a pool, by state (in_use or idle).",
        "herd_pool_waits_total" => "Clients that waited for a server connection.",
        "herd_pool_wait_seconds_total" => "Time clients spent waiting for a server connection.",
        "herd_pool_timeouts_total" => "Clients that gave up waiting for a server connection.",
        "herd_pool_connects_total" => "Server connections opened by the pools.",
        "herd_classifier_cache_hits_total" => "Statement classifications answered from the cache.",
        "herd_classifier_cache_misses_total" => "Statements parsed to be classified.",
        _ => "A Herd counter.",
    }
}

/// The `# HELP` and `# TYPE` lines of metric `name` of type `kind`.
pub fn header(name: &str, kind: &str) -> String {
    format!("# HELP {name} {}\n# TYPE {name} {kind}\n", help(name))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_known_metric_has_its_own_help() {
        for name in [
            "herd_routed_total",
            "herd_ryw_waits_total",
            "herd_pool_connections",
            "herd_replica_staleness_seconds",
            "herd_shard_2pc_commits_total",
            "herd_restore_points_total",
        ] {
            assert_ne!(help(name), help("herd_unknown_total"), "{name}");
        }
        assert_eq!(
            header("herd_x_total", "counter"),
            "# HELP herd_x_total A Herd counter.\n# TYPE herd_x_total counter\n"
        );
    }

    /// The Grafana dashboard in the repository only queries metrics Herd exposes.
    #[test]
    fn the_grafana_dashboard_names_known_metrics() {
        let json = include_str!("../../../dashboards/grafana-herd.json");
        let mut names: Vec<&str> = Vec::new();
        let mut rest = json;
        while let Some(at) = rest.find("herd_") {
            let tail = &rest[at..];
            let end = tail
                .find(|c: char| !(c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_'))
                .unwrap_or(tail.len());
            names.push(&tail[..end]);
            rest = &tail[end..];
        }
        assert!(names.len() > 10, "{names:?}");
        for name in names {
            assert_ne!(help(name), help("herd_unknown_total"), "{name}");
        }
    }

    /// Every counter the workspace increments has its own help text (a new counter without
    /// one would fall back to the generic sentence).
    #[test]
    fn every_incremented_counter_has_its_own_help() {
        let crates = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
        let mut files = Vec::new();
        let mut dirs = vec![crates];
        while let Some(dir) = dirs.pop() {
            for entry in std::fs::read_dir(&dir).expect("listing sources").flatten() {
                let path = entry.path();
                if path.is_dir() && !path.ends_with("target") && !path.ends_with("fuzz") {
                    dirs.push(path);
                } else if path.extension().is_some_and(|e| e == "rs") {
                    files.push(path);
                }
            }
        }
        let mut seen = 0;
        for file in files {
            let text = std::fs::read_to_string(&file).expect("reading a source");
            for call in ["metrics.inc(", "metrics.inc_labels(", "metrics.add("] {
                for (at, _) in text.match_indices(call) {
                    let rest = text[at + call.len()..].trim_start();
                    let Some(name) = rest
                        .strip_prefix('"')
                        .and_then(|r| r.split('"').next())
                        .filter(|n| n.starts_with("herd_"))
                    else {
                        continue;
                    };
                    seen += 1;
                    assert_ne!(
                        help(name),
                        help("herd_unknown_total"),
                        "{name} in {}",
                        file.display()
                    );
                }
            }
        }
        assert!(seen > 20, "found only {seen} counters");
    }
}
