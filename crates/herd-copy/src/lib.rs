//! Logical copies of table subsets (`herd copy`): a publication on the source shard group's
//! primary (tables with PostgreSQL 15 row filters and column lists, or whole schemas), a
//! subscription on the target (any PostgreSQL 15 server, another Herd cluster included) that
//! reaches the source through every node of the group and so follows its primary, the
//! target's tables created or checked, the slot kept on every replica so a failover does not
//! break the copy (see [`slots`]), and each copy's status.

mod error;
pub mod manage;
pub mod resync;
pub mod schema;
pub mod slots;
mod spec;
pub mod status;
mod store;
pub mod sync;
pub mod target;

pub use error::CopyError;
pub use spec::{
    conninfo, qualify, quote_ident, quote_literal, quote_qualified, source_conninfo, validate_name,
    CopySpec, TableSpec, PREFIX,
};
pub use store::Store;
