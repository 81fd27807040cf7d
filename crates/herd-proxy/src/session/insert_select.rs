//! `INSERT … SELECT` into a distributed table whose rows may belong to several shard groups
//! (issue #40): the proxy runs the SELECT alone — on the one group that answers it, or on
//! every group when it reads distributed tables there (a plain concatenation of their rows;
//! aggregates, DISTINCT, LIMIT or OFFSET across groups are refused) — reads each row's key,
//! and hands every group an `INSERT … VALUES` of its rows (herd-sql `insert_values`), which
//! `write_all.rs` runs all or none like a multi-row INSERT split by key. Inside a transaction
//! block the SELECT runs in the transaction's part on each group, so it sees the
//! transaction's own writes.
//!
//! What differs from one server, stated in the README: each group's rows are read at that
//! group's snapshot, the rows pass through the proxy (at most [`MAX_ROWS`] per statement), and
//! a key value must have the key's own type (or be a bare literal) so the proxy places it
//! exactly where the target column will hold it.

use herd_shard::InsertSelect;
use herd_sql::Literal;
use herd_wire::backend::DataRow;
use herd_wire::encode;

use super::batch::Batch;
use super::fan_out::not_supported;
use super::Session;
use crate::pool::Lease;
use crate::server::server_error;
use crate::ProxyError;

/// The most rows one `INSERT … SELECT` across groups moves through the proxy (they are held
/// in memory until every group has its statement).
pub(super) const MAX_ROWS: usize = 100_000;

/// The SELECT's answer on one group.
#[derive(Default)]
struct Source {
    /// Column type OIDs.
    types: Vec<u32>,
    /// Rows, values in text.
    rows: Vec<Vec<Option<String>>>,
}

impl Session {
    /// Each group's statement for an `INSERT … SELECT` of `plan` (`None`: no rows for that
    /// group, it prepares empty), given the batch's SQL, its parameters' types and the
    /// client's Bind.
    pub(super) async fn insert_select_requests<L: std::borrow::BorrowMut<Lease>>(
        &self,
        batch: &Batch,
        plan: &InsertSelect,
        leases: &mut [L],
        sql: &str,
        types: &[u32],
        bind: &[u8],
    ) -> Result<Vec<(usize, String)>, ProxyError> {
        let cut = herd_sql::insert_select(sql).map_err(not_supported)?;
        let sources: Vec<usize> = match plan.source {
            Some(g) => vec![g as usize],
            None => {
                let catalog = self.ctx.catalog();
                let shape = herd_sql::fan_out(&cut.source, &|n| catalog.may_be_aggregate(n))
                    .map_err(|why| not_supported(format!("the SELECT of this INSERT: {why}")))?;
                if shape.combine.is_some() || shape.limit.is_some() || shape.offset.is_some() {
                    return Err(not_supported(format!(
                        "INSERT … SELECT into distributed table {}: a SELECT across shard groups \
                         with aggregates, GROUP BY, DISTINCT, LIMIT or OFFSET is not supported \
                         yet as a source; select the rows by key, or insert them in steps",
                        plan.table
                    )));
                }
                (0..leases.len()).collect()
            }
        };
        let mut all = Source::default();
        for g in sources {
            let Some(lease) = leases.get_mut(g) else {
                return Err(not_supported(format!("shard group {g} has no server")));
            };
            let text = self.sql_on_group(g as u32, &cut.source)?;
            let part = run_source(lease.borrow_mut(), batch, &text, types, bind).await?;
            if all.types.is_empty() {
                all.types = part.types;
            }
            all.rows.extend(part.rows);
            if all.rows.len() > MAX_ROWS {
                return Err(not_supported(format!(
                    "INSERT … SELECT into distributed table {} across shard groups moves at most \
                     {MAX_ROWS} rows per statement through Herd's endpoint: insert in steps (by \
                     key range), or use COPY",
                    plan.table
                )));
            }
        }
        let names = match leases.first_mut() {
            Some(lease) => type_names(lease.borrow_mut(), &all.types).await?,
            None => Vec::new(),
        };
        let key_ok = cut.untyped.get(plan.key_index).copied().unwrap_or(false)
            || all
                .types
                .get(plan.key_index)
                .is_some_and(|&oid| key_alike(oid, plan.key_type));
        if !key_ok && !all.rows.is_empty() {
            return Err(not_supported(format!(
                "the SELECT's value for the shard key {}.{} is not of the key's type ({}): cast it \
                 in the SELECT (`… ::{}`), so Herd places each row where the column will hold it",
                plan.table, plan.key_column, plan.key_type, plan.key_type
            )));
        }
        let map = self
            .map
            .clone()
            .ok_or_else(|| not_supported("the shard map is not loaded".into()))?;
        let mut per_group: Vec<Vec<Vec<Literal>>> = vec![Vec::new(); leases.len()];
        for row in all.rows {
            let key = match row.get(plan.key_index) {
                Some(Some(text)) => Some(plan.key_type.parse(text).map_err(|e| {
                    not_supported(format!(
                        "{e} for {}.{} (a row of the INSERT's SELECT)",
                        plan.table, plan.key_column
                    ))
                })?),
                _ => None,
            };
            let group = map.group_of(key.as_ref()) as usize;
            let values = row
                .into_iter()
                .enumerate()
                .map(|(i, v)| match v {
                    None => Literal::Null,
                    Some(text) if cut.untyped.get(i).copied().unwrap_or(false) => {
                        Literal::Untyped(text)
                    }
                    Some(text) => match names.get(i) {
                        Some(name) => Literal::Typed(text, name.clone()),
                        None => Literal::Untyped(text),
                    },
                })
                .collect();
            per_group
                .get_mut(group)
                .ok_or_else(|| {
                    not_supported(format!(
                        "a row of the INSERT's SELECT belongs to shard group {group}, which is \
                         paused or unknown: run it again"
                    ))
                })?
                .push(values);
        }
        let width = all.types.len();
        let empty = per_group.iter().all(Vec::is_empty);
        let mut out = Vec::new();
        for (g, rows) in per_group.iter().enumerate() {
            // With no rows at all, group 0 still runs the INSERT (of none), so a RETURNING
            // list is described as one server describes it.
            if rows.is_empty() && !(empty && g == 0) {
                continue;
            }
            let text = herd_sql::insert_values(sql, rows, width)
                .map_err(|e| ProxyError::Protocol(format!("building the INSERT's rows: {e}")))?;
            out.push((g, text));
        }
        Ok(out)
    }
}

/// The source's value type OIDs whose text is the key's own text form: the key's types
/// (integers of any width for an integer key; `text`, `varchar` or `name` for a text key).
fn key_alike(oid: u32, key_type: herd_shard::KeyType) -> bool {
    use herd_shard::KeyType;
    match key_type {
        KeyType::Int2 | KeyType::Int4 | KeyType::Int8 => matches!(oid, 20 | 21 | 23),
        KeyType::Text => matches!(oid, 19 | 25 | 1043),
        KeyType::Uuid => oid == 2950,
    }
}

/// Runs the SELECT on `lease` (in its transaction, if one is open) with the client's
/// parameters, its values in text.
async fn run_source(
    lease: &mut Lease,
    batch: &Batch,
    sql: &str,
    types: &[u32],
    bind: &[u8],
) -> Result<Source, ProxyError> {
    let mut request = Vec::new();
    if batch.simple {
        encode::query(&mut request, sql)?;
    } else {
        let (params, _) = super::combine::split_bind(bind)?;
        let mut rest = params.to_vec();
        // No result format codes: every column in text.
        rest.extend_from_slice(&0u16.to_be_bytes());
        encode::parse(&mut request, b"", sql, types)?;
        encode::bind_renamed(&mut request, b"", b"", &rest)?;
        encode::describe(&mut request, b'P', b"")?;
        encode::execute(&mut request, b"", 0)?;
        encode::sync(&mut request);
    }
    lease.conn.send_own(&request).await?;
    let (mut source, mut error) = (Source::default(), None);
    loop {
        let (t, body) = lease.conn.next_message().await?;
        match t {
            b'T' => source.types = field_types(&body)?,
            b'D' if error.is_none() => {
                let row = DataRow::decode(&body)?;
                source.rows.push(
                    row.columns
                        .iter()
                        .map(|c| c.map(|b| String::from_utf8_lossy(b).into_owned()))
                        .collect(),
                );
                if source.rows.len() > MAX_ROWS {
                    // Read on to ReadyForQuery; the caller refuses.
                    error = Some(not_supported(format!(
                        "INSERT … SELECT across shard groups moves at most {MAX_ROWS} rows per \
                         statement through Herd's endpoint: insert in steps (by key range), or \
                         use COPY"
                    )));
                }
            }
            b'E' => error = error.or(Some(server_error(&body))),
            b'Z' => break,
            _ => {}
        }
    }
    error.map_or(Ok(source), Err)
}

/// The type OIDs of a RowDescription's fields.
fn field_types(body: &[u8]) -> Result<Vec<u32>, ProxyError> {
    let bad = || ProxyError::Protocol("malformed RowDescription".into());
    let count = u16::from_be_bytes([
        *body.first().ok_or_else(bad)?,
        *body.get(1).ok_or_else(bad)?,
    ]);
    let mut at = 2;
    let mut types = Vec::with_capacity(usize::from(count));
    for _ in 0..count {
        let name_end = body
            .get(at..)
            .and_then(|b| b.iter().position(|&c| c == 0))
            .ok_or_else(bad)?;
        // Name, NUL, table OID (4), column number (2), then the type OID.
        let oid_at = at + name_end + 1 + 6;
        let oid = body.get(oid_at..oid_at + 4).ok_or_else(bad)?;
        types.push(u32::from_be_bytes([oid[0], oid[1], oid[2], oid[3]]));
        // Type OID (4), type size (2), type modifier (4), format (2).
        at = oid_at + 12;
    }
    Ok(types)
}

/// Each OID's type name as `format_type` writes it (qualified when not on the search path,
/// so the literal's cast names the same type on every group). With typmod -1, not NULL:
/// `bpchar` and `"bit"` then name the types without a length, where `character` and `bit`
/// would mean a length of 1 and cut the value.
async fn type_names(lease: &mut Lease, types: &[u32]) -> Result<Vec<String>, ProxyError> {
    if types.is_empty() {
        return Ok(Vec::new());
    }
    let list: Vec<String> = types.iter().map(u32::to_string).collect();
    let rows = lease
        .conn
        .internal_query(&format!(
            "select format_type(t, -1) from unnest('{{{}}}'::oid[]) with ordinality u(t, n) \
             order by n",
            list.join(",")
        ))
        .await?;
    Ok(rows
        .into_iter()
        .map(|r| r.into_iter().next().flatten().unwrap_or_default())
        .collect())
}
