//! `herd bench sharding`'s report: the table laid out like reference 003's (tps per target,
//! against one server and against Herd with 1 group), the article's figures beside it, the
//! targets of the issue, and the server connections per node.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use super::sharding::{herd_target, Plan, FDW, ONE_SERVER};
use super::sharding_mix::transfer_name;
use crate::report::Results;

/// Reference 003's select-only figures (pgbench -S, its own hardware).
pub(super) fn published() -> BTreeMap<String, String> {
    [(
        "point select, simple".to_string(),
        "one server 78,586 tps; partitioning + postgres_fdw on 2 nodes 42,907 (0.55×); Citus \
         65,626 (0.84×); the authors' multiplexing transport 88,589 on 2 nodes (1.13×)"
            .to_string(),
    )]
    .into()
}

/// The notes: method, confinement and connections.
pub(super) fn explain(
    plan: &Plan,
    confinement: Option<String>,
    front_cpus: f64,
    connections: &BTreeMap<String, BTreeMap<String, u64>>,
    throttled: &BTreeMap<String, f64>,
) -> Vec<String> {
    let mut notes = Vec::new();
    notes.push(match confinement {
        Some(c) => format!(
            "Every node's postmaster and its processes ran in a group of its own capped at {c}, \
             like a separate small machine; Herd's supervisors (each with its proxy), pgbench \
             and this harness shared one more group capped at {front_cpus:.1} CPU."
        ),
        None => "Nodes were not confined (see above): ratios are not scaling figures.".into(),
    });
    notes.push(format!(
        "Data: accounts ({} rows, pgbench_accounts' shape, key aid) and events ({} customers × \
         200 rows, key cid), loaded through each Herd endpoint with COPY (split by key over the \
         groups) and, for the FDW baseline, by each node into its own partition. Shard groups \
         have no replicas: each group's primary is one node. The FDW baseline runs in its own \
         database on the 2-group cluster's two servers: on each, the table is partitioned by \
         hash of the key into 2 partitions, its own local and the other a postgres_fdw foreign \
         table on the other server; half the clients connect to each server.",
        plan.rows, plan.customers
    ));
    if !throttled.is_empty() {
        let shares: Vec<String> = throttled
            .iter()
            .map(|(g, v)| format!("{g} {:.0} %", v * 100.0))
            .collect();
        notes.push(format!(
            "Share of quota periods in which each group was throttled over all measured runs \
             (a node's group is busy only while its target runs; the front group while any \
             does — near 100 % there would mean the harness, not the nodes, set the pace): {}.",
            shares.join(", ")
        ));
    }
    let conns: Vec<String> = connections
        .iter()
        .map(|(target, nodes)| {
            let per: Vec<String> = nodes.iter().map(|(n, c)| format!("{n} {c}")).collect();
            format!("{target}: {}", per.join(", "))
        })
        .collect();
    notes.push(format!(
        "Server connections per node (client backends counted halfway through each run, the \
         most seen): {}. pgbench opens 16 client connections in every case; through Herd each \
         group's node serves them from its pool (at most `proxy.pool_size`, plus Herd's own \
         monitoring sessions), while with postgres_fdw every client backend also opens a \
         connection to the other node.",
        conns.join("; ")
    ));
    notes.push(
        "Across groups (not run on the FDW baseline): an aggregate (`select bid, count(*), \
         sum(abalance) … where aid between :a and :a + 999 group by bid`) and an ordered read \
         (`… where aid > :a order by aid limit 100`), which Herd runs on every group and merges \
         or combines; and transfers — one transaction reading a partner account from \
         `partners`, then debiting one account and crediting the other (in key order) — where \
         the partner is on another group in 0, 10 or 50 % of transfers (read from where the rows \
         are; with one group or one server every transfer stays on it). A transfer across groups \
         commits with two-phase commit."
            .into(),
    );
    notes.push(
        "pgbench, Herd's proxies and the servers share this machine's 2 cores and whatever else \
         runs on it (see the load average): a node's CPU quota, not a machine, is the unit \
         scaled here."
            .into(),
    );
    notes
}

/// One row per workload: tps of every target, Herd's ratios against 1 group and one server,
/// the FDW baseline's ratio against one server.
pub(crate) fn table(r: &Results) -> String {
    let targets = &r.settings.targets;
    let mut md = String::from("| workload |");
    for t in targets {
        let _ = write!(md, " {t} tps |");
    }
    md.push_str(" vs 1 server | vs Herd 1 group | Herd 2 groups vs FDW |\n");
    md.push_str(&"|---".repeat(targets.len() + 4));
    md.push_str("|\n");
    for (mode, per) in crate::report::ordered_modes(r) {
        let tps = |t: &str| per.get(t).map(|x| x.median_tps);
        let _ = write!(md, "| {mode} |");
        for t in targets {
            let _ = write!(
                md,
                " {} |",
                tps(t).map_or("n/a".into(), |v| format!("{v:.0}"))
            );
        }
        let ratios = |base: Option<f64>, skip: &str| -> String {
            targets
                .iter()
                .filter(|t| t.as_str() != skip && t.as_str() != ONE_SERVER)
                .filter(|t| skip == ONE_SERVER || t.as_str() != FDW)
                .filter_map(|t| {
                    let b = base.filter(|b| *b > 0.0)?;
                    Some(format!("{t} {:.2}×", tps(t)? / b))
                })
                .collect::<Vec<_>>()
                .join(", ")
        };
        let one_group = herd_target(1);
        let vs_fdw = match (tps(&herd_target(2)), tps(FDW)) {
            (Some(h), Some(f)) if f > 0.0 => format!("{:.2}×", h / f),
            _ => "n/a".into(),
        };
        let _ = writeln!(
            md,
            " {} | {} | {vs_fdw} |",
            ratios(tps(ONE_SERVER), ONE_SERVER),
            ratios(tps(&one_group), &one_group)
        );
    }
    md.push_str("\nReference 003 (`A New Approach to Sharding for Distributed PostgreSQL`):\n\n");
    for (m, p) in &r.published {
        let _ = writeln!(md, "- {m}: {p}");
    }
    md.push_str(
        "\nTargets on this machine: Herd 2 groups ≥ 1.8× Herd 1 group on point selects, ≥ 3× the \
         FDW baseline on 2 nodes; Herd 4 groups ≥ 3.4× Herd 1 group; with 10 % of transfers \
         across groups, Herd 2 groups ≥ 1.5× Herd 1 group.\n",
    );
    let transfer = |pct: u32, t: &str| {
        r.modes
            .get(&transfer_name(pct))
            .and_then(|m| m.get(t))
            .map(|x| x.median_tps)
            .filter(|v| *v > 0.0)
    };
    let (one, two) = (herd_target(1), herd_target(2));
    if let (Some(h2), Some(h1)) = (transfer(10, &two), transfer(10, &one)) {
        let _ = writeln!(
            md,
            "\nWith 10 % of transfers across groups, {two} ran {:.2}× {one}.",
            h2 / h1
        );
    }
    if let (Some(cross), Some(local)) = (transfer(50, &two), transfer(0, &two)) {
        let _ = writeln!(
            md,
            "Two-phase commit's cost on {two}: transfers with 50 % across groups ran at {:.2}× \
             the rate of transfers within one group.",
            cross / local
        );
    }
    md
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::{ModeResult, Settings, TargetResult};

    #[test]
    fn table_has_both_ratios() {
        let t = TargetResult::single;
        let mut point = ModeResult::new();
        point.insert(ONE_SERVER.into(), t(1000.0));
        point.insert("Herd 1 group".into(), t(800.0));
        point.insert("Herd 2 groups".into(), t(1600.0));
        point.insert(FDW.into(), t(400.0));
        let r = Results {
            scenario: "sharding".into(),
            settings: Settings {
                modes: vec!["point select, simple".into()],
                targets: vec![
                    ONE_SERVER.into(),
                    "Herd 1 group".into(),
                    "Herd 2 groups".into(),
                    FDW.into(),
                ],
                ..Default::default()
            },
            modes: [("point select, simple".to_string(), point)].into(),
            published: published(),
            ..Default::default()
        };
        let md = table(&r);
        assert!(
            md.contains("| point select, simple | 1000 | 800 | 1600 | 400 |"),
            "{md}"
        );
        assert!(md.contains("Herd 2 groups 1.60×"), "{md}");
        assert!(md.contains("Herd 2 groups 2.00×"), "{md}");
        assert!(md.contains("FDW 2 nodes 0.40×"), "{md}");
        assert!(md.contains("| 4.00× |"), "{md}");
        assert!(md.contains("78,586"), "{md}");
    }
}
