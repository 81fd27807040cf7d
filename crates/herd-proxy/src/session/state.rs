//! What a client session carries from one server to the next in transaction pooling: its
//! settings, prepared statements, consistency level and read-your-writes token.

use std::collections::{BTreeMap, HashMap};
use std::hash::{Hash, Hasher};
use std::sync::{Arc, Weak};

use herd_core::{Consistency, Lsn};

use crate::analysis::{Analysis, Effect, SchemaChange};
use crate::catalog::ProcCatalog;

/// A protocol-level prepared statement of the client.
#[derive(Clone, Debug)]
pub struct Statement {
    /// Name used on servers: derived from the text and parameter types, so identical statements
    /// of different clients share one server-side statement.
    pub server_name: String,
    /// The SQL text, as bytes in the client's encoding.
    pub query: Vec<u8>,
    /// Parameter type OIDs as the client declared them.
    pub param_types: Vec<u32>,
    /// May run on a replica.
    pub read_only: bool,
    /// Running it binds the session to its server.
    pub pin: bool,
    /// What running it changes in the session (applied when it is executed, not parsed).
    pub effects: Vec<Effect>,
    /// Servers holding an older generation of the same text prepare it again.
    pub generation: u64,
    /// What running it may change in the schema kept statements refer to.
    pub schema: SchemaChange,
    /// The session's `search_path` when it was parsed ([`SessionState::path`]): a server's
    /// copy prepared under another is not used for it.
    pub path: u64,
}

impl Statement {
    /// A statement with its server-side name computed, and what analysis found about it.
    /// `path` is the session's [`SessionState::path`]: the same text under another
    /// `search_path` may name other tables, so it gets a server-side statement of its own
    /// (clients of a schema each do not take turns re-preparing one shared statement).
    pub fn new(query: &[u8], param_types: Vec<u32>, analysis: &Analysis, path: u64) -> Statement {
        let mut h = std::collections::hash_map::DefaultHasher::new();
        query.hash(&mut h);
        param_types.hash(&mut h);
        if path != 0 {
            // The default path leaves names as they were.
            path.hash(&mut h);
        }
        Statement {
            server_name: format!("herd_{:016x}", h.finish()),
            query: query.to_vec(),
            param_types,
            read_only: analysis.read_only,
            pin: analysis.pin,
            effects: analysis.effects.clone(),
            generation: 0,
            schema: analysis.schema,
            path,
        }
    }
}

/// The client's unnamed prepared statement, which PostgreSQL keeps until the next unnamed
/// `Parse` or simple query: in transaction pooling the next unit may land on another server,
/// where the proxy prepares it again before a `Bind` or `Describe` uses it.
#[derive(Clone, Debug)]
pub struct Unnamed {
    /// The statement.
    pub stmt: Arc<Statement>,
    /// Unique among every client of the proxy: a server's `unnamed` equal to it holds this one.
    pub token: u64,
}

/// The statement of the client's last unnamed Parse, kept after PostgreSQL dropped it: drivers
/// send the same text with every execution (pgbench `-M extended`, `PQexecParams`, JDBC before
/// its prepare threshold), and classifying it again cost more than the rest of the Parse.
#[derive(Clone, Debug)]
pub struct RecentParse {
    /// The statement, as the next unnamed Parse of the same text and types may reuse it.
    pub stmt: Arc<Statement>,
    /// Why it goes to the primary, when it does (the routing's metric label).
    pub reason: &'static str,
    /// The function catalog it was classified with: a newer one (functions created or
    /// changed since) classifies the text again. Weak, so a session idle for hours keeps no
    /// old catalog alive (only its allocation, so its address is not reused).
    catalog: Weak<ProcCatalog>,
    /// Classified for a client encoding that may hide ASCII in multibyte characters.
    unsafe_encoding: bool,
}

impl RecentParse {
    /// Remembers `stmt`, classified (reason `reason`) with `catalog` under `unsafe_encoding`.
    pub fn new(
        stmt: Arc<Statement>,
        reason: &'static str,
        catalog: &Arc<ProcCatalog>,
        unsafe_encoding: bool,
    ) -> Self {
        RecentParse {
            stmt,
            reason,
            catalog: Arc::downgrade(catalog),
            unsafe_encoding,
        }
    }

    /// Whether it answers for a Parse of `query` in a session with `unsafe_encoding` while the
    /// catalog in use is at `catalog` ([`ProxyContext::catalog_ptr`]). The weak handle keeps
    /// the old catalog's allocation, so no newer catalog can have its address.
    ///
    /// [`ProxyContext::catalog_ptr`]: crate::ProxyContext::catalog_ptr
    pub fn answers(
        &self,
        query: &[u8],
        unsafe_encoding: bool,
        catalog: *const ProcCatalog,
    ) -> bool {
        self.stmt.query == query
            && self.unsafe_encoding == unsafe_encoding
            && std::ptr::eq(self.catalog.as_ptr(), catalog)
    }
}

/// A SQL-level prepared statement the proxy keeps (a sharded cluster).
#[derive(Debug, Clone)]
pub struct SqlKept {
    /// The statement as the client wrote it.
    pub query: String,
    /// Its parameters' types, as PostgreSQL named them when it checked the statement.
    pub types: Vec<String>,
}

/// Per-client state.
#[derive(Debug)]
pub struct SessionState {
    /// Session settings (`SET name = …`), by name, as statements to replay.
    sets: BTreeMap<String, String>,
    /// Settings made inside the current transaction; kept only if it commits.
    pending_sets: Vec<(String, Option<String>)>,
    /// Hash of `sets`, compared with a server's to skip replay when equal.
    pub hash: u64,
    /// Consistency level of the session.
    pub consistency: Consistency,
    /// Read-your-writes tokens, one per shard group (index = group; missing: none yet): the
    /// group primary's WAL position after this session's last write there. Positions of
    /// different groups are not comparable.
    tokens: Vec<Lsn>,
    /// Named prepared statements by the client's name (bytes in its encoding; shared handles:
    /// a Bind looks one up per execution). Hashed with foldhash, seeded at random per
    /// process: the names are the client's own, in a map of its own.
    pub statements: HashMap<Vec<u8>, Arc<Statement>, foldhash::fast::RandomState>,
    /// The unnamed prepared statement, while it exists.
    pub unnamed: Option<Unnamed>,
    /// The last unnamed Parse's statement, reused when the next one repeats it.
    pub recent_parse: Option<RecentParse>,
    /// Session pooling on a sharded cluster: the SQL of the statements the client prepared
    /// (passed through under its own names), so that each Bind is checked against the group
    /// of the session's server.
    pub passed: HashMap<Vec<u8>, Vec<u8>>,
    /// A sharded cluster: the SQL-level prepared statements (`PREPARE`), by name, kept by
    /// the proxy rather than a server (`sql_prepare.rs`).
    pub sql_prepared: HashMap<String, SqlKept>,
    /// The client's encoding may hide ASCII bytes inside multibyte characters (SJIS, BIG5,
    /// GBK, UHC, GB18030, JOHAB): SQL with non-ASCII bytes is then not classified.
    pub unsafe_encoding: bool,
    /// `SET LOCAL search_path` in the current transaction: its statement.
    local_path: Option<String>,
    /// The path was changed where the proxy cannot read it (`set_config()`).
    path_unknown: bool,
    /// Hash of the `search_path` the session's statements are analysed under now (its
    /// setting, pending ones of the open transaction included; 0: the server's default).
    /// A statement kept on a server is reused only under the path it was prepared with:
    /// PostgreSQL would analyse it again under another and may refuse to (0A000).
    pub path: u64,
}

impl SessionState {
    /// A new session with `consistency`.
    pub fn new(consistency: Consistency) -> Self {
        SessionState {
            sets: BTreeMap::new(),
            pending_sets: Vec::new(),
            hash: 0,
            consistency,
            tokens: Vec::new(),
            statements: HashMap::default(),
            unnamed: None,
            recent_parse: None,
            passed: HashMap::new(),
            sql_prepared: HashMap::new(),
            unsafe_encoding: false,
            local_path: None,
            path_unknown: false,
            path: 0,
        }
    }

    /// Records `SET name …` (or `RESET name` when `stmt` is `None`) made in the current
    /// transaction or, outside one, immediately.
    pub fn record_set(&mut self, name: &str, stmt: Option<String>, in_transaction: bool) {
        if in_transaction {
            self.pending_sets.push((name.to_string(), stmt));
        } else {
            self.apply(name, stmt);
        }
        self.refresh_path();
    }

    /// `RESET ALL` / `DISCARD ALL`.
    pub fn reset_all(&mut self) {
        self.path_unknown = false;
        self.sets.clear();
        self.pending_sets.clear();
        self.rehash();
        self.refresh_path();
    }

    /// `SET LOCAL search_path …` ran in the current transaction.
    pub fn set_local_path(&mut self, sql: &str) {
        self.local_path = Some(sql.to_string());
    }

    /// The path changed where the proxy cannot read it: from now on, unknown.
    pub fn path_unknown(&mut self) {
        self.path_unknown = true;
    }

    /// The session's `search_path` as far as the proxy knows: `SET LOCAL`, then a `SET` in
    /// the current transaction, then the session's own (also from its startup parameters).
    pub fn search_path(&self) -> herd_shard::SearchPath {
        use herd_shard::SearchPath;
        if self.path_unknown {
            return SearchPath::Unknown;
        }
        let pending = self
            .pending_sets
            .iter()
            .rev()
            .find(|(n, _)| n == "search_path")
            .map(|(_, s)| s.as_deref());
        let sql = match (&self.local_path, pending) {
            (Some(local), _) => Some(local.as_str()),
            (None, Some(pending)) => pending,
            (None, None) => self.sets.get("search_path").map(String::as_str),
        };
        match sql.map(herd_sql::search_path_of) {
            None | Some(Some(None)) => SearchPath::Default,
            Some(Some(Some(schemas))) => SearchPath::Set(schemas),
            Some(None) => SearchPath::Unknown,
        }
    }

    /// The transaction ended: keep its settings when it committed.
    pub fn end_transaction(&mut self, committed: bool) {
        self.local_path = None;
        let pending = std::mem::take(&mut self.pending_sets);
        if committed {
            for (name, stmt) in pending {
                self.apply(&name, stmt);
            }
        }
        self.refresh_path();
    }

    /// Recomputes `path` from the `search_path` in force: the transaction's own latest
    /// setting, else the session's.
    fn refresh_path(&mut self) {
        let pending = self
            .pending_sets
            .iter()
            .rev()
            .find(|(name, _)| name.eq_ignore_ascii_case("search_path"))
            .map(|(_, stmt)| stmt.as_ref());
        let stmt = match pending {
            Some(stmt) => stmt,
            None => self
                .sets
                .iter()
                .find(|(name, _)| name.eq_ignore_ascii_case("search_path"))
                .map(|(_, stmt)| stmt),
        };
        self.path = stmt.map_or(0, |s| {
            let mut h = std::collections::hash_map::DefaultHasher::new();
            s.hash(&mut h);
            // 0 means the default path; a setting must never collide with it.
            h.finish() | 1
        });
    }

    fn apply(&mut self, name: &str, stmt: Option<String>) {
        match stmt {
            Some(s) => {
                self.sets.insert(name.to_string(), s);
            }
            None => {
                self.sets.remove(name);
            }
        }
        self.rehash();
    }

    fn rehash(&mut self) {
        self.unsafe_encoding = self
            .sets
            .get("client_encoding")
            .is_some_and(|stmt| encoding_is_unsafe(stmt));
        if self.sets.is_empty() {
            self.hash = 0;
            return;
        }
        let mut h = std::collections::hash_map::DefaultHasher::new();
        self.sets.hash(&mut h);
        // 0 means "server defaults"; a non-empty state must never collide with it.
        self.hash = h.finish() | 1;
    }

    /// The SQL that brings a server from any state to this session's settings.
    pub fn replay_sql(&self) -> String {
        let mut sql = String::from("RESET ALL;");
        for stmt in self.sets.values() {
            sql.push_str(stmt);
            sql.push(';');
        }
        sql
    }

    /// The read-your-writes token of shard group `group`.
    pub fn token(&self, group: u32) -> Lsn {
        self.tokens.get(group as usize).copied().unwrap_or(Lsn(0))
    }

    /// Raises the read-your-writes token of shard group `group` (never lowers it).
    pub fn advance_token(&mut self, group: u32, lsn: Lsn) {
        let i = group as usize;
        if self.tokens.len() <= i {
            self.tokens.resize(i + 1, Lsn(0));
        }
        self.tokens[i] = self.tokens[i].max(lsn);
    }
}

/// Whether the encoding a `SET client_encoding …` statement names may hide ASCII bytes inside
/// multibyte characters (PostgreSQL allows these as client encodings only, for that reason).
/// Names are compared as PostgreSQL does: case and punctuation ignored, aliases included.
pub fn encoding_is_unsafe(set_statement: &str) -> bool {
    const UNSAFE: [&str; 19] = [
        "sjis",
        "shiftjis",
        "mskanji",
        "win932",
        "windows932",
        "shiftjis2004",
        "big5",
        "win950",
        "windows950",
        "gbk",
        "win936",
        "windows936",
        "cp936",
        "uhc",
        "win949",
        "windows949",
        "cp949",
        "gb18030",
        "johab",
    ];
    let normal: String = set_statement
        .chars()
        .filter(char::is_ascii_alphanumeric)
        .map(|c| c.to_ascii_lowercase())
        .collect();
    UNSAFE.iter().any(|name| normal.ends_with(name))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn settings_replay_and_hash() {
        let mut s = SessionState::new(Consistency::Session);
        assert_eq!(s.hash, 0);
        s.record_set("search_path", Some("SET search_path = a".into()), false);
        let h1 = s.hash;
        assert_ne!(h1, 0);
        s.record_set("work_mem", Some("SET work_mem = '8MB'".into()), true);
        assert_eq!(s.hash, h1, "pending until commit");
        s.end_transaction(false);
        assert_eq!(s.hash, h1, "rolled back");
        s.record_set("work_mem", Some("SET work_mem = '8MB'".into()), true);
        s.end_transaction(true);
        assert_ne!(s.hash, h1);
        assert_eq!(
            s.replay_sql(),
            "RESET ALL;SET search_path = a;SET work_mem = '8MB';"
        );
        s.record_set("search_path", None, false);
        assert_eq!(s.replay_sql(), "RESET ALL;SET work_mem = '8MB';");
        s.reset_all();
        assert_eq!(s.hash, 0);
    }

    #[test]
    fn encodings_that_hide_ascii_bytes() {
        assert!(encoding_is_unsafe("SET \"client_encoding\" = 'SJIS'"));
        assert!(encoding_is_unsafe(
            "set client_encoding to 'Shift_JIS_2004'"
        ));
        assert!(encoding_is_unsafe("SET client_encoding = big5"));
        assert!(!encoding_is_unsafe("SET client_encoding = 'LATIN1'"));
        assert!(!encoding_is_unsafe("SET client_encoding = 'UTF8'"));
        let mut s = SessionState::new(Consistency::Session);
        s.record_set(
            "client_encoding",
            Some("SET client_encoding = 'GBK'".into()),
            false,
        );
        assert!(s.unsafe_encoding);
        s.reset_all();
        assert!(!s.unsafe_encoding);
    }

    #[test]
    fn token_only_grows() {
        let mut s = SessionState::new(Consistency::Session);
        s.advance_token(0, Lsn(10));
        s.advance_token(0, Lsn(5));
        assert_eq!(s.token(0), Lsn(10));
        s.advance_token(2, Lsn(3));
        assert_eq!((s.token(1), s.token(2)), (Lsn(0), Lsn(3)));
    }

    /// The facts of a plain read.
    fn read_only() -> Analysis {
        Analysis {
            read_only: true,
            reason: herd_sql::Reason::ReadOnly,
            pin: false,
            effects: vec![],
            local: None,
            schema: SchemaChange::None,
        }
    }

    #[test]
    fn a_recent_parse_answers_for_its_text_encoding_and_catalog_only() {
        let read = read_only();
        let old = Arc::new(ProcCatalog::default());
        let stmt = Arc::new(Statement::new(b"select $1", vec![], &read, 0));
        let recent = RecentParse::new(stmt, "read", &old, false);
        assert!(recent.answers(b"select $1", false, Arc::as_ptr(&old)));
        assert!(!recent.answers(b"select $2", false, Arc::as_ptr(&old)));
        assert!(
            !recent.answers(b"select $1", true, Arc::as_ptr(&old)),
            "classified for another encoding"
        );
        // A catalog loaded since (functions created or changed): classified again, even
        // once the old one is dropped (its address stays taken while the weak handle lives).
        let new = Arc::new(ProcCatalog::default());
        assert!(!recent.answers(b"select $1", false, Arc::as_ptr(&new)));
        drop(old);
        let newer = Arc::new(ProcCatalog::default());
        assert!(!recent.answers(b"select $1", false, Arc::as_ptr(&newer)));
        assert!(!recent.answers(b"select $1", false, std::ptr::null()));
    }

    #[test]
    fn statement_names_are_shared_by_text() {
        let read = read_only();
        let a = Statement::new(b"select 1", vec![], &read, 0);
        let b = Statement::new(b"select 1", vec![], &read, 0);
        let c = Statement::new(b"select 1", vec![23], &read, 0);
        let d = Statement::new(b"select 1", vec![], &read, 7);
        assert_eq!(a.server_name, b.server_name);
        assert_ne!(a.server_name, c.server_name);
        assert_ne!(a.server_name, d.server_name, "another search_path");
    }

    #[test]
    fn search_path_in_force() {
        let mut s = SessionState::new(Consistency::Session);
        assert_eq!(s.path, 0);
        s.record_set("search_path", Some("SET search_path = a".into()), false);
        let a = s.path;
        assert_ne!(a, 0);
        s.record_set("search_path", Some("SET search_path = b".into()), true);
        let b = s.path;
        assert_ne!(b, a, "the transaction's own setting is in force in it");
        s.end_transaction(false);
        assert_eq!(s.path, a, "rolled back");
        s.record_set("work_mem", Some("SET work_mem = '8MB'".into()), false);
        assert_eq!(s.path, a, "other settings do not count");
        s.record_set("search_path", None, false);
        assert_eq!(s.path, 0);
        s.record_set("search_path", Some("SET search_path = b".into()), true);
        s.end_transaction(true);
        assert_eq!(s.path, b);
        s.reset_all();
        assert_eq!(s.path, 0);
    }
}
