//! `herd bench commit-modes --quick` and `herd bench commit-waits --quick`: scratch clusters come
//! up, every commit mode runs, and results.json has the documented shape. No speed is asserted.

use serde_json::Value;

/// Runs `herd bench SCENARIO --quick`; results.json (the other files checked).
fn quick(scenario: &str) -> Value {
    herd_testkit::quick_bench(env!("CARGO_BIN_EXE_herd"), scenario).results
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
