//! Table test: transaction control, session state, empty and broken input.

mod common;

use common::{at, pri, rep, run, set};
use herd_sql::Reason::*;
use herd_sql::Route::Replica;
use herd_sql::SessionEffect as S;
use herd_sql::TxEffect as T;

#[test]
fn transactions() {
    run(vec![
        pri("begin", TransactionControl).tx(T::Begin { read_only: false }),
        at("begin read only", Replica, TransactionControl).tx(T::Begin { read_only: true }),
        pri("begin read write", TransactionControl).tx(T::Begin { read_only: false }),
        at(
            "begin isolation level repeatable read, read only",
            Replica,
            TransactionControl,
        )
        .tx(T::Begin { read_only: true }),
        pri("start transaction", TransactionControl).tx(T::Begin { read_only: false }),
        at("start transaction read only", Replica, TransactionControl)
            .tx(T::Begin { read_only: true }),
        pri(
            "start transaction isolation level serializable, read only",
            SerializableTransaction,
        )
        .tx(T::Begin { read_only: true }),
        pri(
            "begin isolation level serializable",
            SerializableTransaction,
        ),
        at("commit", Replica, TransactionControl).tx(T::Commit),
        at("end", Replica, TransactionControl).tx(T::Commit),
        at("commit and chain", Replica, TransactionControl).tx(T::Commit),
        at("rollback", Replica, TransactionControl).tx(T::Rollback),
        at("abort", Replica, TransactionControl).tx(T::Rollback),
        at("savepoint s1", Replica, TransactionControl).tx(T::Savepoint),
        at("release savepoint s1", Replica, TransactionControl).tx(T::Release),
        at("release s1", Replica, TransactionControl).tx(T::Release),
        at("rollback to savepoint s1", Replica, TransactionControl).tx(T::RollbackToSavepoint),
        at("rollback to s1", Replica, TransactionControl).tx(T::RollbackToSavepoint),
        pri("prepare transaction 'x'", TransactionControl).tx(T::PrepareTransaction),
        pri("commit prepared 'x'", TransactionControl).tx(T::CommitPrepared),
        pri("rollback prepared 'x'", TransactionControl).tx(T::RollbackPrepared),
        at("set transaction read only", Replica, TransactionControl).tx(T::SetTransaction {
            read_only: Some(true),
        }),
        pri("set transaction read write", TransactionControl).tx(T::SetTransaction {
            read_only: Some(false),
        }),
        at(
            "set transaction isolation level repeatable read",
            Replica,
            TransactionControl,
        )
        .tx(T::SetTransaction { read_only: None }),
        pri(
            "set transaction isolation level serializable",
            SerializableTransaction,
        ),
        pri(
            "set transaction snapshot '00000003-0000001B-1'",
            TransactionControl,
        ),
        pri("set constraints all deferred", TransactionControl),
        at(
            "set transaction_read_only = on",
            Replica,
            TransactionControl,
        )
        .tx(T::SetTransaction {
            read_only: Some(true),
        }),
        pri("set transaction_read_only = off", TransactionControl).tx(T::SetTransaction {
            read_only: Some(false),
        }),
        pri(
            "set transaction_isolation = 'serializable'",
            SerializableTransaction,
        ),
        at(
            "set local transaction_isolation = 'read committed'",
            Replica,
            TransactionControl,
        ),
        pri("begin; insert into t values (1); commit", Write),
        pri("begin; select 1; commit", TransactionControl),
        rep("begin read only; select 1; commit"),
    ]);
}

#[test]
fn session_state() {
    let ss = SessionState;
    run(vec![
        at("set search_path to a, b", Replica, ss.clone()).session(set(
            "search_path",
            "a, b",
            "SET search_path = 'a', 'b'",
        )),
        at("set work_mem = '64MB'", Replica, ss.clone()).session(set(
            "work_mem",
            "64MB",
            "SET work_mem = '64MB'",
        )),
        at("SET statement_timeout TO 0", Replica, ss.clone()).session(set(
            "statement_timeout",
            "0",
            "SET statement_timeout = 0",
        )),
        at("set session work_mem = 1024", Replica, ss.clone()).session(set(
            "work_mem",
            "1024",
            "SET work_mem = 1024",
        )),
        at("set herd.consistency = eventual", Replica, ss.clone()).session(set(
            "herd.consistency",
            "eventual",
            "SET herd.consistency = 'eventual'",
        )),
        at("SET Herd.Consistency TO 'strong'", Replica, ss.clone()).session(set(
            "herd.consistency",
            "strong",
            "SET herd.consistency = 'strong'",
        )),
        at("set local statement_timeout = 0", Replica, ss.clone()).session(S::SetLocal {
            name: "statement_timeout".into(),
            value: "0".into(),
            sql: "SET LOCAL statement_timeout = 0".into(),
        }),
        at("set time zone 'UTC'", Replica, ss.clone()).session(set(
            "timezone",
            "UTC",
            "set time zone 'UTC'",
        )),
        at("set names 'UTF8'", Replica, ss.clone()).session(set(
            "client_encoding",
            "UTF8",
            "SET client_encoding = 'UTF8'",
        )),
        at("set role bob", Replica, ss.clone()).session(set("role", "bob", "SET role = 'bob'")),
        at("set \"MyApp.Var\" = 'x'", Replica, ss.clone()).session(set(
            "MyApp.Var",
            "x",
            "SET \"MyApp\".\"Var\" = 'x'",
        )),
        at("set x.y = on", Replica, ss.clone()).session(set("x.y", "on", "SET x.y = 'on'")),
        at("set x.y = -1.5", Replica, ss.clone()).session(set("x.y", "-1.5", "SET x.y = -1.5")),
        at("set x.y = 'it''s'", Replica, ss.clone()).session(set(
            "x.y",
            "it's",
            "SET x.y = 'it''s'",
        )),
        at("set x.y = 'a\\b'", Replica, ss.clone()).session(set("x.y", "a\\b", "set x.y = 'a\\b'")),
        at("set x.y to default", Replica, ss.clone()).session(S::Reset { name: "x.y".into() }),
        at("reset work_mem", Replica, ss.clone()).session(S::Reset {
            name: "work_mem".into(),
        }),
        at("reset all", Replica, ss.clone()).session(S::ResetAll),
        at("discard all", Replica, ss.clone()).session(S::Discard { all: true }),
        at("discard plans", Replica, ss.clone()).session(S::Discard { all: false }),
        at(
            "set session characteristics as transaction read only",
            Replica,
            ss.clone(),
        )
        .session(set(
            "session characteristics",
            "",
            "set session characteristics as transaction read only",
        )),
        rep("set work_mem = '1MB'; select 1"),
        at("set a.b = 1; set c.d = 2", Replica, ss.clone()),
        pri("set work_mem = '1MB'; insert into t values (1)", Write),
    ]);
}

#[test]
fn empty_and_broken() {
    run(vec![
        pri("", Empty),
        pri("   ", Empty),
        pri(";", Empty),
        pri(";;", Empty),
        pri("-- just a comment", Empty),
        pri("/* nothing */", Empty),
        pri("selec 1", Unparseable),
        pri("select from where", Unparseable),
        pri("select 1; garbage", Unparseable),
        pri("select 'unterminated", Unparseable),
        pri("select 1 /* unterminated", Unparseable),
        pri("select \0 1", Unparseable),
        pri("insert into", Unparseable),
        pri("delete", Unparseable),
    ]);
}
