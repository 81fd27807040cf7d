//! A cache key that ignores literal values: `select * from t where id = 42` and `… = 43` share
//! one classification. Classification does not depend on literal values, except where the
//! value itself is session state (`SET`, `RESET`, `set_config(…)`): those texts keep their own
//! key, as does anything the small lexer below is not sure about.

/// A shape key as it is built: statements of up to this many bytes are shaped on the stack
/// (a statement is shaped on every execution; an allocation would cost as much as the lexing).
pub(crate) type ShapeBuf = smallvec::SmallVec<[u8; 256]>;

/// The shape of `sql` (numbers and quoted strings replaced by `?`), or `None` when the text
/// must be its own key.
pub fn shape_key(sql: &str) -> Option<String> {
    let mut out = ShapeBuf::new();
    if !shape_into(sql, &mut out) {
        return None;
    }
    // Runs are cut at ASCII bytes only, so the key is UTF-8 like the text.
    String::from_utf8(out.into_vec()).ok()
}

/// A literal the lexer replaced by `?`: where it was and what decided where it ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Literal {
    /// Its first byte.
    pub(crate) start: usize,
    /// Just past its last byte.
    pub(crate) end: usize,
    /// Quoted (`'…'`) or a number.
    pub(crate) quoted: bool,
    /// A number whose last byte could continue an identifier: the lexer then read what follows
    /// as the rest of that "identifier" (`1$`), not as new tokens.
    pub(crate) continued: bool,
}

/// The literals of a text, in order, as [`shape_into`] found them.
pub(crate) type Literals = smallvec::SmallVec<[Literal; 8]>;

/// Writes the shape of `sql` into `out` (cleared first), as [`shape_key`] returns it; false
/// when the text must be its own key (then `out` holds nothing useful).
pub(crate) fn shape_into(sql: &str, out: &mut ShapeBuf) -> bool {
    shape_recording(sql, out, None)
}

/// [`shape_into`], also noting each replaced literal in `literals` when given (cleared first).
pub(crate) fn shape_recording(
    sql: &str,
    out: &mut ShapeBuf,
    mut literals: Option<&mut Literals>,
) -> bool {
    let b = sql.as_bytes();
    if let Some(l) = literals.as_deref_mut() {
        l.clear();
    }
    out.clear();
    // Built from runs of the text between replaced literals (`b[copied..i]` is still to be
    // appended), each byte's kind found with one table lookup.
    let mut copied = 0;
    let mut i = 0;
    let mut replaced = false;
    let mut at_statement_start = true;
    // Invariant at the top of the loop: when `b[i]` can continue an identifier, `b[i - 1]`
    // cannot (runs that continue one are consumed where they arise), so a letter here starts
    // a word and a digit starts a number.
    while i < b.len() {
        match CLASS[usize::from(b[i])] {
            OTHER => i += 1,
            WORD => {
                let end = ident_end(b, i + 1);
                // current_setting('transaction_read_only') routes differently from
                // current_setting('work_mem'): its literal decides, as set_config's does.
                if is_stateful_word(&b[i..end], at_statement_start) {
                    return false;
                }
                at_statement_start = false;
                i = end;
            }
            DIGIT => {
                let end = number_end(b, i);
                literal(out, &b[copied..i]);
                copied = end;
                replaced = true;
                // `1$` or `1ä`: what follows continues the number's "identifier" (not
                // after `1.` or `1e-`, which end in a byte that cannot).
                let continued = continues_identifier(b[end - 1]);
                if let Some(l) = literals.as_deref_mut() {
                    l.push(Literal {
                        start: i,
                        end,
                        quoted: false,
                        continued,
                    });
                }
                i = if continued {
                    match continuation_end(b, end) {
                        Some(end) => end,
                        None => return false,
                    }
                } else {
                    end
                };
            }
            QUOTE => {
                // E'…' and U&'…' have other escaping rules: not worth the risk.
                if i > 0 && matches!(b[i - 1], b'e' | b'E' | b'&') {
                    return false;
                }
                let Some(end) = skip_quoted(b, i, b'\'') else {
                    return false;
                };
                literal(out, &b[copied..i]);
                if let Some(l) = literals.as_deref_mut() {
                    l.push(Literal {
                        start: i,
                        end,
                        quoted: true,
                        continued: false,
                    });
                }
                copied = end;
                i = end;
                replaced = true;
            }
            DOUBLE_QUOTE => {
                let Some(end) = skip_quoted(b, i, b'"') else {
                    return false;
                };
                i = end;
                at_statement_start = false;
            }
            DOLLAR => {
                // $1 parameters stay; dollar quoting ($$ … $$, $tag$ … $tag$) is left alone.
                if !b.get(i + 1).is_some_and(u8::is_ascii_digit) {
                    return false;
                }
                match continuation_end(b, i + 1) {
                    Some(end) => i = end,
                    None => return false,
                }
            }
            DASH if b.get(i + 1) == Some(&b'-') => {
                i = b[i..]
                    .iter()
                    .position(|&x| x == b'\n')
                    .map_or(b.len(), |p| i + p);
            }
            SLASH if b.get(i + 1) == Some(&b'*') => {
                let Some(close) = sql[i + 2..].find("*/").map(|p| p + i + 2) else {
                    return false;
                };
                if sql[i + 2..close].contains("/*") {
                    return false; // nested comments
                }
                i = close + 2;
            }
            SEMICOLON => {
                at_statement_start = true;
                i += 1;
            }
            _ => i += 1, // a lone `-` or `/`
        }
    }
    if !replaced {
        return false;
    }
    out.extend_from_slice(&b[copied..]);
    true
}

/// Appends the text before a literal and the literal's `?`.
fn literal(out: &mut ShapeBuf, before: &[u8]) {
    out.extend_from_slice(before);
    out.push(b'?');
}

/// Words whose literal argument is session state (`SET`, `RESET` opening a statement,
/// `set_config`, `current_setting`): the length decides before any byte is compared.
fn is_stateful_word(word: &[u8], at_statement_start: bool) -> bool {
    match word.len() {
        3 => at_statement_start && word.eq_ignore_ascii_case(b"set"),
        5 => at_statement_start && word.eq_ignore_ascii_case(b"reset"),
        10 => word.eq_ignore_ascii_case(b"set_config"),
        15 => word.eq_ignore_ascii_case(b"current_setting"),
        _ => false,
    }
}

/// Whether byte `x` can continue an identifier.
fn continues_identifier(x: u8) -> bool {
    CLASS[usize::from(x)] & IDENT != 0
}

/// Where a literal of the same kind as `like` that starts at `start` of `b` ends, lexed as
/// [`shape_into`] lexes it; `None` when `b` has no such literal there (another kind, an
/// unterminated quote, a number that does or does not continue an identifier where `like`
/// did not or did).
pub(crate) fn literal_end(b: &[u8], start: usize, like: &Literal) -> Option<usize> {
    if like.quoted {
        return match b.get(start) {
            Some(b'\'') => skip_quoted(b, start, b'\''),
            _ => None,
        };
    }
    if !b.get(start)?.is_ascii_digit() {
        return None;
    }
    let end = number_end(b, start);
    (continues_identifier(b[end - 1]) == like.continued).then_some(end)
}

/// End of the number starting at `start`: digits, letters, `.` and `_` (so `1.5e3` and
/// `0x1F` are one literal), with an exponent's sign (`1e-5`).
fn number_end(b: &[u8], start: usize) -> usize {
    let mut j = start;
    while j < b.len() && (b[j].is_ascii_alphanumeric() || b[j] == b'.' || b[j] == b'_') {
        if matches!(b[j], b'e' | b'E') && matches!(b.get(j + 1), Some(b'+' | b'-')) {
            j += 1;
        }
        j += 1;
    }
    j
}

/// End of the identifier bytes from `start` on.
fn ident_end(b: &[u8], start: usize) -> usize {
    b[start..]
        .iter()
        .position(|&x| !continues_identifier(x))
        .map_or(b.len(), |p| start + p)
}

/// End of identifier bytes that continue a parameter or a number (`$1`, `1$`): kept as they
/// are, but non-ASCII there is too odd to shape (`None`).
fn continuation_end(b: &[u8], start: usize) -> Option<usize> {
    let end = ident_end(b, start);
    b[start..end].is_ascii().then_some(end)
}

/// Byte kinds for the lexer. The `IDENT` bit marks bytes that continue an identifier:
/// letters, digits, `_`, `$` and every non-ASCII byte.
const IDENT: u8 = 0x80;
const OTHER: u8 = 0;
const WORD: u8 = IDENT | 1;
const DIGIT: u8 = IDENT | 2;
const DOLLAR: u8 = IDENT | 3;
const QUOTE: u8 = 4;
const DOUBLE_QUOTE: u8 = 5;
const DASH: u8 = 6;
const SLASH: u8 = 7;
const SEMICOLON: u8 = 8;

/// The kind of every byte: one lookup per byte, however many rules apply to it.
static CLASS: [u8; 256] = {
    let mut table = [OTHER; 256];
    let mut i = 0;
    while i < 256 {
        let c = i as u8;
        table[i] = match c {
            b'0'..=b'9' => DIGIT,
            b'$' => DOLLAR,
            b'\'' => QUOTE,
            b'"' => DOUBLE_QUOTE,
            b'-' => DASH,
            b'/' => SLASH,
            b';' => SEMICOLON,
            c if c.is_ascii_alphabetic() || c == b'_' || !c.is_ascii() => WORD,
            _ => OTHER,
        };
        i += 1;
    }
    table
};

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
        // Bytes that continue a number or a parameter are kept; non-ASCII there is not
        // shaped. After `1.` or `1e+` a new word starts.
        assert_eq!(
            shape_key("select 1$ from t where a = 2").as_deref(),
            Some("select ?$ from t where a = ?")
        );
        assert_eq!(shape_key("select 1ä from t"), None);
        assert_eq!(shape_key("select $1ä, 2"), None);
        assert_eq!(
            shape_key("select 1e+ä from t").as_deref(),
            Some("select ?ä from t")
        );
        assert_eq!(shape_key("select 1.ä").as_deref(), Some("select ?ä"));
        // Longer than the stack buffer: the same key, from the heap.
        let long = format!("select {} from t where id = 7", "c, ".repeat(100));
        assert_eq!(
            shape_key(&long),
            Some(format!("select {} from t where id = ?", "c, ".repeat(100)))
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
