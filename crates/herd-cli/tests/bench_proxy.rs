//! `herd bench proxy --quick`: a scratch cluster comes up, pgbench runs against the primary and
//! through Herd (and PgBouncer when installed), and the three report files are written.
//! No speed is asserted: only that every run worked.

#[test]
fn quick_proxy_bench_writes_reports() {
    let herd_testkit::QuickBench { out, results, text } =
        herd_testkit::quick_bench(env!("CARGO_BIN_EXE_herd"), "proxy");
    for mode in ["simple", "prepared"] {
        let targets = results["modes"][mode].as_object().expect(mode);
        for name in ["direct", "herd", "herd-primary", "replica", "forwarder"] {
            assert!(
                targets.contains_key(name),
                "{name} missing in {mode}: {text}"
            );
        }
        for (name, t) in targets {
            let tps = t["median_tps"].as_f64().expect("median_tps");
            assert!(tps > 0.0, "{mode}/{name}: tps {tps}");
            assert_eq!(t["failed_transactions"], 0, "{mode}/{name}");
            assert!(!t["runs"].as_array().expect("runs").is_empty());
        }
    }
    for file in ["report.md", "proxy.svg"] {
        let meta = std::fs::metadata(out.path().join(file)).expect(file);
        assert!(meta.len() > 0, "{file} is empty");
    }
}
