//! Counters of every routing decision, read-your-writes wait and pool event, rendered as
//! Prometheus text for `/metrics`.

use std::collections::BTreeMap;
use std::fmt::Write;
use std::sync::Mutex;

/// Labeled counters. Updates take a short lock; a handful per transaction.
#[derive(Default)]
pub struct Metrics {
    counters: Mutex<BTreeMap<(&'static str, String), u64>>,
}

impl Metrics {
    /// Adds one to counter `name` with label value `label`.
    pub fn inc(&self, name: &'static str, label: &str) {
        self.add(name, label, 1);
    }

    /// Adds `n` to counter `name` with label value `label`.
    pub fn add(&self, name: &'static str, label: &str, n: u64) {
        let mut c = match self.counters.lock() {
            Ok(c) => c,
            Err(p) => p.into_inner(),
        };
        *c.entry((name, label.to_string())).or_default() += n;
    }

    /// Current value of one counter (tests and status).
    pub fn get(&self, name: &'static str, label: &str) -> u64 {
        self.counters
            .lock()
            .ok()
            .and_then(|c| c.get(&(name, label.to_string())).copied())
            .unwrap_or(0)
    }

    /// Prometheus text exposition of every counter. Labels are `key="value"` pairs joined by
    /// commas in `label` (already escaped by the caller: node names and reasons are plain).
    pub fn render(&self) -> String {
        let c = match self.counters.lock() {
            Ok(c) => c,
            Err(p) => p.into_inner(),
        };
        let mut out = String::new();
        let mut last = "";
        for ((name, label), value) in c.iter() {
            if *name != last {
                let _ = writeln!(out, "# TYPE {name} counter");
                last = name;
            }
            if label.is_empty() {
                let _ = writeln!(out, "{name} {value}");
            } else {
                let _ = writeln!(out, "{name}{{{label}}} {value}");
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_prometheus_text() {
        let m = Metrics::default();
        m.inc("herd_routed_total", "node=\"node1\",reason=\"read\"");
        m.inc("herd_routed_total", "node=\"node1\",reason=\"read\"");
        m.inc("herd_client_connections_total", "");
        let text = m.render();
        assert!(
            text.contains("herd_routed_total{node=\"node1\",reason=\"read\"} 2"),
            "{text}"
        );
        assert!(
            text.contains(
                "# TYPE herd_client_connections_total counter\nherd_client_connections_total 1"
            ),
            "{text}"
        );
        assert_eq!(
            m.get("herd_routed_total", "node=\"node1\",reason=\"read\""),
            2
        );
    }
}
