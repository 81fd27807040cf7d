//! A reader of Prometheus text (the output of Herd's own `/metrics`): the dashboard takes its
//! figures from the counters that already exist, so the proxy's hot path does not change.

/// One series of the exposition.
#[derive(Clone, Debug, PartialEq)]
pub struct Series {
    /// The metric name.
    pub name: String,
    /// Label pairs in order of appearance.
    pub labels: Vec<(String, String)>,
    /// The sample value (`NaN` stays `NaN`).
    pub value: f64,
}

impl Series {
    /// The value of label `key`, if present.
    pub fn label(&self, key: &str) -> Option<&str> {
        self.labels
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }
}

/// Every series of `text`; comment lines and lines that do not parse are skipped.
pub fn parse(text: &str) -> Vec<Series> {
    text.lines().filter_map(parse_line).collect()
}

fn parse_line(line: &str) -> Option<Series> {
    let line = line.trim();
    if line.is_empty() || line.starts_with('#') {
        return None;
    }
    let (name, labels, rest) = match line.find('{') {
        Some(open) => {
            let (labels, after) = parse_labels(&line[open + 1..])?;
            (&line[..open], labels, after)
        }
        None => {
            let (name, rest) = line.split_once(char::is_whitespace)?;
            (name, Vec::new(), rest)
        }
    };
    let value = rest.split_whitespace().next()?;
    let value = match value {
        "NaN" => f64::NAN,
        "+Inf" => f64::INFINITY,
        "-Inf" => f64::NEG_INFINITY,
        v => v.parse().ok()?,
    };
    if name.is_empty() {
        return None;
    }
    Some(Series {
        name: name.to_string(),
        labels,
        value,
    })
}

/// Parses `k="v",…}` and returns the pairs and what follows the closing brace.
fn parse_labels(text: &str) -> Option<(Vec<(String, String)>, &str)> {
    let mut labels = Vec::new();
    let mut rest = text;
    loop {
        rest = rest.trim_start_matches([',', ' ']);
        if let Some(after) = rest.strip_prefix('}') {
            return Some((labels, after));
        }
        let (key, after) = rest.split_once("=\"")?;
        let mut value = String::new();
        let mut chars = after.char_indices();
        let end = loop {
            let (i, c) = chars.next()?;
            match c {
                '\\' => match chars.next()?.1 {
                    'n' => value.push('\n'),
                    other => value.push(other),
                },
                '"' => break i,
                c => value.push(c),
            }
        };
        labels.push((key.trim().to_string(), value));
        rest = &after[end + 1..];
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn one(line: &str) -> Option<Series> {
        parse(line).into_iter().next()
    }

    #[test]
    fn reads_each_shape() {
        type Want<'a> = Option<(&'a str, &'a [(&'a str, &'a str)], f64)>;
        let cases: &[(&str, Want)] = &[
            ("herd_x 3", Some(("herd_x", &[], 3.0))),
            ("herd_x{} 4", Some(("herd_x", &[], 4.0))),
            (
                "herd_routed_total{node=\"node1\",reason=\"read\"} 12",
                Some((
                    "herd_routed_total",
                    &[("node", "node1"), ("reason", "read")],
                    12.0,
                )),
            ),
            (
                "herd_pool{user=\"a\\\"b\",db=\"x,y}\"} 1.5",
                Some(("herd_pool", &[("user", "a\"b"), ("db", "x,y}")], 1.5)),
            ),
            ("herd_y 7 1700000000", Some(("herd_y", &[], 7.0))),
            ("# TYPE herd_x counter", None),
            ("", None),
            ("herd_x{node=\"a\" 1", None),
            ("herd_x notanumber", None),
        ];
        for (line, want) in cases {
            let got = one(line);
            match (want, got) {
                (None, None) => {}
                (Some((name, labels, value)), Some(s)) => {
                    assert_eq!(s.name, *name, "{line}");
                    let l: Vec<(&str, &str)> = s
                        .labels
                        .iter()
                        .map(|(k, v)| (k.as_str(), v.as_str()))
                        .collect();
                    assert_eq!(l, labels.to_vec(), "{line}");
                    assert_eq!(s.value, *value, "{line}");
                }
                (want, got) => panic!("{line}: wanted {want:?}, got {got:?}"),
            }
        }
    }

    #[test]
    fn nan_is_kept() {
        let s = one("herd_replica_staleness_seconds{node=\"node1\"} NaN").expect("series");
        assert!(s.value.is_nan());
        assert_eq!(s.label("node"), Some("node1"));
        assert_eq!(s.label("other"), None);
    }
}
