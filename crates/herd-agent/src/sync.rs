//! The primary's synchronous standby set over the members present in the store: grown in the
//! store before `synchronous_standby_names`, shrunk in the store only once the remaining
//! standbys hold everything acknowledged under the larger set. A failover's quorum proof
//! reads the recorded set, so it always covers every standby that may hold an acknowledged
//! commit.

use herd_core::Lsn;

/// What the primary's agent does about the sync set this round.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SyncPlan {
    /// Record this set in the store first (compare-and-set), when it differs from the record.
    pub record: Option<Vec<String>>,
    /// Then `synchronous_standby_names` lists these standbys.
    pub names: Vec<String>,
}

/// The members that may stand in the sync set this round: of those whose heartbeat is in the
/// store (`heartbeat`), the ones replicating from this primary now (`connected`); when none
/// is, every one of them, as before any standby streams (an empty list would acknowledge
/// commits that no standby holds; a list of standbys that do not stream makes them wait).
///
/// A member that never streams (a certificate of another CA, a clone that keeps failing) must
/// not enter the recorded set while others stream: it cannot hold any acknowledged commit,
/// yet a failover's quorum proof would wait to hear from it once it is gone. Leaving the list
/// never weakens the commit mode: `ANY k`/`FIRST k` keep their `k`, so a list shorter than
/// `k` makes commits wait instead.
pub fn candidates(heartbeat: &[String], connected: &dyn Fn(&str) -> bool) -> Vec<String> {
    let streaming: Vec<String> = heartbeat.iter().filter(|m| connected(m)).cloned().collect();
    if streaming.is_empty() {
        heartbeat.to_vec()
    } else {
        streaming
    }
}

/// Decides the recorded set and the server's standby list.
///
/// * `recorded`: the set in the store now; `present`: the other members whose heartbeat is in
///   the store; `applied`: the standby list the server has and the WAL position when it was
///   set; `flushed`: each standby's flushed position (`pg_stat_replication`).
/// * Growing: `recorded ∪ present` is recorded before the server lists the newcomers.
/// * Shrinking: the server lists `present` first; the record drops the departed members once
///   every present standby has flushed past the position at which the shorter list took
///   effect (what was acknowledged under the longer list is then on every remaining one).
/// * No member present: nothing changes — an empty list would acknowledge commits that no
///   standby holds.
pub fn plan(
    recorded: &[String],
    present: &[String],
    applied: Option<&(Vec<String>, Lsn)>,
    flushed: &dyn Fn(&str) -> Option<Lsn>,
) -> SyncPlan {
    let mut present: Vec<String> = present.to_vec();
    present.sort();
    present.dedup();
    if present.is_empty() {
        return SyncPlan {
            record: None,
            names: recorded.to_vec(),
        };
    }
    let mut union: Vec<String> = recorded.iter().chain(&present).cloned().collect();
    union.sort();
    union.dedup();
    let mut sorted_recorded = recorded.to_vec();
    sorted_recorded.sort();
    if union != sorted_recorded {
        return SyncPlan {
            record: Some(union),
            names: present,
        };
    }
    let caught_up = applied.is_some_and(|(names, at)| {
        *names == present && present.iter().all(|m| flushed(m).is_some_and(|f| f >= *at))
    });
    SyncPlan {
        record: (caught_up && sorted_recorded != present).then(|| present.clone()),
        names: present,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v(names: &[&str]) -> Vec<String> {
        names.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn only_members_that_replicate_are_candidates_while_one_does() {
        let connected = |names: &'static [&'static str]| move |m: &str| names.contains(&m);
        // (heartbeat, connected) → candidates
        let table: [(&[&str], &'static [&'static str], &[&str]); 4] = [
            // Nobody streams yet (a new cluster): every member, so commits wait for one.
            (&["a", "b"], &[], &["a", "b"]),
            // A member that never streams stays out while another does.
            (&["a", "stranger"], &["a"], &["a"]),
            (&["a", "b"], &["a", "b"], &["a", "b"]),
            // A walsender without a heartbeat (a member gone from the store) is no candidate.
            (&["a"], &["a", "gone"], &["a"]),
        ];
        for (heartbeat, on, want) in table {
            assert_eq!(
                candidates(&v(heartbeat), &connected(on)),
                v(want),
                "{heartbeat:?} / {on:?}"
            );
        }
    }

    #[test]
    fn sync_set_table() {
        let none = |_: &str| None;
        let all_at = |lsn: u64| move |_: &str| Some(Lsn(lsn));
        // (recorded, present, applied, flushed) → plan
        // A newcomer is recorded before the server lists it.
        assert_eq!(
            plan(&v(&["b"]), &v(&["c", "b"]), None, &none),
            SyncPlan {
                record: Some(v(&["b", "c"])),
                names: v(&["b", "c"])
            }
        );
        // Steady state: nothing to record.
        let applied = (v(&["b", "c"]), Lsn(100));
        assert_eq!(
            plan(
                &v(&["b", "c"]),
                &v(&["b", "c"]),
                Some(&applied),
                &all_at(50)
            ),
            SyncPlan {
                record: None,
                names: v(&["b", "c"])
            }
        );
        // c departed: the server drops it first, the record keeps it ...
        assert_eq!(
            plan(&v(&["b", "c"]), &v(&["b"]), Some(&applied), &all_at(500)),
            SyncPlan {
                record: None,
                names: v(&["b"])
            }
        );
        // ... until b has flushed past the point where the shorter list took effect.
        let shorter = (v(&["b"]), Lsn(200));
        assert_eq!(
            plan(&v(&["b", "c"]), &v(&["b"]), Some(&shorter), &all_at(199)).record,
            None
        );
        assert_eq!(
            plan(&v(&["b", "c"]), &v(&["b"]), Some(&shorter), &none).record,
            None,
            "an unknown position proves nothing"
        );
        assert_eq!(
            plan(&v(&["b", "c"]), &v(&["b"]), Some(&shorter), &all_at(200)).record,
            Some(v(&["b"]))
        );
        // Nobody present: keep listing the recorded set (commits wait rather than go unkept).
        assert_eq!(
            plan(&v(&["b", "c"]), &[], Some(&applied), &all_at(500)),
            SyncPlan {
                record: None,
                names: v(&["b", "c"])
            }
        );
        // A fresh cluster's first replica.
        assert_eq!(plan(&[], &v(&["b"]), None, &none).record, Some(v(&["b"])));
    }
}
