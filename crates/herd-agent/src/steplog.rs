//! How a round's step is logged: by its kind, at a level that shows what changed (a steady
//! member renews or waits every round at debug) and warns of what loses a server or failed.

use crate::decide::Step;

/// The name of a step's kind, without its arguments: logging compares kinds, not texts (a
/// wait's reason carries changing numbers).
pub fn kind(step: &Step) -> &'static str {
    match step {
        Step::Initialize => "Initialize",
        Step::Clone(_) => "Clone",
        Step::StartPrimary => "StartPrimary",
        Step::StartReplica => "StartReplica",
        Step::Renew => "Renew",
        Step::Take => "Take",
        Step::Promote => "Promote",
        Step::Follow(_) => "Follow",
        Step::Rejoin(_) => "Rejoin",
        Step::Reclone(_) => "Reclone",
        Step::Fence(_) => "Fence",
        Step::Abdicate(_) => "Abdicate",
        Step::StepDown { .. } => "StepDown",
        Step::FinishHandover => "FinishHandover",
        Step::Restart(_) => "Restart",
        Step::Wait(_) => "Wait",
    }
}

/// The step's kind as a metric label (`herd_ha_decisions_total{action}`): `start_replica`,
/// `abdicate`, …
pub fn label(step: &Step) -> &'static str {
    match step {
        Step::Initialize => "initialize",
        Step::Clone(_) => "clone",
        Step::StartPrimary => "start_primary",
        Step::StartReplica => "start_replica",
        Step::Renew => "renew",
        Step::Take => "take",
        Step::Promote => "promote",
        Step::Follow(_) => "follow",
        Step::Rejoin(_) => "rejoin",
        Step::Reclone(_) => "reclone",
        Step::Fence(_) => "fence",
        Step::Abdicate(_) => "abdicate",
        Step::StepDown { .. } => "step_down",
        Step::FinishHandover => "finish_handover",
        Step::Restart(_) => "restart",
        Step::Wait(_) => "wait",
    }
}

/// The level a round's step is logged at, given the previous round's step kind and whether
/// acting on it failed. A steady member renews or waits every round: those are debug, so the
/// log at info shows only what changed; what loses a server or data (fencing, stepping down,
/// a re-clone) and failures are warnings every time.
pub fn log_level(step: &Step, previous: Option<&'static str>, failed: bool) -> tracing::Level {
    if failed {
        return tracing::Level::WARN;
    }
    match step {
        Step::Fence(_) | Step::Abdicate(_) | Step::StepDown { .. } | Step::Reclone(_) => {
            tracing::Level::WARN
        }
        _ if previous != Some(kind(step)) => tracing::Level::INFO,
        Step::Renew | Step::Wait(_) => tracing::Level::DEBUG,
        // Another action of the same kind (a second clone attempt, a new upstream): still news.
        _ => tracing::Level::INFO,
    }
}

/// Logs `text` at `level` (tracing's macros take the level as a constant).
pub(crate) fn emit(level: tracing::Level, text: &str) {
    match level {
        tracing::Level::ERROR => tracing::error!("{text}"),
        tracing::Level::WARN => tracing::warn!("{text}"),
        tracing::Level::INFO => tracing::info!("{text}"),
        tracing::Level::DEBUG => tracing::debug!("{text}"),
        tracing::Level::TRACE => tracing::trace!("{text}"),
    }
}

#[cfg(test)]
mod tests {
    use tracing::Level;

    use super::*;

    #[test]
    fn steps_are_logged_by_kind() {
        let wait = || Step::Wait("following h1".into());
        let follow = || Step::Follow("h1".into());
        let fence = || Step::Fence("lease gone".into());
        #[rustfmt::skip]
        let table: Vec<(Step, Option<&'static str>, bool, Level)> = vec![
            // A steady primary and a steady replica: nothing above debug.
            (Step::Renew, Some("Renew"), false, Level::DEBUG),
            (wait(), Some("Wait"), false, Level::DEBUG),
            // Another wait reason is the same kind.
            (Step::Wait("h2 is the candidate".into()), Some("Wait"), false, Level::DEBUG),
            // A change of kind, into or out of the steady ones.
            (Step::Renew, Some("Take"), false, Level::INFO),
            (Step::Renew, None, false, Level::INFO),
            (wait(), Some("Follow"), false, Level::INFO),
            (follow(), Some("Wait"), false, Level::INFO),
            (Step::Take, Some("Wait"), false, Level::INFO),
            // An action repeated is still news, not a warning.
            (follow(), Some("Follow"), false, Level::INFO),
            (Step::Clone("h1".into()), Some("Clone"), false, Level::INFO),
            // Losing a server or a lead: warnings every time.
            (fence(), Some("Renew"), false, Level::WARN),
            (fence(), Some("Fence"), false, Level::WARN),
            (Step::StepDown { immediate: false }, Some("Renew"), false, Level::WARN),
            (Step::Reclone("h1".into()), Some("Wait"), false, Level::WARN),
            (Step::Abdicate("dead".into()), Some("Renew"), false, Level::WARN),
            // A failed action, whatever it was.
            (Step::Renew, Some("Renew"), true, Level::WARN),
            (follow(), Some("Follow"), true, Level::WARN),
            (wait(), None, true, Level::WARN),
        ];
        for (step, previous, failed, want) in table {
            assert_eq!(
                log_level(&step, previous, failed),
                want,
                "{step:?} after {previous:?} (failed: {failed})"
            );
        }
    }
}
