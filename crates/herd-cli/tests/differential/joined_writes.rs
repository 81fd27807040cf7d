//! Writes that read other tables: `UPDATE … FROM` and `DELETE … USING` joined to a co-located
//! table on the key, a reference table, a group-0 table, a table distributed on another key
//! and the table itself not on its key; and data-modifying CTEs that move rows between tables
//! (`WITH moved AS (DELETE … RETURNING …) INSERT INTO … SELECT … FROM moved`, an UPDATE's
//! RETURNING feeding a DELETE … USING). Each runs in a transaction that is rolled back, and
//! the written tables are read back inside it: Herd either answers as one server does or
//! refuses (0A000); rows written on some groups only would show in the checks. Where several
//! joined rows match a target row, the new value does not depend on which one PostgreSQL
//! takes (it is a constant or the row's own), so one server's answer is the answer.

use crate::gen::{Case, Gen, CUSTOMERS, ORDERS};

/// Reads of every table these writes touch, aggregated so that the order of rows does not
/// matter and a fan-out answers them inside a transaction.
fn checks() -> Vec<String> {
    vec![
        "select count(*), sum(id), sum(coalesce(qty, 0)), sum(length(status)) from orders".into(),
        "select count(*), sum(id), sum(coalesce(credit, 0)), sum(length(name)), \
         sum(length(tier)) from customers"
            .into(),
        "select count(*), sum(length(label)) from codes".into(),
    ]
}

impl Gen {
    /// `UPDATE … FROM` or `DELETE … USING` in a rolled-back transaction.
    pub(crate) fn joined_write(&mut self) -> Case {
        let mut params = Vec::new();
        let on_c = self
            .where_(&[&CUSTOMERS], &mut params)
            .replacen(" where ", " and ", 1);
        let on_o = self
            .where_(&[&ORDERS], &mut params)
            .replacen(" where ", " and ", 1);
        let returning = if self.rng.chance(40) {
            " returning 1"
        } else {
            ""
        };
        let (class, write) = match self.rng.below(9) {
            // Co-located on the key: every group, each with its own rows.
            0 => (
                "update from co-located",
                format!(
                    "update orders o set qty = coalesce(o.qty, 0) + 1 from customers c \
                     where c.id = o.customer_id{on_c}"
                ),
            ),
            1 => (
                "update from co-located",
                format!(
                    "update orders o set status = r.zone from customers c, regions r \
                     where c.id = o.customer_id and r.id = c.region_id{on_o}"
                ),
            ),
            2 => (
                "delete using co-located",
                format!("delete from orders o using customers c where c.id = o.customer_id{on_c}"),
            ),
            // A reference table: on every group.
            3 => (
                "delete using reference",
                format!(
                    "delete from customers c using regions r where r.id = c.region_id \
                     and r.zone = {}{on_c}",
                    self.rng.pick(&["'eu'", "'us'", "'apac'"])
                ),
            ),
            // A table of group 0 only, a table distributed on another key, the table itself
            // not on its key: the joined rows are on several groups.
            4 => (
                "update from local",
                format!(
                    "update customers c set tier = t.label from tags t \
                     where t.id = c.region_id{on_c}"
                ),
            ),
            5 => (
                "update from not co-located",
                format!(
                    "update customers c set name = c.name || '*' from codes k \
                     where k.customer_id = c.id{on_c}"
                ),
            ),
            6 => (
                "delete using not co-located",
                format!(
                    "delete from orders o using codes k where k.customer_id = o.customer_id \
                     and k.label like 'a%'{on_o}"
                ),
            ),
            7 => (
                "update from self not on key",
                format!(
                    "update orders o set qty = 0 from orders o2 \
                     where o2.id = o.id + 1{on_o}"
                ),
            ),
            _ => (
                "delete using self not on key",
                format!(
                    "delete from customers c using customers c2 \
                     where c2.region_id = c.region_id and c2.id < c.id{on_c}"
                ),
            ),
        };
        Case {
            class,
            before: vec!["begin".into()],
            command: returning.is_empty(),
            sql: format!("{write}{returning}"),
            params,
            check: checks(),
            cleanup: vec!["rollback".into()],
            ..Case::default()
        }
    }

    /// A data-modifying CTE that moves rows between tables, in a rolled-back transaction.
    pub(crate) fn moving_cte(&mut self) -> Case {
        let mut params = Vec::new();
        let on_o = self.where_(&[&ORDERS], &mut params);
        let key = self.rng.range(1, 12);
        let sql = match self.rng.below(5) {
            // Rows of every group (or of one, by key) deleted and inserted again elsewhere.
            0 => format!(
                "with moved as (delete from orders o{on_o} returning o.*) \
                 insert into orders (id, customer_id, amount, qty, status, placed) \
                 select id + 5000, customer_id, amount, qty, 'moved', placed from moved"
            ),
            1 => format!(
                "with moved as (delete from orders o where o.customer_id = {key} returning o.*) \
                 insert into orders (id, customer_id, amount, qty, status, placed) \
                 select id + 5000, customer_id, amount, qty, 'moved', placed from moved"
            ),
            2 => format!(
                "with moved as (delete from orders o{on_o} returning o.*) \
                 insert into tags (id, label, weight) \
                 select id + 5000, status, qty from moved"
            ),
            3 => format!(
                "with u as (update customers c set credit = coalesce(c.credit, 0) + 1 \
                 where c.region_id = {} returning c.id) \
                 delete from orders o using u where o.customer_id = u.id",
                self.rng.range(1, 5)
            ),
            _ => format!(
                "with moved as (delete from codes k where k.customer_id = {key} returning k.*) \
                 update customers c set name = 'moved' from moved \
                 where moved.customer_id = c.id"
            ),
        };
        let mut check = checks();
        check.push("select count(*), sum(id), sum(coalesce(weight, 0)) from tags".into());
        Case {
            class: "moving cte",
            before: vec!["begin".into()],
            command: true,
            sql,
            params,
            check,
            cleanup: vec!["rollback".into()],
            ..Case::default()
        }
    }
}
