//! `herd bench proxy --quick`: a scratch cluster comes up, pgbench runs against the primary and
//! through Herd (and PgBouncer when installed) in every mode — simple, extended, prepared, a
//! connection per transaction, many clients, and 16 and many clients again with pgbench on
//! cores of its own — the proxies' CPU, context switches and memory
//! are read from /proc (and pgbench's own CPU from its parent's children's times), and the
//! three report files are written. No speed is asserted: only that every run worked and every
//! figure was taken.

/// The modes every run has: pgbench's three protocols and the two pooler shapes.
const MODES: [&str; 5] = [
    "simple",
    "extended",
    "prepared",
    "connect per transaction (-C)",
    "many clients",
];

#[test]
fn quick_proxy_bench_writes_reports() {
    let herd_testkit::QuickBench { out, results, text } =
        herd_testkit::quick_bench(env!("CARGO_BIN_EXE_herd"), "proxy");
    for mode in ["simple", "extended", "prepared"] {
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
    // The pooler shapes: a connection per transaction through every pooler and directly, and
    // 100 clients (the quick run's "many") through Herd and PgBouncer.
    let connect = results["modes"]["connect per transaction (-C)"]
        .as_object()
        .expect("-C mode");
    for name in ["direct", "herd-primary", "forwarder"] {
        let tps = connect[name]["median_tps"].as_f64().unwrap_or(0.0);
        assert!(tps > 0.0, "-C on {name}: {text}");
    }
    let many = results["modes"]["many clients"]
        .as_object()
        .expect("many-clients mode");
    let herd = &many["herd-primary"];
    assert!(herd["median_tps"].as_f64().unwrap_or(0.0) > 0.0, "{text}");
    assert_eq!(herd["failed_transactions"], 0, "{text}");
    // The generator apart (pgbench on cores of its own): both shapes through Herd, and the
    // ratio of the two in a note; a machine with one core says why there is none.
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let report = std::fs::read_to_string(out.path().join("report.md")).expect("report.md");
    if cores >= 2 {
        for mode in [
            "16 clients, generator apart",
            "many clients, generator apart",
        ] {
            let herd = &results["modes"][mode]["herd-primary"];
            assert!(
                herd["median_tps"].as_f64().unwrap_or(0.0) > 0.0,
                "{mode}: {text}"
            );
            assert_eq!(herd["failed_transactions"], 0, "{mode}: {text}");
        }
        assert!(
            report.contains("With the load generator apart — pgbench on core(s)"),
            "{report}"
        );
    } else {
        assert!(report.contains("cannot be kept apart"), "{report}");
    }
    // What the proxies cost, read from /proc: CPU and context switches per transaction.
    let costs = &results["process_costs"];
    for mode in MODES {
        let c = &costs[mode]["herd-primary"];
        let cpu = c["cpu_us_per_txn"].as_f64().unwrap_or(0.0);
        assert!(cpu > 0.0, "{mode}: Herd's CPU per transaction {c}");
        // Its user-space part: the proxy's own code, a part of the whole (clock ticks of
        // 10 ms: zero is possible in a short run, more than the whole is not).
        let user = c["user_us_per_txn"].as_f64().expect("user_us_per_txn");
        assert!((0.0..=cpu).contains(&user), "{mode}: user space {c}");
        assert!(
            c["switches_per_txn"].as_f64().unwrap_or(0.0) > 0.0,
            "{mode}: {c}"
        );
        assert!(c["rss_mib"].as_f64().unwrap_or(0.0) > 1.0, "{mode}: {c}");
        // The load generator's own CPU over the same runs (pgbench is this bench's child).
        assert!(
            c["pgbench_cpu_us_per_txn"].as_f64().unwrap_or(0.0) > 0.0,
            "{mode}: pgbench's CPU per transaction {c}"
        );
        // The whole machine's busy CPU over the same runs holds pgbench's and the proxy's
        // (a tenth off for the clock ticks each figure is counted in).
        let machine = c["machine_cpu_us_per_txn"].as_f64().unwrap_or(0.0);
        let pgbench = c["pgbench_cpu_us_per_txn"].as_f64().unwrap_or(0.0);
        assert!(
            machine >= 0.9 * (cpu + pgbench),
            "{mode}: the machine's CPU per transaction {c}"
        );
    }
    assert!(report.contains("CPU µs / transaction"), "{report}");
    assert!(report.contains("of which user space"), "{report}");
    // With PgBouncer in the run, the forwarder's ratio to it is printed as the floor of a hop.
    if results["modes"]["simple"].get("pgbouncer").is_some() {
        assert!(
            report.contains("the plain forwarder — one hop on tokio"),
            "{report}"
        );
    }
    assert!(
        report.contains("machine's CPU µs / transaction"),
        "{report}"
    );
    assert!(
        report.contains("Memory per client connection on herd-primary"),
        "{report}"
    );
    targets_checked(&results, &report, false, cores >= 2);
    for file in ["report.md", "proxy.svg"] {
        let meta = std::fs::metadata(out.path().join(file)).expect(file);
        assert!(meta.len() > 0, "{file} is empty");
    }
}

/// The targets' table: every row present, figures where the run has them, and the placement
/// it was measured in. `apart_shapes`: the many- and 16-client runs apart have figures.
fn targets_checked(
    results: &serde_json::Value,
    report: &str,
    generator_apart: bool,
    apart_shapes: bool,
) {
    let targets = &results["targets"];
    assert_eq!(targets["generator_apart"], generator_apart, "{targets}");
    let checks = targets["checks"].as_array().expect("checks");
    // Three protocols, the forwarder as the floor, two -C rows, many clients, five CPU rows.
    assert_eq!(checks.len(), 12, "{targets}");
    let figure = |what: &str| {
        let c = checks
            .iter()
            .find(|c| c["what"].as_str().is_some_and(|w| w.starts_with(what)))
            .unwrap_or_else(|| panic!("{what}: {targets}"));
        c["figure"].as_f64()
    };
    // The rows read the right modes and targets: a quick run has one round, so each figure is
    // the ratio of the two medians.
    let median = |mode: &str, target: &str| {
        results["modes"][mode][target]["median_tps"]
            .as_f64()
            .unwrap_or_else(|| panic!("{mode}/{target}: {results}"))
    };
    let close = |what: &str, expected: f64| {
        let f = figure(what).unwrap_or_else(|| panic!("{what}: no figure: {targets}"));
        assert!(
            f > 0.0 && (f - expected).abs() < 1e-9,
            "{what}: {f} against {expected}"
        );
    };
    let connect = "connect per transaction (-C)";
    close(
        "connect per transaction (-C): Herd / direct",
        median(connect, "herd-primary") / median(connect, "direct"),
    );
    close(
        "prepared: Herd / the plain forwarder",
        median("prepared", "herd-primary") / median("prepared", "forwarder"),
    );
    if apart_shapes {
        let (many, few) = if generator_apart {
            ("many clients", "simple")
        } else {
            (
                "many clients, generator apart",
                "16 clients, generator apart",
            )
        };
        close(
            "100 clients: Herd / Herd with 16",
            median(many, "herd-primary") / median(few, "herd-primary"),
        );
    }
    if results["modes"]["simple"].get("pgbouncer").is_some() {
        assert!(figure("simple: Herd / PgBouncer").is_some_and(|f| f > 0.0));
        assert!(figure("simple: Herd's CPU per transaction").is_some_and(|f| f > 0.0));
    }
    assert!(
        report.contains("The proxy's targets, checked against this run"),
        "{report}"
    );
    let placement = if generator_apart {
        "as the targets are judged"
    } else {
        "the targets are judged with `--generator-apart`"
    };
    assert!(report.contains(placement), "{report}");
}

/// `--generator-apart`: every mode runs with pgbench on cores of its own (the servers and every
/// proxy, the bench's forwarder included, on the others), through every target, and the report
/// says where each side ran; on a one-core machine the run stops with the reason.
#[test]
fn quick_proxy_bench_with_the_generator_apart() {
    let herd = env!("CARGO_BIN_EXE_herd");
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    if cores < 2 {
        let out = herd_testkit::scratch_dir();
        let run = herd_testkit::output_within(
            std::process::Command::new(herd)
                .args(["bench", "proxy", "--quick", "--generator-apart", "--out"])
                .arg(out.path()),
            herd_testkit::QUICK_BENCH_LIMIT,
        )
        .expect("finishes");
        let stderr = String::from_utf8_lossy(&run.stderr);
        assert!(!run.status.success(), "{stderr}");
        assert!(stderr.contains("cannot be kept apart"), "{stderr}");
        return;
    }
    let herd_testkit::QuickBench { out, results, text } =
        herd_testkit::quick_bench_with(herd, "proxy", &["--generator-apart"], "proxy");
    let modes = results["modes"].as_object().expect("modes");
    let names: Vec<&str> = modes.keys().map(String::as_str).collect();
    for mode in MODES {
        assert!(names.contains(&mode), "{mode} missing: {names:?}");
        let herd = &modes[mode]["herd-primary"];
        assert!(
            herd["median_tps"].as_f64().unwrap_or(0.0) > 0.0,
            "{mode}: {text}"
        );
        assert_eq!(herd["failed_transactions"], 0, "{mode}: {text}");
    }
    // Every mode is apart: the default run's two shapes apart would repeat two of them.
    assert_eq!(names.len(), MODES.len(), "{names:?}");
    for mode in ["simple", "extended", "prepared"] {
        // The forwarder runs in the bench's own process, on the servers' cores.
        for name in ["direct", "forwarder"] {
            let tps = modes[mode][name]["median_tps"].as_f64().unwrap_or(0.0);
            assert!(tps > 0.0, "{mode}/{name}: {text}");
        }
    }
    let report = std::fs::read_to_string(out.path().join("report.md")).expect("report.md");
    assert!(
        report.contains(
            "Every mode ran with the load generator apart (--generator-apart): pgbench on core(s)"
        ),
        "{report}"
    );
    assert!(!report.contains("cannot be kept apart"), "{report}");
    // pgbench's CPU is explained as apart too, not as sharing the cores.
    assert!(
        report.contains("takes nothing from the proxies' and the servers' cores"),
        "{report}"
    );
    assert!(
        !report.contains("it shares the cores with the proxy"),
        "{report}"
    );
    targets_checked(&results, &report, true, true);
}

/// `--generator-apart` belongs to `herd bench proxy`: elsewhere it is refused before anything
/// starts, with the reason.
#[test]
fn the_generator_apart_is_refused_elsewhere() {
    let run = herd_testkit::output_within(
        std::process::Command::new(env!("CARGO_BIN_EXE_herd")).args([
            "bench",
            "failover",
            "--quick",
            "--generator-apart",
        ]),
        std::time::Duration::from_secs(30),
    )
    .expect("finishes at once");
    let stderr = String::from_utf8_lossy(&run.stderr);
    assert!(!run.status.success(), "{stderr}");
    assert!(
        stderr.contains("--generator-apart applies to `herd bench proxy` only"),
        "{stderr}"
    );
}
