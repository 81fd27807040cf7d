//! Statements that wrap a query (`DECLARE … CURSOR`, `COPY (query) TO`) over distributed
//! tables: their plan follows the wrapped query's, planned as a statement of its own. Where
//! the query runs on one group by its key, so does the statement; where it reads across
//! groups, the general path (group 0 over the global relations) answers the whole
//! statement, so the cursor or the COPY's rows are PostgreSQL's own.

use herd_sql::Wrapper;

use super::Plan;

/// The plan of a statement wrapping a query: `wrapper` as `herd_sql::wrapped` found it,
/// `inner` the wrapped query's plan, `refused` the plan of the statement itself (a refusal:
/// what is said where nothing better applies, e.g. a write on every group).
pub fn wrapped_plan(wrapper: &Wrapper, inner: Plan, refused: Plan) -> Plan {
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
        // (wrapper, inner plan, expected: "same" as inner / "general" / "refuse" /
        // "own" the statement's own refusal / "anywhere").
        let cases: Vec<(&Wrapper, &Plan, &str)> = vec![
            (&cursor, &group, "same"),
            (&cursor, &all, "general"),
            (&cursor, &gen, "general"),
            (&cursor, &no, "same"),
            (&cursor, &Plan::Anywhere, "anywhere"),
            (&held, &group, "refuse"),
            (&held, &all, "refuse"),
            (&held, &Plan::Anywhere, "anywhere"),
            (&copy, &group, "same"),
            (&copy, &all, "general"),
            (&copy, &gen, "general"),
            (&copy, &no, "same"),
            (&file, &all, "refuse"),
            (&file, &group, "refuse"),
            (&cursor, &Plan::WriteAllGroups("DELETE"), "own"),
        ];
        for (wrapper, inner, want) in cases {
            let got = wrapped_plan(wrapper, inner.clone(), refuse());
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
