//! Real client drivers through the endpoint: psycopg 3 and node-postgres run their checks
//! (transactions, prepared statements, COPY, cancel, errors, large results, read-your-writes,
//! pipelining) in `tests/drivers/` against a fresh cluster. The drivers are installed by
//! `scripts/install-deps`; a missing driver fails the test rather than skipping it.

mod common;

use common::cluster;
use common::process::{node_checks, psycopg_checks};

#[test]
fn psycopg3_through_the_endpoint() {
    let c = cluster();
    c.up(&["--commit-mode", "async"]);
    let (ok, output) = psycopg_checks(&c.url(&[]), &c.url(&["--primary"]));
    assert!(ok, "psycopg checks failed: {output}\n{}", c.log_tails());
    println!("{output}");
}

#[test]
fn node_postgres_through_the_endpoint() {
    let c = cluster();
    c.up(&["--commit-mode", "async"]);
    let (ok, output) = node_checks(&c.url(&[]), &c.url(&["--primary"]));
    assert!(
        ok,
        "node-postgres checks failed: {output}\n{}",
        c.log_tails()
    );
    println!("{output}");
}
