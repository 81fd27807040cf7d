//! Writes a configuration as a commented `herd.toml` that lists every option with its default.

use std::fmt::Write;

use crate::Config;

/// Renders `config` as TOML with a comment above each key giving its meaning and default.
/// Parsing the output gives `config` back.
pub fn render(config: &Config) -> String {
    let d = Config::default();
    let c = config;
    let q = |s: &str| quote(s);
    // An empty string leaves the key commented out.
    let opt = |s: &str| {
        if s.is_empty() {
            String::new()
        } else {
            quote(s)
        }
    };
    let bindir = c
        .postgres
        .bindir
        .as_ref()
        .map(|p| q(&p.display().to_string()))
        .unwrap_or_default();
    // (section, key, help, value, default); an empty value leaves the key commented out.
    let entries: Vec<(&str, &str, &str, String, String)> = vec![
        ("cluster", "replicas", "Hot-standby replicas beside the primary.",
            c.cluster.replicas.to_string(), d.cluster.replicas.to_string()),
        ("cluster", "shards", "Shard groups, each a primary with its own replicas and failover (`herd group add` adds one).",
            c.cluster.shards.to_string(), d.cluster.shards.to_string()),
        ("cluster", "commit_mode", "When a commit is acknowledged: async | remote_write | on | remote_apply.",
            q(c.cluster.commit_mode.as_str()), q(d.cluster.commit_mode.as_str())),
        ("cluster", "sync_standbys",
            "Standbys that confirm each commit in the synchronous modes: \"ANY k\" (quorum) or \"FIRST k\".",
            q(&c.cluster.sync_standbys.to_string()), q(&d.cluster.sync_standbys.to_string())),
        ("network", "listen_address",
            "Address of every server and of Herd's API. Keep 127.0.0.1 unless you need remote access.",
            q(&c.network.listen_address.to_string()), q(&d.network.listen_address.to_string())),
        ("network", "port", "The cluster's endpoint; node i listens on port + 1 + i.",
            c.network.port.to_string(), d.network.port.to_string()),
        ("network", "api_port", "Herd's HTTP API (/status, /primary, /replica); 0 means port + 100.",
            c.network.api_port.to_string(), d.network.api_port.to_string()),
        ("postgres", "bindir",
            "Directory of the PostgreSQL 15 server programs; unset: PATH, pg_config --bindir, /usr/lib/postgresql/15/bin.",
            bindir, "unset".into()),
        ("postgres", "os_user", "OS user that runs the servers when Herd runs as root (created if absent).",
            q(&c.postgres.os_user), q(&d.postgres.os_user)),
        ("postgres", "shared_buffers", "PostgreSQL shared_buffers of each server.",
            q(&c.postgres.shared_buffers), q(&d.postgres.shared_buffers)),
        ("postgres", "max_connections", "PostgreSQL max_connections of each server.",
            c.postgres.max_connections.to_string(), d.postgres.max_connections.to_string()),
        ("postgres", "work_mem", "PostgreSQL work_mem of each server.",
            q(&c.postgres.work_mem), q(&d.postgres.work_mem)),
        ("postgres", "max_slot_wal_keep_size", "WAL a replication slot may retain for an absent replica.",
            q(&c.postgres.max_slot_wal_keep_size), q(&d.postgres.max_slot_wal_keep_size)),
        ("postgres", "wal_keep_size",
            "WAL each server keeps regardless of slots, so a former primary can rejoin by pg_rewind after a failover.",
            q(&c.postgres.wal_keep_size), q(&d.postgres.wal_keep_size)),
        ("postgres", "wal_level",
            "PostgreSQL wal_level: \"replica\", or \"logical\" for publications and logical replication (restart to apply).",
            q(&c.postgres.wal_level), q(&d.postgres.wal_level)),
        ("postgres", "wal_compression",
            "PostgreSQL wal_compression of full-page images: off | pglz | lz4 | zstd (`herd config set wal-compression`).",
            q(&c.postgres.wal_compression), q(&d.postgres.wal_compression)),
        ("supervisor", "probe_interval_ms", "How often each node is probed, in milliseconds.",
            c.supervisor.probe_interval_ms.to_string(), d.supervisor.probe_interval_ms.to_string()),
        ("supervisor", "restart_backoff_ms",
            "First delay before restarting a dead replica, doubled per failed attempt, in milliseconds.",
            c.supervisor.restart_backoff_ms.to_string(), d.supervisor.restart_backoff_ms.to_string()),
        ("supervisor", "ready_timeout_s", "How long `herd up` waits for every replica to stream, in seconds.",
            c.supervisor.ready_timeout_s.to_string(), d.supervisor.ready_timeout_s.to_string()),
        ("supervisor", "failover_timeout_ms", "How long the primary's postmaster may be gone before a replica is promoted, in milliseconds.",
            c.supervisor.failover_timeout_ms.to_string(), d.supervisor.failover_timeout_ms.to_string()),
        ("supervisor", "hung_timeout_ms", "How long a running but unresponsive primary may stay so before a replica is promoted, in milliseconds.",
            c.supervisor.hung_timeout_ms.to_string(), d.supervisor.hung_timeout_ms.to_string()),
        ("supervisor", "max_lag_on_failover", "async mode: how far behind the lost primary (bytes) a promoted replica may be.",
            c.supervisor.max_lag_on_failover.to_string(), d.supervisor.max_lag_on_failover.to_string()),
        ("proxy", "pool_mode", "When a server connection returns to its pool: \"transaction\" or \"session\".",
            q(c.proxy.pool_mode.as_str()), q(d.proxy.pool_mode.as_str())),
        ("proxy", "pool_size", "Server connections per node, user and database.",
            c.proxy.pool_size.to_string(), d.proxy.pool_size.to_string()),
        ("proxy", "pool_wait_ms", "How long a transaction may wait for a pooled connection when all are in use (then SQLSTATE 53300).",
            c.proxy.pool_wait_ms.to_string(), d.proxy.pool_wait_ms.to_string()),
        ("proxy", "consistency", "Default read consistency: session (read-your-writes) | bounded | eventual | primary.",
            q(c.proxy.consistency.as_str()), q(d.proxy.consistency.as_str())),
        ("proxy", "read_from_primary", "The primary also serves reads, balanced with the replicas (true | false).",
            c.proxy.read_from_primary.to_string(), d.proxy.read_from_primary.to_string()),
        ("proxy", "max_wait_ms", "session: how long a read may wait for a replica to replay the session's writes.",
            c.proxy.max_wait_ms.to_string(), d.proxy.max_wait_ms.to_string()),
        ("proxy", "max_staleness_ms", "bounded: how far behind (time) a replica may be.",
            c.proxy.max_staleness_ms.to_string(), d.proxy.max_staleness_ms.to_string()),
        ("proxy", "max_replica_lag_bytes", "A replica further behind (bytes of replay) leaves the read pool.",
            c.proxy.max_replica_lag_bytes.to_string(), d.proxy.max_replica_lag_bytes.to_string()),
        ("proxy", "max_replica_lag_ms", "A replica further behind (time) leaves the read pool.",
            c.proxy.max_replica_lag_ms.to_string(), d.proxy.max_replica_lag_ms.to_string()),
        ("proxy", "readmit_fraction", "A replica rejoins the read pool below this fraction of both limits.",
            format!("{:?}", c.proxy.readmit_fraction), format!("{:?}", d.proxy.readmit_fraction)),
        ("proxy", "poll_interval_ms", "How often replica positions are polled (at most 100 ms).",
            c.proxy.poll_interval_ms.to_string(), d.proxy.poll_interval_ms.to_string()),
        ("proxy", "max_message_bytes", "Largest protocol message accepted from a client.",
            c.proxy.max_message_bytes.to_string(), d.proxy.max_message_bytes.to_string()),
        ("proxy", "tls_cert_file", "PEM certificate (chain) for TLS with clients, relative to this file's directory; empty: no TLS.",
            opt(&c.proxy.tls_cert_file), q("")),
        ("proxy", "tls_key_file", "Its PEM private key, mode 0600.",
            opt(&c.proxy.tls_key_file), q("")),
        ("proxy", "tls_required", "Refuse clients that do not use TLS (true | false).",
            c.proxy.tls_required.to_string(), d.proxy.tls_required.to_string()),
        ("proxy", "server_tls", "TLS to the servers: auto (verify-full when secrets/ca.crt exists, else off) | verify-full | require | off.",
            q(&c.proxy.server_tls), q(&d.proxy.server_tls)),
        ("backup", "enabled",
            "Continuous WAL archiving and backups with pgBackRest (`herd backup`, `herd restore`); true | false.",
            c.backup.enabled.to_string(), d.backup.enabled.to_string()),
        ("backup", "repository",
            "pgBackRest repository directory, relative to this file's directory; empty: <data-dir>/backup-repo. Setting it enables backups. With [backup.s3], the path inside the bucket (default /herd).",
            opt(&c.backup.repository), q("")),
        ("backup", "retention_full", "Full backups kept; older ones and the WAL only they need expire after each backup.",
            c.backup.retention_full.to_string(), d.backup.retention_full.to_string()),
        ("backup", "archive_lag_warning_s",
            "Seconds a completed WAL segment may wait on the primary for archiving before herd status, /metrics and the dashboard report the archive as behind.",
            c.backup.archive_lag_warning_s.to_string(), d.backup.archive_lag_warning_s.to_string()),
        ("backup", "full_every_s",
            "Seconds between full backups of each shard group taken by the running cluster (herd up), one group at a time; 0: none. With no full backup yet, one is taken at once.",
            c.backup.full_every_s.to_string(), d.backup.full_every_s.to_string()),
        ("backup", "incr_every_s",
            "Seconds between incremental backups (since the group's newest backup of any type); 0: none.",
            c.backup.incr_every_s.to_string(), d.backup.incr_every_s.to_string()),
        ("backup", "replicas_from_repository",
            "Build a new replica (herd up) from the repository's newest backup (pgbackrest restore --type=standby) instead of pg_basebackup of the primary; pg_basebackup when the group has no backup yet. true | false.",
            c.backup.replicas_from_repository.to_string(), d.backup.replicas_from_repository.to_string()),
        ("dashboard", "bench_results",
            "A `herd bench --out` directory whose latest reports the dashboard shows, relative to this file's directory; empty: none.",
            opt(&c.dashboard.bench_results), q("")),
    ];
    let mut out = String::from(
        "# Herd cluster configuration. Every option is listed with its default.\n\
         # Command-line flags of `herd up` override these values and are saved here.\n\
         # Change commit_mode / sync_standbys / wal_compression at run time with `herd config set`.\n",
    );
    let mut current = "";
    for (section, key, help, value, default) in entries {
        if section != current {
            let _ = write!(out, "\n[{section}]\n");
            current = section;
        }
        let _ = writeln!(out, "# {help} (default: {default})");
        if value.is_empty() {
            let _ = writeln!(out, "# {key} = \"\"");
        } else {
            let _ = writeln!(out, "{key} = {value}");
        }
    }
    for (g, o) in &c.group {
        let _ = write!(
            out,
            "\n# Shard group {g}'s own commit settings (`herd config set --group {g}`).\n[group.{g}]\n"
        );
        if let Some(m) = o.commit_mode {
            let _ = writeln!(out, "commit_mode = {}", q(m.as_str()));
        }
        if let Some(s) = o.sync_standbys {
            let _ = writeln!(out, "sync_standbys = {}", q(&s.to_string()));
        }
    }
    if let Some(s3) = &c.backup.s3 {
        let _ = write!(
            out,
            "\n# The backup repository in an S3-compatible store (backup.repository is the path inside\n\
             # the bucket); credentials_file: the access key id, then the secret, one a line.\n[backup.s3]\n"
        );
        for (key, value) in [
            ("bucket", &s3.bucket),
            ("endpoint", &s3.endpoint),
            ("region", &s3.region),
            ("uri_style", &s3.uri_style),
            ("credentials_file", &s3.credentials_file),
        ] {
            let _ = writeln!(out, "{key} = {}", q(value));
        }
        let _ = writeln!(out, "verify_tls = {}", s3.verify_tls);
    }
    out
}

fn quote(s: &str) -> String {
    // TOML basic strings share JSON's escapes for the characters that can occur here.
    format!("\"{}\"", s.replace('\\', "\\\\").replace('"', "\\\""))
}

#[cfg(test)]
mod tests {
    use std::path::{Path, PathBuf};

    use super::*;

    #[test]
    fn rendering_round_trips_and_documents_defaults() {
        let mut c = Config::default();
        c.cluster.replicas = 3;
        c.cluster.commit_mode = herd_core::CommitMode::RemoteApply;
        c.postgres.bindir = Some(PathBuf::from("/opt/pg/bin"));
        c.postgres.wal_level = "logical".into();
        c.postgres.wal_compression = "lz4".into();
        c.cluster.shards = 3;
        c.backup.repository = "/srv/herd-backups".into();
        c.backup.retention_full = 4;
        c.set_for_group(2, "commit-mode", "async")
            .expect("per group");
        c.set_for_group(1, "sync-standbys", "ANY 2")
            .expect("per group");
        assert!(
            c.set_for_group(3, "commit-mode", "on").is_err(),
            "no group 3"
        );
        assert!(
            c.set_for_group(1, "sync-standbys", "ANY 4").is_err(),
            "3 replicas"
        );
        assert_eq!(
            c.for_group(2).cluster.commit_mode,
            herd_core::CommitMode::Async
        );
        assert_eq!(
            c.for_group(1).cluster.commit_mode,
            herd_core::CommitMode::RemoteApply
        );
        assert_eq!(c.for_group(1).cluster.sync_standbys.count, 2);
        assert_eq!(c.for_group(0), c);
        let text = render(&c);
        assert!(
            text.contains("[group.2]\ncommit_mode = \"async\""),
            "{text}"
        );
        assert!(text.contains("wal_level = \"logical\""), "{text}");
        assert!(text.contains("(default: \"off\")"), "{text}");
        assert!(text.contains("(default: \"on\")"), "{text}");
        assert!(text.contains("replicas = 3"), "{text}");
        assert!(
            text.contains("[backup]\n") && text.contains("retention_full = 4"),
            "{text}"
        );
        let back = Config::parse(&text, Path::new("herd.toml")).expect("valid");
        assert_eq!(back, c);
        c.backup.repository = "/herd/main".into();
        c.backup.s3 = Some(crate::S3Config {
            bucket: "b".into(),
            endpoint: "minio.internal:9000".into(),
            region: "us-east-1".into(),
            uri_style: "path".into(),
            credentials_file: "s3.key".into(),
            verify_tls: false,
        });
        let text = render(&c);
        assert!(text.contains("[backup.s3]\nbucket = \"b\""), "{text}");
        let back = Config::parse(&text, Path::new("herd.toml")).expect("valid with S3");
        assert_eq!(back, c);
        let defaults = render(&Config::default());
        assert!(defaults.contains("# bindir = \"\""), "{defaults}");
        assert_eq!(
            Config::parse(&defaults, Path::new("x")).expect("valid"),
            Config::default()
        );
    }
}
