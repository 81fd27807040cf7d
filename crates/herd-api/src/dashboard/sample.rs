//! One point of the dashboard's charts, built from the published status and the `/metrics`
//! counters (pure: the sampler does the I/O), plus the read-pool changes between two samples.

use std::collections::BTreeMap;

use herd_core::{ClusterEvent, ClusterStatus, EventKind, Role};
use serde::Serialize;

use super::prom::Series;

/// Counts of the primary's active client backends by wait event at one instant.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct CommitWaits {
    /// `wait_event_type:wait_event` (or `CPU`) → backends.
    pub by_event: BTreeMap<String, u32>,
}

/// The figures of one second. Rates are per second since the previous point.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct Point {
    /// Milliseconds since the Unix epoch.
    pub t: u64,
    /// Replica → replay lag in bytes (from the supervisor's probe).
    pub lag_bytes: BTreeMap<String, u64>,
    /// Replica → replay lag in seconds (PostgreSQL's `replay_lag`; absent when unknown).
    pub lag_seconds: BTreeMap<String, f64>,
    /// `node reason` → transactions routed per second (`herd_routed_total`).
    pub routed: BTreeMap<String, f64>,
    /// Node → transactions routed per second, all reasons.
    pub node_tps: BTreeMap<String, f64>,
    /// Read-your-writes waits per second.
    pub ryw_waits: f64,
    /// Read-your-writes fallbacks to the primary per second.
    pub ryw_fallbacks: f64,
    /// Node → server connections in use.
    pub pool_in_use: BTreeMap<String, f64>,
    /// Node → idle server connections.
    pub pool_idle: BTreeMap<String, f64>,
    /// Node → clients that waited for a server connection, per second.
    pub pool_waits: BTreeMap<String, f64>,
    /// Replica → member of the read pool.
    pub read_pool: BTreeMap<String, bool>,
    /// The primary's committing backends by wait event, when sampled.
    pub commit_waits: Option<CommitWaits>,
}

/// Cumulative counters of the previous sample, to turn them into rates.
#[derive(Clone, Debug, Default)]
pub struct Counters {
    t: u64,
    values: BTreeMap<String, f64>,
}

/// Builds the point at `t` (Unix ms) and the counters to keep for the next one.
pub fn point(
    t: u64,
    status: &ClusterStatus,
    metrics: &[Series],
    prev: &Counters,
    commit_waits: Option<CommitWaits>,
) -> (Point, Counters) {
    let mut p = Point {
        t,
        commit_waits,
        ..Point::default()
    };
    for node in all_nodes(status).filter(|n| n.role == Role::Replica) {
        if let Some(lag) = &node.lag {
            p.lag_bytes.insert(node.name.to_string(), lag.replay_bytes);
            if let Some(s) = lag.replay_seconds {
                p.lag_seconds.insert(node.name.to_string(), s);
            }
        }
    }
    let mut now = Counters {
        t,
        values: BTreeMap::new(),
    };
    let dt = t.saturating_sub(prev.t) as f64 / 1000.0;
    let mut rate = |key: String, value: f64| -> f64 {
        now.values.insert(key.clone(), value);
        match prev.values.get(&key) {
            // A counter that went down was reset (the supervisor restarted): no rate this time.
            Some(before) if dt > 0.0 && value >= *before => (value - before) / dt,
            _ => 0.0,
        }
    };
    for s in metrics {
        let node = s.label("node").unwrap_or("").to_string();
        match s.name.as_str() {
            "herd_routed_total" => {
                let reason = s.label("reason").unwrap_or("");
                let r = rate(format!("routed {node} {reason}"), s.value);
                *p.routed.entry(format!("{node} {reason}")).or_default() += r;
                *p.node_tps.entry(node).or_default() += r;
            }
            "herd_ryw_waits_total" => p.ryw_waits += rate("ryw_waits".into(), s.value),
            "herd_ryw_fallbacks_total" => p.ryw_fallbacks += rate("ryw_fallbacks".into(), s.value),
            "herd_pool_connections" => {
                let into = match s.label("state") {
                    Some("in_use") => &mut p.pool_in_use,
                    _ => &mut p.pool_idle,
                };
                *into.entry(node).or_default() += s.value;
            }
            "herd_pool_waits_total" => {
                let key = format!(
                    "pool_waits {node} {} {}",
                    s.label("user").unwrap_or(""),
                    s.label("database").unwrap_or("")
                );
                let r = rate(key, s.value);
                *p.pool_waits.entry(node).or_default() += r;
            }
            "herd_replica_in_read_pool" => {
                p.read_pool.insert(node, s.value > 0.5);
            }
            _ => {}
        }
    }
    (p, now)
}

/// Replicas that left or joined the read pool between `before` and `after`, with the figures
/// that explain it (the proxy decides membership from lag and staleness with hysteresis);
/// `status` (as of `after`) says each node's shard group and whether it became the primary.
pub fn read_pool_changes(
    before: &Point,
    after: &Point,
    status: &ClusterStatus,
) -> Vec<ClusterEvent> {
    let mut events = Vec::new();
    // A replica gone from the endpoint's list (the agent engine's endpoint lists streaming
    // replicas only) is out of the pool; one that appears in a pool sampled before (not the
    // first sample, not an empty pool) comes into it.
    let nodes: std::collections::BTreeSet<&String> = before
        .read_pool
        .keys()
        .chain(after.read_pool.keys())
        .collect();
    for node in nodes {
        let was_in = match before.read_pool.get(node) {
            Some(v) => v,
            None if before.read_pool.is_empty() => continue,
            None => &false,
        };
        let now_in = after.read_pool.get(node).unwrap_or(&false);
        if was_in == now_in {
            continue;
        }
        let lag = match after.lag_bytes.get(node) {
            Some(b) => format!("replay lag {b} bytes"),
            None => "replay lag unknown".to_string(),
        };
        let (group, role) = place(status, node);
        let (kind, text, ok) = if *now_in {
            (
                EventKind::JoinedReadPool,
                format!("{node} joins the read pool ({lag})"),
                true,
            )
        } else if role == Some(Role::Primary) {
            (
                EventKind::LeftReadPool,
                format!("{node} leaves the read pool: it is the primary now"),
                true,
            )
        } else {
            (
                EventKind::LeftReadPool,
                format!("{node} leaves the read pool: too far behind or not answering ({lag})"),
                false,
            )
        };
        events.push(ClusterEvent {
            unix_ms: after.t,
            group,
            kind,
            node: Some(node.clone()),
            text,
            ok,
        });
    }
    events
}

/// How long a replica's leaving the read pool is held back, to be explained by a promotion of
/// that replica reported meanwhile (the supervisor reports a switchover when it is done).
pub const LEFT_EXPLAIN_MS: u64 = 3_000;

/// `left` (a replica leaving the read pool) explained by `recent` events: when a switchover or
/// failover to that replica succeeded within a second before or [`LEFT_EXPLAIN_MS`] after, it
/// left because it was being promoted, not because it lagged.
pub fn explain_left(mut left: ClusterEvent, recent: &[ClusterEvent]) -> ClusterEvent {
    let promoted = recent.iter().any(|e| {
        matches!(e.kind, EventKind::Switchover | EventKind::Failover)
            && e.ok
            && e.node == left.node
            && e.unix_ms + 1_000 >= left.unix_ms
            && e.unix_ms <= left.unix_ms + LEFT_EXPLAIN_MS
    });
    if promoted {
        let node = left.node.clone().unwrap_or_default();
        left.text = format!("{node} leaves the read pool: promoted to primary");
        left.ok = true;
    }
    left
}

/// The shard group and role of node `name` (group 0 and no role when not found).
fn place(status: &ClusterStatus, name: &str) -> (u32, Option<Role>) {
    std::iter::once(status)
        .chain(status.groups.iter())
        .find_map(|g| {
            let n = g.nodes.iter().find(|n| n.name.as_str() == name)?;
            Some((g.group, Some(n.role)))
        })
        .unwrap_or((0, None))
}

/// Every node of every shard group.
fn all_nodes(status: &ClusterStatus) -> impl Iterator<Item = &herd_core::NodeStatus> {
    status
        .nodes
        .iter()
        .chain(status.groups.iter().flat_map(|g| g.nodes.iter()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dashboard::prom::parse;

    fn status() -> ClusterStatus {
        serde_json::from_value(serde_json::json!({
            "version": 1, "commit_mode": "on", "sync_standbys": "ANY 1",
            "synchronous_standby_names": null, "endpoint": "postgresql://x", "supervisor": null,
            "nodes": [
                { "name": "node0", "role": "primary", "pid": 1, "port": 1, "state": "running",
                  "current_lsn": "0/3000148", "received_lsn": null, "replayed_lsn": null,
                  "lag": null, "sync_state": null },
                { "name": "node1", "role": "replica", "pid": 2, "port": 2, "state": "streaming",
                  "current_lsn": null, "received_lsn": "0/3000148", "replayed_lsn": "0/3000100",
                  "lag": { "write_bytes": 0, "flush_bytes": 0, "replay_bytes": 72,
                           "write_seconds": 0.0, "flush_seconds": 0.0, "replay_seconds": 0.25 },
                  "sync_state": "quorum" },
                { "name": "node2", "role": "replica", "pid": null, "port": 3, "state": "stopped",
                  "current_lsn": null, "received_lsn": null, "replayed_lsn": null,
                  "lag": { "write_bytes": 9, "flush_bytes": 9, "replay_bytes": 9,
                           "write_seconds": null, "flush_seconds": null, "replay_seconds": null },
                  "sync_state": null }
            ]
        }))
        .expect("status")
    }

    const FIRST: &str = "\
herd_routed_total{node=\"node0\",reason=\"write\"} 10
herd_routed_total{node=\"node1\",reason=\"read\"} 100
herd_ryw_waits_total 4
herd_pool_connections{node=\"node1\",user=\"u\",database=\"d\",state=\"in_use\"} 2
herd_pool_connections{node=\"node1\",user=\"u\",database=\"d\",state=\"idle\"} 3
herd_pool_waits_total{node=\"node1\",user=\"u\",database=\"d\"} 1
herd_replica_in_read_pool{node=\"node1\"} 1
herd_replica_in_read_pool{node=\"node2\"} 1
";
    const SECOND: &str = "\
herd_routed_total{node=\"node0\",reason=\"write\"} 30
herd_routed_total{node=\"node0\",reason=\"not_caught_up\"} 2
herd_routed_total{node=\"node1\",reason=\"read\"} 150
herd_ryw_waits_total 6
herd_ryw_fallbacks_total 2
herd_pool_connections{node=\"node1\",user=\"u\",database=\"d\",state=\"in_use\"} 1
herd_pool_waits_total{node=\"node1\",user=\"u\",database=\"d\"} 5
herd_replica_in_read_pool{node=\"node1\"} 1
herd_replica_in_read_pool{node=\"node2\"} 0
";

    #[test]
    fn lag_comes_from_the_status_and_rates_from_counter_deltas() {
        let s = status();
        let (first, counters) = point(1_000, &s, &parse(FIRST), &Counters::default(), None);
        // No previous sample: no rates yet, but gauges and lag are there.
        assert_eq!(first.node_tps.get("node1"), Some(&0.0));
        assert_eq!(first.lag_bytes.get("node1"), Some(&72));
        assert_eq!(first.lag_bytes.get("node2"), Some(&9));
        assert_eq!(first.lag_seconds.get("node1"), Some(&0.25));
        assert_eq!(first.lag_seconds.get("node2"), None);
        assert!(!first.lag_bytes.contains_key("node0"));
        assert_eq!(first.pool_in_use.get("node1"), Some(&2.0));
        assert_eq!(first.pool_idle.get("node1"), Some(&3.0));

        // Two seconds later.
        let (second, _) = point(3_000, &s, &parse(SECOND), &counters, None);
        let cases: &[(&BTreeMap<String, f64>, &str, f64)] = &[
            (&second.routed, "node0 write", 10.0),
            (&second.routed, "node1 read", 25.0),
            // A series that appears counts from zero next time, not from its whole value.
            (&second.routed, "node0 not_caught_up", 0.0),
            (&second.node_tps, "node0", 10.0),
            (&second.node_tps, "node1", 25.0),
            (&second.pool_waits, "node1", 2.0),
            (&second.pool_in_use, "node1", 1.0),
        ];
        for (map, key, want) in cases {
            assert_eq!(map.get(*key), Some(want), "{key}");
        }
        assert_eq!(second.ryw_waits, 1.0);
        assert_eq!(second.ryw_fallbacks, 0.0);
    }

    #[test]
    fn a_counter_reset_gives_no_negative_rate() {
        let s = status();
        let (_, counters) = point(1_000, &s, &parse(SECOND), &Counters::default(), None);
        let (p, _) = point(2_000, &s, &parse(FIRST), &counters, None);
        assert_eq!(p.routed.get("node0 write"), Some(&0.0));
        assert_eq!(p.ryw_waits, 0.0);
    }

    #[test]
    fn read_pool_changes_become_events() {
        let s = status();
        let (a, c) = point(1_000, &s, &parse(FIRST), &Counters::default(), None);
        let (b, _) = point(2_000, &s, &parse(SECOND), &c, None);
        let events = read_pool_changes(&a, &b, &s);
        assert_eq!(events.len(), 1, "{events:?}");
        assert_eq!(events[0].kind, EventKind::LeftReadPool);
        assert_eq!(events[0].node.as_deref(), Some("node2"));
        assert!(events[0].text.contains("9 bytes"), "{}", events[0].text);
        assert!(!events[0].ok);
        let back = read_pool_changes(&b, &a, &s);
        assert_eq!(back[0].kind, EventKind::JoinedReadPool);
        assert!(back[0].ok);
        // Unchanged membership, or a replica seen for the first time: nothing.
        assert!(read_pool_changes(&a, &a, &s).is_empty());
        assert!(read_pool_changes(&Point::default(), &a, &s).is_empty());
        // A replica gone from the endpoint's list left the pool; listed again, it joined.
        let mut gone = a.clone();
        gone.read_pool.remove("node1");
        let left = read_pool_changes(&a, &gone, &s);
        assert_eq!(left.len(), 1, "{left:?}");
        assert_eq!(left[0].kind, EventKind::LeftReadPool);
        assert_eq!(left[0].node.as_deref(), Some("node1"));
        assert!(!left[0].ok);
        let joined = read_pool_changes(&gone, &a, &s);
        assert_eq!(joined.len(), 1, "{joined:?}");
        assert_eq!(joined[0].kind, EventKind::JoinedReadPool);
        assert!(joined[0].ok);

        // A replica promoted meanwhile leaves the pool because it is the primary; a node of
        // another shard group is reported with its group.
        let mut promoted = s.clone();
        promoted.nodes[2].role = Role::Primary;
        let mut other = s.clone();
        other.group = 2;
        // Explained afterwards by a promotion of that replica.
        let left = read_pool_changes(&a, &b, &s).remove(0);
        let event = |kind, node: &str, unix_ms, ok| ClusterEvent {
            unix_ms,
            group: 0,
            kind,
            node: Some(node.into()),
            text: String::new(),
            ok,
        };
        // (events reported around it, explained as a promotion)
        let cases = [
            (vec![], false),
            (
                vec![event(EventKind::Switchover, "node2", 3_500, true)],
                true,
            ),
            (vec![event(EventKind::Failover, "node2", 2_000, true)], true),
            (
                vec![event(EventKind::Switchover, "node2", 3_500, false)],
                false,
            ),
            (
                vec![event(EventKind::Switchover, "node1", 3_500, true)],
                false,
            ),
            (
                vec![event(EventKind::Switchover, "node2", 9_000, true)],
                false,
            ),
            (vec![event(EventKind::Restart, "node2", 2_500, true)], false),
        ];
        for (recent, promoted) in cases {
            let e = explain_left(left.clone(), &recent);
            assert_eq!(e.text.contains("promoted"), promoted, "{recent:?}");
            assert_eq!(e.ok, promoted);
        }
        let events = read_pool_changes(&a, &b, &promoted);
        assert!(events[0].text.contains("primary now"), "{}", events[0].text);
        assert!(events[0].ok);
        let mut elsewhere = s.clone();
        elsewhere.nodes.retain(|n| n.name.as_str() != "node2");
        elsewhere.groups.push(other);
        assert_eq!(read_pool_changes(&a, &b, &elsewhere)[0].group, 2);
    }
}
