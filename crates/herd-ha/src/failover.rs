//! Which replica may become primary without losing an acknowledged commit.

use herd_core::{CommitMode, Lsn, NodeName, SyncMethod, SyncStandbys};

/// A replica as seen after the primary was lost.
#[derive(Clone, Debug, PartialEq)]
pub struct Candidate {
    /// The node.
    pub name: NodeName,
    /// Answered its last probe, in recovery.
    pub reachable: bool,
    /// WAL received and flushed to its disk (`pg_last_wal_receive_lsn()`).
    pub flushed: Option<Lsn>,
}

/// What failover needs to know besides the replicas.
#[derive(Clone, Debug, PartialEq)]
pub struct FailoverRules {
    /// The cluster's commit mode.
    pub mode: CommitMode,
    /// `ANY k` or `FIRST k`.
    pub sync: SyncStandbys,
    /// The standbys recorded in `synchronous_standby_names` (recorded before every change of it).
    pub sync_set: Vec<NodeName>,
    /// FIRST k: the standbys the primary last reported as `sync`.
    pub last_sync: Vec<NodeName>,
    /// Async: the primary's last known WAL position.
    pub primary_lsn: Lsn,
    /// Async: how far behind the chosen replica may be.
    pub max_lag_bytes: u64,
    /// The operator accepts losing acknowledged commits.
    pub allow_data_loss: bool,
}

/// Chooses the replica to promote, or says why none is safe.
///
/// * `ANY k` over a recorded set of n standbys: an acknowledged commit is on ≥ k of them, so
///   among any n − k + 1 members at least one has it; the member with the highest flushed
///   position among ≥ n − k + 1 reachable members has every acknowledged commit.
/// * `FIRST k`: the standbys the primary reported as synchronous have every acknowledged commit.
/// * async: the most advanced reachable replica, if within `max_lag_bytes` of the primary's
///   last known position.
pub fn choose_candidate(replicas: &[Candidate], rules: &FailoverRules) -> Result<NodeName, String> {
    let reachable: Vec<&Candidate> = replicas
        .iter()
        .filter(|c| c.reachable && c.flushed.is_some())
        .collect();
    let best = |among: &[&Candidate]| -> Option<NodeName> {
        among
            .iter()
            .max_by(|a, b| a.flushed.cmp(&b.flushed).then(b.name.cmp(&a.name)))
            .map(|c| c.name.clone())
    };
    if reachable.is_empty() {
        return Err("no replica is reachable".into());
    }
    if rules.allow_data_loss {
        return best(&reachable).ok_or_else(|| "no replica is reachable".into());
    }
    if rules.mode == CommitMode::Async {
        let Some(name) = best(&reachable) else {
            return Err("no replica is reachable".into());
        };
        let flushed = reachable
            .iter()
            .find(|c| c.name == name)
            .and_then(|c| c.flushed)
            .unwrap_or_default();
        let lag = rules.primary_lsn.bytes_after(flushed);
        return if lag <= rules.max_lag_bytes {
            Ok(name)
        } else {
            Err(format!(
                "the most advanced replica ({name}) is {lag} bytes behind the lost primary, more than max_lag_on_failover ({}); \
                 promote it anyway with `herd failover --allow-data-loss`",
                rules.max_lag_bytes
            ))
        };
    }
    match rules.sync.method {
        SyncMethod::Any => {
            let n = rules.sync_set.len();
            let k = rules.sync.count as usize;
            let members: Vec<&Candidate> = reachable
                .iter()
                .copied()
                .filter(|c| rules.sync_set.contains(&c.name))
                .collect();
            let needed = (n + 1).saturating_sub(k).max(1);
            if members.len() < needed {
                return Err(format!(
                    "only {} of the {n} recorded sync standbys are reachable; ANY {k} needs {needed} to prove which one holds every acknowledged commit",
                    members.len()
                ));
            }
            best(&members).ok_or_else(|| "no sync standby is reachable".into())
        }
        SyncMethod::First => {
            let members: Vec<&Candidate> = reachable
                .iter()
                .copied()
                .filter(|c| rules.last_sync.contains(&c.name))
                .collect();
            best(&members).ok_or_else(|| {
                "none of the standbys the primary last reported as synchronous is reachable"
                    .to_string()
            })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn c(i: usize, reachable: bool, lsn: u64) -> Candidate {
        Candidate {
            name: NodeName::numbered(i),
            reachable,
            flushed: Some(Lsn(lsn)),
        }
    }

    fn rules(mode: CommitMode, sync: &str, set: &[usize]) -> FailoverRules {
        FailoverRules {
            mode,
            sync: sync.parse().expect("sync"),
            sync_set: set.iter().map(|&i| NodeName::numbered(i)).collect(),
            last_sync: vec![NodeName::numbered(2)],
            primary_lsn: Lsn(1000),
            max_lag_bytes: 100,
            allow_data_loss: false,
        }
    }

    #[test]
    fn candidate_table() {
        let n = |i| Ok(NodeName::numbered(i));
        let on = CommitMode::On;
        // ANY 1 over {1,2}: both reachable needed (n-k+1 = 2); the most advanced wins.
        assert_eq!(
            choose_candidate(
                &[c(1, true, 500), c(2, true, 600)],
                &rules(on, "ANY 1", &[1, 2])
            ),
            n(2)
        );
        assert!(choose_candidate(
            &[c(1, true, 500), c(2, false, 600)],
            &rules(on, "ANY 1", &[1, 2])
        )
        .is_err());
        // ANY 2 over {1,2}: one reachable member suffices (every ack is on both).
        assert_eq!(
            choose_candidate(
                &[c(1, true, 500), c(2, false, 0)],
                &rules(on, "ANY 2", &[1, 2])
            ),
            n(1)
        );
        // ANY 1 over {1,2,3}: 3 needed.
        assert!(choose_candidate(
            &[c(1, true, 5), c(2, true, 6), c(3, false, 7)],
            &rules(on, "ANY 1", &[1, 2, 3])
        )
        .is_err());
        // A non-member does not count towards the proof, nor is it chosen.
        assert_eq!(
            choose_candidate(&[c(1, true, 5), c(3, true, 900)], &rules(on, "ANY 1", &[1])),
            n(1)
        );
        // FIRST 1: the last reported sync standby (node2) if reachable.
        assert_eq!(
            choose_candidate(
                &[c(1, true, 900), c(2, true, 600)],
                &rules(on, "FIRST 1", &[1, 2])
            ),
            n(2)
        );
        assert!(choose_candidate(
            &[c(1, true, 900), c(2, false, 600)],
            &rules(on, "FIRST 1", &[1, 2])
        )
        .is_err());
        // Async: the most advanced, within the lag bound.
        let a = CommitMode::Async;
        assert_eq!(
            choose_candidate(
                &[c(1, true, 950), c(2, true, 920)],
                &rules(a, "ANY 1", &[1, 2])
            ),
            n(1)
        );
        assert!(choose_candidate(&[c(1, true, 850)], &rules(a, "ANY 1", &[1, 2])).is_err());
        // The operator may accept data loss.
        let mut loose = rules(a, "ANY 1", &[1, 2]);
        loose.allow_data_loss = true;
        assert_eq!(choose_candidate(&[c(1, true, 850)], &loose), n(1));
        // Nobody reachable.
        assert!(choose_candidate(&[c(1, false, 1)], &rules(on, "ANY 1", &[1])).is_err());
        // Ties go to the lowest name.
        assert_eq!(
            choose_candidate(
                &[c(2, true, 5), c(1, true, 5)],
                &rules(on, "ANY 2", &[1, 2])
            ),
            n(1)
        );
    }
}
