//! `herd bench proxy --quick`: a scratch cluster comes up, pgbench runs against the primary and
//! through Herd (and PgBouncer when installed), and the three report files are written.
//! No speed is asserted: only that every run worked.

use std::process::Command;

#[test]
fn quick_proxy_bench_writes_reports() {
    let out = herd_testkit::scratch_dir();
    let run = Command::new(env!("CARGO_BIN_EXE_herd"))
        .args(["bench", "proxy", "--quick", "--out"])
        .arg(out.path())
        .output()
        .expect("running herd bench");
    assert!(run.status.success(), "{}", herd_testkit::describe(&run));

    let text = std::fs::read_to_string(out.path().join("results.json")).expect("results.json");
    let results: serde_json::Value = serde_json::from_str(&text).expect("results.json is JSON");
    assert_eq!(results["scenario"], "proxy");
    assert_eq!(results["quick"], true);
    for mode in ["simple", "prepared"] {
        let targets = results["modes"][mode].as_object().expect(mode);
        for name in ["direct", "herd", "herd-primary", "replica"] {
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
