//! Statements kept prepared on pooled servers follow schema changes (plans invalidated by DDL
//! through the endpoint or outside it), in transaction and session pooling and inside a DDL
//! transaction: the endpoint's stale prepared statements (XX000) this binary guards against.

use super::common::raw::{bind, error_code, execute, parse, tags, Raw};
use super::common::{api_get_text, cluster};
use super::sync;
use herd_wire::encode;

/// One kind of schema change a statement kept prepared on a pooled server must follow. `{v}`
/// in the SQL stands for the variant (the change through the endpoint, or outside it), so each
/// variant has objects of its own.
struct SchemaCase {
    what: &'static str,
    /// Run directly, first.
    setup: &'static str,
    /// Run by each client before it prepares `sql` (before the change, then after).
    before: &'static str,
    after: &'static str,
    /// The statement a client prepares (named, as pgx's statement cache does) and runs.
    sql: &'static str,
    /// The schema change (none: the clients' `after` is the change).
    change: &'static str,
}

const SCHEMA_CASES: [SchemaCase; 4] = [
    SchemaCase {
        what: "a type dropped and created again (pgx TestEnumCodecValues)",
        setup: "create type enum_{v} as enum ('foo', 'bar')",
        before: "",
        after: "",
        sql: "select 'foo'::enum_{v}",
        change: "drop type enum_{v}; create type enum_{v} as enum ('foo', 'bar')",
    },
    SchemaCase {
        what: "a table's columns changed",
        setup: "create table tc_{v}(a int); insert into tc_{v} values (1)",
        before: "",
        after: "",
        sql: "select * from tc_{v}",
        change: "alter table tc_{v} alter column a type text, add column b text default 'x'",
    },
    SchemaCase {
        what: "a function replaced with another result type",
        setup: "create function fr_{v}() returns int language sql as 'select 1'",
        before: "",
        after: "",
        sql: "select * from fr_{v}()",
        change: "drop function fr_{v}(); \
                 create function fr_{v}() returns text language sql as $$select 'one'$$",
    },
    SchemaCase {
        what: "another search_path",
        setup: "create schema sa_{v}; create schema sb_{v}; \
                create table sa_{v}.t(a int); insert into sa_{v}.t values (1); \
                create table sb_{v}.t(b text); insert into sb_{v}.t values ('two')",
        before: "set search_path = sa_{v}",
        after: "set search_path = sb_{v}",
        sql: "select * from t",
        change: "",
    },
];

/// What a client sees preparing `sql` as statement `s` (Parse, Describe, Sync: how pgx
/// prepares), then running it (Bind, Execute, Sync): every message, an error by its SQLSTATE.
fn prepare_and_run(r: &mut Raw, sql: &str) -> Vec<(char, Vec<u8>)> {
    let mut out = Vec::new();
    parse(&mut out, "s", sql);
    encode::describe(&mut out, b'S', "s").expect("describe");
    sync(&mut out);
    let mut seen = Vec::new();
    r.send(&out);
    seen.extend(r.until_ready());
    out.clear();
    bind(&mut out, "s", &[]);
    execute(&mut out);
    sync(&mut out);
    r.send(&out);
    seen.extend(r.until_ready());
    seen.into_iter()
        .map(|m| match m.tag {
            b'E' => ('E', m.code().unwrap_or_default().into_bytes()),
            tag => (tag as char, m.body),
        })
        .collect()
}

/// A client of `url` that ran `pre` (when there is one).
fn client_after(url: &str, pre: &str) -> Raw {
    let mut r = Raw::connect(url, &[]);
    if !pre.is_empty() {
        let msgs = r.query(pre);
        assert_eq!(error_code(&msgs), None, "{pre}: {:?}", msgs[0].field(b'M'));
    }
    r
}

/// Every [`SchemaCase`], its change made through the endpoint and outside it: a client of the
/// endpoint that prepares the statement after the change gets what a direct client gets,
/// though a server of the pool still holds the statement as an earlier client prepared it.
/// Every read is bounded by the bare client's 30 s timeout.
fn kept_statements_follow_schema_changes(c: &herd_testkit::TestCluster) {
    let url = c.url(&[]);
    let primary = c.url(&["--primary"]);
    let mut direct = Raw::connect(&primary, &[]);
    for case in &SCHEMA_CASES {
        for (variant, through_endpoint) in [("e", true), ("o", false)] {
            let sql = |text: &str| text.replace("{v}", variant);
            let what = format!(
                "{} ({})",
                case.what,
                if through_endpoint {
                    "through the endpoint"
                } else {
                    "outside it"
                }
            );
            let msgs = direct.query(sql(case.setup));
            assert_eq!(error_code(&msgs), None, "{what}: setup");
            // An earlier client leaves the statement prepared on the pooled server.
            let mut early = client_after(&url, &sql(case.before));
            let seen = prepare_and_run(&mut early, &sql(case.sql));
            assert!(seen.iter().all(|(tag, _)| *tag != 'E'), "{what}: {seen:?}");
            drop(early);
            if !case.change.is_empty() {
                let msgs = if through_endpoint {
                    Raw::connect(&url, &[]).query(sql(case.change))
                } else {
                    direct.query(sql(case.change))
                };
                assert_eq!(error_code(&msgs), None, "{what}: the change");
            }
            let want = prepare_and_run(
                &mut client_after(&primary, &sql(case.after)),
                &sql(case.sql),
            );
            assert!(want.iter().all(|(tag, _)| *tag != 'E'), "{what}: {want:?}");
            for attempt in 0..2 {
                let got =
                    prepare_and_run(&mut client_after(&url, &sql(case.after)), &sql(case.sql));
                assert_eq!(got, want, "{what}, client {attempt} after the change");
            }
        }
    }
}

/// A one-server cluster whose endpoint pools in `mode` over one server connection, so that
/// every client of the endpoint meets the statements earlier ones left there.
fn one_connection_cluster(mode: &str) -> herd_testkit::TestCluster {
    let c = cluster();
    let data = c.data_dir();
    std::fs::create_dir_all(&data).expect("data dir");
    std::fs::write(
        data.join("herd.toml"),
        format!("[proxy]\npool_mode = \"{mode}\"\npool_size = 1\n"),
    )
    .expect("toml");
    c.up(&["--replicas", "0"]);
    c
}

#[test]
fn kept_statements_follow_schema_changes_in_transaction_pooling() {
    let c = one_connection_cluster("transaction");
    kept_statements_follow_schema_changes(&c);
    // A change outside the endpoint is learnt from the server's refusal of the old
    // statement: the unit ran again, the client none the wiser.
    let metrics = api_get_text(c.api_port(), "/metrics");
    let reruns: u64 = metrics
        .lines()
        .filter(|l| l.starts_with("herd_stale_retries_total"))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<u64>().ok())
        .sum();
    assert!(reruns >= 3, "{metrics}");

    // A unit that executed something before the refusal is not run again (it may have had
    // effects outside its transaction): the client gets the server's error, once, and the
    // transaction's write is rolled back, not made twice.
    let url = c.url(&[]);
    let mut direct = Raw::connect(&c.url(&["--primary"]), &[]);
    direct.query("create table written(i int); create type once as enum ('a')");
    let mut early = Raw::connect(&url, &[]);
    prepare_and_run(&mut early, "select 'a'::once");
    drop(early);
    direct.query("drop type once; create type once as enum ('a')");
    let mut r = Raw::connect(&url, &[]);
    let mut out = Vec::new();
    parse(&mut out, "w", "insert into written values (1)");
    bind(&mut out, "w", &[]);
    execute(&mut out);
    parse(&mut out, "s", "select 'a'::once");
    encode::describe(&mut out, b'S', "s").expect("describe");
    sync(&mut out);
    r.send(&out);
    let msgs = r.until_ready();
    assert_eq!(tags(&msgs), "12C1tEZ", "{:?}", error_code(&msgs));
    let count = direct.query("select count(*) from written");
    assert_eq!(count[1].text(), "0", "rolled back with the batch");
    let metrics = api_get_text(c.api_port(), "/metrics");
    assert!(
        metrics.contains(&format!("herd_stale_retries_total {reruns}")),
        "not run again: {metrics}"
    );
    // The next prepare is fresh.
    assert_eq!(
        prepare_and_run(&mut Raw::connect(&url, &[]), "select 'a'::once"),
        prepare_and_run(&mut direct, "select 'a'::once")
    );
}

#[test]
fn kept_statements_follow_schema_changes_in_session_pooling() {
    kept_statements_follow_schema_changes(&one_connection_cluster("session"));
}

/// DDL inside a transaction block through the endpoint: the transaction's own statements after
/// it are prepared against the new schema, and once it rolls back, the next client's against
/// the old one again, as directly (each read bounded by the bare client's timeout).
#[test]
fn kept_statements_inside_a_ddl_transaction() {
    let c = one_connection_cluster("transaction");
    let url = c.url(&[]);
    let primary = c.url(&["--primary"]);
    Raw::connect(&primary, &[]).query("create type mood as enum ('ok')");
    let sql = "select 'ok'::mood";
    let change = "drop type mood; create type mood as enum ('ok', 'bad')";
    // What a client sees: the statement prepared and run inside a transaction that changed
    // the type, then after it ended (`end`: commit or rollback).
    let run = |target: &str, end: &str| {
        let mut r = Raw::connect(target, &[]);
        let mut seen = Vec::new();
        for step in ["begin", change] {
            assert_eq!(error_code(&r.query(step)), None, "{step}");
        }
        // The type made inside is a new one each run: OIDs are not compared.
        seen.push(without_type_oids(prepare_and_run(&mut r, sql)));
        assert_eq!(error_code(&r.query(end)), None, "{end}");
        seen.push(without_type_oids(prepare_and_run(
            &mut Raw::connect(target, &[]),
            sql,
        )));
        seen
    };
    for end in ["rollback", "commit"] {
        // An earlier client leaves the statement prepared on the pooled server.
        prepare_and_run(&mut Raw::connect(&url, &[]), sql);
        let got = run(&url, end);
        let want = run(&primary, end);
        assert!(
            want.iter().flatten().all(|(tag, _)| *tag != 'E'),
            "{end}: {want:?}"
        );
        assert_eq!(got, want, "{end}");
    }
}

/// `msgs` with the type OIDs of their RowDescriptions zeroed.
fn without_type_oids(mut msgs: Vec<(char, Vec<u8>)>) -> Vec<(char, Vec<u8>)> {
    for (tag, body) in &mut msgs {
        if *tag != 'T' {
            continue;
        }
        let fields = u16::from_be_bytes([body[0], body[1]]);
        let mut at = 2;
        for _ in 0..fields {
            at += body[at..].iter().position(|b| *b == 0).expect("name") + 1;
            // Table OID (4) and column number (2), then the type OID.
            body[at + 6..at + 10].fill(0);
            at += 18;
        }
    }
    msgs
}
