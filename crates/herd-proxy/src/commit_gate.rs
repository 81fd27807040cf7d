//! The gate that second phases of two-phase commits pass and a restore point across shard
//! groups closes.
//!
//! A cross-group transaction commits group 0's part first (its decision) and then the others'.
//! A restore point taken on each group one after the other while such a second phase runs could
//! fall between group 0's commit and group k's, so that restoring every group to it showed half
//! of the transaction. Each second phase therefore holds the gate shared, from group 0's
//! `COMMIT PREPARED` until the last group's; a restore point holds it exclusively while it writes
//! its record on every group (waiting a bounded time for the second phases under way). First
//! phases (PREPARE) and single-group transactions never pass it.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{OwnedRwLockReadGuard, OwnedRwLockWriteGuard, RwLock};

/// Second phases share it; a restore point takes it alone. Fair: once a restore point waits,
/// second phases that start later wait behind it, so it is not starved by a steady load.
#[derive(Clone, Debug, Default)]
pub struct CommitGate {
    lock: Arc<RwLock<()>>,
}

/// Held by one second phase; dropping it lets a waiting restore point in.
#[derive(Debug)]
pub struct SecondPhase {
    _guard: OwnedRwLockReadGuard<()>,
}

/// Held while a restore point is written: no second phase runs.
#[derive(Debug)]
pub struct Closed {
    _guard: OwnedRwLockWriteGuard<()>,
}

/// The second phases under way did not end within the wait.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "two-phase commits were still completing after {} ms: no restore point was taken; \
     retry (or when the load is lighter)",
    waited.as_millis()
)]
pub struct StillCommitting {
    /// How long it waited.
    pub waited: Duration,
}

impl CommitGate {
    /// Enters a second phase: waits only while a restore point holds the gate (a few
    /// milliseconds per group, or a waiting point's bounded wait).
    pub async fn second_phase(&self) -> SecondPhase {
        SecondPhase {
            _guard: self.lock.clone().read_owned().await,
        }
    }

    /// Closes the gate once the second phases under way ended, waiting at most `wait`.
    pub async fn close(&self, wait: Duration) -> Result<Closed, StillCommitting> {
        match tokio::time::timeout(wait, self.lock.clone().write_owned()).await {
            Ok(guard) => Ok(Closed { _guard: guard }),
            Err(_) => Err(StillCommitting { waited: wait }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const WAIT: Duration = Duration::from_secs(5);

    #[tokio::test(start_paused = true)]
    async fn a_point_waits_for_second_phases_under_way_and_holds_new_ones() {
        // (second phases under way, do they end within the wait, point taken)
        let cases = [
            (0, true, true),
            (1, true, true),
            (3, true, true),
            (1, false, false),
        ];
        for (under_way, they_end, taken) in cases {
            let gate = CommitGate::default();
            let mut phases = Vec::new();
            for _ in 0..under_way {
                phases.push(gate.second_phase().await);
            }
            if they_end {
                let ending = tokio::spawn(async move {
                    tokio::time::sleep(WAIT / 2).await;
                    drop(phases);
                });
                let closed = gate.close(WAIT).await;
                assert_eq!(closed.is_ok(), taken, "{under_way} under way");
                ending.await.expect("ending");
                // While closed, a new second phase waits; it enters once the point is done.
                let new = gate.clone();
                let mut entering = tokio::spawn(async move { new.second_phase().await });
                assert!(
                    tokio::time::timeout(WAIT, &mut entering).await.is_err(),
                    "a second phase entered a closed gate"
                );
                drop(closed);
                tokio::time::timeout(WAIT, entering)
                    .await
                    .expect("enters once open")
                    .expect("task");
            } else {
                let err = gate.close(WAIT).await.expect_err("refused");
                assert_eq!(err.waited, WAIT);
                assert!(err.to_string().contains("no restore point was taken"));
                drop(phases);
                // Refused, the gate is open again: second phases go on, a later point passes.
                drop(gate.second_phase().await);
                assert!(gate.close(WAIT).await.is_ok());
            }
        }
    }
}
