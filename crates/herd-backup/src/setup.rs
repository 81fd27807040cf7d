//! pgBackRest's configuration for one Herd data directory: where its files live, the stanza of
//! each shard group, and writing `pgbackrest.conf` (mode 0600, owned by the servers' OS user,
//! who runs `archive-push` from PostgreSQL's `archive_command`).
//!
//! Nothing in it depends on which node is primary, so a failover or a switchover needs no
//! rewrite: each stanza lists every node of its group (`pg1-*` … `pgN-*`) and pgBackRest's
//! `backup`, `check` and `stanza-create` connect to each and use the one that is primary; each
//! node's `archive_command` names its own data directory (`--pg1-path`), which `archive-push`
//! needs to resolve PostgreSQL's relative `%p`.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use herd_pg::OsUser;

use crate::BackupError;

/// Where pgBackRest's own files live inside a data directory:
///
/// ```text
/// backup/pgbackrest.conf   written by Herd (mode 0600)
/// backup/restore-points.tsv the restore points `herd backup restore-point` made
/// logs/pgbackrest/         pgBackRest's logs, one file per stanza and command
/// run/pgbackrest/          its lock files (one backup at a time per stanza)
/// ```
#[derive(Clone, Debug)]
pub struct Paths {
    root: PathBuf,
}

impl Paths {
    /// The paths of the data directory `root` (absolute).
    pub fn new(root: impl Into<PathBuf>) -> Paths {
        Paths { root: root.into() }
    }

    /// The directory holding `pgbackrest.conf`.
    pub fn dir(&self) -> PathBuf {
        self.root.join("backup")
    }

    /// `pgbackrest.conf`.
    pub fn config(&self) -> PathBuf {
        self.dir().join("pgbackrest.conf")
    }

    /// The restore points `herd backup restore-point` made (see [`crate::RestorePoint`]).
    pub fn restore_points(&self) -> PathBuf {
        self.dir().join("restore-points.tsv")
    }

    /// pgBackRest's log directory.
    pub fn logs(&self) -> PathBuf {
        self.root.join("logs").join("pgbackrest")
    }

    /// pgBackRest's lock directory (its default, /tmp/pgbackrest, is shared by every cluster of
    /// the machine).
    pub fn locks(&self) -> PathBuf {
        self.root.join("run").join("pgbackrest")
    }
}

/// The stanza of shard group `group`: each group is its own PostgreSQL cluster (own system
/// identifier, own WAL), so each has its own stanza in the shared repository.
pub fn stanza(group: u32) -> String {
    format!("herd-g{group}")
}

/// PostgreSQL's `archive_command` for the node whose data directory is `pg_path`, of shard
/// group `group`, with the configuration at `config`. `archive-push` resolves PostgreSQL's
/// relative `%p` against `pg1-path` and refuses a `pg1-path` other than the server's own
/// directory, so the command names it: the configuration file stays the same for every node.
pub fn archive_command(config: &Path, group: u32, pg_path: &Path) -> String {
    format!(
        "pgbackrest --config={} --stanza={} --pg1-path={} archive-push %p",
        sh_quote(&config.display().to_string()),
        stanza(group),
        sh_quote(&pg_path.display().to_string())
    )
}

/// PostgreSQL's `restore_command` during a restore from the repository named in `config`.
pub fn restore_command(config: &Path, group: u32) -> String {
    format!(
        "pgbackrest --config={} --stanza={} archive-get %f \"%p\"",
        sh_quote(&config.display().to_string()),
        stanza(group)
    )
}

/// One node of a shard group, as pgBackRest reaches it.
#[derive(Clone, Debug, PartialEq)]
pub struct PgNode {
    /// Its data directory.
    pub path: PathBuf,
    /// Its port.
    pub port: u16,
}

/// One shard group's nodes, as pgBackRest reaches them: whichever is primary is found at run
/// time, so the stanza needs no rewrite after a failover or a switchover.
#[derive(Clone, Debug, PartialEq)]
pub struct Stanza {
    /// The shard group.
    pub group: u32,
    /// Every node of the group, node 0 first.
    pub nodes: Vec<PgNode>,
    /// The servers' Unix-domain socket directory (pgBackRest connects over the socket only).
    pub socket_dir: Option<PathBuf>,
}

/// A repository in an S3-compatible object store (`repo1-type=s3`): [`Setup::repository`] is
/// then the path inside the bucket.
#[derive(Clone, Debug, PartialEq)]
pub struct S3Repo {
    /// `repo1-s3-bucket`.
    pub bucket: String,
    /// `repo1-s3-endpoint` (a host name, optionally `:port`).
    pub endpoint: String,
    /// `repo1-s3-region`.
    pub region: String,
    /// `repo1-s3-uri-style`: `host` or `path`.
    pub uri_style: String,
    /// `repo1-s3-key`: the access key id.
    pub key: String,
    /// `repo1-s3-key-secret` (pgbackrest.conf is 0600, readable by the servers' user only).
    pub key_secret: String,
    /// `repo1-storage-verify-tls`.
    pub verify_tls: bool,
}

/// Everything `pgbackrest.conf` says.
#[derive(Clone, Debug)]
pub struct Setup {
    /// The data directory's paths.
    pub paths: Paths,
    /// The repository directory (with [`Setup::s3`], the path inside the bucket).
    pub repository: PathBuf,
    /// The repository is in an object store rather than a directory.
    pub s3: Option<S3Repo>,
    /// Full backups kept.
    pub retention_full: u32,
    /// One per shard group.
    pub stanzas: Vec<Stanza>,
}

impl Setup {
    /// The text of `pgbackrest.conf`.
    pub fn render(&self) -> String {
        let mut out = String::from(
            "# Written by Herd from herd.toml's [backup]; edits are overwritten.\n[global]\n",
        );
        let mut set = |key: &str, value: String| {
            let _ = writeln!(out, "{key}={value}");
        };
        set("repo1-path", self.repository.display().to_string());
        if let Some(s3) = &self.s3 {
            set("repo1-type", "s3".into());
            set("repo1-s3-bucket", s3.bucket.clone());
            set("repo1-s3-endpoint", s3.endpoint.clone());
            set("repo1-s3-region", s3.region.clone());
            set("repo1-s3-uri-style", s3.uri_style.clone());
            set("repo1-s3-key", s3.key.clone());
            set("repo1-s3-key-secret", s3.key_secret.clone());
            if !s3.verify_tls {
                set("repo1-storage-verify-tls", "n".into());
            }
        }
        set("repo1-retention-full", self.retention_full.to_string());
        set("log-path", self.paths.logs().display().to_string());
        set("lock-path", self.paths.locks().display().to_string());
        set("log-level-file", "info".into());
        // A backup starts with an immediate checkpoint rather than waiting for the next
        // scheduled one (up to checkpoint_timeout, 5 minutes by default).
        set("start-fast", "y".into());
        set("process-max", "2".into());
        // lz4 rather than pgBackRest's default gz: gz held a backup to about 30 MB/s on two
        // cores (`herd bench backup`), where lz4 compresses several times faster for a
        // somewhat larger repository. Backups and WAL already in the repository keep the
        // compression they were written with (pgBackRest records it per file).
        set("compress-type", "lz4".into());
        for s in &self.stanzas {
            let _ = write!(out, "\n[{}]\n", stanza(s.group));
            for (i, node) in s.nodes.iter().enumerate() {
                let n = i + 1;
                let _ = writeln!(out, "pg{n}-path={}", node.path.display());
                let _ = writeln!(out, "pg{n}-port={}", node.port);
                if let Some(dir) = &s.socket_dir {
                    let _ = writeln!(out, "pg{n}-socket-path={}", dir.display());
                }
                // Herd's superuser (herd-cluster's SUPERUSER), whom initdb created.
                let _ = writeln!(out, "pg{n}-user=postgres");
            }
        }
        out
    }

    /// Creates the directories pgBackRest uses (the repository included) and writes
    /// `pgbackrest.conf`, everything owned by `owner` (the servers' OS user) when Herd runs as
    /// root. Fails naming the repository when it cannot be created or written.
    pub fn write(&self, owner: Option<&OsUser>) -> Result<(), BackupError> {
        self.write_to(&self.paths.config(), owner)
    }

    /// As [`Setup::write`], the configuration written to `path` (a restore reads its source
    /// repository through a configuration of its own).
    pub fn write_to(&self, path: &Path, owner: Option<&OsUser>) -> Result<(), BackupError> {
        for dir in [self.paths.dir(), self.paths.logs(), self.paths.locks()] {
            create_private_dir(&dir)?;
            hand_over(owner, &dir)?;
        }
        let unwritable = |detail: String| BackupError::RepositoryUnwritable {
            path: self.repository.clone(),
            user: owner
                .map(|u| format!(" by user {}", u.name()))
                .unwrap_or_default(),
            detail,
        };
        if self.s3.is_some() {
            // Nothing local to create: pgBackRest reaches the bucket itself (`stanza-create`
            // and `check` report a wrong key or an unreachable endpoint).
            herd_pg::write_private(path, &self.render())
                .map_err(|e| BackupError::io("writing", path, e))?;
            return hand_over(owner, path);
        }
        if !self.repository.exists() {
            std::fs::create_dir_all(&self.repository)
                .map_err(|e| unwritable(format!("cannot create it ({e})")))?;
            std::fs::set_permissions(
                &self.repository,
                std::os::unix::fs::PermissionsExt::from_mode(0o750),
            )
            .map_err(|e| unwritable(format!("cannot restrict it ({e})")))?;
            hand_over(owner, &self.repository)?;
        }
        if !writable(&self.repository, owner) {
            return Err(unwritable(
                "give it to that user (chown -R), or choose another backup.repository".into(),
            ));
        }
        herd_pg::write_private(path, &self.render())
            .map_err(|e| BackupError::io("writing", path, e))?;
        hand_over(owner, path)
    }
}

fn hand_over(owner: Option<&OsUser>, path: &Path) -> Result<(), BackupError> {
    match owner {
        Some(u) => Ok(u.chown_tree(path)?),
        None => Ok(()),
    }
}

/// Whether `owner` (or this process) may create files in `dir`.
fn writable(dir: &Path, owner: Option<&OsUser>) -> bool {
    use std::os::unix::process::CommandExt;
    let path = dir.display().to_string();
    let mut cmd = std::process::Command::new("test");
    cmd.args(["-d", &path, "-a", "-w", &path, "-a", "-x", &path]);
    if let Some(u) = owner {
        cmd.uid(u.uid()).gid(u.gid());
    }
    cmd.status().map(|s| s.success()).unwrap_or(false)
}

fn create_private_dir(dir: &Path) -> Result<(), BackupError> {
    use std::os::unix::fs::DirBuilderExt;
    match std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
    {
        Ok(()) => Ok(()),
        Err(e) => Err(BackupError::io("creating", dir, e)),
    }
}

/// `text` as one word of a POSIX shell command (PostgreSQL runs `archive_command` with sh).
fn sh_quote(text: &str) -> String {
    if !text.is_empty()
        && text
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "/._-+,:@".contains(c))
    {
        text.to_string()
    } else {
        format!("'{}'", text.replace('\'', "'\\''"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn setup(root: &Path) -> Setup {
        Setup {
            paths: Paths::new(root),
            repository: root.join("backup-repo"),
            s3: None,
            retention_full: 2,
            stanzas: vec![Stanza {
                group: 0,
                nodes: vec![
                    PgNode {
                        path: root.join("nodes/node0"),
                        port: 7433,
                    },
                    PgNode {
                        path: root.join("nodes/node1"),
                        port: 7434,
                    },
                ],
                socket_dir: Some(root.join("sockets")),
            }],
        }
    }

    #[test]
    fn config_names_repository_stanza_and_primary() {
        let text = setup(Path::new("/d")).render();
        for line in [
            "repo1-path=/d/backup-repo",
            "repo1-retention-full=2",
            "log-path=/d/logs/pgbackrest",
            "lock-path=/d/run/pgbackrest",
            "start-fast=y",
            "compress-type=lz4",
            "[herd-g0]",
            "pg1-path=/d/nodes/node0",
            "pg1-port=7433",
            "pg1-socket-path=/d/sockets",
            "pg2-path=/d/nodes/node1",
            "pg2-port=7434",
            "pg2-user=postgres",
        ] {
            assert!(text.lines().any(|l| l == line), "missing {line} in\n{text}");
        }
    }

    #[test]
    fn an_s3_repository_is_configured_for_pgbackrest() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let mut s = setup(tmp.path());
        s.repository = PathBuf::from("/herd/main");
        s.s3 = Some(S3Repo {
            bucket: "herd-backups".into(),
            endpoint: "minio.internal:9000".into(),
            region: "us-east-1".into(),
            uri_style: "path".into(),
            key: "AKIAEXAMPLE".into(),
            key_secret: "wJalr/EXAMPLEKEY".into(),
            verify_tls: false,
        });
        let text = s.render();
        for line in [
            "repo1-path=/herd/main",
            "repo1-type=s3",
            "repo1-s3-bucket=herd-backups",
            "repo1-s3-endpoint=minio.internal:9000",
            "repo1-s3-region=us-east-1",
            "repo1-s3-uri-style=path",
            "repo1-s3-key=AKIAEXAMPLE",
            "repo1-s3-key-secret=wJalr/EXAMPLEKEY",
            "repo1-storage-verify-tls=n",
            "[herd-g0]",
        ] {
            assert!(text.lines().any(|l| l == line), "missing {line} in\n{text}");
        }
        // Written without creating anything named like the bucket's path locally; 0600.
        s.write(None).expect("write");
        assert!(!Path::new("/herd/main").exists());
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(s.paths.config())
            .expect("config")
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600);
        s.s3.as_mut().expect("s3").verify_tls = true;
        assert!(!s.render().contains("verify-tls"));
    }

    #[test]
    fn archive_command_quotes_odd_paths() {
        assert_eq!(
            archive_command(
                Path::new("/d/backup/pgbackrest.conf"),
                1,
                Path::new("/d/nodes/g1-node2")
            ),
            "pgbackrest --config=/d/backup/pgbackrest.conf --stanza=herd-g1 \
             --pg1-path=/d/nodes/g1-node2 archive-push %p"
        );
        assert_eq!(
            archive_command(
                Path::new("/my data/it's/b.conf"),
                0,
                Path::new("/my data/n0")
            ),
            "pgbackrest --config='/my data/it'\\''s/b.conf' --stanza=herd-g0 \
             --pg1-path='/my data/n0' archive-push %p"
        );
    }

    #[test]
    fn writing_creates_a_private_config_and_the_repository() {
        use std::os::unix::fs::PermissionsExt;
        let tmp = tempfile::tempdir().expect("tempdir");
        let s = setup(tmp.path());
        s.write(None).expect("write");
        let mode = std::fs::metadata(s.paths.config())
            .expect("config")
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600);
        assert!(s.repository.is_dir() && s.paths.logs().is_dir());
        s.write(None).expect("idempotent");
    }

    #[test]
    fn an_impossible_repository_is_named() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let file = tmp.path().join("a-file");
        std::fs::write(&file, "").expect("write");
        let mut s = setup(tmp.path());
        s.repository = file.join("repo");
        let err = s.write(None).expect_err("under a file").to_string();
        assert!(err.contains(&s.repository.display().to_string()), "{err}");
    }
}
