//! Restore targets: what `herd restore --to` accepts, checked against the repository's backups
//! before anything is written, so a target the repository cannot reach fails with nothing done.

use crate::{format_utc, parse_timestamp, BackupError, BackupInfo};

/// Where a restore stops.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Target {
    /// The end of the archived WAL.
    Latest,
    /// A moment, in microseconds since the Unix epoch: every transaction committed by then.
    Time(i64),
}

impl std::str::FromStr for Target {
    type Err = BackupError;
    fn from_str(s: &str) -> Result<Target, BackupError> {
        if s.trim() == "latest" {
            return Ok(Target::Latest);
        }
        parse_timestamp(s).map(Target::Time).ok_or_else(|| {
            BackupError::Target(format!(
                "'{s}' is not a restore target: give `latest` or a time such as \
                 '2026-11-28 13:20:32' (UTC), '2026-11-28 13:20:32.5+01' or '2026-11-28T12:20:32Z'"
            ))
        })
    }
}

/// The backup a restore to `target` starts from (the newest that ended before it), given the
/// stanza's backups oldest first and the time now (microseconds since the epoch). Fails for a
/// target in the future or before the end of the first backup.
pub fn choose_set(
    backups: &[BackupInfo],
    target: Target,
    now: i64,
) -> Result<&BackupInfo, BackupError> {
    let Some(last) = backups.last() else {
        return Err(BackupError::Target(
            "the repository holds no backup of this cluster yet: take one with `herd backup`"
                .into(),
        ));
    };
    let Target::Time(t) = target else {
        return Ok(last);
    };
    if t > now {
        return Err(BackupError::Target(format!(
            "the target {} is in the future (it is now {}): WAL up to it does not exist",
            format_utc(t),
            format_utc(now)
        )));
    }
    // Stop times are whole seconds, rounded down: a target within the stop's second could
    // precede the moment the backup became consistent.
    let consistent = |b: &BackupInfo| (b.stop + 1) * 1_000_000;
    backups
        .iter()
        .rev()
        .find(|b| consistent(b) <= t)
        .ok_or_else(|| {
            BackupError::Target(format!(
                "the target {} is before the end of the first backup ({}, which ended at {}): \
                 the earliest moment this repository can restore to is {}",
                format_utc(t),
                backups[0].label,
                format_utc(backups[0].stop * 1_000_000),
                format_utc(consistent(&backups[0]))
            ))
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn backup(label: &str, stop: i64) -> BackupInfo {
        BackupInfo {
            label: label.into(),
            kind: "full".into(),
            start: stop - 5,
            stop,
            size: 0,
            repo_size: 0,
        }
    }

    #[test]
    fn newest_backup_before_the_target() {
        let list = [backup("a", 1000), backup("b", 2000)];
        let s = 1_000_000;
        let now = 5000 * s;
        assert_eq!(
            choose_set(&list, Target::Latest, now)
                .expect("latest")
                .label,
            "b"
        );
        assert_eq!(
            choose_set(&list, Target::Time(1500 * s), now)
                .expect("t")
                .label,
            "a"
        );
        assert_eq!(
            choose_set(&list, Target::Time(2001 * s), now)
                .expect("t")
                .label,
            "b"
        );
        assert_eq!(
            choose_set(&list, Target::Time(2000 * s), now)
                .expect("t")
                .label,
            "a"
        );
    }

    #[test]
    fn unreachable_targets_are_refused() {
        let list = [backup("a", 1000)];
        let s = 1_000_000;
        let early = choose_set(&list, Target::Time(900 * s), 5000 * s).expect_err("early");
        assert!(
            early
                .to_string()
                .contains("before the end of the first backup"),
            "{early}"
        );
        let future = choose_set(&list, Target::Time(6000 * s), 5000 * s).expect_err("future");
        assert!(future.to_string().contains("in the future"), "{future}");
        let none = choose_set(&[], Target::Latest, 0).expect_err("empty");
        assert!(none.to_string().contains("no backup"), "{none}");
        assert!("yesterday".parse::<Target>().is_err());
        assert_eq!("latest".parse::<Target>().expect("latest"), Target::Latest);
    }
}
