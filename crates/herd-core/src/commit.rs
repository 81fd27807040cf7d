//! Commit modes and the quorum of synchronous standbys.

use std::fmt;
use std::str::FromStr;

use crate::NodeName;

/// A value that does not parse, with what was expected. Callers add the key it came from.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid {what} '{value}': expected {expected}")]
pub struct ParseError {
    /// What was being parsed (e.g. "commit mode").
    pub what: &'static str,
    /// The offending input.
    pub value: String,
    /// The allowed values or the expected shape.
    pub expected: String,
}

impl ParseError {
    pub(crate) fn new(what: &'static str, value: &str, expected: impl Into<String>) -> Self {
        ParseError {
            what,
            value: value.to_string(),
            expected: expected.into(),
        }
    }
}

/// How long a commit waits before it is acknowledged (the replication modes of "High availability and scalable reads in PostgreSQL").
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum CommitMode {
    /// Acknowledge after the local WAL flush; replicas follow asynchronously.
    Async,
    /// Wait until the sync standbys have written the WAL (not yet flushed).
    RemoteWrite,
    /// Wait until the sync standbys have flushed the WAL to disk.
    On,
    /// Wait until the sync standbys have replayed the commit (visible to their readers).
    RemoteApply,
}

impl CommitMode {
    /// Every mode, in order of increasing safety.
    pub const ALL: [CommitMode; 4] = [
        CommitMode::Async,
        CommitMode::RemoteWrite,
        CommitMode::On,
        CommitMode::RemoteApply,
    ];

    /// The mode's name in Herd's configuration and CLI.
    pub fn as_str(self) -> &'static str {
        match self {
            CommitMode::Async => "async",
            CommitMode::RemoteWrite => "remote_write",
            CommitMode::On => "on",
            CommitMode::RemoteApply => "remote_apply",
        }
    }

    /// The primary's `synchronous_commit` for this mode. Async uses `local` rather than clearing
    /// `synchronous_standby_names`, so a transaction can still opt into waiting for replicas with
    /// `SET LOCAL synchronous_commit = on`.
    pub fn synchronous_commit(self) -> &'static str {
        match self {
            CommitMode::Async => "local",
            CommitMode::RemoteWrite => "remote_write",
            CommitMode::On => "on",
            CommitMode::RemoteApply => "remote_apply",
        }
    }

    fn allowed() -> String {
        CommitMode::ALL.map(CommitMode::as_str).join(", ")
    }
}

impl fmt::Display for CommitMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for CommitMode {
    type Err = ParseError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        CommitMode::ALL
            .into_iter()
            .find(|m| m.as_str() == s.trim())
            .ok_or_else(|| ParseError::new("commit mode", s, format!("one of {}", Self::allowed())))
    }
}

/// How the primary counts acknowledgements from its standbys.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum SyncMethod {
    /// Quorum: any `k` standbys of the set.
    Any,
    /// Priority: the first `k` standbys of the set, in order.
    First,
}

/// `ANY k` or `FIRST k`: how many standbys must confirm a commit in the synchronous modes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct SyncStandbys {
    /// Quorum or priority.
    pub method: SyncMethod,
    /// How many standbys must confirm (at least 1).
    pub count: u32,
}

impl Default for SyncStandbys {
    fn default() -> Self {
        SyncStandbys {
            method: SyncMethod::Any,
            count: 1,
        }
    }
}

impl SyncStandbys {
    /// The `synchronous_standby_names` value over `standbys`; empty when there are none.
    pub fn standby_names(&self, standbys: &[NodeName]) -> String {
        if standbys.is_empty() {
            return String::new();
        }
        let names: Vec<String> = standbys.iter().map(|n| format!("\"{n}\"")).collect();
        format!("{self} ({})", names.join(", "))
    }
}

impl fmt::Display for SyncStandbys {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let method = match self.method {
            SyncMethod::Any => "ANY",
            SyncMethod::First => "FIRST",
        };
        write!(f, "{method} {}", self.count)
    }
}

impl FromStr for SyncStandbys {
    type Err = ParseError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let bad = || {
            ParseError::new(
                "sync standbys",
                s,
                "'ANY k' or 'FIRST k' with k >= 1, e.g. 'ANY 1'",
            )
        };
        let mut words = s.split_whitespace();
        let method = match words.next().map(str::to_ascii_uppercase).as_deref() {
            Some("ANY") => SyncMethod::Any,
            Some("FIRST") => SyncMethod::First,
            _ => return Err(bad()),
        };
        let count: u32 = words.next().and_then(|w| w.parse().ok()).ok_or_else(bad)?;
        if count == 0 || words.next().is_some() {
            return Err(bad());
        }
        Ok(SyncStandbys { method, count })
    }
}

/// Implements serde for a type through its `Display` / `FromStr`.
macro_rules! serde_via_str {
    ($ty:ty) => {
        impl serde::Serialize for $ty {
            fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                s.collect_str(self)
            }
        }
        impl<'de> serde::Deserialize<'de> for $ty {
            fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                <String as serde::Deserialize>::deserialize(d)?
                    .parse()
                    .map_err(serde::de::Error::custom)
            }
        }
    };
}
pub(crate) use serde_via_str;
serde_via_str!(CommitMode);
serde_via_str!(SyncStandbys);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn commit_modes_parse_and_map_to_synchronous_commit() {
        let table = [
            ("async", "local"),
            ("remote_write", "remote_write"),
            ("on", "on"),
            ("remote_apply", "remote_apply"),
        ];
        for (name, setting) in table {
            let mode: CommitMode = name.parse().expect("valid");
            assert_eq!(mode.as_str(), name);
            assert_eq!(mode.synchronous_commit(), setting);
        }
    }

    #[test]
    fn unknown_commit_mode_names_the_allowed_values() {
        let err = "fast".parse::<CommitMode>().expect_err("invalid");
        let text = err.to_string();
        assert!(
            text.contains("'fast'") && text.contains("remote_apply"),
            "{text}"
        );
    }

    #[test]
    fn sync_standbys_parse() {
        let ok = [
            ("ANY 1", SyncMethod::Any, 1),
            ("any 2", SyncMethod::Any, 2),
            ("  FIRST 1 ", SyncMethod::First, 1),
        ];
        for (text, method, count) in ok {
            let s: SyncStandbys = text.parse().expect(text);
            assert_eq!((s.method, s.count), (method, count));
        }
        for bad in ["", "ANY", "ANY 0", "ANY x", "ALL 1", "ANY 1 2", "1"] {
            assert!(
                bad.parse::<SyncStandbys>().is_err(),
                "{bad} should not parse"
            );
        }
    }

    #[test]
    fn standby_names_quote_each_node() {
        let s: SyncStandbys = "ANY 1".parse().expect("valid");
        let names = [NodeName::numbered(1), NodeName::numbered(2)];
        assert_eq!(s.standby_names(&names), "ANY 1 (\"node1\", \"node2\")");
        assert_eq!(s.standby_names(&[]), "");
    }
}
