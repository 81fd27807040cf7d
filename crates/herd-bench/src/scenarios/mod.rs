//! The scenarios of the registry in the crate root.

pub mod commit_modes;
pub mod commit_waits;
pub mod failover;
pub mod lag;
pub mod lag_report;
mod lag_sampler;
pub mod proxy;
