//! The status document (`herd_core::ClusterStatus`, the one `herd status --json`, `/status`
//! and the dashboard use) built from what the agents publish in the store: one [`Store`] per
//! shard group, group 0 first. Pure, so every mapping is a table row.
//!
//! A replica's lag in seconds and live `sync_state` come from the primary's walsenders, which
//! its record carries (`pg_stat_replication` of the primary's last round); a replica without a
//! walsender there has its lag in bytes only, and the recorded sync set (who must confirm) as
//! its synchronous standing. What a member record does not carry is left out rather than
//! guessed: no postmaster pid.

use herd_core::{
    ClusterStatus, LagInfo, NodeName, NodeState, NodeStatus, Role, SyncMethod, SyncState,
    STATUS_VERSION,
};

use crate::decide::Store;
use crate::member::Member;
use herd_pg::ReplicationRow;

/// One group's status from its store; `endpoint` is the proxy's URL (no password).
pub fn group_status(group: u32, store: &Store, endpoint: &str) -> ClusterStatus {
    let leader = store
        .leader
        .as_deref()
        .and_then(|l| store.members.iter().find(|m| m.name == l));
    let primary = leader.filter(|m| m.role == "primary");
    let leader_lsn = primary.and_then(|m| m.lsn);
    let walsenders = primary.map_or(&[][..], |m| &m.walsenders[..]);
    let mut nodes: Vec<NodeStatus> = store
        .members
        .iter()
        .map(|m| node(m, store, leader_lsn, walsenders))
        .collect();
    // Primary first, then by name: the order every status reader expects.
    nodes.sort_by(|a, b| {
        (a.role != Role::Primary, a.name.as_str()).cmp(&(b.role != Role::Primary, b.name.as_str()))
    });
    ClusterStatus {
        version: STATUS_VERSION,
        commit_mode: store.settings.commit_mode,
        sync_standbys: store.settings.sync_standbys,
        synchronous_standby_names: None,
        endpoint: endpoint.to_string(),
        supervisor: None,
        nodes,
        ha_note: store.handover.as_ref().map(|h| {
            format!(
                "{} asked of {}{}",
                if h.immediate {
                    "a failover"
                } else {
                    "a switchover"
                },
                h.from,
                h.to.as_deref()
                    .map(|t| format!(" for {t}"))
                    .unwrap_or_default()
            )
        }),
        group,
        groups: Vec::new(),
        copies: Vec::new(),
        // What the primary's agent read of its archiver (backups on across hosts).
        archiving: leader
            .filter(|m| m.role == "primary")
            .and_then(|m| m.archiving.clone()),
    }
}

/// The whole cluster: group 0's fields at the top, the others in `groups`.
pub fn cluster_status(groups: &[Store], endpoint: &str) -> ClusterStatus {
    let mut all = groups
        .iter()
        .enumerate()
        .map(|(g, s)| group_status(g as u32, s, endpoint));
    let mut top = all
        .next()
        .unwrap_or_else(|| group_status(0, &empty_store(), endpoint));
    top.groups = all.collect();
    top
}

fn empty_store() -> Store {
    Store {
        initialized: false,
        leader: None,
        members: Vec::new(),
        sync_set: Vec::new(),
        last_sync: Vec::new(),
        last_leader: None,
        settings: Default::default(),
        handover: None,
        restarts: Vec::new(),
    }
}

fn node(
    m: &Member,
    store: &Store,
    leader_lsn: Option<herd_core::Lsn>,
    walsenders: &[ReplicationRow],
) -> NodeStatus {
    let leads = store.leader.as_deref() == Some(m.name.as_str());
    let (role, state) = match (leads, m.role.as_str()) {
        (true, "primary") => (Role::Primary, NodeState::Running),
        // The lease holder before its promotion finished, or a writable node without the
        // lease (it fences itself): neither is the primary yet.
        (true, _) | (false, "primary") => (Role::Replica, NodeState::WrongRole),
        (false, "replica") if m.streaming_from.is_some() => (Role::Replica, NodeState::Streaming),
        (false, "replica") => (Role::Replica, NodeState::Disconnected),
        (false, "stopped") => (Role::Replica, NodeState::Stopped),
        (false, _) => (Role::Replica, NodeState::Starting),
    };
    let replica = role == Role::Replica;
    let row = walsenders
        .iter()
        .find(|w| replica && w.application_name == m.name);
    let lag = match (replica, leader_lsn, m.lsn, m.replayed) {
        (true, Some(head), received, replayed) if row.is_some() => {
            Some(herd_cluster::replica_lag(head, row, received, replayed))
        }
        (true, Some(head), Some(received), replayed) => Some(LagInfo {
            write_bytes: head.bytes_after(received),
            flush_bytes: head.bytes_after(received),
            replay_bytes: head.bytes_after(replayed.unwrap_or(received)),
            write_seconds: None,
            flush_seconds: None,
            replay_seconds: None,
        }),
        _ => None,
    };
    let live = row.and_then(|r| r.sync_state);
    let sync_state = replica.then(|| {
        if let Some(live) = live {
            live
        } else if !store.sync_set.contains(&m.name) {
            SyncState::Async
        } else if store.settings.sync_standbys.method == SyncMethod::Any {
            SyncState::Quorum
        } else if store.last_sync.contains(&m.name) {
            SyncState::Sync
        } else {
            SyncState::Potential
        }
    });
    NodeStatus {
        name: NodeName::from_text(&m.name),
        role,
        pid: None,
        port: m.pg_port,
        state,
        current_lsn: (!replica).then_some(m.lsn).flatten(),
        received_lsn: replica.then_some(m.lsn).flatten(),
        replayed_lsn: replica.then_some(m.replayed).flatten(),
        lag,
        sync_state,
    }
}

/// `herd status --dcs`'s lines about the members' server certificates at `now` (Unix
/// seconds): none when no member serves TLS; else one line of days left, then a warning for
/// each certificate within [`herd_certs::RENEW_BEFORE_DAYS`] of its end or past it, naming the
/// command that renews it.
pub fn certificate_lines(members: &[Member], now: i64) -> Vec<String> {
    if members.iter().all(|m| m.tls_not_after.is_none()) {
        return Vec::new();
    }
    let days = |t: i64| (t - now).div_euclid(86_400);
    let summary: Vec<String> = members
        .iter()
        .map(|m| {
            let line = match m.tls_not_after {
                Some(t) if t <= now => format!("{} EXPIRED", m.name),
                Some(t) => format!("{} {} days", m.name, days(t)),
                None => format!("{} no TLS", m.name),
            };
            // The issuer tells members on the old CA from those on the next during a rotation.
            match &m.tls_issuer {
                Some(ca) => format!("{line} (CA {ca})"),
                None => line,
            }
        })
        .collect();
    let mut lines = vec![format!("server certificates: {}", summary.join(", "))];
    for m in members {
        let Some(t) = m.tls_not_after else { continue };
        let when = if t <= now {
            format!("expired {} days ago", (now - t).div_euclid(86_400))
        } else if days(t) < herd_certs::RENEW_BEFORE_DAYS {
            format!("ends in {} days", days(t))
        } else {
            continue;
        };
        lines.push(format!(
            "WARNING: {}'s server certificate (tls/{}.crt) {when}: restart its agent where \
             secrets/ca.key is (it renews it), or `herd certs issue {} --host {} --out \
             DATA/tls` and restart it",
            m.name, m.name, m.name, m.pg_host
        ));
    }
    lines
}

#[cfg(test)]
mod tests {
    use super::*;
    use herd_core::Lsn;

    fn m(name: &str, role: &str, lsn: u64, streaming: bool) -> Member {
        Member {
            name: name.into(),
            instance: "i".into(),
            role: role.into(),
            pg_host: "10.0.0.1".into(),
            pg_port: 5432,
            api: String::new(),
            lsn: Some(Lsn(lsn)),
            replayed: (role == "replica").then_some(Lsn(lsn.saturating_sub(10))),
            streaming_from: streaming.then(|| "a".to_string()),
            socket: None,
            tls_not_after: None,
            tls_issuer: None,
            tls_trusts: Vec::new(),
            archiving: None,
            secrets_rotation: None,
            walsenders: Vec::new(),
        }
    }

    fn store(leader: &str, members: Vec<Member>, sync: &[&str]) -> Store {
        Store {
            leader: Some(leader.into()),
            members,
            sync_set: sync.iter().map(|s| s.to_string()).collect(),
            ..empty_store()
        }
    }

    #[test]
    fn members_map_to_roles_states_lag_and_sync_standing() {
        let s = store(
            "a",
            vec![
                m("c", "stopped", 0, false),
                m("b", "replica", 900, true),
                m("a", "primary", 1000, false),
                m("d", "replica", 500, false),
            ],
            &["b"],
        );
        let st = group_status(1, &s, "postgresql://x");
        let names: Vec<&str> = st.nodes.iter().map(|n| n.name.as_str()).collect();
        assert_eq!(names, ["a", "b", "c", "d"], "primary first, then by name");
        let a = &st.nodes[0];
        assert_eq!((a.role, a.state), (Role::Primary, NodeState::Running));
        assert_eq!(a.current_lsn, Some(Lsn(1000)));
        assert!(a.lag.is_none() && a.sync_state.is_none());
        let b = &st.nodes[1];
        assert_eq!((b.role, b.state), (Role::Replica, NodeState::Streaming));
        let lag = b.lag.as_ref().expect("lag");
        assert_eq!((lag.write_bytes, lag.replay_bytes), (100, 110));
        assert_eq!(
            b.sync_state,
            Some(SyncState::Quorum),
            "ANY k: a quorum member"
        );
        assert_eq!(st.nodes[2].state, NodeState::Stopped);
        assert_eq!(st.nodes[3].state, NodeState::Disconnected);
        assert_eq!(st.nodes[3].sync_state, Some(SyncState::Async));
        assert_eq!(st.group, 1);
        assert_eq!(st.primary().map(|p| p.name.as_str()), Some("a"));
    }

    #[test]
    fn the_primarys_walsenders_give_lag_in_seconds_and_live_sync_state() {
        let w = |name: &str, replay: u64, lag: Option<f64>, sync: SyncState| ReplicationRow {
            application_name: name.into(),
            state: "streaming".into(),
            write_lsn: Some(Lsn(replay)),
            flush_lsn: Some(Lsn(replay)),
            replay_lsn: Some(Lsn(replay)),
            write_lag: lag,
            flush_lag: lag,
            replay_lag: lag,
            sync_state: Some(sync),
        };
        let mut primary = m("a", "primary", 1000, false);
        primary.walsenders = vec![
            // Behind, measured: its seconds.
            w("b", 900, Some(0.25), SyncState::Sync),
            // Caught up, PostgreSQL's lag cleared: 0 s.
            w("c", 1000, None, SyncState::Async),
        ];
        let s = store(
            "a",
            vec![
                primary,
                m("b", "replica", 900, true),
                m("c", "replica", 1000, true),
                // No walsender for d: bytes only, the recorded standing.
                m("d", "replica", 500, false),
            ],
            &["b", "c"],
        );
        let st = group_status(0, &s, "");
        let lag = |i: usize| st.nodes[i].lag.clone().expect("lag");
        assert_eq!(st.nodes[1].name.as_str(), "b");
        assert_eq!(
            (lag(1).replay_bytes, lag(1).replay_seconds),
            (100, Some(0.25))
        );
        assert_eq!(
            st.nodes[1].sync_state,
            Some(SyncState::Sync),
            "live, not the recorded quorum"
        );
        assert_eq!((lag(2).replay_bytes, lag(2).replay_seconds), (0, Some(0.0)));
        assert_eq!(st.nodes[2].sync_state, Some(SyncState::Async));
        assert_eq!((lag(3).replay_bytes, lag(3).replay_seconds), (510, None));
        assert_eq!(st.nodes[3].sync_state, Some(SyncState::Async));
        // A primary's record without walsenders (an older agent): as before.
        let old = store(
            "a",
            vec![m("a", "primary", 1000, false), m("b", "replica", 900, true)],
            &["b"],
        );
        let st = group_status(0, &old, "");
        assert_eq!(
            st.nodes[1].lag.as_ref().and_then(|l| l.replay_seconds),
            None
        );
        assert_eq!(st.nodes[1].sync_state, Some(SyncState::Quorum));
    }

    #[test]
    fn a_lease_holder_not_yet_promoted_is_no_primary() {
        let s = store(
            "b",
            vec![m("a", "primary", 10, false), m("b", "replica", 10, true)],
            &[],
        );
        let st = group_status(0, &s, "");
        assert!(st.primary().is_none(), "{:?}", st.nodes);
        assert!(st
            .nodes
            .iter()
            .all(|n| n.role == Role::Replica && n.state != NodeState::Running));
    }

    #[test]
    fn groups_nest_under_group_zero() {
        let g0 = store("a", vec![m("a", "primary", 1, false)], &[]);
        let g1 = store("x", vec![m("x", "primary", 1, false)], &[]);
        let st = cluster_status(&[g0, g1], "e");
        assert_eq!(st.group, 0);
        assert_eq!(st.groups.len(), 1);
        assert_eq!(st.groups[0].group, 1);
        assert_eq!(st.groups[0].nodes[0].name.as_str(), "x");
        assert!(cluster_status(&[], "e").nodes.is_empty());
    }

    #[test]
    fn certificate_lines_show_days_left_and_warn_before_the_end() {
        let day = 86_400;
        let now = 1_000 * day;
        let with = |name: &str, end: Option<i64>| Member {
            tls_not_after: end,
            tls_issuer: None,
            tls_trusts: Vec::new(),
            archiving: None,
            walsenders: Vec::new(),
            ..m(name, "replica", 10, true)
        };
        assert!(
            certificate_lines(&[with("a", None)], now).is_empty(),
            "no TLS, no line"
        );
        let lines = certificate_lines(
            &[
                with("a", Some(now + 364 * day + 5)),
                with("b", Some(now + 12 * day + 5)),
                with("c", Some(now - 3 * day - 5)),
                with("d", None),
            ],
            now,
        );
        assert_eq!(
            lines[0],
            "server certificates: a 364 days, b 12 days, c EXPIRED, d no TLS"
        );
        assert_eq!(lines.len(), 3, "{lines:?}");
        assert!(lines[1].starts_with("WARNING: b's server certificate (tls/b.crt) ends in 12 days"));
        assert!(lines[2].contains("c's server certificate (tls/c.crt) expired 3 days ago"));
        assert!(lines[2].contains("`herd certs issue c --host 10.0.0.1 --out DATA/tls`"));
    }
}
