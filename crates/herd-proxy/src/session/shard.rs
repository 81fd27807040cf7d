//! The session's side of sharding: which shard group a unit runs on (planned by `herd-shard`
//! from each statement's key and its Bind parameters), Herd's own `SELECT herd.…()` functions,
//! and the refusal of a statement that would leave its transaction's group.

use std::collections::HashMap;
use std::sync::Arc;

use herd_shard::{Plan, ShardMap};
use herd_wire::frontend::{tag, Bind, Parse, Query};
use herd_wire::{encode, split_frame};

pub(super) use super::plan_sql::{bind_params, plan_sql, raising_sql, typed_params, Resolver};
use super::write_all::Write;
use super::Session;
use crate::pool::Lease;
use crate::ProxyError;

/// SQLSTATE of statements a shard group cannot run alone (feature_not_supported).
pub(super) const NOT_SUPPORTED: &str = "0A000";

/// Why DDL and COPY on distributed tables run by themselves.
pub(super) const ALONE: &str = "DDL and COPY on a distributed or reference table run on every \
     shard group in a transaction of their own: send the statement alone, outside a transaction block";

pub(super) fn not_supported(message: String) -> ProxyError {
    ProxyError::Server {
        code: NOT_SUPPORTED.into(),
        message,
    }
}

/// Where a unit goes.
pub(super) enum UnitRoute {
    /// One group (`None`: any; the session then uses group 0).
    Group(Option<u32>),
    /// DDL every group runs, all or none; the command tag to answer.
    Everywhere(&'static str),
    /// COPY FROM STDIN into a distributed table, split by key.
    CopyIn(herd_shard::CopyIn),
    /// COPY TO STDOUT of a distributed table, gathered from every group.
    CopyOut(herd_shard::CopyOut),
    /// A role statement: runs on group 0, then the roles are copied to every group.
    Role(&'static str),
    /// DDL outside a transaction, group after group (and its undo where it ran, on failure).
    EachGroup(&'static str, String),
    /// CREATE, ALTER or DROP DATABASE: every group.
    Database(herd_sql::DatabaseStmt),
    /// A SELECT every group answers, merged.
    FanOut(herd_sql::FanOut),
    /// EXPLAIN (its options) of such a SELECT: the merge step, then a group's plan.
    ExplainFanOut(String, herd_sql::FanOut),
    /// An UPDATE or DELETE every group runs, or an INSERT split by group; all or none.
    WriteAll(Write),
    /// A query string of several statements on different groups: these statements, one
    /// after the other, in its transaction (`script.rs`).
    Script(super::script::Steps),
    /// Group 0's primary, where a read the fast paths cannot answer runs over the global
    /// relations (the general path, `general.rs`; the translator rewrites it).
    General,
}

/// How long a statement waits for a moving shard's switch (which undoes itself well before).
const MOVE_WAIT_LIMIT: std::time::Duration = std::time::Duration::from_secs(30);

/// Why an UPDATE or DELETE on every shard group must come alone.
pub(super) const WRITE_ALL_ALONE: &str = "an UPDATE or DELETE without a shard key of one group \
     (or an INSERT with rows for several groups) runs on every shard group: send it as the only \
     statement of its query string or of its Bind/Execute (in transaction pooling, not in a \
     session pinned to its server), or add a condition on the shard key";

/// Why a SELECT across shard groups must come alone.
pub(super) const FAN_OUT_ALONE: &str =
    "a SELECT that reads distributed tables on every shard group runs as the only statement of \
     its query string or of its Bind/Execute (in transaction pooling, not in a session pinned to \
     its server): send it alone, or add a condition on the shard key";

impl Session {
    /// The shard map of the session's database when the cluster has several groups and
    /// something is distributed there; `None` otherwise (everything runs on group 0).
    pub(super) async fn active_map(&mut self) -> Result<Option<Arc<ShardMap>>, ProxyError> {
        if self.ctx.groups() < 2 {
            return Ok(None);
        }
        let mut map = if self.in_transaction() {
            self.ctx.shard_map_in_transaction(&self.database).await?
        } else {
            self.ctx.shard_map(&self.database).await?
        };
        if !map.paused.is_empty() && self.in_transaction() {
            // A transaction under way does not wait for a switch (it may hold the very locks
            // the switch waits for): its statements go where the shard still is, and either
            // commit before the source's guard exists or are refused by it (40001).
            let mut open = (*map).clone();
            open.paused.clear();
            map = Arc::new(open);
        }
        self.map = (!map.tables.is_empty()).then(|| map.clone());
        Ok(self.map.clone())
    }

    /// Where `unit` must run; while a shard it touches is switching groups, once the switch
    /// is over.
    pub(super) async fn unit_route(&mut self, unit: &[u8]) -> Result<UnitRoute, ProxyError> {
        if let Some(route) = self.unit_route_once(unit).await? {
            return Ok(route);
        }
        self.ctx.metrics.inc("herd_shard_move_waits_total", "");
        let deadline = tokio::time::Instant::now() + MOVE_WAIT_LIMIT;
        let mut changes = self.ctx.map_changes();
        loop {
            // Subscribed before planning again: a change in between is not missed.
            changes.borrow_and_update();
            if let Some(route) = self.unit_route_once(unit).await? {
                return Ok(route);
            }
            if tokio::time::timeout_at(deadline, changes.changed())
                .await
                .is_err()
            {
                return Err(ProxyError::Server {
                    code: "57014".into(),
                    message: format!(
                        "a shard this statement touches has been switching groups (or a shard group being added) for over {} s",
                        MOVE_WAIT_LIMIT.as_secs()
                    ),
                });
            }
        }
    }

    /// Where `unit` must run, by the map as it is now; `None` while a shard it touches is
    /// switching groups.
    async fn unit_route_once(&mut self, unit: &[u8]) -> Result<Option<UnitRoute>, ProxyError> {
        // Role and database statements alone outside a transaction, whether or not anything
        // is distributed.
        if !self.in_transaction() {
            if let Some((frame, used)) = split_frame(unit, usize::MAX)? {
                if used == unit.len() && frame.tag == tag::QUERY {
                    let sql = Query::decode(frame.body)?.sql;
                    if let Some(tag) = role_statement(sql) {
                        return Ok(Some(UnitRoute::Role(tag)));
                    }
                    if let Some(stmt) = database_statement(sql) {
                        return Ok(Some(UnitRoute::Database(stmt)));
                    }
                }
            }
        }
        refuse_extended_database_statement(unit)?;
        let Some(map) = self.active_map().await? else {
            return Ok(Some(UnitRoute::Group(None)));
        };
        if std::mem::take(&mut self.names_dirty) {
            self.ctx.forget_names(&self.database);
        }
        let names = self.ctx.names(&self.database).await?;
        let user = self.user.clone();
        let resolver = Resolver {
            names: &names,
            path: self.state.search_path(),
            user: &user,
        };
        let mut parsed: HashMap<Vec<u8>, Vec<u8>> = HashMap::new();
        let mut parsed_types: HashMap<Vec<u8>, Vec<u32>> = HashMap::new();
        let mut group: Option<u32> = None;
        // A statement of the unit takes the general path (group 0's primary).
        let mut general = false;
        let mut rest = unit;
        while let Some((frame, used)) = split_frame(rest, usize::MAX)? {
            rest = &rest[used..];
            // The statement's text, borrowed from the unit when it is there (no copy per unit).
            let text: std::borrow::Cow<'_, [u8]>;
            let plan = match frame.tag {
                tag::QUERY => {
                    let sql = Query::decode(frame.body)?.sql;
                    self.note_ddl(sql);
                    text = std::borrow::Cow::Borrowed(sql);
                    match self.drop_index_plan(&map, sql).await? {
                        Some(p) => p,
                        None => {
                            let plan = plan_sql(&self.ctx, &map, Some(&resolver), sql, &[]);
                            // Only a string refused as a whole is looked at again: nothing
                            // more is done for one that runs on one group.
                            let alone = rest.is_empty() && group.is_none();
                            let pooled = self.ctx.config.pool_mode != herd_core::PoolMode::Session;
                            // A transaction across groups takes a string with a COMMIT
                            // statement by statement too (else refused as acting on one part).
                            let spanning = !self.parked.is_empty();
                            if (matches!(plan, Plan::Refuse(_)) || spanning) && alone && pooled {
                                let open = self.in_transaction();
                                if let Some(script) =
                                    super::script::script_of(&self.ctx, &map, &resolver, sql, open)
                                {
                                    return script
                                        .map(|steps| Some(UnitRoute::Script(steps)))
                                        .map_err(not_supported);
                                }
                            }
                            plan
                        }
                    }
                }
                tag::PARSE => {
                    let p = Parse::decode(frame.body)?;
                    self.note_ddl(p.query);
                    parsed.insert(p.name.to_vec(), p.query.to_vec());
                    parsed_types.insert(p.name.to_vec(), p.param_types);
                    continue;
                }
                tag::BIND => {
                    let b = Bind::decode(frame.body)?;
                    let Some(sql) = self.bound_sql(&parsed, b.statement) else {
                        continue;
                    };
                    let types = match parsed_types.get(b.statement) {
                        Some(t) => t.clone(),
                        None => self.bound_types(b.statement).unwrap_or_default(),
                    };
                    let plan = plan_sql(
                        &self.ctx,
                        &map,
                        Some(&resolver),
                        &sql,
                        &typed_params(b.rest, &types),
                    );
                    text = std::borrow::Cow::Owned(sql);
                    plan
                }
                _ => continue,
            };
            // Outside a transaction, statements every group runs wait for a group being
            // added (those of open transactions meet group 0's triggers instead).
            let held = self.ctx.adding_group() && !self.in_transaction();
            if map.waits(&plan) || (held && plan.reaches_every_group()) {
                return Ok(None);
            }
            // A pipeline (several Binds before one Sync) whose statements need several
            // groups: statement by statement in its transaction (`pipeline.rs`), or refused
            // before anything runs.
            let across = match &plan {
                Plan::WriteAllGroups(_)
                | Plan::InsertSplit(_)
                | Plan::InsertSelect(_)
                | Plan::WriteReference { .. }
                | Plan::AllGroups { .. } => !self.alone(unit, frame.tag, rest, group),
                Plan::General { .. } => group.is_some_and(|x| x != 0),
                Plan::Group { group: g, .. } => {
                    group.is_some_and(|x| x != *g) || (general && *g != 0)
                }
                _ => false,
            };
            if across {
                if let Some(sends) = self.pipeline_of(unit, &map, &resolver) {
                    return sends
                        .map(|s| Some(UnitRoute::Script(s)))
                        .map_err(not_supported);
                }
            }
            match plan {
                Plan::Anywhere => {}
                Plan::WriteAllGroups(tag) => {
                    return self
                        .write_route(unit, frame.tag, rest, group, Write::Same(tag))
                        .map(Some);
                }
                Plan::InsertSplit(groups) => {
                    return self
                        .write_route(unit, frame.tag, rest, group, Write::Split(groups))
                        .map(Some);
                }
                Plan::InsertSelect(plan) => {
                    return self
                        .write_route(unit, frame.tag, rest, group, Write::FromSelect(plan))
                        .map(Some);
                }
                Plan::WriteReference {
                    table,
                    tag,
                    columns,
                } => {
                    self.deterministic(&text, &table, &columns).await?;
                    return self
                        .write_route(unit, frame.tag, rest, group, Write::Reference(tag))
                        .map(Some);
                }
                Plan::AllGroups { table } => {
                    if !self.alone(unit, frame.tag, rest, group) {
                        return Err(not_supported(FAN_OUT_ALONE.into()));
                    }
                    let text = String::from_utf8_lossy(&text);
                    // EXPLAIN of a read across groups: the merge step and a group's plan.
                    let explained = first_word_is(text.as_bytes(), &["explain"])
                        .then(|| herd_sql::explained(&text))
                        .flatten();
                    let catalog = self.ctx.catalog();
                    let statement = explained.as_ref().map_or(&*text, |(_, s)| s.as_str());
                    let shape = match herd_sql::fan_out(statement, &|name| {
                        catalog.may_be_aggregate(name)
                    }) {
                        Ok(shape) => shape,
                        Err(why) if explained.is_none() => {
                            let why = format!(
                                "{why} ({table} is distributed: add a condition on its shard \
                                     key to read one group)"
                            );
                            self.general_route(&map, &names, &resolver, &text, &why)
                                .await?;
                            group = Some(0);
                            general = true;
                            continue;
                        }
                        Err(why) => {
                            return Err(not_supported(format!(
                                "{why} ({table} is distributed: add a condition on its \
                                     shard key to read one group)"
                            )))
                        }
                    };
                    if let Some((prefix, _)) = explained {
                        if frame.tag != tag::QUERY || self.in_transaction() {
                            return Err(not_supported(
                                "EXPLAIN of a statement across shard groups runs in the simple \
                                 query protocol, without parameters, outside a transaction block"
                                    .into(),
                            ));
                        }
                        return Ok(Some(UnitRoute::ExplainFanOut(prefix, shape)));
                    }
                    self.ctx.metrics.inc_labels(
                        "herd_shard_routed_total",
                        &[("group", "all"), ("reason", "fan_out")],
                    );
                    return Ok(Some(UnitRoute::FanOut(shape)));
                }
                Plan::Refuse(why) => return Err(not_supported(why)),
                Plan::General { why } => {
                    if group.is_some_and(|x| x != 0) {
                        return Err(not_supported(format!(
                            "{why} (nor can the general path answer it in a batch with \
                             statements for another shard group: send it separately)"
                        )));
                    }
                    let text = String::from_utf8_lossy(&text).into_owned();
                    self.general_route(&map, &names, &resolver, &text, &why)
                        .await?;
                    group = Some(0);
                    general = true;
                }
                // Privileges do not change what the move copies; the rest of DDL could.
                Plan::Everywhere(tag) | Plan::EachGroup { tag, .. }
                    if map.hides_rows() && !matches!(tag, "GRANT" | "REVOKE") =>
                {
                    return Err(ProxyError::Server {
                        code: "55000".into(),
                        message: "DDL on distributed tables waits until the shard moving between \
                                  groups has moved (`herd shards move` finishes or cancels it)"
                            .into(),
                    });
                }
                Plan::Everywhere(_)
                | Plan::EachGroup { .. }
                | Plan::CopyIn(_)
                | Plan::CopyOut(_) => {
                    let alone = group.is_none()
                        && match frame.tag {
                            tag::QUERY => rest.is_empty(),
                            // COPY through the extended protocol (a driver's copy_in): one Bind.
                            _ => {
                                matches!(plan, Plan::CopyIn(_) | Plan::CopyOut(_))
                                    && single_bind(unit)
                            }
                        };
                    if !alone || self.in_transaction() {
                        return Err(not_supported(ALONE.into()));
                    }
                    return Ok(Some(match plan {
                        Plan::Everywhere(tag) => UnitRoute::Everywhere(tag),
                        Plan::CopyIn(c) => UnitRoute::CopyIn(c),
                        Plan::CopyOut(c) => UnitRoute::CopyOut(c),
                        Plan::EachGroup { tag, undo } => UnitRoute::EachGroup(tag, undo),
                        _ => UnitRoute::Group(None),
                    }));
                }
                Plan::Group { group: g, reason } => {
                    if group.is_some_and(|x| x != g) || (general && g != 0) {
                        return Err(not_supported(
                            "the statements of this batch belong to different shard groups; send \
                             them separately (cross-group batches are not supported yet)"
                                .into(),
                        ));
                    }
                    self.ctx.metrics.inc_labels(
                        "herd_shard_routed_total",
                        &[("group", &g.to_string()), ("reason", reason)],
                    );
                    group = Some(g);
                }
            }
        }
        Ok(Some(if general {
            UnitRoute::General
        } else {
            UnitRoute::Group(group)
        }))
    }

    /// `sql` may change what names mean (CREATE, ALTER, DROP): the database's names are
    /// forgotten now and again before this session's next unit, so neither this session nor
    /// another plans with the old ones for long (another session at most until they are read
    /// again). DDL inside `DO` or a procedure is seen within the names' lifetime
    /// (3 s), as DDL made directly on a server is: forgetting at
    /// every call would read the catalog at every call.
    fn note_ddl(&mut self, sql: &[u8]) {
        if first_word_is(sql, &["create", "alter", "drop"]) {
            self.ctx.forget_names(&self.database);
            self.names_dirty = true;
        }
    }

    /// Refuses a write to reference table `table` that could come out differently on each
    /// group: SQL value functions or `DEFAULT`, functions that are not immutable, or an INSERT
    /// leaving out a column whose default is not a constant (a serial's `nextval`, `now()`).
    async fn deterministic(
        &self,
        sql: &[u8],
        table: &str,
        columns: &[String],
    ) -> Result<(), ProxyError> {
        let text = String::from_utf8_lossy(sql);
        let differs = |what: String| {
            not_supported(format!(
                "a write to reference table {table} runs on every shard group, and {what} would \
                 give each group's copy its own value: write the values themselves"
            ))
        };
        if let Some(what) = herd_sql::nondeterministic_syntax(&text) {
            return Err(differs(what));
        }
        let catalog = self.ctx.catalog();
        let classified = self.ctx.classifier.get_or_classify(&text);
        for f in classified
            .statements
            .iter()
            .flat_map(|s| s.functions.iter())
        {
            if herd_sql::FunctionCatalog::volatility(catalog.as_ref(), f)
                != Some(herd_sql::Volatility::Immutable)
            {
                return Err(differs(format!("{f}(), which is not immutable,")));
            }
        }
        if herd_sql::key_facts(&text).is_some_and(|f| f.kind == herd_sql::StmtKind::Insert) {
            let defaults = self.ctx.computed_defaults(&self.database, table).await?;
            if let Some(c) = defaults
                .iter()
                .find(|c| columns.is_empty() || !columns.contains(c))
            {
                return Err(differs(format!("the default of column {c}")));
            }
        }
        Ok(())
    }

    /// The statement just planned is the unit's only one (the last of a simple query, or the
    /// one Bind of an extended batch): the condition for running it on every group (inside a
    /// transaction block, on the transaction's part on each group).
    fn alone(&self, unit: &[u8], frame_tag: u8, rest: &[u8], group: Option<u32>) -> bool {
        group.is_none()
            && match frame_tag {
                tag::QUERY => rest.is_empty(),
                _ => single_bind(unit),
            }
    }

    /// A transaction block is open: begun by the proxy for the client, on the attached
    /// server, or spanning groups.
    pub(super) fn in_transaction(&self) -> bool {
        self.pending_begin.is_some()
            || self.attached.as_ref().is_some_and(|a| a.status != b'I')
            || !self.parked.is_empty()
    }

    /// A write on every group: alone in its unit.
    fn write_route(
        &self,
        unit: &[u8],
        frame_tag: u8,
        rest: &[u8],
        group: Option<u32>,
        write: Write,
    ) -> Result<UnitRoute, ProxyError> {
        if !self.alone(unit, frame_tag, rest, group) {
            return Err(not_supported(WRITE_ALL_ALONE.into()));
        }
        self.ctx.metrics.inc_labels(
            "herd_shard_routed_total",
            &[("group", "all"), ("reason", "write_all")],
        );
        Ok(UnitRoute::WriteAll(write))
    }

    /// `DROP INDEX` of indexes of distributed or reference tables: the index name does not say
    /// its table, so it is looked up; such a drop runs on every group (in a two-phase commit,
    /// or group by group for `CONCURRENTLY`). `None`: not such a statement.
    async fn drop_index_plan(
        &mut self,
        map: &ShardMap,
        sql: &[u8],
    ) -> Result<Option<Plan>, ProxyError> {
        if !first_word_is(sql, &["drop"]) {
            return Ok(None);
        }
        let Some(facts) = herd_sql::key_facts(&String::from_utf8_lossy(sql)) else {
            return Ok(None);
        };
        if facts.drop_type.as_deref() != Some("OBJECT_INDEX") {
            return Ok(None);
        }
        let names: Vec<String> = facts.tables.iter().map(|t| t.name.clone()).collect();
        let tables = self.ctx.index_tables(&self.database, &names).await?;
        let shared = tables.iter().filter(|t| map.table(t).is_some()).count();
        Ok(match shared {
            0 => None,
            n if n < names.len() => Some(Plan::Refuse(
                "this DROP INDEX names indexes of distributed or reference tables (on every \
                 shard group) and others (on group 0 only, or unknown): drop them in separate \
                 statements"
                    .into(),
            )),
            _ if facts.concurrent => Some(Plan::EachGroup {
                tag: "DROP INDEX",
                undo: String::new(),
            }),
            _ => Some(Plan::Everywhere("DROP INDEX")),
        })
    }

    /// A server connection to every group's primary, as the client's role, group 0 first.
    pub(super) async fn primary_leases(&mut self) -> Result<Vec<Lease>, ProxyError> {
        let mut leases = Vec::new();
        for g in 0..self.ctx.groups() {
            let primary = self.ctx.current_primary_of(g).await?;
            leases.push(self.lease(&primary).await?);
        }
        Ok(leases)
    }

    /// The SQL a Bind of `statement` runs: parsed in this unit, or earlier.
    pub(super) fn bound_sql(
        &self,
        parsed: &HashMap<Vec<u8>, Vec<u8>>,
        statement: &[u8],
    ) -> Option<Vec<u8>> {
        if let Some(sql) = parsed.get(statement) {
            return Some(sql.clone());
        }
        if statement.is_empty() {
            return self.state.unnamed.as_ref().map(|u| u.stmt.query.clone());
        }
        self.state
            .statements
            .get(statement)
            .map(|s| s.query.clone())
    }

    /// Answers `SELECT herd.<function>(…)` (outside a transaction) with its one-row result.
    pub(super) async fn answer_herd_call(
        &mut self,
        unit: &[u8],
        function: &str,
        args: &[String],
    ) -> Result<(), ProxyError> {
        if self.pending_begin.is_some() {
            let e = ProxyError::Server {
                code: "25001".into(),
                message: format!("herd.{function} cannot run inside a transaction block"),
            };
            return self.reply_error(&e, unit).await;
        }
        match self.run_herd_call(function, args).await {
            Ok(text) => {
                let out = &mut self.out.buf;
                encode::row_description_text(out, &[function])?;
                encode::data_row(out, &[Some(text.as_bytes())])?;
                encode::command_complete(out, "SELECT 1")?;
                encode::ready_for_query(out, b'I')?;
                self.map = None;
                Ok(())
            }
            Err(e) => self.reply_error(&e, unit).await,
        }
    }
}

/// Whether the statement's first word is one of `words` (lower case), without allocating: this
/// runs for every unit of a sharded cluster, and most statements are not DDL.
pub(super) fn first_word_is(sql: &[u8], words: &[&str]) -> bool {
    let start = sql
        .iter()
        .position(|b| !b.is_ascii_whitespace())
        .unwrap_or(sql.len());
    let rest = &sql[start..];
    let end = rest
        .iter()
        .position(|b| !b.is_ascii_alphabetic())
        .unwrap_or(rest.len());
    words
        .iter()
        .any(|w| rest[..end].eq_ignore_ascii_case(w.as_bytes()))
}

/// The command tag of a role statement (CREATE/ALTER/DROP ROLE or USER, GRANT/REVOKE of a
/// role), `None` for anything else.
fn role_statement(sql: &[u8]) -> Option<&'static str> {
    if !first_word_is(sql, &["create", "alter", "drop", "grant", "revoke"]) {
        return None;
    }
    let revoke = first_word_is(sql, &["revoke"]);
    let facts = herd_sql::key_facts(&String::from_utf8_lossy(sql))?;
    Some(match facts.utility.as_deref()? {
        "CreateRoleStmt" => "CREATE ROLE",
        // ALTER ROLE … SET is AlterRoleSetStmt: per-database settings, not copied.
        "AlterRoleStmt" => "ALTER ROLE",
        "DropRoleStmt" => "DROP ROLE",
        "GrantRoleStmt" if revoke => "REVOKE ROLE",
        "GrantRoleStmt" => "GRANT ROLE",
        _ => return None,
    })
}

/// CREATE, ALTER or DROP DATABASE, `None` for anything else.
fn database_statement(sql: &[u8]) -> Option<herd_sql::DatabaseStmt> {
    if !first_word_is(sql, &["create", "drop", "alter"]) {
        return None;
    }
    herd_sql::key_facts(&String::from_utf8_lossy(sql))?
        .ddl?
        .database
}

/// CREATE, ALTER or DROP DATABASE through the extended protocol is refused: it must reach
/// every group, which the endpoint does for a simple query.
fn refuse_extended_database_statement(unit: &[u8]) -> Result<(), ProxyError> {
    let mut rest = unit;
    while let Some((frame, used)) = split_frame(rest, usize::MAX)? {
        rest = &rest[used..];
        if frame.tag == tag::PARSE && database_statement(Parse::decode(frame.body)?.query).is_some()
        {
            return Err(not_supported(
                "CREATE, ALTER and DROP DATABASE run on every shard group: send them as a simple \
                 query (not prepared), outside a transaction block"
                    .into(),
            ));
        }
    }
    Ok(())
}

/// The SQL of `unit`'s first message, a simple query.
pub(super) fn lone_query(unit: &[u8]) -> Result<Option<String>, ProxyError> {
    Ok(match split_frame(unit, usize::MAX)? {
        Some((frame, _)) => {
            Some(String::from_utf8_lossy(Query::decode(frame.body)?.sql).into_owned())
        }
        None => None,
    })
}

/// `unit` is one extended-protocol execution: at most a Parse, one Bind, a Describe of its
/// portal, its Execute, and Sync or Flush.
fn single_bind(unit: &[u8]) -> bool {
    let mut rest = unit;
    let mut binds = 0;
    while let Ok(Some((frame, used))) = split_frame(rest, usize::MAX) {
        rest = &rest[used..];
        match frame.tag {
            tag::BIND => binds += 1,
            tag::PARSE | tag::DESCRIBE | tag::EXECUTE | tag::SYNC | tag::FLUSH => {}
            _ => return false,
        }
    }
    binds == 1
}

#[cfg(test)]
mod tests {
    #[test]
    fn first_words() {
        assert!(super::first_word_is(b"  DROP index x", &["drop"]));
        assert!(super::first_word_is(
            b"Revoke r from u",
            &["grant", "revoke"]
        ));
        assert!(!super::first_word_is(b"dropped", &["drop"]));
        assert!(!super::first_word_is(b"select 1", &["drop"]));
        assert!(!super::first_word_is(b"", &["drop"]));
    }
}
