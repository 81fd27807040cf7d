//! Errors of the proxy, each with the SQLSTATE a client sees.

/// A failure while serving a client.
#[derive(Debug, thiserror::Error)]
pub enum ProxyError {
    /// The client broke the protocol or sent something too large.
    #[error("protocol violation: {0}")]
    Protocol(String),
    /// Socket error with a client or server.
    #[error("{context}: {source}")]
    Io {
        /// What the proxy was doing.
        context: String,
        /// The cause.
        source: std::io::Error,
    },
    /// A server answered with an error the proxy cannot pass on (during login or setup).
    #[error("{message}")]
    Server {
        /// SQLSTATE from the server.
        code: String,
        /// Its message.
        message: String,
    },
    /// Authentication of the client failed.
    #[error("password authentication failed for user \"{0}\"")]
    AuthFailed(String),
    /// No server can take the work now.
    #[error("{0}")]
    Unavailable(String),
    /// The session ends without a word from the proxy: the server already told the client why
    /// (e.g. its FATAL after `pg_terminate_backend`).
    #[error("{0}")]
    Ended(String),
    /// TLS to a server failed: its certificate did not verify, or it does not serve TLS.
    /// Never followed by a plain connection.
    #[error("{0}")]
    ServerTls(String),
    /// Waiting for a pooled connection took too long.
    #[error(
        "no server connection became free within {0} ms (pool exhausted: proxy.pool_size \
         bounds the server connections per node, proxy.pool_wait_ms the wait)"
    )]
    PoolTimeout(u64),
}

impl ProxyError {
    /// The SQLSTATE to report.
    pub fn sqlstate(&self) -> &str {
        match self {
            ProxyError::Protocol(_) => "08P01",
            ProxyError::Io { .. } => "08006",
            ProxyError::Server { code, .. } => code,
            ProxyError::AuthFailed(_) => "28P01",
            ProxyError::Unavailable(_) => "57P03",
            ProxyError::Ended(_) => "08006",
            ProxyError::ServerTls(_) => "08001",
            ProxyError::PoolTimeout(_) => "53300",
        }
    }

    pub(crate) fn io(context: impl Into<String>, source: std::io::Error) -> Self {
        ProxyError::Io {
            context: context.into(),
            source,
        }
    }
}

/// What clients are told when TLS to a server fails: the node, its address and the cause.
pub(crate) fn server_tls_failure(ep: &herd_core::Endpoint, cause: &str) -> String {
    format!(
        "TLS to node {} ({}:{}) failed: {cause}; Herd does not fall back to plain connections \
         ([proxy] server_tls; the servers' certificates must be of the cluster's CA and name the \
         address they are reached at)",
        ep.name, ep.host, ep.port
    )
}

impl From<herd_wire::WireError> for ProxyError {
    fn from(e: herd_wire::WireError) -> Self {
        ProxyError::Protocol(e.to_string())
    }
}
