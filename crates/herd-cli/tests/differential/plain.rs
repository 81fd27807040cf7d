//! One plain PostgreSQL 15 server, the reference the differential test compares Herd with:
//! initdb'd like Herd's nodes (UTF8, locale C.UTF-8, SCRAM) in a scratch directory, run as the
//! servers' OS user on a free port on 127.0.0.1, and stopped (immediate) when dropped.

use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::Command;

use herd_pg::{OsUser, Pg, PgBinaries};

/// The superuser's password of the throwaway server.
const PASSWORD: &str = "differential";

/// A running plain server; stopped and deleted on drop.
pub struct Plain {
    dir: tempfile::TempDir,
    pg: Pg,
    port: u16,
}

impl Plain {
    /// initdb + start; panics with the reason when the server cannot be made (a test failure).
    pub async fn start() -> Plain {
        let bins = PgBinaries::locate(None).expect("PostgreSQL 15 binaries");
        let user = OsUser::for_servers("postgres").expect("the servers' OS user");
        let pg = Pg::new(bins, user);
        let dir = herd_testkit::scratch_dir();
        let port = herd_testkit::free_port_block(1);
        let pwfile = dir.path().join("pw");
        std::fs::write(&pwfile, PASSWORD).expect("password file");
        pg.hand_over(dir.path()).expect("chown scratch dir");
        let data = dir.path().join("data");
        pg.initdb(&data, "postgres", &pwfile)
            .await
            .expect("initdb of the plain server");
        let conf = format!(
            "port = {port}\nlisten_addresses = '127.0.0.1'\nunix_socket_directories = '{}'\n\
             fsync = off\nsynchronous_commit = off\nmax_connections = 20\n",
            dir.path().display()
        );
        let mut all = std::fs::read_to_string(data.join("postgresql.conf")).expect("conf");
        all.push_str(&conf);
        std::fs::write(data.join("postgresql.conf"), all).expect("write conf");
        pg.start(&data, &dir.path().join("log"))
            .await
            .expect("starting the plain server");
        Plain { dir, pg, port }
    }

    /// A connection URL (the form `herd url` prints, which `common::raw` reads too).
    pub fn url(&self) -> String {
        format!(
            "postgresql://postgres:{PASSWORD}@127.0.0.1:{}/postgres",
            self.port
        )
    }

    fn data(&self) -> PathBuf {
        self.dir.path().join("data")
    }
}

impl Drop for Plain {
    fn drop(&mut self) {
        let mut cmd = Command::new(self.pg.binaries().program("pg_ctl"));
        cmd.args(["stop", "-m", "immediate", "-w", "-t", "30", "-D"])
            .arg(self.data());
        if let Some(u) = self.pg.os_user() {
            cmd.uid(u.uid()).gid(u.gid());
        }
        if let Err(e) = cmd.output() {
            eprintln!("stopping the plain server: {e}");
        }
    }
}
