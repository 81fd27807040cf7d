//! The machine a run happened on, and UTC timestamps, for every report.

use serde::{Deserialize, Serialize};

/// The machine a run happened on.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Machine {
    /// Logical CPUs available.
    pub cores: usize,
    /// Total memory in MiB (0 when unknown).
    pub memory_mib: u64,
    /// CPU model name ("" when unknown).
    pub cpu: String,
    /// `/proc/loadavg`'s 1, 5 and 15 minute averages when the run ended: other work on the
    /// machine skews the figures.
    #[serde(default)]
    pub load_average: String,
}

impl Machine {
    /// This machine, from the standard library and /proc.
    pub fn detect() -> Machine {
        let meminfo = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
        let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
        Machine {
            cores: std::thread::available_parallelism().map_or(0, |n| n.get()),
            memory_mib: field(&meminfo, "MemTotal")
                .and_then(|v| v.split_whitespace().next()?.parse::<u64>().ok())
                .map_or(0, |kb| kb / 1024),
            cpu: field(&cpuinfo, "model name").unwrap_or_default(),
            load_average: std::fs::read_to_string("/proc/loadavg")
                .unwrap_or_default()
                .split_whitespace()
                .take(3)
                .collect::<Vec<_>>()
                .join(" "),
        }
    }
}

/// The value of `key: value` in a /proc file.
fn field(text: &str, key: &str) -> Option<String> {
    text.lines()
        .filter_map(|l| l.split_once(':'))
        .find(|(k, _)| k.trim() == key)
        .map(|(_, v)| v.trim().to_string())
}

/// The current UTC time as `YYYY-MM-DDTHH:MM:SSZ`.
pub fn now_utc() -> String {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    utc(secs)
}

/// Formats seconds since the Unix epoch as ISO 8601 UTC (civil-from-days, proleptic Gregorian).
pub fn utc(secs: u64) -> String {
    let days = (secs / 86_400) as i64;
    let rem = secs % 86_400;
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}Z",
        rem / 3600,
        rem / 60 % 60,
        rem % 60
    )
}
