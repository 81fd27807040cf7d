//! Judging the answers: Herd's outcome against the plain server's — the same rows (as a
//! multiset, or in order when the case's ORDER BY is total), the same affected-row counts, an
//! error on both sides — or "refused" (Herd's 0A000) or "wrong" (anything else); and the
//! counts and report of a run.

use std::collections::BTreeMap;

use crate::send::Mode;

/// What a statement gave.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// Rows rendered as text (values of binary results decoded or hex), or for a command the
    /// single row `affected N`.
    Rows(Vec<Vec<String>>),
    /// An error: SQLSTATE and message.
    Error(String, String),
}

impl Outcome {
    fn refused(&self) -> bool {
        matches!(self, Outcome::Error(code, _) if code == "0A000")
    }

    /// At most `lines` rows, for reports.
    pub fn show(&self, lines: usize) -> String {
        match self {
            Outcome::Error(code, msg) => format!("ERROR {code}: {msg}"),
            Outcome::Rows(rows) => {
                let mut out: Vec<String> = rows
                    .iter()
                    .take(lines)
                    .map(|r| format!("({})", r.join(", ")))
                    .collect();
                if rows.len() > lines {
                    out.push(format!("… {} rows in all", rows.len()));
                }
                if rows.is_empty() {
                    out.push("(no rows)".into());
                }
                out.join(" ")
            }
        }
    }
}

/// The verdict on one pair of outcomes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// The same answer (or both failed).
    Same,
    /// Herd refused with 0A000 where the plain server answered.
    Refused,
    /// A wrong answer.
    Wrong,
}

/// Judges Herd's outcome against the plain server's.
pub fn judge(herd: &Outcome, plain: &Outcome, ordered: bool) -> Verdict {
    match (herd, plain) {
        (Outcome::Error(..), Outcome::Error(..)) => Verdict::Same,
        (h, Outcome::Rows(_)) if h.refused() => Verdict::Refused,
        (Outcome::Rows(a), Outcome::Rows(b)) => {
            let same = if ordered {
                a == b
            } else {
                let (mut a, mut b) = (a.clone(), b.clone());
                a.sort();
                b.sort();
                a == b
            };
            if same {
                Verdict::Same
            } else {
                Verdict::Wrong
            }
        }
        _ => Verdict::Wrong,
    }
}

/// One wrong answer, for the report.
pub struct Wrong {
    /// The case's class.
    pub class: &'static str,
    /// The mode.
    pub mode: Mode,
    /// The script (statement, parameters, checks).
    pub script: String,
    /// Which statement of the script differed.
    pub step: String,
    /// Herd's answer.
    pub herd: Outcome,
    /// The plain server's answer.
    pub plain: Outcome,
}

/// Counts of a run.
#[derive(Default)]
pub struct Tally {
    /// Cases generated.
    pub cases: u64,
    /// Statements compared (each case in each of its modes, checks included).
    pub run: u64,
    /// Same answers.
    pub same: u64,
    /// Refused by Herd (0A000).
    pub refused: u64,
    /// Wrong answers.
    pub wrong: u64,
    /// (class, verdict) → count.
    pub by_class: BTreeMap<(String, String), u64>,
    /// The wrong answers (the first ones kept for the report).
    pub wrongs: Vec<Wrong>,
    /// "class / mode / what Herd did" → count of wrong answers.
    pub symptoms: BTreeMap<String, u64>,
}

impl Tally {
    /// Records one comparison.
    pub fn record(&mut self, class: &'static str, verdict: Verdict) {
        self.run += 1;
        match verdict {
            Verdict::Same => self.same += 1,
            Verdict::Refused => self.refused += 1,
            Verdict::Wrong => self.wrong += 1,
        }
        *self
            .by_class
            .entry((class.to_string(), format!("{verdict:?}")))
            .or_default() += 1;
    }

    /// Counts a wrong answer under its symptom.
    pub fn symptom(&mut self, class: &str, mode: Mode, herd: &Outcome, plain: &Outcome) {
        let what = match (herd, plain) {
            (Outcome::Error(code, _), _) => format!("Herd error {code}"),
            (Outcome::Rows(_), Outcome::Error(code, _)) => format!("Herd answers, plain {code}"),
            (Outcome::Rows(_), Outcome::Rows(_)) => "rows differ".to_string(),
        };
        *self
            .symptoms
            .entry(format!("{class} / {mode:?} / {what}"))
            .or_default() += 1;
    }

    /// The share of comparisons Herd refused, in percent.
    pub fn share_refused(&self) -> f64 {
        if self.run == 0 {
            0.0
        } else {
            100.0 * self.refused as f64 / self.run as f64
        }
    }

    /// The summary line.
    pub fn summary(&self) -> String {
        format!(
            "cases {}, statements compared {}, same {}, refused {}, wrong {}, share refused {:.1}%",
            self.cases,
            self.run,
            self.same,
            self.refused,
            self.wrong,
            self.share_refused()
        )
    }

    /// The full report: summary, per class, and up to `max` wrong answers (one per class and
    /// mode first, so one noisy class does not hide the others).
    pub fn report(&self, max: usize) -> String {
        let mut out = format!("differential: {}\n", self.summary());
        let mut classes: BTreeMap<&str, [u64; 3]> = BTreeMap::new();
        for ((class, verdict), n) in &self.by_class {
            let slot = match verdict.as_str() {
                "Same" => 0,
                "Refused" => 1,
                _ => 2,
            };
            classes.entry(class.as_str()).or_default()[slot] += n;
        }
        out.push_str("per class (same / refused / wrong):\n");
        for (class, [s, r, w]) in &classes {
            out.push_str(&format!("  {class:<28} {s:>6} {r:>6} {w:>6}\n"));
        }
        if !self.symptoms.is_empty() {
            out.push_str("wrong answers by class / mode / symptom:\n");
            for (symptom, n) in &self.symptoms {
                out.push_str(&format!("  {n:>6}  {symptom}\n"));
            }
        }
        let mut seen = std::collections::BTreeSet::new();
        let mut shown: Vec<&Wrong> = Vec::new();
        for w in &self.wrongs {
            if seen.insert((w.class, w.mode)) {
                shown.push(w);
            }
        }
        for w in &self.wrongs {
            if shown.len() >= max {
                break;
            }
            if !shown.iter().any(|s| std::ptr::eq(*s, w)) {
                shown.push(w);
            }
        }
        for w in shown.iter().take(max) {
            out.push_str(&format!(
                "--- WRONG [{}] {:?} at `{}`\n{}\n  herd : {}\n  plain: {}\n",
                w.class,
                w.mode,
                w.step,
                w.script,
                w.herd.show(12),
                w.plain.show(12)
            ));
        }
        if self.wrongs.len() > max {
            out.push_str(&format!(
                "({} more wrong answers not shown)\n",
                self.wrongs.len() - max
            ));
        }
        out
    }
}
