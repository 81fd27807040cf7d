//! Counters of every routing decision, read-your-writes wait and pool event, rendered as
//! Prometheus text for `/metrics`.

use std::collections::hash_map::DefaultHasher;
use std::collections::HashMap;
use std::fmt::Write;
use std::hash::{Hash, Hasher};
use std::sync::Mutex;

/// Labeled counters. An update hashes its name and labels and takes a short lock; the label
/// text is only built the first time a series appears (no allocation on the hot path).
#[derive(Default)]
pub struct Metrics {
    counters: Mutex<HashMap<u64, Series>>,
}

struct Series {
    name: &'static str,
    label: String,
    value: u64,
}

impl Metrics {
    /// Adds one to counter `name` with label text `label` (`key="value",…`, or empty).
    pub fn inc(&self, name: &'static str, label: &str) {
        self.add(name, label, 1);
    }

    /// Adds `n` to counter `name` with label text `label`.
    pub fn add(&self, name: &'static str, label: &str, n: u64) {
        let mut h = DefaultHasher::new();
        (name, label).hash(&mut h);
        self.bump(h.finish(), n, || (name, label.to_string()));
    }

    /// Adds one to counter `name` with labels given as pairs (values are plain node names and
    /// reasons: no escaping needed).
    pub fn inc_labels(&self, name: &'static str, labels: &[(&str, &str)]) {
        let mut h = DefaultHasher::new();
        name.hash(&mut h);
        labels.hash(&mut h);
        self.bump(h.finish(), 1, || {
            let text: Vec<String> = labels.iter().map(|(k, v)| format!("{k}=\"{v}\"")).collect();
            (name, text.join(","))
        });
    }

    fn bump(&self, key: u64, n: u64, describe: impl FnOnce() -> (&'static str, String)) {
        let mut c = match self.counters.lock() {
            Ok(c) => c,
            Err(p) => p.into_inner(),
        };
        c.entry(key)
            .or_insert_with(|| {
                let (name, label) = describe();
                Series {
                    name,
                    label,
                    value: 0,
                }
            })
            .value += n;
    }

    /// Current value of one counter (tests and status).
    pub fn get(&self, name: &'static str, label: &str) -> u64 {
        let c = match self.counters.lock() {
            Ok(c) => c,
            Err(p) => p.into_inner(),
        };
        c.values()
            .filter(|s| s.name == name && s.label == label)
            .map(|s| s.value)
            .sum()
    }

    /// Prometheus text exposition of every counter.
    pub fn render(&self) -> String {
        let c = match self.counters.lock() {
            Ok(c) => c,
            Err(p) => p.into_inner(),
        };
        let mut series: Vec<&Series> = c.values().collect();
        series.sort_by(|a, b| (a.name, &a.label).cmp(&(b.name, &b.label)));
        let mut out = String::new();
        let mut last = "";
        for s in series {
            if s.name != last {
                out.push_str(&crate::metrics_help::header(s.name, "counter"));
                last = s.name;
            }
            if s.label.is_empty() {
                let _ = writeln!(out, "{} {}", s.name, s.value);
            } else {
                let _ = writeln!(out, "{}{{{}}} {}", s.name, s.label, s.value);
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
