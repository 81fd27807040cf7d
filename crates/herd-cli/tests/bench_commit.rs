//! `herd bench commit-modes --quick` and `herd bench commit-waits --quick`: scratch clusters come
//! up, every commit mode runs, and results.json has the documented shape. No speed is asserted.

use std::process::Command;

use serde_json::Value;

/// Runs `herd bench SCENARIO --quick --out TMP`; results.json, after checking the other files.
fn quick(scenario: &str) -> Value {
    let out = herd_testkit::scratch_dir();
    let run = Command::new(env!("CARGO_BIN_EXE_herd"))
        .args(["bench", scenario, "--quick", "--out"])
        .arg(out.path())
        .output()
        .expect("running herd bench");
    assert!(run.status.success(), "{}", herd_testkit::describe(&run));
    for file in ["report.md".to_string(), format!("{scenario}.svg")] {
        let meta = std::fs::metadata(out.path().join(&file)).expect("report file");
        assert!(meta.len() > 0, "{file} is empty");
    }
    let text = std::fs::read_to_string(out.path().join("results.json")).expect("results.json");
    let results: Value = serde_json::from_str(&text).expect("results.json is JSON");
    assert_eq!(results["scenario"], scenario);
    assert_eq!(results["quick"], true);
    results
}

fn median(modes: &Value, mode: &str, target: &str) -> f64 {
    modes[mode][target]["median_tps"]
        .as_f64()
        .unwrap_or_else(|| panic!("{mode}/{target} missing in {modes}"))
}

#[test]
fn quick_commit_modes_bench() {
    let r = quick("commit-modes");
    let modes = &r["modes"];
    for mode in [
        "none",
        "async",
        "remote_write",
        "on",
        "remote_apply",
        "session",
    ] {
        let rows = median(modes, mode, "rows");
        assert!(rows > 0.0, "{mode}: rows/s {rows}");
        let ratio = modes[mode]["rows"]["ratio_to_direct"]
            .as_f64()
            .expect("ratio");
        assert!(ratio > 0.0, "{mode}: ratio {ratio}");
        assert_eq!(modes[mode]["rows"]["failed_transactions"], 0, "{mode}");
    }
    assert!(
        (modes["none"]["rows"]["ratio_to_direct"]
            .as_f64()
            .expect("ratio")
            - 1.0)
            .abs()
            < 1e-9
    );
    assert_eq!(r["published"].as_object().map(|p| p.len()), Some(6));
}

#[test]
fn quick_commit_waits_bench() {
    let r = quick("commit-waits");
    let modes = &r["modes"];
    for mode in ["async", "remote_write", "on", "remote_apply"] {
        assert!(median(modes, mode, "tps") > 0.0, "{mode}: tps");
        assert!(median(modes, mode, "latency_ms") > 0.0, "{mode}: latency");
        assert!(
            median(modes, mode, "sample_hz") > 0.0,
            "{mode}: sampling rate"
        );
        let targets = modes[mode].as_object().expect(mode);
        for event in ["IO:WALSync", "IPC:SyncRep", "LWLock:WALWrite", "CPU"] {
            assert!(
                targets.contains_key(&format!("wait:{event}")),
                "{mode}: {event}"
            );
        }
        let sum: f64 = targets
            .iter()
            .filter(|(k, _)| k.starts_with("wait:"))
            .map(|(_, t)| t["median_tps"].as_f64().expect("share"))
            .sum();
        assert!((sum - 1.0).abs() < 1e-6, "{mode}: shares sum to {sum}");
    }
}
