//! The 10 Hz replication lag sampler of `herd bench lag`: one connection to the replica and one
//! to the primary, each tick reading the replica's replay position, then the primary's current
//! position and PostgreSQL's own `replay_lag`.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use crate::BenchError;

/// Sampling period (10 Hz).
pub const PERIOD: Duration = Duration::from_millis(100);
/// A sample whose queries take longer than this is skipped (the servers are saturated).
const QUERY_TIMEOUT: Duration = Duration::from_secs(2);

/// One tick of the sampler.
#[derive(Clone, Debug, PartialEq)]
pub struct Sample {
    /// Seconds since the sampler started (when the primary answered).
    pub t_s: f64,
    /// Bytes of WAL the primary had written that the replica had not replayed.
    pub bytes: u64,
    /// How long ago the primary was at the replica's replay position, in milliseconds: the
    /// primary positions of the earlier ticks, linearly interpolated (0 when caught up).
    pub time_ms: f64,
    /// `pg_stat_replication.replay_lag` on the primary, in milliseconds (`None` when PostgreSQL
    /// reports NULL: nothing left to replay and no recent reply).
    pub replay_lag_ms: Option<f64>,
    /// Whether Herd's proxy had the replica in its read pool (`None` when not asked).
    pub in_pool: Option<bool>,
}

/// What a sampling run produced.
#[derive(Debug, Default)]
pub struct Sampled {
    /// Every successful tick, in order.
    pub samples: Vec<Sample>,
    /// Ticks skipped because a query failed or took longer than two seconds.
    pub skipped: u32,
    /// Seconds the sampler ran.
    pub elapsed_s: f64,
    /// WAL the primary wrote per second between the first and the last sample.
    pub wal_bytes_per_s: f64,
}

/// Samples every [`PERIOD`] until `stop` is set; `in_pool` (when given) tells whether the
/// replica is in Herd's read pool at that moment.
pub fn sample_until(
    primary_url: &str,
    replica_url: &str,
    stop: &AtomicBool,
    in_pool: Option<&(dyn Fn() -> Option<bool> + Sync)>,
) -> Result<Sampled, BenchError> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| BenchError::io("starting a runtime for", "tokio", e))?;
    rt.block_on(sample_loop(primary_url, replica_url, stop, in_pool))
}

async fn sample_loop(
    primary_url: &str,
    replica_url: &str,
    stop: &AtomicBool,
    in_pool: Option<&(dyn Fn() -> Option<bool> + Sync)>,
) -> Result<Sampled, BenchError> {
    let replica = connect(replica_url, "the replica").await?;
    let primary = connect(primary_url, "the primary").await?;
    // Positions as bigint byte offsets: LSNs stay far below 2^63 in a scratch cluster.
    let replay_sql = "select pg_wal_lsn_diff(pg_last_wal_replay_lsn(), '0/0')::bigint";
    let primary_sql = "select pg_wal_lsn_diff(pg_current_wal_lsn(), '0/0')::bigint, \
                       (select (extract(epoch from replay_lag) * 1000)::float8 \
                        from pg_stat_replication order by replay_lsn limit 1)";
    let replay_stmt = replica
        .prepare(replay_sql)
        .await
        .map_err(|e| sql_error(replay_sql, e))?;
    let primary_stmt = primary
        .prepare(primary_sql)
        .await
        .map_err(|e| sql_error(primary_sql, e))?;

    let started = Instant::now();
    let mut out = Sampled::default();
    let mut history = History::default();
    let mut ticker = tokio::time::interval(PERIOD);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    while !stop.load(Ordering::Relaxed) {
        ticker.tick().await;
        // The replica first: the primary's position read after it can only be further on, so
        // the byte lag is never negative (it includes the WAL written between the two reads).
        let replay = tokio::time::timeout(QUERY_TIMEOUT, replica.query_one(&replay_stmt, &[]));
        let Ok(Ok(row)) = replay.await else {
            out.skipped += 1;
            continue;
        };
        let replayed: i64 = row.get(0);
        let current = tokio::time::timeout(QUERY_TIMEOUT, primary.query_one(&primary_stmt, &[]));
        let Ok(Ok(row)) = current.await else {
            out.skipped += 1;
            continue;
        };
        let t_s = started.elapsed().as_secs_f64();
        let written: i64 = row.get(0);
        let replay_lag_ms: Option<f64> = row.get(1);
        history.push(t_s, written);
        out.samples.push(Sample {
            t_s,
            bytes: written.saturating_sub(replayed).max(0) as u64,
            time_ms: history.lag_s(replayed, t_s) * 1000.0,
            replay_lag_ms,
            in_pool: in_pool.and_then(|f| f()),
        });
    }
    out.elapsed_s = started.elapsed().as_secs_f64();
    out.wal_bytes_per_s = history.rate();
    Ok(out)
}

async fn connect(url: &str, what: &str) -> Result<tokio_postgres::Client, BenchError> {
    let (client, conn) = tokio_postgres::connect(url, tokio_postgres::NoTls)
        .await
        .map_err(|e| sql_error(&format!("connecting the lag sampler to {what}"), e))?;
    tokio::spawn(conn);
    Ok(client)
}

fn sql_error(what: &str, e: tokio_postgres::Error) -> BenchError {
    BenchError::Failed {
        what: what.into(),
        status: "SQL error".into(),
        output: e.to_string(),
    }
}

/// The primary's positions at earlier ticks, to turn a replay position into a time lag.
#[derive(Debug, Default)]
pub struct History {
    /// (seconds, position), positions non-decreasing.
    points: Vec<(f64, i64)>,
}

impl History {
    /// Records the primary's position `lsn` at `t_s`.
    pub fn push(&mut self, t_s: f64, lsn: i64) {
        self.points.push((t_s, lsn));
    }

    /// WAL bytes per second between the first and the last position (0 with fewer than two).
    pub fn rate(&self) -> f64 {
        match (self.points.first(), self.points.last()) {
            (Some(&(t0, l0)), Some(&(t1, l1))) if t1 > t0 => (l1 - l0) as f64 / (t1 - t0),
            _ => 0.0,
        }
    }

    /// Seconds between `now_s` and the moment the primary reached `replayed`, interpolating
    /// linearly between the two ticks around it (WAL assumed written at a steady rate between
    /// ticks); 0 when the replica has everything of the latest tick; the age of the first tick
    /// (a lower bound) when it is older than every tick.
    pub fn lag_s(&self, replayed: i64, now_s: f64) -> f64 {
        let Some(&(_, newest)) = self.points.last() else {
            return 0.0;
        };
        if replayed >= newest {
            return 0.0;
        }
        // The first tick at which the primary was beyond the replay position.
        let after = self.points.partition_point(|&(_, lsn)| lsn <= replayed);
        let Some(before) = after.checked_sub(1) else {
            return (now_s - self.points[0].0).max(0.0);
        };
        let (t0, l0) = self.points[before];
        let (t1, l1) = self.points[after];
        let reached = t0 + (t1 - t0) * (replayed - l0) as f64 / (l1 - l0) as f64;
        (now_s - reached).max(0.0)
    }
}

/// The nearest-rank percentile `p` (0–100] of `values`; 0 when empty.
pub fn percentile(values: &[f64], p: f64) -> f64 {
    let mut v = values.to_vec();
    v.sort_by(f64::total_cmp);
    if v.is_empty() {
        return 0.0;
    }
    let rank = ((v.len() as f64 * p / 100.0).ceil() as usize).clamp(1, v.len());
    v[rank - 1]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn time_lag_is_interpolated_between_ticks() {
        let mut h = History::default();
        assert_eq!(h.lag_s(0, 1.0), 0.0);
        h.push(0.0, 1000);
        h.push(0.1, 2000);
        h.push(0.2, 3000);
        // Caught up with the latest tick.
        assert_eq!(h.lag_s(3000, 0.2), 0.0);
        // Halfway between the ticks at 0.1 s and 0.2 s: reached at 0.15 s.
        assert!((h.lag_s(2500, 0.2) - 0.05).abs() < 1e-9);
        // Exactly at a tick.
        assert!((h.lag_s(2000, 0.2) - 0.1).abs() < 1e-9);
        // Older than every tick: the age of the first one, a lower bound.
        assert!((h.lag_s(500, 0.2) - 0.2).abs() < 1e-9);
        assert!((h.rate() - 10_000.0).abs() < 1e-6);
    }

    #[test]
    fn idle_primary_has_no_time_lag() {
        let mut h = History::default();
        h.push(0.0, 1000);
        h.push(0.1, 1000);
        h.push(0.2, 1000);
        assert_eq!(h.lag_s(1000, 0.2), 0.0);
    }

    #[test]
    fn percentiles_are_nearest_rank() {
        assert_eq!(percentile(&[], 50.0), 0.0);
        let v: Vec<f64> = (1..=100).map(f64::from).collect();
        assert_eq!(percentile(&v, 50.0), 50.0);
        assert_eq!(percentile(&v, 95.0), 95.0);
        assert_eq!(percentile(&v, 100.0), 100.0);
        assert_eq!(percentile(&[3.0, 1.0, 2.0], 50.0), 2.0);
    }
}
