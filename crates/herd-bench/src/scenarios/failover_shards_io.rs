//! The parts of `herd bench failover --hosts 3 --shards 2` beside its rounds: the keys each
//! group holds, the rows read back, probers that see two writable members of one group, and
//! the pure arithmetic of the other group's write rate.

use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use super::failover::{block_on, sql_error};
use super::lab_hosts::{host_of, LabHosts, HOSTS};
use crate::report::OtherGroup;
use crate::BenchError;

/// The distributed table the writers fill: `(k, id)`, distributed by `k`.
pub(crate) const TABLE: &str = "herd_bench_shards";
/// Candidate keys inserted once to learn which group holds which.
const CANDIDATES: i64 = 16;

/// Runs `statements` in order on `url`, one simple query each.
pub(crate) fn run_sql(url: &str, statements: &[String]) -> Result<(), BenchError> {
    block_on(async {
        let (client, conn) = tokio_postgres::connect(url, tokio_postgres::NoTls).await?;
        tokio::spawn(conn);
        for s in statements {
            client.simple_query(s).await?;
        }
        Ok::<_, tokio_postgres::Error>(())
    })?
    .map_err(|e| sql_error("setting up the distributed table through the proxy", e))
}

/// One query's first column (bigint) on `url`.
fn ints(url: &str, query: &str) -> Result<Vec<i64>, BenchError> {
    block_on(async {
        let (client, conn) = tokio_postgres::connect(url, tokio_postgres::NoTls).await?;
        tokio::spawn(conn);
        let rows = client.query(query, &[]).await?;
        Ok::<_, tokio_postgres::Error>(rows.iter().map(|r| r.get::<_, i64>(0)).collect())
    })?
    .map_err(|e| sql_error(query, e))
}

/// Creates and distributes the table through the proxy, inserts one row (id 0) for each
/// candidate key, and reads on each group's primary which keys it holds: one key per group.
pub(crate) fn keys_per_group(hosts: &LabHosts) -> Result<Vec<i64>, BenchError> {
    let proxy = hosts.proxy_url()?;
    let mut setup = vec![
        format!("create table {TABLE} (k bigint, id bigint, primary key (k, id))"),
        format!("select herd.create_distributed_table('{TABLE}', 'k')"),
    ];
    setup.extend((1..=CANDIDATES).map(|k| format!("insert into {TABLE} values ({k}, 0)")));
    run_sql(&proxy, &setup)?;
    let primaries = hosts.wait_whole_groups()?;
    let mut keys = Vec::new();
    for (g, &p) in primaries.iter().enumerate() {
        let held = ints(
            &hosts.node_url(p)?,
            &format!("select k from {TABLE} where id = 0 order by k"),
        )?;
        let Some(&k) = held.first() else {
            return Err(hosts.failure(&format!(
                "group {g} holds none of the keys 1..={CANDIDATES} of the distributed table"
            )));
        };
        keys.push(k);
    }
    Ok(keys)
}

/// The ids in `start..end` of key `k` present on the server at `url`.
pub(crate) fn ids_of_key(
    url: &str,
    k: i64,
    start: i64,
    end: i64,
) -> Result<HashSet<i64>, BenchError> {
    let query = format!("select id from {TABLE} where k = {k} and id >= {start} and id < {end}");
    Ok(ints(url, &query)?.into_iter().collect())
}

/// The other group's writes around a fault at `at`, from its acknowledgement times: the rate
/// over `before` up to the fault (from the first acknowledgement when later), the rate from
/// the fault to `until`, and the longest pause in that window.
pub(crate) fn other_group(
    acked: &[Instant],
    at: Instant,
    until: Instant,
    before: Duration,
) -> OtherGroup {
    let from = acked
        .iter()
        .copied()
        .filter(|t| *t < at)
        .min()
        .map_or(at, |first| {
            first.max(at.checked_sub(before).unwrap_or(first))
        });
    let count = |a: Instant, b: Instant| acked.iter().filter(|t| **t >= a && **t < b).count();
    let per_s = |n: usize, a: Instant, b: Instant| {
        let s = (b - a).as_secs_f64();
        if s > 0.0 {
            n as f64 / s
        } else {
            0.0
        }
    };
    let before_wps = per_s(count(from, at), from, at);
    let during_wps = per_s(count(at, until), at, until);
    let mut marks: Vec<Instant> = acked
        .iter()
        .copied()
        .filter(|t| *t >= at && *t < until)
        .collect();
    marks.sort();
    let mut longest = Duration::ZERO;
    let mut last = at;
    for t in marks.into_iter().chain([until]) {
        longest = longest.max(t - last);
        last = t;
    }
    OtherGroup {
        before_wps,
        during_wps,
        ratio: if before_wps > 0.0 {
            during_wps / before_wps
        } else {
            0.0
        },
        longest_pause_s: longest.as_secs_f64(),
    }
}

/// Per agent: the last probe's time and whether its server accepted writes.
type Seen = Vec<Option<(Instant, bool)>>;

/// One prober thread per agent, inside its host's namespace, every 100 ms; records any
/// instant at which two members of one group accepted writes.
pub(crate) struct GroupProbes {
    stop: Arc<AtomicBool>,
    two_writable: Arc<Mutex<Vec<String>>>,
    threads: Vec<JoinHandle<()>>,
}

impl GroupProbes {
    /// Starts the probers of every agent of `hosts`.
    pub(crate) fn start(hosts: &LabHosts) -> Result<GroupProbes, BenchError> {
        let agents = HOSTS * hosts.groups();
        let stop = Arc::new(AtomicBool::new(false));
        let seen: Arc<Mutex<Seen>> = Arc::new(Mutex::new(vec![None; agents]));
        let two_writable = Arc::new(Mutex::new(Vec::new()));
        let names: Arc<Vec<String>> = Arc::new((0..agents).map(|k| hosts.agent_name(k)).collect());
        let mut threads = Vec::new();
        for k in 0..agents {
            let url = hosts.local_url(k)?;
            let netns = hosts.lab().netns(host_of(k));
            let (stop, seen, two, names) = (
                stop.clone(),
                seen.clone(),
                two_writable.clone(),
                names.clone(),
            );
            threads.push(std::thread::spawn(move || {
                if let Err(e) = herd_testkit::netns::enter(&netns) {
                    eprintln!("herd bench: prober of {}: {e}", names[k]);
                    return;
                }
                let _ = block_on(probe_loop(k, url, stop, seen, two, names));
            }));
        }
        Ok(GroupProbes {
            stop,
            two_writable,
            threads,
        })
    }

    /// The instants seen so far with two writable members of one group (taken).
    pub(crate) fn take_two_writable(&self) -> Vec<String> {
        std::mem::take(&mut *self.two_writable.lock().unwrap_or_else(|p| p.into_inner()))
    }

    /// Stops the probers.
    pub(crate) fn stop(self) {
        self.stop.store(true, Ordering::SeqCst);
        for t in self.threads {
            let _ = t.join();
        }
    }
}

async fn probe_loop(
    k: usize,
    url: String,
    stop: Arc<AtomicBool>,
    seen: Arc<Mutex<Seen>>,
    two: Arc<Mutex<Vec<String>>>,
    names: Arc<Vec<String>>,
) {
    let period = Duration::from_millis(100);
    let mut client: Option<tokio_postgres::Client> = None;
    let group = k / HOSTS;
    while !stop.load(Ordering::SeqCst) {
        let started = Instant::now();
        let writable = herd_testkit::agents::accepts_writes(&url, &mut client).await;
        let now = Instant::now();
        let others: Vec<String> = {
            let mut s = seen.lock().unwrap_or_else(|p| p.into_inner());
            s[k] = Some((now, writable));
            (group * HOSTS..(group + 1) * HOSTS)
                .filter(|&j| j != k)
                .filter(|&j| s[j].is_some_and(|(t, w)| w && now - t < period))
                .map(|j| names[j].clone())
                .collect()
        };
        if writable && !others.is_empty() {
            let text = format!("{} and {} writable together", names[k], others.join(", "));
            two.lock().unwrap_or_else(|p| p.into_inner()).push(text);
        }
        tokio::time::sleep(period.saturating_sub(started.elapsed())).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(at: Instant, v: &[i64]) -> Vec<Instant> {
        v.iter()
            .map(|&m| {
                if m >= 0 {
                    at + Duration::from_millis(m as u64)
                } else {
                    at - Duration::from_millis((-m) as u64)
                }
            })
            .collect()
    }

    #[test]
    fn the_other_groups_rates_around_a_fault() {
        let at = Instant::now() + Duration::from_secs(10);
        let until = at + Duration::from_secs(2);
        let before = Duration::from_secs(1);
        // (acks in ms from the fault, before_wps, during_wps, ratio, longest pause s)
        let cases: [(&[i64], f64, f64, f64, f64); 5] = [
            // Steady 10/s on both sides: ratio 1, pauses 100 ms.
            (
                &[
                    -1000, -900, -800, -700, -600, -500, -400, -300, -200, -100, 0, 200, 400, 600,
                    800, 1000, 1200, 1400, 1600, 1800,
                ],
                10.0,
                5.0,
                0.5,
                0.2,
            ),
            // Nothing after the fault: the whole window is one pause.
            (&[-1000, -500], 2.0, 0.0, 0.0, 2.0),
            // Writes began 500 ms before the fault: the rate over those 500 ms only.
            (&[-500, -250, 100], 4.0, 0.5, 0.125, 1.9),
            // Acks older than `before` do not count.
            (&[-3000, -500, -250, 100], 2.0, 0.5, 0.25, 1.9),
            // No write before: no ratio.
            (&[500], 0.0, 0.5, 0.0, 1.5),
        ];
        for (acks, b, d, r, p) in cases {
            let o = other_group(&ms(at, acks), at, until, before);
            let near = |x: f64, y: f64| (x - y).abs() < 1e-6;
            assert!(
                near(o.before_wps, b) && near(o.during_wps, d) && near(o.ratio, r),
                "{acks:?}: {o:?}"
            );
            assert!(near(o.longest_pause_s, p), "{acks:?}: {o:?}");
        }
    }
}
