//! Running pgbench and reading its summary.

use std::io::Read;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::BenchError;

/// The figures of one pgbench run.
#[derive(Clone, Debug, PartialEq)]
pub struct PgbenchRun {
    /// `tps = … (without initial connection time)`.
    pub tps: f64,
    /// `number of failed transactions: N` (0 when pgbench does not print it).
    pub failed: u64,
    /// `number of transactions actually processed: N`.
    pub transactions: u64,
}

/// Reads the summary pgbench prints at the end of a run; `None` without a tps line.
pub fn parse_output(stdout: &str) -> Option<PgbenchRun> {
    let mut tps = None;
    let mut failed = 0;
    let mut transactions = 0;
    for line in stdout.lines().map(str::trim) {
        if let Some(rest) = line.strip_prefix("tps = ") {
            // With -C (a connection per transaction) the rate includes the reconnections.
            if line.contains("without initial connection time")
                || line.contains("including reconnection times")
            {
                tps = rest.split_whitespace().next()?.parse().ok();
            }
        } else if let Some(rest) = line.strip_prefix("number of failed transactions:") {
            failed = rest.split_whitespace().next()?.parse().ok()?;
        } else if let Some(rest) = line.strip_prefix("number of transactions actually processed:") {
            transactions = rest
                .split_whitespace()
                .next()?
                .split('/')
                .next()?
                .parse()
                .ok()?;
        }
    }
    Some(PgbenchRun {
        tps: tps?,
        failed,
        transactions,
    })
}

/// The median of `values` (mean of the middle two for an even count); `None` when empty.
pub fn median(values: &[f64]) -> Option<f64> {
    let mut v = values.to_vec();
    v.sort_by(f64::total_cmp);
    let n = v.len();
    match n {
        0 => None,
        _ if n % 2 == 1 => Some(v[n / 2]),
        _ => Some((v[n / 2 - 1] + v[n / 2]) / 2.0),
    }
}

/// The pgbench program of the PostgreSQL installation Herd uses.
pub struct Pgbench {
    program: PathBuf,
}

impl Pgbench {
    /// Finds pgbench beside the PostgreSQL 15 server programs.
    pub fn locate() -> Result<Pgbench, BenchError> {
        let program = herd_pg::PgBinaries::locate(None)?.program("pgbench");
        if !program.exists() {
            return Err(BenchError::Missing(format!(
                "pgbench is not installed ({} is absent)",
                program.display()
            )));
        }
        Ok(Pgbench { program })
    }

    /// Runs `pgbench <args> <url>`, killing it after `limit`; its stdout when it succeeds.
    pub fn run_raw(
        &self,
        what: &str,
        args: &[String],
        url: &str,
        limit: Duration,
    ) -> Result<String, BenchError> {
        let mut child = Command::new(&self.program)
            .args(args)
            .arg(url)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|source| BenchError::Spawn {
                program: self.program.display().to_string(),
                source,
            })?;
        let stdout = drain(child.stdout.take());
        let stderr = drain(child.stderr.take());
        let deadline = Instant::now() + limit;
        let status = loop {
            match child.try_wait() {
                Ok(Some(status)) => break Some(status),
                Ok(None) if Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(50))
                }
                Ok(None) => {
                    let _ = child.kill();
                    let _ = child.wait();
                    break None;
                }
                Err(source) => {
                    let _ = child.kill();
                    return Err(BenchError::Spawn {
                        program: self.program.display().to_string(),
                        source,
                    });
                }
            }
        };
        let out = stdout.join().unwrap_or_default();
        let err = stderr.join().unwrap_or_default();
        match status {
            None => Err(BenchError::Hang {
                what: what.into(),
                seconds: limit.as_secs(),
                output: format!("{err}{out}"),
            }),
            Some(s) if !s.success() => Err(BenchError::Failed {
                what: what.into(),
                status: s.to_string(),
                output: format!("{}\n--- stdout\n{}", tail(&err, 40), out),
            }),
            Some(_) => Ok(out),
        }
    }

    /// Runs a measured pgbench and parses its summary.
    pub fn run(
        &self,
        what: &str,
        args: &[String],
        url: &str,
        limit: Duration,
    ) -> Result<PgbenchRun, BenchError> {
        let out = self.run_raw(what, args, url, limit)?;
        parse_output(&out).ok_or_else(|| BenchError::Parse {
            what: what.into(),
            output: out,
        })
    }
}

/// Reads a child's pipe to the end on a thread, so a chatty child cannot block on a full pipe.
fn drain<R: Read + Send + 'static>(pipe: Option<R>) -> std::thread::JoinHandle<String> {
    std::thread::spawn(move || {
        let mut buf = Vec::new();
        if let Some(mut p) = pipe {
            let _ = p.read_to_end(&mut buf);
        }
        String::from_utf8_lossy(&buf).into_owned()
    })
}

/// The last `n` lines of `text`.
fn tail(text: &str, n: usize) -> String {
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    const PG15: &str = "pgbench (15.10 (Debian 15.10-0+deb12u1))
transaction type: <builtin: select only>
scaling factor: 10
query mode: prepared
number of clients: 16
number of threads: 2
maximum number of tries: 1
duration: 10 s
number of transactions actually processed: 187654
number of failed transactions: 3 (0.002%)
latency average = 0.852 ms
initial connection time = 25.310 ms
tps = 18765.432100 (without initial connection time)
";

    #[test]
    fn parses_pg15_summary() {
        let r = parse_output(PG15).expect("parsed");
        assert!((r.tps - 18765.4321).abs() < 1e-9);
        assert_eq!(r.failed, 3);
        assert_eq!(r.transactions, 187654);
    }

    #[test]
    fn older_output_without_failures_and_with_two_tps_lines() {
        let out = "number of transactions actually processed: 50/50\n\
                   tps = 99.5 (including connections establishing)\n\
                   tps = 120.25 (without initial connection time)\n";
        let r = parse_output(out).expect("parsed");
        assert_eq!(r.tps, 120.25);
        assert_eq!(r.failed, 0);
        assert_eq!(r.transactions, 50);
    }

    #[test]
    fn no_tps_is_none() {
        assert_eq!(parse_output("pgbench: error: connection refused\n"), None);
        assert_eq!(
            parse_output("tps = x (without initial connection time)"),
            None
        );
    }

    #[test]
    fn medians() {
        assert_eq!(median(&[]), None);
        assert_eq!(median(&[3.0]), Some(3.0));
        assert_eq!(median(&[5.0, 1.0, 3.0]), Some(3.0));
        assert_eq!(median(&[4.0, 1.0, 3.0, 2.0]), Some(2.5));
    }
}
