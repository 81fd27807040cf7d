//! The endpoint behaves as PostgreSQL does for what drivers send: pipelines that fail before
//! their Sync, huge batches, the unnamed statement across units, duplicate statement names,
//! prepared DISCARD ALL, plans invalidated by DDL, non-UTF-8 client encodings, the client's own
//! parameters, one FATAL only, reads a standby answers differently (and a repeated unnamed
//! statement routed by its text in the session's encoding), and session pooling.
//! Each case came from a driver's own test suite run through Herd; the messages are sent one by
//! one with a bare protocol client so the shapes are exact.

mod common;
#[path = "endpoint/schema_changes.rs"]
mod schema_changes;

use std::time::Duration;

use common::raw::{bind, error_code, execute, parse, tags, within, Raw};
use common::{api_get_text, cluster};
use herd_wire::encode;

/// Pool connections of `node` leased now, from `/metrics`.
fn in_use(api_port: u16, node: &str) -> u64 {
    api_get_text(api_port, "/metrics")
        .lines()
        .filter(|l| l.starts_with("herd_pool_connections{") && l.contains("in_use"))
        .filter(|l| l.contains(&format!("node=\"{node}\"")))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<u64>().ok())
        .sum()
}

fn sync(out: &mut Vec<u8>) {
    encode::sync(out);
}

/// Units routed so far for `reason` (every reason when empty; `herd_routed_total`, every node).
fn routed(api_port: u16, reason: &str) -> u64 {
    api_get_text(api_port, "/metrics")
        .lines()
        .filter(|l| l.starts_with("herd_routed_total{"))
        .filter(|l| reason.is_empty() || l.contains(&format!("reason=\"{reason}\"")))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<u64>().ok())
        .sum()
}

/// Parse, Bind, Execute and Sync of the same unnamed read with a non-ASCII comment.
fn run_unnamed(e: &mut Raw) {
    let mut out = Vec::new();
    // é in UTF-8 (0xC3 0xA9): two half-width katakana in SJIS.
    parse(&mut out, "", "select 1 as one /* \u{e9} */");
    bind(&mut out, "", &[]);
    execute(&mut out);
    sync(&mut out);
    e.send(&out);
    let msgs = e.until_ready();
    assert_eq!(tags(&msgs), "12DCZ", "{:?}", error_code(&msgs));
}

#[test]
fn pipelines_with_errors_and_huge_batches() {
    let c = cluster();
    c.up(&[]);
    let url = c.url(&[]);
    let primary = c.url(&["--primary"]);
    Raw::connect(&primary, &[]).query("create table pe(i int primary key)");
    let mut r = Raw::connect(&url, &[]);

    // The server fails a named Parse before the client has sent the rest of its batch.
    let mut out = Vec::new();
    parse(&mut out, "bad", "insert into no_such_table values ($1)");
    encode::flush(&mut out);
    r.send(&out);
    let first = r.recv();
    assert_eq!(first.code().as_deref(), Some("42P01"), "{first:?}");
    out.clear();
    for i in ["1", "2"] {
        bind(&mut out, "bad", &[i]);
        execute(&mut out);
    }
    parse(&mut out, "", "select 1");
    bind(&mut out, "", &[]);
    execute(&mut out);
    sync(&mut out);
    r.send(&out);
    assert_eq!(tags(&r.until_ready()), "Z", "skipped up to the Sync");
    // PostgreSQL never created the failed statement.
    out.clear();
    bind(&mut out, "bad", &["1"]);
    execute(&mut out);
    sync(&mut out);
    r.send(&out);
    assert_eq!(error_code(&r.until_ready()).as_deref(), Some("26000"));
    assert_eq!(tags(&r.query("insert into pe values (1)")), "CZ");

    // The same inside a transaction: the error fails it, ROLLBACK ends it.
    assert_eq!(tags(&r.query("begin")), "CZ");
    out.clear();
    parse(&mut out, "", "insert into pe values (1)"); // duplicate key at Execute
    bind(&mut out, "", &[]);
    execute(&mut out);
    encode::flush(&mut out);
    r.send(&out);
    let msgs: Vec<_> = (0..3).map(|_| r.recv()).collect();
    assert_eq!(tags(&msgs), "12E");
    assert_eq!(msgs[2].code().as_deref(), Some("23505"));
    out.clear();
    parse(&mut out, "", "insert into pe values (2)");
    bind(&mut out, "", &[]);
    execute(&mut out);
    sync(&mut out);
    r.send(&out);
    let ready = r.until_ready();
    assert_eq!(tags(&ready), "Z");
    assert_eq!(ready[0].body, b"E", "the transaction failed");
    assert_eq!(tags(&r.query("rollback")), "CZ");
    // Every server connection went back to its pool.
    within(Duration::from_secs(10), "idle pools", || {
        in_use(c.api_port(), "node0") == 0
    });

    // A batch whose end is late reaches the server as it is (its statement_timeout applies
    // between Parse and Describe, as directly), not held back until the Sync.
    let mut slow = Raw::connect(&url, &[("options", "-c statement_timeout=100")]);
    out.clear();
    parse(&mut out, "", "select $1::varchar");
    slow.send(&out);
    std::thread::sleep(Duration::from_millis(400));
    out.clear();
    encode::describe(&mut out, b'S', "").expect("describe");
    sync(&mut out);
    slow.send(&out);
    let msgs = slow.until_ready();
    assert_eq!(
        error_code(&msgs).as_deref(),
        Some("57014"),
        "{}",
        tags(&msgs)
    );

    // A huge batch, written while its answers stream back: relaying must be full duplex.
    const N: usize = 40_000;
    out.clear();
    parse(&mut out, "w", "select $1::int, repeat('x', 200)");
    sync(&mut out);
    r.send(&out);
    assert_eq!(tags(&r.until_ready()), "1Z");
    let mut writer = r.stream.try_clone().expect("clone");
    let sender = std::thread::spawn(move || {
        use std::io::Write;
        let mut batch = Vec::new();
        for i in 0..N {
            bind(&mut batch, "w", &[&i.to_string()]);
            execute(&mut batch);
            if batch.len() > 64 * 1024 {
                writer.write_all(&batch).expect("write");
                batch.clear();
            }
        }
        sync(&mut batch);
        writer.write_all(&batch).expect("write");
    });
    let mut rows = 0;
    loop {
        let m = r.recv(); // at most 30 s between messages: a stall fails here
        match m.tag {
            b'D' => rows += 1,
            b'E' => panic!("batch failed: {:?}", m.field(b'M')),
            b'Z' => break,
            _ => {}
        }
    }
    sender.join().expect("writer");
    assert_eq!(rows, N);

    // Answers much larger than the proxy's outbox, read as they come.
    for _ in 0..3 {
        let msgs = r.query("select repeat('x', 1000) from generate_series(1, 5000)");
        assert_eq!(msgs.iter().filter(|m| m.tag == b'D').count(), 5000);
    }

    // A client that gives up in the middle of a big answer leaves no busy backend behind.
    let mut quitter = Raw::connect(&url, &[("options", "-c herd.consistency=primary")]);
    out.clear();
    parse(
        &mut out,
        "",
        "select g, repeat('y', 300) /* giveup */ from generate_series(1, 3000000) g",
    );
    bind(&mut out, "", &[]);
    execute(&mut out);
    sync(&mut out);
    quitter.send(&out);
    for _ in 0..10 {
        quitter.recv();
    }
    drop(quitter);
    let mut direct = Raw::connect(&primary, &[]);
    within(
        Duration::from_secs(20),
        "the abandoned backend to end",
        || {
            let msgs = direct.query(
                "select count(*) from pg_stat_activity where query like '%giveup%' \
             and pid <> pg_backend_pid()",
            );
            msgs.iter().any(|m| m.tag == b'D' && m.text() == "0")
        },
    );
}

#[test]
fn statements_across_units_and_servers() {
    let c = cluster();
    c.up(&[]);
    let url = c.url(&[]);
    let primary = c.url(&["--primary"]);
    let mut a = Raw::connect(&url, &[]);
    let mut b = Raw::connect(&url, &[]);
    let mut out = Vec::new();

    // An unnamed DEALLOCATE ALL frees the client's statement names each time it runs, the
    // same text sent again included (the proxy reuses a repeated unnamed text's facts, never
    // a DEALLOCATE's).
    for round in 0..3 {
        out.clear();
        parse(&mut out, "kept", "select 1");
        sync(&mut out);
        a.send(&out);
        let msgs = a.until_ready();
        assert_eq!(tags(&msgs), "1Z", "round {round}: {:?}", error_code(&msgs));
        out.clear();
        parse(&mut out, "", "DEALLOCATE ALL");
        bind(&mut out, "", &[]);
        execute(&mut out);
        sync(&mut out);
        a.send(&out);
        let msgs = a.until_ready();
        assert_eq!(
            tags(&msgs),
            "12CZ",
            "round {round}: {:?}",
            error_code(&msgs)
        );
    }

    // The unnamed statement outlives its unit (pgx's describe_exec), wherever the next unit
    // lands and whatever other clients parse meanwhile.
    for i in 0..30 {
        out.clear();
        parse(&mut out, "", "select $1::int + 1 /* A */");
        encode::describe(&mut out, b'S', "").expect("describe");
        sync(&mut out);
        a.send(&out);
        assert_eq!(tags(&a.until_ready()), "1tTZ");
        out.clear();
        parse(&mut out, "", "select 'other' /* B */");
        bind(&mut out, "", &[]);
        execute(&mut out);
        sync(&mut out);
        b.send(&out);
        assert_eq!(tags(&b.until_ready()), "12DCZ");
        out.clear();
        bind(&mut out, "", &[&i.to_string()]);
        execute(&mut out);
        sync(&mut out);
        a.send(&out);
        let msgs = a.until_ready();
        assert_eq!(tags(&msgs), "2DCZ", "round {i}: {:?}", msgs.first());
        assert_eq!(msgs[1].text(), (i + 1).to_string());
    }
    // A simple query drops it, as in PostgreSQL.
    a.query("select 1");
    out.clear();
    bind(&mut out, "", &["1"]);
    execute(&mut out);
    sync(&mut out);
    a.send(&out);
    assert_eq!(error_code(&a.until_ready()).as_deref(), Some("26000"));

    // A second Parse of a name in use fails with 42P05, in and out of a transaction.
    out.clear();
    parse(&mut out, "dup", "select 1");
    sync(&mut out);
    a.send(&out);
    assert_eq!(tags(&a.until_ready()), "1Z");
    out.clear();
    parse(&mut out, "dup", "select 2");
    sync(&mut out);
    a.send(&out);
    let msgs = a.until_ready();
    assert_eq!(tags(&msgs), "EZ");
    assert_eq!(msgs[0].code().as_deref(), Some("42P05"));
    assert!(msgs[0].field(b'M').unwrap_or_default().contains("\"dup\""));
    a.query("begin");
    a.send(&out);
    let msgs = a.until_ready();
    assert_eq!(msgs[0].code().as_deref(), Some("42P05"));
    assert_eq!(msgs[1].body, b"E", "the transaction failed");
    a.query("rollback");

    // A prepared DISCARD ALL changes nothing until it runs.
    out.clear();
    parse(&mut out, "d", "discard all");
    sync(&mut out);
    a.send(&out);
    assert_eq!(tags(&a.until_ready()), "1Z");
    out.clear();
    bind(&mut out, "dup", &[]);
    execute(&mut out);
    sync(&mut out);
    a.send(&out);
    assert_eq!(tags(&a.until_ready()), "2DCZ", "dup still exists");
    let mut run_d = Vec::new();
    bind(&mut run_d, "d", &[]);
    execute(&mut run_d);
    sync(&mut run_d);
    a.send(&run_d);
    assert_eq!(tags(&a.until_ready()), "2CZ");
    a.send(&out);
    assert_eq!(error_code(&a.until_ready()).as_deref(), Some("26000"));

    // After DDL changes a statement's result type the client's re-prepare reaches the server.
    let mut p = Raw::connect(&url, &[("options", "-c herd.consistency=primary")]);
    p.query("create table cp(a int)");
    p.query("insert into cp values (1)");
    out.clear();
    parse(&mut out, "cp", "select * from cp");
    sync(&mut out);
    p.send(&out);
    p.until_ready();
    let mut run = Vec::new();
    bind(&mut run, "cp", &[]);
    execute(&mut run);
    sync(&mut run);
    p.send(&run);
    assert_eq!(tags(&p.until_ready()), "2DCZ");
    p.query("alter table cp add column b int");
    p.send(&run);
    assert_eq!(error_code(&p.until_ready()).as_deref(), Some("0A000"));
    out.clear();
    encode::close(&mut out, b'S', "cp").expect("close");
    parse(&mut out, "cp", "select * from cp");
    bind(&mut out, "cp", &[]);
    encode::describe(&mut out, b'P', "").expect("describe");
    execute(&mut out);
    sync(&mut out);
    p.send(&out);
    let msgs = p.until_ready();
    assert_eq!(tags(&msgs), "312TDCZ", "{:?}", error_code(&msgs));
    let fields = u16::from_be_bytes([msgs[3].body[0], msgs[3].body[1]]);
    assert_eq!(fields, 2, "the new result type");

    // A driver that closes and parses a statement again after a schema change gets the new
    // parameter types (pgx TestStmtCacheInvalidationExec), not the proxy's older copy.
    p.query("create table ict(f1 int)");
    let describe_params = |p: &mut Raw, close: bool| {
        let mut out = Vec::new();
        if close {
            encode::close(&mut out, b'S', "ic").expect("close");
        }
        parse(&mut out, "ic", "insert into ict(f1) values ($1)");
        encode::describe(&mut out, b'S', "ic").expect("describe");
        sync(&mut out);
        p.send(&out);
        let msgs = p.until_ready();
        let t = msgs.iter().find(|m| m.tag == b't').expect("parameters");
        u32::from_be_bytes([t.body[2], t.body[3], t.body[4], t.body[5]])
    };
    assert_eq!(describe_params(&mut p, false), 23, "int4");
    p.query("alter table ict alter column f1 type boolean using f1::boolean");
    assert_eq!(describe_params(&mut p, true), 16, "bool after the change");

    // Text in a client encoding other than UTF-8 passes as bytes; the client's own startup
    // parameters are what it is told.
    let mut latin = Raw::connect(
        &url,
        &[
            ("client_encoding", "LATIN1"),
            ("application_name", "herd-test"),
        ],
    );
    assert_eq!(
        latin.parameter("client_encoding").as_deref(),
        Some(&b"LATIN1"[..])
    );
    assert_eq!(
        latin.parameter("application_name").as_deref(),
        Some(&b"herd-test"[..])
    );
    let msgs = latin.query(b"select 'caf\xe9'::text".as_slice());
    assert_eq!(tags(&msgs), "TDCZ", "{:?}", error_code(&msgs));
    assert_eq!(msgs[1].columns()[0].as_deref(), Some(&b"caf\xe9"[..]));
    out.clear();
    parse(&mut out, "", b"select $1::text || '\xe9'".as_slice());
    bind(&mut out, "", &["x"]);
    execute(&mut out);
    sync(&mut out);
    latin.send(&out);
    let msgs = latin.until_ready();
    assert_eq!(msgs[2].columns()[0].as_deref(), Some(&b"x\xe9"[..]));
    let plain = Raw::connect(&url, &[]);
    assert_eq!(
        plain.parameter("application_name").as_deref(),
        Some(&b""[..])
    );
    assert_eq!(
        plain.parameter("client_encoding").as_deref(),
        Some(&b"UTF8"[..])
    );
    drop((latin, plain));
    // PostgreSQL reports a setting only when it changes on its connection: a server that
    // already runs in EUC_JP for an earlier client reports nothing to the next one asking for
    // it by another spelling, who must still be told EUC_JP (psycopg's test_encoding_env_var).
    for spelling in ["eucjp", "euc-jp", "EUC_JP"] {
        let c = Raw::connect(&url, &[("client_encoding", spelling)]);
        assert_eq!(
            c.parameter("client_encoding").as_deref(),
            Some(&b"EUC_JP"[..]),
            "{spelling}"
        );
    }
    let after = Raw::connect(&url, &[]);
    assert_eq!(
        after.parameter("client_encoding").as_deref(),
        Some(&b"UTF8"[..])
    );

    // A server's FATAL reaches the client once, and nothing of Herd's follows it.
    let mut victim = Raw::connect(&url, &[("options", "-c herd.consistency=primary")]);
    let mut q = Vec::new();
    encode::query(&mut q, "select pg_sleep(60) /* victim */").expect("query");
    victim.send(&q);
    let mut direct = Raw::connect(&primary, &[]);
    within(Duration::from_secs(15), "the victim's backend", || {
        let msgs = direct.query(
            "select pg_terminate_backend(pid) from pg_stat_activity \
             where query like '%victim%' and pid <> pg_backend_pid()",
        );
        msgs.iter().any(|m| m.tag == b'D')
    });
    let mut seen = Vec::new();
    while let Some(m) = victim.try_recv() {
        seen.push(m);
    }
    // PostgreSQL sends the query's RowDescription, then its FATAL, then closes.
    assert_eq!(tags(&seen), "TE", "{seen:?}");
    assert_eq!(seen[1].code().as_deref(), Some("57P01"));
}

#[test]
fn reads_a_standby_answers_differently_go_to_the_primary() {
    let c = cluster();
    c.up(&[]);
    let url = c.url(&[]);
    let mut direct = Raw::connect(&c.url(&["--primary"]), &[]);
    direct.query("create unlogged table unl(i int)");
    direct.query("insert into unl values (1)");
    // The unnamed statement a client sends again and again (parameters without preparing) is
    // routed by its text each time in the session's encoding: the proxy reuses the last
    // one's facts only while the encoding is as safe. Non-ASCII text in an encoding that may
    // hide ASCII bytes (SJIS) never goes to a replica; the same bytes in UTF-8 may.
    let mut e = Raw::connect(&url, &[]);
    let (reads, unsafe_text) = (
        routed(c.api_port(), "read"),
        routed(c.api_port(), "unparseable"),
    );
    run_unnamed(&mut e);
    run_unnamed(&mut e);
    assert_eq!(routed(c.api_port(), "read"), reads + 2, "UTF-8: a read");
    assert_eq!(error_code(&e.query("set client_encoding = 'SJIS'")), None);
    run_unnamed(&mut e);
    assert_eq!(
        routed(c.api_port(), "unparseable"),
        unsafe_text + 1,
        "SJIS: the same text is not taken for a read"
    );
    assert_eq!(error_code(&e.query("set client_encoding = 'UTF8'")), None);
    // A read again (to the primary while the replicas replay past the SJIS statement, which
    // may have written: reason not_caught_up), not an unroutable text.
    let all = routed(c.api_port(), "");
    run_unnamed(&mut e);
    assert_eq!(routed(c.api_port(), ""), all + 1);
    assert_eq!(
        routed(c.api_port(), "unparseable"),
        unsafe_text + 1,
        "UTF-8 again: classified afresh"
    );
    drop(e);

    let mut r = Raw::connect(&url, &[]);
    for _ in 0..5 {
        let msgs = r.query("select count(*) from unl");
        assert_eq!(tags(&msgs), "TDCZ", "{:?}", error_code(&msgs));
        let msgs = r.query("select current_setting('transaction_read_only')");
        assert_eq!(msgs[1].text(), "off");
    }
    // A type created in the session's temporary schema stays usable: the session is pinned.
    assert_eq!(
        error_code(&r.query("create type pg_temp.tr as range (subtype = text)")),
        None
    );
    for _ in 0..5 {
        let msgs = r.query("select lower('[a,b]'::pg_temp.tr)");
        assert_eq!(error_code(&msgs), None, "{:?}", msgs[0].field(b'M'));
    }
    drop(r);
    let mut r = Raw::connect(&url, &[]);

    // A prepared transaction is visible where it lives.
    direct.query("create table tx(i int)");
    assert_eq!(tags(&r.query("begin")), "CZ");
    r.query("insert into tx values (1)");
    let msgs = r.query("prepare transaction 'herd_test_gid'");
    assert_eq!(error_code(&msgs), None, "{:?}", msgs[0].field(b'M'));
    let msgs = r.query("select count(*) from pg_prepared_xacts where gid = 'herd_test_gid'");
    assert_eq!(msgs[1].text(), "1");
    assert_eq!(
        error_code(&r.query("commit prepared 'herd_test_gid'")),
        None
    );
}

#[test]
fn session_pooling_end_to_end() {
    let c = cluster();
    let data = c.data_dir();
    std::fs::create_dir_all(&data).expect("data dir");
    std::fs::write(data.join("herd.toml"), "[proxy]\npool_mode = \"session\"\n").expect("toml");
    c.up(&[]);
    let url = c.url(&[]);

    // A first read does not pin the session to a standby: it lives on the primary.
    let mut s = Raw::connect(&url, &[]);
    let msgs = s.query("select pg_is_in_recovery()");
    assert_eq!(msgs[1].text(), "f");
    assert_eq!(error_code(&s.query("create table t(i int)")), None);
    assert_eq!(error_code(&s.query("listen herd_channel")), None);
    // The client sees its server's real process id.
    let (pid, _) = s.backend_key();
    let msgs = s.query("select pg_backend_pid()");
    assert_eq!(msgs[1].text(), pid.to_string());
    // Advisory locks are held by one session on one server.
    assert_eq!(s.query("select pg_advisory_lock(42)")[1].text(), "");
    let mut other = Raw::connect(&url, &[]);
    assert_eq!(
        other.query("select pg_try_advisory_lock(42)")[1].text(),
        "f"
    );
    // Notifications reach the listening session, with the sender's real pid.
    let sender_pid = other.backend_key().0;
    other.query("notify herd_channel, 'hi'");
    let msgs = s.query("select 1");
    let note = msgs.iter().find(|m| m.tag == b'A').expect("notification");
    assert_eq!(
        i32::from_be_bytes([note.body[0], note.body[1], note.body[2], note.body[3]]),
        sender_pid
    );
    // Statements keep the client's own names on its own server, and the unnamed statement
    // outlives a write (pgx's describe_exec: Parse+Describe, later Bind+Execute).
    let mut out = Vec::new();
    parse(&mut out, "mine", "select 1");
    parse(&mut out, "", "insert into t values ($1::int)");
    encode::describe(&mut out, b'S', "").expect("describe");
    sync(&mut out);
    s.send(&out);
    assert_eq!(tags(&s.until_ready()), "11tnZ");
    for i in 0..2 {
        out.clear();
        bind(&mut out, "", &[&i.to_string()]);
        execute(&mut out);
        sync(&mut out);
        s.send(&out);
        let msgs = s.until_ready();
        assert_eq!(tags(&msgs), "2CZ", "{:?}", error_code(&msgs));
    }
    let msgs = s.query("select string_agg(name, ',') from pg_prepared_statements");
    assert_eq!(msgs[1].text(), "mine");
    // A second Parse of the name is the server's own 42P05.
    out.clear();
    parse(&mut out, "mine", "select 2");
    sync(&mut out);
    s.send(&out);
    assert_eq!(error_code(&s.until_ready()).as_deref(), Some("42P05"));

    // A session that says it only reads may be served by a replica.
    let mut ro = Raw::connect(&url, &[("default_transaction_read_only", "on")]);
    assert_eq!(ro.query("select pg_is_in_recovery()")[1].text(), "t");

    // A cancel with the key the client was given reaches its backend.
    let mut q = Vec::new();
    encode::query(&mut q, "select pg_sleep(30)").expect("query");
    s.send(&q);
    std::thread::sleep(Duration::from_millis(300));
    let (pid, key) = s.backend_key();
    let mut cancel = Vec::new();
    encode::cancel_request(&mut cancel, pid, key);
    let port = common::raw::url_parts(&url).2;
    let mut cs = std::net::TcpStream::connect(("127.0.0.1", port)).expect("connect");
    std::io::Write::write_all(&mut cs, &cancel).expect("cancel");
    let msgs = s.until_ready();
    assert_eq!(error_code(&msgs).as_deref(), Some("57014"), "canceled");
}
