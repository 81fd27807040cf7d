//! The control plane's decision step. `decide()` is a pure function of what the supervisor
//! observed; the supervisor carries the decisions out. Today it keeps every server running;
//! failover (a later step) adds decisions here, not I/O.

mod decide;
mod failover;

pub use decide::{decide, Action, Decision, NodeObservation, Policy, PrimaryLoss};
pub use failover::{choose_candidate, Candidate, FailoverRules};
