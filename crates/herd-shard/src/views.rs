//! Views over distributed tables (issue 40, docs/sharding-general.md "Views over distributed
//! tables"): a view is a catalog object of group 0, made there as written; a read of it is a
//! read across groups, answered on group 0 over its global view (`herd_global.v_<oid>`, its
//! definition with distributed tables pointed at their global relations). Pure: which views
//! need a global view (dependencies first), and what a statement naming such views may do.

use std::collections::HashSet;

use herd_sql::{KeyFacts, StmtKind};

use crate::{Names, ShardMap, TableKind};

/// How deep views over views are followed.
const MAX_DEPTH: usize = 16;

/// How a statement may use the views over distributed tables it names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ViewUse {
    /// A read the general path can take (one SELECT without INTO or a data-modifying WITH):
    /// the views are read over their global views.
    Read,
    /// `CREATE [OR REPLACE] VIEW` (not temporary): the catalog object, made on group 0 only.
    CreateView,
    /// Anything else (a write, `CREATE TABLE AS`, a materialized view, a temporary view): a
    /// view over distributed tables it reads is refused.
    Other,
}

/// How the statement of `facts` may use views over distributed tables; `temp`: it creates a
/// temporary object (a temporary view lives in one session's schema on one server, where
/// the global views cannot follow it).
pub fn view_use(facts: Option<&KeyFacts>, temp: bool) -> ViewUse {
    match facts {
        Some(f) if f.kind == StmtKind::Select && !f.select_into && !f.modifying_cte => {
            ViewUse::Read
        }
        Some(f) if f.utility.as_deref() == Some("ViewStmt") && !temp => ViewUse::CreateView,
        _ => ViewUse::Other,
    }
}

/// Utility statements whose tables are read by what they make (`CREATE VIEW`, `CREATE TABLE
/// AS` / `CREATE MATERIALIZED VIEW`, `REFRESH MATERIALIZED VIEW`): the views among their
/// tables are followed too, as a read's are.
pub fn reads_its_tables(facts: Option<&KeyFacts>) -> bool {
    facts
        .and_then(|f| f.utility.as_deref())
        .is_some_and(|u| matches!(u, "ViewStmt" | "CreateTableAsStmt" | "RefreshMatViewStmt"))
}

/// Why a write whose target is `target` (resolved) is refused, when it is a view over
/// distributed tables: PostgreSQL would write through it (an automatically updatable view,
/// or its INSTEAD OF triggers) on group 0 only.
pub fn write_through_view(names: &Names, map: &ShardMap, target: &str) -> Option<String> {
    let view = crate::qualified(target);
    let table = first_distributed(names, map, &view, 0, &mut HashSet::new())?;
    Some(format!(
        "a write through view {view} is not supported: it reads distributed table {table}, \
         whose rows are spread over the shard groups, while the write would run on group 0 \
         only (views over distributed tables are read-only through Herd); write to {table} \
         itself (by its shard key)"
    ))
}

/// The first distributed table the plain view `view` (`schema.name`) reads, directly or
/// through other plain views; `None`: it reads none (or is no such view).
pub fn view_reads_distributed(names: &Names, map: &ShardMap, view: &str) -> Option<String> {
    first_distributed(names, map, &crate::qualified(view), 0, &mut HashSet::new())
}

/// The plain (not materialized) views of `names` that read a distributed table, directly or
/// through other views, each after the views it reads (their global views are made in this
/// order); views of `herd_global` (Herd's own) left out.
pub fn views_over_distributed(names: &Names, map: &ShardMap) -> Vec<String> {
    let mut keys: Vec<&String> = names.views.keys().collect();
    keys.sort();
    let mut out = Vec::new();
    let mut done = HashSet::new();
    for v in keys {
        visit(names, map, v, 0, &mut done, &mut out);
    }
    out
}

fn eligible(names: &Names, view: &str) -> bool {
    names.views.contains_key(view)
        && !names.materialized.contains(view)
        && !view.starts_with("herd_global.")
}

fn visit(
    names: &Names,
    map: &ShardMap,
    view: &str,
    depth: usize,
    done: &mut HashSet<String>,
    out: &mut Vec<String>,
) {
    if depth > MAX_DEPTH || !eligible(names, view) || !done.insert(view.to_string()) {
        return;
    }
    for r in names.views.get(view).into_iter().flatten() {
        visit(names, map, r, depth + 1, done, out);
    }
    if first_distributed(names, map, view, 0, &mut HashSet::new()).is_some() {
        out.push(view.to_string());
    }
}

/// The first distributed table `view` reads, directly or through plain views.
fn first_distributed(
    names: &Names,
    map: &ShardMap,
    view: &str,
    depth: usize,
    seen: &mut HashSet<String>,
) -> Option<String> {
    if depth > MAX_DEPTH || !eligible(names, view) || !seen.insert(view.to_string()) {
        return None;
    }
    let reads = names.views.get(view)?;
    if let Some(t) = reads
        .iter()
        .find(|r| matches!(map.table(r), Some(TableKind::Distributed { .. })))
    {
        return Some(t.clone());
    }
    reads
        .iter()
        .find_map(|r| first_distributed(names, map, r, depth + 1, seen))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::KeyType;

    fn setup() -> (Names, ShardMap) {
        let mut n = Names::default();
        let view = |n: &mut Names, v: &str, reads: &[&str]| {
            n.views
                .insert(v.into(), reads.iter().map(|s| s.to_string()).collect());
        };
        view(&mut n, "public.v_top", &["public.v_mid", "public.local"]);
        view(&mut n, "public.v_mid", &["public.orders", "public.nation"]);
        view(&mut n, "public.v_ref", &["public.nation"]);
        view(&mut n, "public.mv", &["public.orders"]);
        view(&mut n, "public.v_mv", &["public.mv"]);
        view(&mut n, "herd_global.v_1", &["herd_global.t_2"]);
        view(&mut n, "public.a_loop", &["public.b_loop"]);
        view(&mut n, "public.b_loop", &["public.a_loop", "public.orders"]);
        n.materialized.insert("public.mv".into());
        let mut m = ShardMap::new(2, 32);
        m.tables.insert(
            "public.orders".into(),
            TableKind::Distributed {
                column: "id".into(),
                key_type: KeyType::Int8,
            },
        );
        m.tables
            .insert("public.nation".into(), TableKind::Reference);
        (n, m)
    }

    #[test]
    fn views_over_distributed_tables_come_after_the_views_they_read() {
        let (n, m) = setup();
        let got = views_over_distributed(&n, &m);
        let at = |v: &str| got.iter().position(|x| x == v);
        for v in [
            "public.v_top",
            "public.v_mid",
            "public.a_loop",
            "public.b_loop",
        ] {
            assert!(at(v).is_some(), "{v}: {got:?}");
        }
        assert!(at("public.v_mid") < at("public.v_top"), "{got:?}");
        for v in [
            "public.v_ref",
            "public.mv",
            "public.v_mv",
            "herd_global.v_1",
        ] {
            assert!(at(v).is_none(), "{v}: {got:?}");
        }
    }

    #[test]
    fn writes_through_such_views_are_refused_and_statements_say_how_they_use_views() {
        let (n, m) = setup();
        let why = write_through_view(&n, &m, "public.v_top").expect("refused");
        assert!(why.contains("view public.v_top"), "{why}");
        assert!(why.contains("distributed table public.orders"), "{why}");
        assert_eq!(write_through_view(&n, &m, "public.v_ref"), None);
        assert_eq!(write_through_view(&n, &m, "public.orders"), None);
        let facts = |sql: &str| herd_sql::key_facts(sql);
        let cases: &[(&str, bool, ViewUse)] = &[
            ("select * from v", false, ViewUse::Read),
            ("select * into t from v", false, ViewUse::Other),
            ("insert into v values (1)", false, ViewUse::Other),
            (
                "create view w as select * from v",
                false,
                ViewUse::CreateView,
            ),
            (
                "create or replace view w as select 1",
                false,
                ViewUse::CreateView,
            ),
            (
                "create temp view w as select * from v",
                true,
                ViewUse::Other,
            ),
            ("create table t as select * from v", false, ViewUse::Other),
        ];
        for (sql, temp, want) in cases {
            assert_eq!(view_use(facts(sql).as_ref(), *temp), *want, "{sql}");
        }
        assert!(reads_its_tables(
            facts("create materialized view m as select * from v").as_ref()
        ));
        assert!(reads_its_tables(
            facts("refresh materialized view m").as_ref()
        ));
        assert!(!reads_its_tables(facts("drop view v").as_ref()));
    }
}
