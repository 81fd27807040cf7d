//! `herd.toml`: every option with its default, validation with the key, the value and the allowed
//! values, and a commented rendering written into each data directory.

mod render;
mod s3;
mod schema;
mod validate;

pub use render::render;
pub use s3::{parse_credentials, S3Config};
pub use schema::{
    BackupConfig, Changed, ClusterConfig, Config, DashboardConfig, GroupConfig, NetworkConfig,
    PostgresConfig, ProxyConfig, SupervisorConfig, MAX_SHARDS, WAL_COMPRESSIONS,
};

/// Why a configuration was rejected.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The file could not be read or written.
    #[error("cannot access {path}: {source}")]
    Io {
        /// The file.
        path: std::path::PathBuf,
        /// The cause.
        source: std::io::Error,
    },
    /// The file is not valid TOML or does not match the schema.
    #[error("{path} is not a valid Herd configuration:\n{message}")]
    Syntax {
        /// The file.
        path: std::path::PathBuf,
        /// toml's message, with line, column and the offending text.
        message: String,
    },
    /// A value is out of its allowed range.
    #[error("invalid value for {key}: '{value}' ({expected})")]
    Invalid {
        /// The configuration key, e.g. `cluster.commit_mode`.
        key: String,
        /// The rejected value.
        value: String,
        /// What is allowed.
        expected: String,
    },
}

impl ConfigError {
    fn invalid(key: &str, value: impl ToString, expected: impl Into<String>) -> Self {
        ConfigError::Invalid {
            key: key.to_string(),
            value: value.to_string(),
            expected: expected.into(),
        }
    }
}

/// A PostgreSQL size setting (`512MB`, `2GB`, `1024kB`, or a bare number of megabytes, the
/// unit of the WAL size settings) in bytes; `None` for `-1` (unlimited) or text PostgreSQL
/// would refuse.
pub fn parse_size_bytes(text: &str) -> Option<u64> {
    let text = text.trim();
    let digits = text
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(text.len());
    let (number, unit) = text.split_at(digits);
    let n: u64 = number.parse().ok()?;
    let scale: u64 = match unit.trim() {
        "" | "MB" => 1 << 20,
        "kB" => 1 << 10,
        "GB" => 1 << 30,
        "TB" => 1 << 40,
        _ => return None,
    };
    n.checked_mul(scale)
}

#[cfg(test)]
mod size_tests {
    use super::parse_size_bytes;

    #[test]
    fn sizes() {
        assert_eq!(parse_size_bytes("2GB"), Some(2 << 30));
        assert_eq!(parse_size_bytes("512MB"), Some(512 << 20));
        assert_eq!(parse_size_bytes("64"), Some(64 << 20));
        assert_eq!(parse_size_bytes("1024kB"), Some(1 << 20));
        assert_eq!(parse_size_bytes("-1"), None);
        assert_eq!(parse_size_bytes("2 GB"), Some(2 << 30));
        assert_eq!(parse_size_bytes("2gb"), None);
    }
}
