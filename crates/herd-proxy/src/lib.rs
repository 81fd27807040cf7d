//! Herd's client endpoint: a PostgreSQL wire-protocol proxy that pools server connections,
//! sends reads to replicas and writes to the primary, and keeps read-your-writes by WAL LSN.

pub mod router;
pub mod topology;
pub mod monitor;
