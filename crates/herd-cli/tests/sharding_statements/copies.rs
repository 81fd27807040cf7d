//! COPY through the endpoint of a sharded cluster, message by message as one server answers
//! it: `COPY … FROM STDIN` and `COPY … TO STDOUT` of a distributed table (`cp`) and of a table
//! that is not distributed (`cp_one`, on group 0), in the simple protocol (as psql's `\copy`
//! sends it) and the extended one (tokio-postgres' `copy_in`/`copy_out`); a COPY the client
//! aborts (CopyFail) leaves the session usable; a COPY into a group-0 table inside a
//! transaction that spans groups commits or rolls back with the rest (it once left the
//! session's next COMMIT refused and the session failed). Every wait is bounded: a COPY that
//! hangs fails the test.

use std::time::Duration;

use futures_util::{SinkExt, TryStreamExt};
use herd_wire::encode;
use tokio_postgres::Client;

use super::{answer, connect, run_all};
use crate::common::raw::{Msg, Raw};

/// How long one COPY may take through the endpoint (a hang fails, it does not wait forever).
const COPY_LIMIT: Duration = Duration::from_secs(60);

/// What a client reads of a COPY's answer: the kinds of messages, command tags, SQLSTATEs,
/// transaction status; CopyData rows are left out (compared separately, as multisets).
fn read(msgs: &[Msg]) -> Vec<String> {
    msgs.iter()
        .filter(|m| m.tag != b'd')
        .map(|m| match m.tag {
            b'C' => format!(
                "complete {}",
                String::from_utf8_lossy(&m.body).trim_end_matches('\0')
            ),
            b'E' => format!("error {}", m.code().unwrap_or_default()),
            b'Z' => format!("ready {}", char::from(m.body[0])),
            t => char::from(t).to_string(),
        })
        .collect()
}

/// The lines of an answer's CopyData, sorted (however the rows are cut into messages).
fn rows(msgs: &[Msg]) -> Vec<String> {
    let data: Vec<u8> = msgs
        .iter()
        .filter(|m| m.tag == b'd')
        .flat_map(|m| m.body.iter().copied())
        .collect();
    let mut out: Vec<String> = String::from_utf8_lossy(&data)
        .lines()
        .map(str::to_string)
        .collect();
    out.sort();
    out
}

/// A simple-query `COPY … FROM STDIN` as psql sends it: the query, the server's
/// CopyInResponse, then `data` in CopyData messages of `chunk` rows and CopyDone (or CopyFail
/// with `fail`); every message up to ReadyForQuery.
fn copy_in_simple(raw: &mut Raw, sql: &str, data: &[String], fail: Option<&str>) -> Vec<Msg> {
    let mut q = Vec::new();
    encode::query(&mut q, sql).expect("query");
    raw.send(&q);
    let first = raw.recv();
    if first.tag != b'G' {
        // Refused or failed before the copy: the rest of the answer follows.
        let mut all = vec![first];
        if all[0].tag != b'Z' {
            all.extend(raw.until_ready());
        }
        return all;
    }
    let mut out = Vec::new();
    for chunk in data.chunks(50) {
        let text: String = chunk.concat();
        out.push(b'd');
        out.extend_from_slice(&((text.len() + 4) as u32).to_be_bytes());
        out.extend_from_slice(text.as_bytes());
    }
    match fail {
        Some(why) => {
            out.push(b'f');
            out.extend_from_slice(&((why.len() + 5) as u32).to_be_bytes());
            out.extend_from_slice(why.as_bytes());
            out.push(0);
        }
        None => out.extend_from_slice(&[b'c', 0, 0, 0, 4]),
    }
    raw.send(&out);
    let mut all = vec![first];
    all.extend(raw.until_ready());
    all
}

/// The DataRows of an answer.
fn rows_of(msgs: &[Msg]) -> Vec<Vec<Option<Vec<u8>>>> {
    msgs.iter()
        .filter(|m| m.tag == b'D')
        .map(Msg::columns)
        .collect()
}

/// Text rows `id\tnote` for ids in `range`.
fn text_rows(range: std::ops::Range<i64>) -> Vec<String> {
    range.map(|i| format!("{i}\tn{i}\n")).collect()
}

/// The same simple-query COPY FROM STDIN into the distributed table and its one-server copy:
/// the answers, which must be equal.
fn same_copy_in(herd: &mut Raw, sql: &str, data: &[String], fail: Option<&str>) -> Vec<String> {
    let got = read(&copy_in_simple(herd, &sql.replace("CP", "cp"), data, fail));
    let want = read(&copy_in_simple(
        herd,
        &sql.replace("CP", "cp_one"),
        data,
        fail,
    ));
    assert_eq!(
        got, want,
        "{sql}: Herd's distributed table, then group 0's table"
    );
    got
}

/// Both tables' rows, which must be equal.
async fn same_rows(client: &Client, what: &str) {
    assert_eq!(
        answer(client, "select * from cp order by id").await,
        answer(client, "select * from cp_one order by id").await,
        "{what}"
    );
}

pub async fn copies(client: &Client, url: &str, groups: &[String]) {
    run_all(
        client,
        &[
            "create table cp (id bigint primary key, note text)",
            "create table cp_one (id bigint primary key, note text)",
            "create table cp_log (id bigint primary key, note text)",
            "select herd.create_distributed_table('cp', 'id')",
        ],
    )
    .await;
    let mut herd = Raw::connect(url, &[]);
    // psql's `\copy … from` (simple protocol), text and CSV with a header.
    let got = same_copy_in(&mut herd, "copy CP from stdin", &text_rows(1..201), None);
    assert_eq!(got, ["G", "complete COPY 200", "ready I"]);
    let csv: Vec<String> = std::iter::once("note,id\n".to_string())
        .chain((201..221).map(|i| format!("\"c,{i}\",{i}\n")))
        .collect();
    same_copy_in(
        &mut herd,
        "copy CP (note, id) from stdin with (format csv, header)",
        &csv,
        None,
    );
    same_rows(client, "simple-protocol COPY FROM STDIN").await;
    // The client aborts (CopyFail): 57014, nothing kept, the session answers the next query.
    let got = same_copy_in(
        &mut herd,
        "copy CP from stdin",
        &text_rows(300..320),
        Some("stopped by the client"),
    );
    assert_eq!(got, ["G", "error 57014", "ready I"]);
    // A malformed row (a column missing) among good ones of both groups: the server's
    // error, nothing kept.
    let mut bad = text_rows(400..420);
    bad.push("421\n".to_string());
    let got = same_copy_in(&mut herd, "copy CP from stdin", &bad, None);
    assert_eq!(got, ["G", "error 22P04", "ready I"], "{got:?}");
    let msgs = herd.query("select count(*) from cp where id >= 300");
    assert_eq!(rows_of(&msgs), [vec![Some(b"0".to_vec())]]);
    same_rows(client, "aborted COPYs").await;

    // The extended protocol (tokio-postgres): rows, then a copy the client drops (CopyFail).
    for table in ["cp", "cp_one"] {
        let sink = tokio::time::timeout(
            COPY_LIMIT,
            client.copy_in(&format!("copy {table} from stdin")),
        )
        .await
        .expect("CopyInResponse in time")
        .expect("copy_in");
        futures_util::pin_mut!(sink);
        let text: String = text_rows(500..700).concat();
        sink.send(bytes::Bytes::from(text)).await.expect("send");
        let n = tokio::time::timeout(COPY_LIMIT, sink.finish())
            .await
            .unwrap_or_else(|_| panic!("{table}: the COPY ends in time"))
            .expect("finish");
        assert_eq!(n, 200, "{table}");
        // Boxed, not pinned on the stack: dropping it must drop the sink itself (its drop
        // sends CopyFail and Sync).
        let mut sink = Box::pin(
            client
                .copy_in::<_, bytes::Bytes>(&format!("copy {table} from stdin"))
                .await
                .expect("copy_in"),
        );
        sink.send(bytes::Bytes::from(text_rows(800..810).concat()))
            .await
            .expect("send");
        drop(sink);
        let after = tokio::time::timeout(
            COPY_LIMIT,
            client.query_one(&format!("select count(*) from {table}"), &[]),
        )
        .await
        .unwrap_or_else(|_| panic!("{table}: the session answers after an aborted COPY"))
        .expect("count");
        assert_eq!(after.get::<_, i64>(0), 420, "{table}");
    }
    same_rows(client, "extended-protocol COPY FROM STDIN").await;

    // COPY TO STDOUT: the same rows as one server's (in no promised order), the same messages.
    for sql in [
        "copy CP to stdout",
        "copy CP (note, id) to stdout with (format csv, header)",
    ] {
        let mut answers = Vec::new();
        for table in ["cp", "cp_one"] {
            let mut q = Vec::new();
            encode::query(&mut q, sql.replace("CP", table)).expect("query");
            herd.send(&q);
            let msgs = herd.until_ready();
            answers.push((read(&msgs), rows(&msgs)));
        }
        assert_eq!(answers[0], answers[1], "{sql}");
        assert_eq!(
            answers[0].0,
            ["H", "c", "complete COPY 420", "ready I"],
            "{sql}"
        );
    }
    let mut outs = Vec::new();
    for table in ["cp", "cp_one"] {
        let stream = tokio::time::timeout(
            COPY_LIMIT,
            client.copy_out(&format!("copy {table} to stdout")),
        )
        .await
        .expect("CopyOutResponse in time")
        .expect("copy_out");
        let chunks: Vec<bytes::Bytes> = tokio::time::timeout(COPY_LIMIT, stream.try_collect())
            .await
            .expect("the COPY TO ends in time")
            .expect("copy data");
        let text: String = chunks
            .iter()
            .map(|c| String::from_utf8_lossy(c).into_owned())
            .collect();
        let mut lines: Vec<String> = text.lines().map(str::to_string).collect();
        lines.sort();
        outs.push(lines);
    }
    assert_eq!(outs[0], outs[1], "extended-protocol COPY TO STDOUT");
    // COPY (query) TO STDOUT over the distributed table: run on the general path (group 0
    // over the global relations), byte for byte one server's answer, in every format; by key,
    // on the key's group. To a server file: refused (0A000), the session goes on.
    for sql in [
        "copy (select * from CP where id > 10 order by id) to stdout",
        "copy (select id, note from CP order by note, id) to stdout with (format csv, header)",
        "copy (select count(*), sum(id) from CP) to stdout (format binary)",
        "copy (select c.id, count(*) from CP c join CP d on d.note = c.note where c.id < 40 \
         group by 1 order by 1) to stdout",
        "copy (select * from CP where id = 7) to stdout (format csv)",
    ] {
        let mut answers = Vec::new();
        for table in ["cp", "cp_one"] {
            let msgs = herd.query(sql.replace("CP", table));
            let bytes: Vec<u8> = msgs
                .iter()
                .filter(|m| m.tag == b'd')
                .flat_map(|m| m.body.iter().copied())
                .collect();
            answers.push((read(&msgs), bytes));
        }
        assert!(
            answers[0] == answers[1],
            "{sql}: {:?} {:?}",
            answers[0].0,
            answers[1].0
        );
        assert_eq!(answers[0].0[0], "H", "{sql}: {:?}", answers[0].0);
    }
    let msgs = herd.query("copy (select * from cp where id > 10) to '/tmp/herd-copy-refused'");
    assert_eq!(read(&msgs), ["error 0A000", "ready I"]);
    let msgs = herd.query("select count(*) from cp");
    assert_eq!(read(&msgs), ["T", "D", "complete SELECT 1", "ready I"]);

    copy_in_spanning(&mut herd, client, groups).await;
}

/// COPY into group 0's `cp_log` inside a transaction that also wrote a row of `cp` on group 1:
/// COMMIT keeps both, a failed COPY fails the transaction and ROLLBACK ends it, as on one
/// server (where the row goes to `cp_one`). A COPY into the distributed table inside a
/// transaction is refused (0A000), and the transaction rolls back as usual.
async fn copy_in_spanning(herd: &mut Raw, client: &Client, groups: &[String]) {
    let on_1: i64 = connect(&groups[1])
        .await
        .query_one("select min(id) from cp", &[])
        .await
        .expect("a row of group 1")
        .get(0);
    let mut answers = Vec::new();
    for (table, base) in [("cp", 1000), ("cp_one", 2000)] {
        let mut got = Vec::new();
        got.extend(read(&herd.query("begin")));
        got.extend(read(&herd.query(format!(
            "update {table} set note = 'spanning' where id = {on_1}"
        ))));
        got.extend(read(&copy_in_simple(
            herd,
            "copy cp_log from stdin",
            &text_rows(base..base + 30),
            None,
        )));
        got.extend(read(&herd.query("commit")));
        // Failed: a duplicate key in the COPY; ROLLBACK undoes the UPDATE too.
        got.extend(read(&herd.query("begin")));
        got.extend(read(&herd.query(format!(
            "update {table} set note = 'rolled back' where id = {on_1}"
        ))));
        got.extend(read(&copy_in_simple(
            herd,
            "copy cp_log from stdin",
            &text_rows(base + 29..base + 31),
            None,
        )));
        got.extend(read(&herd.query("rollback")));
        answers.push(got);
    }
    assert_eq!(
        answers[0], answers[1],
        "Herd across groups, then one server"
    );
    assert_eq!(
        answers[0].iter().filter(|a| *a == "ready I").count(),
        2,
        "{:?}",
        answers[0]
    );
    assert!(answers[0].contains(&"error 23505".to_string()));
    same_rows(client, "COPY inside a transaction spanning groups").await;
    let logged: i64 = client
        .query_one("select count(*) from cp_log", &[])
        .await
        .expect("count")
        .get(0);
    assert_eq!(logged, 60);
    // The same through the extended protocol (tokio-postgres): the COPY's end waits for its
    // Sync, then COMMIT ends both groups' parts.
    client.batch_execute("begin").await.expect("begin");
    client
        .execute(
            &format!("update cp set note = 'extended' where id = {on_1}"),
            &[],
        )
        .await
        .expect("a row of group 1");
    let mut sink = Box::pin(
        client
            .copy_in::<_, bytes::Bytes>("copy cp_log from stdin")
            .await
            .expect("copy_in in a spanning transaction"),
    );
    sink.send(bytes::Bytes::from(text_rows(4000..4010).concat()))
        .await
        .expect("send");
    let n = tokio::time::timeout(COPY_LIMIT, sink.as_mut().finish())
        .await
        .expect("the COPY ends in time")
        .expect("finish");
    assert_eq!(n, 10);
    tokio::time::timeout(COPY_LIMIT, client.batch_execute("commit"))
        .await
        .expect("COMMIT in time")
        .expect("COMMIT of a transaction spanning groups after an extended COPY");
    let note: String = client
        .query_one(&format!("select note from cp where id = {on_1}"), &[])
        .await
        .expect("group 1's part committed")
        .get(0);
    let logged: i64 = client
        .query_one("select count(*) from cp_log where id >= 4000", &[])
        .await
        .expect("group 0's part committed")
        .get(0);
    assert_eq!((note.as_str(), logged), ("extended", 10));
    // COPY into the distributed table inside a block: refused before the copy starts.
    herd.query("begin");
    let got = read(&copy_in_simple(
        herd,
        "copy cp from stdin",
        &text_rows(3000..3001),
        None,
    ));
    assert_eq!(got, ["error 0A000", "ready E"], "{got:?}");
    assert_eq!(
        read(&herd.query("rollback")),
        ["complete ROLLBACK", "ready I"]
    );
    assert_eq!(
        read(&herd.query("select 1")),
        ["T", "D", "complete SELECT 1", "ready I"]
    );
}
