//! `herd bench failover --hosts 3`: host faults on three "hosts" (network namespaces, each with
//! an etcd member, a `herd agent` with default settings and its PostgreSQL; `herd proxy`
//! outside), under a stream of writes through the proxy. Per fault type: RTO (fault → first
//! write acknowledged by another server), how long an isolated primary still accepted writes
//! (probed from inside its host), instants at which two nodes accepted writes (probes every
//! 100 ms), and acknowledged writes missing afterwards.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use indicatif::ProgressBar;

use super::failover::{block_on, ids_at, spread, sql, Writer, TABLE};
use super::lab_hosts::{LabHosts, HOSTS};
use crate::report::{FailoverResult, Machine, Results, Settings};
use crate::{BenchError, BenchOptions};

/// Fault types, in order.
const FAULTS: [&str; 2] = ["host-killed", "host-partitioned"];
/// Writes acknowledged before the fault, at least this long.
const WARM: Duration = Duration::from_millis(500);
/// How long the writer goes on after the first acknowledged write following the fault.
const AFTER: Duration = Duration::from_secs(1);
/// The longest wait for a write acknowledged by another server after the fault.
const RTO_LIMIT: Duration = Duration::from_secs(90);
/// Target median RTO with default settings, seconds.
const RTO_TARGET_S: f64 = 8.0;
/// The agents' default lease TTL, milliseconds.
const DEFAULT_TTL_MS: u64 = 10_000;

/// Runs the scenario.
pub fn run(opts: &BenchOptions, bar: &ProgressBar) -> Result<Results, BenchError> {
    let iterations = opts
        .iterations
        .unwrap_or(if opts.quick { 1 } else { 20 })
        .max(1);
    bar.set_length(FAULTS.len() as u64 * u64::from(iterations));
    bar.set_position(0);
    let progress = |m: &str| bar.set_message(m.to_string());
    let ttl_ms = opts.ttl_ms.unwrap_or(DEFAULT_TTL_MS);
    let ttl_s = ttl_ms as f64 / 1000.0;
    let mut hosts = LabHosts::start(&opts.herd_exe, opts.ttl_ms, 1, &opts.scratches, &progress)?;
    let outcome = measure_all(&mut hosts, bar, iterations, ttl_s);
    hosts.keep_logs(&opts.out);
    let failover = outcome?;
    let mut versions = BTreeMap::new();
    versions.insert("herd".to_string(), env!("CARGO_PKG_VERSION").to_string());
    let mut published = BTreeMap::new();
    for fault in FAULTS {
        published.insert(
            fault.to_string(),
            "Patroni defaults (ttl 30 s, loop_wait 10 s, retry_timeout 10 s): RTO ~20–40 s".into(),
        );
    }
    Ok(Results {
        scenario: "failover-hosts".into(),
        date: crate::report::now_utc(),
        quick: opts.quick,
        machine: Machine::detect(),
        settings: Settings {
            command: format!(
                "herd bench failover --hosts 3 --iterations {iterations}{}{}",
                opts.ttl_ms
                    .map(|t| format!(" --ttl-ms {t}"))
                    .unwrap_or_default(),
                if opts.quick { " --quick" } else { "" }
            ),
            rounds: iterations,
            duration_s: AFTER.as_secs(),
            scale: 0,
            modes: FAULTS.iter().map(|f| f.to_string()).collect(),
            targets: vec!["herd".into()],
            versions,
        },
        published,
        notes: vec![
            format!(
                "Three hosts as Linux network namespaces on this machine, each with an etcd \
                 member, `herd agent` with its default settings (lease TTL {ttl_s:.1} s{}, loop \
                 1 s, safety margin 2.5 s, commit mode on, ANY 1) and its PostgreSQL; `herd \
                 proxy` and the writer outside. The namespaces share the machine's 2 cores: CPU \
                 contention is real, network latency is not.",
                if opts.ttl_ms.is_some() {
                    " by --ttl-ms"
                } else {
                    ""
                }
            ),
            "host-killed: every process of the primary's host gets SIGKILL (etcd member, agent, \
             watchdog, PostgreSQL), as a power loss; the host boots again after the measurement \
             and rejoins. host-partitioned: both of the primary's links go down; they come back \
             after the measurement and the old primary rejoins (pg_rewind)."
                .into(),
            format!(
                "RTO: from the fault to the acknowledgement of the first write sent after it by \
                 another server. It cannot be below the lease TTL ({ttl_s:.1} s) minus the time \
                 since the last renewal: a new leader is elected only once the old lease has \
                 expired in etcd. The target p50 ≤ {RTO_TARGET_S:.0} s is therefore met only \
                 with a TTL of about 6 s (`herd agent --ttl-ms`)."
            ),
            format!(
                "Isolated primary writable: from the cut to the last probe (every 100 ms, from \
                 inside the host over its loopback) that found the old primary accepting \
                 writes. The agent fences TTL − margin after its last renewal ({:.1} s), so \
                 this is at most that; the target is below the TTL ({ttl_s:.1} s), the earliest \
                 another member could lead.",
                ttl_s - 2.5
            ),
            "Two writable: probe instants (per host, every 100 ms) at which another node had \
             also been seen accepting writes within the last 100 ms."
                .into(),
            "Patroni's figures beside are its documented defaults and the RTO its users report \
             with them, not measured here."
                .into(),
        ],
        failover,
        ..Default::default()
    })
}

/// Every fault type, `iterations` times each.
fn measure_all(
    hosts: &mut LabHosts,
    bar: &ProgressBar,
    iterations: u32,
    ttl_s: f64,
) -> Result<BTreeMap<String, FailoverResult>, BenchError> {
    bar.set_message("creating the writer's table through the proxy");
    let proxy = hosts.proxy_url()?;
    sql(
        &proxy,
        &format!("create table {TABLE} (id bigint primary key)"),
    )?;
    let probes = Probes::start(hosts)?;
    let mut next_id = 1;
    let mut out = BTreeMap::new();
    for fault in FAULTS {
        let mut f = Figures::default();
        for i in 1..=iterations {
            let what = format!("{fault} {i}/{iterations}");
            let outcome = iteration(hosts, bar, &probes, fault, &what, &mut next_id)?;
            f.add(outcome);
            bar.inc(1);
        }
        let two = probes.take_two_writable();
        out.insert(fault.to_string(), f.result(iterations, two, ttl_s));
    }
    probes.stop();
    Ok(out)
}

/// What one iteration measured.
struct Outcome {
    rto: f64,
    whole: f64,
    new_primary: String,
    window: Option<f64>,
    acked: u64,
    lost: u64,
    failed: u64,
}

/// The figures of one fault type so far.
#[derive(Default)]
struct Figures {
    rtos: Vec<f64>,
    wholes: Vec<f64>,
    primaries: Vec<String>,
    windows: Vec<f64>,
    acked: u64,
    lost: u64,
    failed: u64,
}

impl Figures {
    fn add(&mut self, o: Outcome) {
        self.rtos.push(o.rto);
        self.wholes.push(o.whole);
        self.primaries.push(o.new_primary);
        self.windows.extend(o.window);
        self.acked += o.acked;
        self.lost += o.lost;
        self.failed += o.failed;
    }

    fn result(self, iterations: u32, two_writable: Vec<String>, ttl_s: f64) -> FailoverResult {
        let (p50, p95, max) = spread(&self.rtos);
        let window_max = self.windows.iter().copied().fold(0.0, f64::max);
        let target_met =
            p50 <= RTO_TARGET_S && self.lost == 0 && two_writable.is_empty() && window_max < ttl_s;
        FailoverResult {
            iterations,
            rto_p50_s: p50,
            rto_p95_s: p95,
            rto_max_s: max,
            rto_s: self.rtos,
            full_strength_s: self.wholes,
            new_primaries: self.primaries,
            acked_by_killed_primary: Vec::new(),
            acked: self.acked,
            lost: self.lost,
            failed_writes: self.failed,
            writable_window_s: self.windows,
            two_writable: two_writable.len() as u64,
            other_group: Vec::new(),
            target: format!(
                "RTO p50 ≤ {RTO_TARGET_S:.0} s, 0 lost, 0 instants with two writable nodes, \
                 isolated primary writable < TTL"
            ),
            target_met,
        }
    }
}

fn iteration(
    hosts: &mut LabHosts,
    bar: &ProgressBar,
    probes: &Probes,
    fault: &str,
    what: &str,
    next_id: &mut i64,
) -> Result<Outcome, BenchError> {
    bar.set_message(format!("{what}: waiting for the cluster to be whole"));
    let victim = hosts.wait_whole()?;
    let victim_port = hosts.pg_port(victim);
    let writer = Writer::start(&hosts.proxy_url()?, *next_id);
    bar.set_message(format!("{what}: writing"));
    if writer
        .wait_acked(|_| true, WARM, Duration::from_secs(30))
        .is_none()
    {
        let _ = writer.stop();
        return Err(hosts.failure("no write was acknowledged through the proxy within 30 s"));
    }
    bar.set_message(format!("{what}: {fault} ({})", LabHosts::name(victim)));
    let at = Instant::now();
    match fault {
        "host-killed" => hosts.kill_host(victim),
        _ => hosts.lab().set_host(victim, false),
    }
    let first = writer.wait_acked(
        |a| a.sent >= at && a.port != victim_port,
        Duration::ZERO,
        RTO_LIMIT,
    );
    let Some(first) = first else {
        let (_, failed, _) = writer.stop();
        return Err(hosts.failure(&format!(
            "{what}: no write sent after the fault was acknowledged by another server within \
             {} s ({failed} writes failed)",
            RTO_LIMIT.as_secs()
        )));
    };
    let rto = (first.acked - at).as_secs_f64();
    let window = if fault == "host-partitioned" {
        bar.set_message(format!("{what}: waiting for the isolated primary to fence"));
        Some(probes.writable_window(victim, at)?)
    } else {
        None
    };
    std::thread::sleep(AFTER);
    let (acks, failed, end_id) = writer.stop();
    *next_id = end_id;

    bar.set_message(format!("{what}: healing {}", LabHosts::name(victim)));
    match fault {
        "host-killed" => hosts.boot_host(victim)?,
        _ => hosts.lab().set_host(victim, true),
    }
    let primary = hosts.wait_whole()?;
    let whole = at.elapsed().as_secs_f64();
    let start_id = acks.first().map_or(end_id, |a| a.id);
    let present = ids_at(&hosts.node_url(primary)?, start_id, end_id)?;
    let lost = acks.iter().filter(|a| !present.contains(&a.id)).count() as u64;
    if lost > 0 {
        eprintln!("herd bench: {what}: {lost} acknowledged writes missing on the new primary");
    }
    Ok(Outcome {
        rto,
        whole,
        new_primary: LabHosts::name(primary),
        window,
        acked: acks.len() as u64,
        lost,
        failed,
    })
}

/// What the probers saw.
#[derive(Default)]
struct Seen {
    /// Per host: the last probe's time and whether the server accepted writes.
    last: Vec<Option<(Instant, bool)>>,
    /// Per host: the last probe that found it accepting writes.
    last_writable: Vec<Option<Instant>>,
    /// Per host: the last probe that found it not accepting writes (or not answering).
    last_refused: Vec<Option<Instant>>,
    /// Instants at which two nodes accepted writes.
    two_writable: Vec<String>,
}

/// One prober thread per host, inside the host's namespace, every 100 ms.
struct Probes {
    stop: Arc<AtomicBool>,
    seen: Arc<Mutex<Seen>>,
    threads: Vec<JoinHandle<()>>,
}

impl Probes {
    fn start(hosts: &LabHosts) -> Result<Probes, BenchError> {
        let stop = Arc::new(AtomicBool::new(false));
        let seen = Arc::new(Mutex::new(Seen {
            last: vec![None; HOSTS],
            last_writable: vec![None; HOSTS],
            last_refused: vec![None; HOSTS],
            two_writable: Vec::new(),
        }));
        let mut threads = Vec::new();
        for i in 0..HOSTS {
            let url = hosts.local_url(i)?;
            let netns = hosts.lab().netns(i);
            let (stop, seen) = (stop.clone(), seen.clone());
            threads.push(std::thread::spawn(move || {
                if let Err(e) = herd_testkit::netns::enter(&netns) {
                    eprintln!("herd bench: prober of h{i}: {e}");
                    return;
                }
                let _ = block_on(probe_loop(i, url, stop, seen));
            }));
        }
        Ok(Probes {
            stop,
            seen,
            threads,
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Seen> {
        self.seen.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Waits until host `i` was probed refusing writes after `since`; how long after `since`
    /// it was last seen accepting them.
    fn writable_window(&self, i: usize, since: Instant) -> Result<f64, BenchError> {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            {
                let seen = self.lock();
                if seen.last_refused[i].is_some_and(|t| t > since) {
                    let last = seen.last_writable[i].filter(|t| *t > since);
                    return Ok(last.map_or(0.0, |t| (t - since).as_secs_f64()));
                }
            }
            if Instant::now() > deadline {
                return Err(BenchError::Failed {
                    what: "herd bench failover --hosts 3".into(),
                    status: "the isolated primary still accepted writes 60 s after the cut".into(),
                    output: String::new(),
                });
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    fn take_two_writable(&self) -> Vec<String> {
        std::mem::take(&mut self.lock().two_writable)
    }

    fn stop(self) {
        self.stop.store(true, Ordering::SeqCst);
        for t in self.threads {
            let _ = t.join();
        }
    }
}

async fn probe_loop(i: usize, url: String, stop: Arc<AtomicBool>, seen: Arc<Mutex<Seen>>) {
    let period = Duration::from_millis(100);
    let mut client: Option<tokio_postgres::Client> = None;
    while !stop.load(Ordering::SeqCst) {
        let started = Instant::now();
        let writable = herd_testkit::agents::accepts_writes(&url, &mut client).await;
        let now = Instant::now();
        {
            let mut s = seen.lock().unwrap_or_else(|p| p.into_inner());
            s.last[i] = Some((now, writable));
            if writable {
                s.last_writable[i] = Some(now);
                let others: Vec<String> = (0..HOSTS)
                    .filter(|&j| j != i)
                    .filter(|&j| s.last[j].is_some_and(|(t, w)| w && now - t < period))
                    .map(LabHosts::name)
                    .collect();
                if !others.is_empty() {
                    let text = format!("h{i} and {} writable together", others.join(", "));
                    s.two_writable.push(text);
                }
            } else {
                s.last_refused[i] = Some(now);
            }
        }
        tokio::time::sleep(period.saturating_sub(started.elapsed())).await;
    }
}
