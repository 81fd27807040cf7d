//! The scenarios of the registry in the crate root.

pub mod proxy;
