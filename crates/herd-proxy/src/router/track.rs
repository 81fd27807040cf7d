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
    /// The server is in COPY FROM STDIN (it sent CopyInResponse) until the client's CopyDone
    /// or CopyFail: PostgreSQL ignores a `Sync` meanwhile, so none is expected to be answered.
    copy_in: bool,
    /// That COPY was started by an extended-protocol Execute: after the client's CopyDone or
    /// CopyFail the server answers nothing more until the client's next `Sync`.
    copy_extended: bool,
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
        if self.copy_in && p.expect == Expect::Sync {
            return false;
        }
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

    /// The server sent CopyInResponse: it reads CopyData now and ignores any `Sync` until the
    /// copy ends, so the `Sync`s sent right after the `Execute` that started it (a driver's
    /// Bind, Execute, Sync) are answered by nobody; the one after CopyDone is.
    fn enter_copy_in(&mut self) {
        self.copy_in = true;
        self.copy_extended = self.queue.front().map(|p| p.expect) == Some(Expect::Execute);
        if self.copy_extended {
            while self.queue.get(1).map(|p| p.expect) == Some(Expect::Sync) {
                self.queue.remove(1);
            }
        }
    }

    /// The server reads a COPY's rows now (CopyInResponse seen, CopyDone or CopyFail not sent).
    pub fn in_copy(&self) -> bool {
        self.copy_in
    }

    /// The COPY under way was started by an extended-protocol Execute: its CopyDone or
    /// CopyFail leaves the batch open until the client's next `Sync`.
    pub fn copy_owes_sync(&self) -> bool {
        self.copy_in && self.copy_extended
    }

    /// The client's CopyDone or CopyFail was sent: `Sync`s count again.
    pub fn copy_ended(&mut self) {
        self.copy_in = false;
        self.copy_extended = false;
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
        if head.swallow || matches!(tag, b'E' | b'Z' | b'N' | b'S' | b'A' | b'G') {
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
        if tag == b'G' {
            self.enter_copy_in();
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
        self.copy_in = false;
        self.copy_extended = false;
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
mod tests;
