//! `herd bench failover --hosts 3 --shards 2`: a sharded cluster over three "hosts" (network
//! namespaces, each with an etcd member and two `herd agent`s with default settings, one per
//! shard group, so each group has a member on every host; `herd proxy` outside) and a
//! distributed table written by key through the proxy, one writer per group. Per round, group
//! 0's primary is put on another host than group 1's (switchover when needed) and every
//! process of group 1's primary host is killed: group 1's RTO (fault → first write for its
//! key acknowledged), group 0's write rate meanwhile against before the fault, acknowledged
//! writes missing afterwards and instants at which two members of one group accepted writes.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::time::{Duration, Instant};

use indicatif::ProgressBar;

use super::failover::{spread, Writer};
use super::failover_shards_io::{ids_of_key, keys_per_group, other_group, GroupProbes, TABLE};
use super::lab_hosts::{host_of, LabHosts, HOSTS};
use crate::report::{FailoverResult, Machine, OtherGroup, Results, Settings};
use crate::{BenchError, BenchOptions};

/// The one fault measured.
const FAULT: &str = "group-1-host-killed";
/// Shard groups of the lab.
const GROUPS: usize = 2;
/// Writes acknowledged before the fault, at least this long (also the window of the other
/// group's rate before it).
const WARM: Duration = Duration::from_secs(2);
/// How long the writers go on after group 1's first acknowledged write following the fault.
const AFTER: Duration = Duration::from_secs(1);
/// The longest wait for group 1's first acknowledged write after the fault.
const RTO_LIMIT: Duration = Duration::from_secs(90);
/// The agents' default lease TTL, milliseconds.
const DEFAULT_TTL_MS: u64 = 10_000;
/// Target: the other group never goes longer than this without an acknowledged write while
/// group 1 fails over, seconds (its own primary is untouched; it loses one replica of two).
const PAUSE_TARGET_S: f64 = 2.0;

/// Runs the scenario.
pub fn run(opts: &BenchOptions, bar: &ProgressBar) -> Result<Results, BenchError> {
    let iterations = opts
        .iterations
        .unwrap_or(if opts.quick { 1 } else { 10 })
        .max(1);
    bar.set_length(u64::from(iterations));
    bar.set_position(0);
    let progress = |m: &str| bar.set_message(m.to_string());
    let ttl_s = opts.ttl_ms.unwrap_or(DEFAULT_TTL_MS) as f64 / 1000.0;
    let notes = notes(ttl_s);
    let mut hosts = LabHosts::start(
        &opts.herd_exe,
        opts.ttl_ms,
        GROUPS,
        &opts.scratches,
        &progress,
    )?;
    let outcome = measure_all(&mut hosts, bar, iterations);
    hosts.keep_logs(&opts.out);
    let (result, told) = outcome?;
    let mut failover = BTreeMap::new();
    failover.insert(FAULT.to_string(), result);
    let mut versions = BTreeMap::new();
    versions.insert("herd".to_string(), env!("CARGO_PKG_VERSION").to_string());
    Ok(Results {
        scenario: "failover-shards".into(),
        date: crate::report::now_utc(),
        quick: opts.quick,
        machine: Machine::detect(),
        settings: Settings {
            command: format!(
                "herd bench failover --hosts 3 --shards 2 --iterations {iterations}{}{}",
                opts.ttl_ms
                    .map(|t| format!(" --ttl-ms {t}"))
                    .unwrap_or_default(),
                if opts.quick { " --quick" } else { "" }
            ),
            rounds: iterations,
            duration_s: AFTER.as_secs(),
            scale: 0,
            modes: vec![FAULT.into()],
            targets: vec!["herd".into()],
            versions,
        },
        notes: notes.into_iter().chain(told).collect(),
        failover,
        ..Default::default()
    })
}

/// The report's notes on how the scenario runs.
fn notes(ttl_s: f64) -> Vec<String> {
    vec![
        format!(
            "Three hosts as Linux network namespaces on this 2-core noisy machine, each with \
                 an etcd member and two `herd agent`s (one per shard group, default settings: \
                 lease TTL {ttl_s:.1} s, loop 1 s, commit mode on, ANY 1) with their \
                 PostgreSQL; `herd proxy` and the writers outside. The namespaces share the \
                 cores: CPU contention is real, network latency is not."
        ),
        format!(
            "The table `{TABLE} (k, id)` is distributed by k; one writer per group inserts \
                 rows of one key that group holds, one statement at a time, through the proxy \
             (`returning current_setting('port')` names the server that committed it)."
        ),
        "Each round: group 0's primary is switched over to another host when it shares \
             group 1's; then every process of group 1's primary host gets SIGKILL (its etcd \
             member, both agents, their PostgreSQL), as a power loss: group 0 loses a replica \
             there, group 1 its primary. The host boots again after the measurement."
            .into(),
        "Group 1 RTO: from the kill to the acknowledgement of the first group-1 write sent \
             after it by another server than the killed primary; at least the lease TTL minus \
             the time since the last renewal."
            .into(),
        "Group 0 during/before: its acknowledged writes per second from the kill to group \
             1's first acknowledged write, divided by its rate over the 2 s before the kill; \
             longest pause: the longest time without a group-0 acknowledgement in that window."
            .into(),
        "Two writable: probe instants (every member, every 100 ms, from inside its host) \
             at which another member of the same group had also been seen accepting writes \
             within 100 ms."
            .into(),
    ]
}

/// What one round measured.
struct Round {
    rto: f64,
    whole: f64,
    new_primary: String,
    other: OtherGroup,
    acked: u64,
    lost: u64,
    failed: u64,
    /// Per group: what its failed writes were told, with how often.
    told: Vec<BTreeMap<String, u64>>,
}

/// Per group, what its writers' failed writes were told over every round (notes).
fn told_notes(rounds: &[Round]) -> Vec<String> {
    (0..GROUPS)
        .filter_map(|g| {
            let mut all: BTreeMap<String, u64> = BTreeMap::new();
            for r in rounds {
                for (told, n) in r.told.get(g).into_iter().flatten() {
                    *all.entry(shape(told)).or_default() += n;
                }
            }
            let list: Vec<String> = all.iter().map(|(t, n)| format!("{n}× \"{t}\"")).collect();
            (!list.is_empty()).then(|| {
                format!(
                    "Group {g}'s failed writes (over every round) were told: {}.",
                    list.join("; ")
                )
            })
        })
        .collect()
}

/// `told` with every number (a duration, a port, an address) as `N`, so that messages that
/// differ only there are counted together; codes such as `57P03` stay.
fn shape(told: &str) -> String {
    let chars: Vec<char> = told.chars().collect();
    let mut out = String::with_capacity(told.len());
    let mut i = 0;
    while i < chars.len() {
        let starts = chars[i].is_ascii_digit() && (i == 0 || !chars[i - 1].is_alphanumeric());
        if !starts {
            out.push(chars[i]);
            i += 1;
            continue;
        }
        let mut end = i;
        while end < chars.len() && (chars[end].is_ascii_digit() || chars[end] == '.') {
            end += 1;
        }
        if chars.get(end).is_some_and(|c| c.is_alphabetic()) {
            out.extend(&chars[i..end]);
        } else {
            out.push('N');
        }
        i = end;
    }
    out
}

fn measure_all(
    hosts: &mut LabHosts,
    bar: &ProgressBar,
    iterations: u32,
) -> Result<(FailoverResult, Vec<String>), BenchError> {
    bar.set_message("distributing the writers' table through the proxy");
    let keys = keys_per_group(hosts)?;
    let probes = GroupProbes::start(hosts)?;
    let mut next = [1i64; GROUPS];
    let mut rounds = Vec::new();
    for i in 1..=iterations {
        let what = format!("round {i}/{iterations}");
        match round(hosts, bar, &keys, &what, &mut next) {
            Ok(r) => rounds.push(r),
            Err(e) => {
                probes.stop();
                return Err(e);
            }
        }
        bar.inc(1);
    }
    let two = probes.take_two_writable();
    probes.stop();
    for t in two.iter().take(5) {
        eprintln!("herd bench: {t}");
    }
    let told = told_notes(&rounds);
    Ok((result(iterations, rounds, two.len() as u64), told))
}

/// Puts group 0's primary on another host than group 1's (switchover when they share one);
/// every group's primary.
fn apart(hosts: &LabHosts, bar: &ProgressBar, what: &str) -> Result<Vec<usize>, BenchError> {
    let deadline = Instant::now() + Duration::from_secs(120);
    let mut asked = false;
    loop {
        let p = hosts.wait_whole_groups()?;
        if host_of(p[0]) != host_of(p[1]) {
            return Ok(p);
        }
        if Instant::now() > deadline {
            return Err(hosts.failure("group 0's primary did not move off group 1's host"));
        }
        if !asked {
            // Group 0's agent k runs on host k.
            let to = (0..HOSTS).find(|&h| h != host_of(p[1])).unwrap_or(0);
            bar.set_message(format!(
                "{what}: switchover of group 0 to {}",
                hosts.agent_name(to)
            ));
            hosts.switchover(to)?;
            asked = true;
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

fn round(
    hosts: &mut LabHosts,
    bar: &ProgressBar,
    keys: &[i64],
    what: &str,
    next: &mut [i64; GROUPS],
) -> Result<Round, BenchError> {
    bar.set_message(format!("{what}: waiting for both groups to be whole"));
    let primaries = apart(hosts, bar, what)?;
    let victim = host_of(primaries[1]);
    let url = hosts.proxy_url()?;
    let writers: Vec<Writer> = (0..GROUPS)
        .map(|g| {
            let k = keys[g];
            Writer::start_with(
                &url,
                next[g],
                Box::new(move |id| {
                    format!(
                        "insert into {TABLE} values ({k}, {id}) \
                         returning current_setting('port')::int"
                    )
                }),
            )
        })
        .collect();
    bar.set_message(format!("{what}: writing to both groups"));
    for (g, w) in writers.iter().enumerate() {
        if w.wait_acked(|_| true, WARM, Duration::from_secs(30))
            .is_none()
        {
            for w in writers {
                let _ = w.stop();
            }
            return Err(hosts.failure(&format!(
                "{what}: no write to group {g} was acknowledged through the proxy within 30 s"
            )));
        }
    }
    bar.set_message(format!(
        "{what}: killing {} (group 1's primary)",
        LabHosts::name(victim)
    ));
    let at = Instant::now();
    hosts.kill_host(victim);
    // Acknowledged by another server than the killed one: a write sent as the kill began may
    // still have been committed there.
    let old_port = hosts.pg_port(primaries[1]);
    let first = writers[1].wait_acked(
        |a| a.sent >= at && a.port != 0 && a.port != old_port,
        Duration::ZERO,
        RTO_LIMIT,
    );
    let Some(first) = first else {
        for w in writers {
            let _ = w.stop();
        }
        return Err(hosts.failure(&format!(
            "{what}: no group-1 write sent after the kill was acknowledged within {} s",
            RTO_LIMIT.as_secs()
        )));
    };
    let rto = (first.acked - at).as_secs_f64();
    std::thread::sleep(AFTER);
    let told: Vec<BTreeMap<String, u64>> = writers.iter().map(Writer::errors).collect();
    let stopped: Vec<_> = writers.into_iter().map(Writer::stop).collect();
    let group0: Vec<Instant> = stopped[0].0.iter().map(|a| a.acked).collect();
    let other = other_group(&group0, at, first.acked, WARM);

    bar.set_message(format!("{what}: booting {}", LabHosts::name(victim)));
    hosts.boot_host(victim)?;
    let primaries = hosts.wait_whole_groups()?;
    let whole = at.elapsed().as_secs_f64();
    let (mut acked, mut lost, mut failed) = (0, 0, 0);
    for (g, (acks, failures, end)) in stopped.iter().enumerate() {
        let start = acks.first().map_or(*end, |a| a.id);
        let present = ids_of_key(&hosts.node_url(primaries[g])?, keys[g], start, *end)?;
        let missing = acks.iter().filter(|a| !present.contains(&a.id)).count() as u64;
        if missing > 0 {
            eprintln!("herd bench: {what}: {missing} acknowledged writes of group {g} missing");
        }
        acked += acks.len() as u64;
        lost += missing;
        failed += failures;
        next[g] = *end;
    }
    Ok(Round {
        rto,
        whole,
        new_primary: hosts.agent_name(primaries[1]),
        other,
        acked,
        lost,
        failed,
        told,
    })
}

fn result(iterations: u32, rounds: Vec<Round>, two_writable: u64) -> FailoverResult {
    let rtos: Vec<f64> = rounds.iter().map(|r| r.rto).collect();
    let (p50, p95, max) = spread(&rtos);
    let pause = rounds
        .iter()
        .map(|r| r.other.longest_pause_s)
        .fold(0.0, f64::max);
    let lost = rounds.iter().map(|r| r.lost).sum();
    FailoverResult {
        iterations,
        rto_s: rtos,
        rto_p50_s: p50,
        rto_p95_s: p95,
        rto_max_s: max,
        full_strength_s: rounds.iter().map(|r| r.whole).collect(),
        new_primaries: rounds.iter().map(|r| r.new_primary.clone()).collect(),
        acked_by_killed_primary: Vec::new(),
        acked: rounds.iter().map(|r| r.acked).sum(),
        lost,
        failed_writes: rounds.iter().map(|r| r.failed).sum(),
        writable_window_s: Vec::new(),
        two_writable,
        other_group: rounds.iter().map(|r| r.other).collect(),
        target: format!(
            "group 0 never paused > {PAUSE_TARGET_S:.0} s, 0 lost, 0 instants with two writable \
             members of a group"
        ),
        target_met: pause <= PAUSE_TARGET_S && lost == 0 && two_writable == 0,
    }
}

/// The report's table and every round, for `failover-shards`.
pub fn body(r: &Results) -> String {
    let mut md = String::from(
        "| fault | rounds | group 1 RTO p50 | p95 | max | group 0 writes/s before → during \
         (p50) | group 0 during/before (p50) | group 0 longest pause (max) | two writable | \
         acknowledged writes | lost | target |\n\
         |---|---|---|---|---|---|---|---|---|---|---|---|\n",
    );
    for (fault, f) in crate::report::ordered_failover(r) {
        let pick = |get: fn(&OtherGroup) -> f64| {
            let v: Vec<f64> = f.other_group.iter().map(get).collect();
            spread(&v)
        };
        let before = pick(|o| o.before_wps).0;
        let during = pick(|o| o.during_wps).0;
        let ratio = pick(|o| o.ratio).0;
        let pause = pick(|o| o.longest_pause_s).2;
        let _ = writeln!(
            md,
            "| {fault} | {} | {:.2} s | {:.2} s | {:.2} s | {before:.1} → {during:.1} | \
             {ratio:.2} | {pause:.2} s | {} | {} | {} | {} ({}) |",
            f.iterations,
            f.rto_p50_s,
            f.rto_p95_s,
            f.rto_max_s,
            f.two_writable,
            f.acked,
            f.lost,
            f.target,
            if f.target_met { "met" } else { "not met" }
        );
    }
    md.push_str(
        "\nEvery round (group 1 RTO s / seconds until both groups whole again / group 1's new \
         primary / group 0 writes/s before → during / group 0 longest pause s):\n\n",
    );
    for (fault, f) in crate::report::ordered_failover(r) {
        let rounds: Vec<String> = f
            .rto_s
            .iter()
            .zip(&f.full_strength_s)
            .zip(&f.new_primaries)
            .zip(&f.other_group)
            .map(|(((rto, whole), p), o)| {
                format!(
                    "{rto:.2}/{whole:.1}/{p}/{:.1} → {:.1}/{:.2}",
                    o.before_wps, o.during_wps, o.longest_pause_s
                )
            })
            .collect();
        let _ = writeln!(md, "- {fault}: {}", rounds.join(", "));
    }
    md
}

#[cfg(test)]
mod tests {
    use super::*;

    fn round(rto: f64, ratio: f64, pause: f64, lost: u64) -> Round {
        Round {
            rto,
            whole: 30.0,
            new_primary: "h1g1".into(),
            other: OtherGroup {
                before_wps: 100.0,
                during_wps: 100.0 * ratio,
                ratio,
                longest_pause_s: pause,
            },
            acked: 1000,
            lost,
            failed: 2,
            told: vec![BTreeMap::new(), BTreeMap::new()],
        }
    }

    #[test]
    fn the_target_needs_the_other_group_writing_nothing_lost_and_one_writable_per_group() {
        // (rounds, two writable, met)
        let cases = [
            (
                vec![round(10.0, 0.9, 0.5, 0), round(12.0, 0.8, 2.0, 0)],
                0,
                true,
            ),
            // One round in which group 0 stalled for longer than the target.
            (
                vec![round(10.0, 0.9, 0.5, 0), round(12.0, 0.2, 9.5, 0)],
                0,
                false,
            ),
            (vec![round(10.0, 0.9, 0.5, 1)], 0, false),
            (vec![round(10.0, 0.9, 0.5, 0)], 1, false),
        ];
        for (rounds, two, met) in cases {
            let n = rounds.len() as u32;
            let f = result(n, rounds, two);
            assert_eq!(f.target_met, met, "{f:?}");
            assert_eq!(f.other_group.len(), n as usize);
        }
    }

    #[test]
    fn what_failed_writes_were_told_is_summed_per_group() {
        let mut a = round(10.0, 0.9, 0.5, 0);
        let mut b = round(10.0, 0.9, 0.5, 0);
        a.told[1].insert("no answer within 10 s".into(), 2);
        b.told[1].insert("no answer within 10 s".into(), 1);
        b.told[1].insert("57P03: not routing for 2.5 s".into(), 3);
        b.told[1].insert("57P03: not routing for 12.75 s (10.1.2.3:5432)".into(), 1);
        let notes = told_notes(&[a, b]);
        assert_eq!(
            notes,
            [
                "Group 1's failed writes (over every round) were told: 3× \"57P03: not routing \
                 for N s\"; 1× \"57P03: not routing for N s (N:N)\"; 3× \"no answer within N \
                 s\"."
            ]
        );
    }

    #[test]
    fn the_table_shows_the_other_groups_rates() {
        let mut r = Results {
            scenario: "failover-shards".into(),
            ..Default::default()
        };
        r.settings.modes = vec![FAULT.into()];
        let f = result(
            2,
            vec![round(10.0, 0.5, 0.5, 0), round(12.0, 0.7, 0.5, 0)],
            0,
        );
        r.failover.insert(FAULT.into(), f);
        let md = body(&r);
        assert!(md.contains("| group-1-host-killed | 2 | 11.00 s |"), "{md}");
        assert!(
            md.contains("100.0 → 60.0 | 0.60 | 0.50 s | 0 | 2000 | 0 |"),
            "{md}"
        );
        assert!(md.contains("10.00/30.0/h1g1/100.0 → 50.0/0.50"), "{md}");
    }
}
