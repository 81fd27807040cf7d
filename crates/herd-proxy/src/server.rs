//! One connection from the proxy to a PostgreSQL server: login with a client's SCRAM key,
//! buffered frame reading, and small internal queries whose answers never reach a client.

use std::collections::HashMap;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::BytesMut;
use herd_scram::{ClientExchange, ClientKey, Verifier};
use herd_wire::backend::{Authentication, BackendKeyData, DataRow, ErrorFields, ParameterStatus};
use herd_wire::{encode, split_frame};

pub use crate::server_stream::SERVER_USER_TIMEOUT;
use crate::server_stream::{Opening, ServerStream};
use crate::topology::Endpoint;
use crate::ProxyError;
use herd_pg::ClientTls;

/// Largest message accepted from a server (PostgreSQL's own limit is 1 GiB).
const MAX_SERVER_MESSAGE: usize = 1 << 30;
/// Statements kept prepared per server connection before the oldest is closed.
pub const PREPARED_CAPACITY: usize = 256;

/// An authenticated server connection.
pub struct ServerConn {
    stream: ServerStream,
    /// Bytes read but not yet consumed.
    pub rbuf: BytesMut,
    /// The node it is connected to.
    pub endpoint: Endpoint,
    /// Backend process id and secret key, for CancelRequest.
    pub backend_key: (i32, i32),
    /// ParameterStatus values as this connection last reported them: at login, then updated
    /// by every report since (the proxy's own queries and relayed ones). PostgreSQL reports a
    /// setting only when it differs from what it last reported on the connection, so this is
    /// what a client attached here must be told, not the login values.
    pub params: Vec<(String, String)>,
    /// Server-side names of the statements prepared here.
    pub prepared: PreparedSet,
    /// Hash of the session settings last applied here (0: server defaults).
    pub state_hash: u64,
    /// Token of the client's unnamed statement this server holds as its own unnamed statement
    /// (`None`: none of any client's, or unknown).
    pub unnamed: Option<u64>,
    /// Server-side statements whose plan PostgreSQL refuses to reuse after a schema change
    /// (0A000 "cached plan must not change result type"): closed before they are prepared again.
    pub stale: Vec<String>,
    /// Every statement in `prepared` is out of date (a temporary object they may refer to
    /// changed, a DDL transaction ended here, or the server lost one): they are all closed
    /// before the next statement is used here, and prepared again on demand.
    pub expired: bool,
    /// ParameterStatus values the server reported during the last internal query (also
    /// folded into `params`).
    pub reported: Vec<(String, String)>,
    /// What the last session attached here left, emptied (its tracker, its list of bound
    /// statements): the next one reuses their allocations instead of making them anew for
    /// every transaction.
    pub(crate) spare: crate::session::Spare,
}

impl std::fmt::Debug for ServerConn {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "ServerConn({}:{} pid {})",
            self.endpoint.host, self.endpoint.port, self.backend_key.0
        )
    }
}

/// The SQLSTATE of a server connection refused for its credentials (invalid_password): the
/// server refused the key, or its verifier is no longer the one the key was proved against.
pub const PASSWORD_CHANGED: &str = "28P01";

impl ServerConn {
    /// Connects to `ep` as `user` on `database`, proving the user's identity with the SCRAM
    /// `ClientKey` recovered when the client logged in to the proxy (no password is stored).
    /// Over TLS when `tls` is given.
    pub async fn connect(
        ep: &Endpoint,
        user: &str,
        database: &str,
        key: &ClientKey,
        verifier: &Verifier,
        timeout: Duration,
        tls: Option<&ClientTls>,
    ) -> Result<ServerConn, ProxyError> {
        Self::connect_with(
            ep,
            &[("user", user), ("database", database)],
            key,
            verifier,
            timeout,
            tls,
        )
        .await
    }

    /// [`ServerConn::connect`] with the startup parameters given whole (`user` and
    /// `database` among them; `replication` for a replication connection).
    pub async fn connect_with(
        ep: &Endpoint,
        params: &[(&str, &str)],
        key: &ClientKey,
        verifier: &Verifier,
        timeout: Duration,
        tls: Option<&ClientTls>,
    ) -> Result<ServerConn, ProxyError> {
        let what = format!("connecting to {} ({}:{})", ep.name, ep.host, ep.port);
        let stream = tokio::time::timeout(timeout, ServerStream::open(ep, tls))
            .await
            .map_err(|_| ProxyError::Unavailable(format!("{what}: timed out")))?
            .map_err(|e| match e {
                Opening::Io(e) => ProxyError::io(what.clone(), e),
                Opening::Tls(cause) => {
                    ProxyError::ServerTls(crate::error::server_tls_failure(ep, &cause))
                }
            })?;
        let mut conn = ServerConn {
            stream,
            rbuf: BytesMut::with_capacity(16 * 1024),
            endpoint: ep.clone(),
            backend_key: (0, 0),
            params: Vec::new(),
            prepared: PreparedSet::default(),
            state_hash: 0,
            unnamed: None,
            stale: Vec::new(),
            expired: false,
            reported: Vec::new(),
            spare: Default::default(),
        };
        tokio::time::timeout(timeout, conn.login(params, key, verifier))
            .await
            .map_err(|_| ProxyError::Unavailable(format!("{what}: login timed out")))??;
        Ok(conn)
    }

    async fn login(
        &mut self,
        // No application_name for pooled connections: RESET ALL (replaying a client's
        // settings) must bring it back to PostgreSQL's default, which is what a client that
        // set none sees.
        params: &[(&str, &str)],
        key: &ClientKey,
        verifier: &Verifier,
    ) -> Result<(), ProxyError> {
        let mut out = Vec::new();
        encode::startup_message(&mut out, params)?;
        self.send(&out).await?;
        let mut exchange = ClientExchange::with_verifier(key.clone(), verifier);
        loop {
            let (tag, body) = self.next_message().await?;
            match tag {
                b'R' => match Authentication::decode(&body)? {
                    Authentication::Ok => {}
                    Authentication::Sasl { mechanisms } => {
                        if !mechanisms.contains(&herd_scram::MECHANISM) {
                            return Err(ProxyError::Unavailable(format!(
                                "server {} does not offer {}",
                                self.endpoint.name,
                                herd_scram::MECHANISM
                            )));
                        }
                        let first = exchange.client_first();
                        let mut out = Vec::new();
                        encode::sasl_initial_response(
                            &mut out,
                            herd_scram::MECHANISM,
                            Some(&first),
                        )?;
                        self.send(&out).await?;
                    }
                    Authentication::SaslContinue { data } => {
                        let fin = exchange.client_final(data).map_err(|e| match e {
                            // The role's password changed since the key was proved to the
                            // proxy: the same as the server refusing it (see `lease`).
                            herd_scram::ScramError::VerifierMismatch => ProxyError::Server {
                                code: PASSWORD_CHANGED.into(),
                                message: format!(
                                    "password authentication failed on {}: the password \
                                     changed since this session logged in",
                                    self.endpoint.name
                                ),
                            },
                            e => ProxyError::Unavailable(format!(
                                "SCRAM with {}: {e}",
                                self.endpoint.name
                            )),
                        })?;
                        let mut out = Vec::new();
                        encode::sasl_response(&mut out, &fin)?;
                        self.send(&out).await?;
                    }
                    Authentication::SaslFinal { data } => {
                        exchange.verify_server_final(data).map_err(|e| {
                            ProxyError::Unavailable(format!(
                                "server {} failed SCRAM verification: {e}",
                                self.endpoint.name
                            ))
                        })?;
                    }
                    _ => {
                        return Err(ProxyError::Unavailable(format!(
                            "server {} asked for an authentication method other than SCRAM-SHA-256",
                            self.endpoint.name
                        )))
                    }
                },
                b'S' => {
                    let p = ParameterStatus::decode(&body)?;
                    self.params.push((p.name.to_string(), p.value.to_string()));
                }
                b'K' => {
                    let k = BackendKeyData::decode(&body)?;
                    self.backend_key = (k.pid, k.key);
                }
                b'E' => return Err(server_error(&body)),
                b'Z' => return Ok(()),
                _ => {}
            }
        }
    }

    /// Writes the proxy's own statements (a Parse of the unnamed statement, or a simple query,
    /// both of which replace the server's unnamed statement): it holds no client's afterwards.
    pub async fn send_own(&mut self, bytes: &[u8]) -> Result<(), ProxyError> {
        self.unnamed = None;
        self.send(bytes).await
    }

    /// Writes all of `bytes`.
    pub async fn send(&mut self, bytes: &[u8]) -> Result<(), ProxyError> {
        self.stream
            .write_all(bytes)
            .await
            .map_err(|e| ProxyError::io(format!("writing to {}", self.endpoint.name), e))
    }

    /// Ready once the server socket may be read. A poll, not a future: the socket keeps one
    /// waker per direction, so the session's wait costs no waiter of its own.
    pub fn poll_readable(&self, cx: &mut Context<'_>) -> Poll<Result<(), ProxyError>> {
        self.stream
            .poll_readable(cx)
            .map_err(|e| ProxyError::io(format!("reading from {}", self.endpoint.name), e))
    }

    /// Encrypted bytes wait for the socket (TLS only): the relay waits for it to be writable
    /// and calls [`ServerConn::try_send`] (with nothing new, it only flushes).
    pub fn has_backlog(&self) -> bool {
        self.stream.has_backlog()
    }

    /// Whether the connection is encrypted.
    pub fn is_tls(&self) -> bool {
        matches!(self.stream, ServerStream::Tls(_))
    }

    /// Ready once the server socket may be written.
    pub fn poll_writable(&self, cx: &mut Context<'_>) -> Poll<Result<(), ProxyError>> {
        self.stream
            .poll_writable(cx)
            .map_err(|e| ProxyError::io(format!("writing to {}", self.endpoint.name), e))
    }

    /// Reads what the server has sent without waiting: `Ok(0)` when nothing is there yet; an
    /// error when the server closed the connection.
    pub fn try_fill(&mut self) -> Result<usize, ProxyError> {
        if self.rbuf.capacity() - self.rbuf.len() < 4096 {
            self.rbuf.reserve(16 * 1024);
        }
        match self.stream.try_read_buf(&mut self.rbuf) {
            Ok(0) => Err(ProxyError::io(
                format!("reading from {}", self.endpoint.name),
                std::io::Error::new(
                    std::io::ErrorKind::UnexpectedEof,
                    "server closed the connection",
                ),
            )),
            Ok(n) => Ok(n),
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => Ok(0),
            Err(e) => Err(ProxyError::io(
                format!("reading from {}", self.endpoint.name),
                e,
            )),
        }
    }

    /// Writes as much of `bytes` as the socket takes now; `Ok(0)` when it takes nothing.
    pub fn try_send(&mut self, bytes: &[u8]) -> Result<usize, ProxyError> {
        match self.stream.try_write(bytes) {
            Ok(n) => Ok(n),
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => Ok(0),
            Err(e) => Err(ProxyError::io(
                format!("writing to {}", self.endpoint.name),
                e,
            )),
        }
    }

    /// Reads more bytes into `rbuf`; an error when the server closed the connection.
    pub async fn fill(&mut self) -> Result<usize, ProxyError> {
        if self.rbuf.capacity() - self.rbuf.len() < 4096 {
            self.rbuf.reserve(16 * 1024);
        }
        let n = self
            .stream
            .read_buf(&mut self.rbuf)
            .await
            .map_err(|e| ProxyError::io(format!("reading from {}", self.endpoint.name), e))?;
        if n == 0 {
            return Err(ProxyError::io(
                format!("reading from {}", self.endpoint.name),
                std::io::Error::new(
                    std::io::ErrorKind::UnexpectedEof,
                    "server closed the connection",
                ),
            ));
        }
        Ok(n)
    }

    /// The complete message starting `at` bytes into `rbuf`, and its length, if there is one.
    pub fn frame_at(&self, at: usize) -> Result<Option<(herd_wire::Frame<'_>, usize)>, ProxyError> {
        let rest = self.rbuf.get(at..).unwrap_or_default();
        Ok(split_frame(rest, MAX_SERVER_MESSAGE)?)
    }

    /// The next whole message, owned (for the login and internal queries, not the hot path).
    pub async fn next_message(&mut self) -> Result<(u8, Vec<u8>), ProxyError> {
        loop {
            if let Some((frame, n)) = split_frame(&self.rbuf, MAX_SERVER_MESSAGE)? {
                let out = (frame.tag, frame.body.to_vec());
                let _ = self.rbuf.split_to(n);
                return Ok(out);
            }
            self.fill().await?;
        }
    }

    /// Runs `sql` (simple protocol) for the proxy itself; returns the rows' text columns.
    /// The server must be idle. An error from the server is returned after its ReadyForQuery.
    ///
    /// The proxy's own statements are idempotent and the proxy never cancels them, so a query
    /// cancelled (57014) was hit by a client's CancelRequest that was already on its way when
    /// the client's query ended: PostgreSQL would have ignored it on an idle connection, so the
    /// statement runs again (a few times at most) instead of failing the client.
    pub async fn internal_query(
        &mut self,
        sql: &str,
    ) -> Result<Vec<Vec<Option<String>>>, ProxyError> {
        let mut attempts = 0;
        loop {
            match self.internal_query_once(sql).await {
                Err(ProxyError::Server { code, .. }) if code == "57014" && attempts < 3 => {
                    attempts += 1;
                }
                other => return other,
            }
        }
    }

    async fn internal_query_once(
        &mut self,
        sql: &str,
    ) -> Result<Vec<Vec<Option<String>>>, ProxyError> {
        let mut out = Vec::new();
        encode::query(&mut out, sql)?;
        self.send(&out).await?;
        // A simple query drops the server's unnamed statement.
        self.unnamed = None;
        self.reported.clear();
        let mut rows = Vec::new();
        let mut error = None;
        loop {
            let (tag, body) = self.next_message().await?;
            match tag {
                b'S' => {
                    // A value in a client encoding other than UTF-8 is not reported further.
                    if let Ok(p) = ParameterStatus::decode(&body) {
                        self.reported
                            .push((p.name.to_string(), p.value.to_string()));
                        self.note_parameter(p.name, p.value);
                    }
                }
                b'D' => {
                    let row = DataRow::decode(&body)?;
                    rows.push(
                        row.columns
                            .iter()
                            .map(|c| c.map(|b| String::from_utf8_lossy(b).into_owned()))
                            .collect(),
                    );
                }
                b'E' => error = Some(server_error(&body)),
                b'Z' => return error.map_or(Ok(rows), Err),
                _ => {}
            }
        }
    }

    /// Records a ParameterStatus the server sent on this connection.
    pub fn note_parameter(&mut self, name: &str, value: &str) {
        match self.params.iter_mut().find(|(n, _)| n == name) {
            Some(entry) => entry.1 = value.to_string(),
            None => self.params.push((name.to_string(), value.to_string())),
        }
    }

    /// True when the server has sent something unexpected or closed the socket while idle in the
    /// pool (e.g. it was restarted): such a connection must not be reused.
    pub fn is_stale(&mut self) -> bool {
        let mut probe = [0u8; 1];
        match self.stream.try_read(&mut probe) {
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => !self.rbuf.is_empty(),
            _ => true,
        }
    }
}

/// An ErrorResponse body as a `ProxyError::Server`.
pub fn server_error(body: &[u8]) -> ProxyError {
    match ErrorFields::decode(body) {
        Ok(f) => ProxyError::Server {
            code: f.code().unwrap_or("XX000").to_string(),
            message: f.message().unwrap_or("unknown server error").to_string(),
        },
        Err(e) => ProxyError::Protocol(format!("malformed error from server: {e}")),
    }
}

/// The statements prepared on one server connection, with least-recently-used eviction. Each
/// carries the generation of the client statement it was prepared for: a client that closed and
/// parsed a statement again (after a schema change, drivers do) must not get the server's older
/// analysis of the same text. And the `search_path` it was analysed under (a hash, 0 for the
/// default): under another the same text may name other objects.
#[derive(Debug, Default)]
pub struct PreparedSet {
    /// Name → (last use, generation, path).
    names: HashMap<String, (u64, u64, u64), foldhash::fast::RandomState>,
    clock: u64,
}

impl PreparedSet {
    /// Whether `name` is prepared here at `generation` or later, under `path`; marks it used.
    /// A copy from an older generation or another path is forgotten and reported `Stale`
    /// (close it before preparing it again).
    pub fn lookup(&mut self, name: &str, generation: u64, path: u64) -> Lookup {
        self.clock += 1;
        match self.names.get_mut(name) {
            Some((used, gen, p)) if *gen >= generation && *p == path => {
                *used = self.clock;
                Lookup::Fresh
            }
            Some(_) => {
                self.names.remove(name);
                Lookup::Stale
            }
            None => Lookup::Absent,
        }
    }

    /// Records `name` as prepared for `generation` under `path`.
    pub fn insert(&mut self, name: String, generation: u64, path: u64) {
        self.clock += 1;
        self.names.insert(name, (self.clock, generation, path));
    }

    /// Forgets every statement, returning their names (to close them).
    pub fn take_all(&mut self) -> Vec<String> {
        self.names.drain().map(|(name, _)| name).collect()
    }

    /// Forgets `name`.
    pub fn remove(&mut self, name: &str) {
        self.names.remove(name);
    }

    /// Forgets everything (`DISCARD ALL`, `DEALLOCATE ALL`).
    pub fn clear(&mut self) {
        self.names.clear();
    }

    /// Number of statements.
    pub fn len(&self) -> usize {
        self.names.len()
    }

    /// True when none is prepared.
    pub fn is_empty(&self) -> bool {
        self.names.is_empty()
    }

    /// Removes and returns the least recently used name (a scan: only when the set is full).
    pub fn pop_oldest(&mut self) -> Option<String> {
        let oldest = self
            .names
            .iter()
            .min_by_key(|(_, (used, _, _))| *used)
            .map(|(n, _)| n.clone())?;
        self.names.remove(&oldest);
        Some(oldest)
    }
}

/// Whether a server holds a statement.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Lookup {
    /// Prepared, and recent enough.
    Fresh,
    /// Prepared from an older generation: close it, then prepare it again.
    Stale,
    /// Not prepared.
    Absent,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generations_make_older_copies_stale() {
        let mut p = PreparedSet::default();
        p.insert("herd_a".into(), 0, 0);
        assert_eq!(p.lookup("herd_a", 0, 0), Lookup::Fresh);
        assert_eq!(
            p.lookup("herd_a", 7, 0),
            Lookup::Stale,
            "closed and parsed again since"
        );
        assert_eq!(p.lookup("herd_a", 7, 0), Lookup::Absent);
        p.insert("herd_a".into(), 7, 0);
        assert_eq!(p.lookup("herd_a", 3, 0), Lookup::Fresh);
        p.insert("herd_b".into(), 0, 0);
        p.lookup("herd_a", 0, 0);
        assert_eq!(p.pop_oldest().as_deref(), Some("herd_b"));
    }

    #[test]
    fn another_search_path_makes_copies_stale() {
        let mut p = PreparedSet::default();
        p.insert("herd_a".into(), 0, 5);
        assert_eq!(p.lookup("herd_a", 0, 5), Lookup::Fresh);
        assert_eq!(p.lookup("herd_a", 0, 0), Lookup::Stale, "prepared under 5");
        assert_eq!(p.lookup("herd_a", 0, 0), Lookup::Absent);
        p.insert("herd_a".into(), 0, 0);
        p.insert("herd_b".into(), 0, 0);
        let mut all = p.take_all();
        all.sort();
        assert_eq!(all, ["herd_a", "herd_b"]);
        assert!(p.is_empty());
    }
}
