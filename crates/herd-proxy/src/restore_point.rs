//! A restore point on every shard group's primary, consistent with two-phase commits: taken
//! while the [`CommitGate`](crate::commit_gate::CommitGate) is closed, so that restoring every
//! group to it shows each cross-group transaction committed everywhere or nowhere (prepared
//! parts without a decision are rolled back by the restored cluster's resolver).

use std::time::Duration;

use crate::monitor::admin_connect;
use crate::ProxyContext;

/// How long each group's `pg_create_restore_point` may take while the gate is closed (it
/// writes one WAL record; a server that does not answer within this must not hold every
/// cross-group commit for long).
const PER_GROUP: Duration = Duration::from_secs(5);
/// How long connecting to a group's primary may take (before the gate is closed).
const CONNECT: Duration = Duration::from_secs(10);

/// One group's part of a restore point.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GroupPoint {
    /// The shard group.
    pub group: u32,
    /// The WAL position of its record, as PostgreSQL prints it.
    pub lsn: String,
    /// When it was written, in microseconds since the Unix epoch (the server's clock).
    pub time: i64,
}

/// What [`ProxyContext::restore_point`] did: the groups whose record was written (all of them
/// unless `error`), so that the caller records even a partial point and its name is never used
/// again (a restore would stop at the first of two records of one name).
#[derive(Debug, Default)]
pub struct PointOutcome {
    /// The groups written, group 0 first.
    pub written: Vec<GroupPoint>,
    /// Why the point is not complete.
    pub error: Option<String>,
    /// How long second phases of two-phase commits were held (the gate closed).
    pub held: Duration,
}

impl ProxyContext {
    /// Writes the restore point `name` on every group's primary while no second phase of a
    /// two-phase commit runs (waiting at most `wait` for those under way, then refusing with
    /// nothing written), then switches each group's WAL so the points are archived at once.
    pub async fn restore_point(&self, name: &str, wait: Duration) -> PointOutcome {
        let mut outcome = PointOutcome::default();
        // Connected before the gate closes: the hold lasts only the points themselves.
        let mut clients = Vec::new();
        for g in 0..self.groups() {
            let primary = match self.current_primary_of(g).await {
                Ok(p) => p,
                Err(e) => {
                    outcome.error = Some(format!("shard group {g}: {e}; no point was written"));
                    return outcome;
                }
            };
            match admin_connect(&primary, &self.admin, CONNECT).await {
                Some(c) => clients.push(c),
                None => {
                    outcome.error = Some(format!(
                        "cannot connect to shard group {g}'s primary {}; no point was written",
                        primary.name
                    ));
                    return outcome;
                }
            }
        }
        let closed = match self.commits.close(wait).await {
            Ok(c) => c,
            Err(e) => {
                outcome.error = Some(e.to_string());
                self.count_point(&outcome);
                return outcome;
            }
        };
        let held_since = std::time::Instant::now();
        let sql = "select pg_create_restore_point($1)::text, \
                   (extract(epoch from clock_timestamp()) * 1000000)::int8";
        for (g, client) in clients.iter().enumerate() {
            let row = match tokio::time::timeout(PER_GROUP, client.query_one(sql, &[&name])).await {
                Ok(Ok(row)) => row,
                Ok(Err(e)) => {
                    outcome.error = Some(format!("shard group {g}: {e}"));
                    break;
                }
                Err(_) => {
                    outcome.error = Some(format!(
                        "shard group {g}'s primary did not write the point within {} s",
                        PER_GROUP.as_secs()
                    ));
                    break;
                }
            };
            match (row.try_get::<_, String>(0), row.try_get::<_, i64>(1)) {
                (Ok(lsn), Ok(time)) => outcome.written.push(GroupPoint {
                    group: g as u32,
                    lsn,
                    time,
                }),
                (Err(e), _) | (_, Err(e)) => {
                    outcome.error = Some(format!("shard group {g}: reading the point: {e}"));
                    break;
                }
            }
        }
        drop(closed);
        outcome.held = held_since.elapsed();
        self.count_point(&outcome);
        if outcome.error.is_none() {
            for (g, client) in clients.iter().enumerate() {
                // Archived now rather than at the next archive_timeout; the point is written
                // either way, so a failure here only delays its archiving.
                if let Err(e) = client.batch_execute("select pg_switch_wal()").await {
                    tracing::warn!(group = g, "switching WAL after a restore point: {e}");
                }
            }
        }
        outcome
    }

    /// Counts a restore point in `/metrics` by outcome: taken, refused (nothing written) or
    /// partial (written on some groups only).
    fn count_point(&self, outcome: &PointOutcome) {
        let label = match (&outcome.error, outcome.written.is_empty()) {
            (None, _) => "outcome=\"taken\"",
            (Some(_), true) => "outcome=\"refused\"",
            (Some(_), false) => "outcome=\"partial\"",
        };
        self.metrics.inc("herd_restore_points_total", label);
    }
}
