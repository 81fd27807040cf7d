//! Aggregates, GROUP BY, HAVING and DISTINCT across shard groups (planned by
//! `herd_sql::Combine`): every group returns its partial rows (in text), then group 0's
//! primary computes the answer from all of them with the final query — the partial values
//! bound as parameters typed like the partial columns, after the client's own parameters —
//! and that query's answer, in the result formats the client asked for, is the client's.

use herd_sql::Combine;
use herd_wire::encode;
use herd_wire::frontend::KIND_STATEMENT;

use super::batch::Batch;
use super::fan_out::{not_supported, Stream};
use super::rows::{fields, row_values};
use super::Session;
use crate::server::server_error;
use crate::ProxyError;

/// PostgreSQL's limit on a statement's parameters.
const MAX_PARAMS: usize = 65_535;

/// A Bind's rest split into its parameters (format codes and values, as sent) and its
/// result format codes.
pub(super) fn split_bind(rest: &[u8]) -> Result<(&[u8], Vec<i16>), ProxyError> {
    let bad = || ProxyError::Protocol("malformed Bind".into());
    let u16_at = |at: usize| -> Result<usize, ProxyError> {
        Ok(u16::from_be_bytes([
            *rest.get(at).ok_or_else(bad)?,
            *rest.get(at + 1).ok_or_else(bad)?,
        ]) as usize)
    };
    let codes = u16_at(0)?;
    let mut at = 2 + 2 * codes;
    let values = u16_at(at)?;
    at += 2;
    for _ in 0..values {
        let len = i32::from_be_bytes(
            rest.get(at..at + 4)
                .ok_or_else(bad)?
                .try_into()
                .map_err(|_| bad())?,
        );
        at += 4 + usize::try_from(len).unwrap_or(0);
    }
    let params = rest.get(..at).ok_or_else(bad)?;
    let results = u16_at(at)?;
    let formats = (0..results)
        .map(|i| u16_at(at + 2 + 2 * i).map(|c| c as i16))
        .collect::<Result<_, _>>()?;
    Ok((params, formats))
}

/// The client's parameters (each with its format code) followed by `extra` in text.
fn bind_with(
    client: &[u8],
    extra: &[Option<Vec<u8>>],
    result_formats: &[i16],
) -> Result<Vec<u8>, ProxyError> {
    let bad = || ProxyError::Protocol("malformed Bind".into());
    let u16_at = |at: usize| -> Result<usize, ProxyError> {
        Ok(u16::from_be_bytes([
            *client.get(at).ok_or_else(bad)?,
            *client.get(at + 1).ok_or_else(bad)?,
        ]) as usize)
    };
    let (mut codes, mut values): (Vec<u16>, &[u8]) = (Vec::new(), &[]);
    let mut count = 0;
    if !client.is_empty() {
        let n = u16_at(0)?;
        for i in 0..n {
            codes.push(u16_at(2 + 2 * i)? as u16);
        }
        count = u16_at(2 + 2 * n)?;
        values = client.get(4 + 2 * n..).ok_or_else(bad)?;
    }
    // One code for all, or none (text): spelled out per parameter.
    let codes: Vec<u16> = match codes.len() {
        0 => vec![0; count],
        1 => vec![codes[0]; count],
        _ => codes,
    };
    let total = count + extra.len();
    let mut out = Vec::new();
    out.extend_from_slice(&(total as u16).to_be_bytes());
    for c in codes.iter().chain(std::iter::repeat_n(&0u16, extra.len())) {
        out.extend_from_slice(&c.to_be_bytes());
    }
    out.extend_from_slice(&(total as u16).to_be_bytes());
    out.extend_from_slice(values);
    for v in extra {
        match v {
            None => out.extend_from_slice(&(-1i32).to_be_bytes()),
            Some(b) => {
                out.extend_from_slice(&(b.len() as i32).to_be_bytes());
                out.extend_from_slice(b);
            }
        }
    }
    out.extend_from_slice(&(result_formats.len() as u16).to_be_bytes());
    for f in result_formats {
        out.extend_from_slice(&f.to_be_bytes());
    }
    Ok(out)
}

/// One group's partial answer.
#[derive(Default)]
struct Partial {
    /// ParameterDescription's body (extended protocol).
    params: Option<Vec<u8>>,
    /// Column type OIDs.
    types: Vec<u32>,
    /// Each column's source (table OID, column number; 0, 0 for an expression).
    sources: Vec<(u32, i16)>,
    /// Rows, values in text.
    rows: Vec<Vec<Option<Vec<u8>>>>,
}

async fn read_partial(s: &mut Stream<'_>) -> Result<Partial, ProxyError> {
    let mut p = Partial::default();
    let mut error = None;
    while let Some((t, body)) = s.next().await? {
        match t {
            b't' => p.params = Some(body),
            b'T' => {
                let described = fields(&body)?;
                p.types = described.iter().map(|f| f.type_oid).collect();
                p.sources = described.iter().map(|f| (f.table, f.column)).collect();
            }
            b'D' if error.is_none() => p.rows.push(
                row_values(&body)?
                    .into_iter()
                    .map(|v| v.map(<[u8]>::to_vec))
                    .collect(),
            ),
            b'E' => error = error.or(Some(server_error(&body))),
            _ => {}
        }
    }
    s.rows_done = true;
    error.map_or(Ok(p), Err)
}

/// The parameter type OIDs of a ParameterDescription body.
pub(super) fn param_types(body: &[u8]) -> Vec<u32> {
    body.get(2..)
        .unwrap_or_default()
        .chunks_exact(4)
        .map(|c| u32::from_be_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

impl Session {
    /// Reads every group's partial rows, runs the final query on group 0's connection and
    /// writes its answer (the client's) into `out`, ReadyForQuery (`status`) included when owed.
    pub(super) async fn combine(
        &mut self,
        streams: &mut [Stream<'_>],
        batch: &Batch,
        combine: &Combine,
        partial_sql: &str,
        status: u8,
        out: &mut Vec<u8>,
    ) -> Result<(), ProxyError> {
        let mut partials = Vec::new();
        for s in streams.iter_mut() {
            partials.push(read_partial(s).await?);
        }
        let Some(first) = partials.first() else {
            return Ok(());
        };
        let collations = self.partial_collations(first, partial_sql).await?;
        let types = first.types.clone();
        let client_types = first.params.as_deref().map(param_types).unwrap_or_default();
        let rows: Vec<&Vec<Option<Vec<u8>>>> = partials.iter().flat_map(|p| &p.rows).collect();
        self.ctx
            .metrics
            .add("herd_shard_fan_out_rows_total", "", rows.len() as u64);
        let width = types.len() + 1;
        if client_types.len() + rows.len().max(1) * width > MAX_PARAMS {
            return Err(not_supported(format!(
                "combining {} partial rows from the shard groups exceeds PostgreSQL's {MAX_PARAMS} \
                 parameters: add a condition on the shard key, or group by fewer values",
                rows.len()
            )));
        }
        let final_sql = combine
            .final_sql_collated(&types, &collations, client_types.len() + 1, rows.len())
            .map_err(not_supported)?;
        // The partial values (and herd_keep), typed like the partial columns.
        let mut value_types = Vec::new();
        let mut values: Vec<Option<Vec<u8>>> = Vec::new();
        for r in rows
            .iter()
            .map(|r| Some(*r))
            .chain(rows.is_empty().then_some(None))
        {
            value_types.extend_from_slice(&types);
            value_types.push(crate::merge::oid::BOOL);
            match r {
                Some(r) => {
                    values.extend(r.iter().cloned());
                    values.push(Some(b"t".to_vec()));
                }
                None => {
                    values.extend(std::iter::repeat_n(None, types.len()));
                    values.push(Some(b"f".to_vec()));
                }
            }
        }
        let mut declared = client_types.clone();
        declared.extend_from_slice(&value_types);
        let (client_params, result_formats) = match &batch.bind {
            Some((_, rest)) => {
                let (params, formats) = split_bind(rest)?;
                (params.to_vec(), formats)
            }
            None => (Vec::new(), Vec::new()),
        };
        let mut request = Vec::new();
        encode::parse(&mut request, b"", &final_sql, &declared)?;
        // Answers in the order the client asked (a Describe of the statement before or after
        // its Bind).
        let describe_first = batch.describe_statement && !batch.describe_statement_after_bind;
        if describe_first {
            encode::describe(&mut request, KIND_STATEMENT, b"")?;
        }
        let bind = bind_with(&client_params, &values, &result_formats)?;
        encode::bind_renamed(&mut request, b"", b"", &bind)?;
        if batch.describe_statement_after_bind {
            encode::describe(&mut request, KIND_STATEMENT, b"")?;
        }
        if batch.simple || batch.describe_portal {
            encode::describe(&mut request, b'P', b"")?;
        }
        encode::execute(&mut request, b"", 0)?;
        encode::sync(&mut request);
        let Some(coordinator) = streams.first_mut() else {
            return Ok(());
        };
        coordinator.lease.conn.send_own(&request).await?;
        coordinator.done = false;
        coordinator.rows_done = false;
        // Its answer is the client's: ParseComplete per client Parse, the client's own
        // ParameterDescription (not the final query's), the rest as it comes.
        let mut error = None;
        while let Some((t, body)) = coordinator.next().await? {
            match t {
                b'1' if !batch.simple => {
                    for _ in &batch.parses {
                        encode::parse_complete(out);
                    }
                }
                b't' => {
                    let desc = first.params.clone().unwrap_or_default();
                    push(out, b't', &desc);
                }
                b'2' if !batch.simple => encode::bind_complete(out),
                b'T' | b'n' | b'D' | b'C' if error.is_none() => push(out, t, &body),
                b'E' => error = error.or(Some(server_error(&body))),
                b'Z' if error.is_none() && (batch.simple || batch.sync) => {
                    encode::ready_for_query(out, status)?;
                }
                _ => {}
            }
            if out.len() >= 64 * 1024 {
                self.write_client(out).await?;
                out.clear();
            }
        }
        error.map_or(Ok(()), Err)
    }
}

impl Session {
    /// The collation each partial column's values take in the final query (`None`: the
    /// database's default, which parameters have). A column of a table keeps its own (see
    /// [`crate::ProxyContext::column_collations`]); text computed by an expression
    /// (`min(name)`, `upper(name)`) over a table with a column of another collation is
    /// refused, since the RowDescription does not say which collation it has.
    async fn partial_collations(
        &self,
        partial: &Partial,
        partial_sql: &str,
    ) -> Result<Vec<Option<String>>, ProxyError> {
        let text: Vec<bool> = partial
            .types
            .iter()
            .map(|t| crate::merge::is_text(*t))
            .collect();
        if !text.contains(&true) {
            return Ok(Vec::new());
        }
        if text
            .iter()
            .zip(&partial.sources)
            .any(|(t, s)| *t && s.0 == 0)
        {
            let tables: Vec<String> = herd_sql::key_facts(partial_sql)
                .map(|f| f.tables.into_iter().map(|t| t.name).collect())
                .unwrap_or_default();
            if let Some(collation) = self
                .ctx
                .non_default_collation_in(&self.database, &tables)
                .await?
            {
                return Err(not_supported(format!(
                    "text computed across shard groups (min, max, or an expression over a \
                     column) is combined under the database's default collation; the table \
                     has collation {collation}, under which equal values and order may differ: \
                     group or aggregate the column itself, or add a condition on the shard key \
                     to read one group"
                )));
            }
        }
        let columns: Vec<(u32, i16)> = text
            .iter()
            .zip(&partial.sources)
            .map(|(t, s)| if *t && s.0 != 0 { *s } else { (0, 0) })
            .collect();
        self.ctx.column_collations(&self.database, &columns).await
    }
}

fn push(out: &mut Vec<u8>, tag: u8, body: &[u8]) {
    out.push(tag);
    out.extend_from_slice(&((body.len() + 4) as u32).to_be_bytes());
    out.extend_from_slice(body);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn binds_keep_the_clients_parameters_and_add_text_ones() {
        // One binary parameter (format code 1 for all), result formats: one binary.
        let mut rest = Vec::new();
        rest.extend_from_slice(&1u16.to_be_bytes());
        rest.extend_from_slice(&1u16.to_be_bytes());
        rest.extend_from_slice(&1u16.to_be_bytes());
        rest.extend_from_slice(&4i32.to_be_bytes());
        rest.extend_from_slice(&7i32.to_be_bytes());
        rest.extend_from_slice(&1u16.to_be_bytes());
        rest.extend_from_slice(&1u16.to_be_bytes());
        let (params, formats) = split_bind(&rest).expect("split");
        assert_eq!(formats, vec![1]);
        assert_eq!(params.len(), rest.len() - 4);
        let bind = bind_with(params, &[Some(b"5".to_vec()), None], &formats).expect("bind");
        let params = super::super::shard::bind_params(&bind);
        assert_eq!(
            params,
            vec![
                herd_shard::ParamValue::Binary(7i32.to_be_bytes().to_vec()),
                herd_shard::ParamValue::Text(b"5".to_vec()),
                herd_shard::ParamValue::Null,
            ]
        );
        let (_, formats) = split_bind(&bind).expect("split again");
        assert_eq!(formats, vec![1]);
        // No client parameters at all (the simple protocol).
        let bind = bind_with(&[], &[Some(b"x".to_vec())], &[]).expect("bind");
        assert_eq!(
            super::super::shard::bind_params(&bind),
            vec![herd_shard::ParamValue::Text(b"x".to_vec())]
        );
        assert!(split_bind(&[0, 1]).is_err());
    }
}
