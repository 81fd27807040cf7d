//! `COPY table TO STDOUT` of a distributed table: the client's COPY runs on every shard group's
//! primary in turn and the client sees one COPY — one CopyOutResponse, every group's rows, one
//! header (text or CSV `HEADER`; the binary format's signature) and one binary trailer, and the
//! total row count. Each group's rows are as of that group's own snapshot: groups are not read
//! at one instant (a cross-group snapshot needs Sharding II's distributed transactions).
//!
//! PostgreSQL sends COPY TO output one row per CopyData message, with a header line in a
//! message of its own, the binary signature at the start of the first message and the binary
//! trailer (`-1` as int16) as a message of its own (after the header, when there are no rows);
//! the gathering below relies on those boundaries and checks the binary ones.

use herd_shard::CopyOut;
use herd_wire::encode;

use super::copy::{copy_error, tag_rows, CopyUnit};
use super::Session;
use crate::pool::Lease;
use crate::server::server_error;
use crate::ProxyError;

/// PostgreSQL's binary COPY signature, flags (0) and header extension length (0).
const BINARY_HEADER: &[u8; 19] = b"PGCOPY\n\xff\r\n\0\0\0\0\0\0\0\0\0";
/// The binary format's trailer: a tuple field count of -1.
const BINARY_TRAILER: [u8; 2] = [0xff, 0xff];
/// Output is written to the client in pieces of about this size.
const FLUSH_BYTES: usize = 64 * 1024;

/// What one group's CopyData becomes in the gathered stream.
fn gathered<'a>(
    copy: &CopyOut,
    first_group: bool,
    first_message: bool,
    data: &'a [u8],
) -> Result<&'a [u8], ProxyError> {
    let whole = data;
    let mut data = data;
    if copy.binary && first_message {
        let header = data
            .get(..BINARY_HEADER.len())
            .filter(|h| *h == BINARY_HEADER)
            .ok_or_else(|| {
                copy_error(
                    "08P01",
                    "a shard group's binary COPY output does not start with PostgreSQL's \
                     signature and an empty header extension"
                        .into(),
                )
            })?;
        data = &data[header.len()..];
        if first_group {
            // The signature goes out once, with the first group's first message; its trailer
            // (when the message is the signature and the trailer) is held back below.
            return Ok(if data == BINARY_TRAILER {
                header
            } else {
                whole
            });
        }
    }
    if copy.binary && data == BINARY_TRAILER {
        return Ok(&data[..0]);
    }
    if copy.header && first_message && !first_group {
        return Ok(&data[..0]);
    }
    Ok(data)
}

fn copy_data(out: &mut Vec<u8>, bytes: &[u8]) {
    out.push(b'd');
    out.extend_from_slice(&((bytes.len() + 4) as u32).to_be_bytes());
    out.extend_from_slice(bytes);
}

impl Session {
    /// Runs the COPY TO STDOUT of `unit` on every group and gathers the rows.
    pub(super) async fn copy_out(&mut self, unit: &[u8], copy: CopyOut) -> Result<(), ProxyError> {
        let CopyUnit {
            sql,
            before,
            simple,
            sync,
        } = self.copy_unit(unit)?;
        let ready = simple || sync;
        let mut leases = match self.primary_leases().await {
            Ok(l) => l,
            Err(e) => return self.reply_error(&e, unit).await,
        };
        // What the client is still owed goes first.
        let mut out = self.out.pending().to_vec();
        self.out.clear();
        out.extend_from_slice(&before);
        let mut started = false;
        let mut total = 0u64;
        let mut failure = None;
        for (g, lease) in leases.iter_mut().enumerate() {
            let on_group = match self.sql_on_group(g as u32, &sql) {
                Ok(s) => s.into_owned(),
                Err(e) => {
                    failure = Some(e);
                    break;
                }
            };
            match self
                .gather_group(lease, &on_group, &copy, g == 0, &mut started, &mut out)
                .await
            {
                Ok(n) => total += n,
                Err(e) => {
                    failure = Some(e);
                    break;
                }
            }
        }
        for lease in leases {
            lease.release();
        }
        if let Some(e) = failure {
            self.write_client(&out).await?;
            return self.copy_failed(&e, ready).await;
        }
        if copy.binary {
            copy_data(&mut out, &BINARY_TRAILER);
        }
        out.extend_from_slice(&[b'c', 0, 0, 0, 4]);
        encode::command_complete(&mut out, &format!("COPY {total}"))?;
        if ready {
            encode::ready_for_query(&mut out, b'I')?;
        }
        self.ctx.metrics.inc("herd_shard_copy_out_total", "");
        self.write_client(&out).await
    }

    /// Streams one group's COPY output into `out` (written to the client as it fills); the
    /// group's row count. The server's connection ends idle either way (its ReadyForQuery is
    /// read).
    async fn gather_group(
        &mut self,
        lease: &mut Lease,
        sql: &str,
        copy: &CopyOut,
        first_group: bool,
        started: &mut bool,
        out: &mut Vec<u8>,
    ) -> Result<u64, ProxyError> {
        let mut q = Vec::new();
        encode::query(&mut q, sql)?;
        lease.conn.send(&q).await?;
        let mut first_message = true;
        let mut rows = 0;
        let mut error = None;
        loop {
            let (t, body) = lease.conn.next_message().await?;
            match t {
                b'H' if !*started => {
                    out.push(b'H');
                    out.extend_from_slice(&((body.len() + 4) as u32).to_be_bytes());
                    out.extend_from_slice(&body);
                    *started = true;
                }
                b'd' if error.is_none() => {
                    match gathered(copy, first_group, first_message, &body) {
                        Ok([]) => {}
                        Ok(d) => copy_data(out, d),
                        Err(e) => error = Some(e),
                    }
                    first_message = false;
                    if out.len() >= FLUSH_BYTES {
                        self.write_client(out).await?;
                        out.clear();
                    }
                }
                b'C' => rows = tag_rows(&body),
                b'E' => error = error.or(Some(server_error(&body))),
                b'Z' => break,
                _ => {}
            }
        }
        error.map_or(Ok(rows), Err)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn copy(binary: bool, header: bool) -> CopyOut {
        CopyOut {
            table: "t".into(),
            binary,
            header,
        }
    }

    fn run(copy: &CopyOut, first_group: bool, first_message: bool, data: &[u8]) -> Vec<u8> {
        gathered(copy, first_group, first_message, data)
            .map(|d| d.to_vec())
            .unwrap_or_else(|e| panic!("{e}"))
    }

    #[test]
    fn headers_and_trailers_once() {
        let text = copy(false, true);
        assert_eq!(run(&text, true, true, b"a\tb\n"), b"a\tb\n");
        assert_eq!(run(&text, false, true, b"a\tb\n"), b"");
        assert_eq!(run(&text, false, false, b"1\t2\n"), b"1\t2\n");
        let bin = copy(true, false);
        let mut first = BINARY_HEADER.to_vec();
        first.extend_from_slice(&[0, 1, 0, 0, 0, 1, 7]);
        assert_eq!(run(&bin, true, true, &first), &first[..]);
        assert_eq!(run(&bin, false, true, &first), &[0, 1, 0, 0, 0, 1, 7]);
        assert_eq!(run(&bin, true, false, &BINARY_TRAILER), b"");
        // An empty group: signature and trailer in one message.
        let mut empty = BINARY_HEADER.to_vec();
        empty.extend_from_slice(&BINARY_TRAILER);
        assert_eq!(run(&bin, true, true, &empty), &BINARY_HEADER[..]);
        assert_eq!(run(&bin, false, true, &empty), b"");
        assert!(gathered(&bin, true, true, b"garbage").is_err());
    }
}
