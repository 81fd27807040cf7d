//! Statements that wrap a query (`DECLARE … CURSOR`, `COPY (query) TO`, `PREPARE`) over
//! distributed tables: their plan follows the wrapped query's, planned as a statement of its
//! own. Where the query runs on one group by its key, so does the statement; where it reads
//! across groups, the general path (group 0 over the global relations) answers the whole
//! statement, so the cursor, the COPY's rows or the prepared statement are PostgreSQL's own.

use herd_sql::Wrapper;

use super::Plan;

/// The plan of a statement wrapping a query: `wrapper` as `herd_sql::wrapped` found it,
/// `read` the wrapped query is a read, `inner` its plan (a PREPARE's planned with every
/// parameter NULL: its values come with each EXECUTE), `refused` the plan of the statement
/// itself (a refusal: what is said where nothing better applies).
pub fn wrapped_plan(wrapper: &Wrapper, read: bool, inner: Plan, refused: Plan) -> Plan {
    match wrapper {
        Wrapper::Cursor { hold: true } if !matches!(inner, Plan::Anywhere) => Plan::Refuse(
            "DECLARE … WITH HOLD over distributed tables is not supported: a held cursor \
             outlives its transaction on one server connection, which a pooled session gives \
             back at the transaction's end (and a read across groups runs on group 0 in remote \
             transactions that end with the client's); declare the cursor without WITH HOLD \
             inside a transaction block, or read the rows with a SELECT"
                .into(),
        ),
        Wrapper::CopyTo { client: false } if !matches!(inner, Plan::Anywhere) => Plan::Refuse(
            "COPY (query) TO a server file or program reading distributed tables is not \
             supported: it would write on one shard group's server; COPY (query) TO STDOUT"
                .into(),
        ),
        Wrapper::Prepare { .. } if read && !matches!(inner, Plan::Anywhere | Plan::Refuse(_)) => {
            // The statement lives on one server while each EXECUTE's values may belong to any
            // group: the general path answers every execution.
            Plan::General {
                why: "a prepared statement lives on one server while its executions' rows \
                      may be on any shard group"
                    .into(),
            }
        }
        Wrapper::Prepare { .. } => match inner {
            Plan::Anywhere => Plan::Anywhere,
            Plan::Refuse(why) if read => Plan::Refuse(why),
            _ => refused,
        },
        Wrapper::Cursor { .. } | Wrapper::CopyTo { .. } => match inner {
            Plan::Anywhere => Plan::Anywhere,
            p @ Plan::Group { .. } => p,
            Plan::General { why } => Plan::General { why },
            Plan::AllGroups { table } => Plan::General {
                why: format!(
                    "{table} is distributed and the statement reads it across shard groups"
                ),
            },
            Plan::Refuse(why) => Plan::Refuse(why),
            _ => refused,
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn refuse() -> Plan {
        Plan::Refuse("the statement's own refusal".into())
    }

    fn general(p: &Plan) -> bool {
        matches!(p, Plan::General { .. })
    }

    #[test]
    fn wrapped_statements_follow_their_query() {
        let group = Plan::Group {
            group: 1,
            reason: "key",
        };
        let all = Plan::AllGroups {
            table: "orders".into(),
        };
        let gen = Plan::General { why: "w".into() };
        let no = Plan::Refuse("inner refusal".into());
        let cursor = Wrapper::Cursor { hold: false };
        let held = Wrapper::Cursor { hold: true };
        let copy = Wrapper::CopyTo { client: true };
        let file = Wrapper::CopyTo { client: false };
        let prep = Wrapper::Prepare { name: "q".into() };
        // (wrapper, read, inner plan, expected: "same" as inner / "general" / "refuse" /
        // "own" the statement's own refusal / "anywhere").
        let cases: Vec<(&Wrapper, bool, &Plan, &str)> = vec![
            (&cursor, true, &group, "same"),
            (&cursor, true, &all, "general"),
            (&cursor, true, &gen, "general"),
            (&cursor, true, &no, "same"),
            (&cursor, true, &Plan::Anywhere, "anywhere"),
            (&held, true, &group, "refuse"),
            (&held, true, &all, "refuse"),
            (&held, true, &Plan::Anywhere, "anywhere"),
            (&copy, true, &group, "same"),
            (&copy, true, &all, "general"),
            (&copy, true, &gen, "general"),
            (&copy, true, &no, "same"),
            (&file, true, &all, "refuse"),
            (&file, true, &group, "refuse"),
            (&prep, true, &group, "general"),
            (&prep, true, &all, "general"),
            (&prep, true, &gen, "general"),
            (&prep, true, &no, "same"),
            (&prep, true, &Plan::Anywhere, "anywhere"),
            (&prep, false, &group, "own"),
            (&prep, false, &Plan::WriteAllGroups("DELETE"), "own"),
            (&cursor, true, &Plan::WriteAllGroups("DELETE"), "own"),
        ];
        for (wrapper, read, inner, want) in cases {
            let got = wrapped_plan(wrapper, read, inner.clone(), refuse());
            let ok = match want {
                "same" => got == *inner,
                "general" => general(&got),
                "anywhere" => got == Plan::Anywhere,
                "own" => got == refuse(),
                _ => matches!(&got, Plan::Refuse(w) if *w != "the statement's own refusal"),
            };
            assert!(ok, "{wrapper:?} over {inner:?}: {got:?}, want {want}");
        }
    }
}
