//! Shapes of the wrong-answer classes issue #38 lists (search_path, SQL functions, column
//! collations, the key compared through another type, UNIQUE without the key, LIMIT/OFFSET
//! parameters of every integer type), with random parts.

use crate::gen::{Case, Gen, Param};

impl Gen {
    /// Constructs of the known wrong-answer classes, generated with random parts.
    pub(crate) fn special(&mut self) -> Case {
        let mut case = Case::default();
        match self.rng.below(8) {
            0 => {
                case.class = "search_path";
                case.before = vec!["set search_path = alt, public".into()];
                case.sql = "select count(*) from customers".into();
                case.cleanup = vec!["reset search_path".into()];
            }
            1 => {
                case.class = "sql function";
                let n = self.rng.range(1, 60);
                case.sql = match self.rng.below(3) {
                    0 => "select all_orders()".into(),
                    1 => {
                        format!("select c.id, cust_orders(c.id) from customers c where c.id <= {n}")
                    }
                    _ => format!("select count(*) from customers c where plus1(c.id) > {n}"),
                };
            }
            2 => {
                case.class = "collation";
                let v = self.rng.pick(&["'alpha'", "'BETA'", "'ÄBC'", "'Gamma'"]);
                case.sql = match self.rng.below(4) {
                    0 => format!("select id from people where nick = {v}"),
                    1 => format!(
                        "select code from codes where code collate ci = upper('k{}')",
                        self.rng.range(1, 40)
                    ),
                    // Which of the equal values (`beta`, `BETA`) names a group is left open
                    // by PostgreSQL under a nondeterministic collation: the groups are
                    // compared by what is determined (their sizes and least ids).
                    2 => "select count(*), min(id) from people group by nick".into(),
                    _ => "select count(distinct nick) from people".into(),
                };
            }
            3 => {
                case.class = "key through another type";
                let n = self.rng.range(1, 40);
                case.sql = match self.rng.below(3) {
                    0 => format!("select code, label from codes where code = 'k{n}  '::char(12)"),
                    1 => format!("select code from codes where code = 'k{n}'::varchar"),
                    _ => format!("select code from codes where code::char(8) = 'k{n}'"),
                };
            }
            4 => {
                case.class = "unique without key";
                // One server enforces it over every row; Herd must refuse it (each group
                // would enforce it over its own rows only).
                case.sql = match self.rng.below(2) {
                    0 => "create unique index ledger_tag_only on ledger (tag)".into(),
                    _ => "alter table ledger add constraint ledger_tag_only unique (tag)".into(),
                };
                case.command = true;
                case.cleanup = vec![
                    "alter table ledger drop constraint if exists ledger_tag_only".into(),
                    "drop index if exists ledger_tag_only".into(),
                ];
            }
            5 => {
                case.class = "limit param";
                let l = self.rng.range(0, 8);
                case.params = vec![match self.rng.below(3) {
                    0 => Param::I2(l as i16),
                    1 => Param::I4(l as i32),
                    _ => Param::I8(l),
                }];
                case.sql = if self.rng.chance(50) {
                    "select id from orders order by id limit $1".into()
                } else {
                    "select id from customers order by id offset $1".into()
                };
                case.ordered = true;
            }
            6 => {
                case.class = "key in params";
                let k = self.rng.range(1, 4) as usize;
                case.params = (0..k).map(|_| Param::I8(self.rng.range(1, 70))).collect();
                let list: Vec<String> = (1..=k).map(|i| format!("${i}")).collect();
                case.sql = format!(
                    "select o.id, o.amount from orders o where o.customer_id in ({})",
                    list.join(", ")
                );
            }
            _ => {
                case.class = "text key param";
                case.params = vec![Param::Text(format!("k{}", self.rng.range(1, 45)))];
                case.sql = "select code, customer_id from codes where code = $1".into();
            }
        }
        case
    }
}
