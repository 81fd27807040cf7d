//! Matching a server's responses to the messages sent to it, in order.
//!
//! The proxy sometimes answers a client message itself (a `Parse` of a statement the server
//! already holds, a `Close` of a shared statement) or sends messages the client did not
//! (a `Parse` the server lacks). Every message sent or answered is queued here with what its
//! response looks like, so each server message can be forwarded or swallowed, synthetic
//! answers are emitted in the right place, and the proxy knows when the server is idle.

use std::collections::VecDeque;

/// What a queued message is answered with.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Expect {
    /// `Parse` → `ParseComplete` ('1').
    Parse,
    /// `Bind` → `BindComplete` ('2').
    Bind,
    /// `Describe` of a statement → `ParameterDescription` ('t') then `RowDescription` ('T') or `NoData` ('n').
    DescribeStatement,
    /// `Describe` of a portal → `RowDescription` or `NoData`.
    DescribePortal,
    /// `Execute` → rows, then `CommandComplete` ('C'), `EmptyQueryResponse` ('I') or `PortalSuspended` ('s').
    Execute,
    /// `Close` → `CloseComplete` ('3').
    Close,
    /// `Sync` → `ReadyForQuery` ('Z').
    Sync,
    /// Simple `Query` → everything up to `ReadyForQuery`.
    Query,
}

/// One queued message.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Pending {
    expect: Expect,
    /// Sent by the proxy on its own behalf: the client must not see the answer (errors
    /// excepted: a failure of a message sent for the client's sake is the client's to see).
    swallow: bool,
    /// Answered by the proxy with these bytes instead of by the server.
    synthetic: Option<Vec<u8>>,
    /// Sent to make the server fail the way PostgreSQL would have failed the client's message:
    /// the server's ErrorResponse is replaced by these bytes.
    error_override: Option<Vec<u8>>,
    /// Caller's tag to learn about failures (e.g. a `Parse` whose statement must be forgotten).
    id: Option<u64>,
    /// A `Describe` of a statement whose `ParameterDescription` the client already has (from
    /// an attempt of the same unit that failed after it): that part is swallowed.
    parameters_given: bool,
}

/// What to do with one server message.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct Disposition {
    /// Send the message on to the client.
    pub forward: bool,
    /// The transaction status when the message was a `ReadyForQuery` ('I', 'T' or 'E').
    pub ready: Option<u8>,
    /// Ids of queued messages that failed or were skipped because of an error, in the order
    /// they were sent.
    pub failed: Vec<u64>,
}

/// The queue of messages awaiting answers on one server connection.
#[derive(Debug, Default)]
#[cfg_attr(test, derive(Clone, PartialEq))]
pub struct Tracker {
    queue: VecDeque<Pending>,
    /// Inside a `Describe` of a statement, after its `ParameterDescription`.
    seen_parameter_description: bool,
    /// An extended-protocol error arrived and no `Sync` was sent after the failed message:
    /// the server discards everything up to the next `Sync`, answering nothing.
    skipping: bool,
    /// Client requests answered (to the client) since the tracker was emptied.
    answered: usize,
    /// An `Execute` or a simple query got an answer since the tracker was emptied: something
    /// may have run.
    executed: bool,
    /// The client was given a result description (RowDescription or NoData of a `Describe`)
    /// since the tracker was emptied: a rerun could describe the result otherwise.
    described: bool,
    /// Client requests still to come whose answers the client already has (a unit run again,
    /// see [`Tracker::given`]), and whether the first after them is a `Describe` of a statement
    /// whose `ParameterDescription` it has too.
    given: (usize, bool),
}

/// Where a unit's answers stopped when a server failed one of its requests: what the client
/// was given of them (see [`Tracker::stopped_at`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Given {
    /// Client requests answered in full.
    pub answered: usize,
    /// The failed request is a `Describe` of a statement whose `ParameterDescription` the
    /// client has.
    pub parameters: bool,
}

impl Tracker {
    /// A message sent to the server; its answer goes to the client unless `swallow`.
    /// Returns `false` when the server will discard it unanswered (it is skipping to the next
    /// `Sync` after an error): nothing is queued then.
    pub fn sent(&mut self, expect: Expect, swallow: bool, id: Option<u64>) -> bool {
        self.push(Pending {
            expect,
            swallow,
            synthetic: None,
            error_override: None,
            id,
            parameters_given: false,
        })
    }

    /// A message sent so that the server raises an error in the client's place; `error` is the
    /// ErrorResponse the client sees instead of the server's, and a success is swallowed.
    pub fn sent_to_fail(&mut self, expect: Expect, error: Vec<u8>) -> bool {
        self.push(Pending {
            expect,
            swallow: true,
            synthetic: None,
            error_override: Some(error),
            id: None,
            parameters_given: false,
        })
    }

    fn push(&mut self, mut p: Pending) -> bool {
        if self.skipping {
            if p.expect != Expect::Sync && p.expect != Expect::Query {
                return false;
            }
            self.skipping = false;
        }
        if !p.swallow && !matches!(p.expect, Expect::Sync | Expect::Query) {
            match self.given {
                (0, false) => {}
                (0, true) => {
                    p.parameters_given = p.expect == Expect::DescribeStatement;
                    self.given.1 = false;
                }
                (n, _) => {
                    // Answered in the attempt that failed: the client has it already.
                    p.swallow = true;
                    if p.synthetic.is_some() {
                        p.synthetic = Some(Vec::new());
                    }
                    self.given.0 = n - 1;
                }
            }
        }
        self.queue.push_back(p);
        true
    }

    /// The unit about to be sent was sent before, and failed after the client was given
    /// `given` of its answers: those are swallowed this time, so that the client sees each
    /// answer once.
    pub fn given(&mut self, given: Given) {
        self.given = (given.answered, given.parameters);
    }

    /// What the client was given of the unit's answers, when the server has just failed
    /// the request at the head (its ErrorResponse not yet handled) and running the unit again
    /// from its start could do no harm: nothing was executed (no `Execute` or simple query
    /// answered, the failed request is none), no result was described to the client (a
    /// schema change could describe it otherwise the second time), and nothing was sent after
    /// the unit's one `Sync`. `None` otherwise.
    pub fn stopped_at(&self) -> Option<Given> {
        let head = self.queue.front()?;
        let harmless = matches!(
            head.expect,
            Expect::Parse | Expect::Bind | Expect::DescribeStatement | Expect::DescribePortal
        );
        let ends = self
            .queue
            .iter()
            .filter(|p| matches!(p.expect, Expect::Sync | Expect::Query))
            .count();
        let last_is_sync = self.queue.back().is_some_and(|p| p.expect == Expect::Sync);
        if self.executed || self.described || !harmless || ends != 1 || !last_is_sync {
            return None;
        }
        Some(Given {
            answered: self.answered,
            parameters: head.expect == Expect::DescribeStatement
                && self.seen_parameter_description
                && !head.swallow
                && !head.parameters_given,
        })
    }

    /// Empties the tracker for another unit on the same server connection, keeping the
    /// allocation of its queue (a new queue cost an allocation and its growth per transaction).
    pub fn reset(&mut self) {
        self.queue.clear();
        self.seen_parameter_description = false;
        self.skipping = false;
        self.answered = 0;
        self.executed = false;
        self.described = false;
        self.given = (0, false);
    }

    /// True while the server discards extended-protocol messages after an error (until the
    /// next `Sync`): a client message sent now has no effect and gets no answer.
    pub fn skipping(&self) -> bool {
        self.skipping
    }

    /// A client message the proxy answers itself with `answer`, in order with the server's answers.
    /// Synthetic answers already due are appended to `to_client`. Returns `false` (and sends
    /// nothing) when the message falls in the part of a batch the server skips after an error.
    pub fn answered_by_proxy(
        &mut self,
        expect: Expect,
        answer: Vec<u8>,
        id: Option<u64>,
        to_client: &mut Vec<u8>,
    ) -> bool {
        if !self.push(Pending {
            expect,
            swallow: false,
            synthetic: Some(answer),
            error_override: None,
            id,
            parameters_given: false,
        }) {
            return false;
        }
        self.emit_synthetic(to_client);
        true
    }

    /// No answers outstanding: the server is between messages.
    pub fn is_idle(&self) -> bool {
        self.queue.is_empty()
    }

    /// Takes a server message tagged `tag`, arriving now, as one that only passes through:
    /// forwarded as it is, and answering at most a plain request at the head (one the client
    /// sent, answered by the server, with no answer of the proxy's due right after it). Then
    /// the tracker has done exactly what [`Tracker::on_server_message`] would have done, and
    /// the relay copies a run of such messages at once (rows, descriptions, completions: all
    /// of an extended-protocol reply but its ReadyForQuery) instead of handing each over.
    /// `false`: nothing changed; the message must go through `on_server_message`.
    pub fn pass(&mut self, tag: u8) -> bool {
        let Some(head) = self.queue.front() else {
            return false;
        };
        if head.swallow || matches!(tag, b'E' | b'Z' | b'N' | b'S' | b'A') {
            return false;
        }
        let completes = match head.expect {
            Expect::Query | Expect::Sync => {
                self.executed |= head.expect == Expect::Query;
                return true;
            }
            Expect::Execute if !matches!(tag, b'C' | b'I' | b's') => {
                self.executed = true;
                return true;
            }
            Expect::Execute => true,
            Expect::Parse => tag == b'1',
            Expect::Bind => tag == b'2',
            Expect::Close => tag == b'3',
            Expect::DescribePortal => matches!(tag, b'T' | b'n'),
            // Two messages answer it: left to `on_server_message`.
            Expect::DescribeStatement => false,
        };
        if !completes || self.queue.get(1).is_some_and(|p| p.synthetic.is_some()) {
            return false;
        }
        self.executed |= head.expect == Expect::Execute;
        self.described |= head.expect == Expect::DescribePortal;
        self.answered += 1;
        self.queue.pop_front();
        true
    }

    /// Handles one whole server message `raw` (tag first): appends it to `to_client` unless it
    /// answers a swallowed request, then any synthetic answers that have become due.
    pub fn on_server_message(&mut self, raw: &[u8], to_client: &mut Vec<u8>) -> Disposition {
        let tag = raw.first().copied().unwrap_or(0);
        let ready_status = if tag == b'Z' {
            raw.get(5).copied()
        } else {
            None
        };
        // Asynchronous messages belong to no request.
        if matches!(tag, b'N' | b'S' | b'A') {
            to_client.extend_from_slice(raw);
            return Disposition {
                forward: true,
                ..Default::default()
            };
        }
        if tag == b'Z' {
            return self.on_ready(raw, ready_status, to_client);
        }
        let Some(head) = self.queue.front_mut() else {
            // Unexpected: forward rather than hide anything from the client.
            to_client.extend_from_slice(raw);
            return Disposition {
                forward: true,
                ..Default::default()
            };
        };
        if tag == b'E' {
            match head.error_override.take() {
                Some(replacement) => to_client.extend_from_slice(&replacement),
                None => to_client.extend_from_slice(raw),
            }
            let mut d = Disposition {
                forward: true,
                ..Default::default()
            };
            if head.expect == Expect::Query {
                // A simple query's error is followed by its ReadyForQuery.
                return d;
            }
            // Extended protocol: the server skips everything up to the next Sync; so does the
            // client's view, including answers the proxy would have given itself.
            self.skipping = true;
            while let Some(p) = self.queue.front() {
                if p.expect == Expect::Sync || p.expect == Expect::Query {
                    // Sent after the failed message: the server stops skipping there.
                    self.skipping = false;
                    break;
                }
                if let Some(id) = p.id {
                    d.failed.push(id);
                }
                self.queue.pop_front();
            }
            self.seen_parameter_description = false;
            return d;
        }
        let d = Disposition {
            // The ParameterDescription of a rerun's Describe the client already has, too.
            forward: !(head.swallow || (tag == b't' && head.parameters_given)),
            ..Default::default()
        };
        if d.forward {
            to_client.extend_from_slice(raw);
        }
        let client_request = !head.swallow;
        self.executed |= matches!(head.expect, Expect::Execute | Expect::Query);
        self.described |= d.forward
            && matches!(tag, b'T' | b'n')
            && matches!(
                head.expect,
                Expect::DescribeStatement | Expect::DescribePortal
            );
        let completes = match head.expect {
            Expect::Parse => tag == b'1',
            Expect::Bind => tag == b'2',
            Expect::Close => tag == b'3',
            Expect::DescribeStatement => {
                if tag == b't' {
                    self.seen_parameter_description = true;
                    false
                } else {
                    matches!(tag, b'T' | b'n')
                        && std::mem::take(&mut self.seen_parameter_description)
                }
            }
            Expect::DescribePortal => matches!(tag, b'T' | b'n'),
            Expect::Execute => matches!(tag, b'C' | b'I' | b's'),
            Expect::Sync | Expect::Query => false,
        };
        if completes {
            self.answered += usize::from(client_request);
            self.queue.pop_front();
            self.emit_synthetic(to_client);
        }
        d
    }

    /// ReadyForQuery ends the oldest `Sync` or `Query`. Anything queued before it can no longer
    /// be answered: it is dropped (and reported failed) so the tracker never waits forever.
    fn on_ready(&mut self, raw: &[u8], status: Option<u8>, to_client: &mut Vec<u8>) -> Disposition {
        let mut d = Disposition {
            forward: true,
            ready: status,
            failed: Vec::new(),
        };
        let mut swallow = false;
        while let Some(p) = self.queue.pop_front() {
            if matches!(p.expect, Expect::Sync | Expect::Query) {
                swallow = p.swallow;
                break;
            }
            if let Some(id) = p.id {
                d.failed.push(id);
            }
        }
        self.skipping = false;
        self.seen_parameter_description = false;
        d.forward = !swallow;
        if d.forward {
            to_client.extend_from_slice(raw);
        }
        self.emit_synthetic(to_client);
        d
    }

    fn emit_synthetic(&mut self, to_client: &mut Vec<u8>) {
        while let Some(answer) = self.queue.front().and_then(|p| p.synthetic.clone()) {
            to_client.extend_from_slice(&answer);
            if let Some(p) = self.queue.pop_front() {
                self.answered += usize::from(!p.swallow);
            }
        }
    }
}

#[cfg(test)]
mod tests {
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
}
