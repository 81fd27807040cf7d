//! The differential test (issue #38, "never a wrong answer across shard groups"): generated
//! statements run through Herd's endpoint on a 2-group cluster and on one plain PostgreSQL 15
//! server loaded with the same rows, and the answers are compared. Herd's 0A000 counts as
//! "refused"; any other difference is "wrong", and the test fails on any wrong answer.
//!
//! Statements come from a seeded grammar (`differential/gen.rs`, `shapes.rs`, `known.rs`,
//! `edges.rs`, `joined_writes.rs`: UPDATE … FROM, DELETE … USING and CTEs moving rows; `views.rs`:
//! reads of views over distributed tables) over distributed, co-located, reference and local tables
//! (`differential/schema.rs`). Each runs on both servers in the simple protocol (parameters
//! inlined as literals, text results) and, when it has parameters, in four extended modes: a
//! named statement with server-inferred types, one prepared with declared int2/int4/int8/text
//! types and binary parameters, the same with text-format parameters, and an unnamed
//! Parse/Bind/Describe/Execute pipeline (binary results throughout); reads also run through a
//! portal fetched 3 rows at a time, pipelined with other statements, and with text parameters
//! and text results on a bare protocol connection (`differential/send.rs`, `rawtext.rs`). The
//! verdicts and the report are in `differential/compare.rs`, the driving of cases and the
//! catalog/COPY probes in `differential/run.rs`, the plain server in `differential/plain.rs`.
//! The wrong-answer classes found so far are written up in `docs/differential-findings.md`. No new
//! dependency: the PRNG is a hand-written xorshift.
//!
//! Bounded by default (seed 38, at most 3000 cases or 90 s of generation). For longer runs set
//! `HERD_DIFF_MINUTES` (then the case limit is lifted unless `HERD_DIFF_CASES` is set) and
//! `HERD_DIFF_SEED`, or use `scripts/differential --minutes N --seed S`. `HERD_DIFF_REPORT`
//! names a file the full report is also written to; `HERD_DIFF_SHOW` how many wrong answers it
//! shows (60; the first of each class and mode first).

#[path = "common/mod.rs"]
mod common;
#[path = "differential/compare.rs"]
mod compare;
#[path = "differential/edges.rs"]
mod edges;
#[path = "differential/gen.rs"]
mod gen;
#[path = "differential/joined_writes.rs"]
mod joined_writes;
#[path = "differential/known.rs"]
mod known;
#[path = "differential/plain.rs"]
mod plain;
#[path = "differential/rawtext.rs"]
mod rawtext;
#[path = "differential/run.rs"]
mod run;
#[path = "differential/schema.rs"]
mod schema;
#[path = "differential/send.rs"]
mod send;
#[path = "differential/shapes.rs"]
mod shapes;
#[path = "differential/views.rs"]
mod views;

use std::time::{Duration, Instant};

use common::cluster;
use compare::Tally;
use run::{Pair, Side};

/// How long and from which seed to generate.
struct Budget {
    seed: u64,
    cases: u64,
    time: Duration,
}

impl Budget {
    /// From `HERD_DIFF_SEED`, `HERD_DIFF_MINUTES`, `HERD_DIFF_CASES` (bad values are a test
    /// failure, not silently ignored).
    fn from_env() -> Budget {
        let var = |name: &str| -> Option<u64> {
            std::env::var(name).ok().map(|v| {
                v.trim()
                    .parse()
                    .unwrap_or_else(|_| panic!("{name}={v} is not a whole number"))
            })
        };
        let minutes = var("HERD_DIFF_MINUTES");
        Budget {
            seed: var("HERD_DIFF_SEED").unwrap_or(38),
            cases: var("HERD_DIFF_CASES").unwrap_or(if minutes.is_some() {
                u64::MAX
            } else {
                3000
            }),
            time: minutes.map_or(Duration::from_secs(90), |m| Duration::from_secs(m * 60)),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn answers_as_one_server() {
    let budget = Budget::from_env();
    let c = cluster();
    c.up(&["--shards", "2", "--replicas", "0"]);
    let reference = plain::Plain::start().await;
    let mut pair = Pair {
        herd: Side::connect(c.url(&[])).await,
        plain: Side::connect(reference.url()).await,
    };
    let mut tally = Tally::default();
    run::setup(&mut pair, &mut tally).await;
    let groups = [
        c.url(&["--group", "0", "--primary"]),
        c.url(&["--group", "1", "--primary"]),
    ];
    run::probes(&mut pair, &groups, &mut tally).await;

    // HERD_DIFF_TRACE=1 prints every case before it runs (to find what came before a
    // wrong answer that shows up later, as a divergent ledger does).
    let trace = std::env::var("HERD_DIFF_TRACE").is_ok_and(|v| v == "1");
    let mut generator = gen::Gen::new(budget.seed);
    let started = Instant::now();
    while tally.cases < budget.cases && started.elapsed() < budget.time {
        let case = generator.case();
        tally.cases += 1;
        for mode in run::modes(&case) {
            if trace {
                eprintln!("case {} {mode:?}: {}", tally.cases, case.script());
            }
            run::run_case(&mut pair, &case, mode, &mut tally).await;
        }
        if tally.cases % 200 == 0 {
            eprintln!(
                "differential: {} after {:?}",
                tally.summary(),
                started.elapsed()
            );
        }
    }
    let shown = std::env::var("HERD_DIFF_SHOW")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(60);
    let report = format!(
        "seed {}, {:.0} s of generation\n{}",
        budget.seed,
        started.elapsed().as_secs_f64(),
        tally.report(shown)
    );
    println!("{report}");
    if let Ok(path) = std::env::var("HERD_DIFF_REPORT") {
        std::fs::write(&path, &report).unwrap_or_else(|e| panic!("writing {path}: {e}"));
    }
    assert!(tally.cases > 0, "no case generated");
    assert_eq!(
        tally.wrong,
        0,
        "wrong answers through the endpoint: {}",
        tally.summary()
    );
}
