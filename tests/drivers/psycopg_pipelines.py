"""psycopg 3's executemany (pipeline mode: one prepared statement, a Bind/Execute per row, one
Sync) over a distributed table whose rows are on several shard groups, through Herd's endpoint,
compared with the same calls over a one-server copy of the table.

Usage: psycopg_pipelines.py URL DISTRIBUTED ONE_SERVER_COPY. Exits non-zero on a difference.
"""

import faulthandler
import sys

import psycopg

# A hang shows where it is (the test kills the script at 100 s, which would say nothing).
faulthandler.dump_traceback_later(60, exit=True)


def run(url, table):
    seen = []
    ids = list(range(400, 420))
    with psycopg.connect(url, autocommit=True) as conn:
        cur = conn.cursor()
        # Autocommit: the pipeline is one implicit transaction, all rows or none.
        cur.executemany(
            f"insert into {table} (id, balance) values (%s, %s)", [(i, i) for i in ids]
        )
        seen.append(("inserted", cur.rowcount))
        try:
            cur.executemany(
                f"update {table} set balance = balance + 100 / %s where id = %s",
                [(1, ids[0]), (1, ids[1]), (0, ids[2])],
            )
            seen.append("no error")
        except psycopg.errors.DivisionByZero:
            seen.append("22012")
    # Outside autocommit: BEGIN goes in the pipeline, the transaction stays open.
    with psycopg.connect(url) as conn:
        cur = conn.cursor()
        cur.executemany(
            f"update {table} set balance = balance + %s where id = %s",
            [(10, i) for i in ids],
        )
        seen.append(("updated", cur.rowcount))
        conn.rollback()
        cur.executemany(
            f"update {table} set balance = balance + %s where id = %s",
            [(1, i) for i in ids],
        )
        conn.commit()
        cur.executemany(
            f"delete from {table} where id = %s returning id",
            [(i,) for i in ids[:4]],
            returning=True,
        )
        deleted = []
        while True:
            deleted.extend(r[0] for r in cur.fetchall())
            if not cur.nextset():
                break
        seen.append(("deleted", sorted(deleted)))
        conn.commit()
    with psycopg.connect(url, autocommit=True) as conn:
        rows = conn.execute(
            f"select id, balance from {table} where id >= 400 order by id"
        ).fetchall()
    return seen, rows


def main():
    url, distributed, copy = sys.argv[1:4]
    herd = run(url, distributed)
    one = run(url, copy)
    if herd != one:
        print(f"Herd:       {herd}\none server: {one}")
        sys.exit(1)
    print(f"same answers: {herd}")


if __name__ == "__main__":
    main()
