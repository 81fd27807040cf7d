//! `herd bench sharding --quick`: 1- and 2-group scratch clusters and the postgres_fdw baseline
//! come up, every workload runs on every target without a failed transaction (those across
//! groups — aggregates, ordered reads, transfers with two-phase commit — on all but the FDW
//! baseline), and results.json has the documented shape, with server connections per node. No
//! speed is asserted.

const TARGETS: [&str; 4] = ["1 server", "Herd 1 group", "Herd 2 groups", "FDW 2 nodes"];
const WORKLOADS: [&str; 3] = [
    "point select, simple",
    "point select, prepared",
    "bulk read (200 rows), prepared",
];
/// Sharding II's workloads: every target but the FDW baseline.
const ACROSS_GROUPS: [&str; 5] = [
    "aggregate across groups (1,000 rows), simple",
    "ORDER BY … LIMIT 100 across groups, simple",
    "transfer, 0 % across groups, simple",
    "transfer, 10 % across groups, simple",
    "transfer, 50 % across groups, simple",
];

#[test]
fn quick_sharding_bench() {
    let herd_testkit::QuickBench {
        out,
        results: r,
        text: _,
    } = herd_testkit::quick_bench(env!("CARGO_BIN_EXE_herd"), "sharding");
    let every = WORKLOADS
        .iter()
        .flat_map(|w| TARGETS.iter().map(move |t| (*w, *t)));
    let across = ACROSS_GROUPS
        .iter()
        .flat_map(|w| TARGETS[..3].iter().map(move |t| (*w, *t)));
    for (w, t) in every.chain(across) {
        {
            let x = &r["modes"][w][t];
            let tps = x["median_tps"].as_f64().unwrap_or(0.0);
            assert!(tps > 0.0, "{w}/{t}: tps {tps} in {}", r["modes"]);
            assert_eq!(x["failed_transactions"], 0, "{w}/{t}");
            if t == "1 server" {
                assert_eq!(x["ratio_to_direct"].as_f64(), Some(1.0), "{w}");
            }
        }
    }
    // Through Herd a node holds at most its pool (10) and Herd's monitoring sessions; the FDW
    // baseline's nodes hold at least their own 8 clients.
    let conns = &r["connections"];
    for node in ["node0", "g1_node0"] {
        let herd = conns["Herd 2 groups"][node].as_u64().expect("counted");
        assert!((1..=15).contains(&herd), "Herd 2 groups, {node}: {conns}");
        let fdw = conns["FDW 2 nodes"][node].as_u64().expect("counted");
        assert!(fdw >= 8, "FDW, {node}: {conns}");
    }
    let report = std::fs::read_to_string(out.path().join("report.md")).expect("report.md");
    assert!(report.contains("Reference 003"), "{report}");
    assert!(report.contains("vs Herd 1 group"), "{report}");
    assert!(
        report.contains("With 10 % of transfers across groups, Herd 2 groups ran")
            && report.contains("Two-phase commit's cost on Herd 2 groups"),
        "{report}"
    );
    for w in ACROSS_GROUPS {
        assert!(
            r["modes"][w].get("FDW 2 nodes").is_none(),
            "{w} is not run on the FDW baseline"
        );
    }
}
