//! Restore points across shard groups on a multi-host cluster (`herd backup restore-point
//! NAME --dcs …`): the proxy asked holds every other registered proxy the way a shard map
//! change does (the `map_change` lease, its holder named `<proxy id>#point-<n>`), and a proxy
//! that sees such a hold closes its own gate of two-phase commits' second phases
//! ([`CommitGate`]) before it acknowledges. Once every other proxy acknowledged, no second
//! phase runs anywhere in the cluster until the hold ends, so the points written on each
//! group one after the other cannot fall between a transaction's group-0 commit (its decision)
//! and another group's.
//!
//! A proxy that cannot close its gate (second phases still running after the wait, or no gate
//! yet because it is starting) does not acknowledge: the point is refused, naming it. A proxy
//! that holds its gate closed and then loses the store opens it again once a hold could no
//! longer be on (the lease's life): the taking proxy's window is bounded well within it.

use std::sync::Arc;
use std::time::{Duration, Instant};

use herd_proxy::commit_gate::CommitGate;

use super::{Held, Other, Registry, ACK_WAIT, CHANGE_TTL};

/// Marks a `map_change` holder as a restore point's.
const POINT_MARK: &str = "#point-";
/// How long a proxy waits for its second phases under way before it closes its gate for
/// another's point (they take milliseconds; the taking proxy waits as long for its own).
const COMMITS_WAIT: Duration = Duration::from_secs(5);

/// Whether `holder` (a `map_change` lease holder) is a restore point's hold.
fn is_point(holder: &str) -> bool {
    holder.contains(POINT_MARK)
}

/// What a proxy does with its commit gate on one look at the lease.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Step {
    /// No point hold (or it ended): the gate open.
    Open,
    /// A point hold not yet followed: close the gate, then acknowledge.
    Close,
    /// A point hold already followed: keep the gate closed, acknowledge.
    Keep,
    /// A point hold this proxy cannot follow (no gate yet): do not acknowledge.
    Refuse,
}

/// The decision, apart from the I/O: `point_hold` whether another proxy's point holds the
/// lease, `closed` whether this proxy's gate is closed for one, `gate` whether it has a gate.
fn step(point_hold: bool, closed: bool, gate: bool) -> Step {
    match (point_hold, closed, gate) {
        (false, _, _) => Step::Open,
        (true, true, _) => Step::Keep,
        (true, false, true) => Step::Close,
        (true, false, false) => Step::Refuse,
    }
}

/// The proxies of `expected` that `now` (the registrations read) does not show holding for
/// `owner`: not listed any more counts as not acknowledged.
fn unacknowledged(expected: &[String], now: &[Other], owner: &str) -> Vec<String> {
    expected
        .iter()
        .filter(|id| {
            !now.iter()
                .any(|o| &o.id == *id && o.held_for.as_deref() == Some(owner))
        })
        .cloned()
        .collect()
}

/// Held by the proxy taking a restore point: every other registered proxy acknowledged (its
/// gate closed). Dropping it gives the lease back; the others open their gates at their next
/// look (every 200 ms).
pub struct PointHold {
    _held: Held,
    /// The other proxies that acknowledged.
    pub acknowledged: Vec<String>,
}

impl Registry {
    /// This proxy's commit gate, closed while another proxy takes a restore point.
    pub fn set_commit_gate(&self, gate: CommitGate) {
        let _ = self.commit_gate.set(gate);
    }

    /// Follows a restore point's hold by `other` (another proxy's `map_change` holder, if
    /// any): closes or opens this proxy's gate. Whether the hold may be acknowledged.
    pub(super) async fn follow_point(&self, other: Option<&str>) -> bool {
        let point_hold = other.is_some_and(is_point);
        let closed = self.closed().is_some();
        match step(point_hold, closed, self.commit_gate.get().is_some()) {
            Step::Open => {
                if self.closed().take().is_some() {
                    tracing::info!("the restore point is taken: two-phase commits go on");
                }
                true
            }
            Step::Keep => true,
            Step::Refuse => false,
            Step::Close => {
                let Some(gate) = self.commit_gate.get() else {
                    return false;
                };
                match gate.close(COMMITS_WAIT).await {
                    Ok(c) => {
                        tracing::info!(
                            "herd proxy {} takes a restore point: holding the second phases of \
                             two-phase commits",
                            other.unwrap_or_default()
                        );
                        *self.closed() = Some((c, Instant::now()));
                        true
                    }
                    Err(e) => {
                        tracing::warn!("not acknowledging a restore point's hold: {e}");
                        false
                    }
                }
            }
        }
    }

    /// The store unreachable: a gate closed for a point longer than a hold can live opens
    /// (the taking proxy's point is over by then, taken or refused).
    pub(super) fn reopen_stale_point_gate(&self) {
        let mut closed = self.closed();
        if closed
            .as_ref()
            .is_some_and(|(_, since)| since.elapsed() > CHANGE_TTL)
        {
            tracing::warn!(
                "cannot read the store for over {} s with the gate of two-phase commits closed \
                 for a restore point: opening it (the hold has expired)",
                CHANGE_TTL.as_secs()
            );
            *closed = None;
        }
    }

    fn closed(
        &self,
    ) -> std::sync::MutexGuard<'_, Option<(herd_proxy::commit_gate::Closed, Instant)>> {
        self.point_closed.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Holds every other registered proxy for a restore point (see the module's
    /// documentation): refused, naming them, when any did not acknowledge within the bound.
    pub async fn hold_for_point(self: &Arc<Self>) -> Result<PointHold, String> {
        let guard = self.changing.clone().lock_owned().await;
        let owner = format!(
            "{}{POINT_MARK}{}",
            self.id,
            self.changes
                .fetch_add(1, std::sync::atomic::Ordering::SeqCst)
        );
        if !self.lease(&owner, true).await? {
            return Err(
                "another herd proxy is changing a shard map or taking a restore point right \
                 now; try again in a moment"
                    .into(),
            );
        }
        let held = Held {
            registry: self.clone(),
            owner: owner.clone(),
            one_at_a_time: Some(guard),
        };
        let started = Instant::now();
        // Every proxy listed now or later must acknowledge, even one whose registration
        // expires meanwhile: unlike a map change's, a point's hold cannot let a proxy drop out
        // (one frozen in the middle of a second phase could finish it inside the window when
        // it wakes up); a proxy that died is listed no more at the next try.
        let mut expected: Vec<String> = Vec::new();
        let deadline = Instant::now() + ACK_WAIT;
        let missing = loop {
            let now = self.others().await?;
            for o in &now {
                if !expected.contains(&o.id) {
                    expected.push(o.id.clone());
                }
            }
            let missing = unacknowledged(&expected, &now, &owner);
            if missing.is_empty() || Instant::now() >= deadline {
                break missing;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        };
        if !missing.is_empty() {
            drop(held);
            return Err(format!(
                "{} other herd proxy process(es) ({}) did not acknowledge the restore point's \
                 hold within {} s (each closes its gate of two-phase commits first): no point \
                 was taken. Check that they run and reach the store (a proxy that stopped drops \
                 out once its registration expires), then run it again",
                missing.len(),
                missing.join(", "),
                ACK_WAIT.as_secs()
            ));
        }
        let acknowledged = expected;
        tracing::info!(
            "every other herd proxy ({}) holds its two-phase commits for the restore point \
             (acknowledged in {:.1} s)",
            acknowledged.len(),
            started.elapsed().as_secs_f64()
        );
        Ok(PointHold {
            _held: held,
            acknowledged,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_point_hold_closes_the_gate_before_it_is_acknowledged() {
        // (another's point holds the lease, gate closed for it, has a gate) -> step
        let cases = [
            (false, false, true, Step::Open),
            (false, true, true, Step::Open),
            (false, false, false, Step::Open),
            (true, false, true, Step::Close),
            (true, true, true, Step::Keep),
            (true, false, false, Step::Refuse),
        ];
        for (hold, closed, gate, want) in cases {
            assert_eq!(step(hold, closed, gate), want, "{hold} {closed} {gate}");
        }
    }

    #[test]
    fn a_proxy_that_dropped_out_or_did_not_hold_is_named() {
        let other = |id: &str, held: Option<&str>| Other {
            id: id.into(),
            listen: None,
            held_for: held.map(str::to_string),
            groups: None,
            api: None,
            secrets_rotation: None,
        };
        let expected = ["p1".to_string(), "p2".to_string()];
        // (registrations read now, the ones named)
        let cases: [(Vec<Other>, Vec<&str>); 4] = [
            (
                vec![
                    other("p1", Some("me#point-1")),
                    other("p2", Some("me#point-1")),
                ],
                vec![],
            ),
            (vec![other("p1", Some("me#point-1"))], vec!["p2"]),
            (
                vec![other("p1", Some("me#point-0")), other("p2", None)],
                vec!["p1", "p2"],
            ),
            (vec![], vec!["p1", "p2"]),
        ];
        for (now, want) in cases {
            assert_eq!(unacknowledged(&expected, &now, "me#point-1"), want);
        }
    }

    #[test]
    fn only_a_points_holder_name_marks_a_point() {
        assert!(is_point("127_0_0_1_6432-77#point-3"));
        assert!(!is_point("127_0_0_1_6432-77#3"));
        assert!(!is_point("127_0_0_1_6432-77"));
    }
}
