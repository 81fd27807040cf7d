//! Recognising a statement of a known shape without lexing it.
//!
//! An application runs the same few statements with different values; each execution's shape key
//! costs a pass of the lexer over the whole text (about 1,000 instructions for pgbench's
//! select, most of a cache hit). A template keeps one text of a shape cut at its literals:
//! a new text has that shape when the bytes between its literals are the template's, byte for
//! byte, and each literal is of the same kind and ends where the lexer would end it. The
//! lexer's decisions in the parts between literals depend only on those bytes and on the first
//! byte of the literal that follows (for a quote, on the byte before it, which is why literals
//! with nothing between them are not templated), so such a text has the template's shape key
//! (checked against the lexer over generated texts in the tests).

use std::sync::Arc;

use crate::shape::{literal_end, Literal};

/// How many leading bytes of a text find its templates: they must lie before its first literal.
pub(crate) const PREFIX: usize = 16;

/// One text of a shape, cut at its literals.
#[derive(Debug)]
pub(crate) struct Template {
    text: Box<[u8]>,
    literals: Box<[Literal]>,
    /// The shape key of the text.
    pub(crate) key: Arc<[u8]>,
}

impl Template {
    /// The template of `text`, whose literals the lexer found at `literals` and whose shape key
    /// is `key`; `None` when its texts could not be recognised safely this way (a literal
    /// within the first [`PREFIX`] bytes, or two literals with nothing between them). A text
    /// without literals is its own template: it matches that text alone (a statement with
    /// parameters, `$1`, is sent with the same text every time).
    pub(crate) fn new(text: &[u8], literals: &[Literal], key: Arc<[u8]>) -> Option<Template> {
        if literals.first().is_some_and(|l| l.start < PREFIX)
            || literals.windows(2).any(|w| w[1].start <= w[0].end)
        {
            return None;
        }
        Some(Template {
            text: text.into(),
            literals: literals.into(),
            key,
        })
    }

    /// Whether `t` has this template's shape (then its shape key is [`Template::key`]).
    pub(crate) fn matches(&self, t: &[u8]) -> bool {
        let mut pos = 0; // in `t`
        let mut after = 0; // in the template's text: the end of the last literal
        for lit in self.literals.iter() {
            let between = &self.text[after..lit.start];
            if t.get(pos..pos + between.len()) != Some(between) {
                return false;
            }
            pos += between.len();
            match literal_end(t, pos, lit) {
                Some(end) => pos = end,
                None => return false,
            }
            after = lit.end;
        }
        t.get(pos..) == Some(&self.text[after..])
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::shape::{shape_recording, Literals, ShapeBuf};

    /// The template the cache learns for `sql`.
    fn template(sql: &str) -> Option<Template> {
        let mut out = ShapeBuf::new();
        let mut literals = Literals::new();
        if !shape_recording(sql, &mut out, Some(&mut literals)) {
            return Template::new(sql.as_bytes(), &[], Arc::from(sql.as_bytes()));
        }
        Template::new(sql.as_bytes(), &literals, Arc::from(&out[..]))
    }

    #[test]
    fn same_statement_other_values() {
        let t = template("SELECT abalance FROM pgbench_accounts WHERE aid = 123;").expect("t");
        assert_eq!(
            &*t.key,
            b"SELECT abalance FROM pgbench_accounts WHERE aid = ?;"
        );
        for yes in [
            "SELECT abalance FROM pgbench_accounts WHERE aid = 98765;",
            "SELECT abalance FROM pgbench_accounts WHERE aid = 1.5e-3;",
        ] {
            assert!(t.matches(yes.as_bytes()), "{yes}");
        }
        for no in [
            "SELECT abalance FROM pgbench_accounts WHERE aid = 98765",
            "SELECT abalance FROM pgbench_accounts WHERE aid = '1';",
            "SELECT abalance FROM pgbench_accounts WHERE aid = x;",
            "SELECT abalance FROM pgbench_accounts WHERE aid = 1$;",
            "SELECT abalance FROM pgbench_accounts WHERE aid = ;",
            "SELECT abalance FROM pgbench_tellers WHERE aid = 1;",
        ] {
            assert!(!t.matches(no.as_bytes()), "{no}");
        }
        let q = template("select * from accounts where name = 'x' and id > 10").expect("t");
        assert!(q.matches(b"select * from accounts where name = 'it''s' and id > 2"));
        assert!(!q.matches(b"select * from accounts where name = 'open and id > 2"));
    }

    /// Texts that are their own key (no literal, or a literal that is session state) match
    /// themselves, byte for byte, and nothing else.
    #[test]
    fn a_text_that_is_its_own_key_matches_itself_only() {
        for (sql, others) in [
            (
                "SELECT abalance FROM pgbench_accounts WHERE aid = $1;",
                &[
                    "SELECT abalance FROM pgbench_accounts WHERE aid = $2;",
                    "SELECT abalance FROM pgbench_accounts WHERE aid = $1",
                    "SELECT abalance FROM pgbench_accounts WHERE aid = $1; ",
                    "SELECT abalance FROM pgbench_accounts WHERE aid = 1;",
                ][..],
            ),
            (
                "set work_mem = '64MB' -- long enough",
                &["set work_mem = '65MB' -- long enough"][..],
            ),
        ] {
            assert_eq!(crate::shape_key(sql), None, "{sql}");
            let t = template(sql).expect("templated");
            assert_eq!(&*t.key, sql.as_bytes());
            assert!(t.matches(sql.as_bytes()));
            for no in others {
                assert!(!t.matches(no.as_bytes()), "{no}");
            }
        }
    }

    #[test]
    fn texts_that_are_not_templated() {
        for (sql, why) in [
            ("select 1 from t where a = 2", "early literal"),
            (
                "select a from some_table where b = 1'x'",
                "touching literals",
            ),
        ] {
            assert!(template(sql).is_none(), "{why}: {sql}");
        }
    }

    /// A tiny deterministic generator (xorshift), so the check needs no dependency.
    struct Rng(u64);
    impl Rng {
        fn pick<'a>(&mut self, from: &[&'a str]) -> &'a str {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            from[(self.0 % from.len() as u64) as usize]
        }
    }

    const LITERALS: &[&str] = &[
        "1", "42", "1.5", "1.", "1e+5", "1e-", "7$", "3x", "2e", "5E", "0x1F", "1_000", "9ä",
        "'a'", "''", "'it''s'", "'", "'x", "2'b'",
    ];
    const OTHERS: &[&str] = &[
        " ",
        " ",
        ",",
        "=",
        "-",
        "--",
        "\n",
        "/*",
        "*/",
        ";",
        "\"q\"",
        "\"",
        "x",
        "e",
        "E",
        "U&",
        "$1",
        "$",
        "$$",
        "set",
        "reset",
        "set_config",
        "current_setting",
        "ä",
        "_",
        ".",
        "(",
        ")",
        "/",
        "*",
        "$2x",
    ];

    /// Whatever a template accepts, the lexer gives the template's key: over texts built from
    /// the same skeleton with other literals, and with the skeleton itself mutated.
    #[test]
    fn a_match_always_has_the_templates_key() {
        let mut rng = Rng(0x9E37_79B9_7F4A_7C15);
        let (mut templated, mut matched) = (0, 0);
        for _ in 0..100_000 {
            let n = 1 + (rng.0 % 9) as usize;
            // Literal slots (`None`) and the fixed tokens between them.
            let skeleton: Vec<Option<&str>> = (0..n)
                .map(|_| match rng.pick(&["l", "o", "o"]) {
                    "l" => None,
                    _ => Some(rng.pick(OTHERS)),
                })
                .collect();
            let build = |rng: &mut Rng, mutate: bool| {
                let mut s = String::from("select a, b from t where ");
                for slot in &skeleton {
                    let token = if mutate && rng.pick(&["m", "k", "k", "k"]) == "m" {
                        let from = if rng.pick(&["l", "o"]) == "l" {
                            LITERALS
                        } else {
                            OTHERS
                        };
                        rng.pick(from)
                    } else {
                        match slot {
                            None => rng.pick(LITERALS),
                            Some(other) => other,
                        }
                    };
                    s.push_str(token);
                }
                s
            };
            let first = build(&mut rng, false);
            let Some(t) = template(&first) else { continue };
            templated += 1;
            for mutate in [false, false, true, true] {
                let other = build(&mut rng, mutate);
                if t.matches(other.as_bytes()) {
                    matched += 1;
                    // The cache's key: the shape, or the text itself when it has none.
                    let key = crate::shape_key(&other).unwrap_or_else(|| other.clone());
                    assert_eq!(
                        key.as_bytes(),
                        &*t.key,
                        "template of {first:?} accepted {other:?}"
                    );
                }
            }
        }
        // The check must have had something to check.
        assert!(
            templated > 2_000 && matched > 2_000,
            "{templated} templated, {matched} matched"
        );
    }
}
