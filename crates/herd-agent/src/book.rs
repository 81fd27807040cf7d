//! What the agent's rounds remember about their own server between rounds, as inputs of the
//! pure decision: since when a replica has not streamed, since when the leader's server has
//! not served, and the start attempts the back-off counts (herd-cluster's `PrimaryWatch` and
//! `StartBook`, for one node).

use std::time::{Duration, Instant};

use crate::decide::Local;

/// The round's bookkeeping.
#[derive(Debug, Default)]
pub struct Book {
    /// Since when the replica has not streamed.
    not_streaming_since: Option<Instant>,
    /// Since when the server has not served while this member held the lease.
    down_since: Option<Instant>,
    /// Start attempts since the server last served.
    failed_starts: u32,
    /// The last start attempt.
    last_start: Option<Instant>,
}

impl Book {
    /// Updates from this round's probe and whether this member holds the lease (`None`: the
    /// store could not be read, which changes nothing here). True when the leader's server
    /// has just stopped serving (worth a line in the log: the rounds only renew meanwhile).
    pub fn observe(&mut self, local: &Local, leads: Option<bool>, now: Instant) -> bool {
        match local {
            // A standby that does not answer (still starting, or never reaching a consistent
            // point because its upstream's history moved on) does not stream either.
            Local::Replica {
                streaming: false, ..
            }
            | Local::NotAnswering => {
                self.not_streaming_since.get_or_insert(now);
            }
            _ => self.not_streaming_since = None,
        }
        if matches!(local, Local::Primary | Local::Replica { .. }) {
            // It serves: whatever start came before worked.
            self.failed_starts = 0;
        }
        let down = matches!(local, Local::Stopped | Local::NotAnswering);
        match leads {
            Some(true) if down => {
                let fresh = self.down_since.is_none();
                self.down_since.get_or_insert(now);
                fresh
            }
            Some(_) => {
                self.down_since = None;
                false
            }
            None => false,
        }
    }

    /// A start (as primary or standby) or a rejoin is attempted now.
    pub fn start_attempted(&mut self, now: Instant) {
        self.failed_starts = self.failed_starts.saturating_add(1);
        self.last_start = Some(now);
    }

    /// The replica follows a new upstream, or was cloned afresh: it gets its own time to start
    /// streaming.
    pub fn streaming_restarts(&mut self) {
        self.not_streaming_since = None;
    }

    /// How long the replica has not streamed.
    pub fn not_streaming_for(&self, now: Instant) -> Duration {
        self.not_streaming_since
            .map_or(Duration::ZERO, |t| now.saturating_duration_since(t))
    }

    /// How long the leader's server has not served.
    pub fn down_for(&self, now: Instant) -> Option<Duration> {
        self.down_since.map(|t| now.saturating_duration_since(t))
    }

    /// Start attempts since the server last served.
    pub fn failed_starts(&self) -> u32 {
        self.failed_starts
    }

    /// Time since the last start attempt.
    pub fn since_last_start(&self, now: Instant) -> Option<Duration> {
        self.last_start.map(|t| now.saturating_duration_since(t))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_leaders_downtime_counts_only_while_it_leads() {
        let mut book = Book::default();
        let t0 = Instant::now();
        let at = |s: u64| t0 + Duration::from_secs(s);
        assert!(!book.observe(&Local::Primary, Some(true), at(0)));
        assert_eq!(book.down_for(at(0)), None);
        assert!(
            book.observe(&Local::Stopped, Some(true), at(1)),
            "newly down"
        );
        assert!(!book.observe(&Local::Stopped, Some(true), at(2)));
        // The store unreadable for a round: the clock keeps running.
        assert!(!book.observe(&Local::NotAnswering, None, at(3)));
        assert_eq!(book.down_for(at(4)), Some(Duration::from_secs(3)));
        // Back, or another member leads: no downtime.
        book.observe(&Local::Primary, Some(true), at(5));
        assert_eq!(book.down_for(at(5)), None);
        book.observe(&Local::Stopped, Some(true), at(6));
        book.observe(&Local::Stopped, Some(false), at(7));
        assert_eq!(book.down_for(at(7)), None);
    }

    #[test]
    fn start_attempts_count_until_the_server_serves() {
        let mut book = Book::default();
        let t0 = Instant::now();
        assert_eq!(book.since_last_start(t0), None);
        book.start_attempted(t0);
        book.observe(&Local::NotAnswering, Some(false), t0);
        book.start_attempted(t0 + Duration::from_secs(1));
        assert_eq!(book.failed_starts(), 2);
        assert_eq!(
            book.since_last_start(t0 + Duration::from_secs(3)),
            Some(Duration::from_secs(2))
        );
        let replica = Local::Replica {
            upstream: None,
            streaming: false,
            lsn: None,
        };
        book.observe(&replica, Some(false), t0 + Duration::from_secs(4));
        assert_eq!(book.failed_starts(), 0);
        // Not answering at t0 already counted as not streaming.
        assert_eq!(
            book.not_streaming_for(t0 + Duration::from_secs(6)),
            Duration::from_secs(6)
        );
        book.streaming_restarts();
        assert_eq!(
            book.not_streaming_for(t0 + Duration::from_secs(6)),
            Duration::ZERO
        );
    }
}
