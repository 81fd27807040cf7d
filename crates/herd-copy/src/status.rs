//! A copy's status, read from the source (its slot, its walsender) and the target (its
//! subscription, its tables), judged into one state with a reason.

use herd_core::{CopyState, CopyStatus, Lsn, TableCopyStatus};
use tokio_postgres::Client;

use crate::{target, CopySpec};

/// What the source says about a copy's slot.
#[derive(Clone, Debug, PartialEq, Default)]
pub struct SourceSlot {
    /// `confirmed_flush_lsn`.
    pub confirmed: Option<Lsn>,
    /// `wal_status`: reserved, extended, unreserved or lost.
    pub wal_status: String,
    /// WAL kept for it, bytes.
    pub retained: Option<u64>,
    /// WAL written since its confirmed position, bytes.
    pub lag_bytes: Option<u64>,
    /// The walsender's `replay_lag`, seconds.
    pub lag_seconds: Option<f64>,
    /// `pg_stat_replication_slots.total_bytes`.
    pub sent_bytes: Option<u64>,
}

/// What the target says about a copy's subscription.
#[derive(Clone, Debug, PartialEq, Default)]
pub struct Subscription {
    /// Enabled (not paused).
    pub enabled: bool,
    /// Its apply worker runs.
    pub worker_running: bool,
    /// `pg_stat_subscription_stats.apply_error_count`.
    pub apply_errors: i64,
    /// `pg_stat_subscription_stats.sync_error_count`.
    pub sync_errors: i64,
    /// Each table: name, PostgreSQL's state letter, rows.
    pub tables: Vec<(String, String, Option<i64>)>,
}

/// Reads the slot of copy object `name` on the source primary; `None` when it has none.
pub async fn read_source(client: &Client, name: &str) -> Result<Option<SourceSlot>, String> {
    let row = client
        .query_opt(
            "select s.confirmed_flush_lsn::text, coalesce(s.wal_status, ''), \
                    pg_wal_lsn_diff(pg_current_wal_lsn(), s.restart_lsn)::float8, \
                    pg_wal_lsn_diff(pg_current_wal_lsn(), s.confirmed_flush_lsn)::float8, \
                    (select extract(epoch from r.replay_lag)::float8 from pg_stat_replication r where r.pid = s.active_pid), \
                    (select t.total_bytes::float8 from pg_stat_replication_slots t where t.slot_name = s.slot_name) \
             from pg_replication_slots s where s.slot_name = $1",
            &[&name],
        )
        .await
        .map_err(|e| format!("reading its slot on the source primary: {e}"))?;
    Ok(row.map(|r| {
        let bytes = |i: usize| r.get::<_, Option<f64>>(i).map(|v| v.max(0.0) as u64);
        SourceSlot {
            confirmed: r.get::<_, Option<String>>(0).and_then(|t| t.parse().ok()),
            wal_status: r.get(1),
            retained: bytes(2),
            lag_bytes: bytes(3),
            lag_seconds: r.get(4),
            sent_bytes: bytes(5),
        }
    }))
}

/// Reads the subscription of copy object `name` on the target; `None` when it has none.
pub async fn read_target(client: &Client, name: &str) -> Result<Option<Subscription>, String> {
    let row = client
        .query_opt(
            "select s.subenabled, \
                    exists(select 1 from pg_stat_subscription w where w.subid = s.oid and w.relid is null and w.pid is not null), \
                    coalesce((select st.apply_error_count from pg_stat_subscription_stats st where st.subid = s.oid), 0), \
                    coalesce((select st.sync_error_count from pg_stat_subscription_stats st where st.subid = s.oid), 0) \
             from pg_subscription s \
             where s.subname = $1 and s.subdbid = (select oid from pg_database where datname = current_database())",
            &[&name],
        )
        .await
        .map_err(|e| format!("reading its subscription on the target: {e}"))?;
    let Some(row) = row else { return Ok(None) };
    let tables = client
        .query(
            "select n.nspname || '.' || c.relname, r.srsubstate::text, \
                    coalesce((select p.tuples_processed from pg_stat_progress_copy p where p.relid = c.oid), st.n_live_tup) \
             from pg_subscription_rel r \
             join pg_subscription s on s.oid = r.srsubid \
             join pg_class c on c.oid = r.srrelid \
             join pg_namespace n on n.oid = c.relnamespace \
             left join pg_stat_user_tables st on st.relid = c.oid \
             where s.subname = $1 order by 1",
            &[&name],
        )
        .await
        .map_err(|e| format!("reading its tables on the target: {e}"))?;
    Ok(Some(Subscription {
        enabled: row.get(0),
        worker_running: row.get(1),
        apply_errors: row.get(2),
        sync_errors: row.get(3),
        tables: tables
            .iter()
            .map(|t| (t.get(0), t.get(1), t.get(2)))
            .collect(),
    }))
}

/// A person's word for PostgreSQL's table states (`pg_subscription_rel.srsubstate`).
pub fn table_state(letter: &str) -> &'static str {
    match letter {
        "i" => "initializing",
        "d" => "copying",
        "f" | "s" => "catching up",
        "r" => "streaming",
        _ => "unknown",
    }
}

/// The copy's state and the reason worth showing, from what each side said.
pub fn judge(
    slot_name: &str,
    source: &Result<Option<SourceSlot>, String>,
    target: &Result<Option<Subscription>, String>,
    warn_retained_bytes: u64,
) -> (CopyState, Option<String>) {
    let broken = |why: String| (CopyState::Broken, Some(why));
    let slot = match source {
        Err(e) => return broken(format!("the source primary cannot be read ({e})")),
        Ok(None) => {
            return broken(format!(
                "its slot {slot_name} is missing on the source primary (promoted before a replica held its copy?); drop the copy and create it again"
            ))
        }
        Ok(Some(s)) => s,
    };
    if slot.wal_status == "lost" {
        return broken(
            "PostgreSQL invalidated its slot: the target fell further behind than max_slot_wal_keep_size; drop the copy and create it again"
                .into(),
        );
    }
    let retained = slot.retained.unwrap_or(0);
    let warning = (retained > warn_retained_bytes || slot.wal_status == "unreserved").then(|| {
        format!(
            "its slot retains {} MiB of WAL on the source (warning above {} MiB; PostgreSQL invalidates it beyond max_slot_wal_keep_size)",
            retained >> 20,
            warn_retained_bytes >> 20
        )
    });
    let sub = match target {
        Err(e) => {
            let also = warning.map(|w| format!("; {w}")).unwrap_or_default();
            return broken(format!(
                "the target cannot be reached ({e}); the source keeps WAL for it up to max_slot_wal_keep_size{also}"
            ));
        }
        Ok(None) => {
            return broken(format!(
                "the target has no subscription {slot_name}; drop the copy and create it again"
            ))
        }
        Ok(Some(s)) => s,
    };
    if !sub.enabled {
        return (CopyState::Paused, warning);
    }
    if sub.tables.iter().any(|(_, s, _)| s != "r" && s != "s") {
        let reason = (sub.sync_errors > 0).then(|| {
            format!(
                "the initial copy failed {} time(s) and is retried; see the target server's log",
                sub.sync_errors
            )
        });
        return (CopyState::Copying, reason.or(warning));
    }
    if !sub.worker_running && sub.apply_errors > 0 {
        return broken(format!(
            "the target's apply worker stopped after {} error(s) (a conflicting row on the target?); see the target server's log",
            sub.apply_errors
        ));
    }
    (CopyState::Streaming, warning)
}

/// Reads and judges one copy. `source` is the source group's primary, if reachable.
pub async fn read(
    spec: &CopySpec,
    source: Result<&Client, String>,
    target_client: Result<&Client, String>,
    warn_retained_bytes: u64,
) -> CopyStatus {
    let name = spec.object_name();
    let slot = match source {
        Ok(c) => read_source(c, &name).await,
        Err(e) => Err(e),
    };
    let sub = match target_client {
        Ok(c) => read_target(c, &name).await,
        Err(e) => Err(e),
    };
    let (state, reason) = judge(&name, &slot, &sub, warn_retained_bytes);
    let slot = slot.ok().flatten().unwrap_or_default();
    let tables = match &sub {
        Ok(Some(s)) => s
            .tables
            .iter()
            .map(|(t, st, rows)| TableCopyStatus {
                table: t.clone(),
                state: table_state(st).into(),
                rows: *rows,
            })
            .collect(),
        _ => Vec::new(),
    };
    CopyStatus {
        name: spec.name.clone(),
        group: spec.group,
        database: spec.database.clone(),
        target: target::redacted(&spec.target),
        state,
        reason,
        lag_bytes: slot.lag_bytes,
        lag_seconds: slot.lag_seconds,
        retained_bytes: slot.retained,
        sent_bytes: slot.sent_bytes,
        confirmed_lsn: slot.confirmed,
        tables,
    }
}

/// The copies' figures as Prometheus text (appended to the proxy's in `/metrics`).
pub fn render_metrics(copies: &[CopyStatus]) -> String {
    use std::fmt::Write as _;
    let mut out = String::new();
    if copies.is_empty() {
        return out;
    }
    let mut family = |name: &str, kind: &str, help: &str, lines: Vec<String>| {
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}");
        for l in lines {
            let _ = writeln!(out, "{name}{l}");
        }
    };
    let label = |c: &CopyStatus| format!("copy=\"{}\",group=\"{}\"", c.name, c.group);
    let states = [
        CopyState::Copying,
        CopyState::Streaming,
        CopyState::Paused,
        CopyState::Broken,
    ];
    family(
        "herd_copy_state",
        "gauge",
        "1 for the state each logical copy is in, 0 for the others.",
        copies
            .iter()
            .flat_map(|c| {
                states.iter().map(move |s| {
                    format!(
                        "{{{},state=\"{}\"}} {}",
                        label(c),
                        s.as_str(),
                        u8::from(c.state == *s)
                    )
                })
            })
            .collect(),
    );
    let gauge = |c: &CopyStatus, v: Option<f64>| v.map(|v| format!("{{{}}} {v}", label(c)));
    family(
        "herd_copy_lag_bytes",
        "gauge",
        "Source WAL not yet confirmed by the copy's target, in bytes.",
        copies
            .iter()
            .filter_map(|c| gauge(c, c.lag_bytes.map(|b| b as f64)))
            .collect(),
    );
    family(
        "herd_copy_lag_seconds",
        "gauge",
        "How far the target's confirmations trail the source (walsender replay_lag), in seconds.",
        copies
            .iter()
            .filter_map(|c| gauge(c, c.lag_seconds))
            .collect(),
    );
    family(
        "herd_copy_retained_wal_bytes",
        "gauge",
        "WAL the copy's slot keeps on the source, in bytes.",
        copies
            .iter()
            .filter_map(|c| gauge(c, c.retained_bytes.map(|b| b as f64)))
            .collect(),
    );
    family(
        "herd_copy_sent_bytes_total",
        "counter",
        "Decoded change bytes sent to the target (pg_stat_replication_slots.total_bytes).",
        copies
            .iter()
            .filter_map(|c| gauge(c, c.sent_bytes.map(|b| b as f64)))
            .collect(),
    );
    family(
        "herd_copy_table_rows",
        "gauge",
        "Rows in each copied table on the target (PostgreSQL's estimate; while copying, rows so far).",
        copies
            .iter()
            .flat_map(|c| {
                c.tables.iter().filter_map(move |t| {
                    t.rows.map(|r| format!("{{{},table=\"{}\"}} {r}", label(c), t.table))
                })
            })
            .collect(),
    );
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn slot() -> SourceSlot {
        SourceSlot {
            wal_status: "reserved".into(),
            retained: Some(1 << 20),
            ..SourceSlot::default()
        }
    }

    fn sub(states: &[&str]) -> Subscription {
        Subscription {
            enabled: true,
            worker_running: true,
            tables: states
                .iter()
                .map(|s| ("public.t".to_string(), s.to_string(), None))
                .collect(),
            ..Subscription::default()
        }
    }

    #[test]
    fn metrics_name_each_copy_and_state() {
        let c = CopyStatus {
            name: "eu".into(),
            group: 0,
            database: "postgres".into(),
            target: "u@h:1/db".into(),
            state: CopyState::Streaming,
            reason: None,
            lag_bytes: Some(10),
            lag_seconds: None,
            retained_bytes: Some(4096),
            sent_bytes: Some(99),
            confirmed_lsn: None,
            tables: vec![TableCopyStatus {
                table: "public.t".into(),
                state: "streaming".into(),
                rows: Some(5),
            }],
        };
        let text = render_metrics(&[c]);
        for line in [
            "herd_copy_state{copy=\"eu\",group=\"0\",state=\"streaming\"} 1",
            "herd_copy_state{copy=\"eu\",group=\"0\",state=\"broken\"} 0",
            "herd_copy_lag_bytes{copy=\"eu\",group=\"0\"} 10",
            "herd_copy_retained_wal_bytes{copy=\"eu\",group=\"0\"} 4096",
            "herd_copy_sent_bytes_total{copy=\"eu\",group=\"0\"} 99",
            "herd_copy_table_rows{copy=\"eu\",group=\"0\",table=\"public.t\"} 5",
            "# TYPE herd_copy_sent_bytes_total counter",
        ] {
            assert!(text.contains(line), "{line} in\n{text}");
        }
        assert!(render_metrics(&[]).is_empty());
    }

    #[test]
    fn judged_states() {
        let gib = 1 << 30;
        let j = |src: Result<Option<SourceSlot>, String>,
                 tgt: Result<Option<Subscription>, String>| {
            judge("herd_copy_a", &src, &tgt, gib)
        };
        assert_eq!(
            j(Ok(Some(slot())), Ok(Some(sub(&["r", "s"])))),
            (CopyState::Streaming, None)
        );
        assert_eq!(
            j(Ok(Some(slot())), Ok(Some(sub(&["r", "d"])))).0,
            CopyState::Copying
        );
        let paused = Subscription {
            enabled: false,
            ..sub(&["d"])
        };
        assert_eq!(j(Ok(Some(slot())), Ok(Some(paused))).0, CopyState::Paused);
        let (s, why) = j(Ok(None), Ok(Some(sub(&["r"]))));
        assert_eq!(s, CopyState::Broken);
        assert!(why.unwrap_or_default().contains("missing on the source"));
        let lost = SourceSlot {
            wal_status: "lost".into(),
            ..slot()
        };
        let (s, why) = j(Ok(Some(lost)), Err("refused".into()));
        assert_eq!(s, CopyState::Broken);
        assert!(why.unwrap_or_default().contains("invalidated"));
        let (s, why) = j(Ok(Some(slot())), Err("connection refused".into()));
        assert_eq!(s, CopyState::Broken);
        assert!(why.unwrap_or_default().contains("connection refused"));
        let failing = Subscription {
            worker_running: false,
            apply_errors: 3,
            ..sub(&["r"])
        };
        let (s, why) = j(Ok(Some(slot())), Ok(Some(failing)));
        assert_eq!(s, CopyState::Broken);
        assert!(why.unwrap_or_default().contains("3 error"));
        let big = SourceSlot {
            retained: Some(2 * gib),
            ..slot()
        };
        let (s, why) = j(Ok(Some(big)), Ok(Some(sub(&["r"]))));
        assert_eq!(s, CopyState::Streaming);
        assert!(why.unwrap_or_default().contains("retains 2048 MiB"));
    }
}
