//! The start of a client connection: SSL/GSS negotiation refused politely, cancel requests
//! routed, protocol version checked, SCRAM-SHA-256 against the cluster's roles, then the
//! server parameters and the client's own cancel key.

use bytes::BytesMut;
use herd_core::Consistency;
use herd_scram::{ServerExchange, MECHANISM};
use herd_wire::frontend::{sasl_response, SaslInitialResponse};
use herd_wire::{encode, parse_startup, split_frame, split_startup, StartupRequest};

use crate::client::ClientStream;

use crate::{ProxyContext, ProxyError};

/// Largest startup packet accepted (PostgreSQL allows 10 000 bytes).
const MAX_STARTUP: usize = 10_000;

/// A client that logged in.
#[derive(Debug)]
pub struct Login {
    /// Role name.
    pub user: String,
    /// Database name.
    pub database: String,
    /// Settings from the startup packet to replay on servers, as `(name, SET statement)`.
    pub settings: Vec<(String, String)>,
    /// `-c herd.consistency=…` from the startup options, if given.
    pub consistency: Option<Consistency>,
    /// `default_transaction_read_only=on` was asked for: in session pooling the session may
    /// be served by a replica.
    pub read_only: bool,
    /// `replication=database`: a logical replication connection (a copy's subscription),
    /// relayed to the group's primary.
    pub replication: bool,
    /// `-c herd.group=N`: the shard group a replication connection is for (default 0).
    pub group: Option<u32>,
}

/// Reads until `buf` holds at least one more byte; `Ok(false)` on a clean EOF.
pub async fn read_more(stream: &mut ClientStream, buf: &mut BytesMut) -> Result<bool, ProxyError> {
    // Startup and SCRAM messages are small: a small buffer (grown by `reserve`'s doubling for a
    // larger one) keeps what a connected client costs down.
    if buf.capacity() - buf.len() < super::inbuf::MIN_CHUNK / 4 {
        buf.reserve(super::inbuf::MIN_CHUNK);
    }
    let n = stream
        .read_buf(buf)
        .await
        .map_err(|e| ProxyError::io("reading from client", e))?;
    Ok(n > 0)
}

/// Where the startup phase got to.
#[derive(Debug)]
pub enum Step {
    /// The client asked for TLS and was told `S`: the handshake comes next, then startup again.
    StartTls(std::sync::Arc<rustls::ServerConfig>),
    /// A startup packet: authentication comes next.
    Login(Login),
    /// Nothing more to do (a cancel request, or the client left).
    Done,
}

/// Runs the startup phase up to a startup packet or a TLS request.
pub async fn startup(
    stream: &mut ClientStream,
    buf: &mut BytesMut,
    ctx: &ProxyContext,
) -> Result<Step, ProxyError> {
    loop {
        let split = match split_startup(buf, MAX_STARTUP) {
            Ok(split) => split,
            Err(e) => {
                // PostgreSQL closes without a word on a startup packet of impossible length
                // (it only logs "invalid length of startup packet"); so does the proxy.
                tracing::debug!("closing a connection with a malformed startup packet: {e}");
                ctx.metrics.inc("herd_malformed_startups_total", "");
                return Ok(Step::Done);
            }
        };
        let Some((packet, used)) = split else {
            if !read_more(stream, buf).await? {
                return Ok(Step::Done);
            }
            continue;
        };
        // The version decides how the rest reads: check it before parsing parameters.
        if let Some(code) = packet
            .get(4..8)
            .map(|b| u32::from_be_bytes([b[0], b[1], b[2], b[3]]))
        {
            let (major, minor) = (code >> 16, code & 0xffff);
            if major != 3 && major != 1234 {
                return Err(unsupported_version(major, minor));
            }
        }
        let request = parse_startup(packet)?;
        match request {
            StartupRequest::Ssl if stream.is_tls() => {
                return Err(ProxyError::Protocol(
                    "SSLRequest on a connection that is already encrypted".into(),
                ));
            }
            StartupRequest::Ssl if ctx.tls.is_some() => {
                let _ = buf.split_to(used);
                if !buf.is_empty() {
                    // Bytes sent before the handshake would be taken as if encrypted
                    // (PostgreSQL's CVE-2021-23214): refuse, as it does.
                    return Err(ProxyError::Protocol(
                        "received unencrypted data after SSL request".into(),
                    ));
                }
                write(stream, b"S").await?;
                let config = ctx.tls.as_ref().map(|t| t.config.clone());
                return Ok(config.map_or(Step::Done, Step::StartTls));
            }
            StartupRequest::Ssl | StartupRequest::GssEnc => {
                // No TLS here (or GSSAPI asked): 'N' tells the client to continue in plain
                // text (or give up).
                let _ = buf.split_to(used);
                write(stream, b"N").await?;
            }
            StartupRequest::Cancel { pid, key } => {
                ctx.cancels.cancel(pid, key).await;
                return Ok(Step::Done);
            }
            StartupRequest::Startup {
                major,
                minor,
                params,
            } => {
                if major != 3 {
                    return Err(unsupported_version(u32::from(major), u32::from(minor)));
                }
                let mut login = Login {
                    user: String::new(),
                    database: String::new(),
                    settings: Vec::new(),
                    consistency: None,
                    read_only: false,
                    replication: false,
                    group: None,
                };
                for (k, v) in &params {
                    match *k {
                        "user" => login.user = v.to_string(),
                        "database" => login.database = v.to_string(),
                        "replication" if v.eq_ignore_ascii_case("database") => {
                            login.replication = true;
                        }
                        "replication" if is_true_setting(&format!("= '{v}'")) => {
                            return Err(ProxyError::Server {
                                code: "0A000".into(),
                                message: "physical replication connections are not served by Herd's endpoint; connect to a node directly".into(),
                            })
                        }
                        // replication=off/false: an ordinary connection.
                        "replication" => {}
                        "options" => parse_options(v, &mut login)?,
                        // Protocol extensions PostgreSQL 15 does not know are ignored, as it does.
                        name if name.starts_with("_pq_.") => {}
                        name => login.settings.push((name.to_string(), set_statement(name, v))),
                    }
                }
                if ctx.tls.as_ref().is_some_and(|t| t.required) && !stream.is_tls() {
                    return Err(ProxyError::Server {
                        code: "28000".into(),
                        message: "this endpoint accepts only TLS connections; connect with \
                                  sslmode=require (or verify-full)"
                            .into(),
                    });
                }
                if login.user.is_empty() {
                    return Err(ProxyError::Server {
                        code: "28000".into(),
                        message: "no PostgreSQL user name specified in startup packet".into(),
                    });
                }
                if login.database.is_empty() {
                    login.database = login.user.clone();
                }
                login.read_only = login.settings.iter().any(|(name, stmt)| {
                    name.eq_ignore_ascii_case("default_transaction_read_only")
                        && is_true_setting(stmt)
                });
                let _ = buf.split_to(used);
                return Ok(Step::Login(login));
            }
        }
    }
}

/// Whether a replayed `SET "name" = 'value'` sets a boolean to true (PostgreSQL's spellings).
fn is_true_setting(stmt: &str) -> bool {
    let value = stmt
        .rsplit_once('=')
        .map(|(_, v)| v.trim().trim_matches('\'').to_ascii_lowercase())
        .unwrap_or_default();
    matches!(value.as_str(), "on" | "true" | "yes" | "1" | "t" | "y")
}

fn unsupported_version(major: u32, minor: u32) -> ProxyError {
    ProxyError::Server {
        code: "0A000".into(),
        message: format!(
            "unsupported frontend protocol {major}.{minor}: Herd supports protocol 3.0"
        ),
    }
}

/// `options=-c name=value -c …`: `herd.consistency` is Herd's; the rest are session settings.
fn parse_options(options: &str, login: &mut Login) -> Result<(), ProxyError> {
    let mut words = options.split_whitespace();
    while let Some(w) = words.next() {
        let setting = if w == "-c" {
            words.next().unwrap_or_default()
        } else if let Some(rest) = w.strip_prefix("-c").or_else(|| w.strip_prefix("--")) {
            rest
        } else {
            continue;
        };
        let Some((name, value)) = setting.split_once('=') else {
            continue;
        };
        let name = name.replace('-', "_");
        if name.eq_ignore_ascii_case("herd.group") {
            login.group = Some(value.parse().map_err(|_| ProxyError::Server {
                code: "22023".into(),
                message: format!(
                    "invalid value for parameter \"herd.group\": {value:?} (a shard group number)"
                ),
            })?);
        } else if name.eq_ignore_ascii_case("herd.consistency") {
            login.consistency =
                Some(
                    value
                        .parse()
                        .map_err(|e: herd_core::ParseError| ProxyError::Server {
                            code: "22023".into(),
                            message: format!(
                                "invalid value for parameter \"herd.consistency\": {e}"
                            ),
                        })?,
                );
        } else {
            login
                .settings
                .push((name.clone(), set_statement(&name, value)));
        }
    }
    Ok(())
}

/// `SET "name" = 'value'` with both quoted.
fn set_statement(name: &str, value: &str) -> String {
    if LIST_QUOTED.iter().any(|l| name.eq_ignore_ascii_case(l)) {
        return set_list_statement(name, value);
    }
    // Pushes rather than `format!` and `replace`: this runs for every parameter of every login.
    let mut out = String::with_capacity(name.len() + value.len() + 12);
    out.push_str("SET \"");
    push_doubling(&mut out, name, '"');
    out.push_str("\" = '");
    push_doubling(&mut out, value, '\'');
    out.push('\'');
    out
}

/// Settings whose `SET` takes each value as one quoted name (PostgreSQL's `GUC_LIST_QUOTE`):
/// `SET search_path = 'a,b'` names one schema `a,b`, where a startup parameter
/// `search_path=a,b` names two. Their startup value is replayed as a list of names.
const LIST_QUOTED: [&str; 2] = ["search_path", "temp_tablespaces"];

/// `SET "name" = "a", "b"` for a list setting's startup value `a, B` (unquoted names folded
/// to lower case, as PostgreSQL reads the list).
fn set_list_statement(name: &str, value: &str) -> String {
    let mut out = String::from("SET \"");
    push_doubling(&mut out, name, '"');
    out.push_str("\" = ");
    let items = herd_sql::split_path(value);
    if items.is_empty() {
        out.push_str("''");
    }
    for (i, item) in items.iter().enumerate() {
        if i > 0 {
            out.push_str(", ");
        }
        out.push('"');
        push_doubling(&mut out, item, '"');
        out.push('"');
    }
    out
}

/// Appends `text` with every `quote` doubled.
fn push_doubling(out: &mut String, text: &str, quote: char) {
    for (i, part) in text.split(quote).enumerate() {
        if i > 0 {
            out.push(quote);
            out.push(quote);
        }
        out.push_str(part);
    }
}

pub(super) async fn write(stream: &mut ClientStream, bytes: &[u8]) -> Result<(), ProxyError> {
    stream
        .write_all(bytes)
        .await
        .map_err(|e| ProxyError::io("writing to client", e))
}

/// SCRAM-SHA-256 exchange with the client against the role's verifier. Unknown roles get a
/// mock exchange that fails the same way, so role names cannot be probed.
///
/// The last messages of a successful exchange (SASLFinal, AuthenticationOk) are returned
/// unsent: the caller sends them with what follows them (the greeting), so a login costs one
/// write and one wake-up of the client less (two sends where PgBouncer makes one were a
/// measurable share of a connect-per-transaction client's cost).
pub async fn authenticate(
    stream: &mut ClientStream,
    buf: &mut BytesMut,
    ctx: &ProxyContext,
    login: &Login,
) -> Result<Vec<u8>, ProxyError> {
    let servers = ctx.login_servers().await?;
    let verifier = ctx
        .users
        .verifier(&servers, &login.user, login.replication)
        .await
        .map_err(|crate::users::Unreachable| {
            ProxyError::Unavailable(match servers.first() {
                Some(first) => format!(
                    "cannot check the password of \"{}\" now: {} did not answer \
                     (it may be failing over); retry shortly",
                    login.user, first.name
                ),
                None => format!(
                    "cannot check the password of \"{}\" now: no server answers (no primary, \
                     no replica in service); retry shortly",
                    login.user
                ),
            })
        })?;
    let mut exchange = match &verifier {
        Some(v) => ServerExchange::new(v.clone()),
        None => ServerExchange::mock(&login.user, ctx.mock_secret.as_slice()),
    };
    let mut out = Vec::new();
    encode::authentication_sasl(&mut out, &[MECHANISM])?;
    write(stream, &out).await?;
    let failed = || ProxyError::AuthFailed(login.user.clone());

    let body = read_password_message(stream, buf, ctx).await?;
    let initial = SaslInitialResponse::decode(&body)?;
    if initial.mechanism != MECHANISM {
        return Err(ProxyError::Protocol(format!(
            "unsupported SASL mechanism {}",
            initial.mechanism
        )));
    }
    let first = exchange
        .server_first(initial.data.unwrap_or_default())
        .map_err(|_| failed())?;
    out.clear();
    encode::authentication_sasl_continue(&mut out, &first)?;
    write(stream, &out).await?;

    let body = read_password_message(stream, buf, ctx).await?;
    let (last, key) = exchange.server_final(sasl_response(&body)).map_err(|_| {
        ctx.users.forget(&login.user);
        failed()
    })?;
    let verifier = verifier.ok_or_else(failed)?;
    ctx.users.remember(&login.user, key, verifier);
    out.clear();
    encode::authentication_sasl_final(&mut out, &last)?;
    encode::authentication_ok(&mut out);
    Ok(out)
}

async fn read_password_message(
    stream: &mut ClientStream,
    buf: &mut BytesMut,
    ctx: &ProxyContext,
) -> Result<Vec<u8>, ProxyError> {
    loop {
        if let Some((frame, used)) = split_frame(buf, ctx.config.max_message_bytes as usize)? {
            if frame.tag != b'p' {
                return Err(ProxyError::Protocol(format!(
                    "expected a password message, got '{}'",
                    frame.tag as char
                )));
            }
            let body = frame.body.to_vec();
            let _ = buf.split_to(used);
            return Ok(body);
        }
        if !read_more(stream, buf).await? {
            return Err(ProxyError::Protocol(
                "client closed the connection during authentication".into(),
            ));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn options_carry_consistency_and_settings() {
        let mut login = Login {
            user: "u".into(),
            database: "d".into(),
            settings: vec![],
            consistency: None,
            read_only: false,
            replication: false,
            group: None,
        };
        parse_options(
            "-c herd.consistency=eventual -c work_mem=8MB --search-path=a",
            &mut login,
        )
        .expect("valid");
        assert_eq!(login.consistency, Some(Consistency::Eventual));
        assert_eq!(
            login.settings,
            vec![
                (
                    "work_mem".to_string(),
                    "SET \"work_mem\" = '8MB'".to_string()
                ),
                (
                    "search_path".to_string(),
                    "SET \"search_path\" = \"a\"".to_string()
                )
            ]
        );
        assert!(parse_options("-c herd.consistency=strong", &mut login).is_err());
        parse_options("-c herd.group=2", &mut login).expect("group");
        assert_eq!(login.group, Some(2));
        assert!(parse_options("-c herd.group=x", &mut login).is_err());
    }

    #[test]
    fn set_statements_are_quoted() {
        assert_eq!(
            set_statement("application_name", "it's"),
            "SET \"application_name\" = 'it''s'"
        );
        assert_eq!(set_statement("a\"b", "x'y"), r#"SET "a""b" = 'x''y'"#);
        assert_eq!(set_statement("", ""), r#"SET "" = ''"#);
        // A list setting from the startup packet names each of its items.
        assert_eq!(
            set_statement("search_path", "s2,Public, \"My S\""),
            r#"SET "search_path" = "s2", "public", "My S""#
        );
        assert_eq!(
            set_statement("search_path", "\"$user\", public"),
            r#"SET "search_path" = "$user", "public""#
        );
    }
}
