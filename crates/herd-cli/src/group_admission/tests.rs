//! Table tests of the coordinator's admission decision.

use super::*;

fn claim(group: u32, state: State, at_s: u64) -> Claim {
    Claim {
        group,
        by: "coordinator a0".into(),
        api: "10.0.0.9:8080".into(),
        state,
        text: String::new(),
        at_s,
    }
}

#[test]
fn the_coordinator_admits_a_recorded_group_whose_primary_is_up() {
    let apis = vec!["10.0.0.8:8080".to_string(), "10.0.0.9:8080".to_string()];
    let now = 10_000;
    let admitting = claim(2, State::Admitting, now - 10);
    let stale = claim(2, State::Admitting, now - CLAIM_LIFE.as_secs() - 1);
    let failed = claim(2, State::Failed, now - 10);
    let older = claim(1, State::Admitting, now - 10);
    let admit = |api: &str| Step::Admit {
        group: 2,
        api: api.into(),
    };
    // (recorded, served, primary up, apis, claim, failures, backing off) -> step
    type Case<'a> = (
        u32,
        u32,
        bool,
        &'a [String],
        Option<&'a Claim>,
        u32,
        bool,
        Step,
    );
    let cases: Vec<Case> = vec![
        (3, 3, true, &apis, None, 0, false, Step::Idle),
        (3, 3, false, &[], Some(&admitting), 0, false, Step::Idle),
        (3, 2, false, &apis, None, 0, false, Step::WaitPrimary(2)),
        (3, 2, true, &[], None, 0, false, Step::NoProxy(2)),
        (3, 2, true, &apis, None, 0, false, admit("10.0.0.8:8080")),
        (
            3,
            2,
            true,
            &apis,
            Some(&admitting),
            0,
            false,
            Step::Busy(2, "coordinator a0".into()),
        ),
        // A claim whose writer died is taken over; a finished or another group's is not in
        // the way.
        (
            3,
            2,
            true,
            &apis,
            Some(&stale),
            0,
            false,
            admit("10.0.0.8:8080"),
        ),
        (
            3,
            2,
            true,
            &apis,
            Some(&failed),
            0,
            false,
            admit("10.0.0.8:8080"),
        ),
        (
            3,
            2,
            true,
            &apis,
            Some(&older),
            0,
            false,
            admit("10.0.0.8:8080"),
        ),
        // After failures: back off, then the next proxy.
        (3, 2, true, &apis, Some(&failed), 1, true, Step::BackOff(2)),
        (
            3,
            2,
            true,
            &apis,
            Some(&failed),
            1,
            false,
            admit("10.0.0.9:8080"),
        ),
        (
            3,
            2,
            true,
            &apis,
            Some(&failed),
            2,
            false,
            admit("10.0.0.8:8080"),
        ),
    ];
    for (recorded, served, primary_up, apis, claim, failures, backing_off, want) in cases {
        let view = View {
            recorded,
            served,
            primary_up,
            apis,
            claim,
            asked_missing: Duration::ZERO,
            now_s: now,
            failures,
            backing_off,
        };
        assert_eq!(decide(&view), want, "{view:?}");
    }
}

#[test]
fn back_off_doubles_up_to_a_minute() {
    let got: Vec<u64> = (0..8).map(|f| backoff(f).as_secs()).collect();
    assert_eq!(got, vec![0, 2, 4, 8, 16, 32, 60, 60]);
    assert_eq!(backoff(u32::MAX), MAX_BACKOFF);
}

#[test]
fn each_step_says_what_it_does() {
    assert!(Step::NoProxy(2).describe().contains("--api-listen"));
    assert!(Step::Admit {
        group: 2,
        api: "h:1".into()
    }
    .describe()
    .contains("h:1"));
}

#[test]
fn a_claim_through_a_proxy_gone_is_taken_over_after_a_while() {
    let apis = vec!["10.0.0.8:8080".to_string()];
    let now = 10_000;
    // The coordinator's claim names 10.0.0.9, which no longer registers.
    let gone = claim(2, State::Admitting, now - 20);
    let mut by_command = gone.clone();
    by_command.by = "herd group add".into();
    let busy = Step::Busy(2, "coordinator a0".into());
    let admit = Step::Admit {
        group: 2,
        api: "10.0.0.8:8080".into(),
    };
    let cases = [
        (&gone, Duration::ZERO, busy.clone()),
        (&gone, ABANDONED_AFTER - Duration::from_secs(1), busy),
        (&gone, ABANDONED_AFTER, admit),
        // The command's claim names the address the user typed: it keeps its full life.
        (
            &by_command,
            ABANDONED_AFTER * 3,
            Step::Busy(2, "herd group add".into()),
        ),
    ];
    for (c, missing, want) in cases {
        let view = View {
            recorded: 3,
            served: 2,
            primary_up: true,
            apis: &apis,
            claim: Some(c),
            asked_missing: missing,
            now_s: now,
            failures: 0,
            backing_off: false,
        };
        assert_eq!(decide(&view), want, "{view:?}");
    }
    assert!(asks_missing_proxy(&gone, &apis));
    assert!(!asks_missing_proxy(&by_command, &apis));
    let mut finished = gone.clone();
    finished.state = State::Failed;
    assert!(!asks_missing_proxy(&finished, &apis));
}

#[test]
fn a_missing_proxy_is_timed_from_when_this_coordinator_first_saw_it() {
    let apis = vec!["10.0.0.8:8080".to_string()];
    let gone = claim(2, State::Admitting, 1);
    let mut m = Missing::default();
    assert!(m.note(Some(&gone), &apis) < ABANDONED_AFTER);
    assert!(m.abandoned().is_none());
    // Backdate the first sighting: the same claim is then abandoned.
    m.seen = Some((gone.clone(), Instant::now() - ABANDONED_AFTER));
    assert!(m.note(Some(&gone), &apis) >= ABANDONED_AFTER);
    assert_eq!(m.abandoned(), Some(&gone));
    // Another claim (written meanwhile) starts its own clock.
    let newer = claim(2, State::Admitting, 2);
    assert!(m.note(Some(&newer), &apis) < ABANDONED_AFTER);
    assert!(m.abandoned().is_none());
    // Its proxy registered again: nothing is missing.
    let both = vec!["10.0.0.8:8080".to_string(), "10.0.0.9:8080".to_string()];
    assert_eq!(m.note(Some(&newer), &both), Duration::ZERO);
    assert!(m.abandoned().is_none());
}
