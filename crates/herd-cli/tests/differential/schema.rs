//! The schema and the deterministic rows both servers are loaded with.
//!
//! * `customers (id int8 key)` and `orders (customer_id int8 key)`: distributed, co-located.
//!   Some orders name no customer (61..70), some customers have no order, NULLs everywhere.
//! * `regions`: a reference table; region 6 has no customer, region 7 is named by customers but
//!   absent; `tags`: a local table (group 0 only).
//! * `codes (code text key)`: distributed on a text key (comparisons through char/varchar).
//! * `people (nick text collate ci)`: distributed, with a nondeterministic ICU collation.
//! * `ledger (customer_id int8 key, unique (customer_id, tag))`: distributed, the target of the
//!   persistent INSERT/UPDATE/DELETE (a UNIQUE without the key is refused at distribution; the
//!   generator asks for one later, which must be refused too).
//! * `alt.customers`: a plain table that `search_path = alt, public` should name instead.
//! * `cust_orders(int8)`, `all_orders()`: SQL functions reading `orders`; `plus1(int8)`: one
//!   reading no table.
//! * Views over distributed tables: `cust_totals` (an aggregate over customers ⟕ orders),
//!   `order_regions` (orders, customers, `regions`, `tags`), `big_spenders` (over `cust_totals`).

/// Where a set-up statement runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Where {
    /// Both servers; the outcomes must match.
    Both,
    /// Herd's endpoint only (distributing tables).
    HerdOnly,
}

/// The tables (name, DDL, how Herd distributes it or `None` for local).
const TABLES: &[(&str, &str, Option<&str>)] = &[
    (
        "regions",
        "create table regions (id int primary key, name text, zone text)",
        Some("select herd.create_reference_table('regions')"),
    ),
    (
        "customers",
        "create table customers (id bigint primary key, name text, region_id int, tier text, \
         credit numeric(10,2), since date, active bool)",
        Some("select herd.create_distributed_table('customers', 'id')"),
    ),
    (
        "orders",
        "create table orders (id bigint not null, customer_id bigint not null, \
         amount numeric(10,2), qty int, status text, placed date, primary key (customer_id, id))",
        Some("select herd.create_distributed_table('orders', 'customer_id')"),
    ),
    (
        "tags",
        "create table tags (id int primary key, label text, weight int)",
        None,
    ),
    (
        "codes",
        "create table codes (code text primary key, customer_id bigint, label text)",
        Some("select herd.create_distributed_table('codes', 'code')"),
    ),
    (
        "people",
        "create table people (id bigint primary key, nick text collate ci)",
        Some("select herd.create_distributed_table('people', 'id')"),
    ),
    (
        "ledger",
        "create table ledger (customer_id bigint not null, seq int not null, v int, tag text, \
         primary key (customer_id, seq), unique (customer_id, tag))",
        Some("select herd.create_distributed_table('ledger', 'customer_id')"),
    ),
];

/// Every set-up statement in order.
pub fn setup() -> Vec<(String, Where)> {
    let mut out = vec![(
        "create collation ci (provider = icu, locale = 'und-u-ks-level2', deterministic = false)"
            .to_string(),
        Where::Both,
    )];
    for (_, ddl, distribute) in TABLES {
        out.push((ddl.to_string(), Where::Both));
        if let Some(d) = distribute {
            out.push((d.to_string(), Where::HerdOnly));
        }
    }
    for sql in [
        "create schema alt",
        "create table alt.customers (id bigint primary key, name text)",
        "insert into alt.customers (id, name) values (1, 'alt-one'), (2, 'alt-two')",
        "create function cust_orders(bigint) returns bigint language sql stable \
         as $$ select count(*) from orders where customer_id = $1 $$",
        "create function all_orders() returns bigint language sql stable \
         as $$ select count(*) from orders $$",
        "create function plus1(bigint) returns bigint language sql immutable \
         as $$ select $1 + 1 $$",
        // Views over distributed tables (read in `views.rs`).
        "create view cust_totals as select c.id, c.name, c.region_id, count(o.id) as n, \
         sum(o.amount) as total from customers c left join orders o on o.customer_id = c.id \
         group by c.id, c.name, c.region_id",
        "create view order_regions as select o.id, o.customer_id, o.amount, o.status, \
         r.name as region, t.label from orders o join customers c on c.id = o.customer_id \
         left join regions r on r.id = c.region_id left join tags t on t.id = o.qty",
        "create view big_spenders as select id, name, total from cust_totals where total > 100",
    ] {
        out.push((sql.to_string(), Where::Both));
    }
    for row in rows() {
        out.push((row, Where::Both));
    }
    out
}

/// A text literal or NULL.
fn lit(s: Option<String>) -> String {
    s.map(|s| format!("'{}'", s.replace('\'', "''")))
        .unwrap_or_else(|| "NULL".into())
}

/// The INSERTs, one row each (a row per statement never spans groups).
fn rows() -> Vec<String> {
    let mut out = Vec::new();
    for (id, name, zone) in [
        (1, "north", Some("eu")),
        (2, "south", Some("eu")),
        (3, "east", Some("us")),
        (4, "west", Some("us")),
        (5, "Ærø", None),
        (6, "empty", Some("apac")),
    ] {
        out.push(format!(
            "insert into regions (id, name, zone) values ({id}, '{name}', {})",
            lit(zone.map(str::to_string))
        ));
    }
    out.extend(ledger_rows());
    let names = [
        "alpha", "Alpha", "beta", "gamma ", "Émile", "zeta", "a b", "ähnlich", "O'Neil",
    ];
    let tiers = [Some("gold"), Some("silver"), Some("bronze"), None];
    for i in 1..=60i64 {
        let name = (i % 13 != 0).then(|| format!("{}{}", names[(i % 9) as usize], i % 4));
        let region = if i % 11 == 0 {
            "NULL".to_string()
        } else {
            // 1..=5 and 7 (absent from regions); 6 is never named.
            let r = i % 6 + 1;
            if r == 6 { 7 } else { r }.to_string()
        };
        let credit = match i % 10 {
            0 => "NULL".to_string(),
            3 => "0".to_string(),
            _ => format!("{:.2}", ((i * 7919) % 2001 - 700) as f64 / 4.0),
        };
        let since = if i % 17 == 0 {
            "NULL".to_string()
        } else {
            format!("date '2015-01-01' + {}", (i * 97) % 3000)
        };
        let active = match i % 5 {
            0 => "NULL",
            1 | 3 => "true",
            _ => "false",
        };
        out.push(format!(
            "insert into customers (id, name, region_id, tier, credit, since, active) values ({i}, {}, {region}, {}, {credit}, {since}, {active})",
            lit(name),
            lit(tiers[(i % 4) as usize].map(str::to_string))
        ));
    }
    let statuses = [
        Some("new"),
        Some("paid"),
        Some("shipped"),
        Some("void"),
        None,
    ];
    for i in 1..=240i64 {
        let customer = (i * 7) % 70 + 1;
        let amount = if i % 9 == 0 {
            "NULL".to_string()
        } else {
            format!("{:.2}", ((i * 389) % 1000) as f64 / 3.0)
        };
        let qty = if i % 13 == 0 {
            "NULL".to_string()
        } else {
            (i % 6).to_string()
        };
        out.push(format!(
            "insert into orders (id, customer_id, amount, qty, status, placed) values ({i}, {customer}, {amount}, {qty}, {}, date '2024-01-01' + {})",
            lit(statuses[(i % 5) as usize].map(str::to_string)),
            (i * 13) % 365
        ));
    }
    for i in 1..=10 {
        out.push(format!(
            "insert into tags (id, label, weight) values ({i}, 'tag{}', {})",
            i % 4,
            i * 3 % 7
        ));
    }
    for i in 1..=40i64 {
        let label = (i % 6 != 0).then(|| format!("L{}", i % 5));
        out.push(format!(
            "insert into codes (code, customer_id, label) values ('k{i}', {}, {})",
            i % 70 + 1,
            lit(label)
        ));
    }
    let nicks = [
        "alpha", "ALPHA", "Alpha", "beta", "BETA", "gamma", "äbc", "ÄBC",
    ];
    for i in 1..=24i64 {
        out.push(format!(
            "insert into people (id, nick) values ({i}, '{}')",
            nicks[(i % 8) as usize]
        ));
    }
    out
}

/// The ledger's starting rows (also used to put it back after a divergence).
pub fn ledger_rows() -> Vec<String> {
    (1..=20i64)
        .map(|i| {
            format!(
                "insert into ledger (customer_id, seq, v, tag) values ({}, {}, {}, 't{i}')",
                i % 9 + 1,
                i,
                i * 10
            )
        })
        .collect()
}
