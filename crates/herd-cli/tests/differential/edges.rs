//! Shapes aimed at the edges of routing and merging (the second half of the grammar): the shard
//! key written as literals of other types, inside OR/NOT, in INSERTs and UPDATEs that move a
//! row; savepoints, SQL-level PREPARE/EXECUTE and cursors; DISTINCT and statistical
//! aggregates, empty inputs, WITH TIES and DISTINCT ON; self, comma, USING and VALUES joins.

use crate::gen::{Case, Gen, Param};

/// `v` (an int8 key) written in one of several forms PostgreSQL reads as the same number.
fn int_key(g: &mut Gen, v: i64) -> String {
    let forms = [
        format!("{v}"),
        format!("'{v}'"),
        format!("{v}::int2"),
        format!("{v}::int4"),
        format!("{v}.0"),
        format!("{v}::numeric"),
        format!("({} + 1)", v - 1),
        format!("int8 '{v}'"),
        format!("'{v}'::text::int8"),
        format!("abs(-{v})"),
    ];
    g.rng.pick(&forms).clone()
}

/// `k{v}` (a text key) in one of several forms, some meaning another value (as PostgreSQL
/// reads them).
fn text_key(g: &mut Gen, v: i64) -> String {
    let forms = [
        format!("'k{v}'"),
        format!("'k{v}'::varchar"),
        format!("'k{v}'::varchar(2)"),
        format!("'k{v}'::char(3)"),
        format!("'k{v}'::name"),
        format!("'k' || '{v}'"),
        format!("concat('k', {v})"),
        format!("lower('K{v}')"),
        format!("'k{v} '"),
        format!("'k{v}'::bpchar"),
    ];
    g.rng.pick(&forms).clone()
}

impl Gen {
    /// One edge case.
    pub fn edge(&mut self) -> Case {
        match self.rng.below(14) {
            0 | 1 => self.key_forms(),
            2 => self.insert_key_forms(),
            3 => self.move_key(),
            4 => self.returning(),
            5 => self.savepoint(),
            6 => self.sql_prepare(),
            7 => self.cursor(),
            8 | 9 => self.aggregates_more(),
            10 => self.ties_distinct_on(),
            11 => self.joins_more(),
            12 if self.rng.chance(50) => self.refusal_in_transaction(),
            12 if self.rng.chance(50) => self.batch(),
            12 => self.empty_inputs(),
            _ => self.text_and_nulls(),
        }
    }

    /// A statement Herd refuses (0A000) and PostgreSQL fails on (division by zero), first in a
    /// transaction block: PostgreSQL's transaction is aborted (25P02 on the next statement,
    /// COMMIT rolls back), so the write after it must not happen.
    fn refusal_in_transaction(&mut self) -> Case {
        let k = self.rng.range(1, 12);
        let failing = *self.rng.pick(&[
            "select string_agg(c.name, ',') from customers c where 1 / 0 = 1",
            "select c.id from customers c where c.id in (select 1 / 0)",
            "select c.id, row_number() over (order by c.id) from customers c where 1 / 0 = 1",
            "select c.id from customers c union select 1 / 0",
        ]);
        let first_write = self.rng.chance(30);
        let mut before = vec!["begin".to_string()];
        if first_write {
            before.push(format!(
                "update ledger set v = v + 100 where customer_id = {k}"
            ));
        }
        before.push(failing.to_string());
        Case {
            class: "refusal in transaction",
            before,
            sql: format!("update ledger set v = v + 1 where customer_id = {k}"),
            command: true,
            check: vec!["commit".into(), "select * from ledger".into()],
            cleanup: vec!["rollback".into()],
            ..Case::default()
        }
    }

    /// Several statements in one simple query string (one implicit transaction in PostgreSQL:
    /// a failure rolls back the statements before it).
    fn batch(&mut self) -> Case {
        let a = self.rng.range(1, 12);
        let b = self.rng.range(1, 12);
        let seq = self.rng.range(5000, 9000);
        let sql = match self.rng.below(6) {
            0 => format!(
                "update ledger set v = v + 1 where customer_id = {a}; select * from ledger where customer_id = {a}"
            ),
            1 => format!(
                "update ledger set v = v + 1 where customer_id = {a}; update ledger set v = v + 1 where customer_id = {b}"
            ),
            2 => format!(
                "insert into ledger (customer_id, seq, v, tag) values ({a}, {seq}, 0, null); select 1 / 0"
            ),
            3 => format!(
                "insert into ledger (customer_id, seq, v, tag) values ({a}, {seq}, 0, null); \
                 insert into ledger (customer_id, seq, v, tag) values ({a}, {seq}, 0, null)"
            ),
            4 => format!("select count(*) from orders; select c.id from customers c where c.id = {a}"),
            _ => format!(
                "select c.id from customers c where c.id = {a}; select c.id from customers c where c.id = {b}"
            ),
        };
        Case {
            class: "batch",
            sql,
            command: true,
            simple_only: true,
            check: vec!["select * from ledger".into()],
            ..Case::default()
        }
    }

    fn key_forms(&mut self) -> Case {
        let a = self.rng.range(1, 70);
        let b = self.rng.range(1, 70);
        let (class, sql) = match self.rng.below(12) {
            0..=2 => ("key literal forms", {
                let k = int_key(self, a);
                if self.rng.chance(50) {
                    format!("select c.id, c.name from customers c where c.id = {k}")
                } else {
                    format!("select o.id, o.amount from orders o where {k} = o.customer_id")
                }
            }),
            3 => ("key literal forms", {
                let (x, y) = (int_key(self, a), int_key(self, b));
                format!("select o.id from orders o where o.customer_id in ({x}, {y})")
            }),
            4 => (
                "key literal forms",
                format!("select c.id from customers c where c.id = any(array[{a}, {b}])"),
            ),
            5 | 6 => ("text key forms", {
                let k = text_key(self, a.min(40));
                format!("select k.code, k.label from codes k where k.code = {k}")
            }),
            7 => (
                "key in or/not",
                format!("select c.id from customers c where c.id = {a} or c.id = {b}"),
            ),
            8 => (
                "key in or/not",
                format!("select c.id from customers c where not (c.id = {a})"),
            ),
            9 => (
                "key in or/not",
                format!("select c.id, c.tier from customers c where c.id = {a} or c.tier = 'gold'"),
            ),
            10 => (
                "key in or/not",
                format!(
                "select o.id from orders o where (o.customer_id = {a}) is not true and o.qty = 3"
            ),
            ),
            _ => (
                "key in or/not",
                format!("select c.id from customers c where c.id = {a} and c.id = {b}"),
            ),
        };
        Case {
            class,
            sql,
            ..Case::default()
        }
    }

    fn insert_key_forms(&mut self) -> Case {
        let k = self.rng.range(1, 12);
        let seq = self.rng.range(1000, 5000);
        let mut params = Vec::new();
        let key = if self.rng.chance(40) {
            params.push(match self.rng.below(3) {
                0 => Param::I2(k as i16),
                1 => Param::I4(k as i32),
                _ => Param::I8(k),
            });
            "$1".to_string()
        } else {
            int_key(self, k)
        };
        Case {
            class: "insert key forms",
            sql: format!(
                "insert into ledger (customer_id, seq, v, tag) values ({key}, {seq}, 1, null)"
            ),
            params,
            command: true,
            check: vec![
                format!("select * from ledger where customer_id = {k}"),
                "select * from ledger".into(),
            ],
            ..Case::default()
        }
    }

    fn move_key(&mut self) -> Case {
        let k = self.rng.range(1, 12);
        let to = self.rng.range(13, 40);
        let sql = if self.rng.chance(50) {
            format!("update ledger set customer_id = {to} where customer_id = {k}")
        } else {
            format!(
                "update ledger set customer_id = customer_id + {} where seq % 5 = 0",
                to
            )
        };
        Case {
            class: "update moves key",
            sql,
            command: true,
            check: vec![
                format!("select * from ledger where customer_id = {to}"),
                "select * from ledger".into(),
            ],
            ..Case::default()
        }
    }

    fn returning(&mut self) -> Case {
        let n = self.rng.range(0, 60);
        let sql = match self.rng.below(3) {
            0 => format!("update ledger set v = v + 1 where v > {n} returning customer_id, seq, v"),
            1 => format!("delete from ledger where v between {n} and {} returning *", n + 15),
            _ => format!(
                "insert into ledger (customer_id, seq, v, tag) values ({}, {}, {n}, null), ({}, {}, {n}, null) \
                 on conflict (customer_id, seq) do update set v = ledger.v + excluded.v returning *",
                self.rng.range(1, 12),
                self.rng.range(1, 30),
                self.rng.range(1, 12),
                self.rng.range(1, 30)
            ),
        };
        Case {
            class: "write returning",
            sql,
            check: vec!["select * from ledger".into()],
            ..Case::default()
        }
    }

    fn savepoint(&mut self) -> Case {
        let a = self.rng.range(1, 70);
        let write = match self.rng.below(4) {
            0 => format!("update customers set credit = 0 where tier = 'gold' or id = {a}"),
            1 => format!("delete from orders where customer_id in ({a}, {})", self.rng.range(1, 70)),
            2 => "update orders set qty = 99 where status = 'paid'".to_string(),
            _ => format!(
                "insert into orders (id, customer_id, amount, qty, status, placed) values ({}, {a}, 1, 1, 'sp', date '2024-01-01')",
                self.rng.range(2000, 3000)
            ),
        };
        let release = self.rng.chance(30);
        let mut check = vec![if release {
            "release savepoint s1".to_string()
        } else {
            "rollback to savepoint s1".to_string()
        }];
        check.push(
            "select count(*), sum(qty), count(*) filter (where status = 'sp') from orders".into(),
        );
        check.push("select count(*), sum(credit) from customers".into());
        Case {
            class: if release {
                "savepoint release"
            } else {
                "savepoint rollback"
            },
            before: vec!["begin".into(), "savepoint s1".into()],
            sql: write,
            command: true,
            check,
            cleanup: vec!["rollback".into()],
            ..Case::default()
        }
    }

    fn sql_prepare(&mut self) -> Case {
        let a = self.rng.range(1, 70);
        let b = self.rng.range(1, 70);
        // Writes run in a block that is rolled back (the PREPARE in it outlives it, as in
        // PostgreSQL, and the cleanup deallocates it).
        let write = |prep: &str, exec: String, check: &str| Case {
            class: "sql prepare/execute write",
            before: vec!["begin".into(), prep.into()],
            sql: exec,
            command: true,
            check: vec![check.into()],
            cleanup: vec!["rollback".into(), "deallocate p1".into()],
            ..Case::default()
        };
        let (prep, exec, ordered, again) = match self.rng.below(8) {
            0 => (
                "prepare p1(bigint) as select id, name from customers where id = $1",
                format!("execute p1({a})"),
                false,
                format!("execute p1({b})"),
            ),
            1 => (
                "prepare p1(int) as select count(*), sum(amount) from orders where qty = $1",
                format!("execute p1({})", self.rng.range(0, 5)),
                false,
                format!("execute p1({})", self.rng.range(0, 5)),
            ),
            2 => (
                "prepare p1(int2) as select id from orders order by id limit $1",
                format!("execute p1({})", self.rng.range(0, 9)),
                true,
                "execute p1(3)".into(),
            ),
            3 => (
                "prepare p1(bigint) as select o.id from orders o join customers c on c.id = o.customer_id where c.id = $1",
                format!("execute p1({a})"),
                false,
                format!("execute p1({b})"),
            ),
            // A join not on the key (the general path), its parameter's type inferred.
            4 => (
                "prepare p1 as select c.tier, count(*) from orders o join customers c on c.id = o.qty where o.qty > $1 group by 1",
                format!("execute p1({})", self.rng.range(0, 5)),
                false,
                "execute p1('2')".into(),
            ),
            // A write on every group, alone (it changes no value: later cases see the same rows).
            5 => {
                return Case {
                    class: "sql prepare/execute write",
                    before: vec![
                        "prepare p1(int) as update orders set amount = amount where qty = $1"
                            .into(),
                    ],
                    sql: format!("execute p1({})", self.rng.range(0, 5)),
                    command: true,
                    check: vec!["select count(*), sum(amount) from orders".into()],
                    cleanup: vec!["deallocate p1".into()],
                    ..Case::default()
                }
            }
            6 => {
                return write(
                    "prepare p1(bigint, int) as update orders set qty = $2 where customer_id = $1",
                    format!("execute p1({a}, {})", self.rng.range(0, 9)),
                    "select count(*), sum(qty) from orders",
                )
            }
            _ => {
                return write(
                    "prepare p1(bigint, bigint, int) as insert into orders (id, customer_id, amount, qty, status, placed) values ($1, $2, 1, $3, 'pp', date '2024-01-01')",
                    format!(
                        "execute p1({}, {a}, {})",
                        self.rng.range(2000, 3000),
                        self.rng.range(0, 9)
                    ),
                    "select count(*), sum(qty), count(*) filter (where status = 'pp') from orders",
                )
            }
        };
        Case {
            class: "sql prepare/execute",
            before: vec![prep.into()],
            sql: exec,
            ordered,
            check: vec![again],
            cleanup: vec!["deallocate p1".into()],
            ..Case::default()
        }
    }

    fn cursor(&mut self) -> Case {
        let (decl, ordered) = if self.rng.chance(60) {
            (
                "declare cur cursor for select id, customer_id from orders order by id",
                true,
            )
        } else {
            (
                "declare cur cursor for select id, name from customers where tier = 'gold'",
                false,
            )
        };
        // Without an order only the whole result is determined.
        let n = if ordered {
            self.rng.range(1, 8).to_string()
        } else {
            "all".to_string()
        };
        Case {
            class: "cursor",
            before: vec!["begin".into(), decl.into()],
            sql: format!("fetch {n} from cur"),
            ordered,
            check: if ordered {
                vec![format!("fetch {} from cur", self.rng.range(1, 5))]
            } else {
                vec![]
            },
            cleanup: vec!["rollback".into()],
            ..Case::default()
        }
    }

    fn aggregates_more(&mut self) -> Case {
        let aggs = [
            "sum(distinct o.qty)",
            "avg(distinct o.qty)",
            "count(distinct o.customer_id)",
            "stddev(o.qty)",
            "variance(o.amount)",
            "stddev_pop(o.amount)",
            "bool_and(o.qty > 0)",
            "bool_or(o.status = 'void')",
            "every(o.amount is not null)",
            "array_agg(o.id order by o.id)",
            "max(o.status)",
            "min(o.placed)",
            "sum(o.amount) / count(*)",
            "avg(o.qty)::numeric(10,3)",
            "percentile_disc(0.5) within group (order by o.qty)",
            "mode() within group (order by o.qty)",
            "string_agg(o.status, ',' order by o.id)",
            "bit_or(o.qty)",
            "sum(o.qty::int2)",
            "count(*) filter (where o.status is null)",
            "sum(o.customer_id)",
            "avg(o.customer_id)",
        ];
        let k = self.rng.range(1, 2);
        let picked: Vec<&str> = (0..k).map(|_| *self.rng.pick(&aggs)).collect();
        let (group, order) = match self.rng.below(4) {
            0 => ("", ""),
            1 => (" group by o.status", " order by 1 nulls first"),
            2 => (" group by o.customer_id", " order by 1"),
            _ => (" group by o.qty % 2", " order by 1"),
        };
        let lead = group.trim_start_matches(" group by ");
        let items = if lead.is_empty() {
            picked.join(", ")
        } else {
            format!("{lead}, {}", picked.join(", "))
        };
        let having = if !group.is_empty() && self.rng.chance(25) {
            format!(" having {} is not null", picked[0])
        } else {
            String::new()
        };
        Case {
            class: "aggregates more",
            sql: format!("select {items} from orders o{group}{having}{order}"),
            ordered: true,
            ..Case::default()
        }
    }

    fn ties_distinct_on(&mut self) -> Case {
        let n = self.rng.range(1, 12);
        let (sql, ordered) = match self.rng.below(4) {
            0 => (
                format!("select o.id, o.qty from orders o order by o.qty nulls last fetch first {n} rows with ties"),
                false,
            ),
            1 => (
                "select distinct on (o.customer_id) o.customer_id, o.id, o.amount from orders o order by o.customer_id, o.id desc".to_string(),
                true,
            ),
            2 => (
                format!("select distinct on (c.tier) c.tier, c.id from customers c order by c.tier nulls first, c.id limit {n}"),
                true,
            ),
            _ => (
                format!("select o.customer_id, count(*) from orders o group by o.customer_id order by count(*) desc, o.customer_id limit {n}"),
                true,
            ),
        };
        Case {
            class: "ties / distinct on",
            sql,
            ordered,
            ..Case::default()
        }
    }

    fn joins_more(&mut self) -> Case {
        let a = self.rng.range(1, 70);
        let sql = match self.rng.below(8) {
            0 => "select a.id, b.name from customers a join customers b on a.id = b.id where a.tier = 'gold'".to_string(),
            1 => "select a.id, b.id from customers a join customers b on b.id = a.id + 1".to_string(),
            2 => "select c.id, o.id from customers c join orders o on o.id = c.id".to_string(),
            3 => "select c.id, o.id from customers c, orders o where o.customer_id = c.id and o.qty = 2".to_string(),
            4 => "select o.id, l.seq from orders o join ledger l using (customer_id) where o.qty = 1".to_string(),
            5 => format!("select c.id, o.id from customers c join orders o on o.customer_id = c.id and c.id = {a}"),
            6 => "select v.x, c.name from (values (1), (5), (40), (66)) v(x) join customers c on c.id = v.x".to_string(),
            _ => "select c.id, g from customers c, generate_series(1, 2) g where c.region_id = 2".to_string(),
        };
        Case {
            class: "joins more",
            sql,
            ..Case::default()
        }
    }

    fn empty_inputs(&mut self) -> Case {
        let sql = *self.rng.pick(&[
            "select count(*), sum(o.amount), max(o.id), avg(o.qty) from orders o where o.id < 0",
            "select o.status, count(*) from orders o where o.id < 0 group by o.status",
            "select count(*) from orders o where false",
            "select count(distinct o.customer_id), bool_and(true) from orders o where o.qty > 100",
            "select max(c.name), min(c.since) from customers c where c.id > 1000",
            "select o.id from orders o where o.id < 0 order by o.id limit 3",
            "select count(*) from customers c where c.region_id not in (1, null)",
        ]);
        Case {
            class: "empty inputs",
            sql: sql.into(),
            ordered: true,
            ..Case::default()
        }
    }

    fn text_and_nulls(&mut self) -> Case {
        let (sql, ordered) = *self.rng.pick(&[
            ("select c.id, c.name from customers c where c.name > 'a' order by c.name collate \"C\", c.id", true),
            ("select c.id, c.name from customers c order by lower(c.name) nulls first, c.id", true),
            ("select c.id from customers c where c.name ilike 'ä%' or c.name ilike 'é%'", false),
            ("select c.id from customers c where upper(c.name) = 'ÉMILE1'", false),
            ("select c.id, c.name from customers c where c.name ~ '^[a-z]' order by c.name desc, c.id", true),
            ("select c.region_id, count(*) from customers c group by c.region_id order by 1 nulls first", true),
            ("select c.id from customers c where c.tier is distinct from 'gold'", false),
            ("select c.name, count(*) from customers c group by c.name order by c.name nulls last", true),
            ("select c.id, length(c.name), octet_length(c.name) from customers c order by 2 desc nulls last, 1", true),
            ("select min(c.name), max(c.name), min(c.name collate \"C\") from customers c", true),
        ]);
        Case {
            class: "text and nulls",
            sql: sql.into(),
            ordered,
            ..Case::default()
        }
    }
}
