//! PostgreSQL frontend/backend protocol v3 codec for the Herd proxy, both directions,
//! with no I/O so it can be fuzzed.
//!
//! * [`split_startup`] / [`parse_startup`] handle the untagged startup-phase packets
//!   (StartupMessage, SSLRequest, GSSENCRequest, CancelRequest).
//! * [`split_frame`] cuts a byte stream into tagged [`Frame`]s; `Ok(None)` means "read more".
//!   [`Frame::raw`] is the message exactly as received, for zero-copy forwarding.
//! * [`frontend`] and [`backend`] decode frame bodies into borrowed structs; strings are
//!   checked for their nul terminator and utf-8 and never read past the body.
//! * [`encode`] appends complete messages (length field included) to a `Vec<u8>`.
//!
//! No function panics on any input: malformed bytes yield a [`WireError`].

mod error;
mod reader;

pub mod backend;
pub mod encode;
pub mod frame;
pub mod frontend;
pub mod startup;

pub use error::WireError;
pub use frame::{split_frame, Frame};
pub use startup::{parse_startup, split_startup, StartupRequest};
