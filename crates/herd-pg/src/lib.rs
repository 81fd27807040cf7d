//! Runs PostgreSQL 15's programs (initdb, pg_ctl, pg_basebackup) as the right OS user, writes
//! their configuration, and probes running servers over SQL. No other Herd crate starts a
//! PostgreSQL program or touches a server's configuration files.

mod archiver;
mod bin;
mod conf;
mod ctl;
mod datadir;
mod error;
mod files;
mod osuser;
mod probe;
mod slotfile;
mod tls;

pub use archiver::ArchiverRow;
pub use bin::{PgBinaries, PG_MAJOR};
pub use conf::{
    render_hba, render_hba_with, render_server_conf, render_server_conf_with, replication_conninfo,
    socket_dir_fits, socket_path, verify_full, write_node_conf, write_node_conf_with, PeerTls,
    ServerSettings, ServerTls, Upstream, HERD_CONF,
};
pub use ctl::log_tail;
pub use ctl::{Pg, StopMode};
pub use datadir::{
    check_data_dir, clear_recovery_signals, kill_server, postmaster_pid, DataDirState,
};
pub use error::PgError;
pub use files::write_private;
pub use osuser::OsUser;
pub use probe::{
    checkpoint, connect, copy_verifier, create_physical_slot, ensure_role, ensure_role_verifier,
    probe, probe_shared, scram_verifier, ConnSpec, PrimaryProbe, Probe, Prober, ReplicaProbe,
    ReplicationRow, SharedProber, PROBE_APPLICATION,
};
pub use tls::{connect_config, ClientTls, TlsMode};
