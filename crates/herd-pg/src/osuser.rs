//! The unprivileged OS user that runs the servers when Herd runs as root (PostgreSQL refuses root).

use std::path::Path;
use std::process::Command;

use nix::unistd::{Gid, Uid, User};

use crate::PgError;

/// An OS account the PostgreSQL programs are run as.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OsUser {
    name: String,
    uid: Uid,
    gid: Gid,
}

impl OsUser {
    /// The user to run servers as: `None` (the current user) unless Herd runs as root, in which
    /// case `name` is looked up and created as a system user when absent.
    pub fn for_servers(name: &str) -> Result<Option<OsUser>, PgError> {
        if !Uid::effective().is_root() {
            return Ok(None);
        }
        if let Some(user) = lookup(name)? {
            return Ok(Some(user));
        }
        let out = Command::new("useradd")
            .args([
                "--system",
                "--user-group",
                "--no-create-home",
                "--shell",
                "/usr/sbin/nologin",
                name,
            ])
            .output()
            .map_err(|e| PgError::OsUser {
                user: name.into(),
                detail: format!("cannot run useradd: {e}"),
            })?;
        if !out.status.success() {
            return Err(PgError::OsUser {
                user: name.into(),
                detail: format!(
                    "useradd failed: {}; create the user yourself or set postgres.os_user",
                    String::from_utf8_lossy(&out.stderr).trim()
                ),
            });
        }
        lookup(name)?.map(Some).ok_or_else(|| PgError::OsUser {
            user: name.into(),
            detail: "still absent after useradd".into(),
        })
    }

    /// The account's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Numeric user id.
    pub fn uid(&self) -> u32 {
        self.uid.as_raw()
    }

    /// Numeric primary group id.
    pub fn gid(&self) -> u32 {
        self.gid.as_raw()
    }

    /// Gives `path` and everything below it to this user.
    pub fn chown_tree(&self, path: &Path) -> Result<(), PgError> {
        let meta =
            std::fs::symlink_metadata(path).map_err(|e| PgError::io("inspecting", path, e))?;
        std::os::unix::fs::lchown(path, Some(self.uid()), Some(self.gid()))
            .map_err(|e| PgError::io("changing owner of", path, e))?;
        if meta.is_dir() {
            for entry in std::fs::read_dir(path).map_err(|e| PgError::io("listing", path, e))? {
                let entry = entry.map_err(|e| PgError::io("listing", path, e))?;
                self.chown_tree(&entry.path())?;
            }
        }
        Ok(())
    }

    /// Fails with advice when this user cannot reach and write `dir` (a parent directory without
    /// search permission for others, such as a 0700 home or temporary directory, is the usual cause).
    pub fn check_access(&self, dir: &Path) -> Result<(), PgError> {
        use std::os::unix::process::CommandExt;
        let ok = Command::new("test")
            .args([
                "-w",
                &dir.display().to_string(),
                "-a",
                "-x",
                &dir.display().to_string(),
            ])
            .uid(self.uid())
            .gid(self.gid())
            .status()
            .map(|s| s.success())
            .unwrap_or(false);
        if ok {
            Ok(())
        } else {
            Err(PgError::OsUser {
                user: self.name.clone(),
                detail: format!(
                    "cannot reach {} (PostgreSQL runs as this user because Herd runs as root). \
                     Choose a data directory whose parent directories others may enter (chmod o+x), e.g. under /var/lib or /srv.",
                    dir.display()
                ),
            })
        }
    }
}

fn lookup(name: &str) -> Result<Option<OsUser>, PgError> {
    let user = User::from_name(name).map_err(|e| PgError::OsUser {
        user: name.into(),
        detail: format!("lookup failed: {e}"),
    })?;
    Ok(user.map(|u| OsUser {
        name: name.into(),
        uid: u.uid,
        gid: u.gid,
    }))
}
