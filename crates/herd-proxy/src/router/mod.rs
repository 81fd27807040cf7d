//! Where each unit of client work goes, and how the answers are matched up.

pub mod choose;
pub mod track;
