//! `herd bench lag --quick`: a 1-replica scratch cluster runs TPC-B on its primary alone, then
//! with select-only readers on the replica directly and through Herd's read pool (default and
//! tight limits); results.json has every phase with sane lag percentiles, tps and routing. No
//! speed or lag bound is asserted.

use serde_json::Value;

const PHASES: [&str; 4] = [
    "primary-alone",
    "replica-direct",
    "herd-pool",
    "herd-pool-tight",
];

fn f(v: &Value, what: &str) -> f64 {
    v.as_f64()
        .unwrap_or_else(|| panic!("{what} missing or not a number"))
}

#[test]
fn quick_lag_bench() {
    let herd_testkit::QuickBench {
        out: _out,
        results: r,
        text,
    } = herd_testkit::quick_bench(env!("CARGO_BIN_EXE_herd"), "lag");
    assert_eq!(r["settings"]["modes"], serde_json::json!(PHASES), "{text}");

    for phase in PHASES {
        let l = &r["lag"][phase];
        assert!(l.is_object(), "{phase} missing in lag: {text}");
        let samples = l["samples"].as_u64().expect("samples");
        // 3 s at 10 Hz: generous bounds for a loaded machine.
        assert!(samples >= 5, "{phase}: {samples} samples");
        assert_eq!(
            l["series"].as_array().map(Vec::len),
            Some(samples as usize),
            "{phase}"
        );
        let hz = f(&l["sample_hz"], "sample_hz");
        assert!(hz > 1.0 && hz < 12.0, "{phase}: {hz} Hz");
        for q in ["bytes", "time_ms", "replay_lag_ms"] {
            let (p50, p95, max) = (f(&l[q]["p50"], q), f(&l[q]["p95"], q), f(&l[q]["max"], q));
            assert!(
                0.0 <= p50 && p50 <= p95 && p95 <= max,
                "{phase} {q}: {p50} {p95} {max}"
            );
        }
        let writer = &r["modes"][phase]["writer"];
        assert!(f(&writer["median_tps"], "writer tps") > 0.0, "{phase}");
        assert_eq!(writer["failed_transactions"], 0, "{phase}");
        let reader = &r["modes"][phase]["reader"];
        if phase == "primary-alone" {
            assert!(reader.is_null(), "{phase} has no readers: {text}");
            assert_eq!(l["reader"], "none");
            continue;
        }
        assert!(f(&reader["median_tps"], "reader tps") > 0.0, "{phase}");
        assert_eq!(reader["failed_transactions"], 0, "{phase}");
        if phase.starts_with("herd-pool") {
            assert_eq!(l["reader"], "herd");
            let routed = l["reads_to_replica"].as_u64().expect("reads_to_replica")
                + l["reads_to_primary"].as_u64().expect("reads_to_primary");
            assert!(routed > 0, "{phase}: no reads routed: {text}");
            assert!(l["pool_exits"].as_u64().is_some(), "{phase}");
            let share = f(&l["in_pool_share"], "in_pool_share");
            assert!((0.0..=1.0).contains(&share), "{phase}: {share}");
            assert!(l["read_pool_limits"].as_str().is_some(), "{phase}");
        } else {
            assert_eq!(l["reader"], "replica");
            assert!(l["reads_to_replica"].is_null(), "{phase}");
        }
    }
    assert_eq!(
        r["lag"]["herd-pool-tight"]["read_pool_limits"], "1 MiB / 100 ms",
        "{text}"
    );
    assert_eq!(r["published"].as_object().map(|p| p.len()), Some(4));
}
