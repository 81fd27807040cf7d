//! Terminal rendering of operation phases: a spinner on a terminal, plain lines otherwise.

use std::io::IsTerminal;
use std::sync::Mutex;
use std::time::Duration;

use indicatif::{ProgressBar, ProgressStyle};

/// Shows each phase with a spinner and ticks it off when done.
pub struct TermProgress {
    bar: Mutex<Option<ProgressBar>>,
    tty: bool,
}

impl TermProgress {
    /// Progress on stderr.
    pub fn new() -> Self {
        TermProgress {
            bar: Mutex::new(None),
            tty: std::io::stderr().is_terminal(),
        }
    }

    fn finish_bar(&self) {
        if let Ok(mut bar) = self.bar.lock() {
            if let Some(b) = bar.take() {
                b.finish_and_clear();
            }
        }
    }
}

impl herd_cluster::Progress for TermProgress {
    fn phase(&self, text: &str) {
        self.finish_bar();
        if !self.tty {
            eprintln!("  … {text}");
            return;
        }
        let bar = ProgressBar::new_spinner();
        if let Ok(style) = ProgressStyle::with_template("  {spinner} {msg} ({elapsed})") {
            bar.set_style(style);
        }
        bar.set_message(text.to_string());
        bar.enable_steady_tick(Duration::from_millis(100));
        if let Ok(mut slot) = self.bar.lock() {
            *slot = Some(bar);
        }
    }

    fn done(&self, text: &str) {
        self.finish_bar();
        eprintln!("  ✓ {text}");
    }
}

impl Drop for TermProgress {
    fn drop(&mut self) {
        self.finish_bar();
    }
}
