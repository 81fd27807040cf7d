//! Final routing decisions given a [`FunctionCatalog`].

use crate::{
    Classification, FunctionCatalog, PinReason, Reason, Route, SessionEffect, Statement, Volatility,
};

impl Statement {
    /// Final route of this statement: [`Statement::route_without_functions`],
    /// demoted to the primary when any called function is volatile or unknown.
    pub fn route(&self, catalog: &dyn FunctionCatalog) -> (Route, Reason) {
        if self.route_without_functions == Route::Primary {
            return (Route::Primary, self.reason.clone());
        }
        for name in &self.functions {
            match catalog.volatility(name) {
                Some(Volatility::Immutable | Volatility::Stable) => {}
                Some(Volatility::Volatile) => {
                    return (Route::Primary, Reason::VolatileFunction(name.clone()))
                }
                None => return (Route::Primary, Reason::UnknownFunction(name.clone())),
            }
        }
        if let Some(rel) = self.relations.iter().find(|r| catalog.is_unlogged(r)) {
            return (Route::Primary, Reason::PrimaryOnly(rel.clone()));
        }
        (Route::Replica, self.reason.clone())
    }

    /// The session pin this statement implies, if any.
    pub fn pin(&self) -> Option<PinReason> {
        match self.session {
            SessionEffect::Pin(reason) => Some(reason),
            _ => None,
        }
    }
}

impl Classification {
    /// Final decision for the whole string given a catalog.
    ///
    /// [`Route::Primary`] when the string is empty or unparseable, or when any
    /// statement writes, locks, pins, calls a volatile or unknown function, or
    /// is otherwise not safe on a hot standby; the reason is the first such
    /// statement's, preferring any other reason over
    /// [`Reason::TransactionControl`] (so `BEGIN; INSERT …` reports
    /// [`Reason::Write`]). Otherwise [`Route::Replica`], with [`Reason::ReadOnly`]
    /// when any statement is a read, else the first statement's reason.
    pub fn route(&self, catalog: &dyn FunctionCatalog) -> (Route, Reason) {
        if let Some(error) = &self.error {
            let reason = if error.too_complex {
                Reason::TooComplex
            } else {
                Reason::Unparseable
            };
            return (Route::Primary, reason);
        }
        let Some(first) = self.statements.first() else {
            return (Route::Primary, Reason::Empty);
        };
        let mut any_read = false;
        let mut primary: Option<Reason> = None;
        for statement in &self.statements {
            let (route, reason) = statement.route(catalog);
            any_read |= reason == Reason::ReadOnly;
            if route == Route::Primary {
                if reason != Reason::TransactionControl {
                    return (Route::Primary, reason);
                }
                primary.get_or_insert(reason);
            }
        }
        if let Some(reason) = primary {
            (Route::Primary, reason)
        } else if any_read {
            (Route::Replica, Reason::ReadOnly)
        } else {
            (Route::Replica, first.reason.clone())
        }
    }

    /// True when any statement may modify data or schema (see
    /// [`Statement::may_write`]), or when the string did not parse (a newer
    /// server might still run it). Function side effects are not considered:
    /// use [`Classification::route`] for that.
    pub fn is_write(&self) -> bool {
        self.error.is_some() || self.statements.iter().any(|s| s.may_write)
    }

    /// True when the string holds no statement and parsed fine.
    pub fn is_empty(&self) -> bool {
        self.error.is_none() && self.statements.is_empty()
    }

    /// Session pins required by the statements, in order.
    pub fn pins(&self) -> Vec<PinReason> {
        self.statements.iter().filter_map(Statement::pin).collect()
    }
}
