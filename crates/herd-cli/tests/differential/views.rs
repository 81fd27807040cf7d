//! Reads of views over distributed tables (issue 40's views slice): the views of
//! `schema.rs` (an aggregate over a co-located join, a join of a distributed, a reference and
//! a local table, a view over a view) read like tables — filtered, ordered, aggregated, joined
//! with a distributed table. Herd answers them on the general path over their global views.

use crate::gen::{Case, Col, Gen, Kind, Table};

const fn c(name: &'static str, kind: Kind) -> Col {
    Col { name, kind }
}

/// `cust_totals`: customers with their orders' count and sum.
const TOTALS: Table = Table {
    from: "cust_totals v",
    cols: &[
        c("v.id", Kind::Int),
        c("v.name", Kind::Text),
        c("v.region_id", Kind::Int),
        c("v.n", Kind::Int),
        c("v.total", Kind::Num),
    ],
    unique: "v.id",
};

/// `order_regions`: orders with their customer's region (reference) and a tag (local).
const ORDER_REGIONS: Table = Table {
    from: "order_regions w",
    cols: &[
        c("w.id", Kind::Int),
        c("w.customer_id", Kind::Int),
        c("w.amount", Kind::Num),
        c("w.status", Kind::Text),
        c("w.region", Kind::Text),
        c("w.label", Kind::Text),
    ],
    unique: "w.customer_id, w.id",
};

/// `big_spenders`: a view over `cust_totals`.
const BIG: Table = Table {
    from: "big_spenders b",
    cols: &[
        c("b.id", Kind::Int),
        c("b.name", Kind::Text),
        c("b.total", Kind::Num),
    ],
    unique: "b.id",
};

const VIEWS: &[&Table] = &[&TOTALS, &ORDER_REGIONS, &BIG];

impl Gen {
    /// A read of a view over distributed tables.
    pub(crate) fn view_read(&mut self) -> Case {
        let t = *self.rng.pick(VIEWS);
        let mut params = Vec::new();
        let (sql, ordered) = match self.rng.below(3) {
            0 => {
                // Grouped by a column, every output ordered.
                let g = self.rng.pick(t.cols).name;
                let a = self.agg(&[t]);
                let wh = self.where_(&[t], &mut params);
                (
                    format!(
                        "select {g}, {a} from {}{wh} group by {g} order by 1 nulls first",
                        t.from
                    ),
                    true,
                )
            }
            1 if t.unique == "v.id" => {
                // Joined with a distributed table on the key.
                let wh = self.where_(&[t], &mut params);
                (
                    format!(
                        "select v.id, v.total, c.tier from {} join customers c on c.id = v.id{wh} \
                         order by v.id",
                        t.from
                    ),
                    true,
                )
            }
            _ => {
                let items: Vec<String> = if self.rng.chance(20) {
                    vec!["*".into()]
                } else {
                    (0..self.rng.range(1, 3)).map(|_| self.expr(t)).collect()
                };
                let wh = self.where_(&[t], &mut params);
                let mut sql = format!("select {} from {}{wh}", items.join(", "), t.from);
                let ordered = self.rng.chance(60);
                if ordered {
                    sql.push_str(&self.order_limit(&[], &[t.unique], &mut params));
                }
                (sql, ordered)
            }
        };
        Case {
            class: "view",
            sql,
            params,
            ordered,
            ..Case::default()
        }
    }
}
