//! The rules across fields of a [`Config`] that a single value's type cannot express.

use crate::schema::*;
use crate::{Config, ConfigError};

impl Config {
    /// Checks the cross-field rules a single value's type cannot express.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let c = &self.cluster;
        if c.replicas > MAX_REPLICAS {
            return Err(ConfigError::invalid(
                "cluster.replicas",
                c.replicas,
                format!("0 to {MAX_REPLICAS}"),
            ));
        }
        if c.shards == 0 || c.shards > MAX_SHARDS {
            return Err(ConfigError::invalid(
                "cluster.shards",
                c.shards,
                format!("1 to {MAX_SHARDS}"),
            ));
        }
        if c.replicas > 0 && c.sync_standbys.count > c.replicas {
            // Commits would wait forever for standbys that do not exist.
            return Err(ConfigError::invalid(
                "cluster.sync_standbys",
                c.sync_standbys,
                format!("k must be at most the number of replicas ({})", c.replicas),
            ));
        }
        for (g, o) in &self.group {
            let key = format!("group.{g}");
            match g.parse::<u32>() {
                Ok(n) if n < MAX_SHARDS => {}
                _ => {
                    return Err(ConfigError::invalid(
                        "group",
                        g,
                        format!("a shard group number, 0 to {}", MAX_SHARDS - 1),
                    ))
                }
            }
            if let Some(s) = o
                .sync_standbys
                .filter(|s| c.replicas > 0 && s.count > c.replicas)
            {
                return Err(ConfigError::invalid(
                    &format!("{key}.sync_standbys"),
                    s,
                    format!("k must be at most the number of replicas ({})", c.replicas),
                ));
            }
        }
        let n = &self.network;
        let nodes = self.node_count();
        let last_node_port = u32::from(n.port) + nodes;
        if n.port < 1024 || last_node_port > u32::from(u16::MAX) {
            return Err(ConfigError::invalid(
                "network.port",
                n.port,
                format!(
                    "1024 to {}, leaving room for {nodes} node ports after it",
                    u16::MAX as u32 - nodes,
                ),
            ));
        }
        if n.api_port != 0
            && (n.api_port as u32) >= u32::from(n.port)
            && (n.api_port as u32) <= last_node_port
        {
            return Err(ConfigError::invalid(
                "network.api_port",
                n.api_port,
                format!(
                    "a port outside the node ports {}..={last_node_port}",
                    n.port
                ),
            ));
        }
        let p = &self.postgres;
        if p.max_connections < 10 {
            return Err(ConfigError::invalid(
                "postgres.max_connections",
                p.max_connections,
                "at least 10",
            ));
        }
        if p.os_user.is_empty() {
            return Err(ConfigError::invalid(
                "postgres.os_user",
                "",
                "an OS user name",
            ));
        }
        if !WAL_LEVELS.contains(&p.wal_level.as_str()) {
            return Err(ConfigError::invalid(
                "postgres.wal_level",
                &p.wal_level,
                format!("one of {}", WAL_LEVELS.join(", ")),
            ));
        }
        if !WAL_COMPRESSIONS.contains(&p.wal_compression.as_str()) {
            return Err(ConfigError::invalid(
                "postgres.wal_compression",
                &p.wal_compression,
                format!("one of {}", WAL_COMPRESSIONS.join(", ")),
            ));
        }
        let x = &self.proxy;
        if x.pool_size == 0 || x.pool_size > p.max_connections / 2 {
            return Err(ConfigError::invalid(
                "proxy.pool_size",
                x.pool_size,
                format!(
                    "1 to half of postgres.max_connections ({})",
                    p.max_connections / 2
                ),
            ));
        }
        if x.pool_wait_ms == 0 {
            return Err(ConfigError::invalid(
                "proxy.pool_wait_ms",
                x.pool_wait_ms,
                "at least 1 (milliseconds)",
            ));
        }
        if !(0.0..=1.0).contains(&x.readmit_fraction) {
            return Err(ConfigError::invalid(
                "proxy.readmit_fraction",
                x.readmit_fraction,
                "0.0 to 1.0",
            ));
        }
        if x.poll_interval_ms == 0 || x.poll_interval_ms > 100 {
            return Err(ConfigError::invalid(
                "proxy.poll_interval_ms",
                x.poll_interval_ms,
                "1 to 100",
            ));
        }
        if x.max_message_bytes < 1024 {
            return Err(ConfigError::invalid(
                "proxy.max_message_bytes",
                x.max_message_bytes,
                "at least 1024",
            ));
        }
        if x.tls_cert_file.is_empty() != x.tls_key_file.is_empty() {
            return Err(ConfigError::invalid(
                "proxy.tls_key_file",
                &x.tls_key_file,
                "set together with proxy.tls_cert_file (both or neither)",
            ));
        }
        if x.tls_required && x.tls_cert_file.is_empty() {
            return Err(ConfigError::invalid(
                "proxy.tls_required",
                true,
                "false unless proxy.tls_cert_file and proxy.tls_key_file are set",
            ));
        }
        if !["auto", "off", "require", "verify-full"].contains(&x.server_tls.as_str()) {
            return Err(ConfigError::invalid(
                "proxy.server_tls",
                &x.server_tls,
                "one of auto, off, require, verify-full",
            ));
        }
        let b = &self.backup;
        if b.retention_full == 0 || b.retention_full > 9_999_999 {
            // pgBackRest's own bounds for repo1-retention-full.
            return Err(ConfigError::invalid(
                "backup.retention_full",
                b.retention_full,
                "1 to 9999999 full backups",
            ));
        }
        if b.archive_lag_warning_s == 0 || b.archive_lag_warning_s > 604_800 {
            return Err(ConfigError::invalid(
                "backup.archive_lag_warning_s",
                b.archive_lag_warning_s,
                "1 to 604800 seconds (a week)",
            ));
        }
        for (key, value) in [
            ("backup.full_every_s", b.full_every_s),
            ("backup.incr_every_s", b.incr_every_s),
        ] {
            if value > 31_622_400 {
                return Err(ConfigError::invalid(
                    key,
                    value,
                    "0 (no scheduled backups) to 31622400 seconds (a year)",
                ));
            }
        }
        if b.repository.contains('\n') || b.repository.contains('=') {
            // It is written into pgbackrest.conf, one `key=value` a line.
            return Err(ConfigError::invalid(
                "backup.repository",
                &b.repository,
                "a directory path without newlines or '='",
            ));
        }
        if let Some(s3) = &b.s3 {
            s3.validate()?;
            if !b.repository.is_empty() && !b.repository.starts_with('/') {
                return Err(ConfigError::invalid(
                    "backup.repository",
                    &b.repository,
                    "with [backup.s3], an absolute path inside the bucket (default /herd)",
                ));
            }
        }
        let s = &self.supervisor;
        if s.probe_interval_ms == 0 || s.restart_backoff_ms == 0 || s.ready_timeout_s == 0 {
            return Err(ConfigError::invalid(
                "supervisor",
                "0",
                "probe_interval_ms, restart_backoff_ms and ready_timeout_s must be positive",
            ));
        }
        Ok(())
    }
}
