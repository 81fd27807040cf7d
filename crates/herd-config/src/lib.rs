//! `herd.toml`: every option with its default, validation with the key, the value and the allowed
//! values, and a commented rendering written into each data directory.

mod render;
mod schema;

pub use render::render;
pub use schema::{
    Changed, ClusterConfig, Config, GroupConfig, NetworkConfig, PostgresConfig, ProxyConfig,
    SupervisorConfig,
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
