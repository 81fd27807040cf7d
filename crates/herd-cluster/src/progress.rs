//! How long operations report their phases; the CLI renders them, tests stay silent.

/// Receives the phases of a long operation.
pub trait Progress: Send + Sync {
    /// A new phase starts (e.g. "cloning node1 from node0").
    fn phase(&self, text: &str);
    /// The current phase finished successfully.
    fn done(&self, text: &str);
}

/// Discards progress.
#[derive(Clone, Copy, Debug, Default)]
pub struct SilentProgress;

impl Progress for SilentProgress {
    fn phase(&self, _: &str) {}
    fn done(&self, _: &str) {}
}
