//! Failover-safe copies on PostgreSQL 15, where logical slots live only on the primary.
//!
//! The method (Patroni's "permanent slots"): each replica gets a copy of every copy's logical
//! slot — the slot's state file, read from the primary with `pg_read_binary_file` and put in
//! the replica's `pg_replslot/` before a restart loads it — and Herd then moves the replica's
//! slot forward with `pg_replication_slot_advance` to the position the target has confirmed
//! on the primary (never past what the replica has replayed). `hot_standby_feedback` carries
//! the replica slot's catalog horizon to the primary, so the catalog rows its decoding needs
//! are kept. After a promotion the slot is there, at or behind the target's position: the
//! target asks to start at its own position (its replication origin), and PostgreSQL skips
//! every transaction that committed before it, so nothing is applied twice; nothing is lost
//! because the replica's slot never passes the target's confirmation.
//!
//! A replica's slot may be *ahead* of the primary's (it was advanced further under an earlier
//! primary, or it is a former primary's own slot, which pg_rewind keeps): that is safe and left
//! alone. Every slot position is at most what the target confirmed, and the target confirms
//! only what the endpoint's relay let through — WAL already replayed on the replicas that a
//! failover promotes from — so no position is past a promoted node's history. Replacing such a
//! slot would drop it for the seconds its replacement takes to load: a failover then would
//! break the copy (a chaos test found exactly that).
//!
//! This module decides what to do for one replica; the I/O is the caller's.

use herd_core::Lsn;

use crate::spec::PREFIX;

/// A logical slot as a server reports it.
#[derive(Clone, Debug, PartialEq)]
pub struct SlotPos {
    /// `slot_name`.
    pub name: String,
    /// `confirmed_flush_lsn`.
    pub confirmed: Lsn,
    /// PostgreSQL invalidated it (`wal_status = 'lost'`).
    pub lost: bool,
}

/// What to do on one replica.
#[derive(Clone, Debug, PartialEq)]
pub enum SlotStep {
    /// Drop this slot on the replica (its copy is gone, or PostgreSQL invalidated it here).
    Drop(String),
    /// Move this slot forward to `to`.
    Advance {
        /// The slot.
        slot: String,
        /// The position.
        to: Lsn,
    },
    /// Copy these slots' state files from the primary, then restart the replica so it loads
    /// them (one restart for all of them).
    Install(Vec<String>),
}

/// The steps that bring `replica`'s copy slots (positions `replica`, replay position
/// `replayed`) in line with the primary's (`primary`). Only Herd's copy slots are touched.
pub fn plan(primary: &[SlotPos], replica: &[SlotPos], replayed: Lsn) -> Vec<SlotStep> {
    let ours = |s: &&SlotPos| s.name.starts_with(PREFIX);
    let mut steps = Vec::new();
    let mut install = Vec::new();
    for p in primary.iter().filter(ours) {
        let here = replica.iter().find(|r| r.name == p.name);
        if p.lost {
            // The copy is broken on the primary already: nothing worth keeping here.
            if here.is_some() {
                steps.push(SlotStep::Drop(p.name.clone()));
            }
            continue;
        }
        match here {
            None => install.push(p.name.clone()),
            // Invalidated here (its WAL is gone on this replica): useless, replaced.
            Some(r) if r.lost => {
                steps.push(SlotStep::Drop(r.name.clone()));
                install.push(p.name.clone());
            }
            Some(r) => {
                let to = p.confirmed.min(replayed);
                if to > r.confirmed {
                    steps.push(SlotStep::Advance {
                        slot: r.name.clone(),
                        to,
                    });
                }
            }
        }
    }
    for r in replica.iter().filter(ours) {
        if !primary.iter().any(|p| p.name == r.name) {
            steps.push(SlotStep::Drop(r.name.clone()));
        }
    }
    if !install.is_empty() {
        steps.push(SlotStep::Install(install));
    }
    steps
}

#[cfg(test)]
mod tests {
    use super::*;

    fn slot(name: &str, at: u64) -> SlotPos {
        SlotPos {
            name: name.into(),
            confirmed: Lsn(at),
            lost: false,
        }
    }

    /// What, the primary's slots, the replica's, its replay position, the steps expected.
    type Case = (&'static str, Vec<SlotPos>, Vec<SlotPos>, u64, Vec<SlotStep>);

    #[test]
    fn table() {
        let a = "herd_copy_a";
        let b = "herd_copy_b";
        let cases: Vec<Case> = vec![
            (
                "in line: nothing",
                vec![slot(a, 100)],
                vec![slot(a, 100)],
                200,
                vec![],
            ),
            (
                "missing: install",
                vec![slot(a, 100), slot(b, 50)],
                vec![],
                200,
                vec![SlotStep::Install(vec![a.into(), b.into()])],
            ),
            (
                "behind: advance to the primary's",
                vec![slot(a, 150)],
                vec![slot(a, 100)],
                200,
                vec![SlotStep::Advance {
                    slot: a.into(),
                    to: Lsn(150),
                }],
            ),
            (
                "never past the replica's replay",
                vec![slot(a, 150)],
                vec![slot(a, 100)],
                120,
                vec![SlotStep::Advance {
                    slot: a.into(),
                    to: Lsn(120),
                }],
            ),
            (
                "replay behind the slot: wait",
                vec![slot(a, 150)],
                vec![slot(a, 100)],
                90,
                vec![],
            ),
            (
                "ahead (advanced under an earlier primary, or a former primary's own): kept",
                vec![slot(a, 100)],
                vec![slot(a, 180)],
                200,
                vec![],
            ),
            (
                "copy dropped: drop here",
                vec![],
                vec![slot(a, 100)],
                200,
                vec![SlotStep::Drop(a.into())],
            ),
            (
                "other slots untouched",
                vec![slot("theirs", 1)],
                vec![slot("mine", 5)],
                200,
                vec![],
            ),
            (
                "lost on the primary: drop, no install",
                vec![SlotPos {
                    lost: true,
                    ..slot(a, 100)
                }],
                vec![slot(a, 100)],
                200,
                vec![SlotStep::Drop(a.into())],
            ),
            (
                "lost on the primary and absent: nothing",
                vec![SlotPos {
                    lost: true,
                    ..slot(a, 100)
                }],
                vec![],
                200,
                vec![],
            ),
            (
                "lost here: replace",
                vec![slot(a, 100)],
                vec![SlotPos {
                    lost: true,
                    ..slot(a, 90)
                }],
                200,
                vec![SlotStep::Drop(a.into()), SlotStep::Install(vec![a.into()])],
            ),
        ];
        for (what, primary, replica, replayed, want) in cases {
            assert_eq!(plan(&primary, &replica, Lsn(replayed)), want, "{what}");
        }
    }
}
