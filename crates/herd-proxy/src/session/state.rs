//! What a client session carries from one server to the next in transaction pooling: its
//! settings, prepared statements, consistency level and read-your-writes token.

use std::collections::{BTreeMap, HashMap};
use std::hash::{Hash, Hasher};

use herd_core::{Consistency, Lsn};

/// A protocol-level prepared statement of the client.
#[derive(Clone, Debug)]
pub struct Statement {
    /// Name used on servers: derived from the text and parameter types, so identical statements
    /// of different clients share one server-side statement.
    pub server_name: String,
    /// The SQL text.
    pub query: String,
    /// Parameter type OIDs as the client declared them.
    pub param_types: Vec<u32>,
    /// May run on a replica.
    pub read_only: bool,
}

impl Statement {
    /// A statement with its server-side name computed.
    pub fn new(query: &str, param_types: Vec<u32>, read_only: bool) -> Statement {
        let mut h = std::collections::hash_map::DefaultHasher::new();
        query.hash(&mut h);
        param_types.hash(&mut h);
        Statement {
            server_name: format!("herd_{:016x}", h.finish()),
            query: query.to_string(),
            param_types,
            read_only,
        }
    }
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
    /// Read-your-writes token: the primary's WAL position after this session's last write.
    pub token: Lsn,
    /// Named prepared statements (shared handles: a Bind looks one up per execution).
    pub statements: HashMap<String, std::sync::Arc<Statement>>,
    /// The read-only-ness of the last unnamed `Parse`, for a later `Bind` of it.
    pub unnamed_read_only: bool,
}

impl SessionState {
    /// A new session with `consistency`.
    pub fn new(consistency: Consistency) -> Self {
        SessionState {
            sets: BTreeMap::new(),
            pending_sets: Vec::new(),
            hash: 0,
            consistency,
            token: Lsn(0),
            statements: HashMap::new(),
            unnamed_read_only: false,
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
    }

    /// `RESET ALL` / `DISCARD ALL`.
    pub fn reset_all(&mut self) {
        self.sets.clear();
        self.pending_sets.clear();
        self.rehash();
    }

    /// The transaction ended: keep its settings when it committed.
    pub fn end_transaction(&mut self, committed: bool) {
        let pending = std::mem::take(&mut self.pending_sets);
        if committed {
            for (name, stmt) in pending {
                self.apply(&name, stmt);
            }
        }
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

    /// Raises the read-your-writes token (never lowers it).
    pub fn advance_token(&mut self, lsn: Lsn) {
        self.token = self.token.max(lsn);
    }
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
    fn token_only_grows() {
        let mut s = SessionState::new(Consistency::Session);
        s.advance_token(Lsn(10));
        s.advance_token(Lsn(5));
        assert_eq!(s.token, Lsn(10));
    }

    #[test]
    fn statement_names_are_shared_by_text() {
        let a = Statement::new("select 1", vec![], true);
        let b = Statement::new("select 1", vec![], true);
        let c = Statement::new("select 1", vec![23], true);
        assert_eq!(a.server_name, b.server_name);
        assert_ne!(a.server_name, c.server_name);
    }
}
