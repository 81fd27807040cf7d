use std::time::Duration;

use herd_core::{CommitMode, Lsn};

use super::*;
use crate::member::{ClusterSettings, Member};

/// A member record at `lsn` (flushed and replayed), for decision tables.
pub(crate) fn member(name: &str, role: &str, lsn: u64) -> Member {
    Member {
        name: name.into(),
        instance: format!("i-{name}"),
        role: role.into(),
        pg_host: "127.0.0.1".into(),
        pg_port: 5432,
        api: "127.0.0.1:8008".into(),
        lsn: Some(Lsn(lsn)),
        replayed: Some(Lsn(lsn)),
        streaming_from: None,
        socket: None,
        tls_not_after: None,
        tls_issuer: None,
        tls_trusts: Vec::new(),
        archiving: None,
        secrets_rotation: None,
        walsenders: Vec::new(),
    }
}

fn store(leader: Option<&str>, members: Vec<Member>, sync: &[&str]) -> Store {
    Store {
        initialized: true,
        leader: leader.map(str::to_string),
        members,
        sync_set: sync.iter().map(|s| s.to_string()).collect(),
        last_sync: Vec::new(),
        last_leader: Some("a".into()),
        settings: ClusterSettings::default(),
        handover: None,
        restarts: Vec::new(),
    }
}

fn view(me: &str, local: Local, store: Result<Store, String>) -> View {
    View {
        me: me.into(),
        local,
        store,
        was_primary: false,
        lease_left: None,
        not_streaming_for: Duration::ZERO,
        promised: false,
        last_leader_lsn: Lsn(0),
        upstream_lacks_wal: false,
        down_for: None,
        failed_starts: 0,
        since_last_start: None,
        policy: policy(),
    }
}

/// herd-ha's test policy: 0.5 s back-off base, 30 s cap, 2 s dead, 8 s hung.
fn policy() -> Policy {
    Policy {
        restart_backoff: Duration::from_millis(500),
        max_restart_backoff: Duration::from_secs(30),
        failover_timeout: Duration::from_secs(2),
        hung_timeout: Duration::from_secs(8),
    }
}

fn replica(upstream: Option<&str>, lsn: u64) -> Local {
    Local::Replica {
        upstream: upstream.map(str::to_string),
        streaming: upstream.is_some(),
        lsn: Some(Lsn(lsn)),
    }
}

#[test]
fn bootstrap_and_clone() {
    let mut fresh = store(None, vec![], &[]);
    fresh.initialized = false;
    assert_eq!(
        decide(&view("a", Local::Empty, Ok(fresh))),
        Step::Initialize
    );
    let led = store(Some("a"), vec![member("a", "primary", 10)], &[]);
    assert_eq!(
        decide(&view("b", Local::Empty, Ok(led.clone()))),
        Step::Clone("a".into())
    );
    // A leader without a heartbeat has no address to clone from.
    let ghost = store(Some("a"), vec![], &[]);
    assert!(matches!(
        decide(&view("b", Local::Empty, Ok(ghost))),
        Step::Wait(_)
    ));
    // Initialised but leaderless: wait.
    assert!(matches!(
        decide(&view("b", Local::Empty, Ok(store(None, vec![], &[])))),
        Step::Wait(_)
    ));
}

#[test]
fn stopped_servers_start_in_the_safe_role() {
    let led_by_a = store(Some("a"), vec![member("a", "primary", 10)], &[]);
    let mut v = view("a", Local::Stopped, Ok(led_by_a.clone()));
    v.was_primary = true;
    assert_eq!(
        decide(&v),
        Step::StartPrimary,
        "still the leader and alone: restart"
    );
    let mut v = view("b", Local::Stopped, Ok(led_by_a.clone()));
    v.was_primary = true;
    assert_eq!(
        decide(&v),
        Step::Rejoin("a".into()),
        "a former primary rewinds before following"
    );
    assert_eq!(
        decide(&view("b", Local::Stopped, Ok(led_by_a))),
        Step::StartReplica
    );
    // Nobody leads: even a former primary starts in recovery and competes as a replica.
    let mut v = view("a", Local::Stopped, Ok(store(None, vec![], &[])));
    v.was_primary = true;
    assert_eq!(decide(&v), Step::StartReplica);
}

#[test]
fn a_primary_renews_or_fences() {
    let mine = store(Some("a"), vec![member("a", "primary", 10)], &[]);
    assert_eq!(decide(&view("a", Local::Primary, Ok(mine))), Step::Renew);
    let theirs = store(Some("b"), vec![member("b", "primary", 10)], &[]);
    assert!(matches!(
        decide(&view("a", Local::Primary, Ok(theirs))),
        Step::Fence(_)
    ));
    assert_eq!(
        decide(&view("a", Local::Primary, Ok(store(None, vec![], &[])))),
        Step::Take
    );
    // The store unreachable: serve while the lease lasts, then fence.
    let mut v = view("a", Local::Primary, Err("timeout".into()));
    v.lease_left = Some(Duration::from_secs(3));
    assert!(matches!(decide(&v), Step::Wait(_)));
    v.lease_left = Some(Duration::ZERO);
    assert!(matches!(decide(&v), Step::Fence(_)));
    v.lease_left = None;
    assert!(matches!(decide(&v), Step::Fence(_)));
    // A replica just waits for the store.
    assert!(matches!(
        decide(&view("b", replica(Some("a"), 5), Err("timeout".into()))),
        Step::Wait(_)
    ));
}

#[test]
fn replicas_follow_the_leader() {
    let led = store(
        Some("a"),
        vec![member("a", "primary", 10), member("b", "replica", 9)],
        &["b"],
    );
    assert!(matches!(
        decide(&view("b", replica(Some("a"), 9), Ok(led.clone()))),
        Step::Wait(_)
    ));
    assert_eq!(
        decide(&view("b", replica(Some("c"), 9), Ok(led.clone()))),
        Step::Follow("a".into())
    );
    assert_eq!(
        decide(&view("b", replica(None, 9), Ok(led.clone()))),
        Step::Follow("a".into())
    );
    let mut v = view("b", replica(Some("a"), 9), Ok(led.clone()));
    v.was_primary = true;
    assert_eq!(decide(&v), Step::Rejoin("a".into()));
    let mut stuck = view(
        "b",
        Local::Replica {
            upstream: Some("a".into()),
            streaming: false,
            lsn: Some(Lsn(9)),
        },
        Ok(led.clone()),
    );
    stuck.not_streaming_for = Duration::from_secs(3);
    assert!(matches!(decide(&stuck), Step::Wait(_)));
    stuck.not_streaming_for = STUCK_REPLICA;
    assert_eq!(decide(&stuck), Step::Rejoin("a".into()));
    // The leader no longer has the WAL it needs: a rewind cannot help, a fresh clone can.
    stuck.not_streaming_for = Duration::ZERO;
    stuck.upstream_lacks_wal = true;
    assert_eq!(decide(&stuck), Step::Reclone("a".into()));
    // Having won the lease, the replica promotes.
    let won = store(Some("b"), vec![member("b", "replica", 9)], &["b"]);
    assert_eq!(decide(&view("b", replica(None, 9), Ok(won))), Step::Promote);
}

#[test]
fn only_the_proven_candidate_races() {
    // ANY 1 over {b, c}: both must be present; the most advanced takes the lease.
    let leaderless = store(
        None,
        vec![member("b", "replica", 90), member("c", "replica", 100)],
        &["b", "c"],
    );
    assert!(matches!(
        decide(&view("b", replica(None, 90), Ok(leaderless.clone()))),
        Step::Wait(w) if w.contains("c is the candidate")
    ));
    assert_eq!(
        decide(&view("c", replica(None, 100), Ok(leaderless.clone()))),
        Step::Take
    );
    // The agent's own fresh position counts over its published one.
    assert_eq!(
        decide(&view("b", replica(None, 110), Ok(leaderless.clone()))),
        Step::Take
    );
    // c absent: the proof cannot be made, nobody races.
    let half = store(None, vec![member("b", "replica", 90)], &["b", "c"]);
    assert!(matches!(
        decide(&view("b", replica(None, 90), Ok(half))),
        Step::Wait(w) if w.contains("no safe candidate")
    ));
    // A promise to a failsafe primary holds the race back.
    let mut v = view("c", replica(None, 100), Ok(leaderless.clone()));
    v.promised = true;
    assert!(matches!(decide(&v), Step::Wait(_)));
    // Async: the lag bound against the leader's last published position.
    let mut async_store = leaderless;
    async_store.settings.commit_mode = CommitMode::Async;
    let mut v = view("c", replica(None, 100), Ok(async_store));
    v.last_leader_lsn = Lsn(100 + 2 * 1024 * 1024);
    assert!(matches!(decide(&v), Step::Wait(_)));
    v.last_leader_lsn = Lsn(150);
    assert_eq!(decide(&v), Step::Take);
}

#[test]
fn handovers() {
    let h = |to: Option<&str>, loss: bool| crate::member::Handover {
        from: "a".into(),
        to: to.map(str::to_string),
        immediate: false,
        allow_data_loss: loss,
        done: false,
    };
    // The leader steps down; any other leader finishes the request.
    let mut s = store(Some("a"), vec![member("a", "primary", 100)], &["b", "c"]);
    s.handover = Some(h(Some("b"), false));
    assert_eq!(
        decide(&view("a", Local::Primary, Ok(s.clone()))),
        Step::StepDown { immediate: false }
    );
    s.leader = Some("b".into());
    assert_eq!(
        decide(&view("b", Local::Primary, Ok(s))),
        Step::FinishHandover
    );
    // Leaderless: only the target races, and the old leader stays out even if ahead.
    let mut s = store(
        None,
        vec![
            member("a", "replica", 100),
            member("b", "replica", 100),
            member("c", "replica", 100),
        ],
        &["b", "c"],
    );
    s.handover = Some(h(Some("c"), false));
    assert_eq!(
        decide(&view("c", replica(None, 100), Ok(s.clone()))),
        Step::Take,
        "equal positions: the named member takes over"
    );
    assert!(matches!(
        decide(&view("b", replica(None, 100), Ok(s.clone()))),
        Step::Wait(_)
    ));
    assert!(matches!(
        decide(&view("a", replica(None, 100), Ok(s.clone()))),
        Step::Wait(_)
    ));
    // Behind the proven candidate: wait, unless the operator accepts data loss.
    assert!(matches!(
        decide(&view("c", replica(None, 90), Ok(s.clone()))),
        Step::Wait(_)
    ));
    s.handover = Some(h(Some("c"), true));
    assert_eq!(
        decide(&view("c", replica(None, 90), Ok(s.clone()))),
        Step::Take
    );
    // No target: the best candidate other than the old leader.
    s.handover = Some(h(None, false));
    assert_eq!(
        decide(&view("b", replica(None, 100), Ok(s.clone()))),
        Step::Take
    );
    assert!(matches!(
        decide(&view("a", replica(None, 100), Ok(s))),
        Step::Wait(_)
    ));
}

#[test]
fn without_a_recorded_standby_only_the_last_leader_leads_again() {
    // A cluster whose primary never had a synchronous standby, all stopped and restarted.
    let s = store(
        None,
        vec![member("a", "replica", 50), member("b", "replica", 60)],
        &[],
    );
    assert_eq!(
        decide(&view("a", replica(None, 50), Ok(s.clone()))),
        Step::Take
    );
    assert!(matches!(
        decide(&view("b", replica(None, 60), Ok(s.clone()))),
        Step::Wait(w) if w.contains("a is the candidate")
    ));
    let mut gone = s;
    gone.members.retain(|m| m.name != "a");
    assert!(matches!(
        decide(&view("b", replica(None, 60), Ok(gone))),
        Step::Wait(_)
    ));
}

#[test]
fn a_standby_that_cannot_get_its_wal_is_cloned_afresh() {
    let led = store(
        Some("a"),
        vec![member("a", "primary", 10), member("b", "unreachable", 0)],
        &["b"],
    );
    // Still starting (not consistent yet): waits, unless the leader lost the WAL it needs.
    let mut starting = view("b", Local::NotAnswering, Ok(led.clone()));
    assert!(matches!(decide(&starting), Step::Wait(_)));
    starting.upstream_lacks_wal = true;
    assert_eq!(decide(&starting), Step::Reclone("a".into()));
    // Never without a live leader to clone from, nor from itself.
    let gone = store(Some("a"), vec![member("b", "unreachable", 0)], &["b"]);
    let mut orphan = view("b", Local::NotAnswering, Ok(gone));
    orphan.upstream_lacks_wal = true;
    assert!(matches!(decide(&orphan), Step::Wait(_)));
    let mine = store(Some("b"), vec![member("b", "unreachable", 0)], &["b"]);
    let mut own = view("b", Local::NotAnswering, Ok(mine));
    own.upstream_lacks_wal = true;
    // (As the lease holder whose server is silent, it renews: rule 2, alone.)
    assert_eq!(decide(&own), Step::Renew);
    // A streaming replica is never re-cloned, whatever the log said.
    let mut streaming = view(
        "b",
        Local::Replica {
            upstream: Some("a".into()),
            streaming: true,
            lsn: Some(Lsn(9)),
        },
        Ok(led),
    );
    streaming.upstream_lacks_wal = true;
    assert!(matches!(decide(&streaming), Step::Wait(_)));
}

/// What a table row expects of a step.
type Check = fn(&Step) -> bool;

fn secs(s: f64) -> Option<Duration> {
    Some(Duration::from_secs_f64(s))
}

/// The leader `a` with replicas `b`, `c` (both synchronous candidates: ANY 1 over {b, c}).
fn led_with_replicas() -> Store {
    store(
        Some("a"),
        vec![
            member("a", "stopped", 0),
            member("b", "replica", 100),
            member("c", "replica", 100),
        ],
        &["b", "c"],
    )
}

/// The leader `a` alone: no other member's heartbeat.
fn led_alone() -> Store {
    store(Some("a"), vec![member("a", "stopped", 0)], &["b"])
}

fn leader_view(local: Local, s: Store, down_for: Option<Duration>) -> View {
    let mut v = view("a", local, Ok(s));
    v.was_primary = true;
    v.down_for = down_for;
    v
}

/// Rule 1 (herd-ha `primary_dead`): a dead leader's server is not restarted while a replica
/// can take over; the leader keeps the lease for `failover_timeout`, then abdicates.
#[test]
fn a_dead_leader_abdicates_after_the_failover_timeout() {
    #[rustfmt::skip]
    let rows: Vec<(Option<Duration>, Check)> = vec![
        (None, |s| *s == Step::Renew),
        (secs(0.0), |s| *s == Step::Renew),
        (secs(1.9), |s| *s == Step::Renew),
        (secs(2.0), |s| matches!(s, Step::Abdicate(w) if w.contains("no postmaster") && w.contains("can take over"))),
        (secs(30.0), |s| matches!(s, Step::Abdicate(_))),
    ];
    for (down_for, want) in rows {
        let step = decide(&leader_view(Local::Stopped, led_with_replicas(), down_for));
        assert!(want(&step), "down for {down_for:?}: {step:?}");
    }
    // Never restarted in place meanwhile, whatever the back-off says.
    let mut v = leader_view(Local::Stopped, led_with_replicas(), secs(1.0));
    v.since_last_start = secs(100.0);
    assert_eq!(decide(&v), Step::Renew);
    // Another member that is no candidate (stopped, or outside the proven set) does not count:
    // abdicating would leave the group without a leader.
    let mut s = led_with_replicas();
    s.members.retain(|m| m.name != "c");
    assert_eq!(
        decide(&leader_view(Local::Stopped, s, secs(5.0))),
        Step::StartPrimary,
        "ANY 1 over {{b, c}} with c gone: no proof, restart in place"
    );
    let mut s = led_with_replicas();
    for m in &mut s.members {
        m.role = "stopped".into();
    }
    assert_eq!(
        decide(&leader_view(Local::Stopped, s, secs(5.0))),
        Step::StartPrimary
    );
    // Async: a replica within the lag bound of the leader's last position takes over.
    let mut s = led_with_replicas();
    s.settings.commit_mode = CommitMode::Async;
    let mut v = leader_view(Local::Stopped, s, secs(2.5));
    v.last_leader_lsn = Lsn(150);
    assert!(matches!(decide(&v), Step::Abdicate(_)));
}

/// Rule 2 (herd-ha `busy`/hung): a running server that does not answer gets `hung_timeout`.
#[test]
fn a_hung_leader_abdicates_after_the_hung_timeout() {
    for (down_for, abdicates) in [
        (None, false),
        (secs(2.0), false),
        (secs(7.9), false),
        (secs(8.0), true),
    ] {
        let step = decide(&leader_view(
            Local::NotAnswering,
            led_with_replicas(),
            down_for,
        ));
        if abdicates {
            assert!(
                matches!(&step, Step::Abdicate(w) if w.contains("does not answer")),
                "{down_for:?}: {step:?}"
            );
        } else {
            assert_eq!(step, Step::Renew, "{down_for:?}");
        }
    }
    // Alone, a silent server is waited for: never abdicate, never restart a running one.
    assert_eq!(
        decide(&leader_view(Local::NotAnswering, led_alone(), secs(60.0))),
        Step::Renew
    );
}

/// Rule 3 (herd-ha `alone`): no other member could take over, so the leader restarts its
/// server in place, with back-off, and keeps the lease meanwhile.
#[test]
fn a_leader_alone_restarts_in_place_with_back_off() {
    let mut v = leader_view(Local::Stopped, led_alone(), secs(60.0));
    assert_eq!(decide(&v), Step::StartPrimary);
    v.failed_starts = 3; // 2 s after three failed attempts
    v.since_last_start = secs(1.5);
    assert_eq!(decide(&v), Step::Renew, "backing off: hold the lease");
    v.since_last_start = secs(2.0);
    assert_eq!(decide(&v), Step::StartPrimary);
    // A lease holder that never ran as primary starts in recovery, then promotes.
    v.was_primary = false;
    assert_eq!(decide(&v), Step::StartReplica);
    // The cluster never had a synchronous standby: only the last leader holds every
    // acknowledged commit, so the others cannot take over.
    let mut s = led_with_replicas();
    s.sync_set.clear();
    assert_eq!(
        decide(&leader_view(Local::Stopped, s, secs(60.0))),
        Step::StartPrimary
    );
}

/// Rule 4 (herd-ha `restarts_back_off`): starts and rejoins wait `backoff(failed_starts)`
/// since the last attempt: nothing before the first, then 0.5 s doubled per failure, at most
/// 30 s.
#[test]
fn starts_and_rejoins_back_off() {
    let led = store(
        Some("a"),
        vec![member("a", "primary", 10), member("b", "stopped", 0)],
        &["b"],
    );
    let at = |failed: u32, since: Option<Duration>, was_primary: bool| {
        let mut v = view("b", Local::Stopped, Ok(led.clone()));
        v.failed_starts = failed;
        v.since_last_start = since;
        v.was_primary = was_primary;
        decide(&v)
    };
    #[rustfmt::skip]
    let rows: Vec<(u32, Option<Duration>, bool, Step)> = vec![
        // The first attempt at once, even right after an earlier success.
        (0, None, false, Step::StartReplica),
        (0, secs(0.0), false, Step::StartReplica),
        (1, secs(0.4), false, Step::Wait(String::new())),
        (1, secs(0.5), false, Step::StartReplica),
        (2, secs(0.9), false, Step::Wait(String::new())),
        (2, secs(1.0), false, Step::StartReplica),
        (10, secs(29.0), false, Step::Wait(String::new())),
        (10, secs(30.0), false, Step::StartReplica),
        // A former primary's rejoin backs off the same way.
        (2, secs(0.9), true, Step::Wait(String::new())),
        (2, secs(1.0), true, Step::Rejoin("a".into())),
    ];
    for (failed, since, was_primary, want) in rows {
        let got = at(failed, since, was_primary);
        match want {
            Step::Wait(_) => assert!(
                matches!(&got, Step::Wait(w) if w.contains("back-off")),
                "{failed} failed, {since:?} since: {got:?}"
            ),
            want => assert_eq!(got, want, "{failed} failed, {since:?} since"),
        }
    }
    // A running former primary and a stuck replica rejoin with the same back-off.
    let mut v = view("b", replica(Some("a"), 9), Ok(led.clone()));
    v.was_primary = true;
    v.failed_starts = 1;
    v.since_last_start = secs(0.1);
    assert!(matches!(decide(&v), Step::Wait(_)));
    v.since_last_start = secs(0.6);
    assert_eq!(decide(&v), Step::Rejoin("a".into()));
}

/// A long action under way (`jobs.rs`): the round publishes the heartbeat and takes no step,
/// whatever the store says.
#[test]
fn a_busy_node_takes_no_step() {
    use crate::jobs::JobKind;
    let led = store(
        Some("a"),
        vec![member("a", "primary", 10), member("b", "cloning", 0)],
        &["b"],
    );
    let leaderless = store(None, vec![member("b", "rewinding", 0)], &["b"]);
    for kind in [JobKind::Clone, JobKind::Rejoin, JobKind::Reclone] {
        for s in [led.clone(), leaderless.clone()] {
            let mut v = view("b", Local::Busy(kind), Ok(s));
            v.was_primary = true;
            v.upstream_lacks_wal = true;
            v.not_streaming_for = STUCK_REPLICA;
            assert!(
                matches!(decide(&v), Step::Wait(w) if w.contains(kind.role())),
                "{kind:?}"
            );
        }
        assert!(matches!(
            decide(&view("b", Local::Busy(kind), Err("timeout".into()))),
            Step::Wait(_)
        ));
    }
}

#[test]
fn a_restart_request_is_carried_out_by_a_following_replica_only() {
    let mut asked = store(
        Some("a"),
        vec![member("a", "primary", 10), member("b", "replica", 9)],
        &["b"],
    );
    asked.restarts = vec!["b".into()];
    assert_eq!(
        decide(&view("b", replica(Some("a"), 9), Ok(asked.clone()))),
        Step::Restart("a".into())
    );
    // Pointed elsewhere first: following the leader comes before the restart.
    assert_eq!(
        decide(&view("b", replica(Some("c"), 9), Ok(asked.clone()))),
        Step::Follow("a".into())
    );
    // Another member's request, or the leader's own: nothing for this round.
    assert!(matches!(
        decide(&view("c", replica(Some("a"), 9), Ok(asked.clone()))),
        Step::Wait(_)
    ));
    asked.restarts = vec!["a".into()];
    assert_eq!(
        decide(&view("a", Local::Primary, Ok(asked))),
        Step::Renew,
        "a leader is restarted through a switchover, never in place"
    );
}

#[test]
fn a_standby_never_consistent_rejoins_the_leader() {
    let led = store(
        Some("a"),
        vec![member("a", "primary", 10), member("b", "unreachable", 0)],
        &[],
    );
    let mut v = view("b", Local::NotAnswering, Ok(led));
    v.policy = policy();
    assert!(matches!(decide(&v), Step::Wait(_)), "starting: waits");
    v.not_streaming_for = STUCK_STARTING;
    assert_eq!(decide(&v), Step::Rejoin("a".into()));
}

/// A stopped former primary rewinds only from a leader that serves as primary: while the new
/// leader's promotion (and its checkpoint) runs, pg_rewind would see no timeline fork.
#[test]
fn a_former_primary_waits_for_the_leader_to_serve_before_rewinding() {
    for (leader_role, local) in [("replica", Local::Stopped), ("starting", Local::Stopped)] {
        let led = store(
            Some("a"),
            vec![member("a", leader_role, 10), member("b", "replica", 9)],
            &[],
        );
        let mut v = view("b", local.clone(), Ok(led));
        v.was_primary = true;
        assert!(
            matches!(decide(&v), Step::Wait(ref w) if w.contains("does not serve as primary")),
            "{leader_role}, {local:?}: {:?}",
            decide(&v)
        );
    }
    let served = store(Some("a"), vec![member("a", "primary", 10)], &[]);
    let mut v = view("b", Local::Stopped, Ok(served));
    v.was_primary = true;
    assert_eq!(decide(&v), Step::Rejoin("a".into()));
}
