//! Reports: `results.json`, `report.md` and an SVG chart.
//!
//! `results.json` has this shape (every scenario; `modes` maps a mode to its targets):
//!
//! ```json
//! {
//!   "scenario": "proxy",
//!   "date": "2025-01-31T12:00:00Z",
//!   "quick": false,
//!   "machine": { "cores": 2, "memory_mib": 24105, "cpu": "…", "load_average": "1.9 2.0 2.1" },
//!   "settings": { "command": "pgbench -S -c 16 -j 2 -T 10 -M MODE URL", "rounds": 5,
//!                 "duration_s": 10, "scale": 10, "modes": ["simple", "prepared"],
//!                 "targets": ["direct", "herd", "pgbouncer"],
//!                 "versions": { "herd": "0.1.0", "pgbouncer": "1.18.0" } },
//!   "modes": { "simple": { "direct": { "runs": [1.0], "median_tps": 1.0,
//!                                      "ratio_to_direct": 1.0, "failed_transactions": 0 } } },
//!   "published": { "simple": "PgBouncer 0.57×" },
//!   "notes": ["…"]
//! }
//! ```

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

pub use crate::scenarios::bandwidth_report::{BandwidthRow, StreamBytes};
use crate::BenchError;

mod machine;
mod results;

pub use machine::{now_utc, utc, Machine};
pub use results::{
    FailoverResult, LagResult, ModeResult, OtherGroup, Percentiles, ProcessCost, ReadScaling,
    Results, Settings, TargetResult,
};

/// How targets are named in tables and charts.
pub fn label(target: &str) -> &str {
    match target {
        "herd" => "Herd",
        "herd-primary" => "Herd (primary only)",
        "replica" => "direct to a replica",
        "forwarder" => "TCP forwarder",
        "pgbouncer" => "PgBouncer",
        other => other,
    }
}

/// The Markdown report: a heading, the machine, how it ran, the table and the notes.
pub fn markdown(r: &Results) -> String {
    let command = &r.settings.command;
    if r.scenario == "failover-shards" {
        let body = crate::scenarios::failover_shards::body(r);
        return document(r, &format!("Command: `{command}`."), &body);
    }
    if !r.failover.is_empty() {
        return document(r, &format!("Command: `{command}`."), &failover_body(r));
    }
    if !r.bandwidth.is_empty() {
        let mut table = crate::scenarios::bandwidth_report::table(r);
        table.push_str(&crate::scenarios::bandwidth_report::copies_table(r));
        return document(r, &format!("Workloads: `{command}`."), &table);
    }
    if r.backup.is_some() {
        let how = format!(
            "Commands: `{command}`, {} round(s) in rotated order, pgbench {} s per condition.",
            r.settings.rounds, r.settings.duration_s
        );
        return document(r, &how, &crate::scenarios::backup_report::table(r));
    }
    if r.shard_move.is_some() {
        let how = format!("Command: `{command}`, {} move(s).", r.settings.rounds);
        return document(r, &how, &crate::scenarios::shard_move_report::table(r));
    }
    if !r.lag.is_empty() {
        let how = format!(
            "Command: `{command}`, {} s per phase, scale {}.",
            r.settings.duration_s, r.settings.scale
        );
        return document(r, &how, &crate::scenarios::lag_report::table(r));
    }
    let how = format!(
        "Command: `{command}`, {} round(s) of {} s per target and mode, scale {}, targets \
         interleaved.",
        r.settings.rounds, r.settings.duration_s, r.settings.scale
    );
    let mut body = table(r);
    if !r.process_costs.is_empty() {
        body.push_str(&costs_table(r));
    }
    if let Some(t) = &r.targets {
        body.push_str(&crate::scenarios::proxy_targets::table(t));
    }
    document(r, &how, &body)
}

/// The proxies' own cost per transaction, by mode and target.
fn costs_table(r: &Results) -> String {
    let mut md = String::from(
        "\nWhat each proxy's process cost (from /proc, over all its runs of the mode):\n\n\
         | mode | target | CPU µs / transaction | of which user space | wake-ups (context switches) / transaction | RSS MiB | pgbench's CPU µs / transaction | machine's CPU µs / transaction |\n\
         |---|---|---|---|---|---|---|---|\n",
    );
    for (mode, targets) in &r.process_costs {
        for (t, c) in targets {
            let _ = writeln!(
                md,
                "| {mode} | {t} | {:.1} | {:.1} | {:.2} | {:.1} | {:.1} | {:.1} |",
                c.cpu_us_per_txn,
                c.user_us_per_txn,
                c.switches_per_txn,
                c.rss_mib,
                c.pgbench_cpu_us_per_txn,
                c.machine_cpu_us_per_txn
            );
        }
    }
    md
}

/// Heading, machine and `how` (the command) in one paragraph, then `body`, then the notes.
fn document(r: &Results, how: &str, body: &str) -> String {
    let mut md = String::new();
    let _ = writeln!(md, "# herd bench {} — {}\n", r.scenario, r.date);
    let m = &r.machine;
    let cpu = if m.cpu.is_empty() {
        "unknown CPU"
    } else {
        &m.cpu
    };
    let quick = if r.quick {
        " **Quick run: figures not meaningful.**"
    } else {
        ""
    };
    let _ = writeln!(
        md,
        "Machine: {} cores, {} MiB, {cpu}, load average at the end {}. {how}{quick}\n",
        m.cores, m.memory_mib, m.load_average
    );
    md.push_str(body);
    if !r.notes.is_empty() {
        md.push('\n');
        for n in &r.notes {
            let _ = writeln!(md, "- {n}");
        }
    }
    md
}

/// The table: mode | baseline tps | for each other target: tps, ratio | published.
pub fn table(r: &Results) -> String {
    match r.scenario.as_str() {
        "commit-modes" => return crate::scenarios::commit_modes::table(r),
        "commit-waits" => return crate::scenarios::commit_waits::table(r),
        "read-scaling" => return crate::scenarios::read_scaling_report::table(r),
        "sharding" => return crate::scenarios::sharding_report::table(r),
        _ => {}
    }
    let Some((base, others)) = r.settings.targets.split_first() else {
        return String::new();
    };
    let mut head = format!("| mode | {} tps |", label(base));
    for t in others {
        let _ = write!(head, " {0} tps | {0} ratio |", label(t));
    }
    head.push_str(" published ratio |\n");
    let cols = 3 + 2 * others.len();
    let mut md = head + &"|---".repeat(cols) + "|\n";
    for (mode, targets) in ordered_modes(r) {
        let cell = |t: &str, f: &dyn Fn(&TargetResult) -> String| {
            targets.get(t).map_or("n/a".to_string(), f)
        };
        let _ = write!(
            md,
            "| {mode} | {} |",
            cell(base, &|x| format!("{:.0}", x.median_tps))
        );
        for t in others {
            let _ = write!(
                md,
                " {} | {} |",
                cell(t, &|x| format!("{:.0}", x.median_tps)),
                // No baseline (e.g. the server refused that many clients): no ratio.
                cell(t, &|x| if x.ratio_to_direct > 0.0 {
                    format!("{:.2}×", x.ratio_to_direct)
                } else {
                    "n/a".into()
                })
            );
        }
        let _ = writeln!(
            md,
            " {} |",
            r.published.get(mode).map_or("", String::as_str)
        );
    }
    md
}

/// The failover table, then every iteration.
fn failover_body(r: &Results) -> String {
    let mut md = String::new();
    md.push_str(&failover_table(r));
    let hosts = r.scenario == "failover-hosts";
    md.push_str(if hosts {
        "\nEvery iteration (RTO s / seconds until whole again / new primary / seconds the \
         isolated primary still accepted writes):\n\n"
    } else {
        "\nEvery iteration (RTO s / seconds to full strength / new primary / writes acknowledged \
         by the killed primary after the kill):\n\n"
    });
    for (mode, f) in ordered_failover(r) {
        let runs: Vec<String> = f
            .rto_s
            .iter()
            .zip(&f.full_strength_s)
            .zip(&f.new_primaries)
            .enumerate()
            .map(|(i, ((rto, full), p))| {
                let last = if hosts {
                    f.writable_window_s
                        .get(i)
                        .map_or("–".to_string(), |w| format!("{w:.2}"))
                } else {
                    f.acked_by_killed_primary
                        .get(i)
                        .copied()
                        .unwrap_or(0)
                        .to_string()
                };
                format!("{rto:.2}/{full:.1}/{p}/{last}")
            })
            .collect();
        let _ = writeln!(md, "- {mode}: {}", runs.join(", "));
    }
    md
}

/// mode | iterations | RTO p50 | p95 | max | acknowledged writes | lost | target; with
/// `--hosts`, the isolated primary's writable window, instants with two writable nodes and
/// the published figures as well.
pub fn failover_table(r: &Results) -> String {
    let hosts = r.scenario == "failover-hosts";
    let mut md = if hosts {
        String::from(
            "| fault | iterations | RTO p50 | p95 | max | isolated primary writable (max) | \
             two writable | acknowledged writes | lost | target | published |\n\
             |---|---|---|---|---|---|---|---|---|---|---|\n",
        )
    } else {
        String::from(
            "| mode | iterations | RTO p50 | p95 | max | acknowledged writes | lost | target |\n\
             |---|---|---|---|---|---|---|---|\n",
        )
    };
    for (mode, f) in ordered_failover(r) {
        let extra = if hosts {
            let window = if f.writable_window_s.is_empty() {
                "–".to_string()
            } else {
                let max = f.writable_window_s.iter().copied().fold(0.0, f64::max);
                format!("{max:.2} s")
            };
            format!(" {window} | {} |", f.two_writable)
        } else {
            String::new()
        };
        let published = if hosts {
            format!(" {} |", r.published.get(mode).map_or("", String::as_str))
        } else {
            String::new()
        };
        let _ = writeln!(
            md,
            "| {mode} | {} | {:.2} s | {:.2} s | {:.2} s |{extra} {} | {} | {} ({}) |{published}",
            f.iterations,
            f.rto_p50_s,
            f.rto_p95_s,
            f.rto_max_s,
            f.acked,
            f.lost,
            f.target,
            if f.target_met { "met" } else { "not met" }
        );
    }
    md
}

/// The failover modes of `r` in the order of `settings.modes`, then any others.
pub fn ordered_failover(r: &Results) -> Vec<(&String, &FailoverResult)> {
    in_order(&r.settings.modes, &r.failover)
}

/// The modes of `r` in the order of `settings.modes`, then any others.
pub fn ordered_modes(r: &Results) -> Vec<(&String, &ModeResult)> {
    in_order(&r.settings.modes, &r.modes)
}

/// The entries of `map` named in `order`, in that order, then the others (sorted).
pub fn in_order<'a, T>(
    order: &'a [String],
    map: &'a BTreeMap<String, T>,
) -> Vec<(&'a String, &'a T)> {
    let mut out: Vec<_> = order.iter().filter_map(|m| map.get_key_value(m)).collect();
    out.extend(map.iter().filter(|(m, _)| !order.contains(m)));
    out
}

/// Writes `results.json`, `report.md` and `<scenario>.svg` into `out`; the Markdown and the
/// paths written.
pub fn write_all(r: &Results, out: &Path) -> Result<(String, Vec<PathBuf>), BenchError> {
    let json = out.join("results.json");
    let text = serde_json::to_string_pretty(r)? + "\n";
    std::fs::write(&json, text).map_err(|e| BenchError::io("writing", &json, e))?;
    let md = markdown(r);
    let report = out.join("report.md");
    std::fs::write(&report, &md).map_err(|e| BenchError::io("writing", &report, e))?;
    let svg = out.join(format!("{}.svg", r.scenario));
    let mut files = vec![json, report];
    if !r.failover.is_empty() {
        crate::chart::rto(r, &svg)?;
    } else if !r.bandwidth.is_empty() {
        crate::scenarios::bandwidth_report::chart(r, &svg)?;
    } else if r.shard_move.is_some() {
        crate::scenarios::shard_move_report::chart(r, &svg)?;
    } else if r.backup.is_some() {
        crate::scenarios::backup_report::chart(r, &svg)?;
    } else if !r.lag.is_empty() {
        crate::chart::lag(r, &svg)?;
        // The phases' tps as the usual grouped bars beside the lag lines.
        let tps = out.join(format!("{}-tps.svg", r.scenario));
        crate::chart::bars(r, &tps)?;
        files.push(tps);
    } else {
        crate::chart::bars(r, &svg)?;
    }
    files.insert(2, svg);
    Ok((md, files))
}

/// A small proxy-shaped [`Results`] for other modules' tests.
#[cfg(test)]
pub(crate) fn tests_sample() -> Results {
    tests::sample()
}

#[cfg(test)]
mod tests {
    use super::*;

    pub(super) fn sample() -> Results {
        let target = |runs: Vec<f64>, ratio: f64| TargetResult {
            median_tps: crate::median(&runs).unwrap_or(0.0),
            runs,
            ratio_to_direct: ratio,
            failed_transactions: 0,
        };
        let mut simple = ModeResult::new();
        simple.insert("direct".into(), target(vec![1000.0, 1200.0, 1100.0], 1.0));
        simple.insert("herd".into(), target(vec![800.0], 800.0 / 1100.0));
        simple.insert("pgbouncer".into(), target(vec![600.0], 600.0 / 1100.0));
        let mut prepared = ModeResult::new();
        prepared.insert("direct".into(), target(vec![2000.0], 1.0));
        prepared.insert("herd".into(), target(vec![1500.0], 0.75));
        Results {
            scenario: "proxy".into(),
            date: utc(0),
            quick: true,
            machine: Machine {
                cores: 2,
                memory_mib: 1024,
                cpu: String::new(),
                load_average: "0.50 0.40 0.30".into(),
            },
            settings: Settings {
                command: "pgbench -S".into(),
                rounds: 1,
                duration_s: 2,
                scale: 1,
                modes: vec!["simple".into(), "prepared".into()],
                targets: vec!["direct".into(), "herd".into(), "pgbouncer".into()],
                versions: BTreeMap::new(),
            },
            modes: [("simple".into(), simple), ("prepared".into(), prepared)].into(),
            published: [("simple".to_string(), "PgBouncer 0.57×".to_string())].into(),
            notes: vec!["a note".into()],
            ..Default::default()
        }
    }

    #[test]
    fn json_shape() {
        let v = serde_json::to_value(sample()).expect("json");
        for key in [
            "scenario", "date", "quick", "machine", "settings", "modes", "notes",
        ] {
            assert!(v.get(key).is_some(), "{key} missing in {v}");
        }
        assert_eq!(v["machine"]["cores"], 2);
        assert_eq!(v["settings"]["targets"][0], "direct");
        let direct = &v["modes"]["simple"]["direct"];
        assert_eq!(direct["runs"].as_array().map(Vec::len), Some(3));
        assert_eq!(direct["median_tps"], 1100.0);
        assert_eq!(direct["ratio_to_direct"], 1.0);
        assert_eq!(direct["failed_transactions"], 0);
        assert!(v["modes"]["prepared"].get("pgbouncer").is_none());
        let back: Results = serde_json::from_value(v).expect("round trip");
        assert_eq!(back, sample());
    }

    #[test]
    fn markdown_table() {
        let t = table(&sample());
        let lines: Vec<&str> = t.lines().collect();
        assert!(lines[2].starts_with("| simple |") && lines[3].starts_with("| prepared |"));
        assert_eq!(
            lines[0],
            "| mode | direct tps | Herd tps | Herd ratio | PgBouncer tps | PgBouncer ratio | published ratio |"
        );
        assert!(
            lines.contains(&"| prepared | 2000 | 1500 | 0.75× | n/a | n/a |  |"),
            "{t}"
        );
        assert!(
            lines.contains(&"| simple | 1100 | 800 | 0.73× | 600 | 0.55× | PgBouncer 0.57× |"),
            "{t}"
        );
    }

    #[test]
    fn failover_report() {
        let mut r = sample();
        r.scenario = "failover".into();
        r.modes.clear();
        r.settings.modes = vec!["on".into()];
        let proxy_json = serde_json::to_value(sample()).expect("json");
        assert!(proxy_json.get("failover").is_none());
        r.failover.insert(
            "on".into(),
            FailoverResult {
                iterations: 2,
                rto_s: vec![2.5, 3.5],
                rto_p50_s: 3.0,
                rto_p95_s: 3.5,
                rto_max_s: 3.5,
                full_strength_s: vec![9.0, 10.0],
                new_primaries: vec!["node1".into(), "node2".into()],
                acked_by_killed_primary: vec![0, 2],
                writable_window_s: Vec::new(),
                two_writable: 0,
                other_group: Vec::new(),
                acked: 100,
                lost: 0,
                failed_writes: 3,
                target: "RTO p50 ≤ 3 s, 0 lost".into(),
                target_met: true,
            },
        );
        let t = failover_table(&r);
        assert!(
            t.contains(
                "| on | 2 | 3.00 s | 3.50 s | 3.50 s | 100 | 0 | RTO p50 ≤ 3 s, 0 lost (met) |"
            ),
            "{t}"
        );
        let dir = tempfile::tempdir().expect("tempdir");
        let (md, _) = write_all(&r, dir.path()).expect("write");
        assert!(
            md.contains("- on: 2.50/9.0/node1/0, 3.50/10.0/node2/2"),
            "{md}"
        );
        let svg = std::fs::read_to_string(dir.path().join("failover.svg")).expect("svg");
        assert!(
            svg.contains("<svg") && svg.contains("on (p50 3.00 s)"),
            "{svg}"
        );
        let v = serde_json::to_value(&r).expect("json");
        assert_eq!(v["failover"]["on"]["lost"], 0);
        let back: Results = serde_json::from_value(v).expect("round trip");
        assert_eq!(back, r);
    }

    #[test]
    fn dates() {
        assert_eq!(utc(0), "1970-01-01T00:00:00Z");
        assert_eq!(utc(951_782_400 + 3_661), "2000-02-29T01:01:01Z");
        assert_eq!(utc(1_735_689_599), "2024-12-31T23:59:59Z");
    }

    #[test]
    fn writes_all_three_files() {
        let dir = tempfile::tempdir().expect("tempdir");
        let (md, files) = write_all(&sample(), dir.path()).expect("write");
        assert!(md.contains("| simple |"));
        assert_eq!(files.len(), 3);
        let svg = std::fs::read_to_string(dir.path().join("proxy.svg")).expect("svg");
        assert!(svg.contains("<svg") && svg.contains("simple") && svg.contains("PgBouncer"));
    }
}
