use super::*;

fn msg(tag: u8) -> Vec<u8> {
    vec![tag, 0, 0, 0, 4]
}

fn rfq(status: u8) -> Vec<u8> {
    vec![b'Z', 0, 0, 0, 5, status]
}

/// `pass` may only say yes where `on_server_message` would forward the message alone and
/// leave the tracker as `pass` leaves it; a no changes nothing. Checked for every head,
/// every tag a server sends, and what may follow the head.
#[test]
fn passing_does_what_handling_would() {
    let heads = [
        Expect::Parse,
        Expect::Bind,
        Expect::DescribeStatement,
        Expect::DescribePortal,
        Expect::Execute,
        Expect::Close,
        Expect::Sync,
        Expect::Query,
    ];
    let (mut passing, mut completing) = (0, 0);
    for head in heads {
        for swallow in [false, true] {
            for synthetic_next in [false, true] {
                for tag in b"123tTnDCIsEZNSAGHWdc".iter().copied() {
                    let mut t = Tracker::default();
                    let mut out = Vec::new();
                    t.sent(head, swallow, Some(7));
                    if synthetic_next {
                        t.answered_by_proxy(Expect::Close, msg(b'3'), None, &mut out);
                    }
                    t.sent(Expect::Sync, false, None);
                    let mut handled = t.clone();
                    let before = t.clone();
                    if !t.pass(tag) {
                        assert_eq!(t, before, "a no changes nothing");
                        continue;
                    }
                    passing += 1;
                    completing += usize::from(t.queue.len() < before.queue.len());
                    let raw = if tag == b'Z' { rfq(b'I') } else { msg(tag) };
                    let d = handled.on_server_message(&raw, &mut out);
                    assert_eq!(out, raw, "{head:?} {}", tag as char);
                    assert_eq!(
                        d,
                        Disposition {
                            forward: true,
                            ..Default::default()
                        }
                    );
                    assert_eq!(t, handled, "{head:?} {}", tag as char);
                }
            }
        }
    }
    // Rows and descriptions under a query, an execution or a sync pass, and so do the
    // completions of plain requests.
    assert!(
        passing >= 3 * 10 && completing >= 5,
        "{passing} {completing}"
    );
    let mut t = Tracker::default();
    assert!(!t.pass(b'D'), "nothing queued");
    t.sent(Expect::Execute, false, None);
    for tag in [b'E', b'Z', b'S', b'N', b'A'] {
        assert!(!t.pass(tag), "{}", tag as char);
    }
    assert!(t.pass(b'D'));
    assert!(t.pass(b'C'));
    assert!(t.is_idle(), "the execution is answered");
}

#[test]
fn extended_batch_forwards_everything_in_order() {
    let mut t = Tracker::default();
    for e in [
        Expect::Parse,
        Expect::Bind,
        Expect::DescribePortal,
        Expect::Execute,
        Expect::Sync,
    ] {
        t.sent(e, false, None);
    }
    let mut out = Vec::new();
    for tag in [b'1', b'2', b'T', b'D', b'D', b'C'] {
        assert!(t.on_server_message(&msg(tag), &mut out).forward);
    }
    assert!(!t.is_idle());
    let d = t.on_server_message(&rfq(b'I'), &mut out);
    assert_eq!(d.ready, Some(b'I'));
    assert!(t.is_idle());
    assert_eq!(out.len(), 6 * 5 + 6);
}

#[test]
fn synthetic_answers_come_in_order() {
    let mut t = Tracker::default();
    let mut out = Vec::new();
    // Client: Parse(s1) [server already has it], Bind, Execute, Sync.
    t.answered_by_proxy(Expect::Parse, msg(b'1'), None, &mut out);
    assert_eq!(out, msg(b'1'), "due at once: nothing is ahead of it");
    t.sent(Expect::Bind, false, None);
    t.answered_by_proxy(Expect::Close, msg(b'3'), None, &mut out);
    t.sent(Expect::Execute, false, None);
    t.sent(Expect::Sync, false, None);
    out.clear();
    t.on_server_message(&msg(b'2'), &mut out);
    assert_eq!(
        out,
        [msg(b'2'), msg(b'3')].concat(),
        "CloseComplete after BindComplete"
    );
    out.clear();
    t.on_server_message(&msg(b'C'), &mut out);
    t.on_server_message(&rfq(b'I'), &mut out);
    assert_eq!(out, [msg(b'C'), rfq(b'I')].concat());
    assert!(t.is_idle());
}

#[test]
fn swallowed_requests_stay_hidden() {
    let mut t = Tracker::default();
    let mut out = Vec::new();
    t.sent(Expect::Parse, true, Some(7));
    t.sent(Expect::Bind, false, None);
    t.sent(Expect::Execute, false, None);
    t.sent(Expect::Sync, false, None);
    assert!(!t.on_server_message(&msg(b'1'), &mut out).forward);
    assert!(out.is_empty());
    t.on_server_message(&msg(b'2'), &mut out);
    assert_eq!(out, msg(b'2'));
}

#[test]
fn an_error_skips_to_sync_and_reports_failed_ids() {
    let mut t = Tracker::default();
    let mut out = Vec::new();
    t.sent(Expect::Parse, false, Some(1));
    t.sent(Expect::Bind, false, Some(2));
    t.answered_by_proxy(Expect::Close, msg(b'3'), None, &mut out);
    t.sent(Expect::Execute, false, None);
    t.sent(Expect::Sync, false, None);
    let d = t.on_server_message(&msg(b'E'), &mut out);
    assert!(d.forward);
    assert_eq!(d.failed, vec![1, 2]);
    assert_eq!(
        out,
        msg(b'E'),
        "the skipped synthetic CloseComplete is not sent"
    );
    assert_eq!(t.on_server_message(&rfq(b'I'), &mut out).ready, Some(b'I'));
    assert!(t.is_idle());
}

#[test]
fn simple_query_error_waits_for_ready() {
    let mut t = Tracker::default();
    let mut out = Vec::new();
    t.sent(Expect::Query, false, None);
    t.on_server_message(&msg(b'E'), &mut out);
    assert!(!t.is_idle());
    t.on_server_message(&rfq(b'E'), &mut out);
    assert!(t.is_idle());
}

#[test]
fn describe_statement_needs_both_messages() {
    let mut t = Tracker::default();
    let mut out = Vec::new();
    t.sent(Expect::DescribeStatement, false, None);
    t.sent(Expect::Sync, false, None);
    t.on_server_message(&msg(b't'), &mut out);
    t.on_server_message(&msg(b'n'), &mut out);
    assert_eq!(t.on_server_message(&rfq(b'T'), &mut out).ready, Some(b'T'));
    assert!(t.is_idle());
}

#[test]
fn async_messages_pass_through() {
    let mut t = Tracker::default();
    let mut out = Vec::new();
    for tag in [b'N', b'S', b'A'] {
        assert!(t.on_server_message(&msg(tag), &mut out).forward);
    }
    assert_eq!(out.len(), 15);
}

#[test]
fn error_before_the_sync_is_sent_skips_later_messages() {
    // Pipelined batch: the server fails the first Execute before the client's later
    // messages and its Sync reached the proxy (psycopg executemany, pgx batches).
    let mut t = Tracker::default();
    let mut out = Vec::new();
    t.sent(Expect::Parse, false, Some(1));
    t.sent(Expect::Bind, false, None);
    t.sent(Expect::Execute, false, None);
    t.on_server_message(&msg(b'1'), &mut out);
    t.on_server_message(&msg(b'2'), &mut out);
    let d = t.on_server_message(&msg(b'E'), &mut out);
    assert!(d.forward && d.failed.is_empty());
    assert!(t.skipping());
    // Later messages of the same batch get no answer from the server.
    assert!(!t.sent(Expect::Bind, false, None));
    assert!(
        !t.sent(Expect::Parse, true, Some(9)),
        "a re-Parse is skipped too"
    );
    assert!(!t.answered_by_proxy(Expect::Parse, msg(b'1'), Some(3), &mut out));
    assert!(!t.sent(Expect::Execute, false, None));
    assert!(t.sent(Expect::Sync, false, None));
    assert!(!t.skipping());
    out.clear();
    let d = t.on_server_message(&rfq(b'I'), &mut out);
    assert_eq!(d.ready, Some(b'I'));
    assert_eq!(out, rfq(b'I'), "the ReadyForQuery reaches the client");
    assert!(t.is_idle(), "the server can go back to its pool");
    // The next batch is tracked normally.
    assert!(t.sent(Expect::Sync, false, None));
    t.on_server_message(&rfq(b'I'), &mut out);
    assert!(t.is_idle());
}

#[test]
fn errors_of_swallowed_messages_reach_the_client() {
    let mut t = Tracker::default();
    let mut out = Vec::new();
    t.sent(Expect::Parse, true, Some(4)); // a re-prepare on the client's behalf
    t.sent(Expect::Bind, false, None);
    t.sent(Expect::Sync, false, None);
    let d = t.on_server_message(&msg(b'E'), &mut out);
    assert_eq!(d.failed, vec![4]);
    assert_eq!(out, msg(b'E'));
    t.on_server_message(&rfq(b'I'), &mut out);
    assert!(t.is_idle());
}

#[test]
fn an_error_can_be_replaced() {
    let mut t = Tracker::default();
    let mut out = Vec::new();
    let mine = vec![b'E', 0, 0, 0, 5, b'x'];
    t.sent_to_fail(Expect::Parse, mine.clone());
    t.sent(Expect::Sync, false, None);
    t.on_server_message(&msg(b'E'), &mut out);
    assert_eq!(out, mine);
}

#[test]
fn ready_for_query_clears_what_can_no_longer_be_answered() {
    let mut t = Tracker::default();
    let mut out = Vec::new();
    t.sent(Expect::Bind, false, Some(5));
    t.sent(Expect::Sync, false, None);
    let d = t.on_server_message(&rfq(b'I'), &mut out);
    assert_eq!(d.failed, vec![5]);
    assert!(t.is_idle());
}

/// A unit that failed after the client was given some answers runs again without giving
/// them twice; one that executed something does not run again.
#[test]
fn a_rerun_gives_each_answer_once() {
    let mut first = Tracker::default();
    let mut to_client = Vec::new();
    first.answered_by_proxy(Expect::Parse, msg(b'1'), None, &mut to_client);
    first.sent(Expect::DescribeStatement, false, None);
    first.sent(Expect::Sync, false, None);
    assert_eq!(to_client, msg(b'1'));
    first.on_server_message(&msg(b't'), &mut to_client);
    let given = first.stopped_at().expect("nothing ran");
    assert_eq!(
        given,
        Given {
            answered: 1,
            parameters: true
        }
    );

    let mut again = Tracker::default();
    again.given(given);
    let mut to_client = Vec::new();
    again.sent(Expect::Close, true, None);
    again.sent(Expect::Parse, false, None);
    again.sent(Expect::DescribeStatement, false, None);
    again.sent(Expect::Sync, false, None);
    for tag in [b'3', b'1', b't', b'T'] {
        again.on_server_message(&msg(tag), &mut to_client);
    }
    again.on_server_message(&rfq(b'I'), &mut to_client);
    let mut want = msg(b'T');
    want.extend_from_slice(&rfq(b'I'));
    assert_eq!(to_client, want, "only what the client did not have");
    assert!(again.is_idle());

    let mut ran = Tracker::default();
    let mut to_client = Vec::new();
    ran.sent(Expect::Bind, false, None);
    ran.sent(Expect::Execute, false, None);
    ran.sent(Expect::DescribeStatement, false, None);
    ran.sent(Expect::Sync, false, None);
    for tag in [b'2', b'C'] {
        ran.on_server_message(&msg(tag), &mut to_client);
    }
    assert_eq!(ran.stopped_at(), None, "an Execute ran");
    let mut more = Tracker::default();
    more.sent(Expect::DescribeStatement, false, None);
    more.sent(Expect::Sync, false, None);
    more.sent(Expect::Parse, false, None);
    more.sent(Expect::Sync, false, None);
    assert_eq!(more.stopped_at(), None, "more than the unit was sent");
    let mut described = Tracker::default();
    let mut to_client = Vec::new();
    described.sent(Expect::DescribeStatement, false, None);
    described.sent(Expect::Bind, false, None);
    described.sent(Expect::Sync, false, None);
    for tag in [b't', b'T'] {
        described.on_server_message(&msg(tag), &mut to_client);
    }
    assert_eq!(
        described.stopped_at(),
        None,
        "the client has a result description"
    );
}

/// A driver's COPY FROM STDIN in the extended protocol (Bind, Execute, Sync, then the rows,
/// CopyDone, Sync): PostgreSQL ignores the first Sync in copy mode and answers only the
/// second; the tracker expects exactly that, and is idle after it.
#[test]
fn copy_in_through_the_extended_protocol() {
    let mut t = Tracker::default();
    let mut out = Vec::new();
    t.sent(Expect::Bind, false, None);
    t.sent(Expect::Execute, false, None);
    t.sent(Expect::Sync, false, None);
    t.on_server_message(&msg(b'2'), &mut out);
    t.on_server_message(&msg(b'G'), &mut out);
    assert!(!t.is_idle(), "the COPY runs");
    assert!(t.in_copy());
    // A Sync the client sends during the copy is ignored by the server too.
    assert!(!t.sent(Expect::Sync, false, None));
    assert!(
        t.copy_owes_sync(),
        "its end leaves the batch open until a Sync"
    );
    t.copy_ended();
    assert!(!t.copy_owes_sync());
    assert!(!t.in_copy());
    t.sent(Expect::Sync, false, None);
    t.on_server_message(&msg(b'C'), &mut out);
    assert!(!t.is_idle());
    let d = t.on_server_message(&rfq(b'I'), &mut out);
    assert_eq!(d.ready, Some(b'I'));
    assert!(t.is_idle(), "{t:?}");
    // A simple query's COPY: no Sync involved, the Query is answered up to ReadyForQuery.
    t.sent(Expect::Query, false, None);
    t.on_server_message(&msg(b'G'), &mut out);
    assert!(!t.copy_owes_sync(), "ReadyForQuery follows its end");
    t.copy_ended();
    t.on_server_message(&msg(b'C'), &mut out);
    t.on_server_message(&rfq(b'I'), &mut out);
    assert!(t.is_idle());
}
