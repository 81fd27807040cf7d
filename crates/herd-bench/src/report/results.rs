//! What a scenario measured, as written to `results.json` (its shape: the `report` module's docs).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::{BandwidthRow, Machine};

/// Everything a scenario measured, as written to `results.json`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Results {
    /// The scenario's name, e.g. "proxy".
    pub scenario: String,
    /// When the run finished, UTC, ISO 8601.
    pub date: String,
    /// Whether `--quick` was given (figures not meaningful).
    pub quick: bool,
    /// The machine the run shared with every process involved.
    pub machine: Machine,
    /// How the workload was run.
    pub settings: Settings,
    /// Mode (e.g. "simple") → target (e.g. "herd") → figures.
    pub modes: BTreeMap<String, ModeResult>,
    /// Mode → reference figures published elsewhere, shown beside ours.
    pub published: BTreeMap<String, String>,
    /// Anything a reader must know (skipped targets, caveats).
    pub notes: Vec<String>,
    /// `herd bench failover` only: commit mode → figures (empty, and absent from the JSON, in
    /// other scenarios).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub failover: BTreeMap<String, FailoverResult>,
    /// `herd bench lag` only: phase → replication lag figures (empty, and absent from the JSON,
    /// in other scenarios). The phases' tps are rows of `modes` (targets `writer`, `reader`).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub lag: BTreeMap<String, LagResult>,
    /// `herd bench bandwidth` only: one row per workload and `wal_compression` setting (empty,
    /// and absent from the JSON, in other scenarios).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub bandwidth: Vec<BandwidthRow>,
    /// `herd bench bandwidth` only: the bytes of logical copies made with `herd copy` (whole
    /// table, a row filter, a column list) beside the physical stream's.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub copy_bandwidth: Vec<crate::scenarios::bandwidth_copies::CopyBandwidthRow>,
    /// `herd bench read-scaling` only: how the nodes were confined and which served the reads
    /// (absent from the JSON in other scenarios).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub read_scaling: Option<ReadScaling>,
    /// `herd bench sharding` only: target → node → most client backends seen on the node
    /// during a run (absent from the JSON in other scenarios).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub connections: BTreeMap<String, BTreeMap<String, u64>>,
    /// `herd bench proxy` only: mode → target → what the proxy process cost (absent from the
    /// JSON in other scenarios).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub process_costs: BTreeMap<String, BTreeMap<String, ProcessCost>>,
    /// `herd bench proxy` only: the proxy's speed targets checked against the run (absent from
    /// the JSON in other scenarios).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub targets: Option<crate::scenarios::proxy_targets::Targets>,
    /// `herd bench shard-move` only: the moves and the writes' waits (absent from the JSON in
    /// other scenarios).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shard_move: Option<crate::scenarios::shard_move::ShardMoveResult>,
    /// `herd bench backup` only: the copies' speeds and the primary's rate during backups
    /// (absent from the JSON in other scenarios).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backup: Option<crate::scenarios::backup::BackupResult>,
}

/// What a proxy's process cost per transaction over a mode's runs (from `/proc`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ProcessCost {
    /// CPU time (user + system, all threads) per transaction, microseconds.
    pub cpu_us_per_txn: f64,
    /// Of which in user space, microseconds: the proxy's own code (parsing, routing, pooling,
    /// its event loop); the rest is the kernel working for it (system calls, the network
    /// stack), which every proxy pays about alike for the same messages.
    #[serde(default)]
    pub user_us_per_txn: f64,
    /// Context switches (all threads) per transaction: wake-ups, mostly.
    pub switches_per_txn: f64,
    /// Resident memory halfway through the last run, MiB.
    pub rss_mib: f64,
    /// CPU time of the load generator (pgbench, user + system) per transaction through this
    /// proxy, microseconds, its logins included: on a small machine it shares the cores with
    /// the proxy and the servers, so where it grows (many clients) the rate falls with it.
    #[serde(default)]
    pub pgbench_cpu_us_per_txn: f64,
    /// CPU time the whole machine spent busy per transaction over the same runs (`/proc/stat`,
    /// all cores), microseconds: load generator, proxy and servers together.
    #[serde(default)]
    pub machine_cpu_us_per_txn: f64,
}

/// What `herd bench read-scaling` reports besides qps: each node's CPU confinement and where
/// the proxy sent the reads.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ReadScaling {
    /// Whether every node's PostgreSQL ran under a CPU quota.
    pub confined: bool,
    /// How the nodes were confined (interface, quota, period), or why they were not.
    pub confinement: String,
    /// CPUs each node's PostgreSQL could use (0 when unconfined).
    pub cpu_per_node: f64,
    /// Mode (e.g. "3 nodes") → node → statements Herd's proxy routed to it during the measured
    /// runs (every reason: reads, and anything it sent to the primary).
    pub routed: BTreeMap<String, BTreeMap<String, u64>>,
    /// Mode → nodes that received at least 5 % of that mode's statements: the nodes that
    /// actually served reads.
    pub serving_nodes: BTreeMap<String, u32>,
    /// Mode → node → share of the CPU quota's periods in which the node was throttled during
    /// the measured runs (empty when unconfined).
    pub throttled_share: BTreeMap<String, BTreeMap<String, f64>>,
}

/// The replication lag of one phase of `herd bench lag`, sampled at 10 Hz.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct LagResult {
    /// What ran in the phase.
    pub description: String,
    /// Where the select-only clients read: "none", "replica" (directly) or "herd" (through the
    /// proxy's read pool).
    pub reader: String,
    /// Samples taken.
    pub samples: u32,
    /// Samples per second achieved (10 planned).
    pub sample_hz: f64,
    /// Ticks skipped because a query failed or took longer than 2 s.
    pub skipped_samples: u32,
    /// WAL the primary wrote per second during the phase (replay's work).
    #[serde(default)]
    pub wal_bytes_per_s: f64,
    /// WAL bytes written by the primary and not yet replayed by the replica.
    pub bytes: Percentiles,
    /// Milliseconds since the primary was at the replica's replay position (from the sampled
    /// primary positions, interpolated).
    pub time_ms: Percentiles,
    /// PostgreSQL's `pg_stat_replication.replay_lag`, milliseconds, over its non-NULL samples.
    pub replay_lag_ms: Percentiles,
    /// The proxy's read-pool limits in this phase, e.g. "16 MiB / 1000 ms" (None: no proxy).
    #[serde(default)]
    pub read_pool_limits: Option<String>,
    /// Reads the proxy sent to the replica during the phase (None: no proxy).
    #[serde(default)]
    pub reads_to_replica: Option<u64>,
    /// Reads the proxy sent to the primary during the phase (None: no proxy).
    #[serde(default)]
    pub reads_to_primary: Option<u64>,
    /// Times the replica was seen leaving the read pool (observed at 10 Hz; None: no proxy).
    #[serde(default)]
    pub pool_exits: Option<u32>,
    /// Share of the samples with the replica in the read pool (None: no proxy).
    #[serde(default)]
    pub in_pool_share: Option<f64>,
    /// Every sample as [seconds, bytes, time lag ms], for charts.
    pub series: Vec<[f64; 3]>,
}

/// p50, p95 (nearest rank) and maximum of one quantity.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Percentiles {
    /// Median.
    pub p50: f64,
    /// 95th percentile.
    pub p95: f64,
    /// Largest value.
    pub max: f64,
}

/// The figures of `herd bench failover` for one commit mode.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct FailoverResult {
    /// Failovers measured.
    pub iterations: u32,
    /// RTO of every iteration in order, seconds: from the kill to the acknowledgement of the
    /// first write sent after it.
    pub rto_s: Vec<f64>,
    /// Median of `rto_s`.
    pub rto_p50_s: f64,
    /// 95th percentile of `rto_s` (nearest rank).
    pub rto_p95_s: f64,
    /// Largest of `rto_s`.
    pub rto_max_s: f64,
    /// Seconds from each kill until a primary ran and every replica streamed again.
    pub full_strength_s: Vec<f64>,
    /// The primary after each failover.
    pub new_primaries: Vec<String>,
    /// Per iteration: writes sent after the kill and acknowledged by the killed primary (its
    /// orphaned backends) before the failover.
    #[serde(default)]
    pub acked_by_killed_primary: Vec<u64>,
    /// Writes acknowledged to the writer, over all iterations.
    pub acked: u64,
    /// Acknowledged writes missing from the new primary, over all iterations.
    pub lost: u64,
    /// Writes that failed (errors and timeouts, not acknowledged), over all iterations.
    pub failed_writes: u64,
    /// `--hosts`: per partition, how long after the cut the isolated primary was last seen
    /// accepting writes (probed from inside its host), seconds.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub writable_window_s: Vec<f64>,
    /// `--hosts`: probe instants at which two nodes accepted writes.
    #[serde(default)]
    pub two_writable: u64,
    /// `--hosts 3 --shards 2`: per iteration, the other group's writes while the killed
    /// host's group was without a primary.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub other_group: Vec<OtherGroup>,
    /// What this mode must reach, e.g. "RTO p50 ≤ 3 s, 0 lost".
    pub target: String,
    /// Whether `target` was reached.
    pub target_met: bool,
}

/// The writes of the group that kept its primary while another group failed over.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct OtherGroup {
    /// Its acknowledged writes per second before the fault.
    pub before_wps: f64,
    /// Its acknowledged writes per second from the fault to the failed group's first
    /// acknowledged write.
    pub during_wps: f64,
    /// `during_wps / before_wps`.
    pub ratio: f64,
    /// The longest time between two of its acknowledgements in that window (or from the
    /// fault to the first), seconds.
    pub longest_pause_s: f64,
}

/// Target name → figures, for one mode.
pub type ModeResult = BTreeMap<String, TargetResult>;

/// The figures of one target in one mode.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TargetResult {
    /// tps of every run, in the order run.
    pub runs: Vec<f64>,
    /// Median of `runs`.
    pub median_tps: f64,
    /// `median_tps` divided by the baseline target's median.
    pub ratio_to_direct: f64,
    /// Failed transactions summed over the runs.
    pub failed_transactions: u64,
}

#[cfg(test)]
impl TargetResult {
    /// One run of `tps`, no baseline, no failures: a fixture for the report's tests.
    pub(crate) fn single(tps: f64) -> TargetResult {
        TargetResult {
            runs: vec![tps],
            median_tps: tps,
            ratio_to_direct: 0.0,
            failed_transactions: 0,
        }
    }
}

/// How a scenario's workload was run.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Settings {
    /// The measured command, with placeholders.
    pub command: String,
    /// Runs per target and mode.
    pub rounds: u32,
    /// Seconds per run.
    pub duration_s: u64,
    /// pgbench scale factor.
    pub scale: u32,
    /// Modes in table order.
    pub modes: Vec<String>,
    /// Targets in table order; the first is the baseline of the ratios.
    pub targets: Vec<String>,
    /// Program → version.
    pub versions: BTreeMap<String, String>,
}
