//! Table test: reads, writes, DDL, utility commands, functions.

mod common;

use common::{at, only, pri, rep, run, unk, vol};
use herd_sql::PinReason::*;
use herd_sql::Reason::*;
use herd_sql::Route;

#[test]
fn reads() {
    let n = run(vec![
        rep("select 1"),
        rep("SELECT * FROM t"),
        rep("select count(*) from t"),
        rep("select sum(x), avg(x) from t group by y having sum(x) > 1"),
        rep("table t"),
        rep("values (1), (2)"),
        rep("show work_mem"),
        rep("show herd.consistency"),
        rep("explain select 1"),
        rep("explain (verbose, costs off) select * from t"),
        rep("explain (analyze false) select 1"),
        rep("explain analyze select * from t"),
        rep("select now()"),
        rep("select pg_catalog.now()"),
        rep("select current_timestamp, current_user, current_date"),
        rep("select coalesce(a, 1), greatest(1, 2), least(3, 4), nullif(a, 0) from t"),
        rep("select lower(name) from t where upper(name) = 'X'"),
        rep("select abs(-1)"),
        rep("select * from t1 join lateral (select f(t1.x)) s on true"),
        rep("select row_number() over (partition by a order by b) from t"),
        rep("select rank() over w from t window w as (order by a)"),
        rep("with x as (select 1) select * from x"),
        rep("with recursive r(n) as (select 1 union all select n + 1 from r where n < 9) table r"),
        rep("select 'insert into t' as s"),
        rep("select 1 -- delete from t"),
        rep("/* write */ select 1"),
        rep("/* select 1; */ select 1 /* ; drop table t */"),
        rep("select $$drop table t$$"),
        rep("select $tag$ ; delete from t; $tag$"),
        rep("select \"delete\" from \"insert\""),
        rep("select * from t where id = $1"),
        rep("select a from t union select b from u except select c from v"),
        rep("select exists (select 1 from t)"),
        rep("select case when a then 1 else 2 end from t"),
        rep("select x::int, cast(y as text) from t"),
        rep("select * from generate_series(1, 10)"),
        rep("select array_agg(x order by x) from t"),
        rep("select extract(year from now())"),
        rep("select date_trunc('day', now()) from t limit 10 offset 5"),
        rep("select distinct on (a) a, b from t order by a, b"),
        rep("select a, b from t where a in (select a from u) and b = any(array[1, 2])"),
        rep("select t.* from t natural join u full join v using (id)"),
        rep("select 1;"),
        rep("select 1; select 2"),
        rep("  \n select 1  \n"),
        rep("copy t to stdout"),
        rep("copy (select 1) to stdout"),
        rep("copy t (a, b) to stdout with (format csv, header)"),
        rep("select * from t tablesample system (10)"),
        rep("select jsonb '{}' -> 'a', x || 'y' from t"),
    ]);
    assert!(n > 40);
}

#[test]
fn reads_a_standby_answers_differently() {
    run(vec![
        pri("select * from pg_prepared_xacts", only("pg_prepared_xacts")),
        pri(
            "select gid from pg_catalog.pg_prepared_xacts where gid = $1",
            only("pg_catalog.pg_prepared_xacts"),
        ),
        pri(
            "with x as (select * from pg_stat_replication) select count(*) from x",
            only("pg_stat_replication"),
        ),
        pri(
            "select * from t where id in (select pid from pg_locks)",
            only("pg_locks"),
        ),
        pri("select * from pg_stat_activity", only("pg_stat_activity")),
        pri(
            "select * from pg_stat_progress_vacuum",
            only("pg_stat_progress_vacuum"),
        ),
        pri(
            "copy pg_prepared_xacts to stdout",
            only("pg_prepared_xacts"),
        ),
        pri("explain select * from pg_locks", only("pg_locks")),
        pri(
            "select current_setting('transaction_read_only')",
            only("current_setting('transaction_read_only')"),
        ),
        pri(
            "select current_setting('DEFAULT_TRANSACTION_READ_ONLY', true)",
            only("current_setting('default_transaction_read_only')"),
        ),
        pri(
            "select current_setting(name) from t",
            only("current_setting(…)"),
        ),
        pri(
            "show transaction_read_only",
            only("SHOW transaction_read_only"),
        ),
        pri("SHOW in_hot_standby", only("SHOW in_hot_standby")),
        pri("show all", only("SHOW all")),
        pri("select * from unl", only("unl")),
        pri(
            "select count(*) from public.unl u join t on true",
            only("public.unl"),
        ),
        pri("copy unl to stdout", only("unl")),
        rep("select current_setting('work_mem')"),
        rep("show work_mem"),
        rep("select * from my_prepared_xacts"),
        rep("select * from other.unl"),
        rep("select * from t"),
    ]);
}

#[test]
fn functions() {
    run(vec![
        pri("select nextval('s')", vol("nextval")),
        pri("select setval('s', 1)", vol("setval")),
        pri("select currval('s')", vol("currval")),
        pri("select random()", vol("random")),
        pri("select my_func()", unk("my_func")),
        pri("select public.my_func()", unk("public.my_func")),
        pri("select \"MyFunc\"()", unk("MyFunc")),
        pri("select * from t where id = nextval('s')", vol("nextval")),
        pri("select 1 limit nextval('s')", vol("nextval")),
        pri("select * from t order by random()", vol("random")),
        pri("select txid_current()", vol("txid_current")),
        pri("select pg_current_wal_lsn()", vol("pg_current_wal_lsn")),
        pri("select clock_timestamp()", vol("clock_timestamp")),
        pri("select set_config('a', 'b', false)", vol("set_config")).pin(SetConfig),
        pri("select set_config('a', 'b', true)", vol("set_config")).no_pin(),
        pri("select pg_advisory_lock(1)", vol("pg_advisory_lock")).pin(AdvisoryLock),
        pri(
            "select pg_try_advisory_lock(1)",
            vol("pg_try_advisory_lock"),
        )
        .pin(AdvisoryLock),
        pri(
            "select pg_advisory_lock_shared(1)",
            vol("pg_advisory_lock_shared"),
        )
        .pin(AdvisoryLock),
        pri(
            "select pg_advisory_xact_lock(1)",
            vol("pg_advisory_xact_lock"),
        )
        .no_pin(),
        pri("select pg_advisory_unlock(1)", vol("pg_advisory_unlock")).pin(SessionAdvisoryUnlock),
        pri("select count(*) from t where x > random()", vol("random")),
        pri("select (select nextval('s'))", vol("nextval")),
        pri(
            "select * from t1 join lateral (select my_func(t1.x)) s on true",
            unk("my_func"),
        ),
        pri(
            "with x as (select nextval('s')) select * from x",
            vol("nextval"),
        ),
        pri(
            "select * from t where exists (select my_func())",
            unk("my_func"),
        ),
        pri("values (nextval('s'))", vol("nextval")),
        pri("explain select nextval('s')", vol("nextval")),
        pri("select 1; select nextval('s')", vol("nextval")),
        pri(
            "select count(*) filter (where my_func(x)) from t",
            unk("my_func"),
        ),
        pri(
            "select sum(x) over (order by my_func(y)) from t",
            unk("my_func"),
        ),
        pri("copy (select nextval('s')) to stdout", vol("nextval")),
    ]);
}

#[test]
fn writes() {
    run(vec![
        pri("insert into t values (1)", Write),
        pri("insert into t select * from u", Write),
        pri("insert into t values (1) on conflict do nothing", Write),
        pri(
            "insert into t values (1) on conflict (id) do update set v = excluded.v",
            Write,
        ),
        pri("update t set a = 1 where id = 2 returning *", Write),
        pri("delete from t where id = 1", Write),
        pri(
            "merge into t using s on t.id = s.id when matched then update set v = s.v \
             when not matched then insert values (s.id, s.v)",
            Write,
        ),
        pri("with x as (select 1) insert into t select * from x", Write),
        pri(
            "with x as (delete from t returning *) select * from x",
            WritingCte,
        ),
        pri(
            "with x as (update t set a = 1 returning *) select count(*) from x",
            WritingCte,
        ),
        pri(
            "with x as (insert into t values (1) returning id) select * from x",
            WritingCte,
        ),
        pri(
            "with a as (select 1), b as (with c as (delete from t returning 1) select * from c) \
             select * from b",
            WritingCte,
        ),
        pri("select * from t for update", LockingRead),
        pri("select * from t for share", LockingRead),
        pri("select * from t for no key update nowait", LockingRead),
        pri("select * from t for key share skip locked", LockingRead),
        pri("select * from (select * from t for update) s", LockingRead),
        pri(
            "select * from t where id in (select id from u for share)",
            LockingRead,
        ),
        pri("select * into new_t from t", SelectInto).no_pin(),
        pri("select * into temp new_t from t", SelectInto).pin(TempTable),
        pri("explain analyze delete from t", Write),
        pri("explain (analyze, buffers) update t set a = 1", Write),
        pri("explain delete from t", Write),
        pri("explain analyze select * from t for update", LockingRead),
        pri("copy t from stdin", Write),
        pri("copy t from '/tmp/x'", Write),
        pri("copy t to '/tmp/x'", Utility),
        pri("copy (select 1) to program 'cat'", Utility),
        pri("copy (delete from t returning *) to stdout", Write),
        pri("select 1; insert into t values (1)", Write),
        pri("insert into t values (1); select 1", Write),
        pri("select 1; select * from t for update", LockingRead),
    ]);
}

#[test]
fn ddl_and_maintenance() {
    run(vec![
        pri("create table t (i int)", Ddl).no_pin(),
        pri("create temp table x(i int)", Ddl).pin(TempTable),
        pri("create temporary table x(i int)", Ddl).pin(TempTable),
        pri("create table pg_temp.x(i int)", Ddl).pin(TempTable),
        pri(
            "create type pg_temp.r as range (subtype = text, collation = \"C\")",
            Ddl,
        )
        .pin(TempTable),
        pri(
            "create function pg_temp.f() returns int language sql as 'select 1'",
            Ddl,
        )
        .pin(TempTable),
        pri("create type public.r as range (subtype = text)", Ddl).no_pin(),
        pri("create unlogged table x(i int)", Ddl).no_pin(),
        pri("create table x as select 1", Ddl).no_pin(),
        pri("create temp table x as select 1", Ddl).pin(TempTable),
        pri("create temp view v as select 1", Ddl).pin(TempTable),
        pri("create temp sequence s", Ddl).pin(TempTable),
        pri("alter table t add column c int default nextval('s')", Ddl),
        pri("drop table t", Ddl),
        pri("drop table if exists a, b cascade", Ddl),
        pri("truncate t", Ddl),
        pri("grant select on t to bob", Ddl),
        pri("revoke select on t from bob", Ddl),
        pri("comment on table t is 'x'", Ddl),
        pri("vacuum", Ddl),
        pri("vacuum full t", Ddl),
        pri("analyze t", Ddl),
        pri("analyze", Ddl),
        pri("cluster t using i", Ddl),
        pri("reindex table t", Ddl),
        pri("refresh materialized view v", Ddl),
        pri("refresh materialized view concurrently v", Ddl),
        pri("create index on t (a)", Ddl),
        pri("create index concurrently i on t (a)", Ddl),
        pri("create materialized view v as select 1", Ddl),
        pri("create view v as select 1", Ddl),
        pri(
            "create function f() returns int language sql as 'select 1'",
            Ddl,
        ),
        pri("create extension pg_trgm", Ddl),
        pri("checkpoint", Ddl),
        pri("alter system set work_mem = '1MB'", Ddl),
        pri("alter database d set work_mem = '1MB'", Ddl),
        pri("create schema s", Ddl),
        pri("alter sequence s restart", Ddl),
        pri("create role bob", Ddl),
        pri("alter role bob set work_mem = '1MB'", Ddl),
        pri("security label on table t is 'x'", Ddl),
        pri(
            "create trigger tr after insert on t for each row execute function f()",
            Ddl,
        ),
    ]);
}

#[test]
fn utility() {
    run(vec![
        pri("call p()", Utility),
        pri("do $$ begin end $$", Utility),
        pri("do language plpgsql $$ begin perform 1; end $$", Utility),
        pri("lock table t", Lock),
        pri("lock t in access share mode nowait", Lock),
        pri("notify ch", Utility),
        pri("notify ch, 'payload'", Utility),
        pri("listen ch", Utility).pin(Listen),
        pri("unlisten ch", Utility).no_pin(),
        pri("unlisten *", Utility),
        pri("prepare p as select 1", Utility).pin(SqlPrepare),
        pri("prepare p (int) as insert into t values ($1)", Utility).pin(SqlPrepare),
        pri("execute p", Utility),
        pri("execute p(1)", Utility),
        pri("deallocate p", Utility),
        pri("deallocate all", Utility),
        pri("load 'auto_explain'", Utility).pin(LoadLibrary),
        at("declare c cursor for select 1", Route::Replica, Cursor).no_pin(),
        pri("declare c cursor with hold for select 1", Cursor).pin(WithHoldCursor),
        pri(
            "declare c cursor for select * from t for update",
            LockingRead,
        ),
        pri("declare c cursor for select nextval('s')", vol("nextval")),
        at("fetch 10 from c", Route::Replica, Cursor),
        at("move next in c", Route::Replica, Cursor),
        at("close c", Route::Replica, Cursor),
        at("close all", Route::Replica, Cursor),
    ]);
}
