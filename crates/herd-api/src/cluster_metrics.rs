//! `/cluster/metrics`: the `/metrics` text of every agent and proxy of a cluster in one page,
//! each sample labelled with the `instance` (the address) it came from, and
//! `herd_scrape_up{instance}` saying which processes answered. Pure: the fetching is the
//! embedding's ([`ClusterMetricsSource`]).
//!
//! Prometheus text allows one `# HELP` and one `# TYPE` per metric family, and a family's
//! samples together, so the pages are merged by family rather than concatenated. A
//! Prometheus server scraping this page keeps the `instance` labels with `honor_labels: true`
//! (the federation pattern).

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;

/// What one process's `/metrics` gave.
#[derive(Clone, Debug, PartialEq)]
pub struct Scrape {
    /// The process's address (`host:port` of its API): the `instance` label.
    pub instance: String,
    /// `agent` or `proxy`: the `process` label of its `herd_scrape_up`.
    pub process: &'static str,
    /// Its page; `None` when it did not answer in time (or not with 200).
    pub text: Option<String>,
}

/// Produces the scrapes of every process of the cluster.
pub type ClusterMetricsSource =
    std::sync::Arc<dyn Fn() -> Pin<Box<dyn Future<Output = Vec<Scrape>> + Send>> + Send + Sync>;

#[derive(Default)]
struct Family {
    help: Option<String>,
    kind: Option<String>,
    samples: Vec<String>,
}

/// Suffixes of the samples of a histogram or summary family.
const SUFFIXES: [&str; 4] = ["_bucket", "_sum", "_count", "_created"];

/// `value` as a label value (backslash, quote and newline escaped).
fn escape(value: &str) -> String {
    value
        .replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

/// The sample line `line` with `instance="…"` as its first label; `None` for a line that is
/// not a sample.
fn relabel(line: &str, instance: &str) -> Option<(String, String)> {
    let line = line.trim();
    let end = line.find(|c: char| c == '{' || c.is_whitespace())?;
    let name = &line[..end];
    if name.is_empty() {
        return None;
    }
    let label = format!("instance=\"{}\"", escape(instance));
    let rest = &line[end..];
    let out = match rest.strip_prefix('{') {
        Some(labels) if labels.trim_start().starts_with('}') => {
            format!("{name}{{{label}{}", labels.trim_start())
        }
        Some(labels) => format!("{name}{{{label},{labels}"),
        None => format!("{name}{{{label}}}{rest}"),
    };
    Some((name.to_string(), out))
}

/// The family a sample named `name` belongs to, given the family last declared.
fn family_of<'a>(name: &'a str, current: Option<&'a str>) -> &'a str {
    match current {
        Some(c) if name == c || SUFFIXES.iter().any(|s| name.strip_prefix(c) == Some(*s)) => c,
        _ => name,
    }
}

/// The family `name`, created (and put last in `order`) when new.
fn family<'a>(
    order: &mut Vec<String>,
    families: &'a mut HashMap<String, Family>,
    name: &str,
) -> &'a mut Family {
    if !families.contains_key(name) {
        order.push(name.to_string());
    }
    families.entry(name.to_string()).or_default()
}

/// One page of every scrape's samples, grouped by family (in order of first appearance),
/// each labelled with its instance, then `herd_scrape_up` for every scrape.
pub fn merge(scrapes: &[Scrape]) -> String {
    let mut order: Vec<String> = Vec::new();
    let mut families: HashMap<String, Family> = HashMap::new();
    for scrape in scrapes {
        let Some(text) = &scrape.text else { continue };
        let mut current: Option<String> = None;
        for line in text.lines() {
            let trimmed = line.trim();
            if let Some(comment) = trimmed.strip_prefix('#') {
                let mut words = comment.trim_start().splitn(3, ' ');
                let (what, name, rest) = (words.next(), words.next(), words.next());
                if let (Some(what @ ("HELP" | "TYPE")), Some(name)) = (what, name) {
                    let f = family(&mut order, &mut families, name);
                    let rest = rest.unwrap_or_default().to_string();
                    if what == "HELP" {
                        f.help.get_or_insert(rest);
                    } else {
                        f.kind.get_or_insert(rest);
                    }
                    current = Some(name.to_string());
                }
                continue;
            }
            if let Some((name, sample)) = relabel(trimmed, &scrape.instance) {
                let name = family_of(&name, current.as_deref()).to_string();
                family(&mut order, &mut families, &name)
                    .samples
                    .push(sample);
            }
        }
    }
    let mut out = String::new();
    for name in &order {
        let Some(f) = families.get(name) else {
            continue;
        };
        if let Some(help) = &f.help {
            out.push_str(&format!("# HELP {name} {help}\n"));
        }
        if let Some(kind) = &f.kind {
            out.push_str(&format!("# TYPE {name} {kind}\n"));
        }
        for s in &f.samples {
            out.push_str(s);
            out.push('\n');
        }
    }
    out.push_str(
        "# HELP herd_scrape_up Whether the process answered its /metrics within the bound (1) or not (0).\n\
         # TYPE herd_scrape_up gauge\n",
    );
    for s in scrapes {
        out.push_str(&format!(
            "herd_scrape_up{{instance=\"{}\",process=\"{}\"}} {}\n",
            escape(&s.instance),
            s.process,
            u8::from(s.text.is_some())
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scrape(instance: &str, text: Option<&str>) -> Scrape {
        Scrape {
            instance: instance.into(),
            process: "agent",
            text: text.map(str::to_string),
        }
    }

    #[test]
    fn samples_get_the_instance_label() {
        let cases = [
            ("a 1", "a{instance=\"h:1\"} 1"),
            ("a{} 1", "a{instance=\"h:1\"} 1"),
            ("a{x=\"y\"} 2", "a{instance=\"h:1\",x=\"y\"} 2"),
            ("a  3 1700000000", "a{instance=\"h:1\"}  3 1700000000"),
        ];
        for (line, want) in cases {
            assert_eq!(relabel(line, "h:1").map(|r| r.1).as_deref(), Some(want));
        }
        assert_eq!(relabel("", "h:1"), None);
        assert_eq!(relabel("{x=\"y\"} 1", "h:1"), None);
        assert_eq!(escape("a\"b\\c"), "a\\\"b\\\\c");
    }

    #[test]
    fn families_are_merged_and_silent_processes_reported_down() {
        let agent = "# HELP r Rounds.\n# TYPE r counter\nr 5\n";
        let hist = "# HELP d Delay.\n# TYPE d histogram\nd_bucket{le=\"+Inf\"} 1\nd_sum 2\nd_count 1\nx 7\n";
        let page = merge(&[
            scrape("a:1", Some(agent)),
            scrape("a:2", None),
            scrape("p:3", Some(&format!("{agent}{hist}"))),
        ]);
        let want = "# HELP r Rounds.\n# TYPE r counter\nr{instance=\"a:1\"} 5\nr{instance=\"p:3\"} 5\n\
                    # HELP d Delay.\n# TYPE d histogram\nd_bucket{instance=\"p:3\",le=\"+Inf\"} 1\n\
                    d_sum{instance=\"p:3\"} 2\nd_count{instance=\"p:3\"} 1\nx{instance=\"p:3\"} 7\n";
        assert!(page.starts_with(want), "{page}");
        assert!(page.contains("herd_scrape_up{instance=\"a:1\",process=\"agent\"} 1\n"));
        assert!(page.contains("herd_scrape_up{instance=\"a:2\",process=\"agent\"} 0\n"));
        assert_eq!(page.matches("# TYPE r ").count(), 1);
    }
}
