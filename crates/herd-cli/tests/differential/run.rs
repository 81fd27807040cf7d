//! Driving the comparison: the two connections (reconnected when one breaks), the set-up, each
//! case in its protocol modes, and the probes that read every group's catalog directly.

use tokio_postgres::Client;

use crate::common::try_connect;
use crate::compare::{judge, Outcome, Tally, Verdict, Wrong};
use crate::gen::Case;
use crate::schema::{self, Where};
use crate::send::{copy, error_text, simple, statement, Mode};

/// Wrong answers kept for the report.
const KEEP_WRONG: usize = 400;

/// One server's connection, remade when it has been closed (a proxy error may end it).
pub struct Side {
    url: String,
    client: Client,
    /// A bare protocol connection for the text-format mode, made when first needed.
    raw: Option<crate::common::raw::Raw>,
}

impl Side {
    /// Connects to `url`; panics when the server cannot be reached at all.
    pub async fn connect(url: String) -> Side {
        let client = try_connect(&url)
            .await
            .unwrap_or_else(|| panic!("cannot connect to {url}"));
        Side {
            url,
            client,
            raw: None,
        }
    }

    /// Runs the case on the bare text-format connection (blocking this worker briefly).
    pub fn raw_text(&mut self, case: &Case) -> Outcome {
        let url = self.url.clone();
        let raw = self
            .raw
            .get_or_insert_with(|| crate::common::raw::Raw::connect(&url, &[]));
        tokio::task::block_in_place(|| crate::rawtext::run(raw, case))
    }

    /// The client, reconnected first if its connection has ended.
    pub async fn client(&mut self) -> &mut Client {
        if self.client.is_closed() {
            eprintln!("differential: reconnecting to {}", self.url);
            if let Some(c) = try_connect(&self.url).await {
                self.client = c;
            }
        }
        &mut self.client
    }
}

/// Both connections.
pub struct Pair {
    /// Herd's endpoint.
    pub herd: Side,
    /// The plain server.
    pub plain: Side,
}

impl Pair {
    async fn simple_both(&mut self, sql: &str, command: bool) -> (Outcome, Outcome) {
        let h = simple(self.herd.client().await, sql, command).await;
        let p = simple(self.plain.client().await, sql, command).await;
        (h, p)
    }
}

/// Records a comparison, keeping the wrong answer for the report.
#[allow(clippy::too_many_arguments)]
fn note(
    tally: &mut Tally,
    case: &Case,
    mode: Mode,
    step: &str,
    herd: Outcome,
    plain: Outcome,
    ordered: bool,
) -> Verdict {
    let v = judge(&herd, &plain, ordered);
    tally.record(case.class, v);
    if v == Verdict::Wrong {
        tally.symptom(case.class, mode, &herd, &plain);
    }
    if v == Verdict::Wrong && tally.wrongs.len() < KEEP_WRONG {
        tally.wrongs.push(Wrong {
            class: case.class,
            mode,
            script: case.script(),
            step: step.to_string(),
            herd,
            plain,
        });
    }
    v
}

/// Loads the schema on both servers. Set-up statements whose outcomes differ are counted as
/// wrong (class "setup"); statements for Herd alone must succeed.
pub async fn setup(pair: &mut Pair, tally: &mut Tally) {
    for (sql, place) in schema::setup() {
        match place {
            Where::HerdOnly => {
                let h = simple(pair.herd.client().await, &sql, false).await;
                assert!(
                    matches!(h, Outcome::Rows(_)),
                    "set-up on Herd: {sql}: {h:?}"
                );
            }
            Where::Both => {
                let (h, p) = pair.simple_both(&sql, true).await;
                // A refused load would make every later answer meaningless.
                assert!(
                    judge(&h, &p, false) != Verdict::Refused,
                    "set-up refused by Herd: {sql}: {h:?}"
                );
                let case = Case {
                    class: "setup",
                    sql: sql.clone(),
                    ..Case::default()
                };
                note(tally, &case, Mode::Simple, &sql, h, p, false);
            }
        }
    }
}

/// The modes a case runs in: always simple; with parameters, every extended mode; without,
/// the prepared one; plain reads (no steps around them) also through a portal read in parts.
pub fn modes(case: &Case) -> Vec<Mode> {
    let mut modes = if case.params.is_empty() {
        vec![Mode::Simple, Mode::Prepared]
    } else {
        vec![
            Mode::Simple,
            Mode::Prepared,
            Mode::TypedBinary,
            Mode::TypedText,
            Mode::Unnamed,
        ]
    };
    let read = case.sql.starts_with("select") || case.sql.starts_with("with x");
    if read && !case.command && case.before.is_empty() && case.check.is_empty() {
        modes.push(Mode::Portal);
        modes.push(Mode::Pipelined);
        modes.push(Mode::RawText);
    }
    if case.simple_only {
        modes.truncate(1);
    }
    modes
}

/// Runs one case in `mode` on both servers and records the verdicts. The case stops at the
/// first step that is not the same (later steps would only echo it: an aborted transaction,
/// a missing prepared statement). Whenever a step on the ledger (persistent writes) was not
/// the same, the ledger is reloaded on both servers.
pub async fn run_case(pair: &mut Pair, case: &Case, mode: Mode, tally: &mut Tally) {
    let mut verdict = steps(pair, case, mode, tally).await;
    for sql in &case.cleanup {
        let _ = pair.simple_both(sql, true).await;
    }
    // A case whose every step matched may still leave the ledger apart (a write that was
    // rolled back on one server only, or one that lands later): compared after every case.
    if verdict == Verdict::Same {
        let (h, p) = pair.simple_both(LEDGER_AFTER, false).await;
        verdict = note(tally, case, mode, LEDGER_AFTER, h, p, false);
    }
    if verdict != Verdict::Same && case.script().contains("ledger") {
        let _ = pair.simple_both("delete from ledger", true).await;
        for row in schema::ledger_rows() {
            let _ = pair.simple_both(&row, true).await;
        }
    }
}

/// The ledger as it stands after a case that touched it.
const LEDGER_AFTER: &str = "select * from ledger /* after the case */";

/// The steps of a case up to the first that is not the same; that step's verdict.
async fn steps(pair: &mut Pair, case: &Case, mode: Mode, tally: &mut Tally) -> Verdict {
    for sql in &case.before {
        let (h, p) = pair.simple_both(sql, true).await;
        if judge(&h, &p, false) != Verdict::Same {
            return note(tally, case, mode, sql, h, p, false);
        }
    }
    let (h, p) = if mode == Mode::RawText {
        (pair.herd.raw_text(case), pair.plain.raw_text(case))
    } else {
        (
            statement(pair.herd.client().await, case, mode).await,
            statement(pair.plain.client().await, case, mode).await,
        )
    };
    let main = note(tally, case, mode, &case.sql, h, p, case.ordered);
    if main != Verdict::Same {
        return main;
    }
    for sql in &case.check {
        let (h, p) = pair.simple_both(sql, false).await;
        let v = note(tally, case, mode, sql, h, p, false);
        if v != Verdict::Same {
            return v;
        }
    }
    Verdict::Same
}

/// Cluster-wide objects made through the endpoint exist on every group: each group's catalog,
/// read directly, must answer as the plain server's does. Also `create_distributed_table`
/// with bound parameters must distribute as the simple call does.
pub async fn probes(pair: &mut Pair, groups: &[String], tally: &mut Tally) {
    let made = [
        "create database diffdb",
        "create table bound_t (id bigint primary key, v int)",
    ];
    for sql in made {
        let (h, p) = pair.simple_both(sql, true).await;
        let case = Case {
            class: "probe: setup",
            sql: sql.into(),
            ..Case::default()
        };
        note(tally, &case, Mode::Simple, sql, h, p, false);
    }
    let catalog = [
        (
            "create database",
            "select datname from pg_database where datname = 'diffdb'",
        ),
        (
            "create collation",
            "select collname from pg_collation where collname = 'ci'",
        ),
        (
            "create function",
            "select proname from pg_proc where proname in ('cust_orders', 'all_orders', 'plus1')",
        ),
    ];
    for (class, sql) in catalog {
        let p = simple(pair.plain.client().await, sql, false).await;
        for (g, url) in groups.iter().enumerate() {
            let Some(direct) = try_connect(url).await else {
                panic!("cannot connect to group {g} at {url}");
            };
            let h = simple(&direct, sql, false).await;
            let case = Case {
                class: "probe: catalog on every group",
                sql: format!("{sql}   -- on group {g} directly ({class} through the endpoint)"),
                ..Case::default()
            };
            note(tally, &case, Mode::Simple, &case.sql, h, p.clone(), false);
        }
    }
    // COPY out of distributed tables, and COPY into one (rows of every group), checked by a read.
    let copy_in = "copy ledger (customer_id, seq, v, tag) from stdin";
    let rows: String = (1..=12)
        .map(|k| format!("{k}\t{}\t7\t\\N\n", 9000 + k))
        .collect();
    for (sql, data) in [
        ("copy orders to stdout", None),
        (
            "copy (select id, amount from orders where qty = 3) to stdout",
            None,
        ),
        (
            "copy customers (id, name) to stdout with (format csv)",
            None,
        ),
        (copy_in, Some(rows.as_str())),
        ("copy ledger to stdout", None),
    ] {
        let h = copy(pair.herd.client().await, sql, data).await;
        let p = copy(pair.plain.client().await, sql, data).await;
        let case = Case {
            class: "probe: copy",
            sql: sql.into(),
            ..Case::default()
        };
        note(tally, &case, Mode::Simple, sql, h, p, false);
    }
    // Herd alone: the bound call distributes, as the literal one does.
    let herd = pair.herd.client().await;
    let call = herd
        .query(
            "select herd.create_distributed_table($1, $2)",
            &[&"bound_t", &"id"],
        )
        .await;
    let kind = simple(
        herd,
        "select kind from herd.tables where table_name = 'public.bound_t'",
        false,
    )
    .await;
    let case = Case {
        class: "probe: create_distributed_table($1,$2)",
        sql: "select herd.create_distributed_table($1, $2)   -- params ('bound_t', 'id')".into(),
        check: vec!["select kind from herd.tables where table_name = 'public.bound_t'".into()],
        ..Case::default()
    };
    let call = match call {
        Ok(rows) => format!("{} row(s)", rows.len()),
        Err(e) => error_text(&e).show(1),
    };
    note(
        tally,
        &case,
        Mode::Prepared,
        &format!("the call gave {call}; then the check"),
        kind,
        Outcome::Rows(vec![vec!["distributed".into()]]),
        false,
    );
}
