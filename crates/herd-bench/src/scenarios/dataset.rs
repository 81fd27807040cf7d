//! The time-series data set of reference 000, shared by `commit-modes` and `read-scaling`:
//! devices (`host_0`, `host_1`, …) reporting ten CPU metrics every 10 s into one `cpu` table,
//! indexed on time, hostname and one metric (`usage_user`, the article's `cpu_usage`).

use crate::cluster::ScratchCluster;
use crate::BenchError;

/// Epoch second where inserted rows start; preloaded rows lie before it, one every 10 s.
pub(super) const T0: u64 = 1_700_000_000;
/// The ten metric columns, in table order.
pub(super) const METRICS: &str = "usage_user usage_system usage_idle usage_nice usage_iowait \
                                  usage_irq usage_softirq usage_steal usage_guest \
                                  usage_guest_nice";

/// `random() * 100` once per metric column: the values of one row's metrics.
pub(super) fn random_metrics() -> String {
    vec!["random() * 100"; METRICS.split_whitespace().count()].join(", ")
}

/// Creates and fills the `cpu` table on the primary: `devices` hosts with `points` readings
/// each, at `T0 - 10 s × 1..=points` (indexes after the load), then analyses and checkpoints.
pub(super) fn load(herd: &ScratchCluster, devices: u32, points: u32) -> Result<(), BenchError> {
    let cols: Vec<String> = METRICS
        .split_whitespace()
        .map(|m| format!("{m} double precision"))
        .collect();
    let create = format!(
        "create table cpu (time timestamptz not null, hostname text not null, {})",
        cols.join(", ")
    );
    let fill = format!(
        "insert into cpu select to_timestamp({T0} - s * 10), 'host_' || d, {} \
         from generate_series(1, {}) s, generate_series(0, {}) d",
        random_metrics(),
        points,
        devices.max(1) - 1
    );
    let sql = [
        create.as_str(),
        &fill,
        "create index on cpu (time)",
        "create index on cpu (hostname)",
        "create index on cpu (usage_user)",
        "vacuum analyze cpu",
        "checkpoint",
    ];
    herd.psql(&herd.primary_url, &sql).map(drop)
}
