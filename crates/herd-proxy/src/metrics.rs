//! Counters of every routing decision, read-your-writes wait and pool event, rendered as
//! Prometheus text for `/metrics`.

use std::collections::hash_map::DefaultHasher;
use std::collections::HashMap;
use std::fmt::Write;
use std::hash::{Hash, Hasher};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

/// Labeled counters. An update hashes its name and labels and takes a short lock; the label
/// text is only built the first time a series appears (no allocation on the hot path).
#[derive(Default)]
pub struct Metrics {
    counters: Mutex<HashMap<u64, Series>>,
}

struct Series {
    name: &'static str,
    label: String,
    value: Arc<AtomicU64>,
}

/// One series of [`Metrics`], held by whoever bumps it often: an increment is then one atomic
/// addition, without hashing its name and labels or taking the registry's lock.
#[derive(Clone)]
pub struct Counter(Arc<AtomicU64>);

impl Counter {
    /// Adds one.
    pub fn inc(&self) {
        self.0.fetch_add(1, Ordering::Relaxed);
    }
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

    /// The key [`Metrics::add`] gives the label text of `labels`, computed without building
    /// the text: both ways of naming a series reach the same one.
    fn key_of(name: &'static str, labels: &[(&str, &str)]) -> u64 {
        let mut h = DefaultHasher::new();
        name.hash(&mut h);
        // `str`'s Hash writes the bytes then 0xff; SipHash is a stream, so writing the text's
        // pieces one after the other equals writing the whole text.
        for (i, (k, v)) in labels.iter().enumerate() {
            if i > 0 {
                h.write(b",");
            }
            h.write(k.as_bytes());
            h.write(b"=\"");
            h.write(v.as_bytes());
            h.write(b"\"");
        }
        h.write_u8(0xff);
        h.finish()
    }

    /// Adds one to counter `name` with labels given as pairs (values are plain node names and
    /// reasons: no escaping needed).
    pub fn inc_labels(&self, name: &'static str, labels: &[(&str, &str)]) {
        self.counter(name, labels).inc();
    }

    /// The series `name` with labels given as pairs, created at zero when new, to keep and
    /// bump without a lookup.
    pub fn counter(&self, name: &'static str, labels: &[(&str, &str)]) -> Counter {
        let describe = || {
            let text: Vec<String> = labels.iter().map(|(k, v)| format!("{k}=\"{v}\"")).collect();
            (name, text.join(","))
        };
        Counter(self.with_series(Self::key_of(name, labels), describe, Arc::clone))
    }

    fn bump(&self, key: u64, n: u64, describe: impl FnOnce() -> (&'static str, String)) {
        self.with_series(key, describe, |v| v.fetch_add(n, Ordering::Relaxed));
    }

    /// Runs `f` on the value of series `key`, created at zero (named by `describe`) when new.
    fn with_series<R>(
        &self,
        key: u64,
        describe: impl FnOnce() -> (&'static str, String),
        f: impl FnOnce(&Arc<AtomicU64>) -> R,
    ) -> R {
        let mut c = match self.counters.lock() {
            Ok(c) => c,
            Err(p) => p.into_inner(),
        };
        let value = &c
            .entry(key)
            .or_insert_with(|| {
                let (name, label) = describe();
                Series {
                    name,
                    label,
                    value: Arc::default(),
                }
            })
            .value;
        f(value)
    }

    /// Current value of one counter (tests and status).
    pub fn get(&self, name: &'static str, label: &str) -> u64 {
        let c = match self.counters.lock() {
            Ok(c) => c,
            Err(p) => p.into_inner(),
        };
        c.values()
            .filter(|s| s.name == name && s.label == label)
            .map(|s| s.value.load(Ordering::Relaxed))
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
                let _ = writeln!(out, "{} {}", s.name, s.value.load(Ordering::Relaxed));
            } else {
                let value = s.value.load(Ordering::Relaxed);
                let _ = writeln!(out, "{}{{{}}} {}", s.name, s.label, value);
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
        // A kept handle bumps the same series as a lookup by labels.
        let kept = m.counter(
            "herd_routed_total",
            &[("node", "node1"), ("reason", "read")],
        );
        kept.inc();
        m.inc_labels(
            "herd_routed_total",
            &[("node", "node1"), ("reason", "read")],
        );
        assert!(
            m.render()
                .contains("herd_routed_total{node=\"node1\",reason=\"read\"} 4"),
            "{}",
            m.render()
        );
    }
}
