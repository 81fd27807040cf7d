//! What the proxy knows about the nodes: addresses from the supervisor, positions and lag from
//! its own ≤ 100 ms poll. Snapshots are immutable and shared (`Arc`), replaced whole each poll.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use herd_core::Lsn;
pub use herd_core::{Assignment, Endpoint};

/// One replica as last observed.
#[derive(Clone, Debug, PartialEq)]
pub struct ReplicaView {
    /// Where it is.
    pub endpoint: Endpoint,
    /// Answered the last poll, in recovery.
    pub healthy: bool,
    /// `pg_last_wal_replay_lsn()` at the last poll.
    pub replay_lsn: Lsn,
    /// Primary's position minus `replay_lsn`.
    pub lag_bytes: u64,
    /// Upper bound on how old its data is; `None` when unknown.
    pub staleness: Option<Duration>,
    /// Member of the read pool (lag-aware, with hysteresis).
    pub in_read_pool: bool,
}

/// A snapshot of the whole cluster for routing.
#[derive(Clone, Debug, PartialEq, Default)]
pub struct TopologyView {
    /// The primary, only when it answered the last poll and is not in recovery.
    pub primary: Option<Endpoint>,
    /// The primary's `pg_current_wal_lsn()` at the last poll.
    pub primary_lsn: Lsn,
    /// Every replica.
    pub replicas: Vec<ReplicaView>,
    /// Replicas that hold every acknowledged commit ([`Assignment::durable_replicas`]).
    pub durable_replicas: u32,
    /// No member was ever assigned the primary role: a `herd proxy` started before its agents
    /// elected a leader. Logins are refused at once then (there is nobody to wait for yet),
    /// where a primary that is merely down is waited for.
    pub electing: bool,
    /// The last poll could not reach a node over TLS (its certificate did not verify, it does
    /// not serve TLS): the reason, naming the node, told to clients that find no server.
    pub tls_error: Option<String>,
}

impl TopologyView {
    /// The WAL position a failover cannot lose: replayed on as many replicas as hold every
    /// acknowledged commit (at least one), unanswering replicas counting as holding nothing.
    /// `None` without replicas: no failover can happen, everything the primary has is safe.
    pub fn durable_lsn(&self) -> Option<Lsn> {
        if self.replicas.is_empty() {
            return None;
        }
        let mut replayed: Vec<Lsn> = self
            .replicas
            .iter()
            .map(|r| if r.healthy { r.replay_lsn } else { Lsn(0) })
            .collect();
        replayed.sort_unstable_by(|a, b| b.cmp(a));
        let k = (self.durable_replicas.max(1) as usize).min(replayed.len());
        Some(replayed[k - 1])
    }
}

/// Recent primary positions, to bound a replica's staleness in time: a replica that replayed up
/// to LSN `x` holds everything the primary had written at any moment its position was ≤ `x`.
#[derive(Debug, Default)]
pub struct LsnHistory {
    samples: VecDeque<(Instant, Lsn)>,
}

/// How long positions are remembered.
const HISTORY: Duration = Duration::from_secs(30);

impl LsnHistory {
    /// Records the primary's position at `at`.
    pub fn record(&mut self, at: Instant, lsn: Lsn) {
        self.samples.push_back((at, lsn));
        while self
            .samples
            .front()
            .is_some_and(|(t, _)| at.duration_since(*t) > HISTORY)
        {
            self.samples.pop_front();
        }
    }

    /// Upper bound on the age of a replica that replayed up to `replayed`, as of `now`: zero when
    /// it has everything the primary had at the latest sample, `None` when older than the history.
    pub fn staleness(&self, replayed: Lsn, now: Instant) -> Option<Duration> {
        let (_, newest) = self.samples.back()?;
        if replayed >= *newest {
            return Some(Duration::ZERO);
        }
        // The latest moment the primary was not ahead of the replica: the replica's data is at
        // least that fresh. Everything written after it may be missing.
        self.samples
            .iter()
            .rev()
            .find(|(_, lsn)| *lsn <= replayed)
            .map(|(t, _)| now.saturating_duration_since(*t))
    }
}

/// Limits of the lag-aware read pool.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct LagLimits {
    /// Replay lag in bytes above which a replica leaves the pool.
    pub max_bytes: u64,
    /// Staleness above which a replica leaves the pool.
    pub max_staleness: Duration,
    /// It returns once below this fraction of both limits.
    pub readmit_fraction: f64,
}

/// Read-pool membership with hysteresis: leave above the limits, return only below the lower
/// marks, so a replica is not flapping in and out while replay catches up.
pub fn next_membership(
    in_pool: bool,
    lag_bytes: u64,
    staleness: Option<Duration>,
    limits: &LagLimits,
) -> bool {
    let staleness = staleness.unwrap_or(Duration::MAX);
    if in_pool {
        lag_bytes <= limits.max_bytes && staleness <= limits.max_staleness
    } else {
        let low_bytes = (limits.max_bytes as f64 * limits.readmit_fraction) as u64;
        let low_time = limits.max_staleness.mul_f64(limits.readmit_fraction);
        lag_bytes <= low_bytes && staleness <= low_time
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durable_lsn_is_the_kth_replay_position() {
        let replica = |n: usize, healthy: bool, at: u64| ReplicaView {
            endpoint: Endpoint {
                name: herd_core::NodeName::numbered(n),
                host: "h".into(),
                port: n as u16,
                socket: None,
            },
            healthy,
            replay_lsn: Lsn(at),
            lag_bytes: 0,
            staleness: None,
            in_read_pool: healthy,
        };
        let view = |k: u32, replicas: Vec<ReplicaView>| TopologyView {
            primary: None,
            primary_lsn: Lsn(500),
            replicas,
            electing: false,
            durable_replicas: k,
            tls_error: None,
        };
        assert_eq!(
            view(1, vec![]).durable_lsn(),
            None,
            "no replica: nothing to wait for"
        );
        let three = || {
            vec![
                replica(1, true, 300),
                replica(2, true, 100),
                replica(3, true, 200),
            ]
        };
        assert_eq!(view(1, three()).durable_lsn(), Some(Lsn(300)));
        assert_eq!(
            view(0, three()).durable_lsn(),
            Some(Lsn(300)),
            "async: the most advanced"
        );
        assert_eq!(view(2, three()).durable_lsn(), Some(Lsn(200)));
        assert_eq!(
            view(5, three()).durable_lsn(),
            Some(Lsn(100)),
            "k beyond the replicas: all"
        );
        let down = vec![replica(1, false, 900), replica(2, true, 100)];
        assert_eq!(
            view(1, down).durable_lsn(),
            Some(Lsn(100)),
            "a silent replica holds nothing"
        );
    }

    #[test]
    fn staleness_from_history() {
        let t0 = Instant::now();
        let mut h = LsnHistory::default();
        assert_eq!(h.staleness(Lsn(0), t0), None);
        h.record(t0, Lsn(100));
        h.record(t0 + Duration::from_millis(100), Lsn(200));
        h.record(t0 + Duration::from_millis(200), Lsn(300));
        let now = t0 + Duration::from_millis(250);
        assert_eq!(h.staleness(Lsn(300), now), Some(Duration::ZERO));
        assert_eq!(h.staleness(Lsn(250), now), Some(Duration::from_millis(150)));
        assert_eq!(h.staleness(Lsn(100), now), Some(Duration::from_millis(250)));
        assert_eq!(
            h.staleness(Lsn(50), now),
            None,
            "older than anything remembered"
        );
    }

    #[test]
    fn membership_has_hysteresis() {
        let limits = LagLimits {
            max_bytes: 1000,
            max_staleness: Duration::from_secs(1),
            readmit_fraction: 0.5,
        };
        let ms = |m| Some(Duration::from_millis(m));
        let table = [
            (true, 0, ms(0), true),
            (true, 1000, ms(1000), true),
            (true, 1001, ms(0), false),
            (true, 0, ms(1001), false),
            (true, 0, None, false),
            (false, 800, ms(0), false),
            (false, 500, ms(600), false),
            (false, 500, ms(500), true),
            (false, 0, ms(0), true),
        ];
        for (in_pool, bytes, stale, want) in table {
            assert_eq!(
                next_membership(in_pool, bytes, stale, &limits),
                want,
                "{in_pool} {bytes} {stale:?}"
            );
        }
    }
}
