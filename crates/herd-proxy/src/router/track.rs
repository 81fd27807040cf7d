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
    /// Sent by the proxy on its own behalf: the client must not see the answer.
    swallow: bool,
    /// Answered by the proxy with these bytes instead of by the server.
    synthetic: Option<Vec<u8>>,
    /// Caller's tag to learn about failures (e.g. a `Parse` whose statement must be forgotten).
    id: Option<u64>,
}

/// What to do with one server message.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct Disposition {
    /// Send the message on to the client.
    pub forward: bool,
    /// The transaction status when the message was a `ReadyForQuery` ('I', 'T' or 'E').
    pub ready: Option<u8>,
    /// Ids of queued messages that failed or were skipped because of an error.
    pub failed: Vec<u64>,
}

/// The queue of messages awaiting answers on one server connection.
#[derive(Debug, Default)]
pub struct Tracker {
    queue: VecDeque<Pending>,
    /// Inside a `Describe` of a statement, after its `ParameterDescription`.
    seen_parameter_description: bool,
}

impl Tracker {
    /// A message sent to the server; its answer goes to the client unless `swallow`.
    pub fn sent(&mut self, expect: Expect, swallow: bool, id: Option<u64>) {
        self.queue.push_back(Pending {
            expect,
            swallow,
            synthetic: None,
            id,
        });
    }

    /// A client message the proxy answers itself with `answer`, in order with the server's answers.
    /// Synthetic answers already due are appended to `to_client`.
    pub fn answered_by_proxy(&mut self, expect: Expect, answer: Vec<u8>, to_client: &mut Vec<u8>) {
        self.queue.push_back(Pending {
            expect,
            swallow: false,
            synthetic: Some(answer),
            id: None,
        });
        self.emit_synthetic(to_client);
    }

    /// No answers outstanding: the server is between messages.
    pub fn is_idle(&self) -> bool {
        self.queue.is_empty()
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
        let Some(head) = self.queue.front().cloned() else {
            // Unexpected: forward rather than hide anything from the client.
            to_client.extend_from_slice(raw);
            return Disposition {
                forward: true,
                ready: ready_status,
                failed: vec![],
            };
        };
        let mut d = Disposition {
            forward: !head.swallow,
            ready: ready_status,
            ..Default::default()
        };
        if d.forward {
            to_client.extend_from_slice(raw);
        }
        if tag == b'E' {
            if head.expect == Expect::Query {
                // A simple query's error is followed by its ReadyForQuery.
                return d;
            }
            // Extended protocol: the server skips everything up to the next Sync; so does the client's
            // view, including answers the proxy would have given itself.
            while let Some(p) = self.queue.front() {
                if p.expect == Expect::Sync {
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
            Expect::Sync | Expect::Query => tag == b'Z',
        };
        if completes {
            self.queue.pop_front();
            self.emit_synthetic(to_client);
        }
        d
    }

    fn emit_synthetic(&mut self, to_client: &mut Vec<u8>) {
        while let Some(answer) = self.queue.front().and_then(|p| p.synthetic.clone()) {
            to_client.extend_from_slice(&answer);
            self.queue.pop_front();
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
        t.answered_by_proxy(Expect::Parse, msg(b'1'), &mut out);
        assert_eq!(out, msg(b'1'), "due at once: nothing is ahead of it");
        t.sent(Expect::Bind, false, None);
        t.answered_by_proxy(Expect::Close, msg(b'3'), &mut out);
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
        t.answered_by_proxy(Expect::Close, msg(b'3'), &mut out);
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
}
