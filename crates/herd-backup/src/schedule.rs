//! Scheduled backups (`[backup] full_every_s`, `incr_every_s`): which backup a shard group is
//! due for, decided from the backups in the repository rather than from a timer, so a restart of
//! the cluster neither repeats nor skips one.

use std::time::Duration;

use crate::{BackupInfo, BackupKind};

/// How often each type of backup is taken (seconds; 0: never).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Schedule {
    /// Between full backups.
    pub full_every_s: u64,
    /// Between incremental backups (from the newest backup of any type).
    pub incr_every_s: u64,
}

impl Schedule {
    /// Whether any backup is scheduled.
    pub fn is_on(&self) -> bool {
        self.full_every_s > 0 || self.incr_every_s > 0
    }

    /// The backup a group with `backups` (oldest first) is due for at `now` (seconds since the
    /// epoch), if any: a full one when it has none yet or its newest full one is `full_every_s`
    /// old, else an incremental one when its newest backup is `incr_every_s` old.
    pub fn due(&self, backups: &[BackupInfo], now: i64) -> Option<BackupKind> {
        if !self.is_on() {
            return None;
        }
        let age = |b: &BackupInfo| now.saturating_sub(b.stop).max(0) as u64;
        let Some(full) = backups.iter().rev().find(|b| b.kind == "full") else {
            // An incremental backup needs a full one first (pgBackRest would take a full one
            // anyway, with a warning).
            return Some(BackupKind::Full);
        };
        if self.full_every_s > 0 && age(full) >= self.full_every_s {
            return Some(BackupKind::Full);
        }
        let newest = backups.last().unwrap_or(full);
        if self.incr_every_s > 0 && age(newest) >= self.incr_every_s {
            return Some(BackupKind::Incr);
        }
        None
    }

    /// How often the supervisor looks whether a backup is due: a quarter of the shortest
    /// interval, between 1 s and a minute.
    pub fn tick(&self) -> Duration {
        let shortest = [self.full_every_s, self.incr_every_s]
            .into_iter()
            .filter(|s| *s > 0)
            .min()
            .unwrap_or(60);
        Duration::from_secs((shortest / 4).clamp(1, 60))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn backup(kind: &str, stop: i64) -> BackupInfo {
        BackupInfo {
            label: format!("{stop}{kind}"),
            kind: kind.into(),
            start: stop - 5,
            stop,
            size: 0,
            repo_size: 0,
            stop_lsn: None,
            system_id: None,
        }
    }

    #[test]
    fn due_backups() {
        let full_daily_incr_hourly = Schedule {
            full_every_s: 86_400,
            incr_every_s: 3_600,
        };
        let full_only = Schedule {
            full_every_s: 86_400,
            incr_every_s: 0,
        };
        let incr_only = Schedule {
            full_every_s: 0,
            incr_every_s: 60,
        };
        let off = Schedule::default();
        let now = 1_000_000;
        let fresh_full = vec![backup("full", now - 10)];
        let old_full = vec![backup("full", now - 90_000)];
        let old_full_recent_incr = vec![backup("full", now - 90_000), backup("incr", now - 10)];
        let full_then_old_incr = vec![backup("full", now - 7_300), backup("incr", now - 3_700)];
        let cases: [(Schedule, &[BackupInfo], Option<BackupKind>); 11] = [
            (off, &[], None),
            (off, &old_full, None),
            (full_daily_incr_hourly, &[], Some(BackupKind::Full)),
            (incr_only, &[], Some(BackupKind::Full)),
            (full_daily_incr_hourly, &fresh_full, None),
            (full_daily_incr_hourly, &old_full, Some(BackupKind::Full)),
            // The full one is due even when an incremental one is recent.
            (
                full_daily_incr_hourly,
                &old_full_recent_incr,
                Some(BackupKind::Full),
            ),
            (
                full_daily_incr_hourly,
                &full_then_old_incr,
                Some(BackupKind::Incr),
            ),
            (full_only, &full_then_old_incr, None),
            (incr_only, &old_full_recent_incr, None),
            (incr_only, &old_full, Some(BackupKind::Incr)),
        ];
        for (i, (schedule, backups, want)) in cases.iter().enumerate() {
            assert_eq!(schedule.due(backups, now), *want, "case {i}: {schedule:?}");
        }
        // A clock behind the repository's times: nothing due, no overflow.
        assert_eq!(full_daily_incr_hourly.due(&fresh_full, 0), None);
    }

    #[test]
    fn ticks() {
        for (full, incr, secs) in [
            (0, 0, 15),
            (86_400, 0, 60),
            (86_400, 3_600, 60),
            (0, 8, 2),
            (2, 0, 1),
        ] {
            let s = Schedule {
                full_every_s: full,
                incr_every_s: incr,
            };
            assert_eq!(s.tick(), Duration::from_secs(secs), "{full} {incr}");
        }
    }
}
