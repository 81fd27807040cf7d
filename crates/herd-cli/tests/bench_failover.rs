//! `herd bench failover --quick`: a scratch cluster in commit mode `on` loses its primary twice
//! (kill -9 of the postmaster) under writes through the proxy; every acknowledged write must be
//! on the new primary, and the three report files are written. No RTO bound is asserted here.
//! `--hosts 3 --quick`: three network-namespace hosts with default agent settings lose the
//! primary's host once to a power loss and once to a partition. `--hosts 3 --shards 2
//! --quick`: a sharded cluster (two agents per host, one per group) loses the host of group
//! 1's primary once while both groups are written.

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

#[test]
fn quick_failover_bench_on_three_hosts() {
    if !herd_testkit::netns::Lab::available() {
        eprintln!("SKIPPED: `herd bench failover --hosts 3` needs root and `ip netns`");
        return;
    }
    let herd_testkit::QuickBench { out, results, text } = herd_testkit::quick_bench_with(
        env!("CARGO_BIN_EXE_herd"),
        "failover",
        &["--hosts", "3"],
        "failover-hosts",
    );
    let faults = results["failover"].as_object().expect("failover figures");
    assert_eq!(
        faults.keys().collect::<Vec<_>>(),
        ["host-killed", "host-partitioned"],
        "{text}"
    );
    for (fault, f) in faults {
        assert_eq!(f["iterations"], 1, "{fault}: {text}");
        assert_eq!(f["lost"], 0, "{fault}: acknowledged writes lost: {text}");
        assert_eq!(f["two_writable"], 0, "{fault}: two writable nodes: {text}");
        assert!(f["acked"].as_u64().expect("acked") > 0, "{text}");
        // A new leader only once the old lease expired (10 s by default); generous upper bound.
        let rto = f["rto_p50_s"].as_f64().expect("rto");
        assert!(rto > 0.0 && rto < 60.0, "{fault}: RTO {rto}: {text}");
    }
    let window = &faults["host-partitioned"]["writable_window_s"];
    let window = window
        .as_array()
        .and_then(|w| w.first())
        .and_then(|w| w.as_f64());
    let window = window.expect("the isolated primary's window was measured");
    // It fences TTL − margin (7.5 s) after its last renewal, before the 10 s lease can expire.
    assert!(
        window < 10.0,
        "the isolated primary accepted writes {window} s after the cut (the lease lives 10 s)"
    );
    let report = std::fs::read_to_string(out.path().join("report.md")).expect("report.md");
    assert!(report.contains("| host-killed | 1 |"), "{report}");
    assert!(report.contains("Patroni"), "{report}");
    for file in ["hosts-h0.log", "hosts-proxy.log"] {
        assert!(out.path().join(file).exists(), "{file} kept");
    }
}

#[test]
fn quick_failover_bench_on_sharded_hosts() {
    if !herd_testkit::netns::Lab::available() {
        eprintln!("SKIPPED: `herd bench failover --hosts 3 --shards 2` needs root and `ip netns`");
        return;
    }
    let herd_testkit::QuickBench { out, results, text } = herd_testkit::quick_bench_with(
        env!("CARGO_BIN_EXE_herd"),
        "failover",
        &["--hosts", "3", "--shards", "2"],
        "failover-shards",
    );
    let faults = results["failover"].as_object().expect("failover figures");
    assert_eq!(
        faults.keys().collect::<Vec<_>>(),
        ["group-1-host-killed"],
        "{text}"
    );
    let f = &faults["group-1-host-killed"];
    assert_eq!(f["iterations"], 1, "{text}");
    assert_eq!(f["lost"], 0, "acknowledged writes lost: {text}");
    assert_eq!(
        f["two_writable"], 0,
        "two writable members of a group: {text}"
    );
    assert!(f["acked"].as_u64().expect("acked") > 0, "{text}");
    // Group 1 gets a new leader only once the old lease expired (10 s by default); a
    // write acknowledged by the killed primary itself does not count, so not ~0 either.
    let rto = f["rto_p50_s"].as_f64().expect("rto");
    assert!(rto > 1.0 && rto < 60.0, "group 1 RTO {rto}: {text}");
    let other = &f["other_group"][0];
    let before = other["before_wps"].as_f64().expect("before_wps");
    assert!(
        before > 0.0,
        "group 0 wrote nothing before the fault: {text}"
    );
    assert!(other["during_wps"].as_f64().is_some(), "{text}");
    let report = std::fs::read_to_string(out.path().join("report.md")).expect("report.md");
    assert!(report.contains("| group-1-host-killed | 1 |"), "{report}");
    assert!(report.contains("2-core noisy machine"), "{report}");
    for file in ["hosts-h0g0.log", "hosts-h2g1.log", "hosts-proxy.log"] {
        assert!(out.path().join(file).exists(), "{file} kept");
    }
}
