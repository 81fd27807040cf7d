//! UPDATE or DELETE of distributed tables that is not restricted to one shard group: every
//! group's primary runs the client's statement (its parameters as bound) in a transaction of
//! its own, every group PREPAREs it, and group 0's `COMMIT PREPARED` decides before the others
//! commit (the two-phase commit of `two_phase.rs`, whose in-doubt transactions are resolved
//! when the shard map is next read). All or none: a failure on any group before the decision
//! rolls every group back. The client sees one CommandComplete with the total row count.

use herd_wire::encode;
use herd_wire::frontend::KIND_STATEMENT;

use super::copy::tag_rows;
use super::fan_out::Batch;
use super::Session;
use crate::pool::Lease;
use crate::server::server_error;
use crate::ProxyError;

/// Runs the statement on `lease` (inside its open transaction): the rows it changed, and the
/// ParameterDescription when asked for.
async fn run(lease: &mut Lease, request: &[u8]) -> Result<(u64, Option<Vec<u8>>), ProxyError> {
    lease.conn.unnamed = None;
    lease.conn.send(request).await?;
    let (mut rows, mut params, mut error) = (0, None, None);
    loop {
        let (t, body) = lease.conn.next_message().await?;
        match t {
            b't' => params = Some(body),
            b'C' => rows = tag_rows(&body),
            b'E' => error = error.or(Some(server_error(&body))),
            b'Z' => break,
            _ => {}
        }
    }
    error.map_or(Ok((rows, params)), Err)
}

impl Session {
    /// Runs the UPDATE or DELETE of `unit` on every group, all or none, and answers `tag`.
    pub(super) async fn write_all(&mut self, unit: &[u8], tag: &str) -> Result<(), ProxyError> {
        let batch = match self.fan_out_batch(unit) {
            Ok(b) => b,
            Err(e) => return self.reply_error(&e, unit).await,
        };
        let request = match self.write_request(&batch) {
            Ok(r) => r,
            Err(e) => return self.reply_error(&e, unit).await,
        };
        let mut leases = match self.primary_leases().await {
            Ok(l) => l,
            Err(e) => return self.reply_error(&e, unit).await,
        };
        let gid = super::two_phase::ddl_gid("w");
        let outcome = prepare_writes(&mut leases, &gid, &request).await;
        let outcome = match outcome {
            Ok(done) => super::two_phase::commit_all(&mut leases, &gid, "the write")
                .await
                .map(|()| done),
            Err(e) => Err(e),
        };
        for lease in leases {
            lease.release();
        }
        let (rows, params) = match outcome {
            Ok(done) => done,
            Err(e) => return self.reply_error(&e, unit).await,
        };
        let mut out = self.out.pending().to_vec();
        self.out.clear();
        if !batch.simple {
            for _ in &batch.parses {
                encode::parse_complete(&mut out);
            }
            if batch.describe_statement {
                let body = params.unwrap_or_else(|| vec![0, 0]);
                out.push(b't');
                out.extend_from_slice(&((body.len() + 4) as u32).to_be_bytes());
                out.extend_from_slice(&body);
                encode::no_data(&mut out);
            }
            if batch.bind.is_some() {
                encode::bind_complete(&mut out);
            }
            if batch.describe_portal {
                encode::no_data(&mut out);
            }
        }
        encode::command_complete(&mut out, &format!("{tag} {rows}"))?;
        if batch.simple || batch.sync {
            encode::ready_for_query(&mut out, b'I')?;
        }
        self.ctx.metrics.inc("herd_shard_write_all_total", "");
        self.write_client(&out).await
    }

    /// The client's statement as every group runs it.
    fn write_request(&self, batch: &Batch) -> Result<Vec<u8>, ProxyError> {
        let mut out = Vec::new();
        if batch.simple {
            encode::query(&mut out, &batch.query)?;
            return Ok(out);
        }
        let (statement, rest) = batch.bind.clone().unwrap_or_default();
        let parsed: std::collections::HashMap<Vec<u8>, Vec<u8>> = batch
            .parses
            .iter()
            .map(|(name, query, _)| (name.clone(), query.clone()))
            .collect();
        let sql = self.bound_sql(&parsed, &statement).unwrap_or_default();
        let types = self.bound_types(&statement).unwrap_or_default();
        encode::parse(&mut out, b"", &sql, &types)?;
        if batch.describe_statement {
            encode::describe(&mut out, KIND_STATEMENT, b"")?;
        }
        encode::bind_renamed(&mut out, b"", b"", &rest)?;
        encode::execute(&mut out, b"", 0)?;
        encode::sync(&mut out);
        Ok(out)
    }
}

/// Runs the write in a transaction on every lease and prepares it, group 0 first; on the first
/// failure rolls back what was done and returns it. The total row count and group 0's
/// ParameterDescription.
async fn prepare_writes(
    leases: &mut [Lease],
    gid: &str,
    request: &[u8],
) -> Result<(u64, Option<Vec<u8>>), ProxyError> {
    let (mut total, mut described) = (0, None);
    for i in 0..leases.len() {
        let lease = &mut leases[i];
        let step = async {
            lease.conn.internal_query("BEGIN").await?;
            let done = run(lease, request).await?;
            lease
                .conn
                .internal_query(&format!("PREPARE TRANSACTION '{gid}'"))
                .await?;
            Ok::<_, ProxyError>(done)
        };
        match step.await {
            Ok((rows, params)) => {
                total += rows;
                if i == 0 {
                    described = params;
                }
            }
            Err(e) => {
                // A failed statement leaves its transaction open and aborted: end it.
                let _ = leases[i].conn.internal_query("ROLLBACK").await;
                for l in leases[..i].iter_mut().rev() {
                    let _ = l
                        .conn
                        .internal_query(&format!("ROLLBACK PREPARED '{gid}'"))
                        .await;
                }
                return Err(e);
            }
        }
    }
    Ok((total, described))
}
