//! `herd agent`: runs on each host of a multi-host cluster, supervises that host's one
//! PostgreSQL node and takes part in leadership through the store (etcd):
//!
//! - the primary's agent holds the leader lease and renews it; when it cannot, it fences its
//!   server (immediate stop) before the lease can expire elsewhere — a separate watchdog
//!   process does so even when the agent itself is frozen;
//! - replicas race for an expired lease with a compare-and-set, and only the candidate the
//!   quorum proof allows races at all;
//! - a former primary rejoins through pg_rewind (re-clone as fallback).
//!
//! Only durations measured on one host's monotonic clock and TTLs kept by etcd are used: no
//! decision depends on synchronized clocks between hosts.

pub mod decide;
pub mod member;
pub mod sync;
