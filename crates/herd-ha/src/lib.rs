//! The failover rule both engines shared and the agents keep: which replica provably holds every
//! acknowledged commit (`choose_candidate`, table-tested). The supervisor's `decide()` that lived
//! here was retired in issue #39 slice 11 (its rules live on in herd-agent's `decide`).

mod failover;

pub use failover::{choose_candidate, Candidate, FailoverRules};
