//! Restore targets: what `herd restore --to` accepts, checked against the repository's backups
//! before anything is written, so a target the repository cannot reach fails with nothing done.

use herd_core::Lsn;

use crate::{format_utc, parse_timestamp, BackupError, BackupInfo};

/// Where a restore stops.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Target {
    /// The end of the archived WAL.
    Latest,
    /// A moment, in microseconds since the Unix epoch: every transaction committed by then.
    Time(i64),
    /// A WAL position (`0/3000060`): every transaction committed at or before it.
    Lsn(Lsn),
    /// A restore point made by `herd backup restore-point NAME` (`pg_create_restore_point`).
    Name(String),
}

/// Whether `name` may name a restore point: a letter or `_` first, then letters, digits, `_`,
/// `-` or `.`, at most 63 bytes. Nothing else is taken for a name, so a mistyped time or LSN
/// is refused rather than sought as a restore point.
pub fn valid_point_name(name: &str) -> bool {
    let mut chars = name.chars();
    matches!(chars.next(), Some(c) if c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || "_-.".contains(c))
        && name.len() <= 63
}

impl std::str::FromStr for Target {
    type Err = BackupError;
    fn from_str(s: &str) -> Result<Target, BackupError> {
        let s = s.trim();
        if s == "latest" {
            return Ok(Target::Latest);
        }
        if let Ok(lsn) = s.parse::<Lsn>() {
            return Ok(Target::Lsn(lsn));
        }
        if let Some(t) = parse_timestamp(s) {
            return Ok(Target::Time(t));
        }
        // Times and LSNs start with a digit: one that did not parse is a mistake, not a name.
        if valid_point_name(s) {
            return Ok(Target::Name(s.to_string()));
        }
        Err(BackupError::Target(format!(
            "'{s}' is not a restore target: give `latest`, a time such as \
             '2026-11-28 13:20:32' (UTC), '2026-11-28 13:20:32.5+01' or '2026-11-28T12:20:32Z', \
             a WAL position such as 0/3000060, or the name of a restore point (a letter first, \
             then letters, digits, '_', '-' or '.')"
        )))
    }
}

impl std::fmt::Display for Target {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Target::Latest => f.write_str("the end of the archived WAL"),
            Target::Time(t) => f.write_str(&format_utc(*t)),
            Target::Lsn(l) => write!(f, "WAL position {l}"),
            Target::Name(n) => write!(f, "restore point '{n}'"),
        }
    }
}

impl Target {
    /// pgBackRest's `restore` options for this target (`--type`, `--target`, the action).
    pub fn restore_args(&self) -> Vec<String> {
        let (kind, target) = match self {
            Target::Latest => return Vec::new(),
            Target::Time(t) => ("time", format_utc(*t)),
            Target::Lsn(l) => ("lsn", l.to_string()),
            Target::Name(n) => ("name", n.clone()),
        };
        vec![
            format!("--type={kind}"),
            format!("--target={target}"),
            "--target-action=promote".to_string(),
        ]
    }
}

/// The backup a restore to `target` starts from (the newest that ended before it), given the
/// stanza's backups oldest first and the time now (microseconds since the epoch). A restore
/// point is chosen for by its position, `point` (known when Herd recorded it; otherwise the
/// newest backup). Fails for a time in the future, and for a time or position before the end of
/// the first backup.
pub fn choose_set<'a>(
    backups: &'a [BackupInfo],
    target: &Target,
    now: i64,
    point: Option<Lsn>,
) -> Result<&'a BackupInfo, BackupError> {
    let Some(last) = backups.last() else {
        return Err(BackupError::Target(
            "the repository holds no backup of this cluster yet: take one with `herd backup`"
                .into(),
        ));
    };
    let lsn = match (target, point) {
        (Target::Lsn(l), _) => *l,
        (Target::Name(_), Some(l)) => l,
        (Target::Time(t), _) => return choose_by_time(backups, *t, now),
        _ => return Ok(last),
    };
    backups
        .iter()
        .rev()
        .find(|b| b.stop_lsn.is_some_and(|stop| stop <= lsn))
        .ok_or_else(|| {
            let first = &backups[0];
            BackupError::Target(format!(
                "{target} (at {lsn}) is before the end of the first backup ({}, consistent from \
                 {}): this repository cannot restore to it",
                first.label,
                first
                    .stop_lsn
                    .map_or_else(|| "an unknown position".to_string(), |l| l.to_string())
            ))
        })
}

fn choose_by_time(backups: &[BackupInfo], t: i64, now: i64) -> Result<&BackupInfo, BackupError> {
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
            // Positions grow with time in these tables: a backup ending at second s ends at s.
            stop_lsn: Some(Lsn(stop as u64)),
            system_id: None,
        }
    }

    #[test]
    fn newest_backup_before_the_target() {
        let list = [backup("a", 1000), backup("b", 2000)];
        let s = 1_000_000;
        let now = 5000 * s;
        assert_eq!(
            choose_set(&list, &Target::Latest, now, None)
                .expect("latest")
                .label,
            "b"
        );
        assert_eq!(
            choose_set(&list, &Target::Time(1500 * s), now, None)
                .expect("t")
                .label,
            "a"
        );
        assert_eq!(
            choose_set(&list, &Target::Time(2001 * s), now, None)
                .expect("t")
                .label,
            "b"
        );
        assert_eq!(
            choose_set(&list, &Target::Time(2000 * s), now, None)
                .expect("t")
                .label,
            "a"
        );
    }

    #[test]
    fn unreachable_targets_are_refused() {
        let list = [backup("a", 1000)];
        let s = 1_000_000;
        let early = choose_set(&list, &Target::Time(900 * s), 5000 * s, None).expect_err("early");
        assert!(
            early
                .to_string()
                .contains("before the end of the first backup"),
            "{early}"
        );
        let future =
            choose_set(&list, &Target::Time(6000 * s), 5000 * s, None).expect_err("future");
        assert!(future.to_string().contains("in the future"), "{future}");
        let none = choose_set(&[], &Target::Latest, 0, None).expect_err("empty");
        assert!(none.to_string().contains("no backup"), "{none}");
        assert!("2026-13-45 99:00".parse::<Target>().is_err());
        assert!("9/zz".parse::<Target>().is_err());
        assert!("before deploy".parse::<Target>().is_err());
        assert_eq!("latest".parse::<Target>().expect("latest"), Target::Latest);
    }

    #[test]
    fn positions_and_names() {
        assert_eq!(
            "0/3000060".parse::<Target>().expect("lsn"),
            Target::Lsn(Lsn(0x300_0060))
        );
        assert_eq!(
            "before-deploy.2".parse::<Target>().expect("name"),
            Target::Name("before-deploy.2".into())
        );
        assert!(!valid_point_name(&"x".repeat(64)));
        assert_eq!(
            Target::Lsn(Lsn(0x300_0060)).restore_args(),
            [
                "--type=lsn",
                "--target=0/3000060",
                "--target-action=promote"
            ]
        );
        assert!(Target::Latest.restore_args().is_empty());
        let list = [backup("a", 1000), backup("b", 2000)];
        let now = 5000 * 1_000_000;
        let at = |t: &Target, point| choose_set(&list, t, now, point).map(|b| b.label.clone());
        assert_eq!(at(&Target::Lsn(Lsn(1500)), None).expect("lsn"), "a");
        assert_eq!(at(&Target::Lsn(Lsn(2000)), None).expect("lsn"), "b");
        let early = at(&Target::Lsn(Lsn(999)), None).expect_err("early");
        assert!(
            early
                .to_string()
                .contains("before the end of the first backup"),
            "{early}"
        );
        let name = Target::Name("p".into());
        assert_eq!(at(&name, Some(Lsn(1200))).expect("recorded point"), "a");
        assert_eq!(at(&name, None).expect("unknown point: newest"), "b");
    }
}
