//! The proxy's speed targets, checked against a run's own figures: each target's figure (the
//! median of the interleaved rounds' ratios, or the ratio of CPU per transaction), how many
//! rounds met it on their own, and whether the figure does. Pure functions over the results,
//! table-tested; the report prints them as a table, so a reader sees at once where Herd stands
//! on this machine.
//!
//! The targets (docs/benchmarks.md, "Where the proxy's speed stands"): Herd's proxy alone at
//! least as fast as PgBouncer in each protocol; with a connection per transaction at least 5×
//! direct connections and at least PgBouncer; with 1,000 clients within 10 % of its 16-client
//! rate; and Herd's CPU per transaction at most PgBouncer's in every mode. They are judged with
//! the load generator on cores of its own (`--generator-apart`), as a pooler is measured in
//! practice. Herd against the plain forwarder (one hop that parses and pools nothing) is shown
//! beside them as the floor, not as a target: it does by construction a subset of Herd's work.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use serde::{Deserialize, Serialize};

use crate::pgbench::median;
use crate::report::{ModeResult, ProcessCost};

/// Which side of its goal a figure must be on.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Goal {
    /// The figure must be at least this.
    AtLeast(f64),
    /// The figure must be at most this.
    AtMost(f64),
}

impl Goal {
    fn met(self, figure: f64) -> bool {
        match self {
            Goal::AtLeast(g) => figure >= g,
            Goal::AtMost(g) => figure <= g,
        }
    }

    fn text(self) -> String {
        match self {
            Goal::AtLeast(g) => format!("≥ {g:.2}×"),
            Goal::AtMost(g) => format!("≤ {g:.2}×"),
        }
    }
}

/// One target checked against a run (or a reference row shown beside the targets).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TargetCheck {
    /// What is compared, e.g. "simple: Herd / PgBouncer, tps".
    pub what: String,
    /// The goal; `None` for a reference row, which is shown but is not a target.
    pub goal: Option<Goal>,
    /// The figure: the median of the interleaved rounds' own ratios (the ratio of the two
    /// medians where rounds do not pair, and of the two CPU figures for CPU); `None` when the
    /// run has no figure for one side (PgBouncer not installed, a mode refused).
    pub figure: Option<f64>,
    /// Interleaved rounds whose own ratio met the goal, and rounds with both figures (`None`
    /// where there is no per-round figure: CPU is summed over all of a mode's runs).
    pub rounds: Option<(usize, usize)>,
}

impl TargetCheck {
    /// Whether the figure meets the goal (`None`: a reference row, or no figure).
    pub fn met(&self) -> Option<bool> {
        Some(self.goal?.met(self.figure?))
    }
}

/// The checks of one run and where the load generator ran during it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Targets {
    /// Whether every mode ran with the load generator apart (`--generator-apart`).
    pub generator_apart: bool,
    /// Every target, then the CPU rows; the reference row after the protocols.
    pub checks: Vec<TargetCheck>,
}

/// Names of the modes a check reads: the protocols, the connection-per-transaction shape, and
/// the 16- and many-client simple runs to compare (apart in a `--generator-apart` run, the
/// default run's two shapes apart otherwise).
pub struct ModeNames<'a> {
    /// A connection per transaction (`pgbench -C`).
    pub connect: &'a str,
    /// 16 clients, simple protocol.
    pub few: &'a str,
    /// Many clients (1,000), simple protocol.
    pub many: &'a str,
}

const PROTOCOLS: [&str; 3] = ["simple", "extended", "prepared"];
const HERD: &str = "herd-primary";
const BOUNCER: &str = "pgbouncer";

/// Every target and the reference row, checked against `modes` (tps) and `costs` (CPU);
/// `rounds`: the rounds planned for every mode and target.
pub fn checks(
    modes: &BTreeMap<String, ModeResult>,
    costs: &BTreeMap<String, BTreeMap<String, ProcessCost>>,
    names: &ModeNames,
    many_clients: u32,
    rounds: usize,
) -> Vec<TargetCheck> {
    let at_least_one = Some(Goal::AtLeast(1.0));
    let mut out = Vec::new();
    for p in PROTOCOLS {
        out.push(tps_check(
            modes,
            format!("{p}: Herd / PgBouncer, tps"),
            at_least_one,
            ((p, HERD), (p, BOUNCER)),
            rounds,
        ));
    }
    out.push(tps_check(
        modes,
        "prepared: Herd / the plain forwarder, tps (the floor of one hop; not a target)".into(),
        None,
        (("prepared", HERD), ("prepared", "forwarder")),
        rounds,
    ));
    let c = names.connect;
    out.push(tps_check(
        modes,
        format!("{c}: Herd / direct, tps"),
        Some(Goal::AtLeast(5.0)),
        ((c, HERD), (c, "direct")),
        rounds,
    ));
    out.push(tps_check(
        modes,
        format!("{c}: Herd / PgBouncer, tps"),
        at_least_one,
        ((c, HERD), (c, BOUNCER)),
        rounds,
    ));
    out.push(tps_check(
        modes,
        format!("{many_clients} clients: Herd / Herd with 16, tps"),
        Some(Goal::AtLeast(0.9)),
        ((names.many, HERD), (names.few, HERD)),
        rounds,
    ));
    for mode in PROTOCOLS.into_iter().chain([c, names.many]) {
        let cpu = |target: &str| {
            costs
                .get(mode)
                .and_then(|m| m.get(target))
                .map(|c| c.cpu_us_per_txn)
                .filter(|v| *v > 0.0)
        };
        out.push(TargetCheck {
            what: format!("{mode}: Herd's CPU per transaction / PgBouncer's"),
            goal: Some(Goal::AtMost(1.0)),
            figure: cpu(HERD).zip(cpu(BOUNCER)).map(|(h, b)| h / b),
            rounds: None,
        });
    }
    out
}

/// `a` against `b` in tps: within one mode, where both ran every one of the `rounds`, the
/// median of the rounds' own ratios (a round runs every target one after the other, within a
/// minute, so the machine's drift between rounds cancels out: on a noisy VM every target's rate
/// can move 15 % from one round to the next), with the rounds whose own ratio meets `goal`.
/// Otherwise the ratio of the two medians: across modes (all of a mode's rounds run before the
/// next mode's, minutes apart, so round i of one is no closer to round i of the other than to
/// any), or where a run was refused (the rounds left would not pair up).
fn tps_check(
    modes: &BTreeMap<String, ModeResult>,
    what: String,
    goal: Option<Goal>,
    (a, b): ((&str, &str), (&str, &str)),
    rounds: usize,
) -> TargetCheck {
    let get = |(mode, target): (&str, &str)| modes.get(mode)?.get(target);
    let Some((x, y)) = get(a).zip(get(b)) else {
        return TargetCheck {
            what,
            goal,
            figure: None,
            rounds: None,
        };
    };
    let paired = a.0 == b.0 && x.runs.len() == rounds && y.runs.len() == rounds;
    let ratios: Vec<f64> = if paired {
        x.runs
            .iter()
            .zip(&y.runs)
            .filter(|(_, q)| **q > 0.0)
            .map(|(p, q)| p / q)
            .collect()
    } else {
        Vec::new()
    };
    let of_medians = (y.median_tps > 0.0).then(|| x.median_tps / y.median_tps);
    TargetCheck {
        what,
        goal,
        figure: median(&ratios).or(of_medians),
        rounds: goal
            .filter(|_| !ratios.is_empty())
            .map(|g| (ratios.iter().filter(|r| g.met(**r)).count(), ratios.len())),
    }
}

/// The checks as a Markdown table, with a line on the placement they were measured in.
pub fn table(targets: &Targets) -> String {
    let checks = &targets.checks;
    if checks.is_empty() {
        return String::new();
    }
    let placement = if targets.generator_apart {
        "with the load generator on cores of its own, as the targets are judged"
    } else {
        "with pgbench sharing the cores in the protocols and `-C` (the 1,000-client rows compare \
         the two shapes apart); the targets are judged with `--generator-apart`"
    };
    let mut md = format!(
        "\nThe proxy's targets, checked against this run ({placement}):\n\n\
         | target | goal | figure | rounds meeting it | met |\n|---|---|---|---|---|\n"
    );
    for c in checks {
        let goal = c.goal.map_or("—".into(), Goal::text);
        let figure = c.figure.map_or("no figure".into(), |f| format!("{f:.3}×"));
        let rounds = c.rounds.map_or("—".into(), |(m, n)| format!("{m} of {n}"));
        let met = match (c.goal, c.met()) {
            (None, _) => "reference",
            (Some(_), None) => "no figure",
            (Some(_), Some(true)) => "yes",
            (Some(_), Some(false)) => "**no**",
        };
        let _ = writeln!(md, "| {} | {goal} | {figure} | {rounds} | {met} |", c.what);
    }
    md
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::TargetResult;

    fn target(runs: &[f64]) -> TargetResult {
        let mut sorted = runs.to_vec();
        sorted.sort_by(f64::total_cmp);
        TargetResult {
            runs: runs.to_vec(),
            median_tps: sorted[sorted.len() / 2],
            ratio_to_direct: 0.0,
            failed_transactions: 0,
        }
    }

    fn cost(cpu: f64) -> ProcessCost {
        ProcessCost {
            cpu_us_per_txn: cpu,
            ..ProcessCost::default()
        }
    }

    const NAMES: ModeNames = ModeNames {
        connect: "connect",
        few: "simple",
        many: "many",
    };

    fn find<'a>(checks: &'a [TargetCheck], what: &str) -> &'a TargetCheck {
        checks
            .iter()
            .find(|c| c.what.starts_with(what))
            .unwrap_or_else(|| panic!("{what}: {checks:?}"))
    }

    #[test]
    fn each_target_against_its_goal() {
        let mut modes: BTreeMap<String, ModeResult> = BTreeMap::new();
        let mut put = |mode: &str, name: &str, runs: &[f64]| {
            modes
                .entry(mode.into())
                .or_default()
                .insert(name.into(), target(runs));
        };
        put("simple", HERD, &[100.0, 102.0, 98.0]);
        put("simple", BOUNCER, &[99.0, 100.0, 100.0]);
        put("extended", HERD, &[90.0, 91.0, 92.0]);
        put("extended", BOUNCER, &[100.0, 100.0, 100.0]);
        put("prepared", HERD, &[100.0, 100.0, 100.0]);
        put("prepared", "forwarder", &[101.0, 99.0, 102.0]);
        put("connect", HERD, &[50.0, 60.0, 55.0]);
        put("connect", "direct", &[10.0, 10.0, 10.0]);
        put("connect", BOUNCER, &[54.0]); // refused twice: no rounds to pair
        put("many", HERD, &[91.0, 89.0, 95.0]);
        let mut costs: BTreeMap<String, BTreeMap<String, ProcessCost>> = BTreeMap::new();
        // Mode, Herd's and PgBouncer's CPU per transaction.
        for (mode, herd, bouncer) in [
            ("simple", 12.0, 13.0),
            ("prepared", 14.0, 13.0),
            ("connect", 100.0, 110.0),
            // 1,000 clients: Herd's CPU a hair above PgBouncer's is not met.
            ("many", 15.94, 15.87),
        ] {
            costs
                .entry(mode.into())
                .or_default()
                .extend([(HERD.into(), cost(herd)), (BOUNCER.into(), cost(bouncer))]);
        }
        let checks = checks(&modes, &costs, &NAMES, 1000, 3);

        let simple = find(&checks, "simple: Herd / PgBouncer");
        // The median of the rounds' ratios (100/99, 102/100, 98/100), not 100/100.
        let figure = simple.figure.expect("figure");
        assert!((figure - 100.0 / 99.0).abs() < 1e-9, "{simple:?}");
        assert_eq!(
            simple.rounds,
            Some((2, 3)),
            "100/99 and 102/100 meet it, 98/100 not"
        );
        assert_eq!(simple.met(), Some(true));
        let extended = find(&checks, "extended: Herd / PgBouncer");
        assert_eq!(
            (extended.met(), extended.rounds),
            (Some(false), Some((0, 3)))
        );
        // No PgBouncer in prepared mode (older than 1.21): no figure, not a failure.
        let prepared = find(&checks, "prepared: Herd / PgBouncer");
        assert_eq!((prepared.figure, prepared.met()), (None, None));
        // The forwarder is shown, never judged.
        let floor = find(&checks, "prepared: Herd / the plain forwarder");
        assert_eq!((floor.goal, floor.met(), floor.rounds), (None, None, None));
        assert!((floor.figure.expect("figure") - 100.0 / 101.0).abs() < 1e-9);
        let direct = find(&checks, "connect: Herd / direct");
        assert_eq!((direct.met(), direct.rounds), (Some(true), Some((3, 3))));
        // Rounds that do not pair: the ratio of the medians, 55/54.
        let bouncer = find(&checks, "connect: Herd / PgBouncer");
        assert_eq!((bouncer.met(), bouncer.rounds), (Some(true), None));
        assert!((bouncer.figure.expect("figure") - 55.0 / 54.0).abs() < 1e-9);
        // Two modes run minutes apart: never paired by round, the ratio of the medians, 91/100.
        let many = find(&checks, "1000 clients: Herd / Herd with 16");
        assert!(
            (many.figure.expect("figure") - 0.91).abs() < 1e-9,
            "{many:?}"
        );
        assert_eq!((many.met(), many.rounds), (Some(true), None));
        assert_eq!(find(&checks, "simple: Herd's CPU").met(), Some(true));
        assert_eq!(find(&checks, "prepared: Herd's CPU").met(), Some(false));
        assert_eq!(find(&checks, "extended: Herd's CPU").met(), None);
        assert_eq!(find(&checks, "connect: Herd's CPU").met(), Some(true));
        assert_eq!(find(&checks, "many: Herd's CPU").met(), Some(false));
        // Three protocols, the floor, two -C rows, many clients, five CPU rows.
        assert_eq!(checks.len(), 12);
    }

    /// The machine slows down for the last rounds and one of PgBouncer's runs falls in a fast
    /// spell: the medians of the two sides then compare different moments (100 against 102.5),
    /// while Herd ran ahead in three rounds of four.
    #[test]
    fn drift_between_rounds_cancels_out() {
        let mut modes: BTreeMap<String, ModeResult> = BTreeMap::new();
        let simple = modes.entry("simple".into()).or_default();
        simple.insert(HERD.into(), target(&[110.0, 110.0, 90.0, 90.0]));
        simple.insert(BOUNCER.into(), target(&[105.0, 105.0, 88.0, 100.0]));
        let checks = checks(&modes, &BTreeMap::new(), &NAMES, 1000, 4);
        let c = find(&checks, "simple: Herd / PgBouncer");
        assert_eq!((c.met(), c.rounds), (Some(true), Some((3, 4))), "{c:?}");
        let expected = (110.0 / 105.0 + 90.0 / 88.0) / 2.0;
        assert!((c.figure.expect("figure") - expected).abs() < 1e-9, "{c:?}");
    }

    /// A refused run on each side, in different rounds, leaves lists of equal length whose
    /// pairs would be shifted; zero rates are a figure (Herd served nothing: not met), a zero
    /// baseline is none.
    #[test]
    fn refused_runs_and_zero_rates() {
        let mut modes: BTreeMap<String, ModeResult> = BTreeMap::new();
        let simple = modes.entry("simple".into()).or_default();
        simple.insert(HERD.into(), target(&[100.0, 90.0, 100.0]));
        simple.insert(BOUNCER.into(), target(&[100.0, 100.0, 80.0]));
        let extended = modes.entry("extended".into()).or_default();
        extended.insert(HERD.into(), target(&[0.0, 0.0]));
        extended.insert(BOUNCER.into(), target(&[100.0, 100.0]));
        let prepared = modes.entry("prepared".into()).or_default();
        prepared.insert(HERD.into(), target(&[100.0, 100.0]));
        prepared.insert(BOUNCER.into(), target(&[0.0, 0.0]));
        // Four rounds planned, three runs each: the ratio of the medians, 100/100.
        let of_four = checks(&modes, &BTreeMap::new(), &NAMES, 1000, 4);
        let c = find(&of_four, "simple: Herd / PgBouncer");
        assert_eq!(c.rounds, None, "{c:?}");
        assert!((c.figure.expect("figure") - 1.0).abs() < 1e-9, "{c:?}");
        let of_two = checks(&modes, &BTreeMap::new(), &NAMES, 1000, 2);
        let e = find(&of_two, "extended: Herd / PgBouncer");
        assert_eq!(
            (e.figure, e.met(), e.rounds),
            (Some(0.0), Some(false), Some((0, 2)))
        );
        let p = find(&of_two, "prepared: Herd / PgBouncer");
        assert_eq!((p.figure, p.met(), p.rounds), (None, None, None));
    }

    #[test]
    fn the_table_says_what_met_and_where_it_ran() {
        let checks = vec![
            TargetCheck {
                what: "simple: Herd / PgBouncer, tps".into(),
                goal: Some(Goal::AtLeast(1.0)),
                figure: Some(1.013),
                rounds: Some((6, 8)),
            },
            TargetCheck {
                what: "prepared: Herd's CPU per transaction / PgBouncer's".into(),
                goal: Some(Goal::AtMost(1.0)),
                figure: Some(1.2),
                rounds: None,
            },
            TargetCheck {
                what: "floor".into(),
                goal: None,
                figure: Some(0.98),
                rounds: None,
            },
            TargetCheck {
                what: "missing".into(),
                goal: Some(Goal::AtLeast(5.0)),
                figure: None,
                rounds: None,
            },
        ];
        let targets = |generator_apart, checks: &[TargetCheck]| Targets {
            generator_apart,
            checks: checks.to_vec(),
        };
        let md = table(&targets(true, &checks));
        assert!(md.contains("as the targets are judged"), "{md}");
        assert!(
            md.contains("| simple: Herd / PgBouncer, tps | ≥ 1.00× | 1.013× | 6 of 8 | yes |"),
            "{md}"
        );
        assert!(md.contains("| ≤ 1.00× | 1.200× | — | **no** |"), "{md}");
        assert!(
            md.contains("| floor | — | 0.980× | — | reference |"),
            "{md}"
        );
        assert!(
            md.contains("| missing | ≥ 5.00× | no figure | — | no figure |"),
            "{md}"
        );
        let shared = table(&targets(false, &checks));
        assert!(
            shared.contains("judged with `--generator-apart`"),
            "{shared}"
        );
        assert_eq!(table(&targets(true, &[])), "");
    }
}
