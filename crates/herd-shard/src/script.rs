//! A simple-query string of several statements whose rows are on different shard groups
//! (`psql -c "BEGIN; UPDATE t … WHERE id = 1; UPDATE t … WHERE id = 2; COMMIT"`), run
//! statement by statement inside the transaction PostgreSQL gives the string: the client's own
//! `BEGIN` … [`COMMIT`] when it has them, else one implicit transaction around the whole
//! string (a `BEGIN` and `COMMIT` the client does not see). Pure: which strings can run so and
//! the statements the proxy sends for them; the proxy runs each through its transactions
//! across groups (two-phase commit when several groups wrote) and gives the client one answer.

use crate::Plan;

/// What a statement of the string does to the transaction.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Control {
    /// Nothing (an ordinary statement).
    None,
    /// `BEGIN` / `START TRANSACTION`.
    Begin,
    /// `COMMIT` / `END` (without `AND CHAIN`).
    Commit,
    /// Any other transaction control (ROLLBACK, savepoints, SET TRANSACTION, PREPARE
    /// TRANSACTION, COMMIT AND CHAIN …).
    Other,
}

/// One statement the proxy sends for the string, in order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ScriptStep {
    /// Its text.
    pub sql: String,
    /// The proxy's own `BEGIN`/`COMMIT` of an implicit transaction: its command completion is
    /// not the client's.
    pub hidden: bool,
}

/// The statements to send for a string of `statements` (text, control, own plan) whose
/// statements together need several groups; `Err` with the reason to refuse it (SQLSTATE
/// 0A000). Accepted: ordinary statements each of which runs inside a transaction (on one
/// group, or on every group as reads across groups and writes on every group do), optionally
/// between a leading `BEGIN` (not `in_transaction`: inside a transaction block PostgreSQL
/// would only warn) and a trailing `COMMIT`.
pub fn script(
    statements: &[(String, Control, Plan)],
    in_transaction: bool,
) -> Result<Vec<ScriptStep>, String> {
    let n = statements.len();
    let begin = !in_transaction && statements.first().is_some_and(|s| s.1 == Control::Begin);
    let commit = n > 1 && statements.last().is_some_and(|s| s.1 == Control::Commit);
    for (i, (_, control, plan)) in statements.iter().enumerate() {
        let edge = (i == 0 && begin) || (i + 1 == n && commit);
        if *control != Control::None && !edge {
            return Err(
                "a query string whose statements belong to different shard groups may control \
                 its transaction only with a leading BEGIN and a trailing COMMIT: send the \
                 others (ROLLBACK, savepoints, SET TRANSACTION, a COMMIT in the middle) \
                 separately"
                    .into(),
            );
        }
        if edge {
            continue;
        }
        match plan {
            Plan::Anywhere
            | Plan::Group { .. }
            | Plan::AllGroups { .. }
            | Plan::WriteAllGroups(_)
            | Plan::InsertSplit(_)
            | Plan::InsertSelect(_)
            | Plan::WriteReference { .. } => {}
            Plan::Refuse(why) => return Err(why.clone()),
            // The general path answers a statement alone (it runs on group 0 over the global
            // views, read-only), not one of a string's statements.
            Plan::General { why } => {
                return Err(format!(
                    "{why}; in a query string of several statements this read is not answered \
                     across groups: send it on its own"
                ))
            }
            Plan::Everywhere(_) | Plan::EachGroup { .. } | Plan::CopyIn(_) | Plan::CopyOut(_) => {
                return Err(
                    "a statement of this query string runs on every shard group in a \
                     transaction of its own (DDL or COPY on a distributed or reference table): \
                     send it alone"
                        .into(),
                )
            }
        }
    }
    if commit && !begin && !in_transaction {
        return Err(
            "a query string whose statements belong to different shard groups ends with COMMIT \
             but does not begin with BEGIN: send it with its BEGIN, or without the COMMIT"
                .into(),
        );
    }
    let step = |sql: &str, hidden| ScriptStep {
        sql: sql.to_string(),
        hidden,
    };
    // Without a transaction of its own, PostgreSQL's implicit one: the proxy's BEGIN/COMMIT.
    let implicit = !begin && !in_transaction;
    let mut steps = Vec::with_capacity(n + 2);
    if implicit {
        steps.push(step("BEGIN", true));
    }
    steps.extend(statements.iter().map(|(sql, ..)| step(sql, false)));
    if implicit {
        steps.push(step("COMMIT", true));
    }
    Ok(steps)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn g(group: u32) -> Plan {
        Plan::Group {
            group,
            reason: "key",
        }
    }

    fn s(sql: &str, control: Control, plan: Plan) -> (String, Control, Plan) {
        (sql.to_string(), control, plan)
    }

    fn texts(steps: &[ScriptStep]) -> Vec<(&str, bool)> {
        steps.iter().map(|s| (s.sql.as_str(), s.hidden)).collect()
    }

    #[test]
    fn accepted_strings() {
        use Control::{Begin, Commit, None as Plain};
        // psql -c "BEGIN; …; COMMIT": the client's own transaction.
        let steps = script(
            &[
                s("BEGIN", Begin, Plan::Anywhere),
                s("update t set v = 1 where id = 1", Plain, g(0)),
                s("update t set v = 2 where id = 2", Plain, g(1)),
                s("COMMIT", Commit, Plan::Anywhere),
            ],
            false,
        )
        .expect("accepted");
        assert_eq!(
            texts(&steps),
            [
                ("BEGIN", false),
                ("update t set v = 1 where id = 1", false),
                ("update t set v = 2 where id = 2", false),
                ("COMMIT", false)
            ]
        );
        // BEGIN without COMMIT: the transaction stays open, as PostgreSQL leaves it.
        let steps = script(
            &[
                s(
                    "begin isolation level repeatable read",
                    Begin,
                    Plan::Anywhere,
                ),
                s("select 1", Plain, Plan::Anywhere),
                s("select * from t where id = 2", Plain, g(1)),
            ],
            false,
        )
        .expect("accepted");
        assert_eq!(steps.len(), 3);
        assert!(steps.iter().all(|s| !s.hidden));
        // No transaction control: one implicit transaction around it.
        let steps = script(
            &[
                s("insert into t (id) values (1)", Plain, g(0)),
                s(
                    "select count(*) from t",
                    Plain,
                    Plan::AllGroups { table: "t".into() },
                ),
                s("delete from t", Plain, Plan::WriteAllGroups("DELETE")),
                s(
                    "insert into t (id) values (1), (2)",
                    Plain,
                    Plan::InsertSplit(vec![0, 1]),
                ),
            ],
            false,
        )
        .expect("accepted");
        assert_eq!(
            texts(&steps),
            [
                ("BEGIN", true),
                ("insert into t (id) values (1)", false),
                ("select count(*) from t", false),
                ("delete from t", false),
                ("insert into t (id) values (1), (2)", false),
                ("COMMIT", true)
            ]
        );
    }

    /// Inside the client's transaction block: its statements as they are, a trailing COMMIT
    /// included; a BEGIN is refused.
    #[test]
    fn strings_inside_a_transaction() {
        use Control::{Begin, Commit, None as Plain};
        let steps = script(
            &[
                s("update t set v = 1 where id = 1", Plain, g(0)),
                s("update t set v = 2 where id = 2", Plain, g(1)),
                s("COMMIT", Commit, Plan::Anywhere),
            ],
            true,
        )
        .expect("accepted");
        assert_eq!(
            texts(&steps),
            [
                ("update t set v = 1 where id = 1", false),
                ("update t set v = 2 where id = 2", false),
                ("COMMIT", false)
            ]
        );
        let steps = script(
            &[s("select 1", Plain, g(0)), s("select 2", Plain, g(1))],
            true,
        )
        .expect("accepted");
        assert!(steps.iter().all(|s| !s.hidden));
        let why = script(
            &[
                s("BEGIN", Begin, Plan::Anywhere),
                s("select 1", Plain, g(0)),
                s("select 2", Plain, g(1)),
            ],
            true,
        )
        .expect_err("a BEGIN inside a transaction");
        assert!(why.contains("leading BEGIN"), "{why}");
    }

    /// Writes to reference tables run in the string's transaction like any other write
    /// (every group applies them, all or none).
    #[test]
    fn reference_writes_run_in_the_strings_transaction() {
        let reference = || Plan::WriteReference {
            table: "kinds".into(),
            tag: "INSERT 0",
            columns: Vec::new(),
        };
        let steps = script(
            &[
                s("insert into kinds values (1)", Control::None, reference()),
                s("update t set v = 1 where id = 1", Control::None, g(1)),
            ],
            false,
        )
        .expect("accepted");
        assert_eq!(
            texts(&steps),
            [
                ("BEGIN", true),
                ("insert into kinds values (1)", false),
                ("update t set v = 1 where id = 1", false),
                ("COMMIT", true),
            ]
        );
    }

    #[test]
    fn refused_strings() {
        use Control::{Begin, Commit, None as Plain, Other};
        type Statement = (String, Control, Plan);
        let cases: Vec<(Vec<Statement>, &str)> = vec![
            (
                vec![
                    s("BEGIN", Begin, Plan::Anywhere),
                    s("update t set v = 1 where id = 1", Plain, g(0)),
                    s("SAVEPOINT a", Other, Plan::Anywhere),
                    s("update t set v = 2 where id = 2", Plain, g(1)),
                ],
                "leading BEGIN",
            ),
            (
                vec![
                    s("update t set v = 1 where id = 1", Plain, g(0)),
                    s("COMMIT", Commit, Plan::Anywhere),
                    s("update t set v = 2 where id = 2", Plain, g(1)),
                ],
                "leading BEGIN",
            ),
            (
                vec![
                    s("update t set v = 1 where id = 1", Plain, g(0)),
                    s("update t set v = 2 where id = 2", Plain, g(1)),
                    s("COMMIT", Commit, Plan::Anywhere),
                ],
                "does not begin with BEGIN",
            ),
            (
                vec![
                    s("update t set v = 1 where id = 1", Plain, g(0)),
                    s(
                        "select * from a, b",
                        Plain,
                        Plan::Refuse("not joined".into()),
                    ),
                ],
                "not joined",
            ),
            (
                vec![
                    s("update t set v = 1 where id = 1", Plain, g(1)),
                    s(
                        "create index on t (v)",
                        Plain,
                        Plan::Everywhere("CREATE INDEX"),
                    ),
                ],
                "send it alone",
            ),
            (
                vec![
                    s("BEGIN", Begin, Plan::Anywhere),
                    s("BEGIN", Begin, Plan::Anywhere),
                    s("select 1", Plain, g(1)),
                ],
                "leading BEGIN",
            ),
        ];
        for (statements, needle) in cases {
            let why = script(&statements, false).expect_err(needle);
            assert!(why.contains(needle), "{why}");
        }
    }
}
