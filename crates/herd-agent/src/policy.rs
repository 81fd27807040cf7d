//! The agent's timings for a server that is down: how long a leader's server may be dead or
//! silent before the leader gives the lease up, and how restarts back off (the rules of
//! herd-ha's one-host supervisor, for one node).

use std::time::Duration;

/// When to give up on the local server and how often to try it again.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Policy {
    /// Delay before the second start attempt; doubled after each further failed one.
    pub restart_backoff: Duration,
    /// Upper bound of the restart delay.
    pub max_restart_backoff: Duration,
    /// How long the leader's server may have no postmaster before the leader abdicates (when
    /// another member can take over).
    pub failover_timeout: Duration,
    /// How long the leader's server may run without answering (hung, frozen or only
    /// overloaded) before the leader abdicates: longer, so a busy machine causes no failover.
    pub hung_timeout: Duration,
}

/// The first restart delay (herd-ha's default).
pub const RESTART_BACKOFF: Duration = Duration::from_millis(500);
/// The longest restart delay (herd-ha's default).
pub const MAX_RESTART_BACKOFF: Duration = Duration::from_secs(30);
/// The shortest dead-leader timeout: `herd up`'s `failover_timeout_ms` default.
pub const MIN_FAILOVER_TIMEOUT: Duration = Duration::from_secs(2);

impl Policy {
    /// The policy for an agent with these lease timings:
    ///
    /// - `failover_timeout`: 2 s (as `herd up`), or two rounds when the loop wait is longer, so
    ///   a postmaster that vanished is seen gone by at least two probes;
    /// - `hung_timeout`: `ttl − safety_margin`, the time a silent leader was given before this
    ///   rule existed (it stopped renewing and its watchdog fenced the server at that deadline);
    ///   with the defaults 7.5 s, close to `herd up`'s 8 s. Never shorter than
    ///   `failover_timeout`.
    pub fn for_agent(ttl: Duration, loop_wait: Duration, safety_margin: Duration) -> Policy {
        let failover_timeout = MIN_FAILOVER_TIMEOUT.max(loop_wait * 2);
        Policy {
            restart_backoff: RESTART_BACKOFF,
            max_restart_backoff: MAX_RESTART_BACKOFF,
            failover_timeout,
            hung_timeout: ttl.saturating_sub(safety_margin).max(failover_timeout),
        }
    }

    /// [`Policy::for_agent`] with the one-host settings of a herd.toml's `[supervisor]`, so
    /// `herd agent --config herd.toml` honours the same keys as `herd up`:
    /// `failover_timeout_ms` (never under two rounds), `hung_timeout_ms` (never under the
    /// former, and capped at `ttl − safety_margin`: past that the watchdog fences a silent
    /// leader anyway) and `restart_backoff_ms`. With `[supervisor]`'s defaults (2 s, 8 s,
    /// 0.5 s) and the agent's (10 s TTL, 1 s loop wait, 2.5 s margin) it is
    /// [`Policy::default`]. The second value says what was capped, for the log.
    pub fn for_agent_config(
        ttl: Duration,
        loop_wait: Duration,
        safety_margin: Duration,
        supervisor: &herd_config::SupervisorConfig,
    ) -> (Policy, Option<String>) {
        let failover_timeout =
            Duration::from_millis(supervisor.failover_timeout_ms).max(loop_wait * 2);
        let wanted = Duration::from_millis(supervisor.hung_timeout_ms).max(failover_timeout);
        let ceiling = ttl.saturating_sub(safety_margin).max(failover_timeout);
        let capped = (wanted > ceiling
            && supervisor.hung_timeout_ms
                != herd_config::SupervisorConfig::default().hung_timeout_ms)
            .then(|| {
                format!(
                    "supervisor.hung_timeout_ms = {} is longer than the lease allows (--ttl-ms \
                     minus --safety-margin-ms = {} ms): a silent leader gives its lease up after \
                     {} ms",
                    supervisor.hung_timeout_ms,
                    ceiling.as_millis(),
                    ceiling.as_millis()
                )
            });
        let policy = Policy {
            restart_backoff: Duration::from_millis(supervisor.restart_backoff_ms.max(1)),
            max_restart_backoff: MAX_RESTART_BACKOFF,
            failover_timeout,
            hung_timeout: wanted.min(ceiling),
        };
        (policy, capped)
    }

    /// Delay before the next start attempt after `failed` failed ones: none before the first,
    /// then `restart_backoff` doubled per further failure, capped at `max_restart_backoff`.
    pub fn backoff(&self, failed: u32) -> Duration {
        if failed == 0 {
            return Duration::ZERO;
        }
        let factor = 1u32.checked_shl((failed - 1).min(16)).unwrap_or(u32::MAX);
        self.restart_backoff
            .saturating_mul(factor)
            .min(self.max_restart_backoff)
    }
}

impl Default for Policy {
    /// The policy for `herd agent`'s default timings (10 s TTL, 1 s loop wait, 2.5 s margin).
    fn default() -> Self {
        Policy::for_agent(
            Duration::from_secs(10),
            Duration::from_secs(1),
            Duration::from_millis(2500),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_per_failure_and_is_capped() {
        let p = Policy::default();
        assert_eq!(
            p.backoff(0),
            Duration::ZERO,
            "the first attempt waits for nothing"
        );
        assert_eq!(p.backoff(1), Duration::from_millis(500));
        assert_eq!(p.backoff(2), Duration::from_secs(1));
        assert_eq!(p.backoff(4), Duration::from_secs(4));
        assert_eq!(p.backoff(7), Duration::from_secs(30), "capped");
        assert_eq!(p.backoff(u32::MAX), Duration::from_secs(30));
    }

    #[test]
    fn a_herd_toml_supervisor_section_sets_the_agent_timeouts() {
        let (ttl, wait, margin) = (
            Duration::from_secs(10),
            Duration::from_secs(1),
            Duration::from_millis(2500),
        );
        let defaults = herd_config::SupervisorConfig::default();
        assert_eq!(
            Policy::for_agent_config(ttl, wait, margin, &defaults),
            (Policy::default(), None),
            "the defaults of both give today's policy"
        );
        let set = |failover: u64, hung: u64, backoff: u64| herd_config::SupervisorConfig {
            failover_timeout_ms: failover,
            hung_timeout_ms: hung,
            restart_backoff_ms: backoff,
            ..herd_config::SupervisorConfig::default()
        };
        // (failover_timeout_ms, hung_timeout_ms, restart_backoff_ms) -> (failover, hung,
        // back-off, capped)
        let cases = [
            ((3000, 6000, 200), (3000, 6000, 200, false)),
            // Under two rounds: two rounds.
            ((500, 6000, 500), (2000, 6000, 500, false)),
            // Hung shorter than dead: the dead timeout.
            ((4000, 1000, 500), (4000, 4000, 500, false)),
            // Longer than the lease allows: capped and said.
            ((2000, 20_000, 500), (2000, 7500, 500, true)),
        ];
        for ((f, h, b), (wf, wh, wb, capped)) in cases {
            let (p, said) = Policy::for_agent_config(ttl, wait, margin, &set(f, h, b));
            assert_eq!(
                (
                    p.failover_timeout.as_millis(),
                    p.hung_timeout.as_millis(),
                    p.restart_backoff.as_millis(),
                    said.is_some()
                ),
                (wf, wh, wb, capped),
                "{f} {h} {b}"
            );
        }
    }

    #[test]
    fn timeouts_follow_the_lease_timings() {
        let p = Policy::default();
        assert_eq!(p.failover_timeout, Duration::from_secs(2));
        assert_eq!(p.hung_timeout, Duration::from_millis(7500));
        // The test harness's timings: 6 s TTL, 0.5 s loop wait, 2 s margin.
        let p = Policy::for_agent(
            Duration::from_secs(6),
            Duration::from_millis(500),
            Duration::from_secs(2),
        );
        assert_eq!(p.failover_timeout, Duration::from_secs(2));
        assert_eq!(p.hung_timeout, Duration::from_secs(4));
        // A slow loop: two rounds at least.
        let p = Policy::for_agent(
            Duration::from_secs(30),
            Duration::from_secs(3),
            Duration::from_secs(6),
        );
        assert_eq!(p.failover_timeout, Duration::from_secs(6));
        assert_eq!(p.hung_timeout, Duration::from_secs(24));
    }
}
