//! The single error type shared by every splitter, decoder and encoder.

/// Everything that can go wrong while splitting, decoding or encoding a message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum WireError {
    /// The message ended before a field could be read completely.
    #[error("message too short")]
    TooShort,
    /// A declared or encoded length is larger than the allowed maximum.
    #[error("message length {len} exceeds the maximum of {max}")]
    TooLong {
        /// The offending length.
        len: usize,
        /// The maximum that was allowed.
        max: usize,
    },
    /// A length field holds a value that is impossible for this message.
    #[error("invalid length field {0}")]
    BadLength(i32),
    /// A string has no terminating nul byte inside the message.
    #[error("string is missing its nul terminator")]
    MissingNul,
    /// A string is not valid utf-8.
    #[error("string is not valid utf-8")]
    InvalidUtf8,
    /// An encoder was given a string containing a nul byte, which the protocol cannot carry.
    #[error("string contains an interior nul byte")]
    InteriorNul,
    /// A startup-phase packet carries a special request code this crate does not know.
    #[error("unknown request code {0}")]
    UnknownRequestCode(i32),
    /// The message is structurally invalid; the text says how.
    #[error("malformed message: {0}")]
    Malformed(&'static str),
}
