//! Sending one case's statement to one server in one protocol mode, and rendering what comes
//! back as text rows (binary values decoded or hex) or an error.

use std::error::Error as StdError;
use std::time::Duration;

use futures_util::{pin_mut, TryStreamExt};
use tokio_postgres::types::{Format, FromSql, IsNull, ToSql, Type};
use tokio_postgres::{Client, SimpleQueryMessage};

use crate::compare::Outcome;
use crate::gen::{Case, Param};

/// How long one statement may take before it counts as an error ("timeout").
const STATEMENT_TIMEOUT: Duration = Duration::from_secs(20);

/// How a case's statement is sent.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Mode {
    /// Simple protocol, parameters inlined as literals, text results.
    Simple,
    /// Extended protocol through a named prepared statement (`query_raw`): types inferred by
    /// the server, binary parameters, binary results.
    Prepared,
    /// Extended protocol, named statement prepared with declared parameter types
    /// (`prepare_typed`; int2/int4/int8/text as the generator chose), binary parameters.
    TypedBinary,
    /// As `TypedBinary` with every parameter sent in text format.
    TypedText,
    /// Extended protocol, unnamed statement in one pipeline (`query_typed_raw`: Parse with
    /// declared types, Bind, Describe statement, Execute, Sync), binary parameters.
    Unnamed,
    /// Extended protocol inside a transaction: a portal bound once and read 3 rows per
    /// Execute (PortalSuspended in between), binary parameters (reads only).
    Portal,
    /// Extended protocol, three statements pipelined before their answers are read (the case's
    /// statement, a read of one key, the case's statement again), binary parameters.
    Pipelined,
    /// Extended protocol with text parameters and text results, server-inferred types, on a
    /// bare protocol connection (`rawtext.rs`).
    RawText,
}

/// A parameter that encodes itself as whatever integer or text type the statement wants, in
/// binary or (when `text`) in text format.
#[derive(Debug)]
struct Flex<'a> {
    param: &'a Param,
    text: bool,
}

impl ToSql for Flex<'_> {
    fn to_sql(
        &self,
        ty: &Type,
        out: &mut bytes::BytesMut,
    ) -> Result<IsNull, Box<dyn StdError + Sync + Send>> {
        if self.text {
            let s = match self.param {
                Param::Text(s) => s.clone(),
                p => p.literal(),
            };
            out.extend_from_slice(s.as_bytes());
            return Ok(IsNull::No);
        }
        let int = match self.param {
            Param::I2(v) => i64::from(*v),
            Param::I4(v) => i64::from(*v),
            Param::I8(v) => *v,
            Param::Text(s) => return s.as_str().to_sql(ty, out),
        };
        match *ty {
            Type::INT2 => i16::try_from(int)?.to_sql(ty, out),
            Type::INT4 => i32::try_from(int)?.to_sql(ty, out),
            Type::INT8 => int.to_sql(ty, out),
            Type::NUMERIC => Err(format!("no binary numeric for {int}").into()),
            _ => int.to_string().as_str().to_sql(ty, out),
        }
    }

    fn accepts(_: &Type) -> bool {
        true
    }

    fn encode_format(&self, _ty: &Type) -> Format {
        if self.text {
            Format::Text
        } else {
            Format::Binary
        }
    }

    tokio_postgres::types::to_sql_checked!();
}

/// The declared type of a parameter (typed modes).
fn declared(p: &Param) -> Type {
    match p {
        Param::I2(_) => Type::INT2,
        Param::I4(_) => Type::INT4,
        Param::I8(_) => Type::INT8,
        Param::Text(_) => Type::TEXT,
    }
}

/// Any binary value, kept as bytes.
struct Raw(Vec<u8>);

impl<'a> FromSql<'a> for Raw {
    fn from_sql(_: &Type, raw: &'a [u8]) -> Result<Raw, Box<dyn StdError + Sync + Send>> {
        Ok(Raw(raw.to_vec()))
    }
    fn accepts(_: &Type) -> bool {
        true
    }
}

/// A binary value as text: integers, bools and text decoded, numeric decoded, the rest hex.
fn render(ty: &Type, b: &[u8]) -> String {
    let be = |n: usize| -> i64 {
        b.iter()
            .take(n)
            .fold(0i64, |acc, x| (acc << 8) | i64::from(*x))
    };
    match *ty {
        Type::INT2 if b.len() == 2 => (be(2) as i16).to_string(),
        Type::INT4 if b.len() == 4 => (be(4) as i32).to_string(),
        Type::INT8 if b.len() == 8 => be(8).to_string(),
        Type::BOOL if b.len() == 1 => (if b[0] == 1 { "t" } else { "f" }).into(),
        Type::TEXT | Type::VARCHAR | Type::BPCHAR | Type::NAME | Type::UNKNOWN => {
            String::from_utf8_lossy(b).into_owned()
        }
        Type::NUMERIC => numeric(b).unwrap_or_else(|| hex(b)),
        _ => format!("{}:{}", ty.name(), hex(b)),
    }
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// Binary numeric (ndigits, weight, sign, dscale, base-10000 digits) as decimal text.
fn numeric(b: &[u8]) -> Option<String> {
    let word = |i: usize| -> Option<i32> {
        Some(i32::from(u16::from_be_bytes([*b.get(i)?, *b.get(i + 1)?])))
    };
    let (ndigits, weight, sign, dscale) = (word(0)?, word(2)? as i16, word(4)?, word(6)?);
    if sign == 0xC000 {
        return Some("NaN".into());
    }
    let digits: Vec<i32> = (0..ndigits)
        .map(|i| word(8 + 2 * i as usize))
        .collect::<Option<_>>()?;
    let weight = i32::from(weight);
    let group = |e: i32| -> i32 {
        let i = weight - e;
        if i >= 0 {
            digits.get(i as usize).copied().unwrap_or(0)
        } else {
            0
        }
    };
    let mut int = String::new();
    for e in (0..=weight.max(0)).rev() {
        int.push_str(&if int.is_empty() {
            group(e).to_string()
        } else {
            format!("{:04}", group(e))
        });
    }
    let mut frac = String::new();
    let mut e = -1;
    while (frac.len() as i32) < dscale {
        frac.push_str(&format!("{:04}", group(e)));
        e -= 1;
    }
    frac.truncate(dscale as usize);
    let neg = if sign == 0x4000 { "-" } else { "" };
    Some(if dscale > 0 {
        format!("{neg}{int}.{frac}")
    } else {
        format!("{neg}{int}")
    })
}

pub fn error_text(e: &tokio_postgres::Error) -> Outcome {
    match e.as_db_error() {
        Some(d) => Outcome::Error(d.code().code().to_string(), d.message().to_string()),
        None => Outcome::Error("client".into(), e.to_string()),
    }
}

/// Runs `sql` in the simple protocol.
pub async fn simple(client: &Client, sql: &str, command: bool) -> Outcome {
    let run = client.simple_query(sql);
    let msgs = match tokio::time::timeout(STATEMENT_TIMEOUT, run).await {
        Err(_) => return Outcome::Error("timeout".into(), sql.into()),
        Ok(Err(e)) => return error_text(&e),
        Ok(Ok(m)) => m,
    };
    let mut rows = Vec::new();
    for m in msgs {
        match m {
            SimpleQueryMessage::Row(r) => rows.push(
                (0..r.len())
                    .map(|i| r.get(i).unwrap_or("NULL").to_string())
                    .collect(),
            ),
            SimpleQueryMessage::CommandComplete(n) if command => {
                rows.push(vec![format!("affected {n}")])
            }
            _ => {}
        }
    }
    Outcome::Rows(rows)
}

/// Runs the case's statement in an extended mode.
async fn extended(client: &Client, case: &Case, mode: Mode) -> Outcome {
    let flex: Vec<Flex> = case
        .params
        .iter()
        .map(|p| Flex {
            param: p,
            text: mode == Mode::TypedText,
        })
        .collect();
    let run = async {
        let stream = match mode {
            Mode::Unnamed => {
                let typed = flex
                    .iter()
                    .zip(&case.params)
                    .map(|(f, p)| (f as &(dyn ToSql + Sync), declared(p)));
                client.query_typed_raw(case.sql.as_str(), typed).await?
            }
            _ => {
                let refs: Vec<&(dyn ToSql + Sync)> =
                    flex.iter().map(|f| f as &(dyn ToSql + Sync)).collect();
                let prepared = if mode == Mode::Prepared {
                    client.prepare(&case.sql).await?
                } else {
                    let types: Vec<Type> = case.params.iter().map(declared).collect();
                    client.prepare_typed(&case.sql, &types).await?
                };
                client.query_raw(&prepared, refs).await?
            }
        };
        pin_mut!(stream);
        let mut rows = Vec::new();
        while let Some(row) = stream.try_next().await? {
            let mut out = Vec::new();
            for (i, col) in row.columns().iter().enumerate() {
                let v: Option<Raw> = row.try_get(i)?;
                out.push(v.map_or("NULL".into(), |r| render(col.type_(), &r.0)));
            }
            rows.push(out);
        }
        if case.command {
            rows.push(vec![format!(
                "affected {}",
                stream.rows_affected().unwrap_or(0)
            )]);
        }
        Ok::<_, tokio_postgres::Error>(rows)
    };
    match tokio::time::timeout(STATEMENT_TIMEOUT, run).await {
        Err(_) => Outcome::Error("timeout".into(), case.sql.clone()),
        Ok(Err(e)) => error_text(&e),
        Ok(Ok(rows)) => Outcome::Rows(rows),
    }
}

/// Runs the case's statement through a portal read 3 rows at a time, in a transaction that
/// is rolled back.
async fn portal(client: &mut Client, case: &Case) -> Outcome {
    let flex: Vec<Flex> = case
        .params
        .iter()
        .map(|p| Flex {
            param: p,
            text: false,
        })
        .collect();
    let refs: Vec<&(dyn ToSql + Sync)> = flex.iter().map(|f| f as &(dyn ToSql + Sync)).collect();
    let run = async {
        let tx = client.transaction().await?;
        let stmt = tx.prepare(&case.sql).await?;
        let portal = tx.bind(&stmt, &refs).await?;
        let mut rows = Vec::new();
        loop {
            let part = tx.query_portal(&portal, 3).await?;
            if part.is_empty() {
                break;
            }
            for row in part {
                let mut out = Vec::new();
                for (i, col) in row.columns().iter().enumerate() {
                    let v: Option<Raw> = row.try_get(i)?;
                    out.push(v.map_or("NULL".into(), |r| render(col.type_(), &r.0)));
                }
                rows.push(out);
            }
        }
        tx.rollback().await?;
        Ok::<_, tokio_postgres::Error>(rows)
    };
    match tokio::time::timeout(STATEMENT_TIMEOUT, run).await {
        Err(_) => Outcome::Error("timeout".into(), case.sql.clone()),
        Ok(Err(e)) => error_text(&e),
        Ok(Ok(rows)) => Outcome::Rows(rows),
    }
}

/// The case's statement pipelined with a read of one key and itself again; the three answers
/// (or the first error) as one outcome.
async fn pipelined(client: &Client, case: &Case) -> Outcome {
    let mut key = case.clone();
    key.sql = "select c.id, c.name from customers c where c.id = 3".into();
    key.params = Vec::new();
    key.command = false;
    let (a, b, c) = futures_util::join!(
        extended(client, case, Mode::Prepared),
        extended(client, &key, Mode::Prepared),
        extended(client, case, Mode::Prepared)
    );
    let mut rows = Vec::new();
    for (i, o) in [a, b, c].into_iter().enumerate() {
        match o {
            Outcome::Error(code, msg) => {
                return Outcome::Error(code, format!("statement {} of 3: {msg}", i + 1))
            }
            Outcome::Rows(r) => {
                rows.push(vec![format!("-- statement {} of 3", i + 1)]);
                rows.extend(r);
            }
        }
    }
    Outcome::Rows(rows)
}

/// `COPY … TO STDOUT` (lines as one-column rows), or with `data` `COPY … FROM STDIN` (the
/// affected-row count).
pub async fn copy(client: &Client, sql: &str, data: Option<&str>) -> Outcome {
    use futures_util::SinkExt;
    let run = async {
        if let Some(data) = data {
            let sink = client.copy_in(sql).await?;
            pin_mut!(sink);
            sink.send(bytes::Bytes::from(data.to_string())).await?;
            let n = sink.finish().await?;
            return Ok(vec![vec![format!("affected {n}")]]);
        }
        let stream = client.copy_out(sql).await?;
        pin_mut!(stream);
        let mut text = Vec::new();
        while let Some(chunk) = stream.try_next().await? {
            text.extend_from_slice(&chunk);
        }
        Ok::<_, tokio_postgres::Error>(
            String::from_utf8_lossy(&text)
                .lines()
                .map(|l| vec![l.to_string()])
                .collect(),
        )
    };
    match tokio::time::timeout(STATEMENT_TIMEOUT, run).await {
        Err(_) => Outcome::Error("timeout".into(), sql.into()),
        Ok(Err(e)) => error_text(&e),
        Ok(Ok(rows)) => Outcome::Rows(rows),
    }
}

/// The statement of `case` in `mode`.
pub async fn statement(client: &mut Client, case: &Case, mode: Mode) -> Outcome {
    match mode {
        Mode::Simple => simple(client, &case.inline(), case.command).await,
        Mode::Portal => portal(client, case).await,
        Mode::Pipelined => pipelined(client, case).await,
        Mode::RawText => unreachable!("RawText runs on its own connection (run.rs)"),
        _ => extended(client, case, mode).await,
    }
}

#[cfg(test)]
mod tests {
    use super::numeric;

    #[test]
    fn numeric_decodes() {
        // 12.34: ndigits 2, weight 0, sign +, dscale 2, digits [12, 3400].
        let b = [0, 2, 0, 0, 0, 0, 0, 2, 0, 12, 0x0d, 0x48];
        assert_eq!(numeric(&b).as_deref(), Some("12.34"));
    }
}
