//! Data-modifying WITH: answered on the one group every part of the statement runs on by its
//! key; refused (never run on a guess) when a part is on another group, on every group, or
//! writes rows whose keys the statement does not name.

use super::*;

#[test]
fn all_parts_on_one_group_run_there() {
    let (a, b) = split_keys();
    let ga = group_of(a);
    let gb = group_of(b);
    for (sql, want) in [
        (
            format!("with d as (delete from orders where customer_id = {a} returning *) select count(*) from d"),
            ga,
        ),
        (
            format!("with u as (update orders set v = 'x' where customer_id = {b} returning v) select * from u"),
            gb,
        ),
        (
            format!(
                "with i as (insert into orders (customer_id, v) values ({a}, 'x') returning *) \
                 update items set v = 'y' where customer_id = {a}"
            ),
            ga,
        ),
        // A reference table read in a part: every group has its rows.
        (
            format!(
                "with d as (delete from orders o using countries c where c.id = o.n and o.customer_id = {b} returning o.v) \
                 select * from d"
            ),
            gb,
        ),
        // The key as a parameter.
        (
            "with d as (delete from orders where customer_id = $1 returning *) select * from d".into(),
            ga,
        ),
    ] {
        let params: &[Option<&str>] = if sql.contains("$1") { &[Some("1")] } else { &[] };
        assert_eq!(run(&sql, params), group(want), "{sql}");
    }
}

#[test]
fn parts_across_groups_are_refused() {
    let (a, b) = split_keys();
    for (sql, needle) in [
        // Without a key, or keys of two groups.
        (
            "with d as (delete from orders where v = 'x' returning *) select count(*) from d".to_string(),
            "every group",
        ),
        (
            format!("with d as (delete from orders where customer_id = {a} returning *) select * from d, orders o where o.customer_id = {b}"),
            "different groups",
        ),
        (
            format!(
                "with i as (insert into orders (customer_id, v) values ({a}, 'x') returning *) \
                 update items set v = 'y' where customer_id = {b}"
            ),
            "different groups",
        ),
        // Rows whose keys come from another part: not known when planning.
        (
            format!("with d as (delete from orders where customer_id = {a} returning *) insert into items select * from d"),
            "one shard group",
        ),
        // A reference table written: every group's copy.
        (
            format!("with d as (update countries set name = 'x' returning *) select * from orders where customer_id = {a}"),
            "reference table",
        ),
        // A plain table (group 0) with rows of group 1.
        (
            format!(
                "with d as (delete from orders where customer_id = {} returning *) insert into plain_table select 1 from d",
                if group_of(a) == 1 { a } else { b }
            ),
            "one shard group",
        ),
    ] {
        let got = run(&sql, &[]);
        assert!(
            matches!(&got, Plan::Refuse(why) if why.contains("data-modifying WITH") && why.contains(needle)),
            "{sql}: {got:?}"
        );
    }
}

/// A table read through a view or a function (added to the statement's relations by the
/// proxy, in no part's own tables) is not accounted for by any part: refused.
#[test]
fn tables_read_through_views_are_refused() {
    let (a, _) = split_keys();
    let sql = format!(
        "with d as (delete from orders where customer_id = {a} returning *) select * from d, v_items"
    );
    let m = map();
    let facts = key_facts(&sql);
    // What the proxy's name resolution adds for the view.
    let relations = vec!["v_items".to_string(), "public.items".to_string()];
    let got = plan(facts.as_ref(), &relations, &m, &|_| ParamValue::Missing);
    assert!(
        matches!(&got, Plan::Refuse(why) if why.contains("view or function")),
        "{got:?}"
    );
}
