//! The files of a password rotation (`herd secrets rotate`, issue #42).
//!
//! The next passwords are written to `secrets/<name>.next` (mode 0600) before any server is
//! changed; the servers are changed; then each current file is replaced by its next one
//! (atomically) and the `.next` files are removed last. A rotation cut at any point is
//! finished by running it again: it finds both `.next` files and applies the same passwords
//! (changing a role's password to the one it has is harmless), logging in with the current
//! password or, on a server a cut-short run already changed, with the next one.

use crate::secrets::{replace_private, REPLICATION_FILE, SUPERUSER_FILE};
use crate::{ClusterError, Layout, Secrets};

const NEXT: &str = ".next";

/// A rotation under way: the passwords in use and the ones replacing them.
#[derive(Debug)]
pub struct Rotation {
    /// The passwords of `secrets/` now.
    pub current: Secrets,
    /// The passwords being put in place.
    pub next: Secrets,
    /// The next passwords were found in `.next` files: a rotation cut short is finished.
    pub resumed: bool,
}

/// How a rotation starts, from which `.next` files exist.
#[derive(Debug, PartialEq, Eq)]
enum Start {
    /// Both are there: the servers may hold them already; apply them again.
    Resume,
    /// None or one (a run cut while writing them, before any server changed): new passwords.
    Fresh,
}

fn start(superuser_next: bool, replication_next: bool) -> Start {
    if superuser_next && replication_next {
        Start::Resume
    } else {
        Start::Fresh
    }
}

impl Rotation {
    /// Begins a rotation in `layout`'s secrets, or resumes the one cut short there. Fresh
    /// passwords are written to the `.next` files before this returns.
    pub fn begin(layout: &Layout) -> Result<Rotation, ClusterError> {
        let current = Secrets::load(layout)?;
        let dir = layout.secrets();
        let exists = |name: &str| dir.join(format!("{name}{NEXT}")).exists();
        match start(exists(SUPERUSER_FILE), exists(REPLICATION_FILE)) {
            Start::Resume => Ok(Rotation {
                current,
                next: Secrets::load_named(layout, NEXT)?,
                resumed: true,
            }),
            Start::Fresh => Rotation::stage(layout, current, Secrets::generate()),
        }
    }

    /// A rotation to `next`, given (across hosts: the passwords the store carries): they are
    /// written to the `.next` files (0600) before this returns.
    pub fn stage(
        layout: &Layout,
        current: Secrets,
        next: Secrets,
    ) -> Result<Rotation, ClusterError> {
        let dir = layout.secrets();
        replace_private(
            &dir.join(format!("{SUPERUSER_FILE}{NEXT}")),
            &format!("{}\n", next.superuser),
        )?;
        replace_private(
            &dir.join(format!("{REPLICATION_FILE}{NEXT}")),
            &format!("{}\n", next.replication),
        )?;
        Ok(Rotation {
            current,
            next,
            resumed: false,
        })
    }

    /// The passwords of both `.next` files, when both are there.
    pub fn staged(layout: &Layout) -> Option<Secrets> {
        Secrets::load_named(layout, NEXT).ok()
    }

    /// Removes the `.next` files left by a rotation this host has finished otherwise (missing
    /// ones are fine).
    pub fn forget_staged(layout: &Layout) -> Result<(), ClusterError> {
        for name in [SUPERUSER_FILE, REPLICATION_FILE] {
            let path = layout.secrets().join(format!("{name}{NEXT}"));
            match std::fs::remove_file(&path) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => return Err(ClusterError::io("removing", &path, e)),
            }
        }
        Ok(())
    }

    /// The superuser passwords to log in with, in order: the current one, then the next one
    /// (a server changed by a run cut short before the files were replaced).
    pub fn logins(&self) -> Vec<&str> {
        let mut out = vec![self.current.superuser.as_str()];
        if self.next.superuser != self.current.superuser {
            out.push(self.next.superuser.as_str());
        }
        out
    }

    /// Once every server has the next passwords: they become the current files (each
    /// replaced atomically, the replication passfile included), then the `.next` files go.
    pub fn finish(&self, layout: &Layout, replication_user: &str) -> Result<(), ClusterError> {
        self.next.save(layout, replication_user)?;
        Rotation::forget_staged(layout)
    }
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt;

    use super::*;

    #[test]
    fn resumes_only_with_both_next_files() {
        for (superuser, replication, expected) in [
            (false, false, Start::Fresh),
            (true, false, Start::Fresh),
            (false, true, Start::Fresh),
            (true, true, Start::Resume),
        ] {
            assert_eq!(
                start(superuser, replication),
                expected,
                "{superuser} {replication}"
            );
        }
    }

    fn mode(path: &std::path::Path) -> u32 {
        std::fs::metadata(path).expect("meta").permissions().mode() & 0o777
    }

    #[test]
    fn a_rotation_cut_short_is_resumed_with_the_same_passwords() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let layout = Layout::new(tmp.path());
        let old = Secrets::generate();
        old.save(&layout, "replicator").expect("save");

        let first = Rotation::begin(&layout).expect("begin");
        assert!(!first.resumed);
        assert_eq!(first.current, old);
        assert_ne!(first.next.superuser, old.superuser);
        assert_ne!(first.next.replication, old.replication);
        assert_eq!(
            first.logins(),
            [old.superuser.as_str(), &first.next.superuser]
        );
        for name in [SUPERUSER_FILE, REPLICATION_FILE] {
            assert_eq!(mode(&layout.secrets().join(format!("{name}{NEXT}"))), 0o600);
        }
        // Cut here (servers possibly changed, files not): the next run applies the same ones.
        let again = Rotation::begin(&layout).expect("resume");
        assert!(again.resumed);
        assert_eq!(again.next, first.next);
        assert_eq!(
            Secrets::load(&layout).expect("load"),
            old,
            "not replaced yet"
        );

        again.finish(&layout, "replicator").expect("finish");
        assert_eq!(Secrets::load(&layout).expect("load"), first.next);
        for name in [SUPERUSER_FILE, REPLICATION_FILE, "pgpass"] {
            assert_eq!(mode(&layout.secrets().join(name)), 0o600, "{name}");
            let aside = layout.secrets().join(format!("{name}.tmp"));
            assert!(!aside.exists(), "{name}.tmp left behind");
        }
        let pgpass = std::fs::read_to_string(Secrets::pgpass(&layout)).expect("pgpass");
        assert_eq!(
            pgpass,
            format!("*:*:*:replicator:{}\n", first.next.replication)
        );
        // Done: the next rotation starts afresh from the new passwords.
        let later = Rotation::begin(&layout).expect("later");
        assert!(!later.resumed);
        assert_eq!(later.current, first.next);
        assert_ne!(later.next, first.next);
    }

    #[test]
    fn no_secrets_is_an_error() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let err = Rotation::begin(&Layout::new(tmp.path())).expect_err("no secrets");
        assert!(err.to_string().contains("superuser.password"), "{err}");
    }
}
