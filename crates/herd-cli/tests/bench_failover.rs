//! `herd bench failover --quick`: a scratch cluster in commit mode `on` loses its primary twice
//! (kill -9 of the postmaster) under writes through the proxy; every acknowledged write must be
//! on the new primary, and the three report files are written. No RTO bound is asserted here.

#[test]
fn quick_failover_bench_loses_no_acknowledged_write() {
    let herd_testkit::QuickBench { out, results, text } =
        herd_testkit::quick_bench(env!("CARGO_BIN_EXE_herd"), "failover");
    let modes = results["failover"].as_object().expect("failover figures");
    assert_eq!(modes.keys().collect::<Vec<_>>(), ["on"], "{text}");
    let on = &modes["on"];
    assert_eq!(on["iterations"], 2, "{text}");
    assert_eq!(on["rto_s"].as_array().map(Vec::len), Some(2), "{text}");
    let log = std::fs::read_to_string(out.path().join("herd-on.log")).unwrap_or_default();
    assert_eq!(on["lost"], 0, "acknowledged writes lost: {text}\n{log}");
    assert!(on["acked"].as_u64().expect("acked") > 0, "{text}");
    for key in ["rto_p50_s", "rto_p95_s", "rto_max_s"] {
        let v = on[key].as_f64().expect(key);
        assert!(v > 0.0, "{key} = {v}: {text}");
    }
    for file in ["report.md", "failover.svg", "herd-on.log"] {
        let meta = std::fs::metadata(out.path().join(file)).expect(file);
        assert!(meta.len() > 0, "{file} is empty");
    }
    let report = std::fs::read_to_string(out.path().join("report.md")).expect("report.md");
    assert!(report.contains("| on | 2 |"), "{report}");
}
