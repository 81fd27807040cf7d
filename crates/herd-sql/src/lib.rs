//! Statement classification for read/write routing, using the real
//! PostgreSQL grammar through [`pg_query`] (libpg_query).
//!
//! [`classify`] parses a (possibly multi-statement) SQL string once and
//! describes every statement: whether it could run on a hot standby
//! ([`Route::Replica`]) before looking at function volatility, why, which
//! functions it calls, and its effect on the transaction ([`TxEffect`]) and
//! on session state ([`SessionEffect`]). [`Classification::route`] then takes
//! a [`FunctionCatalog`] (built by the caller from `pg_proc`) and gives the
//! final decision. When in doubt the answer is always [`Route::Primary`].
//!
//! The crate is pure: no I/O, no threads, no async. [`ClassifierCache`]
//! memoises classifications by statement text.

mod bodies;
mod cache;
mod calls;
mod classify;
mod ddl;
mod explain;
mod fanout;
mod global;
mod hide;
mod insert_select;
mod keys;
mod route;
mod session;
mod shape;
mod split;
mod sql_prepared;
mod template;
mod walk;
mod wrapped;

pub use bodies::{body_reads, BodyReads};
pub use cache::{CacheStats, ClassifierCache};
pub use calls::{dropped_roles, herd_call, herd_call_args};
pub use classify::classify;
pub use ddl::{DatabaseStmt, DdlFacts, Uniqueness};
pub use explain::explained;
pub use fanout::{fan_out, Bound, Combine, FanOut, SortColumn, SortKey};
pub use global::globalize;
pub use hide::{hide_rows, Hidden};
pub use insert_select::{insert_select, insert_values, InsertSelect, Literal};
pub use keys::{
    key_facts, ColumnName, Condition, CopyFacts, KeyExpr, KeyFacts, OuterSide, StmtKind, TableRef,
    Target,
};
pub use session::{search_path_of, split_path};
pub use shape::shape_key;
pub use split::{insert_rows, nondeterministic_syntax, statements};
pub use sql_prepared::{
    assigned_as_cast, may_be_sql_prepared, sql_prepared, with_arguments, Argument, ConstKind,
    SqlPrepared,
};
pub use wrapped::{wrapped, Wrapped, Wrapper};

use std::ops::Range;

/// Where a statement may be executed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Route {
    /// Safe to run on a hot-standby replica.
    Replica,
    /// Must run on the primary.
    Primary,
}

/// Why a statement (or a whole string) got its route.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Reason {
    /// A plain read: SELECT, VALUES, TABLE, SHOW, EXPLAIN of a read, COPY … TO STDOUT.
    ReadOnly,
    /// INSERT, UPDATE, DELETE, MERGE, COPY FROM, or a write inside EXPLAIN ANALYZE / COPY.
    Write,
    /// Schema change or maintenance command (CREATE, ALTER, DROP, VACUUM, …).
    Ddl,
    /// `SELECT … FOR UPDATE / SHARE / NO KEY UPDATE / KEY SHARE`, at any depth.
    LockingRead,
    /// An explicit `LOCK` statement.
    Lock,
    /// `SELECT … INTO new_table`.
    SelectInto,
    /// A query whose CTEs contain INSERT / UPDATE / DELETE / MERGE.
    WritingCte,
    /// Calls a function the catalog marks volatile (its name).
    VolatileFunction(String),
    /// Calls a function the catalog does not know (its name).
    UnknownFunction(String),
    /// BEGIN, COMMIT, ROLLBACK, SAVEPOINT, SET TRANSACTION, two-phase commit.
    TransactionControl,
    /// Starts or sets a SERIALIZABLE transaction, which a hot standby refuses.
    SerializableTransaction,
    /// SET, RESET, DISCARD: session state only.
    SessionState,
    /// DECLARE, FETCH, MOVE, CLOSE: follows the backend holding the cursor.
    Cursor,
    /// Other commands that must reach the primary: CALL, DO, NOTIFY, LISTEN,
    /// UNLISTEN, PREPARE, EXECUTE, DEALLOCATE, LOAD, COPY to a server file.
    Utility,
    /// Reads something a hot standby answers differently from the primary: a node-local view
    /// (`pg_prepared_xacts`, `pg_stat_activity`, …), a setting such as
    /// `transaction_read_only`, or an unlogged table (its name).
    PrimaryOnly(String),
    /// The text does not parse (or the parser failed).
    Unparseable,
    /// The text parses but its tree is nested deeper than the protobuf
    /// decoder accepts (about 100 message levels: e.g. ~20 nested sub-selects
    /// or a ~50-term `a + b + …` chain).
    TooComplex,
    /// No statement at all (empty string, only comments or semicolons).
    Empty,
}

/// Effect of a statement on the transaction state.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum TxEffect {
    /// No transaction-control effect.
    None,
    /// BEGIN / START TRANSACTION; `read_only` only with an explicit READ ONLY.
    Begin {
        /// True only when the statement says READ ONLY.
        read_only: bool,
    },
    /// SET TRANSACTION …; `read_only` is `Some` when READ ONLY / READ WRITE is given.
    SetTransaction {
        /// `Some(true)` for READ ONLY, `Some(false)` for READ WRITE, else `None`.
        read_only: Option<bool>,
    },
    /// COMMIT / END (also COMMIT AND CHAIN).
    Commit,
    /// ROLLBACK / ABORT (also ROLLBACK AND CHAIN).
    Rollback,
    /// SAVEPOINT name.
    Savepoint,
    /// RELEASE \[SAVEPOINT\] name.
    Release,
    /// ROLLBACK TO \[SAVEPOINT\] name.
    RollbackToSavepoint,
    /// PREPARE TRANSACTION 'gid'.
    PrepareTransaction,
    /// COMMIT PREPARED 'gid'.
    CommitPrepared,
    /// ROLLBACK PREPARED 'gid'.
    RollbackPrepared,
}

/// Effect of a statement on session state that a proxy must track or replay.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum SessionEffect {
    /// No session effect.
    None,
    /// A session-level SET (also SET SESSION …).
    Set {
        /// Setting name as PostgreSQL sees it (lower case unless quoted), e.g. `herd.consistency`.
        name: String,
        /// The value as plain text, e.g. `eventual` or `a, b` (list values joined by `, `).
        value: String,
        /// A statement that replays the setting, normally `SET name = value`;
        /// send it as a statement of its own (it may end in a comment).
        sql: String,
    },
    /// SET LOCAL: lasts until the end of the current transaction.
    SetLocal {
        /// Setting name.
        name: String,
        /// Value as plain text (`DEFAULT` for SET LOCAL x TO DEFAULT).
        value: String,
        /// Replay statement text.
        sql: String,
    },
    /// RESET name (also SET name TO DEFAULT).
    Reset {
        /// Setting name.
        name: String,
    },
    /// RESET ALL.
    ResetAll,
    /// DISCARD ALL (`all == true`) or DISCARD PLANS / SEQUENCES / TEMP.
    Discard {
        /// True for DISCARD ALL.
        all: bool,
    },
    /// The session must stay on the backend that ran this statement.
    Pin(PinReason),
}

/// Why a session must be pinned to one backend.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum PinReason {
    /// Session-level advisory lock (`pg_advisory_lock`, `pg_try_advisory_lock`, shared variants).
    AdvisoryLock,
    /// Session-level advisory unlock: must reach the backend holding the lock.
    SessionAdvisoryUnlock,
    /// LISTEN channel.
    Listen,
    /// Creates a temporary table, view or sequence (TEMP keyword or `pg_temp` schema).
    TempTable,
    /// DECLARE … WITH HOLD cursor outlives the transaction.
    WithHoldCursor,
    /// SQL-level PREPARE.
    SqlPrepare,
    /// LOAD 'library'.
    LoadLibrary,
    /// `set_config(name, value, is_local)` where `is_local` is not literally true.
    SetConfig,
}

/// One statement of a classified string.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Statement {
    /// Route from the statement's structure alone, before function volatility is checked.
    pub route_without_functions: Route,
    /// Reason for `route_without_functions`.
    pub reason: Reason,
    /// Relations read, as written (`name` or `schema.name`), for catalogs that know which are
    /// unlogged (a hot standby cannot read those).
    pub relations: Vec<String>,
    /// Called functions, as written (unquoted names are lower case), schema-qualified
    /// if written so, e.g. `nextval`, `pg_catalog.now`. Some SQL syntax becomes a call
    /// to a `pg_catalog.` function (e.g. `extract(…)` is `pg_catalog.extract`).
    pub functions: Vec<String>,
    /// Transaction-control effect.
    pub tx: TxEffect,
    /// Session-state effect.
    pub session: SessionEffect,
    /// True when the statement may modify data or schema regardless of functions
    /// (DML, DDL, writing CTE, SELECT INTO, CALL, DO, EXECUTE, COPY FROM).
    pub may_write: bool,
    /// Byte range of the statement in the classified string (whitespace trimmed).
    pub span: Range<usize>,
}

/// The classification of a whole SQL string: one [`Statement`] per statement.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Classification {
    /// Statements in order; empty when the string is empty or unparseable.
    pub statements: Vec<Statement>,
    /// Set when the string could not be classified.
    pub error: Option<ParseError>,
}

/// Why a string could not be classified.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParseError {
    /// The parser's message.
    pub message: String,
    /// True when the SQL is valid but nested too deeply to decode
    /// ([`Reason::TooComplex`]); false for a syntax error ([`Reason::Unparseable`]).
    pub too_complex: bool,
}

/// Function volatility as in `pg_proc.provolatile`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Volatility {
    /// `i`: same result for the same arguments, no side effects.
    Immutable,
    /// `s`: no side effects, stable within a statement.
    Stable,
    /// `v`: may have side effects; never sent to a replica.
    Volatile,
}

impl Volatility {
    /// Maps a `pg_proc.provolatile` character (`i`, `s`, `v`).
    pub fn from_provolatile(c: char) -> Option<Self> {
        match c {
            'i' => Some(Self::Immutable),
            's' => Some(Self::Stable),
            'v' => Some(Self::Volatile),
            _ => None,
        }
    }
}

/// Source of function volatility, normally built from `pg_proc`.
///
/// Names are looked up exactly as they appear in [`Statement::functions`]
/// (`now`, `pg_catalog.now`, `myschema.f`), so a catalog should answer for
/// both the bare and the schema-qualified name. With overloads, answer with
/// the most volatile one.
pub trait FunctionCatalog {
    /// Volatility of `name`; `None` means unknown (routes to the primary).
    fn volatility(&self, name: &str) -> Option<Volatility>;

    /// Whether `relation` (`name` or `schema.name`, as written in the statement) is an
    /// unlogged table, which a hot standby refuses to read. Unknown relations are not.
    fn is_unlogged(&self, _relation: &str) -> bool {
        false
    }
}

impl<S: std::hash::BuildHasher> FunctionCatalog
    for std::collections::HashMap<String, Volatility, S>
{
    fn volatility(&self, name: &str) -> Option<Volatility> {
        self.get(name).copied()
    }
}
