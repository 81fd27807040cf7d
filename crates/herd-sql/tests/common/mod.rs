//! Shared test helpers: a small hand-written function catalog and a row checker.
#![allow(dead_code)]

use herd_sql::{
    classify, FunctionCatalog, PinReason, Reason, Route, SessionEffect, TxEffect, Volatility,
};

/// A tiny stand-in for a catalog built from `pg_proc`.
pub struct TestCatalog;

impl FunctionCatalog for TestCatalog {
    fn volatility(&self, name: &str) -> Option<Volatility> {
        use Volatility::*;
        let bare = name.strip_prefix("pg_catalog.").unwrap_or(name);
        Some(match bare {
            "lower" | "upper" | "abs" | "length" | "extract" | "date_part" => Immutable,
            "now" | "count" | "sum" | "avg" | "max" | "min" | "array_agg" | "row_number"
            | "rank" | "generate_series" | "f" | "date_trunc" | "current_setting" => Stable,
            "nextval"
            | "setval"
            | "currval"
            | "random"
            | "pg_advisory_lock"
            | "pg_advisory_lock_shared"
            | "pg_try_advisory_lock"
            | "pg_advisory_xact_lock"
            | "pg_advisory_unlock"
            | "txid_current"
            | "set_config"
            | "pg_current_wal_lsn"
            | "clock_timestamp" => Volatile,
            _ => return None,
        })
    }

    fn is_unlogged(&self, relation: &str) -> bool {
        matches!(relation, "unl" | "public.unl")
    }
}

/// What else to check on a row's first statement.
pub enum Check {
    Nothing,
    Tx(TxEffect),
    Session(SessionEffect),
    Pin(PinReason),
    NoPin,
}

/// One table row: SQL, expected final route and reason, extra check.
pub struct Row {
    pub sql: &'static str,
    pub route: Route,
    pub reason: Reason,
    pub check: Check,
}

impl Row {
    pub fn tx(mut self, tx: TxEffect) -> Self {
        self.check = Check::Tx(tx);
        self
    }
    pub fn session(mut self, s: SessionEffect) -> Self {
        self.check = Check::Session(s);
        self
    }
    pub fn pin(mut self, p: PinReason) -> Self {
        self.check = Check::Pin(p);
        self
    }
    pub fn no_pin(mut self) -> Self {
        self.check = Check::NoPin;
        self
    }
}

/// Expects a replica read.
pub fn rep(sql: &'static str) -> Row {
    at(sql, Route::Replica, Reason::ReadOnly)
}

/// Expects the primary for `reason`.
pub fn pri(sql: &'static str, reason: Reason) -> Row {
    at(sql, Route::Primary, reason)
}

/// Expects `route` for `reason`.
pub fn at(sql: &'static str, route: Route, reason: Reason) -> Row {
    Row {
        sql,
        route,
        reason,
        check: Check::Nothing,
    }
}

pub fn vol(name: &str) -> Reason {
    Reason::VolatileFunction(name.to_string())
}

pub fn only(what: &str) -> Reason {
    Reason::PrimaryOnly(what.to_string())
}

pub fn unk(name: &str) -> Reason {
    Reason::UnknownFunction(name.to_string())
}

pub fn set(name: &str, value: &str, sql: &str) -> SessionEffect {
    SessionEffect::Set {
        name: name.into(),
        value: value.into(),
        sql: sql.into(),
    }
}

/// Checks every row and reports all failures at once.
pub fn run(rows: Vec<Row>) -> usize {
    let mut failures = Vec::new();
    for row in &rows {
        let c = classify(row.sql);
        let got = c.route(&TestCatalog);
        if got != (row.route, row.reason.clone()) {
            failures.push(format!(
                "{:?}: expected {:?} {:?}, got {:?}",
                row.sql, row.route, row.reason, got
            ));
            continue;
        }
        let first = c.statements.first();
        let problem = match (&row.check, first) {
            (Check::Nothing, _) => None,
            (Check::Tx(tx), Some(s)) if s.tx == *tx => None,
            (Check::Session(se), Some(s)) if s.session == *se => None,
            (Check::Pin(p), Some(s)) if s.session == SessionEffect::Pin(*p) => None,
            (Check::NoPin, Some(s)) if !matches!(s.session, SessionEffect::Pin(_)) => None,
            (_, s) => Some(format!("{:?}: effects differ: {:?}", row.sql, s)),
        };
        failures.extend(problem);
    }
    assert!(
        failures.is_empty(),
        "{} failures:\n{}",
        failures.len(),
        failures.join("\n")
    );
    rows.len()
}
