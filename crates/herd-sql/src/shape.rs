//! A cache key that ignores literal values: `select * from t where id = 42` and `… = 43` share
//! one classification. Classification does not depend on literal values, except where the
//! value itself is session state (`SET`, `RESET`, `set_config(…)`): those texts keep their own
//! key, as does anything the small lexer below is not sure about.

/// The shape of `sql` (numbers and quoted strings replaced by `?`), or `None` when the text
/// must be its own key.
pub fn shape_key(sql: &str) -> Option<String> {
    let b = sql.as_bytes();
    // Built from runs of the text between replaced literals (`sql[copied..i]` is still to
    // be appended): a statement is hashed on every execution, so no per-byte pushes.
    let mut out = String::with_capacity(sql.len());
    let mut copied = 0;
    let mut i = 0;
    let mut replaced = false;
    let mut at_statement_start = true;
    while i < b.len() {
        let c = b[i];
        let prev_ident = i > 0 && is_ident(b[i - 1]);
        match c {
            b'\'' => {
                // E'…' and U&'…' have other escaping rules: not worth the risk.
                if i > 0 && matches!(b[i - 1], b'e' | b'E' | b'&') {
                    return None;
                }
                let end = skip_quoted(b, i, b'\'')?;
                out.push_str(&sql[copied..i]);
                out.push('?');
                copied = end;
                i = end;
                replaced = true;
                continue;
            }
            b'"' => {
                i = skip_quoted(b, i, b'"')?;
                at_statement_start = false;
                continue;
            }
            b'$' if !prev_ident => {
                // $1 parameters stay; dollar quoting ($$ … $$, $tag$ … $tag$) is left alone.
                if b.get(i + 1).is_some_and(u8::is_ascii_digit) {
                    i += 1;
                    continue;
                }
                return None;
            }
            b'-' if b.get(i + 1) == Some(&b'-') => {
                i = b[i..]
                    .iter()
                    .position(|&x| x == b'\n')
                    .map_or(b.len(), |p| i + p);
                continue;
            }
            b'/' if b.get(i + 1) == Some(&b'*') => {
                let close = sql[i + 2..].find("*/")? + i + 2;
                if sql[i + 2..close].contains("/*") {
                    return None; // nested comments
                }
                i = close + 2;
                continue;
            }
            b'0'..=b'9' if !prev_ident => {
                let mut j = i;
                while j < b.len() && (b[j].is_ascii_alphanumeric() || b[j] == b'.' || b[j] == b'_')
                {
                    // An exponent sign belongs to the number: 1e-5.
                    if matches!(b[j], b'e' | b'E') && matches!(b.get(j + 1), Some(b'+' | b'-')) {
                        j += 1;
                    }
                    j += 1;
                }
                out.push_str(&sql[copied..i]);
                out.push('?');
                copied = j;
                replaced = true;
                i = j;
                continue;
            }
            b';' => at_statement_start = true,
            c if is_ident(c) && !prev_ident => {
                let end = b[i..]
                    .iter()
                    .position(|&x| !is_ident(x))
                    .map_or(b.len(), |p| i + p);
                let word = &sql[i..end];
                // current_setting('transaction_read_only') routes differently from
                // current_setting('work_mem'): its literal decides, as set_config's does.
                if word.eq_ignore_ascii_case("set_config")
                    || word.eq_ignore_ascii_case("current_setting")
                    || (at_statement_start
                        && (word.eq_ignore_ascii_case("set") || word.eq_ignore_ascii_case("reset")))
                {
                    return None;
                }
                at_statement_start = false;
                i = end;
                continue;
            }
            _ => {}
        }
        if !c.is_ascii() {
            return None;
        }
        i += 1;
    }
    if !replaced {
        return None;
    }
    out.push_str(&sql[copied..]);
    Some(out)
}

/// Bytes that continue an identifier: letters, digits, `_`, `$` and every non-ASCII byte.
/// A table: the test runs on every byte of every statement, twice.
static IDENT_BYTE: [bool; 256] = {
    let mut table = [false; 256];
    let mut i = 0;
    while i < 256 {
        let c = i as u8;
        table[i] = c.is_ascii_alphanumeric() || c == b'_' || c == b'$' || !c.is_ascii();
        i += 1;
    }
    table
};

fn is_ident(c: u8) -> bool {
    IDENT_BYTE[usize::from(c)]
}

/// Index just past the closing `quote` of the literal opening at `start` (doubled quotes escape).
fn skip_quoted(b: &[u8], start: usize, quote: u8) -> Option<usize> {
    let mut i = start + 1;
    loop {
        let pos = b.get(i..)?.iter().position(|&x| x == quote)? + i;
        if b.get(pos + 1) == Some(&quote) {
            i = pos + 2;
        } else {
            return Some(pos + 1);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::shape_key;

    #[test]
    fn literals_are_replaced() {
        let a = shape_key("SELECT abalance FROM pgbench_accounts WHERE aid = 123;");
        assert_eq!(
            a.as_deref(),
            Some("SELECT abalance FROM pgbench_accounts WHERE aid = ?;")
        );
        assert_eq!(
            a,
            shape_key("SELECT abalance FROM pgbench_accounts WHERE aid = 98765;")
        );
        assert_eq!(
            shape_key("select 'it''s', 1.5e-3, x1 from t2").as_deref(),
            Some("select ?, ?, x1 from t2")
        );
        assert_eq!(
            shape_key("select \"a'b\" from t where v = 'x'").as_deref(),
            Some("select \"a'b\" from t where v = ?")
        );
        assert_eq!(
            shape_key("select 1 -- 'not a string'\n").as_deref(),
            Some("select ? -- 'not a string'\n")
        );
        assert_eq!(
            shape_key("update t set a = 1 where id = 2").as_deref(),
            Some("update t set a = ? where id = ?")
        );
        // Everything between the literals is kept byte for byte: identifiers (quoted or
        // not, ASCII or not), comments, parameters and the text after the last literal.
        assert_eq!(
            shape_key("select ä1, $2 from \"ö'\" /* 'c' */ where x = 'y' and z=3.5 -- 4\nlimit 7;")
                .as_deref(),
            Some("select ä1, $2 from \"ö'\" /* 'c' */ where x = ? and z=? -- 4\nlimit ?;")
        );
        assert_eq!(shape_key("select 1").as_deref(), Some("select ?"));
        assert_eq!(shape_key("select 'a'").as_deref(), Some("select ?"));
    }

    #[test]
    fn risky_texts_keep_their_own_key() {
        for sql in [
            "select 1 from t",
            "set work_mem = '8MB'",
            "SET search_path = a",
            "select 1; set x = 2",
            "  reset all",
            "select set_config('a', 'b', false)",
            "select current_setting('transaction_read_only')",
            "select E'\\'' from t",
            "select $$ 1 $$",
            "select $tag$ x $tag$",
            "select /* /* nested */ */ 1",
            "select 'unterminated",
        ] {
            assert!(
                shape_key(sql).is_none() || sql == "select 1 from t",
                "{sql} → {:?}",
                shape_key(sql)
            );
        }
        assert_eq!(
            shape_key("select 1 from t").as_deref(),
            Some("select ? from t")
        );
        assert_eq!(
            shape_key("select x from t").as_deref(),
            None,
            "nothing replaced: the text is its own key"
        );
        assert_eq!(
            shape_key("select $1 from t where a = 2").as_deref(),
            Some("select $1 from t where a = ?")
        );
    }
}
