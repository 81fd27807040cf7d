//! Herd's own functions (`SELECT herd.create_distributed_table($1, $2)` …) called through the
//! extended protocol, as drivers send them: with bound parameters in text or binary format,
//! prepared first (`Parse`/`Describe`/`Sync`, then `Bind`/`Execute`/`Sync`) or all in one
//! batch. No server knows these functions: the proxy answers every message of such a batch
//! itself, and records the statements it parsed so a later `Bind` of them comes back here.

use std::collections::HashMap;

use herd_shard::ParamValue;
use herd_sql::KeyExpr;
use herd_wire::frontend::{tag, Bind, Describe, Parse, KIND_STATEMENT};
use herd_wire::{encode, split_frame};

use super::Session;
use crate::ProxyError;

/// Types (OIDs) whose binary form is the text itself: `text`, `varchar`, `name`, `bpchar`,
/// `unknown`, and unspecified (0, which the server would take as `text` here).
const TEXT_LIKE: [u32; 6] = [0, 25, 1043, 19, 1042, 705];

/// One statement of the batch that calls a Herd function.
#[derive(Clone)]
struct Call {
    function: String,
    args: Vec<KeyExpr>,
    types: Vec<u32>,
}

/// A portal bound to a call: the function, and its arguments' text (or why they cannot be
/// read, reported at Execute as PostgreSQL reports a Bind's error).
type Portal = (String, Result<Vec<String>, ProxyError>);

/// The SQL text of `sql` may call one of Herd's functions (checked without allocating: this
/// runs for every extended-protocol batch on a sharded cluster).
fn mentions_herd(sql: &[u8]) -> bool {
    sql.windows(5).any(|w| w.eq_ignore_ascii_case(b"herd."))
}

impl Session {
    /// Answers `unit` when it is an extended-protocol batch whose statements call Herd's
    /// functions; `false` (nothing sent) when it is not about such calls.
    pub(super) async fn answer_extended_herd_call(
        &mut self,
        unit: &[u8],
    ) -> Result<bool, ProxyError> {
        let Some(plan) = self.herd_call_batch(unit)? else {
            return Ok(false);
        };
        let plan = match plan {
            Ok(p) => p,
            Err(e) => {
                self.reply_error(&e, unit).await?;
                return Ok(true);
            }
        };
        if self.pending_begin.is_some() || self.in_transaction() {
            let e = ProxyError::Server {
                code: "25001".into(),
                message: "Herd's functions (herd.*) cannot run inside a transaction block".into(),
            };
            self.reply_error(&e, unit).await?;
            return Ok(true);
        }
        self.run_herd_call_batch(unit, plan).await?;
        Ok(true)
    }

    /// The calls `unit` parses or binds: `None` when it is not such a batch, an error when it
    /// mixes Herd's functions with other statements.
    #[allow(clippy::type_complexity)]
    fn herd_call_batch(
        &self,
        unit: &[u8],
    ) -> Result<Option<Result<HashMap<Vec<u8>, Call>, ProxyError>>, ProxyError> {
        let mut calls: HashMap<Vec<u8>, Call> = HashMap::new();
        // Statements this batch parses that are not calls: a Bind of them is not one either.
        let mut parsed_others: Vec<Vec<u8>> = Vec::new();
        let mut others = false;
        let mut rest = unit;
        while let Some((frame, used)) = split_frame(rest, usize::MAX)? {
            rest = &rest[used..];
            let (name, sql, types) = match frame.tag {
                tag::PARSE => {
                    let p = Parse::decode(frame.body)?;
                    if !mentions_herd(p.query) {
                        parsed_others.push(p.name.to_vec());
                        others = true;
                        continue;
                    }
                    (p.name.to_vec(), p.query.to_vec(), p.param_types)
                }
                tag::BIND => {
                    let b = Bind::decode(frame.body)?;
                    if calls.contains_key(b.statement) {
                        continue;
                    }
                    if parsed_others.iter().any(|n| n == b.statement) {
                        others = true;
                        continue;
                    }
                    match self.known_statement(b.statement) {
                        Some(s) => s,
                        None => {
                            others = true;
                            continue;
                        }
                    }
                }
                tag::DESCRIBE | tag::EXECUTE | tag::SYNC | tag::FLUSH | tag::CLOSE => continue,
                _ => return Ok(None),
            };
            if !mentions_herd(&sql) {
                if frame.tag == tag::PARSE {
                    parsed_others.push(name);
                }
                others = true;
                continue;
            }
            match std::str::from_utf8(&sql)
                .ok()
                .and_then(herd_sql::herd_call_args)
            {
                Some((function, args)) => {
                    calls.insert(
                        name,
                        Call {
                            function,
                            args,
                            types,
                        },
                    );
                }
                None => {
                    if frame.tag == tag::PARSE {
                        parsed_others.push(name);
                    }
                    others = true;
                }
            }
        }
        Ok(match (calls.is_empty(), others) {
            (true, _) => None,
            (false, false) => Some(Ok(calls)),
            (false, true) => Some(Err(ProxyError::Server {
                code: "0A000".into(),
                message: "a call of Herd's functions (herd.*) runs as the only statement of its \
                          extended-protocol batch: send it alone"
                    .into(),
            })),
        })
    }

    /// The text and parameter types of the client's statement `name` parsed earlier, when
    /// its text may call Herd's functions: checked on the borrowed text first, since this runs
    /// for every Bind on a sharded cluster and almost none are such calls.
    fn known_statement(&self, name: &[u8]) -> Option<(Vec<u8>, Vec<u8>, Vec<u32>)> {
        let stmt = if name.is_empty() {
            self.state.unnamed.as_ref().map(|u| &*u.stmt)
        } else {
            self.state.statements.get(name).map(|s| &**s)
        }?;
        mentions_herd(&stmt.query)
            .then(|| (name.to_vec(), stmt.query.clone(), stmt.param_types.clone()))
    }

    /// Answers every message of the batch, in order, as PostgreSQL would: after an error,
    /// everything up to the Sync is skipped.
    async fn run_herd_call_batch(
        &mut self,
        unit: &[u8],
        calls: HashMap<Vec<u8>, Call>,
    ) -> Result<(), ProxyError> {
        let mut out = Vec::new();
        // Portal name → the call and its arguments' values (or why they cannot be read).
        let mut portals: HashMap<Vec<u8>, Portal> = HashMap::new();
        let mut failed = false;
        let mut rest = unit;
        while let Some((frame, used)) = split_frame(rest, usize::MAX)? {
            rest = &rest[used..];
            if failed && frame.tag != tag::SYNC {
                continue;
            }
            let step: Result<(), ProxyError> = match frame.tag {
                tag::PARSE => {
                    let p = Parse::decode(frame.body)?;
                    self.remember_parse(p.name, p.query, p.param_types)
                        .map(|()| encode::parse_complete(&mut out))
                }
                tag::BIND => {
                    let b = Bind::decode(frame.body)?;
                    let call = calls.get(b.statement).cloned();
                    match call {
                        Some(call) => {
                            let values = bind_args(&call, b.rest);
                            portals.insert(b.portal.to_vec(), (call.function, values));
                            encode::bind_complete(&mut out);
                            Ok(())
                        }
                        None => Err(no_statement(b.statement)),
                    }
                }
                tag::DESCRIBE => {
                    let d = Describe::decode(frame.body)?;
                    if d.kind == KIND_STATEMENT {
                        match calls.get(d.name) {
                            Some(call) => {
                                let types: Vec<u32> = call_param_types(call);
                                encode::parameter_description(&mut out, &types)?;
                                encode::row_description_text(&mut out, &[&call.function])?;
                                Ok(())
                            }
                            None => Err(no_statement(d.name)),
                        }
                    } else {
                        match portals.get(d.name) {
                            Some((function, _)) => {
                                encode::row_description_text(&mut out, &[function])?;
                                Ok(())
                            }
                            None => Err(no_portal(d.name)),
                        }
                    }
                }
                tag::EXECUTE => {
                    let portal = herd_wire::frontend::Execute::decode(frame.body)?.portal;
                    match portals.remove(portal) {
                        Some((function, Ok(args))) => {
                            match self.run_herd_call(&function, &args).await {
                                Ok(text) => {
                                    encode::data_row(&mut out, &[Some(text.as_bytes())])?;
                                    encode::command_complete(&mut out, "SELECT 1")?;
                                    self.map = None;
                                    Ok(())
                                }
                                Err(e) => Err(e),
                            }
                        }
                        Some((_, Err(e))) => Err(e),
                        None => Err(no_portal(portal)),
                    }
                }
                tag::CLOSE => {
                    encode::close_complete(&mut out);
                    Ok(())
                }
                tag::SYNC => {
                    failed = false;
                    encode::ready_for_query(&mut out, b'I')?;
                    Ok(())
                }
                _ => Ok(()),
            };
            if let Err(e) = step {
                self.ctx.metrics.inc(
                    "herd_unit_errors_total",
                    &format!("sqlstate=\"{}\"", e.sqlstate()),
                );
                encode::error_response(&mut out, "ERROR", e.sqlstate(), &e.to_string())?;
                failed = true;
            }
        }
        self.out.buf.extend_from_slice(&out);
        Ok(())
    }

    /// Runs one of Herd's functions with its arguments' text; the one-value answer.
    pub(super) async fn run_herd_call(
        &mut self,
        function: &str,
        args: &[String],
    ) -> Result<String, ProxyError> {
        let database = self.database.clone();
        match (function, args) {
            ("explain", [sql]) => self.explain(sql).await,
            _ => self.ctx.herd_call(&database, function, args).await,
        }
    }
}

/// The parameter types a Describe of the call reports: as declared, text where left open.
fn call_param_types(call: &Call) -> Vec<u32> {
    let n = call
        .args
        .iter()
        .filter_map(param_of)
        .max()
        .unwrap_or(0)
        .max(call.types.len() as u32) as usize;
    (0..n)
        .map(|i| match call.types.get(i).copied().unwrap_or(0) {
            0 => 25,
            t => t,
        })
        .collect()
}

fn param_of(e: &KeyExpr) -> Option<u32> {
    match e {
        KeyExpr::Param(n) => Some(*n),
        KeyExpr::Cast(inner, _) => param_of(inner),
        _ => None,
    }
}

/// The text of each argument: literals as written, parameters from the Bind (text format, or
/// binary of a text type, whose bytes are the text).
fn bind_args(call: &Call, bind_rest: &[u8]) -> Result<Vec<String>, ProxyError> {
    let params = super::shard::bind_params(bind_rest);
    call.args
        .iter()
        .enumerate()
        .map(|(i, a)| arg_text(a, &params, &call.types, i + 1))
        .collect()
}

fn arg_text(
    e: &KeyExpr,
    params: &[ParamValue],
    types: &[u32],
    position: usize,
) -> Result<String, ProxyError> {
    let invalid = |why: String| ProxyError::Server {
        code: "22023".into(),
        message: format!("argument {position} of this herd.* call {why}"),
    };
    match e {
        KeyExpr::Const(Some(t)) => Ok(t.clone()),
        KeyExpr::Const(None) => Err(invalid("is NULL".into())),
        KeyExpr::Cast(inner, _) => arg_text(inner, params, types, position),
        KeyExpr::Param(n) => {
            let i = (*n as usize).wrapping_sub(1);
            let ty = types.get(i).copied().unwrap_or(0);
            match params.get(i) {
                Some(ParamValue::Text(t)) => String::from_utf8(t.clone())
                    .map_err(|_| invalid(format!("(${n}) is not UTF-8 text"))),
                Some(ParamValue::Binary(b)) if TEXT_LIKE.contains(&ty) => {
                    String::from_utf8(b.clone())
                        .map_err(|_| invalid(format!("(${n}) is not UTF-8 text")))
                }
                Some(ParamValue::Binary(_)) => Err(invalid(format!(
                    "(${n}) is binary data of type OID {ty}: send the name as text"
                ))),
                Some(ParamValue::Null) => Err(invalid(format!("(${n}) is NULL"))),
                _ => Err(invalid(format!("(${n}) has no value"))),
            }
        }
        KeyExpr::Other => Err(invalid("is not a literal or parameter".into())),
    }
}

fn no_statement(name: &[u8]) -> ProxyError {
    ProxyError::Server {
        code: "26000".into(),
        message: format!(
            "prepared statement \"{}\" does not exist",
            String::from_utf8_lossy(name)
        ),
    }
}

fn no_portal(name: &[u8]) -> ProxyError {
    ProxyError::Server {
        code: "34000".into(),
        message: format!(
            "portal \"{}\" does not exist",
            String::from_utf8_lossy(name)
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn arguments_in_every_form() {
        let call = Call {
            function: "create_distributed_table".into(),
            args: vec![
                KeyExpr::Param(1),
                KeyExpr::Cast(Box::new(KeyExpr::Param(2)), "text".into()),
                KeyExpr::Const(Some("x".into())),
            ],
            types: vec![0, 25],
        };
        let params = [
            ParamValue::Text(b"orders".to_vec()),
            ParamValue::Binary(b"customer_id".to_vec()),
        ];
        let got: Result<Vec<String>, _> = call
            .args
            .iter()
            .enumerate()
            .map(|(i, a)| arg_text(a, &params, &call.types, i + 1))
            .collect();
        assert_eq!(got.expect("read"), vec!["orders", "customer_id", "x"]);
        assert_eq!(call_param_types(&call), vec![25, 25]);
        let regclass = arg_text(
            &KeyExpr::Param(1),
            &[ParamValue::Binary(vec![0, 0, 64, 1])],
            &[2205],
            1,
        )
        .expect_err("an OID is not a name");
        assert_eq!(regclass.sqlstate(), "22023");
        assert!(arg_text(&KeyExpr::Param(1), &[ParamValue::Null], &[0], 1).is_err());
        assert!(mentions_herd(b"select HERD.f($1)"));
        assert!(!mentions_herd(b"select herd_f($1)"));
    }
}
