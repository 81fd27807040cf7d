//! `COPY table FROM STDIN` into a distributed table: one COPY per shard group's primary (as the
//! client's role, each in its own transaction), the client's rows split by key and streamed to
//! their groups, then all or none: every group PREPAREs, group 0 commits first, the others
//! follow (a load left in doubt is resolved like DDL, when the shard map is next read). The
//! client sees one COPY and the total row count.

use bytes::BytesMut;
use herd_shard::{CopyIn, CopySplitter, Routed};
use herd_wire::frontend::{tag, Bind, Parse, Query};
use herd_wire::{encode, split_frame};

use super::two_phase::{commit_all, ddl_gid, prepare_all};
use super::Session;
use crate::pool::Lease;
use crate::server::server_error;
use crate::ProxyError;

/// Why a load failed, for the client.
pub(super) fn copy_error(code: &str, message: String) -> ProxyError {
    ProxyError::Server {
        code: code.into(),
        message,
    }
}

fn copy_data(bytes: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(bytes.len() + 5);
    out.push(b'd');
    out.extend_from_slice(&((bytes.len() + 4) as u32).to_be_bytes());
    out.extend_from_slice(bytes);
    out
}

/// A COPY statement as the client sent it.
pub(super) struct CopyUnit {
    /// Its SQL.
    pub sql: String,
    /// The answers owed before the copy starts (ParseComplete, BindComplete, NoData), which
    /// the proxy gives itself.
    pub before: Vec<u8>,
    /// A simple query (else one execution in the extended protocol).
    pub simple: bool,
    /// The unit ends with Sync (extended protocol), so ReadyForQuery follows the copy.
    pub sync: bool,
}

impl Session {
    /// Reads the COPY statement of `unit`: a simple query, or one execution in the extended
    /// protocol (whose answers before the copy's response the proxy gives itself).
    pub(super) fn copy_unit(&self, unit: &[u8]) -> Result<CopyUnit, ProxyError> {
        let mut copy = CopyUnit {
            sql: String::new(),
            before: Vec::new(),
            simple: false,
            sync: false,
        };
        let mut parsed = std::collections::HashMap::new();
        let mut rest = unit;
        while let Some((frame, used)) = split_frame(rest, usize::MAX)? {
            rest = &rest[used..];
            match frame.tag {
                tag::QUERY => {
                    copy.sql = String::from_utf8_lossy(Query::decode(frame.body)?.sql).into_owned();
                    copy.simple = true;
                }
                tag::PARSE => {
                    let p = Parse::decode(frame.body)?;
                    parsed.insert(p.name.to_vec(), p.query.to_vec());
                    encode::parse_complete(&mut copy.before);
                }
                tag::BIND => {
                    let b = Bind::decode(frame.body)?;
                    if let Some(text) = self.bound_sql(&parsed, b.statement) {
                        copy.sql = String::from_utf8_lossy(&text).into_owned();
                    }
                    encode::bind_complete(&mut copy.before);
                }
                tag::DESCRIBE => encode::no_data(&mut copy.before),
                // In COPY FROM, PostgreSQL ignores a Sync that reaches it in copy mode: the
                // client's Sync after CopyDone is the one answered (by the proxy, as a lone Sync).
                tag::SYNC => copy.sync = true,
                _ => {}
            }
        }
        Ok(copy)
    }

    /// Runs the COPY of `unit` (a lone simple query) split over every group.
    pub(super) async fn copy_in(&mut self, unit: &[u8], copy: CopyIn) -> Result<(), ProxyError> {
        let CopyUnit {
            sql,
            before,
            simple: sync,
            ..
        } = self.copy_unit(unit)?;
        let Some(map) = self.map.clone() else {
            return Ok(());
        };
        let mut leases = match self.primary_leases().await {
            Ok(l) => l,
            Err(e) => return self.reply_error(&e, unit).await,
        };
        // Started on every group; the client gets group 0's CopyInResponse.
        let started = self.start_copies(&mut leases, &sql, &copy).await;
        let (response, key_index) = match started {
            Ok(r) => r,
            Err(e) => return self.reply_error(&e, unit).await,
        };
        // What the client is still owed goes first, then the CopyInResponse.
        let mut first = self.out.pending().to_vec();
        self.out.clear();
        first.extend_from_slice(&before);
        first.extend_from_slice(&response);
        self.write_client(&first).await?;
        let mut splitter = CopySplitter::new(copy.format, key_index, copy.key_type, &map);
        let mut failure: Option<ProxyError> = None;
        loop {
            let (tag_byte, body) = self.next_client_message().await?;
            let routed = match tag_byte {
                tag::COPY_DATA if failure.is_none() => splitter.push(&body),
                tag::COPY_DATA => continue,
                tag::COPY_DONE => {
                    if failure.is_none() {
                        match splitter.finish() {
                            Ok(rest) => send_routed(&mut leases, rest).await?,
                            Err(e) => failure = Some(copy_error("22P04", e.to_string())),
                        }
                    }
                    break;
                }
                tag::COPY_FAIL => {
                    let why = String::from_utf8_lossy(body.strip_suffix(&[0]).unwrap_or(&body))
                        .into_owned();
                    failure = Some(copy_error(
                        "57014",
                        format!("COPY from stdin failed: {why}"),
                    ));
                    break;
                }
                tag::FLUSH | tag::SYNC => continue,
                other => {
                    return Err(ProxyError::Protocol(format!(
                        "unexpected message type '{}' during COPY",
                        char::from(other)
                    )))
                }
            };
            match routed {
                Ok(r) => send_routed(&mut leases, r).await?,
                Err(e) => failure = Some(copy_error("22P04", e.to_string())),
            }
        }
        let total = match failure {
            Some(e) => Err(e),
            None => finish_copies(&mut leases).await,
        };
        let total = match total {
            Ok(t) => t,
            Err(e) => {
                // Every group's COPY ends failed; their transactions are closed with the
                // connections.
                abort(leases).await;
                return self.copy_failed(&e, sync).await;
            }
        };
        if let Err(e) = self.commit_copies(&mut leases).await {
            return self.copy_failed(&e, sync).await;
        }
        for lease in leases {
            lease.release();
        }
        self.ctx.metrics.inc("herd_shard_copy_rows_total", "");
        let mut out = Vec::new();
        encode::command_complete(&mut out, &format!("COPY {total}"))?;
        if sync {
            encode::ready_for_query(&mut out, b'I')?;
        }
        self.write_client(&out).await
    }

    /// Reports a load that failed once the client was in copy mode: ErrorResponse, and
    /// ReadyForQuery only for a simple query (in the extended protocol the client's Sync after
    /// CopyDone is answered, as a lone Sync).
    pub(super) async fn copy_failed(
        &mut self,
        e: &ProxyError,
        simple: bool,
    ) -> Result<(), ProxyError> {
        let mut out = Vec::new();
        encode::error_response(&mut out, "ERROR", e.sqlstate(), &e.to_string())?;
        if simple {
            encode::ready_for_query(&mut out, b'I')?;
        }
        self.write_client(&out).await
    }

    /// BEGIN and the client's COPY on every group; the client's CopyInResponse and the key's
    /// position in each row.
    async fn start_copies(
        &mut self,
        leases: &mut [Lease],
        sql: &str,
        copy: &CopyIn,
    ) -> Result<(Vec<u8>, usize), ProxyError> {
        let key_index = if copy.columns.is_empty() {
            let rows = leases[0]
                .conn
                .internal_query(&format!(
                    "select attname from pg_attribute where attrelid = to_regclass('{}') \
                     and attnum > 0 and not attisdropped order by attnum",
                    copy.table.replace('\'', "''")
                ))
                .await?;
            rows.iter()
                .position(|r| {
                    r.first().cloned().flatten().as_deref() == Some(copy.key_column.as_str())
                })
                .ok_or_else(|| {
                    copy_error(
                        "42703",
                        format!("{} has no column {}", copy.table, copy.key_column),
                    )
                })?
        } else {
            copy.columns
                .iter()
                .position(|c| *c == copy.key_column)
                .unwrap_or(0)
        };
        let mut response = Vec::new();
        for lease in leases.iter_mut() {
            lease.conn.internal_query("BEGIN").await?;
            let mut q = Vec::new();
            encode::query(&mut q, sql)?;
            lease.conn.send(&q).await?;
            loop {
                let (t, body) = lease.conn.next_message().await?;
                match t {
                    b'G' => {
                        if response.is_empty() {
                            response.push(b'G');
                            response.extend_from_slice(&((body.len() + 4) as u32).to_be_bytes());
                            response.extend_from_slice(&body);
                        }
                        break;
                    }
                    b'E' => {
                        let e = server_error(&body);
                        // Its ReadyForQuery follows.
                        while lease.conn.next_message().await?.0 != b'Z' {}
                        return Err(e);
                    }
                    _ => {}
                }
            }
        }
        Ok((response, key_index))
    }

    /// Two-phase commit of every group's COPY.
    async fn commit_copies(&mut self, leases: &mut [Lease]) -> Result<(), ProxyError> {
        let gid = ddl_gid("copy_");
        prepare_all(leases, &gid, "").await?;
        commit_all(&self.ctx.commits, leases, &gid, "the load").await
    }

    /// The next whole message from the client, reading as needed.
    async fn next_client_message(&mut self) -> Result<(u8, Vec<u8>), ProxyError> {
        let max = self.ctx.config.max_message_bytes as usize;
        loop {
            if let Some((frame, n)) = split_frame(&self.cbuf, max)? {
                let out = (frame.tag, frame.body.to_vec());
                let _ = self.cbuf.split_to(n);
                return Ok(out);
            }
            if self.cbuf.capacity() - self.cbuf.len() < 4096 {
                self.cbuf.reserve(64 * 1024);
            }
            let n = read_more(&mut self.client, &mut self.cbuf).await?;
            if n == 0 {
                return Err(ProxyError::Ended("the client left during COPY".into()));
            }
        }
    }
}

async fn read_more(
    client: &mut crate::client::ClientStream,
    buf: &mut BytesMut,
) -> Result<usize, ProxyError> {
    client
        .read_buf(buf)
        .await
        .map_err(|e| ProxyError::io("reading from client", e))
}

/// Sends routed rows to their groups' COPYs.
async fn send_routed(leases: &mut [Lease], routed: Vec<Routed>) -> Result<(), ProxyError> {
    for r in routed {
        match r {
            Routed::Group(g, bytes) => {
                if let Some(lease) = leases.get_mut(g as usize) {
                    lease.conn.send(&copy_data(&bytes)).await?;
                }
            }
            Routed::All(bytes) => {
                let msg = copy_data(&bytes);
                for lease in leases.iter_mut() {
                    lease.conn.send(&msg).await?;
                }
            }
        }
    }
    Ok(())
}

/// Ends every group's COPY; the total of their row counts, or the first error.
async fn finish_copies(leases: &mut [Lease]) -> Result<u64, ProxyError> {
    let mut total = 0;
    let mut first_error = None;
    for lease in leases.iter_mut() {
        lease.conn.send(&[b'c', 0, 0, 0, 4]).await?;
        loop {
            let (t, body) = lease.conn.next_message().await?;
            match t {
                b'C' => total += tag_rows(&body),
                b'E' => first_error = first_error.or(Some(server_error(&body))),
                b'Z' => break,
                _ => {}
            }
        }
    }
    first_error.map_or(Ok(total), Err)
}

/// The row count at the end of a CommandComplete's tag (`COPY 42`), 0 when there is none.
pub(super) fn tag_rows(body: &[u8]) -> u64 {
    String::from_utf8_lossy(body)
        .trim_end_matches('\0')
        .rsplit(' ')
        .next()
        .and_then(|n| n.parse::<u64>().ok())
        .unwrap_or(0)
}

/// Closes the connections of a failed load: each server rolls its transaction back.
async fn abort(leases: Vec<Lease>) {
    drop(leases);
}
