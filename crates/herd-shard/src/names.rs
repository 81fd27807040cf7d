//! What a name in a statement means, the way PostgreSQL decides it: an unqualified table is
//! the first of the session's `search_path` schemas that has it (`"$user"` being the session's
//! role; `pg_catalog` first unless listed), a view reads the tables of its definition, a
//! function reads the tables its body reads. The planner sees a statement's top-level names
//! only; without this, `customers` would always be `public.customers`, `SELECT f()` would
//! read no table, and a view no distributed table, and each would run on one group on a
//! guess. Pure: the catalog facts come from the caller (`Names`), read from group 0.

use std::collections::{HashMap, HashSet};

use crate::{ShardMap, TableKind};

/// What a function's body reads, as far as Herd can read it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Body {
    /// The relations (as written) and the functions it names.
    Reads {
        /// Relations read or written, as written in the body.
        relations: Vec<String>,
        /// Functions it calls, as written.
        calls: Vec<String>,
        /// The function's own `search_path` (`SET search_path` in its definition), by which
        /// its unqualified names resolve instead of the caller's.
        path: Option<String>,
    },
    /// Herd cannot tell what it reads; the reason (its language, dynamic SQL …).
    Opaque(String),
}

/// The catalog facts of one database that name resolution needs.
#[derive(Debug, Clone, Default)]
pub struct Names {
    /// Unqualified relation name → the schemas that have a relation of that name.
    pub relations: HashMap<String, Vec<String>>,
    /// View or materialized view (`schema.name`) → the relations (`schema.name`) it reads.
    pub views: HashMap<String, Vec<String>>,
    /// View or materialized view (`schema.name`) → the functions (`schema.name`) it calls.
    pub view_calls: HashMap<String, Vec<String>>,
    /// The materialized views among [`Names::views`] (`schema.name`): their rows were computed
    /// when refreshed, on the one group that ran the refresh.
    pub materialized: HashSet<String>,
    /// Function (`name` and `schema.name`, all overloads together) → what its bodies read.
    /// Functions of `pg_catalog`, `information_schema` and `herd`, and functions in C or
    /// internal code, are not listed: they read no table of the user's.
    pub functions: HashMap<String, Vec<Body>>,
    /// Table (`schema.name`) → what runs when it is written besides the statement: its
    /// triggers' functions (`schema.name`; Herd's own left out) and its rules (`rule NAME`).
    pub write_hooks: HashMap<String, Vec<String>>,
    /// Every schema of the database.
    pub schemas: HashSet<String>,
    /// Table (`schema.name`, ordinary or partitioned, of the user's schemas) → its columns in
    /// order (dropped ones left out): which table an unqualified column belongs to, and what
    /// an INSERT without a column list fills.
    pub columns: HashMap<String, Vec<String>>,
    /// `search_path` defaults set by `ALTER ROLE … SET` / `ALTER DATABASE … SET`: by role
    /// name (`""`: for every role), most specific first.
    pub default_paths: HashMap<String, String>,
}

/// The session's `search_path`, as far as the proxy knows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SearchPath {
    /// Never set in the session: the role's or database's default, else the server's.
    Default,
    /// Set to these schemas (`$user` for `"$user"`).
    Set(Vec<String>),
    /// Changed in a way the proxy does not follow (`set_config()`).
    Unknown,
}

/// What a statement reads beyond the relations it names ([`Names::hidden_reads`]).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Hidden {
    /// Relations read through its views and functions (`schema.name`).
    pub relations: Vec<String>,
    /// Views it names (`schema.name`) that read a distributed table (directly or through
    /// other views), with the first such table: answered over their global views.
    pub views: Vec<(String, String)>,
}

/// One walk through the views a relation of a statement reads.
struct ViewWalk<'a> {
    /// The relation the statement names (for messages).
    top: &'a str,
    schemas: &'a [String],
    /// Where views over distributed tables are listed; `None`: such a view is refused.
    views: Option<&'a mut Vec<(String, String)>>,
    /// `top` is a function (whose body runs on one group).
    function: bool,
    seen: &'a mut HashSet<String>,
    seen_fns: &'a mut HashSet<String>,
}

/// The schemas of a `search_path` value, in order (quotes removed; `"$user"` as `$user`).
pub fn path_schemas(value: &str) -> Vec<String> {
    herd_sql::split_path(value)
}

/// How deep function bodies and views are followed (a function calling itself ends there).
const MAX_DEPTH: usize = 16;

impl Names {
    /// The schemas an unqualified name is looked up in, in order, for `user` under `path`.
    pub fn schemas_for(&self, path: &SearchPath, user: &str) -> Option<Vec<String>> {
        let value = match path {
            SearchPath::Unknown => return None,
            SearchPath::Set(v) => v.clone(),
            SearchPath::Default => path_schemas(
                self.default_paths
                    .get(user)
                    .or_else(|| self.default_paths.get(""))
                    .map_or("\"$user\", public", String::as_str),
            ),
        };
        let mut schemas: Vec<String> = value
            .into_iter()
            .map(|s| if s == "$user" { user.to_string() } else { s })
            .filter(|s| self.schemas.contains(s))
            .collect();
        if !schemas.iter().any(|s| s == "pg_catalog") {
            schemas.insert(0, "pg_catalog".into());
        }
        Some(schemas)
    }

    /// `name` as written → `schema.name` as PostgreSQL resolves it under `schemas` (from
    /// [`Names::schemas_for`]); a name no schema of the path has is kept as written.
    pub fn resolve(&self, name: &str, schemas: &[String]) -> String {
        if name.contains('.') {
            return name.to_string();
        }
        let Some(holders) = self.relations.get(name) else {
            return name.to_string();
        };
        schemas
            .iter()
            .find(|s| holders.contains(s))
            .map_or_else(|| name.to_string(), |s| format!("{s}.{name}"))
    }

    /// Rewrites the unqualified table names of a statement (`relations` read anywhere and its
    /// key facts' tables) to the `schema.name` PostgreSQL resolves them to under `schemas`;
    /// the names of its `WITH` queries are left alone.
    pub fn resolve_statement(
        &self,
        facts: Option<&mut herd_sql::KeyFacts>,
        relations: &mut [String],
        schemas: &[String],
    ) {
        let ctes: Vec<String> = facts.as_ref().map_or(Vec::new(), |f| f.ctes.clone());
        let resolve = |name: &mut String| {
            if !ctes.contains(name) {
                *name = self.resolve(name, schemas);
            }
        };
        relations.iter_mut().for_each(resolve);
        if let Some(f) = facts {
            resolve_facts(f, &resolve);
        }
    }

    /// Why a write to `table` (distributed or reference: every group runs it on its own
    /// rows or copy) cannot run as one server would, if it cannot: a rule on it, or a
    /// trigger whose function names a distributed or reference table (it would read one
    /// group's rows, or write one group's copy) or cannot be read.
    pub fn write_hooks_refusal(
        &self,
        map: &ShardMap,
        table: &str,
        schemas: &[String],
    ) -> Option<String> {
        let hooks = self.write_hooks.get(&crate::qualified(table))?;
        for hook in hooks {
            if let Some(rule) = hook.strip_prefix("rule ") {
                return Some(format!(
                    "table {table} has rule {rule}, which rewrites writes on each shard group \
                     apart: drop the rule (or write what it does as statements of their own)"
                ));
            }
            for body in self.functions.get(hook).into_iter().flatten() {
                let Body::Reads { relations, .. } = body else {
                    return Some(format!(
                        "table {table} has a trigger calling {hook}, which Herd cannot read, \
                         and each shard group would run it on its own rows"
                    ));
                };
                if let Some(t) = relations
                    .iter()
                    .map(|r| self.resolve(r, schemas))
                    .find(|r| map.table(r).is_some())
                {
                    return Some(format!(
                        "table {table} has a trigger calling {hook}, which reads or writes \
                         {t}, a distributed or reference table: each shard group would run it \
                         on its own rows or copy"
                    ));
                }
            }
        }
        None
    }

    /// The relations a statement reads beyond those it names, through the views it reads
    /// and the functions it calls (`relations` already resolved, `functions` as written);
    /// `Err` with the reason when one of them reads a distributed table (its rows are on
    /// every group, while the view's or function's query would run on one), or when a
    /// function's body cannot be read while distributed tables exist.
    ///
    /// `views_ok`: the statement is a read the general path can take (or a `CREATE VIEW`,
    /// which lives on group 0 as the catalog object): a (plain, not materialized) view that
    /// reads distributed tables is then no refusal — its distributed tables are among the
    /// relations returned, and it is listed in [`Hidden::views`], so a read of it is planned
    /// across groups and answered over its global view (`herd_global.v_<oid>`).
    pub fn hidden_reads(
        &self,
        map: &ShardMap,
        relations: &[String],
        functions: &[String],
        schemas: &[String],
        views_ok: bool,
    ) -> Result<Hidden, String> {
        let mut hidden = Hidden::default();
        let mut seen: HashSet<String> = HashSet::new();
        let mut seen_fns: HashSet<String> = HashSet::new();
        for r in relations {
            let mut walk = ViewWalk {
                top: r,
                schemas,
                views: views_ok.then_some(&mut hidden.views),
                function: false,
                seen: &mut seen,
                seen_fns: &mut seen_fns,
            };
            self.view_reads(map, &mut walk, r, 0, &mut hidden.relations)?;
        }
        for f in functions {
            self.function_reads(map, f, f, schemas, 0, &mut seen_fns, &mut hidden.relations)?;
        }
        Ok(hidden)
    }

    fn view_reads(
        &self,
        map: &ShardMap,
        walk: &mut ViewWalk<'_>,
        view: &str,
        depth: usize,
        out: &mut Vec<String>,
    ) -> Result<(), String> {
        let qualified = crate::qualified(view);
        let Some(reads) = self.views.get(&qualified) else {
            return Ok(());
        };
        if depth > MAX_DEPTH || !walk.seen.insert(qualified.clone()) {
            return Ok(());
        }
        let top = walk.top;
        for f in self.view_calls.get(&qualified).into_iter().flatten() {
            self.function_reads(map, top, f, walk.schemas, depth + 1, walk.seen_fns, out)?;
        }
        for r in reads {
            if let Some(TableKind::Distributed { .. }) = map.table(r) {
                if self.materialized.contains(&qualified) {
                    return Err(format!(
                        "materialized view {qualified} reads distributed table {r}: its rows \
                         were computed on the one shard group that refreshed it, from that \
                         group's rows only; use a plain view (answered across groups), or \
                         query {r} itself"
                    ));
                }
                if walk.function {
                    return Err(format!(
                        "function {top} reads view {qualified}, which reads distributed table \
                         {r}, whose rows are spread over the shard groups, while a function \
                         runs on one group: read the view in the statement itself"
                    ));
                }
                let Some(views) = walk.views.as_deref_mut() else {
                    return Err(format!(
                        "view {top} reads distributed table {r}, whose rows are spread over the \
                         shard groups, while this statement would run the view on one group \
                         (only a read — SELECT, a cursor or COPY (SELECT …) TO STDOUT — is \
                         answered across groups through a view): query {r} itself, or read \
                         the view in a SELECT"
                    ));
                };
                let named = crate::qualified(top);
                if !views.iter().any(|(v, _)| *v == named) {
                    views.push((named, r.clone()));
                }
            }
            out.push(r.clone());
            self.view_reads(map, walk, r, depth + 1, out)?;
        }
        Ok(())
    }

    #[allow(clippy::too_many_arguments)]
    fn function_reads(
        &self,
        map: &ShardMap,
        top: &str,
        function: &str,
        schemas: &[String],
        depth: usize,
        seen: &mut HashSet<String>,
        out: &mut Vec<String>,
    ) -> Result<(), String> {
        let Some(bodies) = self.functions.get(function) else {
            return Ok(());
        };
        if depth > MAX_DEPTH || !seen.insert(function.to_string()) {
            return Ok(());
        }
        let distributed = !map.tables.is_empty();
        for body in bodies {
            match body {
                Body::Opaque(why) if distributed => {
                    return Err(format!(
                        "function {top} {why}, so Herd cannot tell whether it reads distributed \
                         tables (each shard group would run it on its own rows): call it \
                         directly on a shard group, or rewrite it in SQL or PL/pgSQL without \
                         dynamic SQL"
                    ))
                }
                Body::Opaque(_) => {}
                Body::Reads {
                    relations,
                    calls,
                    path,
                } => {
                    let own = path.as_ref().map(|p| {
                        let mut s: Vec<String> = path_schemas(p)
                            .into_iter()
                            .filter(|s| self.schemas.contains(s))
                            .collect();
                        if !s.iter().any(|x| x == "pg_catalog") {
                            s.insert(0, "pg_catalog".into());
                        }
                        s
                    });
                    let schemas = own.as_deref().unwrap_or(schemas);
                    for r in relations {
                        let r = self.resolve(r, schemas);
                        if let Some(TableKind::Distributed { .. }) = map.table(&r) {
                            return Err(format!(
                                "function {top} reads distributed table {r}, whose rows are \
                                 spread over the shard groups, while a function runs on one \
                                 group: read {r} in the statement itself"
                            ));
                        }
                        let mut views_seen = HashSet::new();
                        // A function runs on one group: a view over distributed tables
                        // read in its body stays refused.
                        let mut walk = ViewWalk {
                            top,
                            schemas,
                            views: None,
                            function: true,
                            seen: &mut views_seen,
                            seen_fns: seen,
                        };
                        self.view_reads(map, &mut walk, &r, depth + 1, out)?;
                        out.push(r);
                    }
                    for c in calls {
                        self.function_reads(map, top, c, schemas, depth + 1, seen, out)?;
                    }
                }
            }
        }
        Ok(())
    }
}

fn resolve_facts(f: &mut herd_sql::KeyFacts, resolve: &dyn Fn(&mut String)) {
    for t in f.tables.iter_mut().chain(f.inner_tables.iter_mut()) {
        resolve(&mut t.name);
    }
    for side in f.outer_joins.iter_mut() {
        for t in side.preserved.iter_mut().chain(side.other.iter_mut()) {
            resolve(&mut t.name);
        }
    }
    if let Some(source) = f.source.as_deref_mut() {
        resolve_facts(source, resolve);
    }
    for part in f.with_parts.iter_mut() {
        resolve_facts(part, resolve);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::KeyType;

    fn names() -> Names {
        let mut n = Names::default();
        for s in ["public", "s2", "alice", "pg_catalog"] {
            n.schemas.insert(s.into());
        }
        n.relations
            .insert("customers".into(), vec!["public".into(), "s2".into()]);
        n.relations.insert("orders".into(), vec!["alice".into()]);
        n.relations.insert("v_all".into(), vec!["public".into()]);
        n.relations.insert("v_ref".into(), vec!["public".into()]);
        n.relations
            .insert("pg_class".into(), vec!["pg_catalog".into()]);
        n.views
            .insert("public.v_all".into(), vec!["public.v_inner".into()]);
        n.views
            .insert("public.v_inner".into(), vec!["public.customers".into()]);
        n.views
            .insert("public.v_ref".into(), vec!["public.regions".into()]);
        n.functions.insert(
            "f_count".into(),
            vec![Body::Reads {
                relations: vec!["customers".into()],
                calls: vec![],
                path: None,
            }],
        );
        n.functions.insert(
            "f_outer".into(),
            vec![Body::Reads {
                relations: vec![],
                calls: vec!["f_count".into()],
                path: None,
            }],
        );
        n.functions.insert(
            "f_ref".into(),
            vec![Body::Reads {
                relations: vec!["regions".into()],
                calls: vec!["f_ref".into()],
                path: None,
            }],
        );
        n.functions.insert(
            "f_s2".into(),
            vec![Body::Reads {
                relations: vec!["customers".into()],
                calls: vec![],
                path: Some("s2".into()),
            }],
        );
        n.functions.insert(
            "f_py".into(),
            vec![Body::Opaque("is written in plpython3u".into())],
        );
        n
    }

    fn map() -> ShardMap {
        let mut m = ShardMap::new(2, 32);
        m.tables.insert(
            "public.customers".into(),
            TableKind::Distributed {
                column: "id".into(),
                key_type: KeyType::Int8,
            },
        );
        m.tables
            .insert("public.regions".into(), TableKind::Reference);
        m
    }

    #[test]
    fn search_path_values() {
        assert_eq!(path_schemas("s2, public"), vec!["s2", "public"]);
        assert_eq!(path_schemas("\"$user\", public"), vec!["$user", "public"]);
        assert_eq!(path_schemas("\"My Schema\",S2"), vec!["My Schema", "s2"]);
        assert!(path_schemas("").is_empty());
    }

    #[test]
    fn names_resolve_through_the_path() {
        let n = names();
        let path = |p: SearchPath, user: &str| n.schemas_for(&p, user).expect("known");
        let default = path(SearchPath::Default, "postgres");
        assert_eq!(default, vec!["pg_catalog", "public"]);
        assert_eq!(n.resolve("customers", &default), "public.customers");
        let s2 = path(
            SearchPath::Set(vec!["s2".into(), "public".into()]),
            "postgres",
        );
        assert_eq!(n.resolve("customers", &s2), "s2.customers");
        assert_eq!(n.resolve("public.customers", &s2), "public.customers");
        assert_eq!(n.resolve("pg_class", &s2), "pg_catalog.pg_class");
        // "$user" is the session's role, when such a schema exists.
        let alice = path(SearchPath::Default, "alice");
        assert_eq!(alice, vec!["pg_catalog", "alice", "public"]);
        assert_eq!(n.resolve("orders", &alice), "alice.orders");
        assert_eq!(n.resolve("orders", &default), "orders", "not on the path");
        assert_eq!(n.resolve("nothing", &default), "nothing");
        // A role's default path.
        let mut with_default = n.clone();
        with_default
            .default_paths
            .insert("bob".into(), "s2, public".into());
        assert_eq!(
            with_default.schemas_for(&SearchPath::Default, "bob"),
            Some(vec!["pg_catalog".into(), "s2".into(), "public".into()])
        );
        assert_eq!(n.schemas_for(&SearchPath::Unknown, "bob"), None);
    }

    #[test]
    fn triggers_and_rules_that_touch_shared_tables_are_refused() {
        let (mut n, m) = (names(), map());
        let schemas = vec!["pg_catalog".to_string(), "public".to_string()];
        n.functions.insert(
            "public.audit".into(),
            vec![Body::Reads {
                relations: vec!["regions".into()],
                calls: vec![],
                path: None,
            }],
        );
        n.functions.insert(
            "public.stamp".into(),
            vec![Body::Reads {
                relations: vec![],
                calls: vec!["now".into()],
                path: None,
            }],
        );
        n.write_hooks
            .insert("public.customers".into(), vec!["public.stamp".into()]);
        assert_eq!(n.write_hooks_refusal(&m, "customers", &schemas), None);
        n.write_hooks
            .get_mut("public.customers")
            .expect("hooks")
            .push("public.audit".into());
        let why = n
            .write_hooks_refusal(&m, "customers", &schemas)
            .expect("refused");
        assert!(
            why.contains("regions, a distributed or reference table"),
            "{why}"
        );
        n.write_hooks
            .insert("public.regions".into(), vec!["rule r_log".into()]);
        assert!(n
            .write_hooks_refusal(&m, "public.regions", &schemas)
            .expect("rule")
            .contains("has rule r_log"));
    }

    #[test]
    fn statements_resolve_but_not_their_ctes() {
        let n = names();
        let s2 = vec![
            "pg_catalog".to_string(),
            "s2".to_string(),
            "public".to_string(),
        ];
        let mut facts =
            herd_sql::key_facts("with customers as (select 1) select * from customers, pg_class")
                .expect("facts");
        let mut rels = vec!["customers".to_string(), "pg_class".to_string()];
        n.resolve_statement(Some(&mut facts), &mut rels, &s2);
        assert_eq!(rels, vec!["customers", "pg_catalog.pg_class"]);
        let mut facts = herd_sql::key_facts("select * from customers c").expect("facts");
        let mut rels = vec!["customers".to_string()];
        n.resolve_statement(Some(&mut facts), &mut rels, &s2);
        assert_eq!(rels, vec!["s2.customers"]);
        assert_eq!(facts.tables[0].name, "s2.customers");
    }

    #[test]
    fn views_and_functions_that_read_distributed_tables_are_refused() {
        let (n, m) = (names(), map());
        let schemas = vec!["pg_catalog".to_string(), "public".to_string()];
        let refused = |rels: &[&str], fns: &[&str], needle: &str| {
            let rels: Vec<String> = rels.iter().map(|s| s.to_string()).collect();
            let fns: Vec<String> = fns.iter().map(|s| s.to_string()).collect();
            let e = n
                .hidden_reads(&m, &rels, &fns, &schemas, false)
                .expect_err("refused");
            assert!(e.contains(needle), "{e}");
        };
        refused(
            &["public.v_all"],
            &[],
            "view public.v_all reads distributed table public.customers",
        );
        refused(
            &[],
            &["f_count"],
            "function f_count reads distributed table public.customers",
        );
        refused(
            &[],
            &["f_outer"],
            "function f_outer reads distributed table",
        );
        refused(&[], &["f_py"], "plpython3u");
        // Reference tables are on every group: fine, and reported as read.
        let extra = n
            .hidden_reads(
                &m,
                &["public.v_ref".into()],
                &["f_ref".into()],
                &schemas,
                false,
            )
            .expect("answerable")
            .relations;
        assert!(extra.contains(&"public.regions".to_string()), "{extra:?}");
        // Under another path, the function's unqualified table is another one.
        let s2 = vec!["pg_catalog".to_string(), "s2".to_string()];
        let extra = n
            .hidden_reads(&m, &[], &["f_count".into()], &s2, false)
            .expect("s2.customers is not distributed")
            .relations;
        assert_eq!(extra, vec!["s2.customers".to_string()]);
        // A function with a search_path of its own resolves by it.
        assert!(n
            .hidden_reads(&m, &[], &["f_s2".into()], &schemas, false)
            .is_ok());
        // Without distributed tables an opaque function runs where its statement goes.
        assert!(n
            .hidden_reads(
                &ShardMap::new(2, 32),
                &[],
                &["f_py".into()],
                &schemas,
                false
            )
            .is_ok());
    }

    #[test]
    fn a_read_may_go_through_views_over_distributed_tables() {
        let (mut n, m) = (names(), map());
        let schemas = vec!["pg_catalog".to_string(), "public".to_string()];
        // A read: the view (through another view) is listed, its table read.
        let h = n
            .hidden_reads(&m, &["public.v_all".into()], &[], &schemas, true)
            .expect("a read goes through");
        assert_eq!(
            h.views,
            vec![("public.v_all".to_string(), "public.customers".to_string())]
        );
        assert!(h.relations.contains(&"public.customers".to_string()));
        assert!(h.relations.contains(&"public.v_inner".to_string()));
        // A function reading the view still runs on one group: refused.
        n.functions.insert(
            "f_view".into(),
            vec![Body::Reads {
                relations: vec!["v_all".into()],
                calls: vec![],
                path: None,
            }],
        );
        let e = n
            .hidden_reads(&m, &[], &["f_view".into()], &schemas, true)
            .expect_err("function");
        assert!(
            e.contains("function f_view reads view public.v_inner, which reads distributed"),
            "{e}"
        );
        // A materialized view's rows are one group's: refused even for a read.
        n.materialized.insert("public.v_inner".into());
        let e = n
            .hidden_reads(&m, &["public.v_all".into()], &[], &schemas, true)
            .expect_err("materialized");
        assert!(e.contains("materialized view public.v_inner"), "{e}");
    }
}
