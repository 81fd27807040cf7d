//! `herd bench sharding`'s workloads across shard groups (Sharding II): an aggregate and an
//! ordered `LIMIT 100` read that run on every group and are merged by Herd, and a transfer mix
//! — pgbench's TPC-B-like debit and credit of two accounts in one transaction — with a given
//! share of transfers whose two accounts live on different groups (those commit with two-phase
//! commit). They run on one server and on Herd with 1, 2 and 4 groups, not on the postgres_fdw
//! baseline (reference 003 measures point selects there).

use std::fmt::Write as _;
use std::path::Path;

use crate::cluster::ScratchCluster;
use crate::process::write_script;
use crate::BenchError;

/// The workloads before these (reference 003's), which every target runs.
pub(super) const FIRST: usize = 3;
/// The aggregate across groups.
pub(super) const AGGREGATE: &str = "aggregate across groups (1,000 rows), simple";
/// The ordered read across groups.
pub(super) const ORDERED: &str = "ORDER BY … LIMIT 100 across groups, simple";
/// Shares of transfers across groups, in percent.
pub(super) const CROSS_SHARES: [u32; 3] = [0, 10, 50];

/// The report row of transfers with `pct` % across groups.
pub(super) fn transfer_name(pct: u32) -> String {
    format!("transfer, {pct} % across groups, simple")
}

/// The workloads: report name, pgbench protocol, script (`rows` accounts).
pub(super) fn workloads(rows: u32) -> Vec<(String, &'static str, String)> {
    let mut w = vec![
        (
            AGGREGATE.to_string(),
            "simple",
            format!(
                "\\set a random(1, {})\nselect bid, count(*), sum(abalance) from accounts \
                 where aid between :a and :a + 999 group by bid;\n",
                rows.saturating_sub(1000).max(1)
            ),
        ),
        (
            ORDERED.to_string(),
            "simple",
            format!(
                "\\set a random(1, {})\nselect aid, abalance from accounts where aid > :a \
                 order by aid limit 100;\n",
                rows.saturating_sub(100).max(1)
            ),
        ),
    ];
    for pct in CROSS_SHARES {
        // The partner comes from `partners` (same group, or another); the two accounts are
        // updated in key order so that transfers never wait on each other in a cycle (a
        // deadlock across groups is not one PostgreSQL detects).
        w.push((
            transfer_name(pct),
            "simple",
            format!(
                "\\set a1 random(1, {rows})\n\\set d random(1, 1000)\n\\set r random(1, 100)\n\
                 begin;\n\
                 select case when :r <= {pct} then cross_aid else same_aid end as a2 \
                 from partners where aid = :a1 \\gset\n\
                 \\set lo least(:a1, :a2)\n\\set hi greatest(:a1, :a2)\n\
                 \\set dlo case when :a1 = :lo then -:d else :d end\n\
                 update accounts set abalance = abalance + :dlo where aid = :lo;\n\
                 update accounts set abalance = abalance - :dlo where aid = :hi;\n\
                 end;\n"
            ),
        ));
    }
    w
}

/// Builds and loads `partners (aid, same_aid, cross_aid)` for a cluster whose group primaries
/// are `nodes` (group order): for every account, another account on its own group and one on
/// the next group (with one group, one half the table away). Read from where the rows are, so
/// the bench does not repeat Herd's placement rule. Loaded through `endpoint` (distributed by
/// `aid` with several groups, so that it lives beside `accounts`).
pub(super) fn load_partners(
    cluster: &ScratchCluster,
    nodes: &[String],
    endpoint: &str,
    dir: &Path,
) -> Result<(), BenchError> {
    let mut held: Vec<Vec<u32>> = Vec::new();
    for url in nodes {
        let text = cluster.psql(
            url,
            &["select coalesce(string_agg(aid::text, ',' order by aid), '') from accounts"],
        )?;
        held.push(
            text.trim()
                .split(',')
                .filter_map(|a| a.parse().ok())
                .collect(),
        );
    }
    let csv = partners_csv(&held);
    let file = write_script(dir, &format!("partners-{}.csv", nodes.len()), &csv)?;
    let mut sql = vec![
        "create table partners (aid int primary key, same_aid int, cross_aid int)".to_string(),
    ];
    if nodes.len() > 1 {
        sql.push("select herd.create_distributed_table('partners', 'aid')".into());
    }
    sql.push(format!(
        "\\copy partners from '{}' with (format csv)",
        file.display()
    ));
    let refs: Vec<&str> = sql.iter().map(String::as_str).collect();
    cluster.psql(endpoint, &refs).map(drop)
}

/// The partners of every account, as CSV, from the accounts each group holds.
fn partners_csv(held: &[Vec<u32>]) -> String {
    let mut out = String::new();
    let n = held.len();
    for (g, ids) in held.iter().enumerate() {
        let other = &held[(g + 1) % n];
        for (i, aid) in ids.iter().enumerate() {
            let same = ids[(i + 1) % ids.len()];
            let cross = if n == 1 {
                ids[(i + ids.len() / 2) % ids.len()]
            } else if other.is_empty() {
                same
            } else {
                other[i % other.len()]
            };
            let _ = writeln!(out, "{aid},{same},{cross}");
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn partners_stay_or_cross() {
        let csv = partners_csv(&[vec![1, 4, 5], vec![2, 3]]);
        assert_eq!(csv, "1,4,2\n4,5,3\n5,1,2\n2,3,1\n3,2,4\n");
        let one = partners_csv(&[vec![1, 2, 3, 4]]);
        assert_eq!(one, "1,2,3\n2,3,4\n3,4,1\n4,1,2\n");
    }

    #[test]
    fn transfers_lock_in_key_order() {
        let w = workloads(1000);
        assert_eq!(w.len(), 2 + CROSS_SHARES.len());
        let (name, _, script) = &w[3];
        assert_eq!(name, &transfer_name(10));
        assert!(script.contains("when :r <= 10 then cross_aid"), "{script}");
        assert!(script.contains("where aid = :lo;\nupdate"), "{script}");
    }
}
