//! Backups and point-in-time recovery with pgBackRest: the configuration Herd writes for it
//! (one stanza per shard group), running its commands as the servers' OS user with their
//! progress, reading its backup list, and checking a restore target against that list.
//!
//! Why pgBackRest rather than a home-made archiver: it is the archiver PostgreSQL HA stacks
//! rely on (parallel, checksummed, retention and WAL expiry, S3), packaged by Debian, and Herd
//! only has to write its configuration and call it. Its dependencies: serde_json (pgBackRest's
//! JSON output), herd-pg (the OS user), herd-core (WAL positions), and jiff for restore
//! targets' times — a maintained date-time crate (offsets, month lengths, leap years checked)
//! instead of hand-written calendar code, built without a time zone database.

mod backfill;
mod error;
mod info;
mod points;
mod run;
mod schedule;
mod setup;
mod target;
mod time;

pub use backfill::{
    newest_history, previous_timeline_segments, push_segments, segments_before_switch,
};
pub use error::BackupError;
pub use info::{parse_info, BackupInfo};
pub use points::{
    newest_point_before, point_on_every_group, read_points, record_point, repository_points,
    RestorePoint,
};
pub use run::{BackupKind, Event, Runner};
pub use schedule::Schedule;
pub use setup::{archive_command, restore_command, stanza, Paths, PgNode, S3Repo, Setup, Stanza};
pub use target::{choose_set, valid_point_name, Target};
pub use time::{format_utc, parse_timestamp};
