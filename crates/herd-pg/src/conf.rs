//! Server configuration written by Herd. initdb's `postgresql.conf` is kept and told to include
//! `herd.conf`, which Herd owns and rewrites whole (then reloads) whenever a setting changes.

use std::fmt::Write;
use std::net::IpAddr;
use std::path::{Path, PathBuf};

use crate::PgError;

/// Longest Unix-domain socket path the kernel accepts (`sun_path` is 108 bytes with its NUL).
const MAX_SOCKET_PATH: usize = 107;

/// The socket file a server on `port` creates in `dir` (libpq's and PostgreSQL's naming).
pub fn socket_path(dir: &Path, port: u16) -> PathBuf {
    dir.join(format!(".s.PGSQL.{port}"))
}

/// Whether sockets in `dir` fit the kernel's path limit for any port (and the `.lock` file
/// PostgreSQL keeps beside each socket is irrelevant to that limit).
pub fn socket_dir_fits(dir: &Path) -> bool {
    socket_path(dir, u16::MAX).as_os_str().len() <= MAX_SOCKET_PATH
}

/// The file Herd owns inside each node's data directory.
pub const HERD_CONF: &str = "herd.conf";

/// Everything that differs between Herd's nodes or comes from `herd.toml`.
#[derive(Clone, Debug, PartialEq)]
pub struct ServerSettings {
    /// `listen_addresses`.
    pub listen_address: IpAddr,
    /// `port`.
    pub port: u16,
    /// `unix_socket_directories`: where Herd's proxy reaches a node on this host without the
    /// cost of TCP loopback; `None` for TCP only.
    pub socket_dir: Option<PathBuf>,
    /// `shared_buffers`.
    pub shared_buffers: String,
    /// `max_connections`.
    pub max_connections: u32,
    /// `work_mem`.
    pub work_mem: String,
    /// `max_slot_wal_keep_size`.
    pub max_slot_wal_keep_size: String,
    /// `wal_keep_size`.
    pub wal_keep_size: String,
    /// `wal_level` ("replica" or "logical").
    pub wal_level: String,
    /// `wal_compression` ("off", "pglz", "lz4" or "zstd").
    pub wal_compression: String,
    /// `synchronous_commit`.
    pub synchronous_commit: String,
    /// `synchronous_standby_names`.
    pub synchronous_standby_names: String,
    /// Replicas only: `primary_conninfo` and `primary_slot_name`.
    pub upstream: Option<Upstream>,
    /// `archive_command` with `archive_mode = on` when WAL is archived (backups configured);
    /// `None` leaves archiving off, as PostgreSQL's defaults have it.
    pub archive_command: Option<String>,
}

/// Where a replica streams from.
#[derive(Clone, Debug, PartialEq)]
pub struct Upstream {
    /// libpq connection string to the primary (password from a passfile, never inline).
    pub conninfo: String,
    /// The replication slot reserved for this replica on the primary.
    pub slot: String,
}

/// A server's TLS files (issue #42, `herd agent` with a cluster CA): `ssl = on` with this
/// certificate and key (each mode 0600, owned by the servers' OS user, kept outside the data
/// directory so `pg_basebackup` never copies one host's key to another).
#[derive(Clone, Debug, PartialEq)]
pub struct ServerTls {
    /// `ssl_cert_file`.
    pub cert_file: PathBuf,
    /// `ssl_key_file`.
    pub key_file: PathBuf,
    /// `ssl_ca_file`: the cluster's CA, which client certificates must come from where
    /// `pg_hba.conf` asks for one (replication from other hosts).
    pub ca_file: PathBuf,
}

/// How a member connects to another over TLS: the cluster's CA to verify the server with,
/// and its own certificate and key, offered as a client certificate (libpq otherwise looks
/// for `~/.postgresql/postgresql.crt` of whatever HOME it inherited).
#[derive(Clone, Debug, PartialEq)]
pub struct PeerTls {
    /// The cluster's CA certificate (`sslrootcert`).
    pub ca_file: PathBuf,
    /// This member's certificate (`sslcert`).
    pub cert_file: PathBuf,
    /// Its key (`sslkey`).
    pub key_file: PathBuf,
}

impl PeerTls {
    /// libpq's settings as environment variables, for programs given a host and port.
    pub fn env(&self) -> [(&'static str, &Path); 3] {
        [
            ("PGSSLROOTCERT", &self.ca_file),
            ("PGSSLCERT", &self.cert_file),
            ("PGSSLKEY", &self.key_file),
        ]
    }
}

/// `conninfo` with the server's certificate checked against the cluster's CA and its names
/// against the host asked for (`sslmode=verify-full`): what replication, `pg_basebackup` and
/// `pg_rewind` connect with when the cluster has a CA.
pub fn verify_full(conninfo: &str, tls: &PeerTls) -> String {
    let q = |p: &Path| libpq_quote(&p.display().to_string());
    format!(
        "{conninfo} sslmode=verify-full sslrootcert='{}' sslcert='{}' sslkey='{}'",
        q(&tls.ca_file),
        q(&tls.cert_file),
        q(&tls.key_file)
    )
}

/// libpq's quoting inside single quotes: backslash before ' and \.
fn libpq_quote(value: &str) -> String {
    value.replace('\\', "\\\\").replace('\'', "\\'")
}

/// A replica's `primary_conninfo`: the primary at `host:port` as the replication `user`, the
/// password from `passfile`, `application_name` naming the standby in
/// `synchronous_standby_names`. libpq's keep-alives and TCP_USER_TIMEOUT end the walreceiver's
/// connection within ~11 s of a dead link (as [`render_server_conf`] bounds the walsender's),
/// so it reconnects within `wal_retrieve_retry_interval` of the link healing instead of
/// waiting out TCP's retransmission back-off.
pub fn replication_conninfo(
    host: &str,
    port: u16,
    user: &str,
    passfile: &Path,
    application_name: &str,
) -> String {
    let passfile = libpq_quote(&passfile.display().to_string());
    format!(
        "host={host} port={port} user={user} passfile='{passfile}' \
         application_name={application_name} connect_timeout=5 \
         keepalives=1 keepalives_idle=5 keepalives_interval=2 keepalives_count=3 \
         tcp_user_timeout=10000"
    )
}

/// Renders `herd.conf`.
pub fn render_server_conf(s: &ServerSettings) -> String {
    render_server_conf_with(s, None)
}

/// Renders `herd.conf`, serving TLS with `tls` when given.
pub fn render_server_conf_with(s: &ServerSettings, tls: Option<&ServerTls>) -> String {
    let mut out =
        String::from("# Written by Herd; edits are overwritten. Change herd.toml instead.\n");
    let mut set = |key: &str, value: &str| {
        let _ = writeln!(out, "{key} = {}", quote(value));
    };
    set("listen_addresses", &s.listen_address.to_string());
    set("port", &s.port.to_string());
    // The socket lives in the cluster's own directory (no clash with other clusters) and is
    // open to the servers' OS user only; SCRAM applies to every login on it as over TCP.
    match &s.socket_dir {
        Some(dir) => {
            set("unix_socket_directories", &dir.to_string_lossy());
            // An octal integer (PostgreSQL parses the leading 0).
            set("unix_socket_permissions", "0700");
        }
        None => set("unix_socket_directories", ""),
    }
    set("password_encryption", "scram-sha-256");
    set("max_connections", &s.max_connections.to_string());
    // Two-phase commit (PREPARE TRANSACTION) for applications and drivers that use it: as
    // many prepared transactions as connections. Standbys require at least the primary's
    // value, which every node shares.
    set("max_prepared_transactions", &s.max_connections.to_string());
    set("shared_buffers", &s.shared_buffers);
    set("work_mem", &s.work_mem);
    set("maintenance_work_mem", "64MB");
    set("effective_cache_size", "512MB");
    set("wal_level", &s.wal_level);
    set("wal_compression", &s.wal_compression);
    // pg_rewind needs hint bits WAL-logged to rejoin a former primary.
    set("wal_log_hints", "on");
    set("max_wal_senders", "16");
    set("max_replication_slots", "16");
    set("max_slot_wal_keep_size", &s.max_slot_wal_keep_size);
    // A cluster that receives logical copies runs one apply worker per copy plus one worker
    // per table being copied initially; PostgreSQL's default of 4 (out of the 8 background
    // workers) stalls the fourth copy's initial copy. Standbys need not match it.
    set("max_logical_replication_workers", "6");
    // A former primary rewound onto a member promoted moments ago replays from its last
    // checkpoint before the fork; the new primary's slot for it is newer than that, so only
    // kept WAL lets it stream (else it is cloned afresh).
    set("wal_keep_size", &s.wal_keep_size);
    set("max_wal_size", "1GB");
    set("hot_standby", "on");
    set("hot_standby_feedback", "on");
    set("recovery_prefetch", "try");
    // Frequent standby replies keep pg_stat_replication's positions and lag times fresh.
    set("wal_receiver_status_interval", "1s");
    // After a failover a replica is pointed at the new primary: retry streaming every second
    // rather than PostgreSQL's 5 s, so sync commits resume sooner.
    set("wal_retrieve_retry_interval", "1s");
    // A connection whose peer went away behind a cut link (no reset ever arrives) must die
    // within seconds, not linger under TCP's retransmission back-off (doubling from 0.2 s:
    // after a 12 s cut the next retry can come ~13 s after the link heals, and the sync
    // commits waiting on a walsender wait that long). Keep-alives probe an idle socket after
    // 5 s, every 2 s, 3 times; TCP_USER_TIMEOUT closes one with data unacknowledged for 10 s.
    // The replica's side of the same connection is bounded by `replication_conninfo`.
    set("tcp_keepalives_idle", "5");
    set("tcp_keepalives_interval", "2");
    set("tcp_keepalives_count", "3");
    set("tcp_user_timeout", "10000");
    // The walsender and walreceiver give up on a silent peer after 10 s (PostgreSQL: 60 s);
    // replicas report every second (wal_receiver_status_interval), so only a dead link is
    // silent that long.
    set("wal_sender_timeout", "10s");
    set("wal_receiver_timeout", "10s");
    set("synchronous_commit", &s.synchronous_commit);
    set("synchronous_standby_names", &s.synchronous_standby_names);
    set("log_line_prefix", "%m [%p] %q%u@%d ");
    if let Some(command) = &s.archive_command {
        // Every node gets it, replicas too: with `on` (not `always`) only the primary runs
        // the command, so a promoted replica starts archiving without a restart.
        set("archive_mode", "on");
        set("archive_command", command);
        // A quiet primary still ships its WAL within a minute: it bounds how far back the
        // newest restorable moment can lie.
        set("archive_timeout", "60s");
    }
    if let Some(up) = &s.upstream {
        set("primary_conninfo", &up.conninfo);
        set("primary_slot_name", &up.slot);
    }
    if let Some(tls) = tls {
        set("ssl", "on");
        set("ssl_cert_file", &tls.cert_file.to_string_lossy());
        set("ssl_key_file", &tls.key_file.to_string_lossy());
        set("ssl_ca_file", &tls.ca_file.to_string_lossy());
        set("ssl_min_protocol_version", "TLSv1.2");
    }
    out
}

/// Renders `pg_hba.conf`: SCRAM-SHA-256 for everyone (TCP and the cluster's private socket),
/// nothing trusted.
pub fn render_hba(listen_address: IpAddr, replication_user: &str) -> String {
    render_hba_with(listen_address, replication_user, false)
}

/// Renders `pg_hba.conf` as [`render_hba`]; with `cluster_tls` (the cluster has a CA), logins
/// from beyond loopback take TLS (`hostssl`): replication from a member holding a certificate of
/// the cluster's CA (`clientcert=verify-ca`: the certificate names its host, not the replication
/// role) besides the password, and every other role, the superuser included, over TLS: every
/// connection Herd makes from another host (proxies, agents, `herd-cli`'s tasks, postgres_fdw
/// and subscriptions between the servers) is verified TLS then. Loopback and the local socket
/// are unchanged.
pub fn render_hba_with(
    listen_address: IpAddr,
    replication_user: &str,
    cluster_tls: bool,
) -> String {
    let mut out = String::from(
        "# Written by Herd. SCRAM-SHA-256 for every user; no trust, no peer.\n\
         local all all scram-sha-256\n\
         host all all 127.0.0.1/32 scram-sha-256\n",
    );
    let _ = writeln!(
        out,
        "host replication {replication_user} 127.0.0.1/32 scram-sha-256"
    );
    if listen_address.is_loopback() {
        return out;
    }
    // The operator chose to listen beyond loopback: accept password logins from anywhere.
    if cluster_tls {
        out.push_str("hostssl all all 0.0.0.0/0 scram-sha-256\n");
        let _ = writeln!(
            out,
            "hostssl replication {replication_user} 0.0.0.0/0 scram-sha-256 clientcert=verify-ca"
        );
    } else {
        out.push_str("host all all 0.0.0.0/0 scram-sha-256\n");
        let _ = writeln!(
            out,
            "host replication {replication_user} 0.0.0.0/0 scram-sha-256"
        );
    }
    out
}

/// Writes `herd.conf` and `pg_hba.conf` into `datadir`, makes `postgresql.conf` include
/// `herd.conf`, and creates or removes `standby.signal` to match the role.
pub fn write_node_conf(
    datadir: &Path,
    settings: &ServerSettings,
    hba: &str,
) -> Result<(), PgError> {
    write_node_conf_with(datadir, settings, None, hba)
}

/// [`write_node_conf`], serving TLS with `tls` when given.
pub fn write_node_conf_with(
    datadir: &Path,
    settings: &ServerSettings,
    tls: Option<&ServerTls>,
    hba: &str,
) -> Result<(), PgError> {
    let write = |name: &str, text: &str| {
        let path = datadir.join(name);
        std::fs::write(&path, text).map_err(|e| PgError::io("writing", path, e))
    };
    write(HERD_CONF, &render_server_conf_with(settings, tls))?;
    write("pg_hba.conf", hba)?;
    let main = datadir.join("postgresql.conf");
    let text = std::fs::read_to_string(&main).map_err(|e| PgError::io("reading", &main, e))?;
    let include = format!("include '{HERD_CONF}'");
    if !text.lines().any(|l| l.trim() == include) {
        write("postgresql.conf", &format!("{text}\n{include}\n"))?;
    }
    let signal = datadir.join("standby.signal");
    if settings.upstream.is_some() {
        write("standby.signal", "")?;
    } else if signal.exists() {
        std::fs::remove_file(&signal).map_err(|e| PgError::io("removing", signal, e))?;
    }
    Ok(())
}

impl crate::Pg {
    /// [`write_node_conf`], then gives the files written to the servers' OS user.
    pub fn write_conf(
        &self,
        datadir: &Path,
        settings: &ServerSettings,
        hba: &str,
    ) -> Result<(), PgError> {
        self.write_conf_with(datadir, settings, None, hba)
    }

    /// [`write_node_conf_with`], then gives the files written to the servers' OS user.
    pub fn write_conf_with(
        &self,
        datadir: &Path,
        settings: &ServerSettings,
        tls: Option<&ServerTls>,
        hba: &str,
    ) -> Result<(), PgError> {
        write_node_conf_with(datadir, settings, tls, hba)?;
        for file in [
            HERD_CONF,
            "pg_hba.conf",
            "postgresql.conf",
            "standby.signal",
        ] {
            let path = datadir.join(file);
            if path.exists() {
                self.hand_over(&path)?;
            }
        }
        Ok(())
    }
}

/// A postgresql.conf string literal.
fn quote(value: &str) -> String {
    format!("'{}'", value.replace('\\', "\\\\").replace('\'', "''"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings() -> ServerSettings {
        ServerSettings {
            listen_address: IpAddr::from([127, 0, 0, 1]),
            port: 7433,
            socket_dir: None,
            shared_buffers: "128MB".into(),
            max_connections: 100,
            work_mem: "4MB".into(),
            max_slot_wal_keep_size: "2GB".into(),
            wal_keep_size: "256MB".into(),
            wal_level: "replica".into(),
            wal_compression: "off".into(),
            synchronous_commit: "on".into(),
            synchronous_standby_names: "ANY 1 (\"node1\", \"node2\")".into(),
            upstream: None,
            archive_command: None,
        }
    }

    #[test]
    fn primary_conf_has_replication_and_safety_settings() {
        let text = render_server_conf(&settings());
        for line in [
            "listen_addresses = '127.0.0.1'",
            "port = '7433'",
            "wal_log_hints = 'on'",
            "recovery_prefetch = 'try'",
            "synchronous_standby_names = 'ANY 1 (\"node1\", \"node2\")'",
            "unix_socket_directories = ''",
            "wal_level = 'replica'",
            "wal_compression = 'off'",
        ] {
            assert!(text.lines().any(|l| l == line), "missing {line} in\n{text}");
        }
        assert!(!text.contains("primary_conninfo"));
        assert!(!text.contains("archive_mode"), "no archiving unless asked");
    }

    #[test]
    fn archiving_is_on_with_a_command() {
        let mut s = settings();
        s.archive_command = Some("pgbackrest --stanza=herd-g0 archive-push %p".into());
        let text = render_server_conf(&s);
        for line in [
            "archive_mode = 'on'",
            "archive_command = 'pgbackrest --stanza=herd-g0 archive-push %p'",
        ] {
            assert!(text.lines().any(|l| l == line), "missing {line} in\n{text}");
        }
    }

    #[test]
    fn a_socket_dir_is_private_and_long_paths_do_not_fit() {
        let mut s = settings();
        s.socket_dir = Some(PathBuf::from("/data/herd/sockets"));
        let text = render_server_conf(&s);
        for line in [
            "unix_socket_directories = '/data/herd/sockets'",
            "unix_socket_permissions = '0700'",
        ] {
            assert!(text.lines().any(|l| l == line), "missing {line} in\n{text}");
        }
        assert_eq!(
            socket_path(Path::new("/s"), 5433),
            PathBuf::from("/s/.s.PGSQL.5433")
        );
        assert!(socket_dir_fits(Path::new(
            "/tmp/herd-test-abc/data/sockets"
        )));
        assert!(!socket_dir_fits(&PathBuf::from(format!(
            "/{}",
            "d".repeat(100)
        ))));
    }

    #[test]
    fn wal_level_and_compression_come_from_the_settings() {
        let mut s = settings();
        s.wal_level = "logical".into();
        s.wal_compression = "zstd".into();
        let text = render_server_conf(&s);
        for line in ["wal_level = 'logical'", "wal_compression = 'zstd'"] {
            assert!(text.lines().any(|l| l == line), "missing {line} in\n{text}");
        }
        assert_eq!(text.matches("wal_level").count(), 1, "{text}");
    }

    #[test]
    fn replica_conf_quotes_conninfo() {
        let mut s = settings();
        s.upstream = Some(Upstream {
            conninfo: "host=127.0.0.1 passfile='/a b/pgpass'".into(),
            slot: "node1".into(),
        });
        let text = render_server_conf(&s);
        assert!(
            text.contains("primary_conninfo = 'host=127.0.0.1 passfile=''/a b/pgpass'''"),
            "{text}"
        );
        assert!(text.contains("primary_slot_name = 'node1'"));
    }

    #[test]
    fn connections_die_within_seconds_of_a_dead_link() {
        let text = render_server_conf(&settings());
        for line in [
            "tcp_keepalives_idle = '5'",
            "tcp_keepalives_interval = '2'",
            "tcp_keepalives_count = '3'",
            "tcp_user_timeout = '10000'",
            "wal_sender_timeout = '10s'",
            "wal_receiver_timeout = '10s'",
        ] {
            assert!(text.lines().any(|l| l == line), "missing {line} in\n{text}");
        }
    }

    #[test]
    fn replication_conninfo_bounds_a_dead_link() {
        let c = replication_conninfo(
            "10.0.0.1",
            5432,
            "replicator",
            Path::new("/var/lib/herd/secrets/pgpass"),
            "h2",
        );
        assert_eq!(
            c,
            "host=10.0.0.1 port=5432 user=replicator passfile='/var/lib/herd/secrets/pgpass' \
             application_name=h2 connect_timeout=5 keepalives=1 keepalives_idle=5 \
             keepalives_interval=2 keepalives_count=3 tcp_user_timeout=10000"
        );
        // A quote in the path stays inside the value (libpq's backslash escapes).
        let odd = replication_conninfo("h", 1, "r", Path::new("/a'b\\c/pgpass"), "n");
        assert!(odd.contains("passfile='/a\\'b\\\\c/pgpass'"), "{odd}");
        // And the whole string survives postgresql.conf's quoting.
        let mut s = settings();
        s.upstream = Some(Upstream {
            conninfo: c.clone(),
            slot: "h2".into(),
        });
        let text = render_server_conf(&s);
        assert!(
            text.contains(&format!("primary_conninfo = '{}'", c.replace('\'', "''"))),
            "{text}"
        );
    }

    #[test]
    fn tls_serves_the_issued_certificate_and_replication_verifies_it() {
        let tls = ServerTls {
            cert_file: PathBuf::from("/d/tls/h1.crt"),
            key_file: PathBuf::from("/d/tls/h1.key"),
            ca_file: PathBuf::from("/d/secrets/ca.crt"),
        };
        let text = render_server_conf_with(&settings(), Some(&tls));
        for line in [
            "ssl = 'on'",
            "ssl_cert_file = '/d/tls/h1.crt'",
            "ssl_key_file = '/d/tls/h1.key'",
            "ssl_ca_file = '/d/secrets/ca.crt'",
            "ssl_min_protocol_version = 'TLSv1.2'",
        ] {
            assert!(text.lines().any(|l| l == line), "missing {line} in\n{text}");
        }
        assert!(
            !render_server_conf(&settings()).contains("ssl"),
            "no CA, no TLS"
        );
        let peer = PeerTls {
            ca_file: PathBuf::from("/d/secrets/ca'.crt"),
            cert_file: PathBuf::from("/d/tls/h1.crt"),
            key_file: PathBuf::from("/d/tls/h1.key"),
        };
        let c = verify_full("host=10.0.0.1 port=5432", &peer);
        assert_eq!(
            c,
            "host=10.0.0.1 port=5432 sslmode=verify-full sslrootcert='/d/secrets/ca\\'.crt' \
             sslcert='/d/tls/h1.crt' sslkey='/d/tls/h1.key'"
        );
        // Every login from other hosts over TLS only, the superuser's too; loopback unchanged.
        let wide = render_hba_with(IpAddr::from([10, 0, 0, 5]), "replicator", true);
        assert!(wide.contains(
            "\nhostssl replication replicator 0.0.0.0/0 scram-sha-256 clientcert=verify-ca\n"
        ));
        assert!(
            !wide.contains("\nhost replication replicator 0.0.0.0/0"),
            "{wide}"
        );
        assert!(wide.contains("\nhost replication replicator 127.0.0.1/32 scram-sha-256\n"));
        assert!(wide.contains("\nhostssl all all 0.0.0.0/0 scram-sha-256\n"));
        assert!(wide.contains("\nhost all all 127.0.0.1/32 scram-sha-256\n"));
        assert!(wide.contains("\nlocal all all scram-sha-256\n"));
        // Beyond loopback, no `host` line (TLS or not) for any role.
        let plain_wide: Vec<&str> = wide
            .lines()
            .filter(|l| l.starts_with("host ") && !l.contains("127.0.0.1/32"))
            .collect();
        assert!(plain_wide.is_empty(), "{plain_wide:?} in\n{wide}");
        assert_eq!(
            render_hba_with(IpAddr::from([10, 0, 0, 5]), "replicator", false),
            render_hba(IpAddr::from([10, 0, 0, 5]), "replicator")
        );
    }

    #[test]
    fn hba_never_trusts() {
        let local = render_hba(IpAddr::from([127, 0, 0, 1]), "replicator");
        assert!(local
            .lines()
            .filter(|l| !l.starts_with('#'))
            .all(|l| l.ends_with("scram-sha-256")));
        assert!(!local.contains("0.0.0.0/0"));
        let wide = render_hba(IpAddr::from([10, 0, 0, 5]), "replicator");
        assert!(wide.contains("0.0.0.0/0 scram-sha-256"));
    }

    #[test]
    fn writing_conf_is_idempotent_and_tracks_role() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let d = tmp.path();
        std::fs::write(d.join("postgresql.conf"), "# initdb\n").expect("write");
        let mut s = settings();
        s.upstream = Some(Upstream {
            conninfo: "host=x".into(),
            slot: "node1".into(),
        });
        write_node_conf(d, &s, "hba").expect("write");
        write_node_conf(d, &s, "hba").expect("write again");
        let main = std::fs::read_to_string(d.join("postgresql.conf")).expect("read");
        assert_eq!(main.matches("include 'herd.conf'").count(), 1);
        assert!(d.join("standby.signal").exists());
        s.upstream = None;
        write_node_conf(d, &s, "hba").expect("write as primary");
        assert!(!d.join("standby.signal").exists());
    }
}
