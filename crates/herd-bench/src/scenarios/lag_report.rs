//! The report of `herd bench lag`: its Markdown table (laid out like reference 001's two
//! experiments, the article's figures beside ours) and the phase order for tables and charts.

use std::fmt::Write as _;

use crate::report::{LagResult, Percentiles, Results};

/// The phases of `r` in the order of `settings.modes`, then any others.
pub fn ordered(r: &Results) -> Vec<(&String, &LagResult)> {
    let mut out: Vec<_> = r
        .settings
        .modes
        .iter()
        .filter_map(|m| r.lag.get_key_value(m))
        .collect();
    out.extend(r.lag.iter().filter(|(m, _)| !r.settings.modes.contains(m)));
    out
}

/// phase | reads | writer tps (× alone) | reader tps (× direct) | WAL rate | time lag
/// p50/p95/max | bytes p50/p95/max | replay_lag p50/p95/max | reads on the replica | pool exits
/// | published.
pub fn table(r: &Results) -> String {
    let mut md = String::from(
        "| phase | reads | writer tps (× alone) | reader tps (× direct) | WAL MiB/s | lag ms p50 / \
         p95 / max | lag KiB p50 / p95 / max | replay_lag ms p50 / p95 / max | reads on replica \
         | pool exits | published (AlloyDB article) |\n\
         |---|---|---|---|---|---|---|---|---|---|---|\n",
    );
    for (phase, l) in ordered(r) {
        let tps = |target: &str| {
            r.modes
                .get(phase)
                .and_then(|m| m.get(target))
                .map_or("—".to_string(), |t| {
                    format!("{:.0} ({:.2}×)", t.median_tps, t.ratio_to_direct)
                })
        };
        let three = |p: &Percentiles, div: f64| {
            format!(
                "{:.1} / {:.1} / {:.1}",
                p.p50 / div,
                p.p95 / div,
                p.max / div
            )
        };
        let share = match (l.reads_to_replica, l.reads_to_primary) {
            (Some(rep), Some(pri)) if rep + pri > 0 => {
                format!("{:.1} %", 100.0 * rep as f64 / (rep + pri) as f64)
            }
            (Some(_), Some(_)) => "0 reads".into(),
            _ if l.reader == "replica" => "100 %".into(),
            _ => "—".into(),
        };
        let reads = match &l.read_pool_limits {
            Some(limits) => format!("Herd, pool {limits}"),
            None => l.reader.clone(),
        };
        let _ = writeln!(
            md,
            "| {phase} | {reads} | {} | {} | {:.1} | {} | {} | {} | {share} | {} | {} |",
            tps("writer"),
            tps("reader"),
            l.wal_bytes_per_s / (1024.0 * 1024.0),
            three(&l.time_ms, 1.0),
            three(&l.bytes, 1024.0),
            three(&l.replay_lag_ms, 1.0),
            l.pool_exits.map_or("—".to_string(), |n| n.to_string()),
            r.published.get(phase).map_or("", String::as_str)
        );
    }
    md
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;
    use crate::report::{Machine, ModeResult, Settings, TargetResult};

    #[test]
    fn one_row_per_phase_with_routing_share() {
        let p = |a, b, c| Percentiles {
            p50: a,
            p95: b,
            max: c,
        };
        let lag = LagResult {
            description: "d".into(),
            reader: "herd".into(),
            samples: 3,
            sample_hz: 10.0,
            skipped_samples: 0,
            wal_bytes_per_s: 2.0 * 1024.0 * 1024.0,
            bytes: p(1024.0, 2048.0, 4096.0),
            time_ms: p(1.0, 2.0, 3.0),
            replay_lag_ms: p(0.5, 1.5, 2.5),
            read_pool_limits: Some("1 MiB / 100 ms".into()),
            reads_to_replica: Some(25),
            reads_to_primary: Some(75),
            pool_exits: Some(4),
            in_pool_share: Some(0.3),
            series: vec![[0.1, 1024.0, 1.0]],
        };
        let tps = |v: f64, ratio: f64| TargetResult {
            runs: vec![v],
            median_tps: v,
            ratio_to_direct: ratio,
            failed_transactions: 0,
        };
        let mut row = ModeResult::new();
        row.insert("writer".into(), tps(400.0, 0.5));
        row.insert("reader".into(), tps(5000.0, 1.25));
        let r = Results {
            scenario: "lag".into(),
            date: crate::report::utc(0),
            quick: true,
            machine: Machine {
                cores: 2,
                memory_mib: 1,
                cpu: String::new(),
                load_average: String::new(),
            },
            settings: Settings {
                command: "c".into(),
                rounds: 1,
                duration_s: 3,
                scale: 1,
                modes: vec!["herd-pool-tight".into()],
                targets: vec!["writer".into(), "reader".into()],
                versions: BTreeMap::new(),
            },
            modes: [("herd-pool-tight".to_string(), row)].into(),
            published: [("herd-pool-tight".to_string(), "—".to_string())].into(),
            notes: vec![],
            lag: [("herd-pool-tight".to_string(), lag)].into(),
            ..Default::default()
        };
        let t = table(&r);
        assert!(
            t.contains(
                "| herd-pool-tight | Herd, pool 1 MiB / 100 ms | 400 (0.50×) | 5000 (1.25×) | 2.0 \
                 | 1.0 / 2.0 / 3.0 | 1.0 / 2.0 / 4.0 | 0.5 / 1.5 / 2.5 | 25.0 % | 4 | — |"
            ),
            "{t}"
        );
        assert_eq!(t.lines().count(), 3, "{t}");
        assert!(crate::report::markdown(&r).contains("**Quick run"));
    }
}
