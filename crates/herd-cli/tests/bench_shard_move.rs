//! `herd bench shard-move --quick`: a two-group scratch cluster comes up, the table loads on
//! both groups, one shard moves under write load on the moved and other shards, and
//! results.json and report.md have the documented shape: the move's total time, Herd's switch
//! wait, the writes' longest waits, and no failed write on the other shards. No speed is
//! asserted.

#[test]
fn quick_shard_move_bench() {
    let herd_testkit::QuickBench {
        out,
        results: r,
        text,
    } = herd_testkit::quick_bench(env!("CARGO_BIN_EXE_herd"), "shard-move");
    let m = &r["shard_move"];
    assert_eq!(m["rows"], 200_000, "{m}");
    assert!(m["moved_rows"].as_u64().unwrap_or(0) > 1000, "{m}");
    assert!(m["table_bytes"].as_u64().unwrap_or(0) > 10 << 20, "{m}");
    let moves = m["moves"].as_array().expect("moves");
    assert_eq!(moves.len(), 1, "{m}");
    let mv = &moves[0];
    assert_eq!(mv["groups"], "0 → 1");
    let wait = mv["herd_wait_ms"].as_f64().expect("Herd's wait");
    assert!(wait > 0.0 && wait < 5000.0, "{mv}");
    assert!(mv["total_s"].as_f64().unwrap_or(0.0) > 0.0, "{mv}");
    // Writes went on during the move on both kinds of shards, and none on the others failed.
    assert!(mv["transactions"][0].as_u64().unwrap_or(0) > 0, "{mv}");
    assert!(mv["transactions"][1].as_u64().unwrap_or(0) > 0, "{mv}");
    assert_eq!(mv["failed"][1], 0, "{mv}");
    assert!(mv["moved_max_ms"].as_f64().unwrap_or(0.0) > 0.0, "{mv}");
    let report = std::fs::read_to_string(out.path().join("report.md")).expect("report.md");
    assert!(report.contains("| 0 → 1 |"), "{report}\n{text}");
    assert!(out.path().join("shard-move.svg").exists());
}
