//! The extended protocol with text everywhere, as libpq's `PQexecParams` with text formats
//! sends it: Parse (unnamed, no parameter types), Bind (text parameters, text results),
//! Describe portal, Execute, Sync — on a bare protocol connection (`common::raw`), since
//! tokio-postgres always asks for binary results.

use crate::common::raw::{bind, execute, parse, Raw};
use crate::compare::Outcome;
use crate::gen::{Case, Param};

/// The parameter as the text a driver would send.
fn text(p: &Param) -> String {
    match p {
        Param::Text(s) => s.clone(),
        other => other.literal(),
    }
}

/// Runs the case's statement on `raw`; rows as text, or the first error.
pub fn run(raw: &mut Raw, case: &Case) -> Outcome {
    let values: Vec<String> = case.params.iter().map(text).collect();
    let refs: Vec<&str> = values.iter().map(String::as_str).collect();
    let mut out = Vec::new();
    parse(&mut out, "", &case.sql);
    bind(&mut out, "", &refs);
    herd_wire::encode::describe(&mut out, b'P', "").expect("describe");
    execute(&mut out);
    herd_wire::encode::sync(&mut out);
    raw.send(&out);
    let mut rows = Vec::new();
    let mut error = None;
    for m in raw.until_ready() {
        match m.tag {
            b'D' => rows.push(
                m.columns()
                    .into_iter()
                    .map(|v| v.map_or("NULL".into(), |b| String::from_utf8_lossy(&b).into_owned()))
                    .collect(),
            ),
            b'E' if error.is_none() => {
                error = Some(Outcome::Error(
                    m.code().unwrap_or_default(),
                    m.field(b'M').unwrap_or_default(),
                ))
            }
            _ => {}
        }
    }
    error.unwrap_or(Outcome::Rows(rows))
}
