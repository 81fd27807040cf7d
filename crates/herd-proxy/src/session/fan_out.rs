//! A SELECT that every shard group answers (planned by `herd_sql::fan_out`): the statement
//! goes to every group's primary at once, and the client sees one result — group 0's
//! RowDescription without the hidden sort columns, the rows concatenated or merged in sort
//! order (a k-way merge that pulls from each group only as its rows are needed), OFFSET and
//! LIMIT applied to the merged stream, one CommandComplete with the total. Runs outside a
//! transaction block, through the simple or the extended protocol (one Bind and Execute per
//! message batch). Each group reads at its own snapshot: the groups are not read at one
//! instant (a cross-group snapshot needs distributed transactions).

use herd_sql::{Bound, FanOut, SortColumn};
use herd_wire::encode;
use herd_wire::frontend::KIND_STATEMENT;

use super::batch::Batch;
use super::rows::{data_row, fields, row_description, row_values, Field};
use super::Session;
use crate::merge::{self, KeyOrder, SortValue};
use crate::pool::Lease;
use crate::server::server_error;
use crate::ProxyError;

/// Output is written to the client in pieces of about this size.
const FLUSH_BYTES: usize = 64 * 1024;

/// SQLSTATE of what the merge cannot answer (feature_not_supported).
const NOT_SUPPORTED: &str = "0A000";

pub(super) fn not_supported(message: String) -> ProxyError {
    ProxyError::Server {
        code: NOT_SUPPORTED.into(),
        message,
    }
}

/// One group's answer as it is read, on a server connection the stream borrows (a pooled one,
/// or a part of the client's transaction).
pub(super) struct Stream<'a> {
    pub(super) lease: &'a mut Lease,
    /// Its ReadyForQuery was read.
    pub(super) done: bool,
    /// Its CommandComplete (or an error) was read: no more rows.
    pub(super) rows_done: bool,
    /// The status of its last ReadyForQuery (`I`, `T` in a transaction, `E` failed; 0 while
    /// none was read).
    pub(super) status: u8,
    /// Read to its ReadyForQuery without a connection failure: fit for its next use.
    pub(super) clean: bool,
}

impl<'a> Stream<'a> {
    pub(super) fn new(lease: &'a mut Lease) -> Stream<'a> {
        // Nothing sent yet: nothing to read.
        Stream {
            lease,
            done: true,
            rows_done: true,
            status: 0,
            clean: false,
        }
    }

    /// The next message, or `None` once ReadyForQuery was read.
    pub(super) async fn next(&mut self) -> Result<Option<(u8, Vec<u8>)>, ProxyError> {
        if self.done {
            return Ok(None);
        }
        let (t, body) = self.lease.conn.next_message().await?;
        if t == b'Z' {
            self.done = true;
            self.status = body.first().copied().unwrap_or(b'I');
        }
        Ok(Some((t, body)))
    }

    /// The next DataRow, `None` after the rows (errors are returned).
    async fn next_row(&mut self) -> Result<Option<Vec<u8>>, ProxyError> {
        while !self.rows_done {
            match self.next().await? {
                Some((b'D', body)) => return Ok(Some(body)),
                Some((b'C', _)) | None => self.rows_done = true,
                Some((b'E', body)) => {
                    self.rows_done = true;
                    return Err(server_error(&body));
                }
                Some(_) => {}
            }
        }
        Ok(None)
    }

    /// Reads up to ReadyForQuery, so the connection can go back to its pool.
    pub(super) async fn drain(&mut self) -> Result<(), ProxyError> {
        while self.next().await?.is_some() {}
        Ok(())
    }
}

/// A LIMIT/OFFSET's value (NULL or a missing parameter: no bound), a parameter read by its
/// type (`types`: the statement's parameter types, 0 where not known).
fn bound_value(
    what: &'static str,
    bound: Option<Bound>,
    params: &[herd_shard::ParamValue],
    types: &[u32],
) -> Result<Option<u64>, ProxyError> {
    let n = match bound {
        None => return Ok(None),
        Some(Bound::Const(n)) => n,
        Some(Bound::Param(p)) => {
            let value = params
                .get((p as usize).wrapping_sub(1))
                .unwrap_or(&herd_shard::ParamValue::Missing);
            let ty = types
                .get((p as usize).wrapping_sub(1))
                .copied()
                .unwrap_or(0);
            match super::bound::bound_param(what, p, value, ty) {
                Ok(Some(n)) => n,
                Ok(None) => return Ok(None),
                Err(e) => {
                    return Err(ProxyError::Server {
                        code: e.code().into(),
                        message: e.to_string(),
                    })
                }
            }
        }
    };
    if n < 0 {
        return Err(ProxyError::Server {
            code: "2201W".into(),
            message: format!("{what} must not be negative"),
        });
    }
    Ok(Some(n as u64))
}

/// A binary parameter used as LIMIT or OFFSET whose type the client left to the server.
fn untyped_binary_bound(plan: &FanOut, params: &[herd_shard::ParamValue], types: &[u32]) -> bool {
    [plan.limit, plan.offset].iter().any(|b| match b {
        Some(Bound::Param(p)) => {
            let i = (*p as usize).wrapping_sub(1);
            matches!(params.get(i), Some(herd_shard::ParamValue::Binary(_)))
                && types.get(i).copied().unwrap_or(0) == 0
        }
        _ => false,
    })
}

impl Session {
    /// Runs the SELECT of `unit` on every group and answers with the merged rows.
    pub(super) async fn fan_out(&mut self, unit: &[u8], plan: FanOut) -> Result<(), ProxyError> {
        // A portal bound now and executed by a later batch would be read in parts (or not at
        // all): the merge needs the whole answer in this one.
        if super::batch::binds_without_execute(unit) {
            let e = not_supported(super::batch::FETCHED_WHOLE.into());
            return self.reply_error(&e, unit).await;
        }
        let batch = match self.fan_out_batch(unit) {
            Ok(b) => b,
            Err(e) => return self.reply_error(&e, unit).await,
        };
        let mut leases = match self.primary_leases().await {
            Ok(l) => l,
            Err(e) => return self.reply_error(&e, unit).await,
        };
        let mut streams: Vec<Stream> = leases.iter_mut().map(Stream::new).collect();
        let answer = self.fan_out_on(&batch, &plan, &mut streams, b'I').await;
        let clean: Vec<bool> = streams.iter().map(|s| s.clean).collect();
        drop(streams);
        // Every connection read to its ReadyForQuery goes back to its pool; one that failed
        // mid-answer is closed.
        for (lease, clean) in leases.into_iter().zip(clean) {
            if clean {
                lease.release();
            }
        }
        self.answer_fan_out(answer, unit).await
    }

    /// Writes a fan-out's answer: its messages, or what was answered before an error, then the
    /// error.
    pub(super) async fn answer_fan_out(
        &mut self,
        answer: Result<Vec<u8>, (Vec<u8>, ProxyError)>,
        unit: &[u8],
    ) -> Result<(), ProxyError> {
        match answer {
            Ok(out) => {
                self.ctx.metrics.inc("herd_shard_fan_out_total", "");
                self.write_client(&out).await
            }
            Err((out, e)) => {
                // As from one server: what was answered before the error, then the error.
                self.write_client(&out).await?;
                self.reply_error(&e, unit).await
            }
        }
    }

    /// Runs the fan-out of `batch` on `streams` (group 0 first) and reads every stream to its
    /// ReadyForQuery. The client's messages (flushed to the client as they fill; ReadyForQuery
    /// with `status` when owed), or those before an error and the error.
    pub(super) async fn fan_out_on(
        &mut self,
        batch: &Batch,
        plan: &FanOut,
        streams: &mut [Stream<'_>],
        status: u8,
    ) -> Result<Vec<u8>, (Vec<u8>, ProxyError)> {
        // What the client is still owed goes first.
        let mut out = self.out.pending().to_vec();
        self.out.clear();
        let answered = self
            .fan_out_steps(batch, plan, streams, status, &mut out)
            .await;
        // Every stream is read to its ReadyForQuery (also after an error elsewhere).
        let mut drained = Ok(());
        for s in streams.iter_mut() {
            match s.drain().await {
                Ok(()) => s.clean = true,
                Err(e) => drained = drained.and(Err(e)),
            }
        }
        match drained.and(answered) {
            Ok(()) => Ok(out),
            Err(e) => Err((out, e)),
        }
    }

    /// The steps of a fan-out, writing the client's answer into `out`.
    async fn fan_out_steps(
        &mut self,
        batch: &Batch,
        plan: &FanOut,
        streams: &mut [Stream<'_>],
        status: u8,
        out: &mut Vec<u8>,
    ) -> Result<(), ProxyError> {
        let params = batch
            .bind
            .as_ref()
            .map(|(_, rest)| super::shard::bind_params(rest))
            .unwrap_or_default();
        // A combined query's partial and final statements keep every parameter of the
        // client's, typed as PostgreSQL infers them for the client's statement (one used only
        // in HAVING or LIMIT is not in the partial query). A binary LIMIT or OFFSET whose type
        // the client left open is read as the type the server gives it.
        let mut types = batch
            .bind
            .as_ref()
            .and_then(|(statement, _)| self.bound_types(statement))
            .unwrap_or_default();
        // An OFFSET parameter is left out of the groups' statement: its type must be declared
        // there, or the Bind's parameters would outnumber the statement's.
        let offset_param = matches!(plan.offset, Some(Bound::Param(_)));
        if (plan.combine.is_some() || offset_param || untyped_binary_bound(plan, &params, &types))
            && !batch.simple
        {
            if let Some(s) = streams.first_mut() {
                let sql = self.batch_sql(batch);
                types = super::batch::infer_param_types(s.lease, &sql, &types).await?;
            }
        }
        let limit = bound_value("LIMIT", plan.limit, &params, &types)?;
        let offset = bound_value("OFFSET", plan.offset, &params, &types)?.unwrap_or(0);
        // One statement for every group, unless a move makes some group hide rows.
        let requests = if self.hides_rows() {
            (0..streams.len() as u32)
                .map(|g| {
                    let sql = self.sql_on_group(g, &plan.sql)?;
                    self.group_request(batch, plan, &sql, &types)
                })
                .collect::<Result<Vec<_>, _>>()?
        } else {
            vec![self.group_request(batch, plan, &plan.sql, &types)?]
        };
        for (i, s) in streams.iter_mut().enumerate() {
            let request = &requests[i.min(requests.len() - 1)];
            // Our statements replace the server's unnamed statement (a simple query drops it):
            // it no longer holds any client's. A stream is read only once sent to; one whose
            // sending failed is left unread and so not clean (its connection is closed).
            s.done = false;
            s.rows_done = false;
            s.lease.conn.send_own(request).await?;
        }
        match &plan.combine {
            Some(combine) => {
                self.combine(streams, batch, combine, &plan.sql, status, out)
                    .await
            }
            None => {
                let rows = self
                    .merge(streams, batch, plan, (limit, offset), out)
                    .await?;
                self.ctx
                    .metrics
                    .add("herd_shard_fan_out_rows_total", "", rows);
                encode::command_complete(out, &format!("SELECT {rows}"))?;
                if batch.simple || batch.sync {
                    encode::ready_for_query(out, status)?;
                }
                Ok(())
            }
        }
    }

    /// What every group is sent: the group statement, with the client's parameters.
    fn group_request(
        &self,
        batch: &Batch,
        plan: &FanOut,
        sql: &str,
        types: &[u32],
    ) -> Result<Vec<u8>, ProxyError> {
        let mut out = Vec::new();
        if batch.simple {
            encode::query(&mut out, sql)?;
            return Ok(out);
        }
        let (_, rest) = batch.bind.clone().unwrap_or_default();
        if plan.combine.is_some() {
            // Partial rows in text (they become the final query's parameters), and the
            // statement's parameter types (the final query declares them).
            encode::parse(&mut out, b"", sql, types)?;
            encode::describe(&mut out, KIND_STATEMENT, b"")?;
            let (params, _) = super::combine::split_bind(&rest)?;
            let mut text_results = params.to_vec();
            text_results.extend_from_slice(&0u16.to_be_bytes());
            encode::bind_renamed(&mut out, b"", b"", &text_results)?;
            encode::execute(&mut out, b"", 0)?;
            encode::sync(&mut out);
            return Ok(out);
        }
        encode::parse(&mut out, b"", sql, types)?;
        // The groups answer in the order the client asked, which the client's answer keeps.
        let describe_first = batch.describe_statement && !batch.describe_statement_after_bind;
        if describe_first {
            encode::describe(&mut out, KIND_STATEMENT, b"")?;
        }
        encode::bind_renamed(&mut out, b"", b"", &rest)?;
        if batch.describe_statement_after_bind {
            encode::describe(&mut out, KIND_STATEMENT, b"")?;
        }
        encode::describe(&mut out, b'P', b"")?;
        encode::execute(&mut out, b"", 0)?;
        encode::sync(&mut out);
        Ok(out)
    }

    /// One merged row: skipped while the OFFSET lasts, else sent without its hidden columns
    /// (flushed to the client in pieces).
    async fn emit(
        &mut self,
        row: &[u8],
        skipped: &mut u64,
        offset: u64,
        rows: &mut u64,
        visible: usize,
        out: &mut Vec<u8>,
    ) -> Result<(), ProxyError> {
        if *skipped < offset {
            *skipped += 1;
            return Ok(());
        }
        data_row(out, &row_values(row)?, visible);
        *rows += 1;
        if out.len() >= FLUSH_BYTES {
            self.write_client(out).await?;
            out.clear();
        }
        Ok(())
    }

    /// The declared parameter types of the statement a Bind names.
    pub(super) fn bound_types(&self, statement: &[u8]) -> Option<Vec<u32>> {
        if statement.is_empty() {
            return self
                .state
                .unnamed
                .as_ref()
                .map(|u| u.stmt.param_types.clone());
        }
        self.state
            .statements
            .get(statement)
            .map(|s| s.param_types.clone())
    }

    /// Reads the groups' answers and writes the client's into `out` (flushed to the client as
    /// it fills), up to (not including) the CommandComplete; the number of rows sent.
    async fn merge(
        &mut self,
        streams: &mut [Stream<'_>],
        batch: &Batch,
        plan: &FanOut,
        (limit, offset): (Option<u64>, u64),
        out: &mut Vec<u8>,
    ) -> Result<u64, ProxyError> {
        // The headers: group 0's are the client's; every group's up to its RowDescription.
        let mut described = None;
        for (g, s) in streams.iter_mut().enumerate() {
            let portal = header(
                s,
                batch,
                if g == 0 { Some(&mut *out) } else { None },
                plan.hidden,
            )
            .await?;
            if g == 0 {
                described = Some(portal);
            }
        }
        let Some(fields) = described else {
            return Ok(0);
        };
        let visible = fields.len().saturating_sub(plan.hidden);
        // The sort keys' columns, types and formats.
        let mut order = Vec::new();
        let mut key_fields = Vec::new();
        for k in &plan.sort {
            let at = match k.column {
                SortColumn::Output(i) => i,
                SortColumn::Hidden(j) => visible + j,
            };
            let f = fields
                .get(at)
                .ok_or_else(|| not_supported("ORDER BY position out of range".into()))?;
            order.push(KeyOrder {
                descending: k.descending,
                nulls_first: k.nulls_first,
            });
            key_fields.push((at, f.type_oid, f.format, f.table, f.column));
        }
        let text_columns: Vec<(u32, i16)> = key_fields
            .iter()
            .filter(|k| merge::is_text(k.1))
            .map(|k| (k.3, k.4))
            .collect();
        if !text_columns.is_empty() {
            let mut other = self
                .ctx
                .non_bytewise_collation(&self.database, &text_columns)
                .await?;
            if other.is_none() && text_columns.iter().any(|c| c.0 == 0) {
                // An expression: its collation comes from the columns it reads.
                let tables: Vec<String> = herd_sql::key_facts(&plan.sql)
                    .map(|f| f.tables.into_iter().map(|t| t.name).collect())
                    .unwrap_or_default();
                other = self
                    .ctx
                    .table_with_other_collation(&self.database, &tables)
                    .await?;
            }
            if let Some(collation) = other {
                return Err(not_supported(format!(
                    "ORDER BY on text across shard groups is merged in byte order, which is the \
                     C collation's; this text has collation {collation}: order by an expression \
                     with COLLATE \"C\", or add a condition on the shard key"
                )));
            }
        }
        let keys_of = |row: &[u8]| -> Result<Vec<SortValue>, ProxyError> {
            let values = row_values(row)?;
            key_fields
                .iter()
                .map(|(at, type_oid, format, ..)| {
                    merge::sort_value(*type_oid, *format, values.get(*at).copied().flatten())
                        .map_err(not_supported)
                })
                .collect()
        };
        let mut skipped = 0u64;
        let mut rows = 0u64;
        let wanted = |rows: u64| limit.is_none_or(|l| rows < l);
        if plan.sort.is_empty() {
            'groups: for s in streams.iter_mut() {
                while wanted(rows) {
                    let Some(row) = s.next_row().await? else {
                        continue 'groups;
                    };
                    self.emit(&row, &mut skipped, offset, &mut rows, visible, out)
                        .await?;
                }
                break;
            }
        } else {
            // Each group's next row and its keys; the least goes out next.
            let mut heads: Vec<Option<(Vec<SortValue>, Vec<u8>)>> = Vec::new();
            for s in streams.iter_mut() {
                heads.push(match s.next_row().await? {
                    Some(row) => Some((keys_of(&row)?, row)),
                    None => None,
                });
            }
            while wanted(rows) {
                let mut best: Option<usize> = None;
                for (i, h) in heads.iter().enumerate() {
                    let Some((keys, _)) = h else { continue };
                    let better = match best.and_then(|b| heads[b].as_ref()) {
                        None => true,
                        Some((bk, _)) => {
                            merge::compare_keys(&order, keys, bk) == std::cmp::Ordering::Less
                        }
                    };
                    if better {
                        best = Some(i);
                    }
                }
                let Some(i) = best else { break };
                let next = match streams[i].next_row().await? {
                    Some(row) => Some((keys_of(&row)?, row)),
                    None => None,
                };
                let Some((_, row)) = std::mem::replace(&mut heads[i], next) else {
                    break;
                };
                self.emit(&row, &mut skipped, offset, &mut rows, visible, out)
                    .await?;
            }
        }
        Ok(rows)
    }
}

/// Reads one group's answer up to its rows. Into `client` (group 0) goes what the client's
/// batch is owed: ParseComplete per Parse, the statement's ParameterDescription and
/// RowDescription, BindComplete, the portal's RowDescription — without the hidden columns.
/// The RowDescription of the rows' fields is returned.
async fn header(
    s: &mut Stream<'_>,
    batch: &Batch,
    mut client: Option<&mut Vec<u8>>,
    hidden: usize,
) -> Result<Vec<Field>, ProxyError> {
    let mut described_statement = false;
    loop {
        let Some((t, body)) = s.next().await? else {
            return Err(ProxyError::Protocol(
                "a shard group ended its answer before the rows".into(),
            ));
        };
        match t {
            b'E' => {
                s.rows_done = true;
                return Err(server_error(&body));
            }
            b'1' => {
                if let Some(out) = client.as_deref_mut() {
                    for _ in &batch.parses {
                        encode::parse_complete(out);
                    }
                }
            }
            b't' => {
                if let Some(out) = client.as_deref_mut() {
                    out.push(b't');
                    out.extend_from_slice(&((body.len() + 4) as u32).to_be_bytes());
                    out.extend_from_slice(&body);
                }
            }
            b'2' => {
                if let Some(out) = client.as_deref_mut() {
                    encode::bind_complete(out);
                }
            }
            b'T' if batch.describe_statement && !described_statement => {
                described_statement = true;
                if let Some(out) = client.as_deref_mut() {
                    let f = fields(&body)?;
                    let keep = f.len().saturating_sub(hidden);
                    row_description(out, &f, keep);
                }
            }
            b'T' => {
                let f = fields(&body)?;
                if let Some(out) = client.as_deref_mut() {
                    if batch.simple || batch.describe_portal {
                        let keep = f.len().saturating_sub(hidden);
                        row_description(out, &f, keep);
                    }
                }
                return Ok(f);
            }
            _ => {}
        }
    }
}
