//! `herd bench read-scaling`'s report: the notes on where the reads went and how the nodes
//! were confined, the article's figures, and the table laid out like its read table.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use super::read_scaling::{mode, Plan, BASE, FRONT_QUOTA_US, PERIOD_US};
use crate::report::{ReadScaling, Results};

/// Notes on where the reads went, the speedup ceiling that follows, and the method.
pub(super) fn explain(s: &ReadScaling, plan: &Plan) -> Vec<String> {
    let mut notes = Vec::new();
    let serving: Vec<String> = s
        .routed
        .iter()
        .map(|(m, nodes)| {
            let counts: Vec<String> = nodes.iter().map(|(n, v)| format!("{n} {v}")).collect();
            format!(
                "{m}: {} serving ({})",
                s.serving_nodes.get(m).copied().unwrap_or(0),
                counts.join(", ")
            )
        })
        .collect();
    notes.push(format!(
        "Statements routed per node during the measured runs (Herd's herd_routed_total): {}.",
        serving.join("; ")
    ));
    notes.push(
        "The clusters run with `proxy.read_from_primary = true`: the primary takes its share of \
         the reads (least outstanding requests), so N nodes read on N nodes, as in the article \
         (by default Herd keeps the primary for writes and reads on the N − 1 replicas only)."
            .into(),
    );
    if s.confined {
        let busy: Vec<String> = s
            .throttled_share
            .iter()
            .map(|(m, nodes)| {
                let shares: Vec<String> = nodes
                    .iter()
                    .map(|(n, v)| format!("{n} {:.0} %", v * 100.0))
                    .collect();
                format!("{m}: {}", shares.join(", "))
            })
            .collect();
        notes.push(format!(
            "Each node's postmaster and all its processes ran in its own group ({}); backends \
             forked later inherit it. Herd's supervisors (with the proxy), pgbench and this \
             harness shared one more group capped at {:.1} CPU. The groups' parent has the \
             highest CPU weight, so other work on the machine cannot starve them below their \
             quotas. Share of quota periods in which each node was throttled (≈ 100 % = the node was \
             the bottleneck): {}.",
            s.confinement,
            FRONT_QUOTA_US as f64 / PERIOD_US as f64,
            busy.join("; ")
        ));
    }
    notes.push(format!(
        "Data set: {} devices × {} readings (one every 10 s, {} rows), loaded on the primary \
         before confinement; the article used 4000 devices × 3 days (100M rows) on 8-core VMs. \
         All clusters stay up and the runs interleave; consistency `eventual` through the \
         proxy; one query per transaction (qps = pgbench tps).",
        plan.devices,
        plan.points,
        u64::from(plan.devices) * u64::from(plan.points)
    ));
    notes.push(
        "pgbench, Herd's proxy and the servers share this machine's cores (and other work on it: \
         see the load average), so a node's quota, not a machine, is the unit scaled here."
            .into(),
    );
    notes
}

/// What reference 000 says about read throughput per cluster size (TimescaleDB, 8 clients).
pub(super) fn published() -> BTreeMap<String, String> {
    [
        (
            "1 node",
            "1.00× (baseline; per-query qps not in the stored text)",
        ),
        (
            "3 nodes",
            "\"an average of 2.5x faster queries\" (summary: \"2.9x higher on average\"); \
             per-query figures not in the stored text",
        ),
        (
            "5 nodes",
            "\"4.8x faster queries\"; per-query figures not in the stored text",
        ),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .collect()
}

/// The report's table, laid out like the article's read table (one row per query, qps per
/// cluster size with the speedup against 1 node), then the published speedups.
pub(crate) fn table(r: &Results) -> String {
    let modes = crate::report::ordered_modes(r);
    let mut md = String::from("| query |");
    for (m, _) in &modes {
        let _ = write!(md, " {m} qps |");
        if m.as_str() != mode(BASE) {
            let _ = write!(md, " {m} speedup |");
        }
    }
    md.push('\n');
    md.push_str(&"|---".repeat(1 + 2 * modes.len().saturating_sub(1) + 1));
    md.push_str("|\n");
    for target in &r.settings.targets {
        let _ = write!(md, "| {target} |");
        for (m, per_target) in &modes {
            let t = per_target.get(target);
            let _ = write!(
                md,
                " {} |",
                t.map_or("n/a".into(), |t| format!("{:.0}", t.median_tps))
            );
            if m.as_str() != mode(BASE) {
                let _ = write!(
                    md,
                    " {} |",
                    t.map_or("n/a".into(), |t| format!("{:.2}×", t.ratio_to_direct))
                );
            }
        }
        md.push('\n');
    }
    md.push_str("\nReference 000 (TimescaleDB, 1 primary + replicas on separate 8-core VMs):\n\n");
    for (m, _) in &modes {
        if let Some(p) = r.published.get(m.as_str()) {
            let _ = writeln!(md, "- {m}: {p}");
        }
    }
    if let Some(s) = &r.read_scaling {
        md.push_str("\nNodes that served reads:");
        for (m, _) in &modes {
            let n = s.serving_nodes.get(m.as_str()).copied().unwrap_or(0);
            let _ = write!(md, " {m}: {n};");
        }
        let _ = writeln!(
            md,
            " CPU confinement: {}.",
            if s.confined {
                s.confinement.clone()
            } else {
                format!("**none** — {}", s.confinement)
            }
        );
    }
    md
}
