#!/usr/bin/env python3
"""psycopg 3 compatibility checks run through Herd's endpoint (the proxy).

Usage: psycopg_check.py PROXY_URL [PRIMARY_URL]

PROXY_URL is what `herd url` prints; PRIMARY_URL (`herd url --primary`), when given, is used to
verify committed / rolled-back rows directly on the primary, bypassing the proxy.

Each check prints `ok <name>` or raises with a message naming what went wrong; any failure makes
the script exit non-zero (after running the remaining checks, so one run shows every failure).
Every network operation is bounded: connections use connect_timeout, and a watchdog kills the
process (printing every thread's stack) if one check takes longer than CHECK_TIMEOUT seconds.
"""

import datetime as dt
import faulthandler
import sys
import threading
import time
import traceback
import urllib.parse
import urllib.request
import uuid
from decimal import Decimal

import psycopg
from psycopg import errors, sql

CHECK_TIMEOUT = 30
CONNECT_TIMEOUT = 10
PREFIX = "drv_py_"


def fail(msg):
    raise AssertionError(msg)


def expect_eq(got, want, what):
    if got != want:
        fail(f"{what}: expected {want!r}, got {got!r}")


class Checker:
    def __init__(self, url, primary_url):
        self.url = url
        self.primary_url = primary_url
        self.failures = []

    def connect(self, url=None, **kw):
        kw.setdefault("connect_timeout", CONNECT_TIMEOUT)
        return psycopg.connect(url or self.url, **kw)

    def run(self, name, fn):
        faulthandler.dump_traceback_later(CHECK_TIMEOUT, exit=True)
        start = time.monotonic()
        try:
            fn()
        except Exception as e:  # noqa: BLE001 - report every failure, keep going
            self.failures.append(name)
            print(f"FAIL {name}: {type(e).__name__}: {e}", flush=True)
            diag = getattr(e, "diag", None)
            if diag is not None and getattr(diag, "sqlstate", None):
                print(f"     sqlstate={diag.sqlstate} detail={diag.message_detail!r}", flush=True)
            traceback.print_exc(file=sys.stdout)
            sys.stdout.flush()
        else:
            print(f"ok {name} ({time.monotonic() - start:.2f}s)", flush=True)
        finally:
            faulthandler.cancel_dump_traceback_later()

    # ----------------------------------------------------------------------------------------

    def setup(self):
        with self.connect(autocommit=True) as conn:
            for t in ("tx", "types", "uniq", "copy", "ryw", "pipe", "prep"):
                conn.execute(f"drop table if exists {PREFIX}{t}")
            conn.execute(f"create table {PREFIX}tx (id int primary key, note text)")
            conn.execute(
                f"create table {PREFIX}types (id int primary key, i bigint, t text, n numeric,"
                " ts timestamptz, b bytea, nul text, ia int[], ta text[], f float8, bo bool,"
                " d date, u uuid, j jsonb)"
            )
            conn.execute(f"create table {PREFIX}uniq (id int primary key)")
            conn.execute(f"create table {PREFIX}copy (id int primary key, note text, n numeric)")
            conn.execute(f"create table {PREFIX}ryw (id int primary key, v text)")
            conn.execute(f"create table {PREFIX}pipe (id int primary key, v text)")
            conn.execute(f"create table {PREFIX}prep (id int primary key, v text)")

    def check_connect(self):
        with self.connect() as conn:
            v = conn.info.server_version
            if not 150000 <= v < 160000:
                fail(f"server_version {v}: expected PostgreSQL 15")
            sv = conn.info.parameter_status("server_version")
            if not sv or not sv.startswith("15"):
                fail(f"ParameterStatus server_version = {sv!r}")
            for p in ("client_encoding", "DateStyle", "integer_datetimes", "standard_conforming_strings"):
                if conn.info.parameter_status(p) is None:
                    fail(f"ParameterStatus {p} missing")
            expect_eq(conn.info.parameter_status("client_encoding"), "UTF8", "client_encoding")
            if not conn.pgconn.used_password:
                fail("the connection did not use the password (no SCRAM exchange?)")
            if conn.info.backend_pid == 0:
                fail("BackendKeyData missing (backend_pid 0): cancel cannot work")
            expect_eq(conn.execute("select 1 + 1").fetchone(), (2,), "select 1 + 1")
            expect_eq(conn.execute("select current_user").fetchone(), ("postgres",), "current_user")
        # A wrong password is refused with 28P01.
        parts = urllib.parse.urlsplit(self.url)
        bad = parts._replace(netloc=f"postgres:not-the-password@{parts.hostname}:{parts.port}")
        try:
            self.connect(urllib.parse.urlunsplit(bad)).close()
        except psycopg.OperationalError as e:
            if "password authentication failed" not in str(e):
                fail(f"wrong password refused with an unexpected message: {e}")
        else:
            fail("a wrong password was accepted")

    def check_transactions(self):
        t = f"{PREFIX}tx"
        with self.connect() as conn:  # not autocommit: psycopg opens transactions itself
            with conn.cursor() as cur:
                cur.execute(f"insert into {t} values (1, 'committed'), (2, 'committed')")
                cur.execute(f"select count(*) from {t}")
                expect_eq(cur.fetchone(), (2,), "rows seen inside the transaction")
                expect_eq(conn.info.transaction_status, psycopg.pq.TransactionStatus.INTRANS, "status")
            conn.commit()
            with conn.cursor() as cur:
                cur.execute(f"insert into {t} values (3, 'rolled back')")
                cur.execute(f"update {t} set note = 'changed' where id = 1")
                cur.execute(f"select count(*) from {t}")
                expect_eq(cur.fetchone(), (3,), "rows inside the doomed transaction")
            conn.rollback()
            # The transaction() context manager: commit on success, rollback on exception.
            conn.autocommit = True
            with conn.transaction():
                conn.execute(f"insert into {t} values (4, 'ctx committed')")
            try:
                with conn.transaction():
                    conn.execute(f"insert into {t} values (5, 'ctx rolled back')")
                    raise RuntimeError("boom")
            except RuntimeError:
                pass
            # Savepoints (nested transaction blocks).
            with conn.transaction():
                conn.execute(f"insert into {t} values (6, 'outer')")
                try:
                    with conn.transaction():
                        conn.execute(f"insert into {t} values (7, 'inner rolled back')")
                        raise RuntimeError("inner")
                except RuntimeError:
                    pass
            rows = conn.execute(f"select id, note from {t} order by id").fetchall()
            want = [(1, "committed"), (2, "committed"), (4, "ctx committed"), (6, "outer")]
            expect_eq(rows, want, "rows after commit/rollback (through the proxy)")
        if self.primary_url:
            with self.connect(self.primary_url, autocommit=True) as p:
                rows = p.execute(f"select id, note from {t} order by id").fetchall()
                expect_eq(rows, want, "rows after commit/rollback (on the primary)")

    def check_prepared(self):
        with self.connect(autocommit=True) as conn:
            cur = conn.cursor()
            for i in range(300):
                cur.execute("select %s::int * 2, %s::text", (i, f"v{i}"), prepare=True)
                expect_eq(cur.fetchone(), (i * 2, f"v{i}"), f"prepared select #{i}")
            # Prepared writes, alternating with prepared reads of what was written.
            for i in range(100):
                cur.execute(f"insert into {PREFIX}prep values (%s, %s)", (i, f"p{i}"), prepare=True)
                cur.execute(f"select v from {PREFIX}prep where id = %s", (i,), prepare=True)
                expect_eq(cur.fetchone(), (f"p{i}",), f"prepared read-your-write #{i}")
            # Prepared statements survive transactions (the proxy may switch server connections).
            for i in range(20):
                with conn.transaction():
                    cur.execute("select %s::int + 1", (i,), prepare=True)
                    expect_eq(cur.fetchone(), (i + 1,), f"prepared in transaction #{i}")
            # Every statement prepared (threshold 0), many distinct texts.
            conn.prepare_threshold = 0
            for i in range(50):
                cur.execute(f"select %s::int + {i}", (1,))
                expect_eq(cur.fetchone(), (1 + i,), f"distinct prepared statement #{i}")
            conn.prepare_threshold = 5
            # More distinct statements than psycopg keeps (prepared_max, 100 by default): it
            # closes the oldest (protocol Close with libpq >= 17, else DEALLOCATE name).
            for i in range(150):
                cur.execute(f"select %s::int - {i}", (1000,), prepare=True)
                expect_eq(cur.fetchone(), (1000 - i,), f"statement #{i} past prepared_max")

            # Parameter types, text and binary, as query parameters and round-tripped via a table.
            ts = dt.datetime(2024, 2, 29, 13, 14, 15, 123456, tzinfo=dt.timezone.utc)
            u = uuid.UUID("12345678-1234-5678-1234-567812345678")
            row = (
                2**40,
                "héllo wörld ☃ 'quote' \"dq\" \\ backslash",
                Decimal("12345678901234567890.123456789"),
                ts,
                b"\x00\x01\xff binary \x00",
                None,
                [1, 2, None, 4],
                ["a", "b c", None, 'd"e'],
                3.5,
                True,
                dt.date(1999, 12, 31),
                u,
            )
            for binary in (False, True):
                got = cur.execute(
                    "select %s::bigint, %s::text, %s::numeric, %s::timestamptz, %s::bytea,"
                    " %s::text, %s::int[], %s::text[], %s::float8, %s::bool, %s::date, %s::uuid",
                    row,
                    binary=binary,
                    prepare=True,
                ).fetchone()
                expect_eq(got, row, f"parameter round trip (binary={binary})")
            for k, binary in enumerate((False, True)):
                cur.execute(
                    f"insert into {PREFIX}types values (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s,"
                    " %s, %s, %s, %s)",
                    (k,) + row + (psycopg.types.json.Jsonb({"k": [1, "x"]}),),
                    binary=binary,
                )
                got = cur.execute(
                    f"select i, t, n, ts, b, nul, ia, ta, f, bo, d, u from {PREFIX}types"
                    " where id = %s",
                    (k,),
                    binary=binary,
                ).fetchone()
                expect_eq(got, row, f"table round trip (binary={binary})")
                j = cur.execute(f"select j from {PREFIX}types where id = %s", (k,)).fetchone()
                expect_eq(j, ({"k": [1, "x"]},), "jsonb round trip")
            # executemany (psycopg 3 sends it as a pipeline of extended-protocol batches).
            cur.executemany(
                f"insert into {PREFIX}types (id, t) values (%s, %s)",
                [(100 + i, f"many {i}") for i in range(50)],
            )
            expect_eq(
                cur.execute(f"select count(*) from {PREFIX}types where id >= 100").fetchone(),
                (50,),
                "rows inserted by executemany",
            )

    def check_errors(self):
        with self.connect(autocommit=True) as conn:
            conn.execute(f"insert into {PREFIX}uniq values (1)")
            try:
                conn.execute(f"insert into {PREFIX}uniq values (1)")
            except errors.UniqueViolation as e:
                expect_eq(e.sqlstate, "23505", "unique violation sqlstate")
                expect_eq(e.diag.constraint_name, f"{PREFIX}uniq_pkey", "constraint name")
                expect_eq(e.diag.table_name, f"{PREFIX}uniq", "table name")
                if "Key (id)=(1) already exists" not in (e.diag.message_detail or ""):
                    fail(f"unique violation detail: {e.diag.message_detail!r}")
            else:
                fail("duplicate insert did not raise UniqueViolation")
            expect_eq(conn.execute("select 1").fetchone(), (1,), "usable after 23505")
            for sqltext, exc, code in [
                ("select 1/0", errors.DivisionByZero, "22012"),
                ("select * from no_such_table_xyz", errors.UndefinedTable, "42P01"),
                ("selec 1", errors.SyntaxError, "42601"),
                ("select 'abc'::int", errors.InvalidTextRepresentation, "22P02"),
            ]:
                for prepare in (False, True):
                    try:
                        conn.execute(sqltext, prepare=prepare)
                    except exc as e:
                        expect_eq(e.sqlstate, code, f"sqlstate of {sqltext!r}")
                        if not e.diag.message_primary:
                            fail(f"no message for {sqltext!r}")
                    else:
                        fail(f"{sqltext!r} did not raise {exc.__name__}")
                    expect_eq(conn.execute("select 2").fetchone(), (2,), f"usable after {code}")
            # An error in a parameterised (extended protocol) statement.
            try:
                conn.execute("select %s::int / %s::int", (1, 0))
            except errors.DivisionByZero:
                pass
            else:
                fail("parameterised 1/0 did not raise")
            # RAISE with a custom SQLSTATE, hint and detail.
            try:
                conn.execute(
                    "do $$ begin raise exception 'custom failure' using errcode = 'P0099',"
                    " detail = 'the detail', hint = 'the hint'; end $$"
                )
            except psycopg.Error as e:
                expect_eq(e.sqlstate, "P0099", "custom sqlstate")
                expect_eq(e.diag.message_detail, "the detail", "custom detail")
                expect_eq(e.diag.message_hint, "the hint", "custom hint")
            else:
                fail("RAISE did not raise")
            # A notice does not disturb the connection and reaches the notice handler.
            notices = []
            conn.add_notice_handler(lambda d: notices.append(d.message_primary))
            conn.execute("do $$ begin raise notice 'hello notice'; end $$")
            expect_eq(notices, ["hello notice"], "notices")
            # An error inside a transaction aborts it (25P02) until rollback.
            conn.autocommit = False
            conn.execute(f"insert into {PREFIX}uniq values (2)")
            try:
                conn.execute(f"insert into {PREFIX}uniq values (1)")
            except errors.UniqueViolation:
                pass
            else:
                fail("duplicate insert in a transaction did not raise")
            expect_eq(conn.info.transaction_status, psycopg.pq.TransactionStatus.INERROR, "INERROR")
            try:
                conn.execute("select 1")
            except errors.InFailedSqlTransaction as e:
                expect_eq(e.sqlstate, "25P02", "in failed transaction")
            else:
                fail("statement in an aborted transaction did not raise 25P02")
            conn.rollback()
            expect_eq(conn.execute(f"select count(*) from {PREFIX}uniq").fetchone(), (1,), "rows")
            conn.rollback()
            # A read-only transaction refusing a write.
            conn.autocommit = True
            try:
                with conn.transaction():
                    conn.execute("set transaction read only")
                    conn.execute(f"insert into {PREFIX}uniq values (3)")
            except errors.ReadOnlySqlTransaction as e:
                expect_eq(e.sqlstate, "25006", "read-only transaction")
            else:
                fail("write in a READ ONLY transaction did not raise 25006")
            expect_eq(conn.execute("select 3").fetchone(), (3,), "usable at the end")

    def check_copy(self):
        t = f"{PREFIX}copy"
        n = 20000
        with self.connect(autocommit=True) as conn:
            cur = conn.cursor()
            with cur.copy(f"COPY {t} (id, note, n) FROM STDIN") as copy:
                for i in range(n):
                    copy.write_row((i, f"row {i}\ttab\nnewline" if i % 1000 == 0 else f"row {i}", Decimal(i) / 4))
            expect_eq(cur.rowcount, n, "COPY FROM rowcount")
            expect_eq(conn.execute(f"select count(*), sum(id) from {t}").fetchone(), (n, n * (n - 1) // 2), "rows after COPY FROM")
            # Raw block writes (CSV).
            with cur.copy(f"COPY {t} (id, note) FROM STDIN (FORMAT csv)") as copy:
                copy.write("".join(f"{n + i},\"csv, {i}\"\n" for i in range(100)))
            # COPY TO STDOUT, rows parsed by the driver.
            got = 0
            with cur.copy(f"COPY (select id, note, n from {t} where id < {n} order by id) TO STDOUT") as copy:
                copy.set_types(["int4", "text", "numeric"])
                for i, row in enumerate(copy.rows()):
                    want_note = f"row {i}\ttab\nnewline" if i % 1000 == 0 else f"row {i}"
                    if row != (i, want_note, Decimal(i) / 4):
                        fail(f"COPY TO row {i}: {row!r}")
                    got += 1
            expect_eq(got, n, "rows read by COPY TO")
            # COPY TO STDOUT in blocks, binary format.
            size = 0
            with cur.copy(f"COPY {t} TO STDOUT (FORMAT binary)") as copy:
                for block in copy:
                    size += len(block)
            if size < n * 10:
                fail(f"binary COPY TO returned only {size} bytes")
            # A failing COPY FROM (duplicate key) reports 23505 and leaves the connection usable.
            try:
                with cur.copy(f"COPY {t} (id, note) FROM STDIN") as copy:
                    for i in range(10):
                        copy.write_row((i, "dup"))
            except errors.UniqueViolation:
                pass
            else:
                fail("COPY FROM with duplicate keys did not raise UniqueViolation")
            expect_eq(conn.execute(f"select count(*) from {t}").fetchone(), (n + 100,), "rows after failed COPY")
            # A COPY the client aborts (exception inside the block sends CopyFail).
            try:
                with cur.copy(f"COPY {t} (id, note) FROM STDIN") as copy:
                    copy.write_row((999999, "never"))
                    raise RuntimeError("client gives up")
            except (RuntimeError, errors.QueryCanceled):
                pass
            expect_eq(conn.execute(f"select count(*) from {t} where id = 999999").fetchone(), (0,), "CopyFail row")
            # COPY inside an explicit transaction, rolled back.
            with conn.transaction(force_rollback=True):
                with cur.copy(f"COPY {t} (id, note) FROM STDIN") as copy:
                    copy.write_row((888888, "rolled back"))
                expect_eq(conn.execute(f"select count(*) from {t} where id = 888888").fetchone(), (1,), "in tx")
            expect_eq(conn.execute(f"select count(*) from {t} where id = 888888").fetchone(), (0,), "after rollback")
            expect_eq(conn.execute("select 4").fetchone(), (4,), "usable after COPY")

    def check_cancel(self):
        with self.connect(autocommit=True) as conn:
            for attempt in range(2):  # twice: the key must keep working after a cancel
                timer = threading.Timer(0.5, conn.cancel)
                timer.start()
                start = time.monotonic()
                try:
                    conn.execute("select pg_sleep(10)")
                except errors.QueryCanceled as e:
                    expect_eq(e.sqlstate, "57014", "cancel sqlstate")
                else:
                    fail(f"pg_sleep(10) was not cancelled (attempt {attempt})")
                finally:
                    timer.cancel()
                took = time.monotonic() - start
                if took > 5:
                    fail(f"cancel took {took:.1f}s (attempt {attempt})")
                expect_eq(conn.execute("select 5").fetchone(), (5,), "usable after cancel")
            # Cancel inside a transaction: the transaction is aborted, rollback recovers it.
            conn.autocommit = False
            conn.execute("select 1")
            timer = threading.Timer(0.5, conn.cancel)
            timer.start()
            try:
                conn.execute("select pg_sleep(10)")
            except errors.QueryCanceled:
                pass
            else:
                fail("pg_sleep(10) in a transaction was not cancelled")
            finally:
                timer.cancel()
            conn.rollback()
            expect_eq(conn.execute("select 6").fetchone(), (6,), "usable after cancel in tx")
            conn.rollback()
            # A cancel while idle does nothing harmful.
            conn.autocommit = True
            conn.cancel()
            time.sleep(0.3)
            expect_eq(conn.execute("select 7").fetchone(), (7,), "usable after idle cancel")
            # psycopg >= 3.2 also has cancel_safe() (non-blocking libpq cancel API).
            if hasattr(conn, "cancel_safe"):
                timer = threading.Timer(0.5, lambda: conn.cancel_safe(timeout=5))
                timer.start()
                try:
                    conn.execute("select pg_sleep(10)")
                except errors.QueryCanceled:
                    pass
                else:
                    fail("pg_sleep(10) was not cancelled by cancel_safe()")
                finally:
                    timer.cancel()
                expect_eq(conn.execute("select 8").fetchone(), (8,), "usable after cancel_safe")

    def check_large_result(self):
        n = 200_000
        q = "select g, repeat('x', 100) from generate_series(1, %s) g" % n
        with self.connect() as conn:
            # Server-side cursor (DECLARE/FETCH) inside a transaction.
            with conn.transaction():
                with conn.cursor(name="big_cursor") as cur:
                    cur.itersize = 5000
                    cur.execute(q)
                    count = 0
                    total = 0
                    for g, s in cur:
                        count += 1
                        total += g
                        if len(s) != 100:
                            fail(f"row {g}: payload of {len(s)} chars")
            expect_eq(count, n, "rows from the server-side cursor")
            expect_eq(total, n * (n + 1) // 2, "sum of g from the server-side cursor")
            conn.commit()
            conn.autocommit = True
            # Plain fetchall (whole result buffered by libpq).
            rows = conn.execute(q).fetchall()
            expect_eq(len(rows), n, "rows from fetchall")
            expect_eq(rows[-1], (n, "x" * 100), "last row")
            expect_eq(sum(r[0] for r in rows), n * (n + 1) // 2, "sum of g from fetchall")
            del rows
            # Binary format, prepared, and streamed row by row (single-row mode).
            cur = conn.cursor()
            count = 0
            for (g, s) in cur.stream(q):
                count += 1
            expect_eq(count, n, "rows from cursor.stream()")
            rows = cur.execute(q, binary=True, prepare=True).fetchall()
            expect_eq(len(rows), n, "rows from a binary prepared fetchall")
            expect_eq(conn.execute("select 9").fetchone(), (9,), "usable after large results")

    def check_read_your_writes(self):
        t = f"{PREFIX}ryw"
        before = routed_reads(self.url)
        with self.connect(autocommit=True) as conn:
            missing = []
            for i in range(200):
                conn.execute(f"insert into {t} values (%s, %s)", (i, f"v{i}"))
                row = conn.execute(f"select v from {t} where id = %s", (i,)).fetchone()
                if row != (f"v{i}",):
                    missing.append((i, row))
                # A simple-protocol read too (no parameters).
                if i % 10 == 0:
                    c = conn.execute(f"select count(*) from {t}", prepare=False).fetchone()[0]
                    if c != i + 1:
                        missing.append((i, f"count {c}"))
            if missing:
                fail(f"{len(missing)} of 200 reads missed the row just written, e.g. {missing[:5]}")
            # Update then read, and delete then read.
            for i in range(50):
                conn.execute(f"update {t} set v = %s where id = %s", (f"u{i}", i))
                expect_eq(conn.execute(f"select v from {t} where id = %s", (i,)).fetchone(), (f"u{i}",), f"read after update #{i}")
                conn.execute(f"delete from {t} where id = %s", (i,))
                expect_eq(conn.execute(f"select v from {t} where id = %s", (i,)).fetchone(), None, f"read after delete #{i}")
        after = routed_reads(self.url)
        if before is not None and after is not None:
            delta = {k: after.get(k, 0) - before.get(k, 0) for k in after}
            print(f"     (routed reads by node during the loop: {delta})", flush=True)

    def check_pipeline(self):
        t = f"{PREFIX}pipe"
        with self.connect(autocommit=True) as conn:
            with conn.pipeline():
                cur = conn.cursor()
                for i in range(10):
                    cur.execute(f"insert into {t} values (%s, %s)", (i, f"p{i}"))
                c1 = conn.cursor()
                c1.execute(f"select count(*) from {t}")
                c2 = conn.cursor()
                c2.execute("select %s::int + %s::int", (40, 2))
                c3 = conn.cursor()
                c3.execute(f"select v from {t} where id = %s", (9,))
            expect_eq(c1.fetchone(), (10,), "count in pipeline")
            expect_eq(c2.fetchone(), (42,), "expression in pipeline")
            expect_eq(c3.fetchone(), ("p9",), "read-your-write in pipeline")
            # Results fetched inside the pipeline (forces a Sync/flush mid-pipeline).
            with conn.pipeline() as p:
                cur = conn.cursor()
                cur.execute(f"insert into {t} values (%s, %s) returning id", (100, "x"))
                p.sync()
                expect_eq(cur.fetchone(), (100,), "RETURNING fetched inside the pipeline")
                cur.execute(f"select v from {t} where id = %s", (100,))
                expect_eq(cur.fetchone(), ("x",), "read inside the pipeline")
            # An error in a pipeline: the failing statement raises, the connection recovers.
            # Statements up to a Sync form one implicit transaction (as on PostgreSQL itself):
            # 300 and 301 are lost with the duplicate, 400 (synced before it) stays.
            try:
                with conn.pipeline() as p:
                    conn.execute(f"insert into {t} values (400, 'synced')")
                    p.sync()
                    conn.execute(f"insert into {t} values (300, 'a')")
                    conn.execute(f"insert into {t} values (300, 'dup')")
                    conn.execute(f"insert into {t} values (301, 'after error, skipped')")
            except errors.UniqueViolation:
                pass
            else:
                fail("duplicate insert in a pipeline did not raise")
            got = conn.execute(f"select id from {t} where id >= 300 order by id").fetchall()
            expect_eq(got, [(400,)], "rows after a pipeline error")
            # Many prepared statements in one pipeline.
            with conn.pipeline():
                curs = []
                for i in range(100):
                    c = conn.cursor()
                    c.execute("select %s::int * 10", (i,), prepare=True)
                    curs.append(c)
            for i, c in enumerate(curs):
                expect_eq(c.fetchone(), (i * 10,), f"pipelined prepared #{i}")

    def check_deallocate(self):
        """DEALLOCATE ALL, sent by applications and by psycopg itself: after a command whose
        status is ROLLBACK, DROP, ALTER, DISCARD ALL or DEALLOCATE ALL it empties its cache of
        prepared statements and sends DEALLOCATE ALL before the next command. Statements
        prepared afterwards must still work, on this connection and on others."""
        tag = uuid.uuid4().hex[:8]
        t = f"{PREFIX}prep"
        q = f"insert into {t} values (%s, %s) returning id /* {tag} */"
        problems = []
        with self.connect(autocommit=True) as conn:
            cur = conn.cursor()
            # (a) An explicit DEALLOCATE ALL in the middle of a transaction (one server).
            try:
                with conn.transaction():
                    cur.execute(q, (100_001, "a"), prepare=True)
                    conn.execute("deallocate all")
                    cur.execute(q, (100_002, "a"), prepare=True)
                    expect_eq(cur.fetchone(), (100_002,), "prepared insert after DEALLOCATE ALL")
            except Exception as e:  # noqa: BLE001
                problems.append(f"(a) statement prepared again after an explicit DEALLOCATE ALL: {type(e).__name__}: {e}")
            # (b) psycopg's own DEALLOCATE ALL after ROLLBACK TO SAVEPOINT (a failed nested block).
            q2 = q.replace("*/", "b */")
            try:
                with conn.transaction():
                    cur.execute(q2, (100_003, "b"), prepare=True)
                    try:
                        with conn.transaction():  # SAVEPOINT
                            conn.execute(f"insert into {t} values (100003, 'dup')")
                    except errors.UniqueViolation:
                        pass  # ROLLBACK TO SAVEPOINT: psycopg sends DEALLOCATE ALL next
                    cur.execute(q2, (100_004, "b"), prepare=True)
                    expect_eq(cur.fetchone(), (100_004,), "prepared insert after ROLLBACK TO SAVEPOINT")
            except Exception as e:  # noqa: BLE001
                problems.append(f"(b) statement prepared again after psycopg's automatic DEALLOCATE ALL (after ROLLBACK TO SAVEPOINT): {type(e).__name__}: {e}")
        # (c) Other clients preparing the same statements afterwards.
        for k in range(3):
            try:
                with self.connect(autocommit=True) as other:
                    with other.transaction():
                        got = other.execute(q, (100_010 + k, "c"), prepare=True).fetchone()
                        expect_eq(got, (100_010 + k,), "another client's prepared insert")
            except Exception as e:  # noqa: BLE001
                problems.append(f"(c) another client (#{k}) preparing the same statement afterwards: {type(e).__name__}: {e}")
        if problems:
            fail("; ".join(problems))

    def check_pipeline_transaction(self):
        """A transaction inside a pipeline: psycopg sends BEGIN through the extended protocol
        (Parse/Bind/Execute "BEGIN", Sync), then the writes. Run last: it may hang."""
        t = f"{PREFIX}pipe"
        with self.connect(autocommit=True) as conn:
            for i in range(5):
                with conn.pipeline():
                    with conn.transaction():
                        conn.execute(f"insert into {t} values (%s, 'tx')", (1000 + 2 * i,))
                        conn.execute(f"insert into {t} values (%s, 'tx')", (1001 + 2 * i,))
            got = conn.execute(f"select count(*) from {t} where id >= 1000").fetchone()
            expect_eq(got, (10,), "rows written by pipelined transactions")

    def check_cleanup(self):
        with self.connect(autocommit=True) as conn:
            for t in ("tx", "types", "uniq", "copy", "ryw", "pipe", "prep"):
                conn.execute(sql.SQL("drop table if exists {}").format(sql.Identifier(PREFIX + t)))


def routed_reads(url):
    """`herd_routed_total` counters from the API (endpoint port + 100), or None."""
    try:
        port = urllib.parse.urlsplit(url).port + 100
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
            text = r.read().decode()
    except Exception:  # noqa: BLE001 - informational only
        return None
    out = {}
    for line in text.splitlines():
        if line.startswith("herd_routed_total{"):
            labels, value = line.rsplit(" ", 1)
            out[labels[len("herd_routed_total"):]] = float(value)
    return out


def main():
    if len(sys.argv) < 2:
        print(__doc__, file=sys.stderr)
        return 2
    print(f"psycopg {psycopg.__version__} (libpq {psycopg.pq.version()}, {psycopg.pq.__impl__})", flush=True)
    c = Checker(sys.argv[1], sys.argv[2] if len(sys.argv) > 2 else None)
    c.run("setup", c.setup)
    if c.failures:
        return 1
    for name in (
        "connect",
        "transactions",
        "prepared",
        "errors",
        "copy",
        "cancel",
        "large_result",
        "read_your_writes",
        "pipeline",
        "deallocate",
        "pipeline_transaction",
        "cleanup",
    ):
        c.run(name, getattr(c, f"check_{name}"))
    if c.failures:
        print(f"FAILED: {', '.join(c.failures)}", flush=True)
        return 1
    print("all psycopg checks passed", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
