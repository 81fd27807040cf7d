//! Standard output that tolerates a closed pipe (`herd status | head`): the reader left, so
//! the rest is dropped instead of ending in a panic.

use std::io::Write;

/// Writes `text` to stdout; a closed pipe or other write error is ignored.
pub fn write_out(text: &str) {
    let mut out = std::io::stdout().lock();
    let _ = out.write_all(text.as_bytes()).and_then(|()| out.flush());
}

/// `emit!` is `print!` through [`write_out`].
macro_rules! emit {
    ($($arg:tt)*) => { $crate::output::write_out(&format!($($arg)*)) };
}

/// `emitln!` is `println!` through [`write_out`].
macro_rules! emitln {
    ($($arg:tt)*) => { $crate::output::write_out(&format!("{}\n", format!($($arg)*))) };
}

pub(crate) use {emit, emitln};
