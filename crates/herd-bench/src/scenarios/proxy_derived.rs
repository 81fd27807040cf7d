//! What `herd bench proxy` derives from its figures beyond the ratios: where Herd stands against
//! the floor of one hop, and what the load generator's own growth with many clients leaves of
//! the few-client rate. Pure functions over the results, table-tested.

use std::collections::BTreeMap;

use crate::report::{ModeResult, ProcessCost};

/// Where Herd's rate against PgBouncer stands against the floor of one hop: what the plain
/// forwarder (no parsing, no pooling) ran against PgBouncer in the same rounds. A proxy that
/// parses every statement to route it pays that floor and its own work on top, so the
/// forwarder's ratio is about the most any proxy on tokio can reach on this machine.
pub fn against_the_floor(modes: &BTreeMap<String, ModeResult>) -> Option<String> {
    let ratio = |mode: &str, target: &str| {
        let m = modes.get(mode)?;
        let bouncer = m.get("pgbouncer")?.median_tps;
        let t = m.get(target)?.median_tps;
        (bouncer > 0.0 && t > 0.0).then(|| t / bouncer)
    };
    let parts: Vec<String> = ["simple", "extended", "prepared"]
        .into_iter()
        .filter_map(|mode| {
            let floor = ratio(mode, "forwarder")?;
            let herd = ratio(mode, "herd-primary")?;
            Some(format!("{mode} {floor:.2}× (Herd {herd:.2}×)"))
        })
        .collect();
    (!parts.is_empty()).then(|| {
        format!(
            "Against PgBouncer's rate, the plain forwarder — one hop on tokio that parses and \
             pools nothing — ran: {}. Herd pays that hop and its own work (classifying every \
             statement with PostgreSQL's grammar to route it, pooling): the forwarder's ratio is \
             about the most a proxy on this event loop reaches here; the user-space column of \
             the cost table shows the proxies' own work.",
            parts.join("; ")
        )
    })
}

/// What the load generator's own growth with many clients leaves of the few-client rate.
#[derive(Debug, PartialEq)]
pub struct GeneratorShare {
    /// pgbench's CPU per transaction with few clients and with many, µs.
    pub generator_few: f64,
    pub generator_many: f64,
    /// The machine's busy CPU per transaction with few clients, µs.
    pub machine_few: f64,
    /// Cores busy with few clients (the machine's CPU per transaction times the rate).
    pub busy_few: f64,
    /// The many-client rate as a fraction of the few-client rate if only the generator's
    /// cost changed and every core were busy.
    pub ratio: f64,
}

/// An estimate of what pgbench's own growth with many clients leaves of the few-client rate
/// (`few_tps`) on `cores` shared with the proxy and the servers: if the proxy and the servers
/// cost per transaction what they did with few clients and every core were busy, a
/// transaction would cost the machine `machine_few` + the generator's extra µs, and the rate
/// would be the cores' time over that. Not a bound on what is measured: the others' costs
/// change with many connections too, and the few-client run may leave cores idle. `None`
/// without the figures, or when the generator cost no more with many clients.
pub fn generator_share(
    few: &ProcessCost,
    many: &ProcessCost,
    few_tps: f64,
    cores: usize,
) -> Option<GeneratorShare> {
    let extra = many.pgbench_cpu_us_per_txn - few.pgbench_cpu_us_per_txn;
    let machine = few.machine_cpu_us_per_txn;
    let usable = machine > 0.0 && few.pgbench_cpu_us_per_txn > 0.0 && extra > 0.0;
    (usable && few_tps > 0.0 && cores > 0).then(|| GeneratorShare {
        generator_few: few.pgbench_cpu_us_per_txn,
        generator_many: many.pgbench_cpu_us_per_txn,
        machine_few: machine,
        busy_few: machine * few_tps / 1e6,
        ratio: cores as f64 * 1e6 / ((machine + extra) * few_tps),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::TargetResult;

    fn cost(pgbench: f64, machine: f64) -> ProcessCost {
        ProcessCost {
            cpu_us_per_txn: 18.0,
            user_us_per_txn: 3.0,
            switches_per_txn: 0.5,
            rss_mib: 10.0,
            pgbench_cpu_us_per_txn: pgbench,
            machine_cpu_us_per_txn: machine,
        }
    }

    #[test]
    fn the_floor_of_one_hop_against_pgbouncer() {
        let target = TargetResult::single;
        let mode = |pairs: &[(&str, f64)]| -> ModeResult {
            pairs
                .iter()
                .map(|(n, tps)| (n.to_string(), target(*tps)))
                .collect()
        };
        let mut modes = BTreeMap::new();
        modes.insert(
            "simple".to_string(),
            mode(&[
                ("pgbouncer", 20_000.0),
                ("forwarder", 19_800.0),
                ("herd-primary", 19_200.0),
            ]),
        );
        // No PgBouncer in prepared mode (older than 1.21): that mode is left out.
        modes.insert(
            "prepared".to_string(),
            mode(&[("forwarder", 30_000.0), ("herd-primary", 29_000.0)]),
        );
        let note = against_the_floor(&modes).expect("simple has all three");
        assert!(note.contains("simple 0.99× (Herd 0.96×)"), "{note}");
        assert!(!note.contains("prepared"), "{note}");
        // Without PgBouncer anywhere there is nothing to say.
        modes.remove("simple");
        assert_eq!(against_the_floor(&modes), None);
    }

    #[test]
    fn the_generators_growth_and_the_idle_cores() {
        let share = |few, many, tps| generator_share(&few, &many, tps, 2);
        // 80 µs per transaction at 25,000 tps: both cores busy. 20 µs more of pgbench with
        // many clients: 2 s of CPU per second over 100 µs, 20,000 tps, 0.8 of the rate.
        let c = share(cost(14.0, 80.0), cost(34.0, 110.0), 25_000.0).expect("an estimate");
        assert!((c.ratio - 0.8).abs() < 1e-9, "{c:?}");
        assert!((c.busy_few - 2.0).abs() < 1e-9, "{c:?}");
        assert_eq!((c.generator_few, c.generator_many), (14.0, 34.0));
        // At 20,000 tps only 1.6 cores were busy: the idle 0.4 absorbs the generator's rise.
        let c = share(cost(14.0, 80.0), cost(34.0, 110.0), 20_000.0).expect("an estimate");
        assert!((c.ratio - 1.0).abs() < 1e-9, "{c:?}");
        assert!((c.busy_few - 1.6).abs() < 1e-9, "{c:?}");
        // The generator no dearer with many clients: nothing to estimate.
        assert_eq!(share(cost(14.0, 80.0), cost(14.0, 80.0), 25_000.0), None);
        assert_eq!(share(cost(14.0, 80.0), cost(12.0, 80.0), 25_000.0), None);
        // Figures missing (an older report, a /proc that could not be read): none.
        assert_eq!(share(cost(14.0, 0.0), cost(30.0, 100.0), 25_000.0), None);
        assert_eq!(share(cost(0.0, 80.0), cost(30.0, 100.0), 25_000.0), None);
        assert_eq!(share(cost(14.0, 80.0), cost(30.0, 100.0), 0.0), None);
    }
}
