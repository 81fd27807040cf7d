//! `herd bench bandwidth --quick`: a publisher with a hot standby and a subscriber cluster come
//! up, every workload runs under every wal_compression setting, and results.json carries
//! positive byte counts for both streams, and the copies made with `herd copy` send fewer bytes
//! with a row filter or a column list than whole. No speed is asserted.

#[test]
fn quick_bandwidth_bench() {
    let herd_testkit::QuickBench {
        out,
        results: r,
        text,
    } = herd_testkit::quick_bench(env!("CARGO_BIN_EXE_herd"), "bandwidth");
    let rows = r["bandwidth"].as_array().expect("bandwidth rows");
    let workloads = [
        "pgbench-checkpoint",
        "pgbench",
        "bulk-insert",
        "single-commits",
    ];
    assert_eq!(rows.len(), workloads.len() * 3, "{text}");
    for workload in workloads {
        for compression in ["off", "lz4", "zstd"] {
            let row = rows
                .iter()
                .find(|x| x["workload"] == workload && x["wal_compression"] == compression)
                .unwrap_or_else(|| panic!("{workload}/{compression} missing in {text}"));
            let what = format!("{workload}/{compression}");
            assert!(row["units"].as_u64().unwrap_or(0) > 0, "{what}: units");
            assert!(row["wal_bytes"].as_u64().unwrap_or(0) > 0, "{what}: WAL");
            for stream in ["physical", "logical"] {
                for counter in ["socket_bytes", "sent_lsn_bytes"] {
                    let n = row[stream][counter].as_u64().unwrap_or(0);
                    assert!(n > 0, "{what}: {stream} {counter} = {n}");
                }
            }
            let ratio = row["ratio_logical_to_physical"].as_f64().unwrap_or(0.0);
            assert!(ratio > 0.0 && ratio.is_finite(), "{what}: ratio {ratio}");
        }
    }
    // The copies made with `herd copy`: each sends bytes, a filter or a column list fewer than
    // the whole table (one transaction each, so this is a count, not a timing).
    let copies = r["copy_bandwidth"].as_array().expect("copy_bandwidth rows");
    let bytes = |what: &str| {
        let row = copies
            .iter()
            .find(|c| c["copy"] == what)
            .unwrap_or_else(|| panic!("copy {what} missing in {text}"));
        assert!(
            row["physical_bytes"].as_u64().unwrap_or(0) > 0,
            "{what}: physical"
        );
        row["copy_bytes"].as_u64().unwrap_or(0)
    };
    let whole = bytes("whole table");
    assert!(whole > 0, "{text}");
    assert!(bytes("10 % of rows") < whole / 2, "{text}");
    assert!(bytes("2 of 5 columns") < whole, "{text}");
    let md = std::fs::read_to_string(out.path().join("report.md")).expect("report.md");
    assert!(md.contains("Logical copies made with `herd copy`"), "{md}");
    assert!(md.contains("| bulk-insert | zstd |"), "{md}");
    assert!(md.contains("reference 004"), "{md}");
}
