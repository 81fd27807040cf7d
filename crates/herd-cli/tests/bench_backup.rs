//! `herd bench backup --quick`: a small cluster with `[backup]` on, pg_basebackup, `herd
//! backup` from the standby and from the primary, `herd restore --to latest` and a copy of a pg_basebackup each timed, the
//! primary's pgbench rate with and without backups running; results.json and report.md have
//! the documented shape and the chart exists. No speed is asserted.

#[test]
fn quick_backup_bench() {
    let herd_testkit::QuickBench {
        out,
        results: r,
        text,
    } = herd_testkit::quick_bench(env!("CARGO_BIN_EXE_herd"), "backup");
    let b = &r["backup"];
    assert_eq!(b["scale"], 5, "{b}");
    assert!(b["cluster_bytes"].as_u64().unwrap_or(0) > 50 << 20, "{b}");
    let copies = b["copies"].as_array().expect("copies");
    assert_eq!(copies.len(), 5, "{b}");
    for c in copies {
        assert!(c["median_s"].as_f64().unwrap_or(0.0) > 0.0, "{c}");
        assert!(c["mb_per_s"].as_f64().unwrap_or(0.0) > 0.0, "{c}");
        assert!(c["vs_baseline"].as_f64().unwrap_or(0.0) > 0.0, "{c}");
    }
    let load = b["load"].as_array().expect("load");
    assert_eq!(load.len(), 3, "{b}");
    assert_eq!(load[0]["during"], "no backup");
    for l in load {
        assert!(l["median_tps"].as_f64().unwrap_or(0.0) > 0.0, "{l}");
    }
    let report = std::fs::read_to_string(out.path().join("report.md")).expect("report.md");
    assert!(
        report.contains("| herd restore --to latest |"),
        "{report}\n{text}"
    );
    assert!(report.contains("| backup from the standby |"), "{report}");
    assert!(report.contains("| cp -a of a pg_basebackup |"), "{report}");
    assert!(out.path().join("backup.svg").exists());
}
