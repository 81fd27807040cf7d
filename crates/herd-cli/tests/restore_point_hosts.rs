//! `herd backup restore-point NAME --dcs …` on a multi-host cluster, modelled
//! on loopback: one etcd, two shard groups of one `herd agent` each, two `herd proxy`
//! processes. Bank transfers spanning the groups run through both proxies while the point is
//! taken through the first: it is written on both groups, the second proxy held its two-phase
//! commits meanwhile (named in the answer), it is recorded in the store and the proxy's data
//! directory, and the transfers go on (the balances still sum to the start). With the second
//! proxy frozen (SIGSTOP) the point is refused, naming it, and nothing is recorded: the name
//! is free again once it runs. The points are asked without --proxy-api (the proxy found through
//! its registration's API) but the last, which names it; an unreachable --proxy-api or a bad
//! name is a clear refusal.

mod common;

use std::process::Command;
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::agent_groups::Groups;
use common::hosts::HERD;
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;

const AGENTS: [(&str, u32); 2] = [("a0", 0), ("b0", 1)];
const ACCOUNTS: i64 = 40;
const START: i64 = 1000;

/// One transfer spanning the groups: both legs commit or neither.
async fn transfer(db: &tokio_postgres::Client, from: i64, to: i64, amount: i64) -> bool {
    let sql = [
        "begin".to_string(),
        format!("update accounts set balance = balance - {amount} where id = {from}"),
        format!("update accounts set balance = balance + {amount} where id = {to}"),
        "commit".to_string(),
    ];
    common::all_or_nothing(db, &sql).await
}

/// `herd backup restore-point NAME --dcs …` within 60 s: the proxy found in the store (its
/// registration names its API), or the one at `api` (`--proxy-api`).
fn restore_point_at(g: &Groups, name: &str, api: Option<&str>) -> std::process::Output {
    let mut cmd = Command::new(HERD);
    cmd.args(["backup", "restore-point", name])
        .args(["--dcs", &g.dcs(), "--cluster", &g.cluster]);
    if let Some(api) = api {
        cmd.args(["--proxy-api", api]);
    }
    cmd.arg("--data-dir").arg(g.dir.path().join("proxy"));
    herd_testkit::output_within(&mut cmd, Duration::from_secs(60)).expect("herd exits in time")
}

/// [`restore_point_at`] without `--proxy-api`.
fn restore_point(g: &Groups, name: &str) -> std::process::Output {
    restore_point_at(g, name, None)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restore_point_holds_every_proxy_or_is_refused() {
    let mut g = Groups::new(&AGENTS, "rp");
    let db = g.start_primaries_and_proxy().await;
    db.batch_execute("create table accounts (id bigint primary key, balance bigint not null)")
        .await
        .expect("table");
    db.simple_query("select herd.create_distributed_table('accounts', 'id')")
        .await
        .expect("distribute");
    common::fill_accounts(&db, ACCOUNTS, START).await;
    // Which group holds each account (group 0's primary is agent 0, group 1's agent 1).
    let on = common::accounts_by_group(&[g.direct_url(0), g.direct_url(1)]).await;
    assert!(on[0].len() >= 2 && on[1].len() >= 2, "{on:?}");

    let second_port = g.base + 2 * AGENTS.len() as u16 + 2;
    let (mut second, _through_second) = g.extra_proxy(second_port, "proxy2").await;
    let second_id = format!("127_0_0_1_{second_port}-{}", second.id());

    // Transfers spanning the groups through both proxies, two sessions each.
    let stop = Arc::new(AtomicBool::new(false));
    let acked = Arc::new(AtomicI64::new(0));
    let workers: Vec<_> = (0..4)
        .map(|w| {
            let (stop, acked, on) = (stop.clone(), acked.clone(), on.clone());
            let port = if w % 2 == 0 {
                g.proxy_port()
            } else {
                second_port
            };
            let url = g.url(port);
            tokio::spawn(async move {
                let db = common::connect(&url).await;
                let mut i = w;
                while !stop.load(Ordering::Relaxed) {
                    i += 1;
                    let a = on[0][i % on[0].len()];
                    let b = on[1][(i * 7) % on[1].len()];
                    let (from, to) = if i % 2 == 0 { (a, b) } else { (b, a) };
                    if transfer(&db, from, to, (i % 9 + 1) as i64).await {
                        acked.fetch_add(1, Ordering::SeqCst);
                    }
                }
            })
        })
        .collect();
    common::eventually(Duration::from_secs(30), "transfers committing", || {
        let n = acked.load(Ordering::SeqCst);
        async move { n >= 20 }
    })
    .await;

    // Bad input: a --proxy-api nobody serves (named, nothing taken), or a name PostgreSQL's
    // restore could not use.
    let nobody = format!("127.0.0.1:{}", herd_testkit::free_port_block(1));
    let out = restore_point_at(&g, "no_api", Some(&nobody));
    assert!(
        !out.status.success()
            && herd_testkit::describe(&out).contains("cannot reach the herd proxy's HTTP API")
            && herd_testkit::describe(&out).contains("nothing was taken"),
        "{}",
        herd_testkit::describe(&out)
    );
    let out = restore_point(&g, "1bad");
    assert!(
        !out.status.success()
            && herd_testkit::describe(&out).contains("cannot name a restore point"),
        "{}",
        herd_testkit::describe(&out)
    );

    // Taken through the first proxy (the only one serving an API: found through its
    // registration, no --proxy-api), the second holding its second phases meanwhile.
    let started = Instant::now();
    let out = restore_point(&g, "mid_load");
    let text = herd_testkit::describe(&out);
    assert!(out.status.success(), "{text}\nlogs:\n{}", g.logs());
    assert!(text.contains("Restore point mid_load at"), "{text}");
    assert!(text.contains("on 2 shard groups"), "{text}");
    assert!(
        text.contains("1 other herd proxy process(es) held theirs") && text.contains(&second_id),
        "the second proxy acknowledged: {text}"
    );
    eprintln!(
        "restore point across 2 groups and 2 proxies: {:.1} s",
        started.elapsed().as_secs_f64()
    );
    let points = std::fs::read_to_string(g.dir.path().join("proxy/backup/restore-points.tsv"))
        .expect("restore-points.tsv");
    assert_eq!(
        points
            .lines()
            .filter(|l| l.starts_with("mid_load\t"))
            .count(),
        2,
        "one record per group: {points}"
    );
    // The name is used: refused before anything is asked of the proxy.
    let again = restore_point(&g, "mid_load");
    assert!(!again.status.success());
    assert!(
        herd_testkit::describe(&again).contains("exists already"),
        "{}",
        herd_testkit::describe(&again)
    );

    // Transfers go on through both proxies once the hold ended.
    let before = acked.load(Ordering::SeqCst);
    common::eventually(Duration::from_secs(30), "transfers after the point", || {
        let n = acked.load(Ordering::SeqCst);
        async move { n >= before + 20 }
    })
    .await;

    // A frozen proxy does not acknowledge: refused, named, nothing recorded.
    stop.store(true, Ordering::Relaxed);
    for w in workers {
        let _ = tokio::time::timeout(Duration::from_secs(30), w).await;
    }
    let pid = Pid::from_raw(second.id() as i32);
    kill(pid, Signal::SIGSTOP).expect("SIGSTOP the second proxy");
    let started = Instant::now();
    let out = restore_point(&g, "frozen");
    let took = started.elapsed();
    kill(pid, Signal::SIGCONT).expect("SIGCONT");
    let text = herd_testkit::describe(&out);
    assert!(!out.status.success(), "{text}");
    assert!(
        text.contains("did not acknowledge") && text.contains(&second_id),
        "the frozen proxy is named: {text}"
    );
    assert!(text.contains("no point was taken"), "{text}");
    assert!(took < Duration::from_secs(40), "refused in {took:?}");
    let points = std::fs::read_to_string(g.dir.path().join("proxy/backup/restore-points.tsv"))
        .expect("restore-points.tsv");
    assert!(!points.contains("frozen"), "{points}");
    // Refused, the name is free: taken once the second proxy runs again.
    let mut retried = None;
    for _ in 0..5 {
        let out = restore_point_at(&g, "frozen", Some(&g.proxy_api()));
        if out.status.success() {
            retried = Some(out);
            break;
        }
        tokio::time::sleep(Duration::from_secs(2)).await;
    }
    let out = retried.unwrap_or_else(|| panic!("the point after SIGCONT; logs:\n{}", g.logs()));
    assert!(
        herd_testkit::describe(&out).contains(&second_id),
        "{}",
        herd_testkit::describe(&out)
    );

    // Every transfer whole: the balances sum to the start.
    let sum: i64 = db
        .query_one("select sum(balance)::int8 from accounts", &[])
        .await
        .expect("sum")
        .get(0);
    assert_eq!(sum, ACCOUNTS * START);
    let _ = second.kill();
    let _ = second.wait();
}
