//! The embedded store of `herd up`: a [`MemoryDcs`] whose lasting facts are also kept in a
//! file (`DATA/store.json`), so that `herd down` then `herd up` resumes with the same leader,
//! sync set and settings.
//!
//! The file is rewritten (temporary file, fsync, rename, fsync of the directory: a reader
//! sees the old file or the new one, whole) after every compare-and-set and every change of a
//! lease's *holder* (taken, released, found expired). Heartbeats (`put_expiring`) and lease
//! renewals stay in memory: they are most of the writes, and a restart forgets them anyway.
//! On open, keys and revisions come back, expiring keys do not, and each lease is held by its
//! last holder for one TTL from the open, so that holder renews it in its first round.
//! One writer at a time (the data directory's `SupervisorLock`); readers open it read-only.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use crate::memory::Durable;
use crate::{Dcs, DcsError, MemoryDcs, Versioned};

/// The layout of the file this code writes; another one is refused, not misread.
const FORMAT: u32 = 1;

/// Why the store file cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum EmbeddedError {
    /// The file exists but cannot be read.
    #[error("cannot read the store file {}: {source} (check its owner and permissions)", path.display())]
    Unreadable {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// The file cannot be written (nor its directory synced).
    #[error("cannot write the store file {}: {source} (check the data directory's owner, permissions and free space)", path.display())]
    Unwritable {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// The file is not a store this version of Herd can read.
    #[error("the store file {} is damaged ({detail}); restore it from a backup, or move it aside to start from an empty store", path.display())]
    Damaged {
        /// The file.
        path: PathBuf,
        /// What is wrong with it.
        detail: String,
    },
    /// A read-only open found no file.
    #[error("no store file at {}: the cluster has not been started with this data directory yet", path.display())]
    Absent {
        /// Where it was looked for.
        path: PathBuf,
    },
}

/// The file's contents. Values are kept as text when they are UTF-8 (all of Herd's are), so
/// the file can be read by a person.
#[derive(Serialize, Deserialize)]
struct StoreFile {
    format: u32,
    /// The last revision given out by a durable write.
    revision: u64,
    keys: BTreeMap<String, KeyRecord>,
    leases: BTreeMap<String, LeaseRecord>,
}

#[derive(Serialize, Deserialize)]
struct KeyRecord {
    revision: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    text: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    bytes: Option<Vec<u8>>,
}

#[derive(Serialize, Deserialize)]
struct LeaseRecord {
    holder: String,
    ttl_ms: u64,
}

fn encode(durable: Durable) -> StoreFile {
    StoreFile {
        format: FORMAT,
        revision: durable.revision,
        keys: durable
            .keys
            .into_iter()
            .map(|(k, v)| {
                let (text, bytes) = match String::from_utf8(v.value) {
                    Ok(text) => (Some(text), None),
                    Err(e) => (None, Some(e.into_bytes())),
                };
                let record = KeyRecord {
                    revision: v.revision,
                    text,
                    bytes,
                };
                (k, record)
            })
            .collect(),
        leases: durable
            .leases
            .into_iter()
            .map(|(name, (holder, ttl))| {
                let ttl_ms = u64::try_from(ttl.as_millis()).unwrap_or(u64::MAX);
                (name, LeaseRecord { holder, ttl_ms })
            })
            .collect(),
    }
}

/// The durable state of `file`, or what is wrong with it.
fn decode(file: StoreFile) -> Result<Durable, String> {
    if file.format != FORMAT {
        return Err(format!(
            "format {} where this Herd reads format {FORMAT}",
            file.format
        ));
    }
    let mut keys = BTreeMap::new();
    for (k, record) in file.keys {
        // A revision above the counter would be given out again: two writes, one revision.
        if record.revision == 0 || record.revision > file.revision {
            return Err(format!(
                "key {k:?} has revision {} (the store's last is {})",
                record.revision, file.revision
            ));
        }
        let value = match (record.text, record.bytes) {
            (Some(text), None) => text.into_bytes(),
            (None, Some(bytes)) => bytes,
            _ => return Err(format!("key {k:?} needs one of \"text\" or \"bytes\"")),
        };
        let revision = record.revision;
        keys.insert(k, Versioned { value, revision });
    }
    let leases = file
        .leases
        .into_iter()
        .map(|(name, l)| (name, (l.holder, Duration::from_millis(l.ttl_ms))))
        .collect();
    Ok(Durable {
        revision: file.revision,
        keys,
        leases,
    })
}

/// The durable state kept at `path`; `Ok(None)` when there is no file.
fn load(path: &Path) -> Result<Option<Durable>, EmbeddedError> {
    let text = match std::fs::read_to_string(path) {
        Ok(text) => text,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) if e.kind() == std::io::ErrorKind::InvalidData => {
            return Err(EmbeddedError::Damaged {
                path: path.to_path_buf(),
                detail: "not UTF-8 text".into(),
            })
        }
        Err(source) => {
            return Err(EmbeddedError::Unreadable {
                path: path.to_path_buf(),
                source,
            })
        }
    };
    let damaged = |detail: String| EmbeddedError::Damaged {
        path: path.to_path_buf(),
        detail,
    };
    let file: StoreFile = serde_json::from_str(&text).map_err(|e| damaged(e.to_string()))?;
    decode(file).map(Some).map_err(damaged)
}

/// Replaces the file at `path` with `bytes` so that a crash leaves the old file or the new
/// one, never a mix: the new contents are synced under a temporary name, renamed over the old
/// file, and the rename itself is synced by syncing the directory.
fn write_atomically(path: &Path, bytes: &[u8]) -> Result<(), EmbeddedError> {
    use std::io::Write;
    let failed = |source| EmbeddedError::Unwritable {
        path: path.to_path_buf(),
        source,
    };
    let mut tmp_name = path.file_name().unwrap_or_default().to_os_string();
    tmp_name.push(".tmp");
    let tmp = path.with_file_name(tmp_name);
    let mut f = std::fs::File::create(&tmp).map_err(failed)?;
    f.write_all(bytes)
        .and_then(|_| f.sync_all())
        .map_err(failed)?;
    drop(f);
    std::fs::rename(&tmp, path).map_err(failed)?;
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    std::fs::File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(failed)
}

/// A [`Dcs`] kept in this process's memory and, for what must outlive a restart, in a file.
pub struct EmbeddedDcs {
    memory: MemoryDcs,
    path: PathBuf,
    /// Opened for reading only: every write is refused, the file is never touched.
    read_only: bool,
    /// Held while the state is copied and written out, so the file never goes back to an
    /// older state than one already written.
    writing: Mutex<()>,
    /// A write of the file failed: the next operation tries again, even one (a renewal) that
    /// changes nothing durable.
    dirty: AtomicBool,
}

impl EmbeddedDcs {
    /// Opens the store kept at `path` (created, empty, when absent) for reading and writing.
    pub fn open(path: &Path) -> Result<EmbeddedDcs, EmbeddedError> {
        Self::open_with_clock(path, Box::new(Instant::now))
    }

    /// Like [`EmbeddedDcs::open`], reading time from `clock` (tests expire leases with it).
    pub fn open_with_clock(
        path: &Path,
        clock: Box<dyn Fn() -> Instant + Send + Sync>,
    ) -> Result<EmbeddedDcs, EmbeddedError> {
        let durable = load(path)?;
        let fresh = durable.is_none();
        let store = EmbeddedDcs {
            memory: MemoryDcs::restored(durable.unwrap_or_default(), clock),
            path: path.to_path_buf(),
            read_only: false,
            writing: Mutex::new(()),
            dirty: AtomicBool::new(false),
        };
        // Written at once: a directory the store cannot write to is reported now, by the
        // open, not by the first election.
        if fresh {
            store.write_file()?;
        }
        Ok(store)
    }

    /// Opens the store kept at `path` for reading (`herd status` and other commands beside
    /// a running `herd up`): writes fail, the file is never written. Each lease counts as
    /// held by its last recorded holder for one TTL from now.
    pub fn open_read_only(path: &Path) -> Result<EmbeddedDcs, EmbeddedError> {
        let durable = load(path)?.ok_or_else(|| EmbeddedError::Absent {
            path: path.to_path_buf(),
        })?;
        Ok(EmbeddedDcs {
            memory: MemoryDcs::restored(durable, Box::new(Instant::now)),
            path: path.to_path_buf(),
            read_only: true,
            writing: Mutex::new(()),
            dirty: AtomicBool::new(false),
        })
    }

    /// The file this store is kept in.
    pub fn path(&self) -> &Path {
        &self.path
    }

    fn write_file(&self) -> Result<(), EmbeddedError> {
        let _writing = self.writing.lock().unwrap_or_else(|p| p.into_inner());
        let file = encode(self.memory.durable());
        // Serialising plain strings and numbers cannot fail.
        let text = serde_json::to_string_pretty(&file).unwrap_or_default();
        let written = write_atomically(&self.path, text.as_bytes());
        self.dirty.store(written.is_err(), Ordering::SeqCst);
        written
    }

    /// Writes the file when `changed` (the caller's write must not be reported done before
    /// it is on disk), or when an earlier write failed (then a failure again is not the
    /// caller's: it stays pending for the next operation).
    fn persist(&self, changed: bool) -> Result<(), DcsError> {
        if changed {
            self.write_file()
                .map_err(|e| DcsError::Unavailable(e.to_string()))
        } else {
            if self.dirty.load(Ordering::SeqCst) {
                let _ = self.write_file();
            }
            Ok(())
        }
    }

    fn writable(&self) -> Result<(), DcsError> {
        if self.read_only {
            return Err(DcsError::Unavailable(format!(
                "the store file {} is open read-only",
                self.path.display()
            )));
        }
        Ok(())
    }
}

impl Dcs for EmbeddedDcs {
    fn get(&self, key: &str) -> Result<Option<Versioned>, DcsError> {
        self.memory.get(key)
    }

    /// Done in memory first, then written out: a failed write of the file reports the store
    /// unavailable, whose outcome (as for etcd) the caller learns by reading again.
    fn compare_and_set(&self, key: &str, expected: u64, value: Vec<u8>) -> Result<u64, DcsError> {
        self.writable()?;
        let revision = self.memory.compare_and_set(key, expected, value)?;
        self.persist(true)?;
        Ok(revision)
    }

    fn acquire_lease(&self, key: &str, owner: &str, ttl: Duration) -> Result<bool, DcsError> {
        self.writable()?;
        let (held, changed) = self.memory.take_lease(key, owner, ttl);
        self.persist(changed)?;
        Ok(held)
    }

    fn release_lease(&self, key: &str, owner: &str) -> Result<(), DcsError> {
        self.writable()?;
        let changed = self.memory.give_up_lease(key, owner);
        self.persist(changed)
    }

    fn lease_holder(&self, key: &str) -> Result<Option<String>, DcsError> {
        let (holder, expired) = self.memory.holder(key);
        if !self.read_only {
            self.persist(expired)?;
        }
        Ok(holder)
    }

    fn put_expiring(&self, key: &str, value: Vec<u8>, ttl: Duration) -> Result<(), DcsError> {
        self.writable()?;
        // Written out only when it replaced a durable key, which must not come back on open.
        let replaced = self.memory.put_expiring_over(key, value, ttl);
        self.persist(replaced)
    }

    fn list(&self, prefix: &str) -> Result<Vec<(String, Versioned)>, DcsError> {
        self.memory.list(prefix)
    }

    fn changes(&self) -> tokio::sync::watch::Receiver<u64> {
        self.memory.changes()
    }

    fn changes_ignoring(&self, prefix: &str) -> tokio::sync::watch::Receiver<u64> {
        self.memory.changes_ignoring(prefix)
    }

    fn changes_under(&self, within: &str, ignoring: &[&str]) -> tokio::sync::watch::Receiver<u64> {
        self.memory.changes_under(within, ignoring)
    }
}

#[cfg(test)]
mod tests;
