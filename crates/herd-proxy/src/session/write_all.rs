//! UPDATE or DELETE of distributed tables that is not restricted to one shard group, and
//! multi-row INSERTs whose rows belong to several groups: every group's primary runs the
//! client's statement (an INSERT with only that group's rows; its parameters as bound) in a
//! transaction of its own, every group PREPAREs it, and group 0's `COMMIT PREPARED` decides before the others
//! commit (the two-phase commit of `two_phase.rs`, whose in-doubt transactions are resolved
//! when the shard map is next read). All or none: a failure on any group before the decision
//! rolls every group back. The client sees one CommandComplete with the total row count, and
//! the rows of a RETURNING list (every group's, in group order; a reference table's from one
//! copy) once the write is decided.

use herd_wire::encode;
use herd_wire::frontend::KIND_STATEMENT;

use super::batch::Batch;
use super::copy::tag_rows;
use super::Session;
use crate::pool::Lease;
use crate::server::server_error;
use crate::ProxyError;

/// What one group answered.
#[derive(Default)]
pub(super) struct Done {
    /// The rows it changed.
    count: u64,
    /// ParameterDescription (when the statement was described).
    params: Option<Vec<u8>>,
    /// The statement's RowDescription or NoData (when described).
    statement: Option<(u8, Vec<u8>)>,
    /// The portal's RowDescription or NoData (a simple query's RowDescription).
    portal: Option<(u8, Vec<u8>)>,
    /// DataRow bodies of a RETURNING list.
    rows: Vec<Vec<u8>>,
}

/// Runs the statement on `lease` (inside its open transaction).
pub(super) async fn run(lease: &mut Lease, request: &[u8]) -> Result<Done, ProxyError> {
    lease.conn.send_own(request).await?;
    let (mut done, mut error) = (Done::default(), None);
    loop {
        let (t, body) = lease.conn.next_message().await?;
        match t {
            b't' => done.params = Some(body),
            // After a ParameterDescription the next description is the statement's.
            b'T' | b'n' if done.params.is_some() && done.statement.is_none() => {
                done.statement = Some((t, body))
            }
            b'T' | b'n' => done.portal = Some((t, body)),
            b'D' => done.rows.push(body),
            b'C' => done.count = tag_rows(&body),
            b'E' => error = error.or(Some(server_error(&body))),
            b'Z' => break,
            _ => {}
        }
    }
    error.map_or(Ok(done), Err)
}

fn push(out: &mut Vec<u8>, (tag, body): &(u8, Vec<u8>)) {
    out.push(*tag);
    out.extend_from_slice(&((body.len() + 4) as u32).to_be_bytes());
    out.extend_from_slice(body);
}

/// What every group runs.
pub(super) enum Write {
    /// The client's UPDATE or DELETE, everywhere; its command tag.
    Same(&'static str),
    /// The client's INSERT … VALUES, each group with its rows (the group of each row).
    Split(Vec<u32>),
    /// The client's write to a reference table, everywhere (group 0's row count answers).
    Reference(&'static str),
    /// The client's INSERT … SELECT, each group an INSERT … VALUES of its rows of the SELECT
    /// (`insert_select.rs`).
    FromSelect(herd_shard::InsertSelect),
}

impl Write {
    /// The command tag the client is answered with, and whether one copy's rows answer (a
    /// reference table's copies all change alike).
    pub(super) fn answer(&self) -> (&'static str, bool) {
        match self {
            Write::Same(tag) => (tag, false),
            Write::Split(_) | Write::FromSelect(_) => ("INSERT 0", false),
            Write::Reference(tag) => (tag, true),
        }
    }
}

impl Session {
    /// Runs the write of `unit` on every group, all or none, and answers its command tag.
    pub(super) async fn write_all(&mut self, unit: &[u8], write: Write) -> Result<(), ProxyError> {
        let batch = match self.fan_out_batch(unit) {
            Ok(b) => b,
            Err(e) => return self.reply_error(&e, unit).await,
        };
        let mut leases = match self.primary_leases().await {
            Ok(l) => l,
            Err(e) => return self.reply_error(&e, unit).await,
        };
        let requests = match self.write_requests(&batch, &write, &mut leases).await {
            Ok(r) => r,
            Err(e) => {
                for lease in leases {
                    lease.release();
                }
                return self.reply_error(&e, unit).await;
            }
        };
        let (tag, one_copy) = write.answer();
        let gid = super::two_phase::ddl_gid("w");
        let outcome = prepare_writes(&mut leases, &gid, &requests).await;
        let outcome = match outcome {
            Ok(done) => {
                self.ctx.metrics.inc("herd_shard_2pc_commits_total", "");
                super::two_phase::commit_all(&self.ctx.commits, &mut leases, &gid, "the write")
                    .await
                    .map(|()| done)
            }
            Err(e) => {
                self.ctx.metrics.inc("herd_shard_2pc_aborts_total", "");
                Err(e)
            }
        };
        for lease in leases {
            lease.release();
        }
        let answers = match outcome {
            Ok(done) => done,
            Err(e) => return self.reply_error(&e, unit).await,
        };
        let out = self.write_answer(&batch, &answers, tag, one_copy, b'I')?;
        self.ctx.metrics.inc("herd_shard_write_all_total", "");
        self.write_client(&out).await
    }

    /// The client's answer to a write every group ran: its batch's messages, the RETURNING
    /// rows, one CommandComplete with the total, ReadyForQuery (`status`) when owed. What the
    /// client was still owed comes first.
    pub(super) fn write_answer(
        &mut self,
        batch: &Batch,
        answers: &[Done],
        tag: &str,
        one_copy: bool,
        status: u8,
    ) -> Result<Vec<u8>, ProxyError> {
        // A reference table's copies changed alike: one copy answers.
        let answers: Vec<&Done> = if one_copy {
            answers.iter().take(1).collect()
        } else {
            answers.iter().collect()
        };
        let rows: u64 = answers.iter().map(|d| d.count).sum();
        // Descriptions from the first group that ran the statement.
        let first = answers
            .iter()
            .find(|d| d.portal.is_some() || d.statement.is_some());
        let no_data = (b'n', Vec::new());
        let mut out = self.out.pending().to_vec();
        self.out.clear();
        if !batch.simple {
            for _ in &batch.parses {
                encode::parse_complete(&mut out);
            }
            // The statement's description where the client asked for it: before or after
            // its Bind.
            let describe = |out: &mut Vec<u8>| {
                let params = first
                    .and_then(|d| d.params.clone())
                    .unwrap_or_else(|| vec![0, 0]);
                push(out, &(b't', params));
                push(
                    out,
                    first.and_then(|d| d.statement.as_ref()).unwrap_or(&no_data),
                );
            };
            if batch.describe_statement && !batch.describe_statement_after_bind {
                describe(&mut out);
            }
            if batch.bind.is_some() {
                encode::bind_complete(&mut out);
            }
            if batch.describe_statement_after_bind {
                describe(&mut out);
            }
            if batch.describe_portal {
                push(
                    &mut out,
                    first.and_then(|d| d.portal.as_ref()).unwrap_or(&no_data),
                );
            }
        } else if let Some(description) = first.and_then(|d| d.portal.as_ref()) {
            push(&mut out, description);
        }
        for d in &answers {
            for row in &d.rows {
                push(&mut out, &(b'D', row.clone()));
            }
        }
        encode::command_complete(&mut out, &format!("{tag} {rows}"))?;
        if batch.simple || batch.sync {
            encode::ready_for_query(&mut out, status)?;
        }
        Ok(out)
    }

    /// What each group runs (`None`: nothing, its transaction is prepared empty so that
    /// group 0 always holds the decision).
    pub(super) async fn write_requests<L: std::borrow::BorrowMut<Lease>>(
        &self,
        batch: &Batch,
        write: &Write,
        leases: &mut [L],
    ) -> Result<Vec<Option<Vec<u8>>>, ProxyError> {
        let (statement, rest) = batch.bind.clone().unwrap_or_default();
        let sql = self.batch_sql(batch);
        let mut types = self.bound_types(&statement).unwrap_or_default();
        let groups = match write {
            // Each group its own statement only while a move makes some group hide rows.
            Write::Same(_) if self.hides_rows() => {
                let text = String::from_utf8_lossy(&sql);
                return (0..leases.len() as u32)
                    .map(|g| {
                        let on_group = self.sql_on_group(g, &text)?;
                        request(batch, on_group.as_bytes(), &types, &rest).map(Some)
                    })
                    .collect();
            }
            Write::Same(_) | Write::Reference(_) => {
                return Ok(vec![
                    Some(request(batch, &sql, &types, &rest)?);
                    leases.len()
                ])
            }
            Write::Split(groups) => groups,
            Write::FromSelect(plan) => {
                if !batch.simple {
                    if let Some(first) = leases.first_mut() {
                        types = super::batch::infer_param_types(first.borrow_mut(), &sql, &types)
                            .await?;
                    }
                }
                let text = String::from_utf8_lossy(&sql).into_owned();
                let parts = self
                    .insert_select_requests(batch, plan, leases, &text, &types, &rest)
                    .await?;
                let mut requests = vec![None; leases.len()];
                for (g, part) in parts {
                    if let Some(slot) = requests.get_mut(g) {
                        *slot = Some(request(batch, part.as_bytes(), &types, &rest)?);
                    }
                }
                return Ok(requests);
            }
        };
        // A group's rows may not use every parameter: each is declared with the type
        // PostgreSQL infers for the whole statement.
        if !batch.simple {
            if let Some(first) = leases.first_mut() {
                types = super::batch::infer_param_types(first.borrow_mut(), &sql, &types).await?;
            }
        }
        let text = String::from_utf8_lossy(&sql).into_owned();
        (0..leases.len() as u32)
            .map(|g| {
                let rows: Vec<usize> = groups
                    .iter()
                    .enumerate()
                    .filter(|(_, x)| **x == g)
                    .map(|(i, _)| i)
                    .collect();
                if rows.is_empty() {
                    return Ok(None);
                }
                let part = herd_sql::insert_rows(&text, &rows).map_err(|e| {
                    ProxyError::Protocol(format!("splitting the INSERT's rows: {e}"))
                })?;
                request(batch, part.as_bytes(), &types, &rest).map(Some)
            })
            .collect()
    }
}

/// The statement as a group runs it: a simple query, or Parse/[Describe]/Bind/Execute/Sync
/// of the unnamed statement with the client's parameters.
fn request(batch: &Batch, sql: &[u8], types: &[u32], rest: &[u8]) -> Result<Vec<u8>, ProxyError> {
    let mut out = Vec::new();
    if batch.simple {
        encode::query(&mut out, sql)?;
        return Ok(out);
    }
    encode::parse(&mut out, b"", sql, types)?;
    if batch.describe_statement && !batch.describe_statement_after_bind {
        encode::describe(&mut out, KIND_STATEMENT, b"")?;
    }
    encode::bind_renamed(&mut out, b"", b"", rest)?;
    if batch.describe_statement_after_bind {
        encode::describe(&mut out, KIND_STATEMENT, b"")?;
    }
    // The portal's description: a RETURNING list's RowDescription, else NoData.
    encode::describe(&mut out, b'P', b"")?;
    encode::execute(&mut out, b"", 0)?;
    encode::sync(&mut out);
    Ok(out)
}

/// Runs the write in a transaction on every lease and prepares it, group 0 first; on the first
/// failure rolls back what was done and returns it. Each group's answer, in group order.
async fn prepare_writes(
    leases: &mut [Lease],
    gid: &str,
    requests: &[Option<Vec<u8>>],
) -> Result<Vec<Done>, ProxyError> {
    let mut answers = Vec::new();
    for i in 0..leases.len() {
        let lease = &mut leases[i];
        let request = requests.get(i).and_then(Option::as_ref);
        let step = async {
            lease.conn.internal_query("BEGIN").await?;
            let done = match request {
                Some(r) => run(lease, r).await?,
                None => Done::default(),
            };
            if i == 0 {
                lease
                    .conn
                    .internal_query(&super::two_phase::decision(gid))
                    .await?;
            }
            lease
                .conn
                .internal_query(&format!("PREPARE TRANSACTION '{gid}'"))
                .await?;
            Ok::<_, ProxyError>(done)
        };
        match step.await {
            Ok(done) => answers.push(done),
            Err(e) => {
                super::two_phase::abort(leases, i, gid).await;
                return Err(e);
            }
        }
    }
    Ok(answers)
}
