//! The query generator's core: a seeded xorshift PRNG (hand-written, no dependency) and a
//! small grammar of statements over the schema of `schema.rs`. Every case says whether its
//! ORDER BY fully determines the order of its rows (then answers are compared in order), and
//! LIMIT/OFFSET is only generated under such an order (else any subset would be a right
//! answer). Here: the
//! cases, the tables, predicates and expressions, single-table reads, aggregates and joins;
//! the other shapes are in `shapes.rs`, `known.rs` and `edges.rs`.

/// xorshift64* — deterministic for a seed, good enough to pick grammar branches.
pub struct Rng(u64);

impl Rng {
    /// A generator for `seed` (0 is mapped to a fixed non-zero state).
    pub fn new(seed: u64) -> Rng {
        Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }

    /// The next 64 random bits.
    pub fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    /// Uniform in `0..n` (`n` > 0).
    pub fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }

    /// True with probability `pct`/100.
    pub fn chance(&mut self, pct: u64) -> bool {
        self.next() % 100 < pct
    }

    /// One element of a non-empty slice.
    pub fn pick<'a, T>(&mut self, items: &'a [T]) -> &'a T {
        &items[self.below(items.len())]
    }

    /// An integer in `lo..=hi`.
    pub fn range(&mut self, lo: i64, hi: i64) -> i64 {
        lo + (self.next() % (hi - lo + 1) as u64) as i64
    }
}

/// A bound parameter (sent as `$n` in the extended protocol, as a literal in the simple one).
#[derive(Clone, Debug)]
pub enum Param {
    /// int2.
    I2(i16),
    /// int4.
    I4(i32),
    /// int8.
    I8(i64),
    /// text.
    Text(String),
}

impl Param {
    /// The value as an SQL literal (simple protocol).
    pub fn literal(&self) -> String {
        match self {
            Param::I2(v) => v.to_string(),
            Param::I4(v) => v.to_string(),
            Param::I8(v) => v.to_string(),
            Param::Text(s) => format!("'{}'", s.replace('\'', "''")),
        }
    }
}

/// One generated test case: statements before, the statement compared, statements after.
#[derive(Clone, Debug, Default)]
pub struct Case {
    /// The grammar branch (class) that made it, for the per-class report.
    pub class: &'static str,
    /// Run first, in the simple protocol, outcomes compared too (BEGIN, SET, a DELETE).
    pub before: Vec<String>,
    /// The statement, `$n` for parameters.
    pub sql: String,
    /// Its parameters.
    pub params: Vec<Param>,
    /// Whether ORDER BY fully determines the order of the rows.
    pub ordered: bool,
    /// Whether the statement returns no rows (its affected-row count is compared instead).
    pub command: bool,
    /// Run after the statement (simple protocol, compared as multisets): verification reads.
    pub check: Vec<String>,
    /// Always run at the end, outcome ignored (ROLLBACK, RESET).
    pub cleanup: Vec<String>,
    /// Several statements in one query string: the simple protocol only.
    pub simple_only: bool,
}

impl Case {
    /// The statement with its parameters as literals.
    pub fn inline(&self) -> String {
        let mut sql = self.sql.clone();
        for (i, p) in self.params.iter().enumerate().rev() {
            sql = sql.replace(&format!("${}", i + 1), &p.literal());
        }
        sql
    }

    /// The whole case as one readable script (for reports).
    pub fn script(&self) -> String {
        let mut parts = self.before.clone();
        let mut main = self.sql.clone();
        if !self.params.is_empty() {
            main.push_str(&format!("   -- params {:?}", self.params));
        }
        parts.push(main);
        parts.extend(self.check.iter().map(|c| format!("{c}   -- check")));
        parts.extend(self.cleanup.iter().cloned());
        parts.join(";\n")
    }
}

/// A column: SQL name (qualified), kind, whether unique in its table.
#[derive(Clone, Copy)]
pub(crate) struct Col {
    /// The qualified name (`c.id`).
    pub(crate) name: &'static str,
    /// Its kind of values.
    pub(crate) kind: Kind,
}

#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    Int,
    Num,
    Text,
    Date,
    Bool,
}

/// A table under an alias: its columns, its unique column, and its key (if distributed).
pub(crate) struct Table {
    /// `name alias` as written in FROM.
    pub(crate) from: &'static str,
    /// Its columns.
    pub(crate) cols: &'static [Col],
    /// A column unique in the table (ends an ORDER BY to make it total).
    pub(crate) unique: &'static str,
}

const fn c(name: &'static str, kind: Kind) -> Col {
    Col { name, kind }
}

pub(crate) const CUSTOMERS: Table = Table {
    from: "customers c",
    cols: &[
        c("c.id", Kind::Int),
        c("c.name", Kind::Text),
        c("c.region_id", Kind::Int),
        c("c.tier", Kind::Text),
        c("c.credit", Kind::Num),
        c("c.since", Kind::Date),
        c("c.active", Kind::Bool),
    ],
    unique: "c.id",
};
pub(crate) const ORDERS: Table = Table {
    from: "orders o",
    cols: &[
        c("o.id", Kind::Int),
        c("o.customer_id", Kind::Int),
        c("o.amount", Kind::Num),
        c("o.qty", Kind::Int),
        c("o.status", Kind::Text),
        c("o.placed", Kind::Date),
    ],
    unique: "o.id",
};
pub(crate) const REGIONS: Table = Table {
    from: "regions r",
    cols: &[
        c("r.id", Kind::Int),
        c("r.name", Kind::Text),
        c("r.zone", Kind::Text),
    ],
    unique: "r.id",
};
pub(crate) const TAGS: Table = Table {
    from: "tags t",
    cols: &[
        c("t.id", Kind::Int),
        c("t.label", Kind::Text),
        c("t.weight", Kind::Int),
    ],
    unique: "t.id",
};
pub(crate) const CODES: Table = Table {
    from: "codes k",
    cols: &[
        c("k.code", Kind::Text),
        c("k.customer_id", Kind::Int),
        c("k.label", Kind::Text),
    ],
    unique: "k.code",
};

const SINGLE: &[&Table] = &[&CUSTOMERS, &ORDERS, &REGIONS, &TAGS, &CODES];

/// Generates cases from one seed.
pub struct Gen {
    /// The random source (also used by the shapes of `edges.rs`).
    pub(crate) rng: Rng,
}

impl Gen {
    /// A generator for `seed`.
    pub fn new(seed: u64) -> Gen {
        Gen {
            rng: Rng::new(seed),
        }
    }

    /// The next case.
    pub fn case(&mut self) -> Case {
        match self.rng.below(100) {
            0..=13 => self.single(),
            14..=23 => self.aggregate(),
            24..=35 => self.join(),
            36..=42 => self.subquery(),
            43..=47 => self.cte(),
            48..=51 => self.setop(),
            52..=54 => self.window(),
            55..=61 => self.modifying_cte(),
            62..=68 => self.dml(),
            69..=75 => self.special(),
            76..=78 => self.joined_write(),
            79..=80 => self.moving_cte(),
            81..=83 => self.view_read(),
            _ => self.edge(),
        }
    }

    /// A literal of `kind` near the data's values.
    pub(crate) fn value(&mut self, kind: Kind, col: &str) -> String {
        let r = &mut self.rng;
        match kind {
            Kind::Int if col.ends_with("id") => r.range(0, 72).to_string(),
            Kind::Int => r.range(-1, 7).to_string(),
            Kind::Num => format!("{}.{}", r.range(-150, 330), r.range(0, 99)),
            Kind::Text => r
                .pick(&[
                    "'alpha1'",
                    "'Alpha2'",
                    "'b'",
                    "'gold'",
                    "'paid'",
                    "'new'",
                    "'eu'",
                    "'us'",
                    "'m'",
                    "'Émile1'",
                    "'gamma 3'",
                    "'k7'",
                    "'L1'",
                    "''",
                    "'zeta'",
                ])
                .to_string(),
            Kind::Date => format!("date '{}-{:02}-15'", r.range(2015, 2024), r.range(1, 12)),
            Kind::Bool => r.pick(&["true", "false"]).to_string(),
        }
    }

    /// A predicate on a column of `t`; may add parameters to `params`.
    pub(crate) fn pred(&mut self, t: &Table, params: &mut Vec<Param>) -> String {
        let col = *self.rng.pick(t.cols);
        let n = col.name;
        match self.rng.below(10) {
            0 => format!("{n} is null"),
            1 => format!("{n} is not null"),
            2 if col.kind != Kind::Bool => {
                let k = self.rng.range(2, 5);
                let vs: Vec<String> = (0..k).map(|_| self.value(col.kind, n)).collect();
                let not = if self.rng.chance(20) { " not" } else { "" };
                format!("{n}{not} in ({})", vs.join(", "))
            }
            3 if col.kind == Kind::Int => {
                let a = self.rng.range(0, 40);
                format!("{n} between {a} and {}", a + self.rng.range(0, 30))
            }
            4 if col.kind == Kind::Text => {
                let p = self.rng.pick(&["'a%'", "'%a%'", "'A%'", "'_e%'", "'%1'"]);
                let op = self.rng.pick(&["like", "ilike", "not like"]);
                format!("{n} {op} {p}")
            }
            5 if col.kind == Kind::Int || col.kind == Kind::Text => {
                // A parameter: int8 for ids, int4 otherwise, text for text.
                let p = match col.kind {
                    Kind::Int if n.ends_with("id") => Param::I8(self.rng.range(0, 72)),
                    Kind::Int => Param::I4(self.rng.range(0, 6) as i32),
                    _ => Param::Text(self.value(Kind::Text, n).trim_matches('\'').to_string()),
                };
                params.push(p);
                let op = self.rng.pick(&["=", "<>", "<", ">="]);
                format!("{n} {op} ${}", params.len())
            }
            6 if col.kind == Kind::Bool => format!("{n} is not true"),
            7 => format!("not ({n} = {} or {n} is null)", self.value(col.kind, n)),
            _ => {
                let op = self.rng.pick(&["=", "<>", "<", "<=", ">", ">="]);
                let v = self.value(col.kind, n);
                format!("{n} {op} {v}")
            }
        }
    }

    /// A WHERE clause of 0..=2 predicates (with an `and`/`or`), or "".
    pub(crate) fn where_(&mut self, tables: &[&Table], params: &mut Vec<Param>) -> String {
        let k = self.rng.below(3);
        if k == 0 {
            return String::new();
        }
        let mut ps = Vec::new();
        for _ in 0..k {
            let t = *self.rng.pick(tables);
            ps.push(self.pred(t, params));
        }
        let join = if self.rng.chance(25) { " or " } else { " and " };
        format!(" where {}", ps.join(join))
    }

    /// An expression over a column of `t` (or the column itself), with its output name.
    pub(crate) fn expr(&mut self, t: &Table) -> String {
        let col = *self.rng.pick(t.cols);
        let n = col.name;
        if self.rng.chance(55) {
            return n.to_string();
        }
        match col.kind {
            Kind::Int => self
                .rng
                .pick(&[
                    format!("{n} % 5"),
                    format!("{n} * 2 + 1"),
                    format!("coalesce({n}, -1)"),
                ])
                .clone(),
            Kind::Num => self
                .rng
                .pick(&[
                    format!("{n} * 2"),
                    format!("round({n})"),
                    format!("abs({n})"),
                    format!("case when {n} > 100 then 'big' else 'small' end"),
                ])
                .clone(),
            Kind::Text => self
                .rng
                .pick(&[
                    format!("upper({n})"),
                    format!("length({n})"),
                    format!("coalesce({n}, '?') || '!'"),
                    format!("{n} < 'm'"),
                    format!("substr({n}, 1, 2)"),
                ])
                .clone(),
            Kind::Date => format!("extract(year from {n})"),
            Kind::Bool => format!("not {n}"),
        }
    }

    /// ORDER BY the given columns then `uniques`, with random directions; plus maybe a LIMIT
    /// and OFFSET (literal or an int2/int4/int8 parameter).
    pub(crate) fn order_limit(
        &mut self,
        lead: &[String],
        uniques: &[&str],
        params: &mut Vec<Param>,
    ) -> String {
        let mut keys: Vec<String> = Vec::new();
        for k in lead
            .iter()
            .map(String::as_str)
            .chain(uniques.iter().copied())
        {
            let dir = self
                .rng
                .pick(&["", " desc", " nulls first", " desc nulls last"]);
            keys.push(format!("{k}{dir}"));
        }
        let mut out = format!(" order by {}", keys.join(", "));
        if self.rng.chance(50) {
            out.push_str(&format!(" limit {}", self.limit_arg(params, 0, 12)));
        }
        if self.rng.chance(30) {
            out.push_str(&format!(" offset {}", self.limit_arg(params, 0, 20)));
        }
        out
    }

    /// A LIMIT/OFFSET count: a literal or a parameter of a random integer type.
    pub(crate) fn limit_arg(&mut self, params: &mut Vec<Param>, lo: i64, hi: i64) -> String {
        let v = self.rng.range(lo, hi);
        match self.rng.below(4) {
            0 => v.to_string(),
            i => {
                params.push(match i {
                    1 => Param::I2(v as i16),
                    2 => Param::I4(v as i32),
                    _ => Param::I8(v),
                });
                format!("${}", params.len())
            }
        }
    }

    fn single(&mut self) -> Case {
        let t = *self.rng.pick(SINGLE);
        let mut params = Vec::new();
        let items: Vec<String> = if self.rng.chance(15) {
            vec!["*".into()]
        } else {
            (0..self.rng.range(1, 3)).map(|_| self.expr(t)).collect()
        };
        let distinct = self.rng.chance(15);
        let wh = self.where_(&[t], &mut params);
        let mut sql = format!(
            "select {}{} from {}{wh}",
            if distinct { "distinct " } else { "" },
            items.join(", "),
            t.from
        );
        let mut ordered = false;
        if !distinct && self.rng.chance(50) {
            let lead: Vec<String> = (0..self.rng.below(2))
                .map(|_| self.rng.pick(t.cols).name.to_string())
                .collect();
            sql.push_str(&self.order_limit(&lead, &[t.unique], &mut params));
            ordered = true;
        } else if distinct && self.rng.chance(40) && items[0] != "*" {
            // Distinct rows ordered by every output column: a total order.
            let all: Vec<String> = (1..=items.len()).map(|i| i.to_string()).collect();
            sql.push_str(&self.order_limit(&all, &[], &mut params));
            ordered = true;
        }
        Case {
            class: "single",
            sql,
            params,
            ordered,
            ..Case::default()
        }
    }

    /// An aggregate over `tables`' columns.
    pub(crate) fn agg(&mut self, tables: &[&Table]) -> String {
        let t = *self.rng.pick(tables);
        let col = *self.rng.pick(t.cols);
        let n = col.name;
        let numeric = matches!(col.kind, Kind::Int | Kind::Num);
        match self.rng.below(8) {
            0 => "count(*)".into(),
            1 => format!("count({n})"),
            2 => format!("count(distinct {n})"),
            3 if numeric => format!("sum({n})"),
            4 if numeric => format!("avg({n})"),
            5 => format!("min({n})"),
            6 => format!("max({n})"),
            7 if numeric => format!("sum({n}) filter (where {n} > 0)"),
            _ => "count(*)".into(),
        }
    }

    fn aggregate(&mut self) -> Case {
        let (tables, from): (Vec<&Table>, String) = match self.rng.below(4) {
            0 => (vec![&CUSTOMERS], "customers c".into()),
            1 | 2 => (vec![&ORDERS], "orders o".into()),
            _ => (
                vec![&CUSTOMERS, &ORDERS],
                "customers c join orders o on o.customer_id = c.id".into(),
            ),
        };
        let groupable = [
            "c.tier",
            "c.region_id",
            "c.active",
            "c.id",
            "o.status",
            "o.qty",
            "o.customer_id",
            "o.qty % 2",
            "upper(c.name)",
        ];
        let names: Vec<&str> = tables.iter().map(|t| &t.from[t.from.len() - 1..]).collect();
        let usable: Vec<&str> = groupable
            .iter()
            .copied()
            .filter(|g| names.iter().any(|a| g.contains(&format!("{a}."))))
            .collect();
        let mut groups: Vec<String> = Vec::new();
        for _ in 0..self.rng.below(3) {
            let g = self.rng.pick(&usable).to_string();
            if !groups.contains(&g) {
                groups.push(g);
            }
        }
        let aggs: Vec<String> = (0..self.rng.range(1, 3))
            .map(|_| self.agg(&tables))
            .collect();
        let mut params = Vec::new();
        let wh = self.where_(&tables, &mut params);
        let mut items = groups.clone();
        items.extend(aggs.iter().cloned());
        let mut sql = format!("select {} from {from}{wh}", items.join(", "));
        let mut ordered = groups.is_empty();
        if !groups.is_empty() {
            sql.push_str(&format!(" group by {}", groups.join(", ")));
            if self.rng.chance(30) {
                let options = [
                    "count(*) > 1".to_string(),
                    format!("{} is not null", aggs[0]),
                    "count(*) between 2 and 5".to_string(),
                ];
                let h = self.rng.pick(&options).clone();
                sql.push_str(&format!(" having {h}"));
            }
            if self.rng.chance(60) {
                let positions: Vec<String> = (1..=groups.len()).map(|i| i.to_string()).collect();
                sql.push_str(&self.order_limit(&positions, &[], &mut params));
                ordered = true;
            }
        }
        Case {
            class: "aggregate",
            sql,
            params,
            ordered,
            ..Case::default()
        }
    }

    fn join(&mut self) -> Case {
        let kinds = ["join", "left join", "right join", "full join"];
        let (from, tables, class): (String, Vec<&Table>, &'static str) = match self.rng.below(8) {
            0 | 1 => (
                format!(
                    "customers c {} orders o on o.customer_id = c.id",
                    self.rng.pick(&kinds)
                ),
                vec![&CUSTOMERS, &ORDERS],
                "join co-located",
            ),
            2 => (
                format!(
                    "customers c {} regions r on r.id = c.region_id",
                    self.rng.pick(&kinds)
                ),
                vec![&CUSTOMERS, &REGIONS],
                "join reference",
            ),
            3 => (
                format!(
                    "regions r {} customers c on c.region_id = r.id",
                    self.rng.pick(&["left join", "full join", "join"])
                ),
                vec![&REGIONS, &CUSTOMERS],
                "join reference preserved",
            ),
            4 => (
                "orders o left join customers c on c.id = o.customer_id".into(),
                vec![&ORDERS, &CUSTOMERS],
                "join co-located",
            ),
            5 => (
                format!(
                    "customers c join orders o on o.customer_id = c.id {} regions r on r.id = c.region_id",
                    self.rng.pick(&["join", "left join"])
                ),
                vec![&CUSTOMERS, &ORDERS, &REGIONS],
                "join three-way",
            ),
            6 => (
                "customers c join tags t on t.id = c.region_id".into(),
                vec![&CUSTOMERS, &TAGS],
                "join local",
            ),
            _ => (
                format!(
                    "codes k {} customers c on c.id = k.customer_id",
                    self.rng.pick(&kinds)
                ),
                vec![&CODES, &CUSTOMERS],
                "join not co-located",
            ),
        };
        let mut params = Vec::new();
        let wh = self.where_(&tables, &mut params);
        let items: Vec<String> = (0..self.rng.range(1, 4))
            .map(|_| {
                let t = *self.rng.pick(&tables);
                self.expr(t)
            })
            .collect();
        let mut sql = format!("select {} from {from}{wh}", items.join(", "));
        let ordered = self.rng.chance(50);
        if ordered {
            let uniques: Vec<&str> = tables.iter().map(|t| t.unique).collect();
            sql.push_str(&self.order_limit(&[], &uniques, &mut params));
        }
        Case {
            class,
            sql,
            params,
            ordered,
            ..Case::default()
        }
    }
}
