//! Generated passwords, kept in files of mode 0600 under `secrets/`.

use std::path::{Path, PathBuf};

use rand::distributions::{Alphanumeric, DistString};

use crate::{ClusterError, Layout};

/// The cluster's passwords.
#[derive(Clone, PartialEq, Eq)]
pub struct Secrets {
    /// The superuser's (`postgres`) password.
    pub superuser: String,
    /// The replication role's password.
    pub replication: String,
}

impl std::fmt::Debug for Secrets {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Secrets(..)")
    }
}

pub(crate) const SUPERUSER_FILE: &str = "superuser.password";
pub(crate) const REPLICATION_FILE: &str = "replication.password";
pub(crate) const PGPASS_FILE: &str = "pgpass";
const API_TOKEN_FILE: &str = "api-token";

impl Secrets {
    /// Fresh random passwords (32 alphanumerics, ~190 bits).
    pub fn generate() -> Secrets {
        let mut rng = rand::thread_rng();
        Secrets {
            superuser: Alphanumeric.sample_string(&mut rng, 32),
            replication: Alphanumeric.sample_string(&mut rng, 32),
        }
    }

    /// Writes the password files and the replication passfile, each with mode 0600. Each file
    /// is replaced whole (written aside, then renamed over): a reader — a walreceiver reading
    /// its passfile, an agent reloading the passwords — sees the old file or the new one,
    /// never a half-written one.
    pub fn save(&self, layout: &Layout, replication_user: &str) -> Result<(), ClusterError> {
        let dir = layout.secrets();
        std::fs::create_dir_all(&dir).map_err(|e| ClusterError::io("creating", &dir, e))?;
        std::fs::set_permissions(&dir, std::os::unix::fs::PermissionsExt::from_mode(0o700))
            .map_err(|e| ClusterError::io("restricting", &dir, e))?;
        replace_private(&dir.join(SUPERUSER_FILE), &format!("{}\n", self.superuser))?;
        replace_private(
            &dir.join(REPLICATION_FILE),
            &format!("{}\n", self.replication),
        )?;
        replace_private(
            &Self::pgpass(layout),
            &format!("*:*:*:{replication_user}:{}\n", self.replication),
        )
    }

    /// Reads the passwords back.
    pub fn load(layout: &Layout) -> Result<Secrets, ClusterError> {
        Self::load_named(layout, "")
    }

    /// Reads the passwords of the files named with `suffix` (`""`: the current ones).
    pub(crate) fn load_named(layout: &Layout, suffix: &str) -> Result<Secrets, ClusterError> {
        let read = |name: &str| {
            let path = layout.secrets().join(format!("{name}{suffix}"));
            std::fs::read_to_string(&path)
                .map(|s| s.trim().to_string())
                .map_err(|e| ClusterError::io("reading secret", path, e))
        };
        Ok(Secrets {
            superuser: read(SUPERUSER_FILE)?,
            replication: read(REPLICATION_FILE)?,
        })
    }

    /// The superuser password file (initdb's `--pwfile`).
    pub fn superuser_file(layout: &Layout) -> PathBuf {
        layout.secrets().join(SUPERUSER_FILE)
    }

    /// The libpq passfile replicas use to reach the primary.
    pub fn pgpass(layout: &Layout) -> PathBuf {
        layout.secrets().join(PGPASS_FILE)
    }

    /// The bearer token of the HTTP API (needed when it listens beyond 127.0.0.1).
    pub fn api_token_file(layout: &Layout) -> PathBuf {
        layout.secrets().join(API_TOKEN_FILE)
    }

    /// The API token, created (mode 0600) when there is none yet.
    pub fn ensure_api_token(layout: &Layout) -> Result<String, ClusterError> {
        if let Some(t) = Self::read_api_token(layout) {
            return Ok(t);
        }
        let token = Alphanumeric.sample_string(&mut rand::thread_rng(), 32);
        write_private(&Self::api_token_file(layout), &format!("{token}\n"))?;
        Ok(token)
    }

    /// The API token, when the file exists and is not empty.
    pub fn read_api_token(layout: &Layout) -> Option<String> {
        std::fs::read_to_string(Self::api_token_file(layout))
            .ok()
            .map(|t| t.trim().to_string())
            .filter(|t| !t.is_empty())
    }
}

fn write_private(path: &Path, text: &str) -> Result<(), ClusterError> {
    herd_pg::write_private(path, text).map_err(|e| ClusterError::io("writing", path, e))
}

/// Writes `path` (mode 0600) through a file beside it renamed over it: atomic for readers.
pub(crate) fn replace_private(path: &Path, text: &str) -> Result<(), ClusterError> {
    let mut aside = path.as_os_str().to_owned();
    aside.push(".tmp");
    let aside = PathBuf::from(aside);
    // A leftover from a write cut short may have another mode: start afresh.
    let _ = std::fs::remove_file(&aside);
    write_private(&aside, text)?;
    std::fs::rename(&aside, path).map_err(|e| ClusterError::io("renaming", &aside, e))
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt;

    use super::*;

    #[test]
    fn secrets_are_private_and_round_trip() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let layout = Layout::new(tmp.path());
        let s = Secrets::generate();
        assert_eq!(s.superuser.len(), 32);
        assert_ne!(s.superuser, s.replication);
        s.save(&layout, "replicator").expect("save");
        for f in [SUPERUSER_FILE, REPLICATION_FILE, PGPASS_FILE] {
            let mode = std::fs::metadata(layout.secrets().join(f))
                .expect("meta")
                .permissions()
                .mode();
            assert_eq!(mode & 0o777, 0o600, "{f}");
        }
        let mode = std::fs::metadata(layout.secrets())
            .expect("meta")
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o700);
        assert_eq!(Secrets::read_api_token(&layout), None);
        let token = Secrets::ensure_api_token(&layout).expect("token");
        assert_eq!(token.len(), 32);
        assert_eq!(Secrets::ensure_api_token(&layout).expect("again"), token);
        assert_eq!(Secrets::read_api_token(&layout), Some(token));
        let mode = std::fs::metadata(Secrets::api_token_file(&layout))
            .expect("meta")
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600);
        let back = Secrets::load(&layout).expect("load");
        assert_eq!(back.superuser, s.superuser);
        assert_eq!(format!("{back:?}"), "Secrets(..)");
    }
}
