//! A replication slot's state file put into a (stopped or running) server's data directory:
//! PostgreSQL loads `pg_replslot/<name>/state` at its next start. This is how a logical slot
//! reaches a replica on PostgreSQL 15, which cannot create one on a standby.

use std::io::Write as _;
use std::os::unix::fs::{DirBuilderExt as _, OpenOptionsExt as _};
use std::path::Path;

use crate::{Pg, PgError};

impl Pg {
    /// Writes `state` (the bytes of the primary's `pg_replslot/<name>/state`) as slot `name`
    /// in `datadir`, durably, owned by the servers' OS user. The server loads it when it
    /// next starts. `name` must be a plain slot name (lower-case letters, digits, `_`).
    pub fn install_slot_state(
        &self,
        datadir: &Path,
        name: &str,
        state: &[u8],
    ) -> Result<(), PgError> {
        let plain = !name.is_empty()
            && name
                .chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_');
        if !plain {
            return Err(PgError::Protocol {
                context: "a slot to install".into(),
                detail: format!("{name:?} is not a plain slot name"),
            });
        }
        let dir = datadir.join("pg_replslot").join(name);
        if dir.exists() {
            std::fs::remove_dir_all(&dir).map_err(|e| PgError::io("removing", &dir, e))?;
        }
        std::fs::DirBuilder::new()
            .mode(0o700)
            .create(&dir)
            .map_err(|e| PgError::io("creating", &dir, e))?;
        let file = dir.join("state");
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&file)
            .map_err(|e| PgError::io("creating", &file, e))?;
        f.write_all(state)
            .and_then(|()| f.sync_all())
            .map_err(|e| PgError::io("writing", &file, e))?;
        // The directory entries too, so a crash right after leaves the slot whole or absent.
        for d in [&dir, &datadir.join("pg_replslot")] {
            std::fs::File::open(d)
                .and_then(|h| h.sync_all())
                .map_err(|e| PgError::io("syncing", d, e))?;
        }
        self.hand_over(&dir)
    }
}
