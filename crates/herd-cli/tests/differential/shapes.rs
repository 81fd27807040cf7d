//! Reads beyond single tables and joins (subqueries, CTEs, set operations, window functions)
//! and writes: data-modifying CTEs and writes in rolled-back transactions, persistent
//! INSERT/UPDATE/DELETE on the ledger verified by reading it back.

use crate::gen::{Case, Gen, Param, CUSTOMERS, ORDERS};

impl Gen {
    pub(crate) fn subquery(&mut self) -> Case {
        let mut params = Vec::new();
        let inner = self.where_(&[&ORDERS], &mut params);
        let and_inner = inner.replacen(" where ", " and ", 1);
        let (sql, class) = match self.rng.below(7) {
            0 => (
                format!("select c.id, c.name from customers c where c.id in (select o.customer_id from orders o{inner})"),
                "subquery in",
            ),
            1 => (
                format!("select c.id, c.tier from customers c where exists (select 1 from orders o where o.customer_id = c.id{and_inner})"),
                "subquery exists",
            ),
            2 => (
                format!("select c.id from customers c where not exists (select 1 from orders o where o.customer_id = c.id{and_inner})"),
                "subquery exists",
            ),
            3 => (
                "select c.id, (select count(*) from orders o where o.customer_id = c.id) from customers c".to_string(),
                "subquery scalar",
            ),
            4 => (
                format!("select x.customer_id, x.s from (select o.customer_id, sum(o.amount) as s from orders o{inner} group by o.customer_id) x where x.s > {}", self.rng.range(0, 600)),
                "subquery derived",
            ),
            5 => (
                format!("select c.id, c.region_id from customers c where c.region_id in (select r.id from regions r where r.zone = {})", self.rng.pick(&["'eu'", "'us'", "'apac'"])),
                "subquery reference",
            ),
            _ => (
                format!("select c.id from customers c where c.credit > (select avg(o.amount) from orders o{inner})"),
                "subquery uncorrelated",
            ),
        };
        Case {
            class,
            sql,
            params,
            ..Case::default()
        }
    }

    pub(crate) fn cte(&mut self) -> Case {
        let mut params = Vec::new();
        let wh = self.where_(&[&ORDERS], &mut params);
        let sql = match self.rng.below(3) {
            0 => format!(
                "with x as (select o.customer_id, count(*) as n, sum(o.amount) as s from orders o{wh} group by o.customer_id) \
                 select c.id, c.name, x.n, x.s from customers c join x on x.customer_id = c.id"
            ),
            1 => format!(
                "with x as (select o.id, o.customer_id, o.amount from orders o{wh}) select count(*), max(x.amount) from x"
            ),
            _ => format!(
                "with x as (select * from customers c where c.active) select x.tier, count(*) from x join orders o on o.customer_id = x.id{} group by x.tier",
                wh
            ),
        };
        Case {
            class: "cte",
            sql,
            params,
            ..Case::default()
        }
    }

    pub(crate) fn setop(&mut self) -> Case {
        let op = *self
            .rng
            .pick(&["union", "union all", "intersect", "except", "except all"]);
        let mut params = Vec::new();
        let a = self.where_(&[&CUSTOMERS], &mut params);
        let b = self.where_(&[&ORDERS], &mut params);
        let sql = match self.rng.below(3) {
            0 => format!(
                "select c.id from customers c{a} {op} select o.customer_id from orders o{b}"
            ),
            1 => format!("select c.tier from customers c{a} {op} select o.status from orders o{b}"),
            _ => format!("select c.region_id from customers c{a} {op} select r.id from regions r"),
        };
        Case {
            class: "setop",
            sql,
            params,
            ..Case::default()
        }
    }

    pub(crate) fn window(&mut self) -> Case {
        let f = *self.rng.pick(&[
            "row_number() over (partition by o.customer_id order by o.id)",
            "sum(o.amount) over (partition by o.customer_id)",
            "count(*) over (partition by o.customer_id)",
            "rank() over (order by o.amount, o.id)",
            "lag(o.id) over (partition by o.customer_id order by o.id)",
            "max(o.qty) over ()",
        ]);
        let mut params = Vec::new();
        let wh = self.where_(&[&ORDERS], &mut params);
        Case {
            class: "window",
            sql: format!("select o.id, o.customer_id, {f} from orders o{wh}"),
            params,
            ..Case::default()
        }
    }

    /// A data-modifying CTE (or a plain write) inside a transaction that is rolled back, with
    /// the tables read back inside it.
    pub(crate) fn modifying_cte(&mut self) -> Case {
        let mut params = Vec::new();
        let (t, verb) = if self.rng.chance(50) {
            (&ORDERS, "orders")
        } else {
            (&CUSTOMERS, "customers")
        };
        let wh = self.where_(&[t], &mut params);
        let write = match self.rng.below(3) {
            0 => format!("delete from {} {wh} returning *", t.from),
            1 => {
                let set = if verb == "orders" {
                    "qty = coalesce(o.qty, 0) + 1"
                } else {
                    "credit = coalesce(c.credit, 0) + 1"
                };
                format!("update {} set {set}{wh} returning *", t.from)
            }
            _ => {
                if verb == "orders" {
                    format!("insert into orders (id, customer_id, amount, qty, status, placed) select o.id + 1000, o.customer_id, o.amount, o.qty, 'copy', o.placed from orders o{wh} returning *")
                } else {
                    format!("insert into customers (id, name, region_id, tier, credit, since, active) select c.id + 1000, c.name, c.region_id, c.tier, c.credit, c.since, c.active from customers c{wh} returning *")
                }
            }
        };
        let plain_write = !self.rng.chance(70);
        let sql = if plain_write {
            write.replace(" returning *", "")
        } else {
            format!("with d as ({write}) select count(*) from d")
        };
        Case {
            class: if plain_write {
                "write in rolled-back tx"
            } else {
                "modifying cte"
            },
            before: vec!["begin".into()],
            sql,
            params,
            command: plain_write,
            check: vec![
                format!("select count(*), sum(id) from {verb}"),
                "select count(*) from orders where qty is not distinct from 1 or status = 'copy'"
                    .into(),
            ],
            cleanup: vec!["rollback".into()],
            ..Case::default()
        }
    }

    /// A persistent write on the ledger, verified by reading the whole table.
    pub(crate) fn dml(&mut self) -> Case {
        let mut params = Vec::new();
        let sql = match self.rng.below(6) {
            0 | 1 => {
                let n = self.rng.range(1, 3);
                let rows: Vec<String> = (0..n)
                    .map(|_| {
                        let (k, seq) = (self.rng.range(1, 12), self.rng.range(21, 400));
                        // A tag unique with the primary key (unique-without-key is `special`).
                        format!("({k}, {seq}, {}, 'u{k}-{seq}')", self.rng.range(-5, 50))
                    })
                    .collect();
                format!(
                    "insert into ledger (customer_id, seq, v, tag) values {}{}",
                    rows.join(", "),
                    if self.rng.chance(30) {
                        " on conflict do nothing"
                    } else {
                        ""
                    }
                )
            }
            2 => {
                params.push(Param::I8(self.rng.range(1, 12)));
                "update ledger set v = v + 1 where customer_id = $1".into()
            }
            3 => format!(
                "update ledger set v = v * 2 where v > {}",
                self.rng.range(0, 60)
            ),
            4 => format!(
                "delete from ledger where customer_id in ({}, {})",
                self.rng.range(1, 12),
                self.rng.range(1, 12)
            ),
            _ => format!(
                "delete from ledger where seq % 7 = {}",
                self.rng.range(0, 6)
            ),
        };
        Case {
            class: "dml",
            sql,
            params,
            command: true,
            check: vec!["select * from ledger".into()],
            ..Case::default()
        }
    }
}
