//! Planning a statement's text for the shard groups: the names it uses resolved for the
//! session, its parameters (from a Bind message's bytes), and the SQL of a refusal raised
//! inside a transaction.

use herd_shard::{ParamValue, Plan, ShardMap, ViewUse};

use super::shard::NOT_SUPPORTED;
use crate::ProxyContext;

/// What names mean for the session whose statement is planned: the database's catalog
/// names, the session's `search_path` and role.
pub(super) struct Resolver<'a> {
    pub(super) names: &'a herd_shard::Names,
    pub(super) path: herd_shard::SearchPath,
    pub(super) user: &'a str,
}

/// The plan of one statement's text with its parameters; `names` (when known) resolves its
/// table names through the session's `search_path` and finds what its views and functions
/// read.
pub(super) fn plan_sql(
    ctx: &ProxyContext,
    map: &ShardMap,
    names: Option<&Resolver<'_>>,
    sql: &[u8],
    params: &[ParamValue],
) -> Plan {
    let text = String::from_utf8_lossy(sql);
    let classification = ctx.classifier.get_or_classify(&text);
    if classification.statements.len() > 1 {
        // Planned statement by statement (the key facts are one statement's).
        return match herd_sql::statements(&text) {
            Some(parts) if parts.len() > 1 => herd_shard::plan_several(
                parts
                    .iter()
                    .map(|part| plan_sql(ctx, map, names, part.as_bytes(), params)),
            ),
            _ => Plan::Refuse(
                "this query string could not be split into its statements to find their shard \
                 groups: send its statements separately"
                    .into(),
            ),
        };
    }
    let mut relations: Vec<String> = classification
        .statements
        .iter()
        .flat_map(|s| s.relations.iter().cloned())
        .collect();
    let mut facts = herd_sql::key_facts(&text);
    // A temporary object: it lives in one session's schema on one server.
    let temp = classification
        .statements
        .iter()
        .any(|s| s.session == herd_sql::SessionEffect::Pin(herd_sql::PinReason::TempTable));
    // Views over distributed tables the statement reads (view, its distributed table).
    let mut over_views: Vec<(String, String)> = Vec::new();
    let mut refusal = None;
    if let Some(shared) = herd_shard::shared_object_plan(facts.as_ref(), map) {
        return shared;
    }
    if let Some(r) = names {
        let functions: Vec<String> = classification
            .statements
            .iter()
            .flat_map(|s| s.functions.iter().cloned())
            .collect();
        let uses = herd_shard::view_use(facts.as_ref(), temp);
        match resolve_names(r, map, facts.as_mut(), &mut relations, &functions, uses) {
            // A DECLARE or COPY (query) TO is planned again by its query below.
            Err(why) => refusal = Some(why),
            Ok(views) => over_views = views,
        }
    }
    let param = |n: u32| {
        params
            .get((n as usize).wrapping_sub(1))
            .cloned()
            .unwrap_or(ParamValue::Missing)
    };
    let planned = match refusal {
        Some(why) => Plan::Refuse(why),
        None => herd_shard::plan(facts.as_ref(), &relations, map, &param),
    };
    let plan = match planned {
        // A read through a view over distributed tables: say so, rather than the planner's
        // reason (the view is a relation of group 0 to it).
        Plan::General { .. } if !over_views.is_empty() => {
            let (view, table) = &over_views[0];
            Plan::General {
                why: format!(
                    "view {view} reads distributed table {table}, whose rows are spread over \
                     the shard groups"
                ),
            }
        }
        // A temporary view over distributed tables: no global view can follow it.
        Plan::Group { reason: "view", .. } if temp => Plan::Refuse(TEMP_VIEW.into()),
        plan => plan,
    };
    // A refused DECLARE CURSOR or COPY (query) TO: planned by the query it wraps
    // (only refusals are looked at again, so nothing is added to what runs on one group).
    let wraps = |f: &herd_sql::KeyFacts| {
        matches!(f.utility.as_deref(), Some("DeclareCursorStmt" | "CopyStmt"))
    };
    if matches!(plan, Plan::Refuse(_)) && facts.as_ref().is_some_and(wraps) {
        if let Some(w) = herd_sql::wrapped(&text) {
            let inner = plan_sql(ctx, map, names, w.query.as_bytes(), params);
            return herd_shard::wrapped_plan(&w.wrapper, inner, plan);
        }
    }
    plan
}

/// Resolves the statement's names in place and adds what its views and functions read to
/// `relations`; `Err` with the reason to refuse it.
fn resolve_names(
    r: &Resolver<'_>,
    map: &ShardMap,
    mut facts: Option<&mut herd_sql::KeyFacts>,
    relations: &mut Vec<String>,
    functions: &[String],
    uses: ViewUse,
) -> Result<Vec<(String, String)>, String> {
    let Some(schemas) = r.names.schemas_for(&r.path, r.user) else {
        // The path is not known: an unqualified name of a sharded table, or a function whose
        // body names tables, could mean anything.
        let ctes = facts.as_ref().map_or(&[][..], |f| f.ctes.as_slice());
        let sharded = |n: &String| {
            !n.contains('.')
                && !ctes.contains(n)
                && map
                    .tables
                    .keys()
                    .any(|k| k.rsplit('.').next() == Some(n.as_str()))
        };
        if let Some(name) = relations.iter().find(|n| sharded(n)) {
            return Err(format!(
                "the session's search_path was changed with set_config(), which Herd does not \
                 follow, so it cannot tell which table {name} names: write it with its schema \
                 (or set search_path with SET)"
            ));
        }
        // A view over distributed tables, under any schema the name may mean: its read would
        // be answered over its global view, which needs the name resolved.
        let over_view = |n: &String| {
            let over = |v: &str| herd_shard::view_reads_distributed(r.names, map, v).is_some();
            match r.names.relations.get(n) {
                _ if n.contains('.') => over(n),
                Some(schemas) if !ctes.contains(n) => {
                    schemas.iter().any(|s| over(&format!("{s}.{n}")))
                }
                _ => false,
            }
        };
        if let Some(name) = relations.iter().find(|n| over_view(n)) {
            return Err(format!(
                "the session's search_path was changed with set_config(), which Herd does not \
                 follow, and {name} is (or may be) a view over distributed tables, read across \
                 shard groups only with the session's names known: set search_path with SET"
            ));
        }
        if let Some(f) = functions
            .iter()
            .find(|f| r.names.functions.contains_key(*f))
        {
            return Err(format!(
                "the session's search_path was changed with set_config(), which Herd does not \
                 follow, so it cannot tell which tables function {f} reads: set search_path \
                 with SET"
            ));
        }
        return Ok(Vec::new());
    };
    r.names
        .resolve_statement(facts.as_deref_mut(), relations, &schemas);
    // Unqualified columns of joins, and an INSERT's columns when it lists none, by the tables'
    // columns (pure scans of the facts: nothing is read for a statement that needs neither).
    if let Some(f) = facts.as_deref_mut() {
        herd_shard::qualify_columns(f, &r.names.columns);
        herd_shard::fill_insert_columns(f, map, &r.names.columns);
        // The parts of a data-modifying WITH are planned as statements of their own.
        for part in f.with_parts.iter_mut() {
            herd_shard::qualify_columns(part, &r.names.columns);
            herd_shard::fill_insert_columns(part, map, &r.names.columns);
        }
    }
    // A write runs its table's triggers and rules on each group that runs it.
    let written = |f: &herd_sql::KeyFacts| {
        use herd_sql::StmtKind::{Delete, Insert, Update};
        matches!(f.kind, Insert | Update | Delete) || f.copy.as_ref().is_some_and(|c| c.from)
    };
    let targets = facts
        .as_deref()
        .into_iter()
        .flat_map(|f| std::iter::once(f).chain(&f.with_parts))
        .filter(|f| written(f))
        .filter_map(|f| f.tables.first());
    for t in targets {
        if map.table(&t.name).is_some() {
            if let Some(why) = r.names.write_hooks_refusal(map, &t.name, &schemas) {
                return Err(why);
            }
        } else if let Some(why) = herd_shard::write_through_view(r.names, map, &t.name) {
            return Err(why);
        }
    }
    // What a CREATE VIEW / CREATE TABLE AS / REFRESH makes reads the views it names too.
    let mut read = relations.clone();
    let makes = herd_shard::reads_its_tables(facts.as_deref());
    if makes {
        for t in facts.as_deref().into_iter().flat_map(|f| &f.tables) {
            if !read.contains(&t.name) {
                read.push(t.name.clone());
            }
        }
    }
    let views_ok = uses != ViewUse::Other;
    let hidden = r
        .names
        .hidden_reads(map, &read, functions, &schemas, views_ok)?;
    // Those statements are only checked: they are planned by the tables they name (a CREATE
    // VIEW is the catalog object, of group 0; a REFRESH of a materialized view over reference
    // tables runs on group 0, which holds their rows).
    if !makes {
        for e in hidden.relations {
            if !relations.contains(&e) {
                relations.push(e);
            }
        }
    }
    Ok(hidden.views)
}

/// Why a temporary view over distributed tables is refused.
const TEMP_VIEW: &str = "a temporary view over distributed tables is not supported: it lives \
     in one session's schema on shard group 0, where Herd cannot make its global view (reads \
     of it would see group 0's rows only); create a permanent view (CREATE VIEW, read across \
     groups), or query the tables themselves";

/// The parameters of a Bind (after its names): format codes, then values.
pub(super) fn bind_params(rest: &[u8]) -> Vec<ParamValue> {
    let mut r = rest;
    let mut take = |n: usize| -> Option<&[u8]> {
        let (head, tail) = (r.get(..n)?, r.get(n..)?);
        r = tail;
        Some(head)
    };
    let mut out = Vec::new();
    let Some(n_formats) = take(2).map(|b| u16::from_be_bytes([b[0], b[1]]) as usize) else {
        return out;
    };
    let mut formats = Vec::with_capacity(n_formats);
    for _ in 0..n_formats {
        match take(2) {
            Some(b) => formats.push(u16::from_be_bytes([b[0], b[1]])),
            None => return out,
        }
    }
    let Some(n_params) = take(2).map(|b| u16::from_be_bytes([b[0], b[1]]) as usize) else {
        return out;
    };
    for i in 0..n_params {
        let Some(len) = take(4).map(|b| i32::from_be_bytes([b[0], b[1], b[2], b[3]])) else {
            return out;
        };
        // One format code applies to all; none means text.
        let format = match formats.len() {
            0 => 0,
            1 => formats[0],
            _ => formats.get(i).copied().unwrap_or(0),
        };
        if len < 0 {
            out.push(ParamValue::Null);
            continue;
        }
        let Some(value) = take(len as usize) else {
            return out;
        };
        out.push(if format == 1 {
            ParamValue::Binary(value.to_vec())
        } else {
            ParamValue::Text(value.to_vec())
        });
    }
    out
}

/// The parameters of a Bind as the planner reads them: a value the client declared of a type
/// other than a key's own ([`herd_shard::param_type_alike`]) is only its type, since its
/// bytes compare with a key through a conversion (`types`: the statement's declared types).
pub(super) fn typed_params(rest: &[u8], types: &[u32]) -> Vec<ParamValue> {
    let mut params = bind_params(rest);
    for (p, t) in params.iter_mut().zip(types) {
        if !herd_shard::param_type_alike(*t) && !matches!(p, ParamValue::Null) {
            *p = ParamValue::OtherType(*t);
        }
    }
    params
}

/// SQL that fails with `message` and SQLSTATE 0A000 on the server itself, so the server's
/// transaction aborts exactly as if the statement had failed there.
pub(super) fn raising_sql(message: &str) -> String {
    let quoted = message.replace('\'', "''").replace("$herd$", "");
    format!(
        "DO $herd$ BEGIN RAISE EXCEPTION USING ERRCODE = '{NOT_SUPPORTED}', MESSAGE = '{quoted}'; END $herd$"
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bind_parameters() {
        let mut b = Vec::new();
        b.extend_from_slice(&2u16.to_be_bytes());
        b.extend_from_slice(&0u16.to_be_bytes());
        b.extend_from_slice(&1u16.to_be_bytes());
        b.extend_from_slice(&3u16.to_be_bytes());
        b.extend_from_slice(&2i32.to_be_bytes());
        b.extend_from_slice(b"42");
        b.extend_from_slice(&8i32.to_be_bytes());
        b.extend_from_slice(&7i64.to_be_bytes());
        b.extend_from_slice(&(-1i32).to_be_bytes());
        assert_eq!(
            bind_params(&b),
            vec![
                ParamValue::Text(b"42".to_vec()),
                ParamValue::Binary(7i64.to_be_bytes().to_vec()),
                ParamValue::Null
            ]
        );
        assert!(bind_params(&[0, 0, 0, 1, 0]).is_empty(), "truncated");
        assert!(raising_sql("it's").contains("'it''s'"));
    }
}
