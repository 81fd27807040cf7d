//! Parsing and per-statement classification.

use crate::walk::{scan, Facts};
use crate::{
    session, Classification, ParseError, PinReason, Reason, Route, SessionEffect, Statement,
    TxEffect,
};
use pg_query::protobuf::{
    a_const, node::Node as N, CopyStmt, DeclareCursorStmt, ExplainStmt, Node, RangeVar,
};
use std::ops::Range;

/// `CURSOR_OPT_HOLD` from PostgreSQL's `parsenodes.h`.
const CURSOR_OPT_HOLD: i32 = 0x0020;

/// A statement's classification before its source span is attached.
#[derive(Debug, Clone)]
pub(crate) struct Draft {
    pub route: Route,
    pub reason: Reason,
    pub functions: Vec<String>,
    pub relations: Vec<String>,
    pub tx: TxEffect,
    pub session: SessionEffect,
    pub may_write: bool,
}

impl Draft {
    pub(crate) fn new(route: Route, reason: Reason) -> Self {
        Draft {
            route,
            reason,
            functions: Vec::new(),
            relations: Vec::new(),
            tx: TxEffect::None,
            session: SessionEffect::None,
            may_write: false,
        }
    }

    fn primary(reason: Reason) -> Self {
        Draft::new(Route::Primary, reason)
    }

    fn pinned(mut self, pin: PinReason) -> Self {
        self.session = SessionEffect::Pin(pin);
        self
    }

    fn writes(mut self) -> Self {
        self.may_write = true;
        self
    }

    fn with_functions_of(mut self, node: &Node) -> Self {
        self.functions = scan(node).functions;
        self
    }

    fn finish(self, span: Range<usize>) -> Statement {
        Statement {
            route_without_functions: self.route,
            reason: self.reason,
            functions: self.functions,
            relations: self.relations,
            tx: self.tx,
            session: self.session,
            may_write: self.may_write,
            span,
        }
    }
}

/// Classifies every statement of `sql`. Pure: parses once, does no I/O, and
/// never panics (a parser failure of any kind gives [`Reason::Unparseable`]).
pub fn classify(sql: &str) -> Classification {
    match std::panic::catch_unwind(|| classify_inner(sql)) {
        Ok(c) => c,
        Err(_) => unparseable("internal error while classifying".to_string(), false),
    }
}

fn unparseable(message: String, too_complex: bool) -> Classification {
    Classification {
        statements: Vec::new(),
        error: Some(ParseError {
            message,
            too_complex,
        }),
    }
}

fn classify_inner(sql: &str) -> Classification {
    let parsed = match pg_query::parse(sql, 0) {
        Ok(p) => p,
        Err(e) => {
            let too_complex = matches!(e, pg_query::Error::Decode(_));
            return unparseable(e.to_string(), too_complex);
        }
    };
    let statements = parsed
        .protobuf
        .stmts
        .iter()
        .map(|raw| {
            let span = span_of(sql, raw.stmt_location, raw.stmt_len);
            let text = sql.get(span.clone()).unwrap_or("");
            let draft = match raw.stmt.as_deref() {
                Some(node) => statement(node, text),
                None => Draft::primary(Reason::Unparseable),
            };
            draft.finish(span)
        })
        .collect();
    Classification {
        statements,
        error: None,
    }
}

/// Byte range of a statement from `RawStmt` location/length (0 = to the end),
/// clamped to the string and trimmed of surrounding whitespace.
fn span_of(sql: &str, location: i32, len: i32) -> Range<usize> {
    let bytes = sql.as_bytes();
    let mut start = usize::try_from(location).unwrap_or(0).min(bytes.len());
    let mut end = match usize::try_from(len) {
        Ok(0) | Err(_) => bytes.len(),
        Ok(n) => start.saturating_add(n).min(bytes.len()),
    };
    while start < end && bytes[start].is_ascii_whitespace() {
        start += 1;
    }
    while end > start && bytes[end - 1].is_ascii_whitespace() {
        end -= 1;
    }
    if sql.is_char_boundary(start) && sql.is_char_boundary(end) {
        start..end
    } else {
        0..0
    }
}

/// Classifies one statement node; `text` is its source (empty for inner queries).
fn statement(node: &Node, text: &str) -> Draft {
    let Some(kind) = node.node.as_ref() else {
        return Draft::primary(Reason::Unparseable);
    };
    match kind {
        N::SelectStmt(_)
        | N::InsertStmt(_)
        | N::UpdateStmt(_)
        | N::DeleteStmt(_)
        | N::MergeStmt(_) => query(node, kind),
        N::VariableShowStmt(s) => show(&s.name),
        N::VariableSetStmt(s) => session::variable_set(s, text),
        N::TransactionStmt(s) => session::transaction(s),
        N::DiscardStmt(s) => session::discard(s),
        N::ExplainStmt(s) => explain(s),
        N::CopyStmt(s) => copy(s),
        N::DeclareCursorStmt(s) => declare(s),
        N::FetchStmt(_) | N::ClosePortalStmt(_) => Draft::new(Route::Replica, Reason::Cursor),
        N::PrepareStmt(_) => Draft::primary(Reason::Utility)
            .with_functions_of(node)
            .pinned(PinReason::SqlPrepare),
        N::ExecuteStmt(_) | N::CallStmt(_) | N::DoStmt(_) => Draft::primary(Reason::Utility)
            .with_functions_of(node)
            .writes(),
        N::DeallocateStmt(_) | N::NotifyStmt(_) | N::UnlistenStmt(_) => {
            Draft::primary(Reason::Utility)
        }
        N::ListenStmt(_) => Draft::primary(Reason::Utility).pinned(PinReason::Listen),
        N::LoadStmt(_) => Draft::primary(Reason::Utility).pinned(PinReason::LoadLibrary),
        N::LockStmt(_) => Draft::primary(Reason::Lock),
        N::ConstraintsSetStmt(_) => Draft::primary(Reason::TransactionControl),
        N::CreateStmt(s) => ddl(node, s.relation.as_ref()),
        N::CreateTableAsStmt(s) => ddl(node, s.into.as_ref().and_then(|i| i.rel.as_ref())),
        N::ViewStmt(s) => ddl(node, s.view.as_ref()),
        N::CreateSeqStmt(s) => ddl(node, s.sequence.as_ref()),
        // Every other statement kind is DDL, maintenance or administration.
        _ => ddl(node, None),
    }
}

/// SHOW: settings a standby reports differently (and SHOW ALL, which lists them) go to the
/// primary.
fn show(name: &str) -> Draft {
    let name = name.to_ascii_lowercase();
    if name == "all" || crate::walk::STANDBY_SETTINGS.contains(&name.as_str()) {
        Draft::primary(Reason::PrimaryOnly(format!("SHOW {name}")))
    } else {
        Draft::new(Route::Replica, Reason::ReadOnly)
    }
}

/// True when `rel` names a temporary relation (TEMP keyword or `pg_temp` schema).
fn is_temp(rel: Option<&RangeVar>) -> bool {
    rel.is_some_and(|r| r.relpersistence == "t" || r.schemaname.starts_with("pg_temp"))
}

/// DDL or maintenance; pins when it creates a temporary relation.
fn ddl(node: &Node, created: Option<&RangeVar>) -> Draft {
    let facts = scan(node);
    let mut draft = Draft::primary(Reason::Ddl).writes();
    draft.functions = facts.functions;
    // `create type pg_temp.t …`, `create function pg_temp.f …`: the object lives in this
    // server's temporary schema only.
    if is_temp(created) || facts.temp_schema {
        draft.pinned(PinReason::TempTable)
    } else {
        draft
    }
}

/// SELECT / VALUES / TABLE and INSERT / UPDATE / DELETE / MERGE.
fn query(node: &Node, kind: &N) -> Draft {
    let Facts {
        functions,
        dml,
        locking,
        select_into,
        pin,
        opaque,
        relations,
        primary_only,
        temp_schema: _,
    } = scan(node);
    if opaque {
        return Draft::primary(Reason::Unparseable);
    }
    let mut draft = match kind {
        N::SelectStmt(select) => {
            if dml {
                Draft::primary(Reason::WritingCte).writes()
            } else if select_into {
                let into = select.into_clause.as_ref().and_then(|i| i.rel.as_ref());
                let d = Draft::primary(Reason::SelectInto).writes();
                if is_temp(into) {
                    d.pinned(PinReason::TempTable)
                } else {
                    d
                }
            } else if locking {
                Draft::primary(Reason::LockingRead)
            } else {
                Draft::new(Route::Replica, Reason::ReadOnly)
            }
        }
        _ => Draft::primary(Reason::Write).writes(),
    };
    if let Some((reason, function)) = pin {
        // Session-level lock functions are volatile anyway; do not rely on
        // the catalog saying so.
        if draft.route == Route::Replica {
            draft.route = Route::Primary;
            draft.reason = Reason::VolatileFunction(function);
        }
        if draft.session == SessionEffect::None {
            draft.session = SessionEffect::Pin(reason);
        }
    }
    if let (Some(what), Route::Replica) = (primary_only, draft.route) {
        draft.route = Route::Primary;
        draft.reason = Reason::PrimaryOnly(what);
    }
    draft.functions = functions;
    draft.relations = relations;
    draft
}

/// EXPLAIN: without ANALYZE nothing runs, so a read stays a read and no pin
/// applies; with ANALYZE the inner statement runs and its class is kept.
fn explain(stmt: &ExplainStmt) -> Draft {
    let Some(inner) = stmt.query.as_deref() else {
        return Draft::primary(Reason::Unparseable);
    };
    let mut draft = statement(inner, "");
    draft.tx = TxEffect::None;
    if !explain_analyze(stmt) {
        draft.may_write = false;
        if matches!(draft.session, SessionEffect::Pin(_)) {
            draft.session = SessionEffect::None;
        }
    }
    draft
}

/// True when the EXPLAIN options include ANALYZE (not explicitly false).
fn explain_analyze(stmt: &ExplainStmt) -> bool {
    stmt.options.iter().any(|opt| {
        let Some(N::DefElem(def)) = opt.node.as_ref() else {
            return false;
        };
        if !def.defname.eq_ignore_ascii_case("analyze") {
            return false;
        }
        match def.arg.as_deref().and_then(|a| a.node.as_ref()) {
            None => true,
            Some(N::AConst(c)) => match c.val.as_ref() {
                Some(a_const::Val::Boolval(b)) => b.boolval,
                Some(a_const::Val::Ival(i)) => i.ival != 0,
                Some(a_const::Val::Sval(s)) => !matches!(
                    s.sval.to_ascii_lowercase().as_str(),
                    "false" | "off" | "no" | "0" | "f" | "n"
                ),
                _ => true,
            },
            Some(N::String(s)) => !matches!(
                s.sval.to_ascii_lowercase().as_str(),
                "false" | "off" | "no" | "0" | "f" | "n"
            ),
            Some(_) => true,
        }
    })
}

/// COPY: FROM writes; TO a server file or program stays on the primary;
/// TO STDOUT of a table is a read, of a query is classified like the query.
fn copy(stmt: &CopyStmt) -> Draft {
    if stmt.is_from {
        return Draft::primary(Reason::Write).writes();
    }
    if stmt.is_program || !stmt.filename.is_empty() {
        return Draft::primary(Reason::Utility);
    }
    match stmt.query.as_deref() {
        Some(inner) => {
            let mut draft = statement(inner, "");
            draft.tx = TxEffect::None;
            draft
        }
        None => {
            let mut draft = Draft::new(Route::Replica, Reason::ReadOnly);
            if let Some(rel) = &stmt.relation {
                let name = if rel.schemaname.is_empty() {
                    rel.relname.clone()
                } else {
                    format!("{}.{}", rel.schemaname, rel.relname)
                };
                if crate::walk::is_node_local_view(&name) {
                    draft = Draft::primary(Reason::PrimaryOnly(name.clone()));
                }
                draft.relations = vec![name];
            }
            draft
        }
    }
}

/// DECLARE CURSOR: routes like its query (a read may run on a replica inside
/// a read-only transaction); WITH HOLD outlives the transaction, so it pins
/// the session and goes to the primary.
fn declare(stmt: &DeclareCursorStmt) -> Draft {
    let mut draft = match stmt.query.as_deref() {
        Some(inner) => statement(inner, ""),
        None => return Draft::primary(Reason::Unparseable),
    };
    if draft.route == Route::Replica {
        draft.reason = Reason::Cursor;
    }
    if stmt.options & CURSOR_OPT_HOLD != 0 {
        draft.route = Route::Primary;
        if !matches!(draft.session, SessionEffect::Pin(_)) {
            draft.session = SessionEffect::Pin(PinReason::WithHoldCursor);
        }
    }
    draft
}
