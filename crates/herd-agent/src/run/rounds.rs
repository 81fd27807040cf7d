//! Round cadence: how often simulated agents run over one memory store.

use std::sync::Arc;

use herd_dcs::{Dcs, MemoryDcs};

use super::*;
use crate::member::{member_key, LEADER};

/// How the simulated agents listen for changes.
#[derive(Clone, Copy)]
enum Wake {
    /// On every write (as the agent did before).
    Every,
    /// Not on heartbeats, as [`Agent::run`] does.
    NotOnHeartbeats,
}

/// Rounds each of `members` simulated agents runs in `span` over one memory store: like
/// [`Agent::run`], each writes its heartbeat every round and then waits in [`pause`].
async fn rounds(members: usize, wake: Wake, loop_wait: Duration, span: Duration) -> Vec<u64> {
    let dcs: Arc<dyn Dcs> = Arc::new(MemoryDcs::default());
    let (_stop, shutdown) = watch::channel(false);
    let tasks: Vec<_> = (0..members)
        .map(|i| {
            let (dcs, mut shutdown) = (dcs.clone(), shutdown.clone());
            tokio::spawn(async move {
                let key = member_key(&format!("m{i}"));
                let mut changes = match wake {
                    Wake::Every => dcs.changes(),
                    Wake::NotOnHeartbeats => dcs.changes_ignoring(MEMBERS),
                };
                let started = Instant::now();
                let mut n = 0;
                while started.elapsed() < span {
                    n += 1;
                    dcs.put_expiring(&key, n.to_string().into_bytes(), Duration::from_secs(10))
                        .expect("memory store");
                    pause(&mut changes, loop_wait, &mut shutdown).await;
                }
                n
            })
        })
        .collect();
    let mut out = Vec::new();
    for t in tasks {
        out.push(t.await.expect("task"));
    }
    out
}

/// A steady cluster runs about one round per loop wait and member; before, every heartbeat
/// woke the writer and the other members, and rounds followed each other every ~20 ms.
#[tokio::test]
async fn a_steady_cluster_runs_one_round_per_loop_wait() {
    let (wait, span) = (Duration::from_millis(200), Duration::from_secs(2));
    let expected = 10; // span / wait
                       // What the test tells apart: woken by heartbeats, a member runs many times more.
    let before = rounds(1, Wake::Every, wait, span).await;
    assert!(before[0] > 3 * expected, "{before:?}");
    for members in [1, 3] {
        let now = rounds(members, Wake::NotOnHeartbeats, wait, span).await;
        for n in &now {
            assert!(
                (expected / 2..=expected + expected / 2).contains(n),
                "{members} member(s): {now:?} rounds in {span:?} with a {wait:?} loop wait"
            );
        }
    }
}

/// What is acted on at once still wakes the loop: the leader lease given up.
#[tokio::test]
async fn a_lease_change_still_wakes_the_loop() {
    let dcs = MemoryDcs::default();
    let (_stop, mut shutdown) = watch::channel(false);
    let mut changes = dcs.changes_ignoring(MEMBERS);
    dcs.acquire_lease(LEADER, "m1", Duration::from_secs(10))
        .expect("lease");
    changes.borrow_and_update();
    let started = Instant::now();
    let release = async {
        tokio::time::sleep(Duration::from_millis(100)).await;
        dcs.release_lease(LEADER, "m1").expect("release");
    };
    tokio::join!(
        pause(&mut changes, Duration::from_secs(5), &mut shutdown),
        release
    );
    assert!(
        started.elapsed() < Duration::from_secs(1),
        "{:?}",
        started.elapsed()
    );
}
