//! The scenarios of the registry in the crate root.

pub mod bandwidth;
pub mod bandwidth_report;
pub mod commit_modes;
pub mod commit_waits;
mod dataset;
pub mod failover;
pub mod lag;
pub mod lag_report;
mod lag_sampler;
pub mod proxy;
pub mod read_scaling;
pub mod read_scaling_report;
pub mod sharding;
pub mod sharding_report;
