//! `herd bench read-scaling --quick`: 1- and 3-node scratch clusters come up, every query runs
//! through the proxy on each, and results.json has the documented shape. No speed is asserted.

const TARGETS: [&str; 5] = [
    "mix",
    "lastpoint",
    "max-1h-8-hosts",
    "high-cpu-10m",
    "avg-5m-all-hosts",
];

#[test]
fn quick_read_scaling_bench() {
    let herd_testkit::QuickBench {
        out: _out,
        results: r,
        text: _,
    } = herd_testkit::quick_bench(env!("CARGO_BIN_EXE_herd"), "read-scaling");

    let modes = &r["modes"];
    for mode in ["1 node", "3 nodes"] {
        for target in TARGETS {
            let t = &modes[mode][target];
            let qps = t["median_tps"].as_f64().unwrap_or(0.0);
            assert!(qps > 0.0, "{mode}/{target}: qps {qps} in {modes}");
            let ratio = t["ratio_to_direct"].as_f64().unwrap_or(0.0);
            assert!(ratio > 0.0, "{mode}/{target}: ratio {ratio}");
            assert_eq!(t["failed_transactions"], 0, "{mode}/{target}");
            if mode == "1 node" {
                assert!(
                    (ratio - 1.0).abs() < 1e-9,
                    "{target}: baseline ratio {ratio}"
                );
            }
        }
    }

    // Where the reads went: the only node with 1 node; every node with 3 nodes (the scenario
    // runs with proxy.read_from_primary = true).
    let s = &r["read_scaling"];
    assert_eq!(s["serving_nodes"]["1 node"], 1, "{s}");
    assert!(
        s["serving_nodes"]["3 nodes"].as_u64().unwrap_or(0) >= 2,
        "{s}"
    );
    let three = s["routed"]["3 nodes"].as_object().expect("routed per node");
    assert_eq!(three.len(), 3, "{s}");
    for node in ["node0", "node1", "node2"] {
        assert!(three[node].as_u64().unwrap_or(0) > 0, "{node}: {s}");
    }
    // Confinement is reported either way, and consistently.
    let confined = s["confined"].as_bool().expect("confined");
    let cpus = s["cpu_per_node"].as_f64().expect("cpu_per_node");
    assert_eq!(confined, cpus > 0.0, "{s}");
    assert!(!s["confinement"].as_str().unwrap_or("").is_empty(), "{s}");
    let notes = r["notes"].to_string();
    assert_eq!(!confined, notes.contains("NOT confined"), "{notes}");
    assert!(
        r["published"]["3 nodes"]
            .as_str()
            .is_some_and(|p| p.contains("2.5x")),
        "{}",
        r["published"]
    );
}
